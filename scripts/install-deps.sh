#!/usr/bin/env bash
# Installs, only when missing, what weir's tests and benches use:
# PostgreSQL 15 server binaries, psql and pgbench.
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
