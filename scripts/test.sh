#!/usr/bin/env bash
# Installs what the test suite needs (only what is missing), then runs every
# test: unit tests, end-to-end tests against a throwaway PostgreSQL, the
# driver matrix, the deployment checks and a bounded fuzz run. Works on a fresh machine with Rust, Python and Postgres 15.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh

echo "== cargo fmt --check, cargo clippy -D warnings"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "== cargo test (workspace)"
# The same tests as `cargo test --workspace --locked --no-fail-fast`; the
# binaries without timing windows run three at a time (scripts/run-tests.py).
log=$(mktemp)
trap 'rm -f "$log"' EXIT
python3 scripts/run-tests.py 2>&1 | tee "$log"
passed=$(grep -oE "^tests: [0-9]+ passed" "$log" | awk '{print $2}' || true)

echo "== deploy checks"
bash deploy/check.sh

echo "== fuzzing (bounded: FUZZ_SECONDS per target)"
FUZZ_SECONDS="${FUZZ_SECONDS:-8}" bash scripts/fuzz.sh

# Reached only when everything above passed (set -e, pipefail).
echo "tests: ${passed} passed, 0 failed"
