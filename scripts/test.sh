#!/usr/bin/env bash
# Installs what the test suite needs (only what is missing), then runs every
# test: unit tests, end-to-end tests against a throwaway PostgreSQL, the
# driver matrix, a 3-minute soak, the deployment checks and a bounded fuzz run.
#
# Needs a Rust toolchain (1.85+, with rustfmt and clippy), Python 3 and gcc.
# scripts/install-deps.sh brings the rest (Postgres, PgBouncer, pip, a JDK, Go,
# Node.js and the drivers) from Debian's packages, PyPI and npm, so it needs
# Debian 12+ or Ubuntu 22.04+, root or sudo, and those registries and crates.io
# reachable; anywhere else it names what is missing and stops. On a fresh
# machine with 2 cores the whole run takes about 25 minutes, most of it builds.
# scripts/fresh-debian-check.sh runs it in a fresh Debian 12 chroot.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh

# A CI machine's disk may be small: one CI run ran out of space linking the
# test binaries. In CI there are no incremental caches (a clean clone gains
# nothing from them; they were ~640 MB), and the test build (target/debug) is
# removed once the tests have run, before the release and fuzz builds.
in_ci=0
if [ "${CI:-}" = true ]; then
    in_ci=1
    export CARGO_INCREMENTAL=0
fi

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

echo "== e2e core subset against Postgres 18"
bash scripts/test-pg-versions.sh --core 18 2>&1 | tee "$log"
passed18=$(grep -oE "^tests: [0-9]+ passed" "$log" | awk '{print $2}' || true)
passed=$((${passed:-0} + ${passed18:-0}))

echo "== soak (${SOAK_MINUTES:-3} minutes of churn and faults, checked from Postgres's data)"
# The dev builds the tests just made (run-tests.py builds target/debug/weir
# with the same selection, so this build is a no-op):
# what the soak checks (no lost or duplicated commit, recovery, no leak, no
# panic) does not depend on the optimisation level, and the release build
# with fat LTO would cost CI ten minutes. Fails when a check fails.
cargo build --workspace --bins --locked
soak_out="target/soak"
target/debug/weir-bench soak --minutes "${SOAK_MINUTES:-3}" --weir-bin target/debug/weir --out "$soak_out"
if [ "$in_ci" = 1 ]; then
    echo "disk: target/ held $(du -sh target | cut -f1) after the tests; removing target/debug"
    rm -rf target/debug
fi

echo "== deploy checks"
bash deploy/check.sh
if [ "$in_ci" = 1 ]; then
    # The release build the deploy checks made; the fuzz build has its own.
    rm -rf target
fi

echo "== fuzzing (bounded: FUZZ_SECONDS per target)"
FUZZ_SECONDS="${FUZZ_SECONDS:-8}" bash scripts/fuzz.sh

# Reached only when everything above passed (set -e, pipefail).
echo "tests: ${passed} passed, 0 failed"
