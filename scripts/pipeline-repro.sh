#!/usr/bin/env bash
# psycopg's auto-prepare pipeline (ten runs of one query in one pipeline,
# prepare_threshold 5) 200 times through weir in transaction mode, each run
# bounded by 5 s; prints "stalls N of 200" and fails on any stall.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --workspace --bins --locked
WEIR_BIN="$PWD/target/debug/weir" cargo test --workspace --test e2e --locked -- \
    pipeline::auto_prepare_in_a_pipeline_200_runs --ignored --nocapture
