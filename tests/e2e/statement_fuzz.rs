//! A differential fuzzer for the statement path: sequences of
//! extended-protocol messages from several clients at once (named and
//! unnamed Parse, Bind, Describe of statements and portals, Execute with row
//! limits, Close, Flush, Sync, pipelines past a Sync, simple queries,
//! transaction blocks, errors on purpose, DDL and `SET LOCAL search_path` in
//! between) run against Postgres directly and through weir in session and
//! transaction mode; each client's replies are compared message by message,
//! with what differs by nature masked (ParameterStatus, table OIDs, long
//! numbers in error texts). Every reply must arrive (`client.rs`), and none
//! beyond: each client ends with a Sync of its own.
//!
//! Case `n` of a seed is made from its own seed (`case_rng`) and runs from
//! a clean start: its lane's tables put back, a fresh weir in each mode
//! (`lane.rs`), so it runs the same alone, in any lane, after any other
//! case. Lanes run cases side by side, each in a database of its own. A
//! failing case is shrunk (steps, then ops, removed while it still fails)
//! and printed in the case text (`case.rs`), which `REGRESSIONS` keeps;
//! what would differ by nature is kept out of cases by the rules of
//! `case.rs` (`valid`), each with its reason.
//!
//! `WEIR_FUZZ_CASES` and `WEIR_FUZZ_SEED` set the run's size and seed
//! (scripts/statement-fuzz.sh), `WEIR_FUZZ_FROM` skips the cases before that
//! number (`WEIR_FUZZ_FROM=n WEIR_FUZZ_CASES=n+1` runs case n alone),
//! `WEIR_FUZZ_LANES` sets the lanes, `WEIR_FUZZ_CASE` runs one case given
//! as text instead, and `WEIR_FUZZ_LOG` (a tracing filter, `weir=debug`)
//! prints weir's log.

mod case;
mod client;
mod lane;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use weir_e2e::{PgOptions, PgServer};

use case::{case_rng, generate, parse_case, valid, Case};
use lane::{Lane, Verdict, CLIENTS};

const STEPS: usize = 24;
/// Cases per CI run (a fixed seed), and the seed.
const CI_CASES: u64 = 300;
const CI_SEED: u64 = 0x5eed_0032;
/// Lanes: cases run side by side, each lane in a database of its own.
const LANES: usize = 3;
/// A run stops after this many failing cases.
const MAX_FAILURES: usize = 12;

