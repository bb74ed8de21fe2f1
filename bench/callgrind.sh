#!/usr/bin/env bash
# Instructions per transaction of a weir binary under pgbench -S, counted by
# callgrind: repeatable where CPU time on this shared 2-core VM is not (runs
# of the same build differ by about 5 %, against 10-40 % for CPU time).
#
#   bench/callgrind.sh [WEIR_BIN] [CLIENTS] [MODE] [SECONDS]
#   bench/callgrind.sh target/release/weir 1000 simple 12
#
# Starts a throwaway Postgres 15 (as the postgres user when root) and weir
# (pool 20, transaction mode, md5) under valgrind with instrumentation off;
# switches it on once the pgbench clients are logged in (WARMUP, default 25 s),
# counts SECONDS, and divides by the transactions Postgres committed meanwhile
# and by the pairs of send() calls counted (one to the server, one to the
# client per transaction: the closer figure, as the commits may stray past the
# window). Prints one line and leaves the callgrind file (for
# callgrind_annotate) in $OUT (default /tmp/weir-callgrind). Needs valgrind,
# pgbench, psql.
set -euo pipefail
bin=$(realpath "${1:-target/release/weir}")
clients=${2:-1000}
mode=${3:-simple}
secs=${4:-12}
out=${OUT:-/tmp/weir-callgrind}
pgbin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
command -v valgrind >/dev/null || { echo "valgrind is not installed (apt-get install valgrind)"; exit 1; }

rm -rf "$out" && mkdir -p "$out"
as_pg() { if [ "$(id -u)" = 0 ]; then chown -R postgres "$out"; runuser -u postgres -- "$@"; else "$@"; fi; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
pg_port=$(free_port)
weir_port=$(free_port)
while [ "$weir_port" = "$pg_port" ]; do weir_port=$(free_port); done

as_pg "$pgbin/initdb" -D "$out/pg" -A trust -U postgres >/dev/null
cat >>"$out/pg/postgresql.conf" <<EOF
port = $pg_port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$out'
max_connections = 200
fsync = off
synchronous_commit = off
EOF
as_pg "$pgbin/pg_ctl" -D "$out/pg" -l "$out/pg.log" -w start >/dev/null
vg=
cleanup() {
    [ -n "$vg" ] && kill "$vg" 2>/dev/null && wait "$vg" 2>/dev/null
    as_pg "$pgbin/pg_ctl" -D "$out/pg" -m immediate stop >/dev/null 2>&1 || true
}
trap cleanup EXIT
psql() { command psql -h 127.0.0.1 -p "$pg_port" -U postgres -qAt "$@"; }
psql -c "create user bench password 'bench' superuser" -c "create database app owner bench"
PGPASSWORD=bench pgbench -q -i -s 10 -h 127.0.0.1 -p "$pg_port" -U bench app >/dev/null 2>&1

echo '"bench" "bench"' >"$out/userlist.txt"
cat >"$out/weir.toml" <<EOF
[weir]
listen_addr = "127.0.0.1:$weir_port"
auth_type = "md5"
auth_file = "userlist.txt"
pool_mode = "transaction"
default_pool_size = 20
max_client_conn = 30000
log_connections = false
log_disconnections = false

[databases.app]
host = "127.0.0.1"
port = $pg_port
EOF
valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$out/callgrind.out" \
    "$bin" --config "$out/weir.toml" >"$out/weir.log" 2>&1 &
vg=$!
for _ in $(seq 100); do
    PGPASSWORD=bench command psql -h 127.0.0.1 -p "$weir_port" -U bench app -qAtc 'select 1' >/dev/null 2>&1 && break
    sleep 0.3
done
PGPASSWORD=bench pgbench -n -S -M "$mode" -c "$clients" -j 2 -T $((secs + ${WARMUP:-25} + 10)) \
    -h 127.0.0.1 -p "$weir_port" -U bench app >"$out/pgbench.log" 2>&1 &
pb=$!
# Logins under valgrind take a while (about 20 s for 1,000 md5 clients here).
sleep "${WARMUP:-25}"
committed() { psql -c "select xact_commit from pg_stat_database where datname = 'app'"; }
a=$(committed)
callgrind_control -i on "$vg" >/dev/null 2>&1
sleep "$secs"
callgrind_control -d "$vg" >/dev/null 2>&1
callgrind_control -i off "$vg" >/dev/null 2>&1
b=$(committed)
kill "$pb" 2>/dev/null || true
wait "$pb" 2>/dev/null || true
ir=$(callgrind_annotate "$out/callgrind.out.1" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
tx=$((b - a))
# Each transaction makes two send() calls (to the server, to the client):
# counted inside the window, where the commits above may stray past it.
sends=$(callgrind_annotate --tree=calling "$out/callgrind.out.1" 2>/dev/null \
    | grep -E '>   .*send\.c:send \(' | grep -oE '\([0-9,]+x\)' | tr -d '(),x' | awk '{s += $1} END {if (NR) print s}' || true)
by_sends=
[ -n "$sends" ] && [ "$sends" -gt 1 ] && by_sends=", $((ir * 2 / sends)) per send() pair"
echo "weir $(basename "$bin"): -S -M $mode -c $clients, ${secs}s: $tx transactions, $ir instructions, $((ir / tx)) per transaction${by_sends}"
