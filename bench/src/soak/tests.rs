//! The soak's own parts against a real Postgres: the raw client (login,
//! simple and extended protocol, pipelines, errors, cancel) and the ledger
//! check reading Postgres's rows (a lost, a duplicated and a phantom row are
//! found).

use std::time::Duration;

use bytes::BytesMut;
use weir_testkit::{PgOptions, PgServer, APP_DB, TRUST_USER};

use super::load::Outcome;
use super::wire::{self, Conn};

const LIMIT: Duration = Duration::from_secs(10);

fn postgres() -> PgServer {
    PgServer::start(PgOptions { log_connections: false, ..PgOptions::default() }).expect("a throwaway Postgres")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime")
}

#[test]
fn wire_client_speaks_to_postgres() {
    let pg = postgres();
    let addr = format!("127.0.0.1:{}", pg.port());
    runtime().block_on(async {
        let mut c = Conn::connect(&addr, TRUST_USER, APP_DB, LIMIT).await.expect("login");
        assert!(c.key.is_some(), "BackendKeyData kept");
        let r = c.simple("select 1; select 2", LIMIT).await.expect("simple");
        assert_eq!((r.rows, r.ready, r.status), (2, 1, b'I'));
        let r = c.simple("begin; select 1/0", LIMIT).await.expect("an error is a reply");
        assert_eq!((r.errors.as_slice(), r.status), (&["22012".to_string()][..], b'E'));
        assert_eq!(r.messages, ["division by zero"]);
        let r = c.simple("commit", LIMIT).await.expect("commit");
        assert_eq!(r.tags, ["ROLLBACK"], "COMMIT of a failed transaction answers ROLLBACK");

        let mut out = BytesMut::new();
        wire::extended(&mut out, "named", "select $1::int + 1", &["41"], false);
        wire::sync(&mut out);
        wire::extended(&mut out, "named", "select $1::int + 1", &["1"], true);
        wire::extended(&mut out, "", "select $1::text", &["x"], false);
        wire::sync(&mut out);
        let r = c.exchange(&out, 2, LIMIT).await.expect("pipeline");
        assert_eq!((r.rows, r.ready, r.errors.len()), (3, 2, 0));

        let key = c.key.expect("key");
        c.write(&wire::query("select pg_sleep(10)")).await.expect("write");
        tokio::time::sleep(Duration::from_millis(200)).await;
        wire::cancel(&addr, key).await;
        let r = c.exchange(&[], 1, LIMIT).await.expect("cancelled reply");
        assert_eq!(r.errors, ["57014"]);
        c.terminate().await;

        let refused = Conn::connect(&addr, TRUST_USER, "no_such_db", LIMIT).await.err().expect("refused");
        assert_eq!(refused.label(), "3D000");
    });
}

#[test]
fn ledger_check_reads_postgres_rows() {
    let pg = postgres();
    runtime().block_on(async {
        super::create_schema(&pg).await.expect("schema");
        let direct = super::faults::direct(&pg).await.expect("direct");
        direct
            .batch_execute(
                "insert into soak_ledger(id, writer) values (1, 'w'), (3, 'w'), (3, 'w'), (4, 'w'), (5, 'w');
                 update soak_counter set n = 5",
            )
            .await
            .expect("rows");
        let records = [
            (1, Outcome::Acked),
            (2, Outcome::Acked),
            (3, Outcome::Acked),
            (4, Outcome::Failed),
            (5, Outcome::Ambiguous),
        ];
        let l = super::check_ledger(&pg, &records).await.expect("check");
        assert_eq!((l.lost, l.duplicated, l.phantom, l.ambiguous_committed), (1, 1, 1, 1));
        assert_eq!((l.rows, l.counter), (5, 5));
        assert!(!l.ok());
        direct
            .batch_execute("delete from soak_ledger where id in (3, 4); insert into soak_ledger values (2, 'w')")
            .await
            .expect("fix");
        direct
            .batch_execute("insert into soak_ledger(id, writer) values (3, 'w'); update soak_counter set n = 4")
            .await
            .expect("fix");
        let l = super::check_ledger(&pg, &records).await.expect("check");
        assert!(l.ok(), "{l:?}");
    });
}
