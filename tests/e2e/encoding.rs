//! Server text in any client encoding passes through weir byte for byte:
//! a LATIN9 client on a UTF8 database, a LATIN1 database, an EUC_JP client,
//! a SQL_ASCII database.
//! Each client gets exactly the bytes the same client gets straight from
//! Postgres, and afterwards the client and its server connection live on.
//! Every case runs in session and in transaction mode.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::BufMut;
use weir::protocol::tags::{backend as be, frontend as fe};
use weir_e2e::{pg, Harness, Opts, PgServer, TRUST_USER};

use weir_e2e::raw::Raw;

const MODES: [&str; 2] = ["session", "transaction"];

/// One client's case: how it connects (through weir and straight to
/// Postgres) and the statement, in the client's encoding.
struct Case {
    /// Extra `[databases.app]` lines for weir.
    database: String,
    /// Extra startup parameters through weir and straight to Postgres.
    via_weir: &'static [(&'static str, &'static str)],
    direct: &'static [(&'static str, &'static str)],
    sql: &'static [u8],
    /// The SQLSTATE, and a field of the ErrorResponse with its exact bytes.
    code: &'static [u8],
    field: (u8, &'static [u8]),
}

/// Sends a simple Query of raw bytes; returns every message up to ReadyForQuery.
async fn run(raw: &mut Raw, sql: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut out = vec![fe::QUERY];
    out.put_i32((4 + sql.len() + 1) as i32);
    out.extend_from_slice(sql);
    out.push(0);
    raw.send(&out).await.unwrap();
    let mut got = Vec::new();
    loop {
        let (tag, body) = raw.read_msg().await.unwrap();
        got.push((tag, body.to_vec()));
        if tag == be::READY_FOR_QUERY {
            return got;
        }
    }
}

/// A field of the first ErrorResponse among `msgs`, as bytes.
fn error_field(msgs: &[(u8, Vec<u8>)], code: u8) -> Option<Vec<u8>> {
    let (_, body) = msgs.iter().find(|(t, _)| *t == be::ERROR_RESPONSE)?;
    let mut rest = &body[..];
    while let Some((&f, tail)) = rest.split_first() {
        let end = tail.iter().position(|&b| b == 0)?;
        if f == code {
            return Some(tail[..end].to_vec());
        }
        rest = &tail[end + 1..];
    }
    None
}

/// Backends of `TRUST_USER` other than `except` (the direct client's).
fn weir_backends(h: &Harness, except: i32) -> BTreeSet<i32> {
    h.server_pids(TRUST_USER).into_iter().filter(|&p| p != except).collect()
}

async fn pid(raw: &mut Raw) -> i32 {
    raw.query("select pg_backend_pid()").await.unwrap().scalar().unwrap().parse().unwrap()
}

async fn check(pg: &Arc<PgServer>, case: &Case) {
    for mode in MODES {
        let opts = Opts { pool_mode: mode, auth_type: "trust", database: case.database.clone(), ..Opts::default() };
        let h = Harness::start_with(pg.clone(), opts).await;
        let pg_addr: SocketAddr = format!("127.0.0.1:{}", pg.port()).parse().unwrap();
        let mut direct = Raw::login(pg_addr, TRUST_USER, "", case.direct).await.unwrap();
        let direct_pid = pid(&mut direct).await;
        let mut client = Raw::login(h.addr(), TRUST_USER, "", case.via_weir).await.unwrap();
        assert_eq!(client.query("select 1").await.unwrap().scalar(), Some("1"));
        let servers = weir_backends(&h, direct_pid);
        assert!(!servers.is_empty());
        for round in 0..2 {
            let want = run(&mut direct, case.sql).await;
            let got = run(&mut client, case.sql).await;
            assert_eq!(error_field(&want, b'C').as_deref(), Some(case.code), "{mode}: direct {want:?}");
            assert_eq!(error_field(&want, case.field.0).as_deref(), Some(case.field.1), "{mode}: direct {want:?}");
            assert_eq!(got, want, "{mode}, round {round}: weir passes on the server's exact bytes");
        }
        // The client and its server live on.
        assert_eq!(client.query("select 41 + 1").await.unwrap().scalar(), Some("42"), "{mode}");
        let after = weir_backends(&h, direct_pid);
        assert!(servers.is_subset(&after), "{mode}: no server connection closed: {servers:?} then {after:?}");
    }
}

/// `RAISE EXCEPTION 'foo€bar'` for a LATIN9 client: the euro sign is 0xA4.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latin9_client_on_a_utf8_database() {
    let pg = Arc::new(pg().await);
    let latin9 = &[("client_encoding", "LATIN9")];
    check(
        &pg,
        &Case {
            database: String::new(),
            via_weir: latin9,
            direct: latin9,
            sql: b"DO $$BEGIN RAISE EXCEPTION 'foo\xa4bar'; END$$",
            code: b"P0001",
            field: (b'M', b"foo\xa4bar"),
        },
    )
    .await;
}

/// A LATIN1 database (its clients default to LATIN1): a unique violation on
/// 'Jos\xe9' names the key in LATIN1 in its DETAIL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unique_violation_on_a_non_ascii_key_in_a_latin1_database() {
    let pg = Arc::new(pg().await);
    let create = "create database latin1db encoding 'LATIN1' lc_collate 'C' lc_ctype 'C' template template0";
    pg.psql("postgres", create).unwrap();
    pg.psql(
        "latin1db",
        &format!(
            "create table people (name text primary key); insert into people values ('Jos' || chr(233)); \
             grant all on people to {TRUST_USER}"
        ),
    )
    .unwrap();
    check(
        &pg,
        &Case {
            database: "dbname = \"latin1db\"\n".into(),
            via_weir: &[],
            direct: &[("database", "latin1db")],
            sql: b"insert into people values ('Jos\xe9')",
            code: b"23505",
            field: (b'D', b"Key (name)=(Jos\xe9) already exists."),
        },
    )
    .await;
}

/// An EUC_JP client: a NOTICE and an ERROR in Japanese (EUC_JP bytes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn euc_jp_client_gets_its_notice_and_error() {
    let pg = Arc::new(pg().await);
    let euc_jp = &[("client_encoding", "EUC_JP")];
    check(
        &pg,
        &Case {
            database: String::new(),
            via_weir: euc_jp,
            direct: euc_jp,
            sql: b"DO $$BEGIN RAISE NOTICE '\xc6\xfc\xcb\xdc'; RAISE EXCEPTION '\xc6\xfc\xcb\xdc\xb8\xec'; END$$",
            code: b"P0001",
            field: (b'M', b"\xc6\xfc\xcb\xdc\xb8\xec"),
        },
    )
    .await;
}

/// A SQL_ASCII database: Postgres passes any byte through unconverted, so a
/// message can hold bytes that are valid in no encoding at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_ascii_database_passes_any_byte() {
    let pg = Arc::new(pg().await);
    let create = "create database asciidb encoding 'SQL_ASCII' lc_collate 'C' lc_ctype 'C' template template0";
    pg.psql("postgres", create).unwrap();
    check(
        &pg,
        &Case {
            database: "dbname = \"asciidb\"\n".into(),
            via_weir: &[],
            direct: &[("database", "asciidb")],
            sql: b"DO $$BEGIN RAISE WARNING '\xff\xfe'; RAISE EXCEPTION 'bad \xc3\x28 bytes'; END$$",
            code: b"P0001",
            field: (b'M', b"bad \xc3\x28 bytes"),
        },
    )
    .await;
}
