#!/usr/bin/env bash
# The statement-path differential fuzzer (tests/e2e/statement_fuzz.rs) for
# longer than CI runs it: CASES generated cases (default 3000) from SEED
# (default: a random one, printed), against Postgres directly and through
# weir in session and transaction mode, in WEIR_FUZZ_LANES lanes side by
# side (default 3). A failing case is shrunk and printed in the case text;
# add it to REGRESSIONS in the test.
#
# FROM skips the cases numbered below it (CASES counts from 0 all the same):
# `scripts/statement-fuzz.sh 145 11 144` runs case 144 of seed 11 alone.
# WEIR_FUZZ_CASE='0:Ps1=0;S | 1:Q0' runs one case given as text.
#
#   scripts/statement-fuzz.sh [CASES] [SEED] [FROM]
set -euo pipefail
cd "$(dirname "$0")/.."
cases=${1:-3000}
seed=${2:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
from=${3:-0}
echo "statement fuzzer: $cases cases, seed $seed, from case $from"
cargo build --workspace --bins --locked
WEIR_BIN="$PWD/target/debug/weir" WEIR_FUZZ_CASES=$cases WEIR_FUZZ_SEED=$seed WEIR_FUZZ_FROM=$from \
    cargo test --workspace --test e2e --locked -- statement_fuzz:: --nocapture