/// Shrunk failures found by the fuzzer, kept as regression cases.
const REGRESSIONS: &[&str] = &[
    // psycopg's auto-prepare: unnamed groups, then a named Parse of the same
    // text (already prepared on the server by another client) and Binds on
    // it, one Sync: weir's ParseComplete came first, or nothing came.
    "1:Ps2=0;S | 0:P_=0;B_=_;DP_;E_/0;P_=0;B_=_;DP_;E_/0;Ps1=0;Bp1=s1;DPp1;Ep1/0;Bp1=s1;Ep1/0;S;F",
    "1:Ps2=0;S | 0:P_=0;B_=_;E_/0;Ps1=0;Bp1=s1;Ep1/0;F | 0:S",
    "0:DSs4;F | 0:Bp1=s2;Ps3=6;S",
    // After an error the server skips to Sync: weir's own replies too.
    "1:B_=s4;F | 1:Ps3=5;S",
    "2:Bp1=s3;Ps4=0;CSs4;S | 2:DSs4;F",
    "1:Ps2=6;Ps1=4;CSs1;S | 1:B_=s1;S",
    "2:B_=s2;Ps2=0;CSs2;S | 2:F;F;Bp1=s2;Ps2=0;S",
    "2:Ps2=3 | 1:Ps2=0;F;F | 0:Bp1=s3;Ep1/0;CPp1;S | 0:B_=s4;Ps1=2;B_=s3;B_=s4;Ps2=4;Ps3=0;S | \
     0:F;F;DSs4;Ps4=5;Bp1=s1;CSs3;B_=s3;F | 2:F;Ps1=5;F | 0:S | 2:S",
    // An error naming one of weir's statements names the client's.
    "1:Ps4=7 | 1:Bp1=s4!;Ep1/0;DPp1;S",
    // An unnamed Parse the server already holds, queued behind a Sync or a
    // simple query that fails the transaction: Postgres's 25P02, no
    // ParseComplete of weir's.
    "0:P_=0;B_=_;E_/0;S | 0:Q0 | 0:P_=0;S | 0:P_=5;B_=_;E_/0;S;P_=0;B_=_;E_/0;S | 0:Q2",
    "0:P_=0;B_=_;E_/0;S | 0:Q0 | 0:P_=0;S | 0:Q10;P_=0;B_=_;E_/0;S | 0:Q2",
    // Two names of one statement of weir's (the same text): an error on a
    // Bind of one names that one.
    "2:P_=0;Ps3=5;Ps1=5 | 2:Ps3=1 | 2:Bp1=s3;Ps1=3;S | 2:P_=4;B_=s3;B_=s4;CSs4;CSs2;P_=7;S",
    // An error on a Bind of a name that a Close or an unnamed Parse after
    // it, skipped, would have dropped: the client's name as it was.
    "0:CSs4;Ps3=0;Ps4=3;S | 2:Q7 | 0:F;DSs4;Bp1=s2;B_=s4;F | 0:P_=0;E_/0;Ps4=1;P_=0;S | \
     0:Bp1=s4;B_=s3;CSs4;Ps4=3;B_=s2;DP_;F",
    "0:P_=3 | 0:P_=3 | 0:Bp1=_!;P_=1;S",
    // In a failed transaction, a Bind with the wrong parameter count of a
    // statement the server lacks (evicted): Postgres's 08P01 for the count,
    // not the 25P02 of weir's Parse before it.
    "1:Ps1=5;Bp1=s3;S | 1:Ps4=0;Ps2=4;Bp1=s1;Ps3=3;Ps4=3;Ps1=1;Ps4=2;S | 1:Q0 | 1:Ps3=8;S | \
     1:F;B_=s1;CP_;E_/1;B_=s2;S",
    // The same, for a statement whose text refers to `$n` it does not
    // declare: Postgres counts the highest.
    "1:Ps3=7;Ps3=8;S | 1:Q0 | 1:B_=s1;S;F | 1:CP_;Bp1=s3;B_=s3;Ps1=0;F",
    // A named Parse of a statement the server holds, behind a query that
    // fails the transaction: Postgres's 25P02, not weir's ParseComplete.
    "0:Ps1=0;S | 0:Q0 | 0:Q10;Ps2=0;S | 0:Q2",
    // A named Parse in a failed transaction leaves the server's unnamed
    // statement alone (described after it, as Postgres does there).
    "0:Ps2=0;S | 0:Q0 | 0:P_=4;S | 0:B_=s4;S | 0:Ps1=0;S | 0:DS_;S | 0:Q2",
    // SET LOCAL search_path: the statement is planned in `sb`, not shared
    // with one planned for another client in `public`.
    "0:Ps1=3;S | 1:Q0 | 1:Q12 | 1:Ps2=3;Bp1=s2;Ep1/0;S | 1:Q2",
    // A Describe, in a failed transaction, of a statement weir must prepare
    // first (uncertain after the rollback): Postgres describes one that
    // returns no rows.
    "0:Q0 | 0:Ps1=4;S | 0:Q2 | 0:Q0 | 0:B_=s4;S | 0:DSs1;S | 0:Q2",
    // A DEALLOCATE behind a Parse not yet answered: its ParseComplete first.
    "2:Ps3=5 | 2:Q9",
    // Errors on statements a later batch closed name them as the client did.
    "1:Ps2=1;P_=5;Ps2=7 | 1:DSs1;Ps2=6;DS_;DSs2;S;Bp1=s2;S;P_=1;CSs2;P_=2;S",
    "0:Ps4=3;S | 0:B_=s4!;S;CSs4;Bp1=s2!;S",
    "1:Q0 | 1:P_=2;S | 1:Bp1=_!;S;Q2;Bp1=s3;B_=s1;S",
    // A Parse of a name the client holds, in a failed transaction, with a
    // text that parses there (an empty one): Postgres's 42P05, where weir
    // preparing the held statement first got 25P02.
    "1:Ps1=7 | 1:Q0;F;Bp1=s3;DPp1 | 1:Bp1=s2;CSs1;Ps3=7;CSs4;B_=s3;DSs2;DSs3;S;Ps1=8;B_=s1",
    "2:Ps4=3;Bp1=s4;Bp1=s3;F | 2:CSs2;P_=4;F;S | 2:Q0 | 2:F;B_=s2;DSs1;S | \
     2:Ps4=8;Ps3=5;Ps3=8;Bp1=s4;S;B_=s1;B_=s3;Bp1=s4;S",
    "2:Ps1=8 | 2:Q0 | 2:Ps3=1;Ps1=4;F | 2:F;P_=8;S;B_=_;E_/0;P_=3;CP_;CSs3;B_=_;F",
    // Written past a Sync while the server skips to it (its error already
    // read): what the skipped messages changed is undone first.
    "1:P_=2;S | 2:B_=s4;F | 2:Ps3=2;B_=s3;S;Bp1=s3;S",
    "2:Ps2=0;S | 1:DSs1;F | 1:Ps4=0;S;F;B_=s4!;Ps2=0;E_/2;P_=3;P_=7;S;B_=s4;CP_;E_/0;S",
    "1:Ps1=5 | 1:Ps1=7;F | 1:Ps4=5;S;Ps3=8;DSs3;Ps4=2;CSs2;Bp1=s4;Ps2=5;DSs1;S;Q0",
    "2:Ps2=5;S;Ps2=1;F;P_=2;CSs4;F;S | 2:CSs3;Ps2=8;B_=s1;E_/0;F | 2:Ps1=5;S;DSs1;P_=6;Ps2=2;B_=_!;S",
    "2:Bp1=s1;F | 1:P_=8;DS_;Ps1=7;Ps3=5;P_=3;S | 2:F;Ps2=7;Ps4=6;B_=s2;S | \
     1:Ps2=8;Bp1=s2;P_=4;S;B_=s2;CSs3;Ps4=2;E_/2;F | 0:F;F;DSs3;F;CSs4;P_=7;S;Bp1=s3;CSs1;Ep1/0;B_=s1;F | \
     0:Ps1=3;Ep1/0;Ep1/2;DSs1;Ep1/2;DPp1;E_/1;S;B_=s1;Ps3=8;CSs3;B_=s1;DSs1;DP_;E_/1;S;CSs4;B_=s1;Ps3=6;Ps3=2;F",
    // Replies the server sent behind a ReadyForQuery, to what the client
    // wrote past its Sync or query, in the same read: held until the next
    // bytes came (the client hung).
    "1:Bp1=s4;S;P_=6;F",
    "2:Q12;P_=0;F",
    "1:Q0;DSs2;F;F",
    // Messages written past a Sync use the statements as that batch left
    // them: a Parse or Close of a name, skipped after an error before it,
    // leaves the name as it was.
    "1:Ps4=2;DSs2;CSs4;S;Ps4=5;F;F",
    "2:Bp1=s4;Ps2=3;S;B_=s2",
    "1:Bp1=s1;Ps3=7;S;Bp1=s3!",
    "0:Bp1=s1;Ps1=0;S;Bp1=s1",
    "1:B_=s1;Ps2=8;S;Q0;DSs2;F;F;F;F",
    "1:Ps4=7;S | 2:Bp1=s2;DPp1;F | 1:CSs3;Bp1=s2;DPp1;Bp1=s4;Bp1=s4;S;F;Bp1=s4;P_=6;B_=_;B_=_;Bp1=_;F",
    "2:Q0 | 2:B_=s3 | 2:P_=0 | 2:Bp1=_;P_=1 | 2:P_=1;CPp1;E_/0;Bp1=s2;S;DS_;Bp1=s3;CPp1;S",
    "2:Q0 | 2:Bp1=s1;S | 2:Q8;B_=s1;E_/2;CSs2;Ps2=0;DPp1;CPp1;Ps3=2;S;Ps3=8;CSs3;P_=2 | \
     2:Ps3=5;Bp1=s2!;S;DSs1;B_=s3;B_=s3;CPp1;B_=s2;Ps2=7;B_=s2;S | 2:CSs1;Bp1=s3;Bp1=s4;Ps2=5;B_=s3;S",
    // A second BEGIN while weir holds back the first (another client holds
    // the only server): Postgres's 25001 warning before its BEGIN.
    "1:Q0 | 0:Q0 | 0:Q0",
];

