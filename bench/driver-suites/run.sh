#!/usr/bin/env bash
# The driver-suite bench: psycopg2's and asyncpg's own upstream test suites,
# straight to a throwaway Postgres 15 and through weir in session and in
# transaction mode; prints the tests that pass directly but not through weir.
# Not a CI gate. Everything it installs goes to bench/driver-suites/.cache.
#
#   bench/driver-suites/run.sh [--suites psycopg2,asyncpg] [--targets session,transaction] [--keep]
#
# WEIR_BIN picks the weir binary (default: target/debug/weir, built if missing).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cache="$here/.cache"

# Pinned: the drivers (their wheels run the tests), the sdists of the same
# versions (they ship the tests), and the test runner.
PSYCOPG2_VERSION=2.9.10
ASYNCPG_VERSION=0.30.0
PYTEST_VERSION=8.3.3
PYTEST_TIMEOUT_VERSION=2.3.1
DISTRO_VERSION=1.9.0   # asyncpg's test_connect imports it
stamp="psycopg2-$PSYCOPG2_VERSION asyncpg-$ASYNCPG_VERSION pytest-$PYTEST_VERSION timeout-$PYTEST_TIMEOUT_VERSION distro-$DISTRO_VERSION"

if [ "$(cat "$cache/stamp" 2>/dev/null)" != "$stamp" ]; then
    echo "preparing $cache ($stamp)"
    rm -rf "$cache/venv" "$cache/sdist" "$cache/suites" "$cache/stamp"
    mkdir -p "$cache/sdist" "$cache/suites"
    python3 -m venv "$cache/venv"
    "$cache/venv/bin/pip" install -q "psycopg2-binary==$PSYCOPG2_VERSION" "asyncpg==$ASYNCPG_VERSION" \
        "pytest==$PYTEST_VERSION" "pytest-timeout==$PYTEST_TIMEOUT_VERSION" "distro==$DISTRO_VERSION"
    "$cache/venv/bin/pip" download -q --no-deps --no-binary :all: -d "$cache/sdist" \
        "psycopg2==$PSYCOPG2_VERSION" "asyncpg==$ASYNCPG_VERSION"
    # Only the tests: run next to an unbuilt source tree they would import it.
    for pkg in psycopg2 asyncpg; do
        version_var="$(echo "$pkg" | tr a-z A-Z)_VERSION"
        tar -xzf "$cache/sdist/$pkg-${!version_var}.tar.gz" -C "$cache/sdist"
        mkdir -p "$cache/suites/$pkg"
        cp -a "$cache/sdist/$pkg-${!version_var}/tests" "$cache/suites/$pkg/tests"
    done
    echo "$stamp" >"$cache/stamp"
fi

weir_bin="${WEIR_BIN:-$root/target/debug/weir}"
if [ -z "${WEIR_BIN:-}" ] && [ ! -x "$weir_bin" ]; then
    (cd "$root" && nice -n 10 cargo build -p weir --bin weir)
fi
# A copy, so that a rebuild during the run does not change the binary under test.
cp "$weir_bin" "$cache/weir"
exec "$cache/venv/bin/python" "$here/runner.py" --weir-bin "$cache/weir" "$@"
