#!/usr/bin/env bash
# Installs what the test suite needs (only what is missing), then runs every
# test: unit tests, end-to-end tests against a throwaway PostgreSQL, and the
# deployment checks. Works on a fresh machine with Rust, Python and Postgres 15.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh

echo "== cargo test (workspace)"
cargo test --workspace --locked --no-fail-fast

echo "== deploy checks"
bash deploy/check.sh

echo "== fuzzing (bounded: FUZZ_SECONDS per target)"
FUZZ_SECONDS="${FUZZ_SECONDS:-8}" bash scripts/fuzz.sh
