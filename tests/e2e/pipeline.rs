//! psycopg 3 pipelines through weir, in both pool modes: a pipeline whose
//! repeated query reaches psycopg's auto-prepare threshold (unnamed
//! Parse/Bind/Describe/Execute groups, then a Parse of `_pg3_0` and Binds
//! on it, all before one Sync) must get every reply in Postgres's order,
//! and psycopg's pipeline features must work at prepare_threshold 0, 1 and
//! 5. Each run has its own deadline inside the program, so a stall is
//! reported as one, never as a hung test.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;
use weir_e2e::{harness, Harness, SCRAM_PASS, SCRAM_USER};

/// How long one program may take in all.
const LIMIT: Duration = Duration::from_secs(300);

/// Runs tests/drivers/python/psycopg_pipeline.py with `args`; returns its
/// exit status and output.
async fn program(h: &Harness, args: &[&str]) -> (bool, String) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("drivers/python/psycopg_pipeline.py");
    let mut cmd = Command::new("python3");
    cmd.arg(script)
        .args(args)
        .env("WEIR_URL", h.url(SCRAM_USER, SCRAM_PASS))
        .kill_on_drop(true)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd.spawn().expect("python3 with psycopg 3: run scripts/install-deps.sh");
    let out = tokio::time::timeout(LIMIT, child.wait_with_output())
        .await
        .expect("the psycopg program finished in time")
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

async fn repro(mode: &'static str, runs: u32) {
    // One server: the statement psycopg auto-prepares is then already
    // prepared (by an earlier run) on the server weir lends.
    let h = harness(1, mode, "md5", "").await;
    let (ok, out) = program(&h, &["repro", &runs.to_string()]).await;
    println!("{mode}: {}", out.lines().last().unwrap_or_default());
    assert!(ok, "{mode}: the auto-prepare pipeline stalled or failed:\n{out}");
}

async fn suite(mode: &'static str) {
    // The pipeline checks hold two connections at once.
    let h = harness(2, mode, "md5", "").await;
    let (ok, out) = program(&h, &["suite"]).await;
    assert!(ok, "{mode}: psycopg pipeline checks failed:\n{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_prepare_in_a_pipeline_transaction_mode() {
    repro("transaction", 30).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_prepare_in_a_pipeline_session_mode() {
    repro("session", 10).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psycopg_pipelines_transaction_mode() {
    suite("transaction").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psycopg_pipelines_session_mode() {
    suite("session").await;
}

/// The long run (scripts/pipeline-repro.sh): 200 runs in transaction mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn auto_prepare_in_a_pipeline_200_runs() {
    repro("transaction", 200).await;
}
