#!/usr/bin/env python3
"""Runs PgBouncer's shell test suite (the suites before 1.19): test/test.sh,
then test/ssl/test.sh, in WORK (where run.sh put test/ and ./pgbouncer).

    legacy.py WORK EXPECTED.txt [TEST...]

Each script prints `running TEST ... ok|FAILED|skipped`. A script that stops
before its list is done (its `die` when the console does not answer, a test
that hangs for WEIR_SUITE_STALL seconds, default 300) is started again on
the tests after the one that was running, which counts as failed. The
outcomes go to WORK/results.txt, and compare.py compares them with
EXPECTED.txt.

The scripts use fixed ports (6666, 6667) and Unix sockets in /tmp: as root,
this runs in a network and mount namespace of its own with a private /tmp,
and the scripts run as WEIR_SUITE_USER (initdb refuses root; not
`postgres`, whom the suite's userlist.txt names). Otherwise they run
as the current user on the machine's ports and /tmp, which must be free.
"""
import os
import re
import select
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = [("test", "test.sh"), ("test/ssl", "ssl/test.sh")]
RESULT = re.compile(r"running (test_\w+) \.\.\. (ok|FAILED|skipped)")
STARTED = re.compile(r"running (test_\w+) \.\.\. ")
OUTCOME = {"ok": "passed", "FAILED": "failed", "skipped": "skipped"}


def testlist(script):
    """The tests a script runs by default, in order (its testlist="...")."""
    text = open(script, encoding="utf-8").read()
    body = re.search(r'^testlist="(.*?)"', text, re.S | re.M).group(1)
    return body.split()


def isolate():
    """A private /tmp and a loopback of our own (we are in new mount and
    network namespaces, as root)."""
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=1777", "tmpfs", "/tmp"], check=True)
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)


def v3_certificates(work):
    """WEIR_SUITE_V3_CERTS=1 (a diagnostic, not the suite as written): the
    ssl suite's CA and site certificates are made X.509 v3 (a CA's basic
    constraints, a site's subjectAltName), to see what fails besides the
    certificates' version."""
    ssl = os.path.join(work, "test", "ssl")
    for name, old, new in [
        (
            "newca.sh",
            '-out "$name/ca.crt" -- "$@"',
            '-out "$name/ca.crt" -addext basicConstraints=critical,CA:TRUE -- "$@"',
        ),
        (
            "newsite.sh",
            'run_ca -days $days -policy pol-server -in "$pfx.csr" -out "$pfx.crt"',
            'printf "subjectAltName=DNS:%s\\n" "$DstName" >"$pfx.ext"\n'
            'run_ca -days $days -policy pol-server -extfile "$pfx.ext" -in "$pfx.csr" -out "$pfx.crt"',
        ),
    ]:
        path = os.path.join(ssl, name)
        text = open(path, encoding="utf-8").read()
        assert old in text, f"{name} changed: no {old!r}"
        open(path, "w", encoding="utf-8").write(text.replace(old, new))


def as_user(work):
    """How the scripts are run: as WEIR_SUITE_USER (default nobody) when
    root, with the environment the scripts read (USER) set to match."""
    if os.geteuid() != 0:
        return [], dict(os.environ)
    user = os.environ.get("WEIR_SUITE_USER", "nobody")
    env = dict(os.environ, USER=user, LOGNAME=user, HOME=work)
    return ["runuser", "-u", user, "--"], env


def run_one(cwd, tests, prefix, env, log, stall):
    """Runs ./test.sh TESTS in cwd; returns {test: outcome} for the tests it
    reported, and the test it was running when it stopped (or None)."""
    proc = subprocess.Popen(
        prefix + ["./test.sh", *tests],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    buf, done, current, last = "", {}, None, time.monotonic()
    fd = proc.stdout.fileno()
    while True:
        ready, _, _ = select.select([fd], [], [], 5)
        if ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            text = chunk.decode("utf-8", "replace")
            sys.stdout.write(text)
            sys.stdout.flush()
            log.write(text)
            buf += text
            last = time.monotonic()
            for m in RESULT.finditer(buf):
                done[m.group(1)] = OUTCOME[m.group(2)]
            started = [m.group(1) for m in STARTED.finditer(buf)]
            current = started[-1] if started and started[-1] not in done else None
            buf = buf[-4096:]
        elif current and time.monotonic() - last > stall:
            note = f"\nlegacy.py: {current} gave no output for {stall} s: stopped\n"
            sys.stdout.write(note)
            log.write(note)
            os.killpg(proc.pid, signal.SIGKILL)
            break
    proc.wait()
    return done, current


def stop_leftovers(cwd, prefix, env):
    """What a script that was stopped left running: its pgbouncer (by the
    ini's pidfile) and its Postgres."""
    pidfile = os.path.join(cwd, "test.pid")
    if os.path.exists(pidfile):
        subprocess.run(prefix + ["sh", "-c", f'kill -9 "$(head -n1 {pidfile})"'], env=env, check=False)
    if os.path.exists(os.path.join(cwd, "pgdata", "postmaster.pid")):
        subprocess.run(
            prefix + ["pg_ctl", "-D", os.path.join(cwd, "pgdata"), "-m", "immediate", "stop"],
            env=env,
            check=False,
            stdout=subprocess.DEVNULL,
        )


def main():
    work, expected = sys.argv[1:3]
    wanted = sys.argv[3:]
    stall = int(os.environ.get("WEIR_SUITE_STALL", "300"))
    if os.geteuid() == 0:
        isolate()
    if os.environ.get("WEIR_SUITE_V3_CERTS") == "1":
        v3_certificates(work)
    prefix, env = as_user(work)
    results = {}
    with open(os.path.join(work, "suite.log"), "w", encoding="utf-8") as log:
        for subdir, name in SCRIPTS:
            cwd = os.path.join(work, subdir)
            tests = testlist(os.path.join(cwd, "test.sh"))
            if wanted:
                tests = [t for t in tests if t in wanted]
            remaining = tests
            while remaining:
                done, current = run_one(cwd, remaining, prefix, env, log, stall)
                for t, outcome in done.items():
                    results[f"{name}::{t}"] = outcome
                if current is not None:
                    results[f"{name}::{current}"] = "failed"
                    stop_leftovers(cwd, prefix, env)
                reported = set(done) | ({current} if current else set())
                if not reported:
                    break
                last = max(remaining.index(t) for t in reported)
                remaining = [t for t in remaining[last + 1 :] if t not in reported]
            for t in remaining:
                results[f"{name}::{t}"] = "failed"
            stop_leftovers(cwd, prefix, env)
    out = os.path.join(work, "results.txt")
    with open(out, "w", encoding="utf-8") as f:
        for name, outcome in results.items():
            f.write(f"{outcome} {name}\n")
    return subprocess.run([sys.executable, os.path.join(HERE, "compare.py"), out, expected]).returncode


if __name__ == "__main__":
    sys.exit(main())
