"""Conformance program for asyncpg through weir in transaction mode.

asyncpg prepares every query under its own name (__asyncpg_stmt_N__) and
closes statements its cache (statement_cache_size=10 here) evicts.
Reads WEIR_URL; exits 0 when every check passed.
"""

import asyncio
import os
import sys

import asyncpg

URL = os.environ["WEIR_URL"]
CLIENTS = int(os.environ.get("WEIR_CLIENTS", "20"))


def check(ok, what):
    if not ok:
        raise AssertionError(what)


async def connect():
    return await asyncpg.connect(URL, statement_cache_size=10)


async def worker(i):
    conn = await connect()
    try:
        # Prepared queries reused across many transactions.
        stmt = await conn.prepare("select $1::int * 2")
        for k in range(30):
            got = await stmt.fetchval(k)
            check(got == 2 * k, f"reuse: {k}*2 gave {got}")
        # More distinct statements than max_prepared_statements and the cache.
        for j in range(40):
            got = await conn.fetchval(f"select $1::int + {j}", i)
            check(got == i + j, f"distinct {j} gave {got}")
        # Commit and rollback.
        async with conn.transaction():
            await conn.execute("insert into drv_asyncpg (id, note) values ($1, $2)", i * 1000 + 1, "tx")
        tx = conn.transaction()
        await tx.start()
        await conn.execute("insert into drv_asyncpg (id, note) values ($1, $2)", i * 1000 + 2, "tx")
        await tx.rollback()
        n = await conn.fetchval("select count(*) from drv_asyncpg where id = any($1)", [i * 1000 + 1, i * 1000 + 2])
        check(n == 1, f"commit/rollback left {n} rows")
        # An error inside a transaction, then recovery.
        tx = conn.transaction()
        await tx.start()
        try:
            await conn.fetchval("select 1 / $1::int", 0)
            raise AssertionError("division by zero did not fail")
        except asyncpg.DivisionByZeroError:
            pass
        try:
            await conn.fetchval("select 1")
            raise AssertionError("aborted transaction did not fail")
        except asyncpg.InFailedSQLTransactionError:
            pass
        await tx.rollback()
        check(await stmt.fetchval(21) == 42, "recovery")
        # NULLs and binary parameters (asyncpg speaks binary).
        blob = bytes([0, 1, 2, 255, 0, 127])
        row = await conn.fetchrow("select $1::bytea, $2::text, $3::int4", blob, None, None)
        check(tuple(row) == (blob, None, None), f"nulls/binary: {row!r}")
        # COPY.
        copied = await conn.copy_records_to_table(
            "drv_asyncpg", records=[(i * 1000 + 100 + r, None) for r in range(10)], columns=["id", "note"]
        )
        check(copied == "COPY 10", f"copy: {copied}")
        # A statement timeout through the driver's own API (asyncpg cancels it).
        if i % 5 == 0:
            try:
                await conn.execute("select pg_sleep(5)", timeout=0.3)
                raise AssertionError("pg_sleep(5) did not time out")
            except asyncio.TimeoutError:
                pass
            check(await stmt.fetchval(21) == 42, "after timeout")
    finally:
        await conn.close()


async def main():
    conn = await connect()
    await conn.execute("drop table if exists drv_asyncpg")
    await conn.execute("create table drv_asyncpg (id int primary key, note text)")
    results = await asyncio.wait_for(
        asyncio.gather(*(worker(i) for i in range(CLIENTS)), return_exceptions=True), 120
    )
    failures = [f"client {i}: {type(r).__name__}: {r}" for i, r in enumerate(results) if r is not None]
    total = await conn.fetchval("select count(*) from drv_asyncpg")
    await conn.close()
    if total != CLIENTS * 11:
        failures.append(f"total rows {total}")
    for f in failures:
        print("FAIL:", f)
    if failures:
        sys.exit(1)
    print(f"asyncpg {asyncpg.__version__}: {CLIENTS} clients passed")


if __name__ == "__main__":
    asyncio.run(main())
