//! Raw volume: a 1 GiB Query (weir streams long messages in pieces and
//! never holds one whole; a client that leaves halfway costs at most its
//! server connection, never weir's memory), and 10,000 connections at once
//! beyond max_client_conn (each refused with 53300, memory bounded).
//!
//! weir runs in this test process, so its memory is this process's VmRSS.
//! scripts/run-tests.py runs this module in a process of its own with
//! nothing beside it, and its two tests one at a time (`exclusive`), so no
//! other test's allocations move that figure (a plain `cargo test` runs
//! every module in one process, where they can).
//! The flood comes from a child `python3`, so its sockets do not count
//! against this process's open-file limit; weir holds one socket per flood
//! connection while it refuses it, so the soft RLIMIT_NOFILE is raised (up
//! to the hard limit) for 10,000 of those plus the harness, and the test
//! fails, saying so, when the hard limit is too low.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use weir::protocol::tags::frontend as fe;
use weir_e2e::raw::{header, startup, Outcome, Raw};
use weir_e2e::{exclusive, Before, Harness, Opts, APP_DB, SCRAM_USER};

/// weir may grow by at most this much during an attack.
const RSS_BUDGET: u64 = 100 << 20;

/// weir's resident memory (the harness runs weir in this process), in bytes.
pub fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS line");
    let kib: u64 = line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).expect("VmRSS value");
    kib * 1024
}

/// How much `peak` is above `base`, in bytes (0 if memory shrank).
fn growth(base: u64, peak: u64) -> u64 {
    peak.saturating_sub(base)
}

/// Samples VmRSS every 20 ms until `f` ends; returns its output and the peak.
async fn peak_rss<T>(f: impl std::future::Future<Output = T>) -> (T, u64) {
    tokio::pin!(f);
    let mut peak = rss_bytes();
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    loop {
        tokio::select! {
            out = &mut f => return (out, peak.max(rss_bytes())),
            _ = tick.tick() => peak = peak.max(rss_bytes()),
        }
    }
}

/// Sends a Query header claiming `len`, then `body_mib` MiB of a string
/// without its end, then `finish` (read what weir says, or leave).
async fn huge_query(h: &Harness, len: i32, body_mib: usize, leave: bool) -> Option<Outcome> {
    let mut c = Raw::connect(h.addr()).await;
    c.send_anyway(&startup(&[("user", SCRAM_USER), ("database", APP_DB)])).await;
    loop {
        let (tag, _) = c.next_or_reset().await.expect("login");
        if tag == weir::protocol::tags::backend::READY_FOR_QUERY {
            break;
        }
    }
    c.send_anyway(&header(fe::QUERY, len)).await;
    c.send_anyway(b"select '").await;
    let chunk = vec![b'x'; 1 << 20];
    for _ in 0..body_mib {
        c.send_anyway(&chunk).await;
    }
    if leave {
        drop(c);
        None
    } else {
        Some(c.outcome().await)
    }
}

/// The 1 GiB Query. Postgres accepts messages up to 1 GiB - 2 bytes
/// (PQ_LARGE_MESSAGE_LIMIT), and so does weir by default: a header over
/// that is refused by weir itself (08P01) before anything is sent. One at
/// the limit streams to Postgres in pieces; its client leaving after a few
/// MiB leaves a half-sent message too long to complete, so that one server
/// connection is closed (a replacement opens in parallel) and weir's
/// memory stays flat throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_gib_query_is_never_buffered() {
    exclusive(180, async {
        let h = Harness::start(Opts { auth_type: "trust", ..Default::default() }).await;
        let before = Before::take(&h).await;
        let base = rss_bytes();

        let (over, peak) = peak_rss(huge_query(&h, (1 << 30) - 1, 4, false)).await;
        let over = over.unwrap();
        assert_eq!(over.code(), "08P01", "a header past Postgres's limit: {over:?}");
        assert!(growth(base, peak) < RSS_BUDGET, "weir grew by {} MiB", growth(base, peak) >> 20);
        before.unharmed(&h).await;

        let closed = h.pool().metrics.closed_total();
        let reset_failed = h.pool().metrics.closed(weir_metrics::CloseReason::ResetFailed);
        let (_, peak) = peak_rss(async {
            huge_query(&h, (1 << 30) - 2, 8, true).await;
            let pool = h.pool();
            let quiet = weir_e2e::eventually(Duration::from_secs(20), || {
                let s = pool.snapshot();
                s.active + s.recovering == 0
            });
            assert!(quiet.await, "the half-sent query's server was dealt with");
        })
        .await;
        let grew = growth(base, peak);
        assert!(grew < RSS_BUDGET, "weir grew by {} MiB while a 1 GiB query streamed", grew >> 20);
        let m = &h.pool().metrics;
        assert_eq!(m.closed_total(), closed + 1, "only the half-fed server connection is closed");
        assert_eq!(m.closed(weir_metrics::CloseReason::ResetFailed), reset_failed + 1, "as not recoverable");
        let rows = before.keeper.simple_query("select 'still here'").await.expect("the keeper still queries");
        assert!(!rows.is_empty());
        h.client().await.simple_query("select 1").await.expect("a new client is served");
    })
    .await
}

