"""Runs drivers' own upstream test suites straight to Postgres and through weir.

Started by run.sh (which prepares the venv and the suites in .cache). Starts a
throwaway PostgreSQL 15 on a free 127.0.0.1 port, and for each suite and each
target (direct, weir in session mode, weir in transaction mode) recreates the
suite's database, starts weir if the target needs it, runs the suite under
pytest with a time bound, and stops weir. Then prints, per target, how many
tests passed directly but not through it, and which.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CACHE = HERE / ".cache"
PG_BIN = Path(os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin"))
TARGETS = ["direct", "session", "transaction"]

# Each suite: its tests folder in .cache/suites, its database, the environment
# that points it at a host and port, and its time bound in seconds.
SUITES = {
    "psycopg2": {
        "db": "psycopg2_test",
        "env": lambda port: {
            "PSYCOPG2_TESTDB": "psycopg2_test",
            "PSYCOPG2_TESTDB_HOST": "127.0.0.1",
            "PSYCOPG2_TESTDB_PORT": str(port),
            "PSYCOPG2_TESTDB_USER": "postgres",
        },
        "bound": 420,
    },
    "asyncpg": {
        "db": "asyncpg_test",
        # With PGHOST set, asyncpg's test base uses the running server
        # (RunningCluster) and libpq's variables instead of its own initdb.
        "env": lambda port: {
            "PGHOST": "127.0.0.1",
            "PGPORT": str(port),
            "PGUSER": "postgres",
            "PGDATABASE": "asyncpg_test",
        },
        "bound": 600,
    },
}
# Databases the suites connect to besides their own (weir needs a section each).
EXTRA_DBS = ["postgres", "template1", "testdb", "asyncpg_intro_test"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def as_postgres(cmd):
    """Server binaries refuse to run as root: run them as `postgres` then."""
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--"] + cmd
    return cmd


def wait_port(port, limit):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            time.sleep(0.1)
    return False


class Postgres:
    def __init__(self, root):
        self.root = root
        self.data = root / "data"
        self.port = free_port()

    def start(self):
        self.data.mkdir()
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres")
            shutil.chown(self.data, "postgres")
        subprocess.run(
            as_postgres([str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust",
                         "-E", "UTF8", "--locale=C", "--no-sync"]),
            check=True, stdout=subprocess.DEVNULL)
        opts = (f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.root} "
                "-c max_connections=400 -c max_prepared_transactions=20 -c fsync=off "
                "-c synchronous_commit=off -c full_page_writes=off -c jit=off")
        subprocess.run(as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-o", opts, "-w",
                                    "-l", str(self.root / "postgres.log"), "start"]),
                       check=True, stdout=subprocess.DEVNULL)

    def stop(self):
        subprocess.run(as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w",
                                    "stop"]), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def sql(self, statement):
        import psycopg2  # from the venv run.sh made

        conn = psycopg2.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres")
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(statement)
        conn.close()

    def fresh_db(self, name):
        self.sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        self.sql(f"CREATE DATABASE {name}")


class Weir:
    def __init__(self, binary, root, pg_port, mode):
        self.binary, self.mode = binary, mode
        self.dir = root / f"weir-{mode}"
        self.dir.mkdir(exist_ok=True)
        self.port = free_port()
        dbs = [s["db"] for s in SUITES.values()] + EXTRA_DBS
        sections = "".join(f'[databases.{d}]\nhost = "127.0.0.1"\nport = {pg_port}\n\n' for d in dbs)
        # Session mode gives every client its own server, so the pool must
        # hold as many as the suites open at once; transaction mode shares
        # weir's default pool of 20.
        pool = 150 if mode == "session" else 20
        (self.dir / "weir.toml").write_text(f"""[weir]
listen_addr = "127.0.0.1:{self.port}"
auth_type = "trust"
pool_mode = "{mode}"
default_pool_size = {pool}
max_client_conn = 1000
query_wait_timeout = "30s"
# asyncpg's log-listener tests send client_min_messages at startup; weir,
# as PgBouncer, refuses startup parameters it is not told to track.
track_extra_parameters = ["search_path", "statement_timeout", "lock_timeout", "client_min_messages"]
log_stats = false

