"""psycopg's test_socket_closed (tests/test_waiting.py), run against the
conninfo in argv[1]: while `select pg_sleep(2)` runs, another thread finishes
the connection (PQfinish: Terminate, then close); each wait function must end
with "connection socket closed" (its cause an OSError) within a second, as it
does against Postgres. Runs each wait function `rounds` times (argv[2]).
Prints one line per wait function; exits non-zero on the first difference."""

import sys
import threading
import time

import psycopg
from psycopg import generators, waiting
from psycopg.pq import ConnStatus


def one(conninfo, name):
    waitfn = getattr(waiting, name)
    pgconn = psycopg.pq.PGconn.connect(conninfo.encode())
    if pgconn.status != ConnStatus.OK:
        sys.exit(f"connect failed: {pgconn.error_message!r}")

    def closer():
        time.sleep(0.5)
        pgconn.finish()

    t = threading.Thread(target=closer)
    t.start()
    pgconn.send_query(b"select pg_sleep(2)")
    t0 = time.time()
    try:
        gen = generators.execute(pgconn)
        waitfn(gen, pgconn.socket, 0.1)
        return "no error"
    except psycopg.OperationalError as e:
        message = str(e)
        if "connection socket closed" not in message:
            return f"OperationalError {message!r}"
        if not isinstance(e.__cause__, OSError):
            return f"cause {e.__cause__!r}"
    finally:
        t.join()
    if pgconn.status != ConnStatus.BAD:
        return f"status {pgconn.status}"
    dt = time.time() - t0
    if dt >= 1.0:
        return f"took {dt:.2f} s"
    return None


def main(conninfo, rounds):
    fns = [f for f in ("wait_c", "wait_poll", "wait_select", "wait_epoll", "wait_selector", "wait") if hasattr(waiting, f)]
    for name in fns:
        for i in range(rounds):
            problem = one(conninfo, name)
            if problem:
                print(f"{name}: round {i + 1}: {problem}")
                sys.exit(1)
        print(f"{name}: connection socket closed, {rounds} times")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3)
