#!/usr/bin/env python3
"""Runs the workspace's tests as `cargo test --workspace` would, in less wall time.

Every test binary is built first (`cargo test --no-run`). The end-to-end
binary (tests/e2e/main.rs) is split into its top-level modules, each run in a
process of its own (`--exact` with the module's test names), so a unit of work
is a unit test binary or an e2e module. Units whose tests hold timing windows
that are the feature under test (those that call `serial()` or `exclusive()`
from the e2e support, directly or in a `mod` file they include) run one at a
time with nothing else beside them. The rest mostly wait on Postgres, psql and
child processes, so they run JOBS at a time first. Each unit's output is
printed whole when it ends, then a summary.

Exit status: 0 when every binary passed, 1 otherwise. The last line is
`tests: N passed, M failed`.

Usage: run-tests.py [--jobs N] [--timeout SECONDS] [cargo args...]
"""

import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import time

SOLO_MARKERS = ("exclusive(", "serial()")
RESULT = re.compile(r"test result: \w+\. (\d+) passed; (\d+) failed")


def build_weir_bin():
    """Builds the weir binary the end-to-end tests start as a process, and
    returns its path. Built here, once, before any test runs: otherwise the
    first test of each e2e process to need it ran `cargo build` itself, and
    in a clean clone that build (about 100 s) was charged to whichever
    module asked first, while the others waited on cargo's lock.

    `--workspace --bins` rather than `-p weir`: cargo resolves features per
    selection, and `-p weir` alone leaves out what the test crates turn on
    (tokio-postgres's socket2 and syn features, futures-util's sink), so the
    test build after it compiled tokio, serde and weir a second time (about
    1.5 min on 2 cores). The whole workspace's binaries resolve as the test
    build does, and that build reuses all of it."""
    cmd = ["cargo", "build", "--workspace", "--bins", "--locked", "--message-format=json-render-diagnostics"]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(proc.returncode)
    for line in proc.stdout.splitlines():
        msg = json.loads(line)
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if msg["target"]["name"] == "weir" and not msg["profile"]["test"]:
            return msg["executable"]
    sys.exit("cargo build --workspace --bins named no weir executable")


def build(cargo_args):
    """Builds every test binary; returns [(name, executable, src_path, cwd, args)]."""
    cmd = ["cargo", "test", "--workspace", "--locked", "--no-run", "--message-format=json-render-diagnostics"]
    proc = subprocess.run(cmd + cargo_args, stdout=subprocess.PIPE, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(proc.returncode)
    found = []
    for line in proc.stdout.splitlines():
        msg = json.loads(line)
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg["profile"]["test"]:
            continue
        target = msg["target"]
        cwd = os.path.dirname(msg["manifest_path"])
        found.append((target["name"], msg["executable"], target["src_path"], cwd, []))
    return found


def split_modules(binary):
    """An e2e binary (its source is a main.rs of `mod` lines) as one unit per module."""
    name, exe, src, cwd, _ = binary
    if os.path.basename(src) != "main.rs" or name != "e2e":
        return [binary]
    out = subprocess.run([exe, "--list", "--format", "terse"], cwd=cwd, stdout=subprocess.PIPE, text=True, check=True)
    groups = {}
    for line in out.stdout.splitlines():
        if line.endswith(": test"):
            test = line[: -len(": test")]
            groups.setdefault(test.split("::", 1)[0], []).append(test)
    folder = os.path.dirname(src)
    return [(mod, exe, os.path.join(folder, mod + ".rs"), cwd, ["--exact"] + tests) for mod, tests in groups.items()]


def sources(src_path):
    """The file and the `mod name;` files next to it that it includes."""
    files = [src_path]
    try:
        text = open(src_path, encoding="utf-8").read()
    except OSError:
        return files
    folder = os.path.dirname(src_path)
    for name in re.findall(r"^\s*(?:pub\s+)?mod\s+(\w+)\s*;", text, re.MULTILINE):
        files.append(os.path.join(folder, name + ".rs"))
    return files


def is_solo(src_path):
    for f in sources(src_path):
        try:
            text = open(f, encoding="utf-8").read()
        except OSError:
            continue
        if any(m in text for m in SOLO_MARKERS):
            return True
    return False


def run_one(binary, timeout):
    name, exe, src, cwd, args = binary
    env = dict(os.environ, CARGO_MANIFEST_DIR=cwd)
    started = time.monotonic()
    try:
        proc = subprocess.run(
            [exe] + args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout, check=False
        )
        out, code = proc.stdout.decode("utf-8", "replace"), proc.returncode
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode("utf-8", "replace") + f"\n{name}: killed after {timeout} s\n"
        code = -1
    return name, src, exe, out, code, time.monotonic() - started


def report(result, totals):
    name, src, exe, out, code, secs = result
    rel = os.path.relpath(src)
    print(f"     Running {rel} ({os.path.relpath(exe)}) [{secs:.0f} s]", flush=False)
    print(out, end="" if out.endswith("\n") else "\n")
    passed = failed = 0
    for p, f in RESULT.findall(out):
        passed, failed = passed + int(p), failed + int(f)
    if code != 0 and failed == 0:
        failed = 1  # crashed, timed out, or failed outside a test
    totals["passed"] += passed
    totals["failed"] += failed
    if code != 0:
        totals["bad"].append(rel)
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("WEIR_TEST_JOBS", "3")))
    ap.add_argument("--timeout", type=int, default=900)
    args, cargo_args = ap.parse_known_args()

    if "WEIR_BIN" not in os.environ:
        os.environ["WEIR_BIN"] = build_weir_bin()
    binaries = [unit for b in build(cargo_args) for unit in split_modules(b)]
    solo = [b for b in binaries if is_solo(b[2])]
    shared = [b for b in binaries if not is_solo(b[2])]
    totals = {"passed": 0, "failed": 0, "bad": []}
    started = time.monotonic()
    print(f"== {len(shared)} test binaries and e2e modules, {args.jobs} at a time", flush=True)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for fut in concurrent.futures.as_completed([pool.submit(run_one, b, args.timeout) for b in shared]):
            report(fut.result(), totals)
    print(f"== {len(solo)} timing-window e2e modules, one at a time: {', '.join(b[0] for b in solo)}", flush=True)
    for b in solo:
        report(run_one(b, args.timeout), totals)

    doc = subprocess.run(["cargo", "test", "--workspace", "--locked", "--doc", "--quiet"] + cargo_args, check=False)
    if doc.returncode != 0:
        totals["failed"] += 1
        totals["bad"].append("doc tests")

    print(f"== test binaries ran in {time.monotonic() - started:.0f} s")
    for rel in totals["bad"]:
        print(f"FAILED: {rel}")
    print(f"tests: {totals['passed']} passed, {totals['failed']} failed")
    return 1 if totals["bad"] else 0


if __name__ == "__main__":
    sys.exit(main())