{sections}""")
        self.proc = None

    def start(self):
        log = open(self.dir / "weir.log", "ab")
        self.proc = subprocess.Popen([str(self.binary), "--config", str(self.dir / "weir.toml")],
                                     stdout=subprocess.DEVNULL, stderr=log, env={**os.environ, "WEIR_LOG": "info"})
        if not wait_port(self.port, 30):
            raise RuntimeError(f"weir ({self.mode}) did not listen; see {self.dir / 'weir.log'}")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def run_suite(suite, target, port, out_dir):
    """Runs one suite against one port; returns {test id: (outcome, error)}."""
    spec = SUITES[suite]
    outcomes = out_dir / f"{suite}-{target}.jsonl"
    outcomes.unlink(missing_ok=True)
    env = {**os.environ, **spec["env"](port), "SUITE_OUTCOMES": str(outcomes),
           "PYTHONPATH": str(HERE), "PYTHONDONTWRITEBYTECODE": "1"}
    for var in ("PGPASSWORD", "PGSERVICE", "PGSSLMODE"):
        env.pop(var, None)
    cmd = [sys.executable, "-m", "pytest", "tests", "-p", "outcomes", "-p", "no:cacheprovider", "-q",
           "--timeout=60", "--timeout-method=signal"]
    log = open(out_dir / f"{suite}-{target}.log", "wb")
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=CACHE / "suites" / suite, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        proc.wait(spec["bound"])
        cut = False
    except subprocess.TimeoutExpired:
        cut = True
    finally:
        # Its own session, so the whole group (and any test's child) goes; also on Ctrl-C.
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    took = time.monotonic() - started
    results = {}
    if outcomes.exists():
        for line in outcomes.read_text(encoding="utf-8").splitlines():
            r = json.loads(line)
            results[r["id"]] = (r["outcome"], r["error"])
    counts = {o: sum(1 for v in results.values() if v[0] == o) for o in ("passed", "failed", "skipped")}
    note = f", cut at its {spec['bound']}s bound" if cut else ""
    print(f"  {suite:9} {target:12} {took:6.0f}s  passed {counts['passed']:5}  failed {counts['failed']:4}"
          f"  skipped {counts['skipped']:4}{note}", flush=True)
    return results, cut


def report(all_results, cuts, targets, out_dir):
    lines = ["# Driver suites: tests that pass directly but not through a target", ""]
    header = "| suite | tests | pass directly | " + " | ".join(f"differ: weir {t}" for t in targets) + " |"
    lines += [header, "|" + "---|" * (3 + len(targets))]
    details = []
    for suite, by_target in all_results.items():
        direct = by_target["direct"]
        passed = {t for t, (o, _) in direct.items() if o == "passed"}
        row = [suite, str(len(direct)), str(len(passed))]
        for target in targets:
            res = by_target[target]
            differ = sorted(t for t in passed if res.get(t, ("not run", ""))[0] != "passed")
            mark = " (cut)" if cuts.get((suite, target)) else ""
            row.append(f"{len(differ)}{mark}")
            details.append(f"\n## {suite} through weir in {target} mode: {len(differ)}\n")
            for t in differ:
                outcome, error = res.get(t, ("not run", ""))
                details.append(f"- `{t}`: {outcome}" + (f": {error}" if error else ""))
        lines.append("| " + " | ".join(row) + " |")
    text = "\n".join(lines + details) + "\n"
    (out_dir / "summary.md").write_text(text, encoding="utf-8")
    print()
    print(text)
    print(f"(also in {out_dir / 'summary.md'}; per-run logs and outcomes next to it)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weir-bin", required=True)
    ap.add_argument("--suites", default=",".join(SUITES))
    ap.add_argument("--targets", default="session,transaction", help="weir modes to compare with direct")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (Postgres data, weir logs)")
    args = ap.parse_args()
    suites = [s for s in args.suites.split(",") if s]
    targets = [t for t in args.targets.split(",") if t]
    for name in suites + targets:
        if name not in SUITES and name not in TARGETS:
            sys.exit(f"unknown suite or target: {name}")
    out_dir = CACHE / "results" / time.strftime("%Y%m%d-%H%M%S")
    out_dir.mkdir(parents=True)
    root = Path(tempfile.mkdtemp(prefix="weir-driver-suites-"))
    os.chmod(root, 0o755)
    pg = Postgres(root)
    all_results, cuts = {}, {}
    try:
        pg.start()
        print(f"postgres on 127.0.0.1:{pg.port}; results in {out_dir}", flush=True)
        for suite in suites:
            all_results[suite] = {}
            for target in ["direct"] + targets:
                pg.fresh_db(SUITES[suite]["db"])
                for db in ("testdb", "asyncpg_intro_test"):  # asyncpg's tests create these
                    pg.sql(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
                weir = None if target == "direct" else Weir(args.weir_bin, root, pg.port, target)
                try:
                    if weir:
                        weir.start()
                    port = weir.port if weir else pg.port
                    all_results[suite][target], cuts[(suite, target)] = run_suite(suite, target, port, out_dir)
                finally:
                    if weir:
                        weir.stop()
                        shutil.copy(weir.dir / "weir.log", out_dir / f"weir-{suite}-{target}.log")
        report(all_results, cuts, targets, out_dir)
    finally:
        pg.stop()
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
