//! The console against PgBouncer's. weir's columns must start with
//! PgBouncer 1.23's (names, order and type OIDs, as its admin.c and stats.c
//! declare them, listed below), with the columns 1.25 inserted (the client
//! limits in DATABASES and USERS, a user's reserve_pool_size, the sockets'
//! id, load_balance_hosts in DATABASES and POOLS, the prepared statements'
//! parse and bind counts in the STATS). Debian's PgBouncer (1.18) and weir run on
//! the same Postgres, every SHOW runs on both, and each of 1.18's columns
//! must be in weir's with its type and in its relative order (1.23 inserted
//! columns between 1.18's). Then the figures PgBouncer's tools read are
//! real: bytes, query time, a client's wait, and averages over the last
//! stats_period.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use weir_e2e::pgbouncer::{describe, Described, PgBouncer};
use weir_e2e::process::{rows, WeirProcess, ADMIN_PASS, ADMIN_USER};
use weir_e2e::{connect, pg, SCRAM_PASS, SCRAM_USER};

/// Every SHOW of PgBouncer (1.23's list).
const SHOWS: &[&str] = &[
    "STATS",
    "STATS_TOTALS",
    "STATS_AVERAGES",
    "TOTALS",
    "POOLS",
    "CLIENTS",
    "SERVERS",
    "DATABASES",
    "USERS",
    "CONFIG",
    "LISTS",
    "MEM",
    "SOCKETS",
    "ACTIVE_SOCKETS",
    "DNS_HOSTS",
    "DNS_ZONES",
    "FDS",
    "STATE",
    "PEERS",
    "PEER_POOLS",
    "VERSION",
    "HELP",
];

/// PgBouncer 1.23's columns per SHOW: its type letters (s text, i int4,
/// q int8, N numeric, b bytea, T a time as text) and names.
const PGBOUNCER_1_23: &[(&str, &str, &str)] = &[
    (
        "STATS",
        "sNNNNNNNNNNNNNNNNNNNNNN",
        "database total_server_assignment_count total_xact_count total_query_count total_received total_sent \
         total_xact_time total_query_time total_wait_time total_client_parse_count total_server_parse_count \
         total_bind_count avg_server_assignment_count avg_xact_count avg_query_count avg_recv avg_sent avg_xact_time \
         avg_query_time avg_wait_time avg_client_parse_count avg_server_parse_count avg_bind_count",
    ),
    (
        "STATS_TOTALS",
        "sNNNNNNNNNNN",
        "database server_assignment_count xact_count query_count bytes_received bytes_sent xact_time query_time wait_time \
         client_parse_count server_parse_count bind_count",
    ),
    (
        "STATS_AVERAGES",
        "sNNNNNNNNNNN",
        "database server_assignment_count xact_count query_count bytes_received bytes_sent xact_time query_time wait_time \
         avg_client_parse_count avg_server_parse_count avg_bind_count",
    ),
    ("TOTALS", "sN", "name value"),
    (
        "POOLS",
        "ssiiiiiiiiiiiiiss",
        "database user cl_active cl_waiting cl_active_cancel_req cl_waiting_cancel_req sv_active sv_active_cancel \
         sv_being_canceled sv_idle sv_used sv_tested sv_login maxwait maxwait_us pool_mode load_balance_hosts",
    ),
    ("CLIENTS", CONNECTION_TYPES, CONNECTION_NAMES),
    ("SERVERS", CONNECTION_TYPES, CONNECTION_NAMES),
    (
        "DATABASES",
        "ssissiiiissiiiiii",
        "name host port database force_user pool_size min_pool_size reserve_pool server_lifetime pool_mode \
         load_balance_hosts max_connections current_connections max_client_connections current_client_connections paused disabled",
    ),
    (
        "USERS",
        "ssssiiii",
        "name pool_size reserve_pool_size pool_mode max_user_connections current_connections \
         max_user_client_connections current_client_connections",
    ),
    ("CONFIG", "ssss", "key value default changeable"),
    ("LISTS", "si", "list items"),
    ("MEM", "siiii", "name size used free memtotal"),
    ("SOCKETS", "ssssssisiTTiiississiiiiiiiii", SOCKET_NAMES),
    ("ACTIVE_SOCKETS", "ssssssisiTTiiississiiiiiiiii", SOCKET_NAMES),
    ("DNS_HOSTS", "sqs", "hostname ttl addrs"),
    ("DNS_ZONES", "sqi", "zonename serial count"),
    (
        "FDS",
        "issssiqisssssbb",
        "fd task user database addr port cancel link client_encoding std_strings datestyle timezone password \
         scram_client_key scram_server_key",
    ),
    ("STATE", "ss", "key value"),
    ("PEERS", "isii", "peer_id host port pool_size"),
    ("PEER_POOLS", "iiiii", "peer_id cl_active_cancel_req cl_waiting_cancel_req sv_active_cancel sv_login"),
    ("VERSION", "s", "version"),
];
const CONNECTION_TYPES: &str = "ssssssisiTTiiississi";
const CONNECTION_NAMES: &str = "type user database replication state addr port local_addr local_port connect_time \
    request_time wait wait_us close_needed ptr link remote_pid tls application_name prepared_statements";
