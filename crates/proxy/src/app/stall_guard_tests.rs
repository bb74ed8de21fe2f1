//! The client session's stall guard against a real Postgres, through a
//! whole weir (so it lives in `app`, above `client`): a pipeline held inside weir on
//! purpose (the tests-only `HOLD_FOR_TEST` query) is logged with the
//! session's state and counted on the pool's metrics within 5 s.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::Weir;
use crate::client::prepared::HOLD_FOR_TEST;
use crate::config::Config;
use crate::protocol::{messages, tags::backend as be};

/// Log lines, captured.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

async fn read_until_ready(s: &mut TcpStream, buf: &mut BytesMut) {
    loop {
        let f = tokio::time::timeout(Duration::from_secs(10), crate::wire::read_frame(s, buf, 1 << 20))
            .await
            .expect("weir answers")
            .expect("a frame");
        assert_ne!(f.tag, be::ERROR_RESPONSE, "{:?}", messages::parse_error_fields(&f.bytes[5..]));
        if f.tag == be::READY_FOR_QUERY {
            return;
        }
    }
}

/// A weir (pool of one, transaction mode) in front of a fresh Postgres, and
/// a client of it whose transaction is open and whose next query weir holds
/// back on purpose (`HOLD_FOR_TEST`): a stall from now on.
struct Stalled {
    _pg: weir_testkit::PgServer,
    weir: Weir,
    s: TcpStream,
    buf: BytesMut,
    pool: Arc<crate::pool::Pool>,
}

/// The tests here run one at a time: the first holds a 5 s window that a
/// neighbour's Postgres starting beside it could eat on 2 cores.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn stall() -> Stalled {
    let pg = tokio::task::spawn_blocking(|| weir_testkit::PgServer::start(Default::default()))
        .await
        .unwrap()
        .expect("start postgres");
    let dir = pg.data_dir().parent().unwrap().join("stall-guard");
    std::fs::create_dir_all(&dir).unwrap();
    let toml = format!(
        "[weir]\nlisten_addr = \"127.0.0.1:0\"\nauth_type = \"trust\"\npool_mode = \"transaction\"\n\
         default_pool_size = 1\n[databases.app]\nhost = \"127.0.0.1\"\nport = {}\n",
        pg.port()
    );
    let weir = Weir::start(Config::from_toml(&toml, &dir).unwrap()).await.unwrap();
    let mut s = TcpStream::connect(weir.local_addr()).await.unwrap();
    let mut out = BytesMut::new();
    messages::startup_message(&mut out, 196608, &[("user", weir_testkit::TRUST_USER), ("database", "app")]);
    s.write_all(&out).await.unwrap();
    let mut buf = BytesMut::new();
    read_until_ready(&mut s, &mut buf).await;
    // A statement that gets the client a server, then one weir holds back
    // while the server owes nothing: the transaction stays open.
    out.clear();
    messages::query(&mut out, "begin");
    s.write_all(&out).await.unwrap();
    read_until_ready(&mut s, &mut buf).await;
    let pool = weir.shared().pools.get("app", weir_testkit::TRUST_USER).expect("pool");
    assert_eq!(pool.metrics.stalled_pipelines(), 0);
    out.clear();
    messages::query(&mut out, &format!("{} select 1", std::str::from_utf8(HOLD_FOR_TEST).unwrap()));
    s.write_all(&out).await.unwrap();
    Stalled { _pg: pg, weir, s, buf, pool }
}

#[tokio::test]
async fn a_pipeline_stalled_inside_weir_is_logged_and_counted_within_5_s() {
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    // A current-thread runtime: weir's tasks log through this subscriber.
    let _guard = tracing::subscriber::set_default(subscriber);
    let _alone = ONE_AT_A_TIME.lock().await;
    // tracing caches each callsite's interest for the whole process, from
    // the thread that first reaches it: the other test here, run first on a
    // thread with no subscriber, leaves the stall's line cached as never
    // wanted. Asked again now, with this thread's subscriber in place.
    tracing::callsite::rebuild_interest_cache();
    // Every part held to the end: the client, weir and Postgres.
    let Stalled { _pg, weir: _weir, s: _s, buf: _buf, pool } = stall().await;
    let start = Instant::now();
    let text = || String::from_utf8_lossy(&logs.0.lock().unwrap()).into_owned();
    while start.elapsed() < Duration::from_secs(5) {
        if pool.metrics.stalled_pipelines() == 1 && text().contains("pipeline stalled inside weir") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let line = text().lines().find(|l| l.contains("pipeline stalled inside weir")).map(str::to_owned);
    assert_eq!(pool.metrics.stalled_pipelines(), 1, "counted within 5 s; log: {}", text());
    let line = line.expect("logged within 5 s");
    assert!(line.contains("WARN") && line.contains("in_batch=false") && line.contains("status=T"), "{line}");
    // Once per stall.
    tokio::time::sleep(crate::client::transfer_watchdog::STALL_LIMIT * 2).await;
    assert_eq!(pool.metrics.stalled_pipelines(), 1);
    // What /metrics serves of the pools.
    let rendered = weir_metrics::render_all();
    let series = rendered
        .lines()
        .find(|l| l.starts_with("weir_stalled_pipelines_total{") && l.contains(weir_testkit::TRUST_USER));
    assert!(series.is_some_and(|l| l.ends_with(" 1")), "{rendered}");
}

/// A stall that lasts `STALL_END` ends the session with a FATAL XX000
/// rather than leave the client waiting forever; its server is rolled back
/// and kept.
#[tokio::test]
async fn a_stall_that_lasts_ends_the_session_and_keeps_the_server() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let Stalled { _pg, weir, mut s, mut buf, pool } = stall().await;
    let limit = crate::client::transfer_watchdog::STALL_END + Duration::from_secs(30);
    let frame = tokio::time::timeout(limit, crate::wire::read_frame(&mut s, &mut buf, 1 << 20))
        .await
        .expect("the stalled session ends")
        .expect("a frame");
    assert_eq!(frame.tag, be::ERROR_RESPONSE);
    let fields = messages::parse_error_fields(&frame.bytes[5..]).unwrap();
    assert_eq!((fields.severity.as_str(), fields.code.as_str()), ("FATAL", "XX000"), "{fields:?}");
    assert!(fields.message_text().contains("pipeline stalled inside weir"), "{fields:?}");
    let end = Instant::now() + Duration::from_secs(30);
    while pool.snapshot().idle != 1 {
        assert!(Instant::now() < end, "the server is recovered: {:?}", pool.snapshot());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(pool.metrics.closed_total(), 0, "and kept");
    drop(weir);
}
