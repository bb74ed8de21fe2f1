#!/usr/bin/env python3
"""asyncpg through weir: the driver's own timeout on a queued query and on a
running query.

asyncpg answers its timeout with a CancelRequest on a new socket, waits for
the cancelled statement's ReadyForQuery and keeps using the connection. weir
must drop the queued query (never run it), cancel the running one on its
server, and leave the connection and the server usable.

Usage: python3 asyncpg_timeouts.py <weir-url>
Exit status 0 means every check passed; anything else names what failed.
The pool behind <weir-url> must have exactly one server, and a table
ledger(id bigint primary key, ...) must exist.
"""

import asyncio
import sys
import time

import asyncpg

TIMEOUT = 0.3


def check(ok, what):
    if not ok:
        raise AssertionError(what)
    print(f"ok: {what}")


async def timed_out(conn, sql):
    """Runs sql with asyncpg's timeout; returns seconds until it gave up."""
    started = time.monotonic()
    try:
        await conn.execute(sql, timeout=TIMEOUT)
    except asyncio.TimeoutError:
        return time.monotonic() - started
    raise AssertionError(f"{sql!r} finished instead of timing out")


async def main(url):
    # statement_cache_size=0: no named prepared statements across transactions.
    holder = await asyncpg.connect(url, statement_cache_size=0)
    client = await asyncpg.connect(url, statement_cache_size=0)
    try:
        await holder.execute("begin")
        server_pid = await holder.fetchval("select pg_backend_pid()")

        # 1. Queued: the pool's one server is held, the INSERT waits in weir.
        took = await timed_out(client, "insert into ledger(id) values (9001)")
        check(took < TIMEOUT + 0.2, f"queued INSERT timed out after {took:.3f}s")
        # asyncpg raises TimeoutError before its CancelRequest has even been
        # sent (that runs in a background task). Give it time to land while
        # the INSERT is still queued; otherwise the commit below frees the
        # server first and the INSERT runs, as it would on Postgres itself.
        await asyncio.sleep(0.5)
        await holder.execute("commit")
        async with client.transaction():
            check(await client.fetchval("select 41 + 1") == 42, "the connection is usable after the queued cancel")
            pid = await client.fetchval("select pg_backend_pid()")
        check(pid == server_pid, "it runs on the pool's same server")

        # 2. Running: the INSERT is on the server, asyncpg's cancel is forwarded.
        took = await timed_out(client, "insert into ledger(id) select 9002 from pg_sleep(5)")
        check(took < TIMEOUT + 0.2, f"running INSERT timed out after {took:.3f}s")
        started = time.monotonic()
        check(await client.fetchval("select 7") == 7, "the connection is usable after the running cancel")
        waited = time.monotonic() - started
        check(waited < 2.0, f"the next query did not wait for pg_sleep(5) ({waited:.3f}s)")
        async with client.transaction():
            pid = await client.fetchval("select pg_backend_pid()")
        check(pid == server_pid, "the same server survived the cancel")

        await asyncio.sleep(0.5)
        rows = await holder.fetch("select id from ledger where id in (9001, 9002) order by id")
        check(not rows, f"neither cancelled INSERT left a row (found {[r['id'] for r in rows]})")
    finally:
        await client.close()
        await holder.close()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    try:
        asyncio.run(asyncio.wait_for(main(sys.argv[1]), 60))
    except Exception as e:  # report and fail, whatever it was
        print(f"FAILED: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