/// A case to run: a kept regression case, or generated case `n`.
#[derive(Clone, Copy)]
enum Job {
    Kept(usize),
    Generated(u64),
    /// The case text in `WEIR_FUZZ_CASE`.
    Given,
}

impl Job {
    fn case(self, seed: u64) -> Case {
        match self {
            Job::Kept(i) => parse_case(REGRESSIONS[i]),
            Job::Given => parse_case(&std::env::var("WEIR_FUZZ_CASE").unwrap_or_default()),
            Job::Generated(n) => generate(&mut case_rng(seed, n), CLIENTS, STEPS),
        }
    }

    fn describe(self, seed: u64) -> String {
        match self {
            Job::Kept(i) => format!("regression case {i}"),
            Job::Given => "the case in WEIR_FUZZ_CASE".to_owned(),
            Job::Generated(n) => {
                format!("case {n} of seed {seed} (alone: scripts/statement-fuzz.sh {} {seed} {n})", n + 1)
            }
        }
    }
}

/// What the lanes share: the jobs, the next one to take, what failed.
struct Run {
    seed: u64,
    jobs: Vec<Job>,
    next: AtomicUsize,
    stop: AtomicBool,
    failures: Mutex<Vec<String>>,
    unrunnable: Mutex<Vec<String>>,
}