const SOCKET_NAMES: &str = "type user database replication state addr port local_addr local_port connect_time \
    request_time wait wait_us close_needed ptr link remote_pid tls application_name prepared_statements id recv_pos \
    pkt_pos pkt_remain send_pos send_remain pkt_avail send_avail";

/// The columns of a `PGBOUNCER_1_23` entry, with type OIDs.
fn columns_1_23(types: &str, names: &str) -> Vec<(String, u32)> {
    let oid = |t: char| match t {
        's' | 'T' => 25,
        'i' => 23,
        'q' => 20,
        'N' => 1700,
        'b' => 17,
        other => panic!("type letter {other}"),
    };
    let names: Vec<&str> = names.split_whitespace().collect();
    assert_eq!(names.len(), types.len(), "{names:?}");
    names.into_iter().zip(types.chars()).map(|(n, t)| (n.to_owned(), oid(t))).collect()
}

/// True when every item of `part` is in `whole`, in the same order.
fn in_order(part: &[(String, u32)], whole: &[(String, u32)]) -> bool {
    let mut rest = whole.iter();
    part.iter().all(|c| rest.any(|w| w == c))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_show_starts_with_pgbouncers_columns_and_types() {
    let pg = pg().await;
    let w = WeirProcess::start(&pg, "", "").await;
    let c = connect(&w.url(SCRAM_USER, SCRAM_PASS)).await.unwrap();
    c.simple_query("select 1").await.unwrap();
    let bouncer = PgBouncer::start(pg.port(), ADMIN_USER).expect("Debian's pgbouncer (scripts/install-deps.sh)");

    let (port, weir_port) = (bouncer.port, w.port);
    let theirs: HashMap<_, _> =
        tokio::task::spawn_blocking(move || describe(port, ADMIN_USER, "", SHOWS)).await.unwrap().into_iter().collect();
    let ours: HashMap<_, _> = tokio::task::spawn_blocking(move || describe(weir_port, ADMIN_USER, ADMIN_PASS, SHOWS))
        .await
        .unwrap()
        .into_iter()
        .collect();
    for (show, types, names) in PGBOUNCER_1_23 {
        let Some(Described::Columns(ours)) = ours.get(*show) else {
            panic!("weir's SHOW {show} gave no result set: {:?}", ours.get(*show));
        };
        let expected = columns_1_23(types, names);
        let head: Vec<_> = ours.iter().take(expected.len()).cloned().collect();
        assert_eq!(head, expected, "SHOW {show}: weir's columns must start with PgBouncer 1.23's");
    }
    let mut compared = Vec::new();
    for show in SHOWS {
        let Some(Described::Columns(ours)) = ours.get(*show) else {
            panic!("weir's SHOW {show} gave no result set: {:?}", ours.get(*show));
        };
        match theirs.get(*show).expect("pgbouncer answered") {
            Described::Columns(theirs) => {
                assert!(
                    in_order(theirs, ours),
                    "SHOW {show}: each of PgBouncer 1.18's columns must be in weir's, with its type and in its order\n\
                     1.18: {theirs:?}\nweir: {ours:?}"
                );
                compared.push(*show);
            }
            // PgBouncer's SHOW HELP is notices only: no columns to match.
            Described::NoRows => assert_eq!(*show, "HELP"),
            // A command this PgBouncer lacks (1.18 has no SHOW STATE).
            Described::Error(e) => assert!(e.contains("invalid command"), "SHOW {show} on pgbouncer: {e}"),
        }
    }
    assert!(compared.len() >= 18, "compared only {compared:?}");
}

/// The `app` row of a SHOW.
async fn app_row(w: &WeirProcess, show: &str) -> HashMap<String, String> {
    let out = w.admin(show).await.unwrap();
    rows(&out).into_iter().find(|r| r["database"] == "app").unwrap_or_else(|| panic!("{show}: no app row: {out}"))
}

fn num(row: &HashMap<String, String>, col: &str) -> u64 {
    row[col].parse().unwrap_or_else(|_| panic!("{col} in {row:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_query_time_and_waits_are_counted() {
    let pg = pg().await;
    let w = WeirProcess::start(&pg, "stats_period = \"1s\"", "pool_size = 1").await;
    let c = connect(&w.url(SCRAM_USER, SCRAM_PASS)).await.unwrap();
    let sql = "select repeat('x', 1000), pg_sleep(0.05)";
    c.simple_query(sql).await.unwrap();
    let stats = app_row(&w, "SHOW STATS").await;
    assert!(num(&stats, "total_received") >= sql.len() as u64, "{stats:?}");
    assert!(num(&stats, "total_sent") >= 1000, "{stats:?}");
    assert!(num(&stats, "total_query_time") >= 50_000, "pg_sleep(0.05) is 50 ms of query time: {stats:?}");
    let totals = app_row(&w, "SHOW STATS_TOTALS").await;
    assert_eq!(totals["bytes_received"], stats["total_received"], "{totals:?}");

    // The averages cover the last completed stats_period (1 s here).
    let mut seen = false;
    for _ in 0..40 {
        c.simple_query("select 1").await.unwrap();
        let avg = app_row(&w, "SHOW STATS_AVERAGES").await;
        if num(&avg, "query_count") > 0 && num(&avg, "bytes_received") > 0 {
            seen = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(seen, "averages over the last period appear once one completes");
    // After a quiet period, they fall back to zero: not weir's lifetime.
    let mut quiet = false;
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if num(&app_row(&w, "SHOW STATS_AVERAGES").await, "query_count") == 0 {
            quiet = true;
            break;
        }
    }
    assert!(quiet, "a period without queries averages zero");
    assert!(num(&app_row(&w, "SHOW STATS").await, "total_query_count") >= 2, "totals stay");

    // A client queued behind the only server shows its wait.
    let busy = connect(&w.url(SCRAM_USER, SCRAM_PASS)).await.unwrap();
    // The holder's query runs until the wait was seen, then is cancelled: a
    // short sleep could end first on a loaded machine.
    let hold = "select pg_sleep(60)";
    let holder = tokio::spawn(async move { c.simple_query(hold).await.map(|_| c) });
    let direct = weir_e2e::direct_client(&pg).await;
    weir_e2e::until_running(&direct, hold, 1).await;
    let queued = tokio::spawn(async move { busy.simple_query("select 2").await.map(|_| busy) });
    let mut waited = None;
    let end = Instant::now() + weir_e2e::WAIT_LIMIT;
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let clients = rows(&w.admin("SHOW CLIENTS").await.unwrap());
        if let Some(r) = clients.iter().find(|r| r["state"] == "waiting" && r["database"] == "app") {
            let us = num(r, "wait") * 1_000_000 + num(r, "wait_us");
            if us > 0 {
                waited = Some(r.clone());
                break;
            }
        }
    }
    let waited = waited.expect("a waiting client with its wait so far");
    assert_eq!(waited["close_needed"], "0");
    assert!(!waited["request_time"].is_empty(), "{waited:?}");
    direct
        .simple_query(&format!("select pg_cancel_backend(pid) from pg_stat_activity where query = '{hold}'"))
        .await
        .unwrap();
    let e = holder.await.unwrap().expect_err("the holder's query was cancelled");
    assert_eq!(weir_e2e::sqlstate(&e).as_deref(), Some("57014"), "{e}");
    queued.await.unwrap().unwrap();
    let stats = app_row(&w, "SHOW STATS").await;
    assert!(num(&stats, "total_wait_time") > 0, "{stats:?}");
}
