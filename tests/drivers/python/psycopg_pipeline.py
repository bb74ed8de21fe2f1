"""psycopg 3 pipelines through weir: auto-prepare inside a pipeline.

Usage: psycopg_pipeline.py repro RUNS   (the auto-prepare repro, RUNS times)
       psycopg_pipeline.py suite        (pipeline checks, prepare_threshold 0, 1, 5)

Reads WEIR_URL. Every run has its own deadline (STALL seconds): a run that
does not finish in time is a stall. Prints "stalls N of RUNS" (repro) and
exits 0 only when nothing stalled and every result was as expected.
"""

import asyncio
import os
import sys

import psycopg

URL = os.environ["WEIR_URL"]
STALL = float(os.environ.get("WEIR_STALL_SECS", "5"))


def check(ok, what):
    if not ok:
        raise AssertionError(what)


async def connect(threshold, autocommit=False):
    conn = await psycopg.AsyncConnection.connect(URL, autocommit=autocommit)
    conn.prepare_threshold = threshold
    return conn


async def repro_once(i):
    """The auto-prepare repro: ten runs of one query in one pipeline, with
    prepare_threshold 5 (five unnamed, then a Parse of _pg3_0 and five Binds)."""
    conn = await connect(5)
    try:
        async with conn.pipeline():
            cursors = [await conn.execute("select 42 as x") for _ in range(10)]
        rows = [await c.fetchone() for c in cursors]
        check(rows == [(42,)] * 10, f"run {i}: rows {rows}")
        await conn.commit()
    finally:
        await conn.close()


async def repro(runs):
    stalls = 0
    for i in range(runs):
        try:
            await asyncio.wait_for(repro_once(i), STALL)
        except asyncio.TimeoutError:
            stalls += 1
            print(f"run {i}: stalled past {STALL} s", flush=True)
    print(f"stalls {stalls} of {runs}", flush=True)
    return stalls == 0


async def pipeline_checks(threshold):
    """psycopg's pipeline features at one prepare_threshold, in one session:
    repeated queries (crossing the threshold), parameters, an error in the
    pipeline and recovery, executemany, sync points and explicit transactions."""
    conn = await connect(threshold, autocommit=True)
    try:
        async with conn.pipeline() as p:
            curs = [await conn.execute("select %s::int * 3", (k,)) for k in range(12)]
            await p.sync()
            got = [(await c.fetchone())[0] for c in curs]
            check(got == [k * 3 for k in range(12)], f"threshold {threshold}: {got}")
            curs = [await conn.execute("select %s::text || 'x'", (str(k),)) for k in range(8)]
        got = [(await c.fetchone())[0] for c in curs]
        check(got == [f"{k}x" for k in range(8)], f"threshold {threshold}: {got}")
        # An error in the pipeline: later queries up to the sync are skipped.
        try:
            async with conn.pipeline():
                await conn.execute("select 1")
                await conn.execute("select 1 / %s::int", (0,))
                await conn.execute("select 2")
            raise AssertionError("division by zero did not fail")
        except psycopg.errors.DivisionByZero:
            pass
        got = (await (await conn.execute("select 5 as y")).fetchone())[0]
        check(got == 5, f"after error: {got}")
        # executemany in a pipeline, repeated past the threshold.
        await conn.execute("create temporary table if not exists pl (id int, v text)")
        async with conn.pipeline():
            async with conn.cursor() as cur:
                for _ in range(3):
                    await cur.executemany("insert into pl values (%s, %s)", [(k, str(k)) for k in range(6)])
        n = (await (await conn.execute("select count(*) from pl")).fetchone())[0]
        check(n == 18, f"executemany rows {n}")
        await conn.execute("drop table pl")
        # Explicit transactions inside a pipeline.
        conn2 = await connect(threshold)
        try:
            for _ in range(3):
                async with conn2.pipeline():
                    curs = [await conn2.execute("select %s::int + 1", (k,)) for k in range(7)]
                got = [(await c.fetchone())[0] for c in curs]
                check(got == [k + 1 for k in range(7)], f"transaction: {got}")
                await conn2.commit()
        finally:
            await conn2.close()
    finally:
        await conn.close()


async def suite():
    for threshold in (0, 1, 5):
        for rep in range(3):
            try:
                await asyncio.wait_for(pipeline_checks(threshold), STALL * 4)
            except asyncio.TimeoutError:
                print(f"threshold {threshold} round {rep}: stalled", flush=True)
                return False
    print("pipeline checks passed at prepare_threshold 0, 1 and 5", flush=True)
    return True


def main():
    what = sys.argv[1]
    ok = asyncio.run(repro(int(sys.argv[2])) if what == "repro" else suite())
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
