#!/usr/bin/env bash
# Installs what the test suite needs (only what is missing), then runs every
# test: unit tests, end-to-end tests against a throwaway PostgreSQL, and the
# deployment checks. Works on a fresh machine with Rust, Python and Postgres 15.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh

echo "== cargo test (workspace)"
cargo test --workspace --locked --no-fail-fast 2>&1 | tee /tmp/weir-cargo-test.log
# tee hides cargo's exit status
if grep -qE "^test result: FAILED|error(\[E[0-9]+\])?:|^error: test failed" /tmp/weir-cargo-test.log; then
    echo "cargo test failed" >&2
    exit 1
fi

echo "== deploy checks"
bash deploy/check.sh
