//! A driver outside Rust: asyncpg (installed by scripts/install-deps.sh)
//! times out a queued and a running query, cancels, and keeps its connection.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use weir_e2e::{Harness, Opts, SCRAM_PASS, SCRAM_USER};
use weir_metrics::DropReason;

use super::{create_ledger, ledger_ids};

/// Fails loudly (never skips) when python3 or asyncpg is missing.
async fn require_asyncpg() {
    let probe = tokio::process::Command::new("python3")
        .args(["-c", "import asyncpg"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await;
    match probe {
        Ok(s) if s.success() => {}
        other => {
            panic!("python3 with asyncpg is required (run scripts/install-deps.sh): {other:?}")
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asyncpg_timeouts_drop_the_queued_query_and_keep_the_connection() {
    let _alone = weir_e2e::serial().await;
    require_asyncpg().await;
    let h = Harness::start(Opts { pool_size: 1, ..Opts::default() }).await;
    let direct = create_ledger(&h).await;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("drivers/python/asyncpg_timeouts.py");
    let run = tokio::process::Command::new("python3")
        .arg(&script)
        .arg(h.url(SCRAM_USER, SCRAM_PASS))
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(90), run).await.expect("the asyncpg scenario finished").unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "asyncpg scenario failed ({}):\n{stdout}\n{stderr}", out.status);
    eprintln!("{stdout}");

    assert!(ledger_ids(&direct).await.is_empty());
    let m = &h.pool().metrics;
    assert_eq!(m.dropped_queries(DropReason::Cancelled), 1, "the queued INSERT was dropped on asyncpg's cancel");
    assert_eq!(m.opened(), 1, "one server did everything");
    assert_eq!(m.closed_total(), 0, "no server was closed");
}
