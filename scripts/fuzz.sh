#!/usr/bin/env bash
# Runs every cargo-fuzz target in crates/proxy/fuzz for a bounded time
# (FUZZ_SECONDS each, default 10) and fails on the first crash, printing the
# executions per target. It also fails when `cargo fuzz list` names no
# target, or a target reports no (or zero) executed units: a run that
# fuzzed nothing is not a pass. Installs cargo-fuzz from crates.io when missing.
# Stable rustc takes cargo-fuzz's -Z flags with RUSTC_BOOTSTRAP=1.
# The committed seeds (crates/proxy/fuzz/corpus/TARGET) are read only; what
# libFuzzer finds goes to a temporary folder, so the repo's corpus stays small.
# A crash leaves its input in crates/proxy/fuzz/artifacts/TARGET/.
# No sanitizer (`-s none`): weir forbids unsafe code, so AddressSanitizer
# guards only its dependencies; without it the build took 223 s instead of
# 286 s and a target ran 5.66 M inputs in 8 s instead of 0.78 M (frame).
set -euo pipefail

seconds="${FUZZ_SECONDS:-10}"
export RUSTC_BOOTSTRAP=1
cd "$(dirname "$0")/../crates/proxy"

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi

targets=$(cargo fuzz list)
if [ -z "$targets" ]; then
    echo "cargo fuzz list named no fuzz target in crates/proxy/fuzz: nothing was fuzzed"
    exit 1
fi
started=$(date +%s)
cargo fuzz build -s none
echo "fuzz build: $(($(date +%s) - started)) s"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for t in $targets; do
    mkdir -p "$work/$t"
    log="$work/$t.log"
    if ! cargo fuzz run -s none "$t" "$work/$t" "fuzz/corpus/$t" -- \
        -max_total_time="$seconds" -print_final_stats=1 >"$log" 2>&1; then
        tail -n 60 "$log"
        echo "fuzz target $t FAILED (input in crates/proxy/fuzz/artifacts/$t/)"
        exit 1
    fi
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    if ! [[ "$execs" =~ ^[0-9]+$ ]] || [ "$execs" -eq 0 ]; then
        tail -n 60 "$log"
        echo "fuzz target $t ran no input (stat::number_of_executed_units: '${execs}')"
        exit 1
    fi
    echo "fuzz $t: ${execs} executions in ${seconds} s, no crash"
done