impl Run {
    /// Takes jobs until none is left (or enough failed), each checked on `lane`.
    async fn drive(&self, lane: Lane) {
        while !self.stop.load(Ordering::Relaxed) {
            let Some(&job) = self.jobs.get(self.next.fetch_add(1, Ordering::Relaxed)) else { return };
            let case = job.case(self.seed);
            assert!(valid(&case), "{} breaks the rules: {case}", job.describe(self.seed));
            match lane.check(&case).await {
                Verdict::Same => {}
                Verdict::Unrunnable(e) => {
                    self.unrunnable.lock().unwrap().push(format!("{}: {e}\n  {case}", job.describe(self.seed)))
                }
                Verdict::Differs(mode, diff) => {
                    let (small, small_diff) = match job {
                        Job::Kept(_) | Job::Given => (case, None),
                        Job::Generated(_) => lane.shrink(case, mode).await,
                    };
                    let mut failures = self.failures.lock().unwrap();
                    failures.push(format!(
                        "{} fails on {}:\n  shrunk: {small}\n  {}",
                        job.describe(self.seed),
                        mode.name(),
                        small_diff.unwrap_or(diff)
                    ));
                    if failures.len() >= MAX_FAILURES {
                        self.stop.store(true, Ordering::Relaxed);
                    }
                }
            }
        }
    }
}

async fn fuzz(seed: u64, cases: u64, from: u64, lanes: usize) {
    let pg =
        tokio::task::spawn_blocking(|| PgServer::start(PgOptions { log_connections: false, ..PgOptions::default() }))
            .await
            .unwrap()
            .expect("start postgres");
    let pg = Arc::new(pg);
    let mut jobs: Vec<Job> = (0..REGRESSIONS.len()).map(Job::Kept).collect();
    jobs.extend((from..cases).map(Job::Generated));
    if std::env::var("WEIR_FUZZ_CASE").is_ok() {
        jobs = vec![Job::Given];
    }
    let run = Arc::new(Run {
        seed,
        jobs,
        next: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
        failures: Mutex::default(),
        unrunnable: Mutex::default(),
    });
    let started = Instant::now();
    let mut tasks = Vec::new();
    for n in 0..lanes {
        let lane = Lane::open(pg.clone(), n).await;
        let run = run.clone();
        tasks.push(tokio::spawn(async move { run.drive(lane).await }));
    }
    for t in tasks {
        t.await.expect("lane");
    }
    let secs = started.elapsed().as_secs_f64();
    let ran = run.next.load(Ordering::Relaxed).min(run.jobs.len());
    println!(
        "statement fuzzer: seed {seed}, cases {from}..{cases} and {} regression cases: {ran} run in {secs:.1} s \
         ({:.2} cases/s, {lanes} lanes)",
        REGRESSIONS.len(),
        ran as f64 / secs
    );
    let unrunnable = run.unrunnable.lock().unwrap();
    let failures = run.failures.lock().unwrap();
    assert!(unrunnable.is_empty(), "Postgres did not answer {} cases:\n{}", unrunnable.len(), unrunnable.join("\n"));
    assert!(failures.is_empty(), "{} failing cases:\n{}", failures.len(), failures.join("\n"));
}

fn env(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|s| s.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weir_answers_as_postgres_does() {
    if let Ok(filter) = std::env::var("WEIR_FUZZ_LOG") {
        let _ = tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::new(filter)).try_init();
    }
    let seed = env("WEIR_FUZZ_SEED").unwrap_or(CI_SEED);
    let cases = env("WEIR_FUZZ_CASES").unwrap_or(CI_CASES);
    let from = env("WEIR_FUZZ_FROM").unwrap_or(0);
    let lanes = env("WEIR_FUZZ_LANES").map_or(LANES, |n| n.max(1) as usize);
    fuzz(seed, cases, from, lanes).await;
}
