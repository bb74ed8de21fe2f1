"""libpq 18 through psycopg 3's binary wheel (which bundles it): connects with
the conninfo in argv[1] (the test adds direct TLS and max_protocol_version),
checks that protocol 3.2 was negotiated, runs a query, then cancels a running
pg_sleep with libpq's cancel API (PQcancelCreate, which carries the 32-byte
key of 3.2 over a new connection negotiated as the first one) and checks that
the session goes on. Prints one line per check; exits non-zero on the first
failure."""

import sys
import threading
import time

import psycopg
from psycopg import errors


def main(conninfo):
    if psycopg.pq.version() < 180000:
        sys.exit(f"psycopg's libpq is {psycopg.pq.version()}, not 18: pip install 'psycopg[binary]>=3.3'")
    with psycopg.connect(conninfo, autocommit=True) as conn:
        version = conn.info.full_protocol_version
        if version != 30002:
            sys.exit(f"negotiated protocol {version}, not 30002")
        print(f"libpq {psycopg.pq.version()} negotiated protocol {version}")
        ssl = conn.pgconn.ssl_in_use
        print(f"ssl in use: {ssl}")
        row = conn.execute("select 'libpq 18 ' || current_user").fetchone()
        print(row[0])

        def cancel_soon():
            time.sleep(1.0)
            conn.cancel_safe(timeout=10)

        canceller = threading.Thread(target=cancel_soon)
        canceller.start()
        started = time.monotonic()
        try:
            conn.execute("select pg_sleep(30)")
            sys.exit("pg_sleep(30) was not cancelled")
        except errors.QueryCanceled as e:
            took = time.monotonic() - started
            if took > 10:
                sys.exit(f"cancelled only after {took:.1f} s")
            print(f"cancelled: {e.sqlstate}")
        canceller.join()
        print(conn.execute("select 'after cancel'").fetchone()[0])


if __name__ == "__main__":
    main(sys.argv[1])
