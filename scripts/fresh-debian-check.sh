#!/usr/bin/env bash
# Runs the README's test command on a fresh Debian 12 (bookworm), without
# Docker: a debootstrap chroot given only what a fresh CI machine has (the
# Rust toolchain, Python 3.11, gcc and the Postgres 15 packages), a clean
# clone of this checkout's HEAD, and then `CI=true bash .ci/run` inside it.
# The run must pass, or stop at once naming what is missing.
#
# Needs: root on a Debian or Ubuntu host (chroot and mounts), debootstrap
# (`apt-get install debootstrap`), a rustup toolchain on the host (bound
# read-only into the chroot; cargo's registry inside starts empty), git, and
# a few GB of disk. A full run takes about as long as CI (25 min on 2 cores).
#
# Usage: sudo bash scripts/fresh-debian-check.sh [--until STEP] [DIR]
#   DIR      where the chroot lives (default /var/tmp/weir-fresh-debian). The
#            bootstrapped base is kept there and reused; each run starts from
#            a fresh copy of it (DIR/run), so nothing of an earlier run leaks.
#   --until  install-deps: stop after scripts/install-deps.sh;
#            first-test:   stop after fmt, clippy and the first test binary;
#            all:          the whole of .ci/run (default).
#   --again  keep the last run's chroot (what install-deps installed, cargo's
#            downloads, the clone's target/) and only take HEAD afresh: for
#            checking a fix quickly, not a fresh machine any more.
# Environment: DEBIAN_MIRROR (default http://deb.debian.org/debian).
# The run's output is in DIR/run.log as well as on stdout.
set -euo pipefail

until_step=all
again=0
dir=/var/tmp/weir-fresh-debian
while [ $# -gt 0 ]; do
    case "$1" in
    --until)
        until_step="$2"
        shift 2
        ;;
    --again)
        again=1
        shift
        ;;
    -h | --help)
        sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
        exit 0
        ;;
    *)
        dir="$1"
        shift
        ;;
    esac
done
case "$until_step" in install-deps | first-test | all) ;; *)
    echo "--until takes install-deps, first-test or all, not '$until_step'" >&2
    exit 2
    ;;
esac

die() {
    echo "fresh-debian-check: $*" >&2
    exit 1
}
[ "$(id -u)" = 0 ] || die "needs root (chroot, mount): run it with sudo"
command -v debootstrap >/dev/null || die "needs debootstrap: apt-get install debootstrap"
command -v git >/dev/null || die "needs git (to make a clean clone of this checkout)"
rustup_home="${RUSTUP_HOME:-$HOME/.rustup}"
cargo_bin="${CARGO_HOME:-$HOME/.cargo}/bin"
[ -x "$cargo_bin/cargo" ] && [ -d "$rustup_home/toolchains" ] ||
    die "needs a rustup toolchain on the host (looked in $rustup_home and $cargo_bin)"

repo="$(cd "$(dirname "$0")/.." && pwd)"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
base="$dir/base"
root="$dir/run"
mkdir -p "$dir"

# Refuses to remove a folder while anything is mounted below it: a bound /dev
# removed with rm -rf would be the host's.
mounted_below() { findmnt -rn -o TARGET | grep -q "^$1\(/\|$\)"; }
unmount_all() {
    local m
    for m in $(findmnt -rn -o TARGET | grep "^$root/" | sort -r); do
        umount -l "$m" 2>/dev/null || true
    done
}
trap unmount_all EXIT

