"""Conformance program for psycopg 3 through weir in transaction mode.

prepare_threshold=0 makes psycopg prepare every query under its own name
(_pg3_N) from the first run; prepared_max=10 makes it close old ones.
Reads WEIR_URL; exits 0 when every check passed.
"""

import os
import sys
import threading

import psycopg
from psycopg import errors

URL = os.environ["WEIR_URL"]
CLIENTS = int(os.environ.get("WEIR_CLIENTS", "20"))


def connect():
    conn = psycopg.connect(URL, autocommit=True, prepare_threshold=0)
    conn.prepared_max = 10
    return conn


def check(ok, what):
    if not ok:
        raise AssertionError(what)


def worker(i):
    with connect() as conn:
        # Prepared queries reused across many transactions.
        for k in range(30):
            got = conn.execute("select %s::int * 2", (k,)).fetchone()[0]
            check(got == 2 * k, f"reuse: {k}*2 gave {got}")
        # More distinct statements than max_prepared_statements (and psycopg's own cache).
        for j in range(40):
            got = conn.execute(f"select %s::int + {j}", (i,)).fetchone()[0]
            check(got == i + j, f"distinct {j} gave {got}")
        # Commit and rollback.
        with conn.transaction():
            conn.execute("insert into drv_psycopg (id, note) values (%s, %s)", (i * 1000 + 1, "tx"))
        try:
            with conn.transaction():
                conn.execute("insert into drv_psycopg (id, note) values (%s, %s)", (i * 1000 + 2, "tx"))
                raise RuntimeError("roll back")
        except RuntimeError:
            pass
        n = conn.execute("select count(*) from drv_psycopg where id = any(%s)", ([i * 1000 + 1, i * 1000 + 2],)).fetchone()[0]
        check(n == 1, f"commit/rollback left {n} rows")
        # An error inside a transaction, then recovery.
        conn.autocommit = False
        try:
            conn.execute("select 1 / %s::int", (0,))
            raise AssertionError("division by zero did not fail")
        except errors.DivisionByZero:
            pass
        try:
            conn.execute("select 1")
            raise AssertionError("aborted transaction did not fail")
        except errors.InFailedSqlTransaction:
            pass
        conn.rollback()
        conn.autocommit = True
        check(conn.execute("select %s::int * 2", (21,)).fetchone()[0] == 42, "recovery")
        # NULLs and binary parameters, binary results.
        blob = bytes([0, 1, 2, 255, 0, 127])
        with conn.cursor(binary=True) as cur:
            row = cur.execute("select %b::bytea, %s::text, %s::int4", (blob, None, None)).fetchone()
        check(row == (blob, None, None), f"nulls/binary: {row!r}")
        # COPY.
        with conn.cursor() as cur:
            with cur.copy("copy drv_psycopg (id, note) from stdin") as copy:
                for r in range(10):
                    copy.write_row((i * 1000 + 100 + r, None))
        # A statement cancelled through the driver's own API.
        if i % 5 == 0:
            timer = threading.Timer(0.3, conn.cancel_safe)
            timer.start()
            try:
                conn.execute("select pg_sleep(5)")
                raise AssertionError("pg_sleep(5) was not cancelled")
            except errors.QueryCanceled:
                pass
            finally:
                timer.cancel()
            check(conn.execute("select %s::int * 2", (21,)).fetchone()[0] == 42, "after cancel")


def main():
    with connect() as conn:
        conn.execute("drop table if exists drv_psycopg")
        conn.execute("create table drv_psycopg (id int primary key, note text)")
    failures = []

    def run(i):
        try:
            worker(i)
        except Exception as e:  # noqa: BLE001 - every failure is reported
            failures.append(f"client {i}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    with connect() as conn:
        total = conn.execute("select count(*) from drv_psycopg").fetchone()[0]
    if total != CLIENTS * 11:
        failures.append(f"total rows {total}")
    for f in failures:
        print("FAIL:", f)
    if failures or any(t.is_alive() for t in threads):
        sys.exit(1)
    print(f"psycopg {psycopg.__version__} (libpq {psycopg.pq.version()}): {CLIENTS} clients passed")


if __name__ == "__main__":
    main()