/// File descriptors the harness itself may hold beside the flood's sockets.
const HARNESS_FILES: u64 = 1_000;

/// Makes room in this process's open-files limit for `n` flood sockets in
/// weir plus the harness: raises the soft RLIMIT_NOFILE up to the hard limit,
/// or fails saying the hard limit is too low.
fn open_files_for(n: usize) {
    let need = n as u64 + HARNESS_FILES;
    let (soft, hard) = rlimit::Resource::NOFILE.get().expect("getrlimit(RLIMIT_NOFILE)");
    if soft >= need {
        return;
    }
    assert!(
        hard >= need,
        "the open-files hard limit ({hard}) is below the {need} a flood of {n} connections needs; \
         not raised: raise the hard limit (ulimit -Hn) to run this test"
    );
    rlimit::Resource::NOFILE.set(need, hard).unwrap_or_else(|e| {
        panic!("raising the open-files soft limit from {soft} to {need} (hard {hard}) failed: {e}")
    });
    eprintln!("raised the open-files soft limit from {soft} to {need} for a flood of {n}");
}

/// The flood: `n` connections opened at once, each sending the startup packet
/// (given in hex) and reading what weir answers; prints `code count` lines.
const FLOOD_PY: &str = r#"
import asyncio, sys, collections
host, port, n, startup = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), bytes.fromhex(sys.argv[4])
async def one():
    try:
        r, w = await asyncio.wait_for(asyncio.open_connection(host, port), 60)
        w.write(startup)
        data = await asyncio.wait_for(r.read(), 60)
        w.close()
    except Exception as e:
        return 'error:' + type(e).__name__
    if not data.startswith(b'E'):
        return 'other:' + repr(data[:1])
    for field in data[5:].split(b'\0'):
        if field.startswith(b'C'):
            return field[1:].decode()
    return 'no-sqlstate'
async def main():
    got = await asyncio.gather(*(one() for _ in range(n)))
    for code, count in collections.Counter(got).items():
        print(code, count)
asyncio.run(main())
"#;

/// 10,000 connections at once while max_client_conn (50) is taken: every
/// one is refused with 53300, weir's memory stays within budget, and the
/// clients already in are served throughout and after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_flood_beyond_max_client_conn() {
    exclusive(300, async {
        let max = 50;
        let general = format!("max_client_conn = {max}");
        let h = Harness::start(Opts { auth_type: "trust", general, ..Default::default() }).await;
        let before = Before::take(&h).await;
        let mut fillers = Vec::new();
        for _ in 1..max {
            fillers.push(h.client().await);
        }
        assert_eq!(h.weir().shared().clients.load(std::sync::atomic::Ordering::SeqCst), max);
        let n = 10_000;
        open_files_for(n);
        let startup_hex: String =
            startup(&[("user", SCRAM_USER), ("database", APP_DB)]).iter().map(|b| format!("{b:02x}")).collect();
        let base = rss_bytes();
        let flood = async {
            let mut child = tokio::process::Command::new("python3")
                .args(["-c", FLOOD_PY, "127.0.0.1", &h.addr().port().to_string(), &n.to_string(), &startup_hex])
                .stdout(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .expect("python3 runs the flood");
            let mut out = String::new();
            child.stdout.take().unwrap().read_to_string(&mut out).await.unwrap();
            assert!(child.wait().await.unwrap().success(), "flood script failed");
            out
        };
        // The clients already in keep working while the flood runs.
        let during = async {
            for _ in 0..5 {
                before.keeper.simple_query("select 1").await.expect("served during the flood");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        };
        let ((out, ()), peak) = peak_rss(async { tokio::join!(flood, during) }).await;
        let counts: Vec<(String, usize)> =
            out.lines().filter_map(|l| l.split_once(' ').map(|(c, k)| (c.to_owned(), k.parse().unwrap()))).collect();
        eprintln!("flood of {n}: {counts:?}; weir grew by {} MiB at most", growth(base, peak) >> 20);
        assert_eq!(counts, vec![("53300".to_owned(), n)], "every flood connection gets 53300");
        assert!(growth(base, peak) < RSS_BUDGET, "weir grew by {} MiB", growth(base, peak) >> 20);

        drop(fillers);
        let clients = &h.weir().shared().clients;
        let settled =
            weir_e2e::eventually(Duration::from_secs(10), || clients.load(std::sync::atomic::Ordering::SeqCst) == 1);
        assert!(settled.await, "the fillers' and the flood's slots were given back");
        before.unharmed(&h).await;
    })
    .await
}