# 1. The base system, once: Debian's minimal base with the packages a fresh
#    CI machine has (gcc, Python 3.11 as python3, Postgres 15). No pip, no
#    sudo, no git, no pgbouncer, no node: install-deps.sh must bring those.
if [ ! -e "$base/.weir-base-done" ]; then
    mounted_below "$base" && die "$base has mounts below it; unmount them first"
    rm -rf "$base"
    echo "== debootstrap bookworm into $base"
    debootstrap --variant=minbase \
        --include=ca-certificates,gcc,libc6-dev,python3,postgresql-15,postgresql-client-15 \
        bookworm "$base" "$mirror"
    # Debian's own mirror and the security suite, as a bookworm image has.
    printf 'deb %s bookworm main\ndeb %s bookworm-updates main\n' "$mirror" "$mirror" \
        >"$base/etc/apt/sources.list"
    rm -rf "$base/var/lib/apt/lists/"*
    touch "$base/.weir-base-done"
fi

# 2. A fresh copy of the base for this run, the host's DNS, and the kernel's
#    file systems.
unmount_all
mounted_below "$root" && die "$root still has mounts below it; unmount them first"
if [ "$again" = 1 ] && [ -d "$root/src" ]; then
    echo "== reusing $root (--again)"
    rm -rf "$root/target.kept"
    if [ -d "$root/src/target" ]; then mv "$root/src/target" "$root/target.kept"; fi
    rm -rf "$root/src"
else
    rm -rf "$root"
    echo "== copying the base to $root"
    cp -a "$base" "$root"
fi
cp /etc/resolv.conf "$root/etc/resolv.conf"
# The host's own certificate authorities: where the registries are reached
# through a proxy with a CA of its own, every machine there trusts it, and so
# must the chroot (the base has none of them).
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
    chroot "$root" update-ca-certificates >/dev/null
fi
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys" && mount --make-rslave "$root/sys"
mount --rbind /dev "$root/dev" && mount --make-rslave "$root/dev"

# 3. The Rust toolchain, read-only, and an empty cargo home: crates come from
#    crates.io as on a fresh machine.
mkdir -p "$root/opt/rustup" "$root/root/.cargo/bin"
mount --bind "$rustup_home" "$root/opt/rustup"
mount -o remount,bind,ro "$root/opt/rustup"
for tool in cargo rustc rustup rustdoc rustfmt cargo-fmt cargo-clippy clippy-driver; do
    [ -e "$cargo_bin/$tool" ] && cp "$cargo_bin/$tool" "$root/root/.cargo/bin/"
done

# 4. A clean clone of this checkout's HEAD (committed work only).
echo "== cloning $(git -C "$repo" rev-parse --short HEAD) into /src"
git clone -q --no-hardlinks "$repo" "$root/src"
if [ -d "$root/target.kept" ]; then mv "$root/target.kept" "$root/src/target"; fi

case "$until_step" in
install-deps) cmd="bash scripts/install-deps.sh" ;;
first-test)
    # test.sh's own first steps, then the proxy's unit tests (the first
    # test binary run-tests.py starts).
    cmd="bash scripts/install-deps.sh && cargo fmt --all -- --check"
    cmd="$cmd && cargo clippy --workspace --all-targets --locked -- -D warnings"
    cmd="$cmd && CARGO_INCREMENTAL=0 cargo test --locked -p weir --lib"
    ;;
all) cmd="CI=true bash .ci/run" ;;
esac
# A clean environment, but for the host's certificate settings (as above).
run_env=(HOME=/root TERM=dumb LANG=C.UTF-8 RUSTUP_HOME=/opt/rustup CARGO_HOME=/root/.cargo
    PATH=/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)
for var in SSL_CERT_FILE SSL_CERT_DIR NODE_EXTRA_CA_CERTS PIP_CERT REQUESTS_CA_BUNDLE CURL_CA_BUNDLE; do
    if [ -n "${!var:-}" ]; then run_env+=("$var=${!var}"); fi
done
echo "== in the chroot: $cmd"
started=$(date +%s)
set +e
chroot "$root" /usr/bin/env -i "${run_env[@]}" \
    /bin/bash -c "cd /src && $cmd" </dev/null 2>&1 | tee "$dir/run.log"
status=${PIPESTATUS[0]}
set -e
echo "== exit status $status after $(($(date +%s) - started)) s (log: $dir/run.log)"
exit "$status"
