#!/usr/bin/env bash
# The statement-path differential fuzzer (tests/e2e/statement_fuzz.rs) for
# longer than CI runs it: CASES generated cases (default 1000) from SEED
# (default: a random one, printed), against Postgres directly and through
# weir in session and transaction mode. A failing case is shrunk and printed
# in the case text; add it to REGRESSIONS in the test.
#
#   scripts/statement-fuzz.sh [CASES] [SEED]
set -euo pipefail
cd "$(dirname "$0")/.."
cases=${1:-1000}
seed=${2:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
echo "statement fuzzer: $cases cases, seed $seed"
cargo build --workspace --bins --locked
WEIR_BIN="$PWD/target/debug/weir" WEIR_FUZZ_CASES=$cases WEIR_FUZZ_SEED=$seed \
    cargo test --workspace --test e2e --locked -- statement_fuzz:: --nocapture
