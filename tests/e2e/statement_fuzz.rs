//! A differential fuzzer for the statement path: sequences of
//! extended-protocol messages from several clients at once (named and
//! unnamed Parse, Bind, Describe of statements and portals, Execute with row
//! limits, Close, Flush, Sync, simple queries, errors on purpose, DDL in
//! between) run against Postgres directly and through weir in session and
//! transaction mode; each client's replies are compared message by message,
//! with what differs by nature masked (ParameterStatus, table OIDs). Every
//! reply must arrive: a read that waits past `REPLY_LIMIT` fails the case.
//!
//! Cases come from a fixed seed; a failing case is shrunk (steps, then
//! ops, removed while it still fails) and printed in the case text
//! (`case.rs`), which `REGRESSIONS` keeps. `WEIR_FUZZ_CASES` and
//! `WEIR_FUZZ_SEED` set the run's size and seed (scripts/statement-fuzz.sh);
//! `WEIR_FUZZ_FROM` skips the cases before that number (one case of a
//! seed runs alone with `WEIR_FUZZ_FROM=n WEIR_FUZZ_CASES=n+1`).

mod case;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use rand::SeedableRng;
use weir::protocol::tags::backend as be;
use weir_e2e::raw::{error_fields, Raw};
use weir_e2e::{Harness, Opts, PgServer, APP_DB, TRUST_USER};

use case::{encode, generate, parse_case, smaller, valid, Case, Op};

/// How long a client waits for a reply it is owed.
const REPLY_LIMIT: Duration = Duration::from_secs(5);
const CLIENTS: usize = 3;
const STEPS: usize = 24;
/// Cases per CI run (a fixed seed), and the seed.
const CI_CASES: u64 = 30;
const CI_SEED: u64 = 0x5eed_0032;
/// Re-runs a shrink may spend.
const SHRINK_BUDGET: usize = 80;

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
];

/// One message as compared: its tag and its body with inherent differences masked.
type Msg = (char, String);

/// Where a case runs.
#[derive(Clone, Copy)]
struct Target {
    addr: SocketAddr,
    name: &'static str,
}

/// Runs a case on a target: each client's compared replies, or the first
/// failure to get them.
async fn run(case: &Case, t: Target) -> Result<Vec<Vec<Msg>>, String> {
    let mut clients = Vec::new();
    for _ in 0..case.clients {
        let raw = Raw::login_within(REPLY_LIMIT, t.addr, TRUST_USER, "", &[]).await?;
        clients.push(Client { raw, owed: VecDeque::new(), seen: Vec::new(), defined: Vec::new() });
    }
    for (i, step) in case.steps.iter().enumerate() {
        let c = &mut clients[step.client];
        c.raw.send(&encode(step, &mut c.defined)).await?;
        for op in &step.ops {
            c.owe(op);
        }
        if step.reads() {
            c.read_owed().await.map_err(|e| format!("{}: step {i} (client {}): {e}", t.name, step.client))?;
        }
    }
    let mut out = Vec::new();
    for c in clients {
        out.push(c.seen);
        c.raw.terminate().await;
    }
    Ok(out)
}

/// What a client is owed, in order.
#[derive(Debug, PartialEq)]
enum Owed {
    /// One extended message's reply (its last message).
    Reply,
    /// ReadyForQuery for a Sync or a simple query.
    Ready,
}

struct Client {
    raw: Raw,
    owed: VecDeque<Owed>,
    seen: Vec<Msg>,
    defined: Vec<(String, usize)>,
}

impl Client {
    fn owe(&mut self, op: &Op) {
        match op {
            Op::Flush => {}
            Op::Sync | Op::Query(_) => self.owed.push_back(Owed::Ready),
            _ => self.owed.push_back(Owed::Reply),
        }
    }

    /// Reads until nothing is owed: every reply to what was sent, where an
    /// ErrorResponse to an extended message stands for the rest up to the
    /// next Sync (skipped).
    async fn read_owed(&mut self) -> Result<(), String> {
        while !self.owed.is_empty() {
            let (tag, body) = self.raw.read_msg().await.map_err(|e| format!("{e}; still owed {:?}", self.owed))?;
            self.note(tag, &body);
        }
        Ok(())
    }

    fn note(&mut self, tag: u8, body: &Bytes) {
        let reply = self.owed.front() == Some(&Owed::Reply);
        match tag {
            be::PARAMETER_STATUS => return,
            be::READY_FOR_QUERY => while self.owed.pop_front().is_some_and(|o| o == Owed::Reply) {},
            be::ERROR_RESPONSE if reply => {
                while self.owed.front() == Some(&Owed::Reply) {
                    self.owed.pop_front();
                }
            }
            be::PARSE_COMPLETE
            | be::BIND_COMPLETE
            | be::CLOSE_COMPLETE
            | be::NO_DATA
            | be::ROW_DESCRIPTION
            | be::COMMAND_COMPLETE
            | be::EMPTY_QUERY_RESPONSE
            | be::PORTAL_SUSPENDED
                if reply =>
            {
                self.owed.pop_front();
            }
            _ => {}
        }
        self.seen.push((tag as char, masked(tag, body)));
    }
}

/// A message body as compared: table OIDs and column numbers of a
/// RowDescription and long numbers in error texts masked.
fn masked(tag: u8, body: &[u8]) -> String {
    match tag {
        be::ROW_DESCRIPTION => {
            let mut out = String::new();
            let mut at = 2;
            while at < body.len() {
                let end = at + body[at..].iter().position(|&b| b == 0).unwrap_or(body.len() - at);
                out.push_str(&String::from_utf8_lossy(&body[at..end]));
                // Skip the table OID (4) and column number (2); keep the rest (12).
                let rest = (end + 7).min(body.len());
                let next = (end + 19).min(body.len());
                out.push_str(&format!(" {:?}; ", &body[rest..next]));
                at = next;
            }
            out
        }
        be::ERROR_RESPONSE | be::NOTICE_RESPONSE => {
            let (code, message) = error_fields(body);
            let mut m = String::new();
            let mut digits = 0;
            for ch in message.chars() {
                digits = if ch.is_ascii_digit() { digits + 1 } else { 0 };
                m.push(if digits >= 5 { '#' } else { ch });
            }
            format!("{code} {m}")
        }
        _ => String::from_utf8_lossy(body).into_owned(),
    }
}

/// The places a case runs: Postgres directly, and weir in front of the same
/// Postgres in session and in transaction mode, the latter with unnamed
/// statements served from server-side ones from their second Parse (the
/// default) and from their first.
struct Bench {
    pg: std::sync::Arc<PgServer>,
    direct: Target,
    modes: Vec<(Target, Harness)>,
}

impl Bench {
    async fn start() -> Bench {
        let first = Harness::start(opts("session", 2)).await;
        let pg = first.pg.clone();
        let second = Harness::start_with(pg.clone(), opts("transaction", 2)).await;
        let third = Harness::start_with(pg.clone(), opts("transaction", 1)).await;
        let direct = Target { addr: format!("127.0.0.1:{}", pg.port()).parse().unwrap(), name: "direct" };
        let modes = vec![
            (Target { addr: first.addr(), name: "session" }, first),
            (Target { addr: second.addr(), name: "transaction" }, second),
            (Target { addr: third.addr(), name: "transaction, unnamed prepared at once" }, third),
        ];
        Bench { pg, direct, modes }
    }

    async fn run(&self, case: &Case, t: Target) -> Result<Vec<Vec<Msg>>, String> {
        let pg = self.pg.clone();
        let sql = "create table if not exists fz (a int); grant all on fz to public; truncate fz; \
                   insert into fz values (1), (2), (3); drop index if exists fz_i;";
        tokio::task::spawn_blocking(move || pg.psql(APP_DB, sql).expect("fuzz setup")).await.unwrap();
        run(case, t).await
    }

    /// None when every target agrees with Postgres (or Postgres itself could
    /// not run the case); else the target and what differed.
    async fn check(&self, case: &Case) -> Option<(Target, String)> {
        let Ok(want) = self.run(case, self.direct).await else { return None };
        for (t, _) in &self.modes {
            if let Some(diff) = self.differs(case, *t, &want).await {
                return Some((*t, diff));
            }
        }
        None
    }

    async fn differs(&self, case: &Case, t: Target, want: &[Vec<Msg>]) -> Option<String> {
        let got = match self.run(case, t).await {
            Ok(got) => got,
            Err(e) => return Some(e),
        };
        for (c, (w, g)) in want.iter().zip(&got).enumerate() {
            let n = w.iter().zip(g).take_while(|(a, b)| a == b).count();
            if n < w.len() || n < g.len() {
                return Some(format!(
                    "client {c}, reply {n}: Postgres sent {:?}, weir ({}) sent {:?}\n  Postgres: {}\n  weir: {}",
                    w.get(n),
                    t.name,
                    g.get(n),
                    w.iter().map(|m| m.0).collect::<String>(),
                    g.iter().map(|m| m.0).collect::<String>(),
                ));
            }
        }
        None
    }

    /// Removes steps and ops while the case still fails on `t`.
    async fn shrink(&self, mut case: Case, t: Target) -> (Case, String) {
        let mut budget = SHRINK_BUDGET;
        let mut last = String::new();
        'outer: while budget > 0 {
            for smaller in smaller(&case).into_iter().filter(valid) {
                if budget == 0 {
                    break 'outer;
                }
                budget -= 1;
                let Ok(want) = self.run(&smaller, self.direct).await else { continue };
                if let Some(diff) = self.differs(&smaller, t, &want).await {
                    case = smaller;
                    last = diff;
                    continue 'outer;
                }
            }
            break;
        }
        (case, last)
    }
}

fn opts(mode: &'static str, prepare_unnamed_after: u32) -> Opts {
    Opts {
        pool_size: CLIENTS as u32,
        pool_mode: mode,
        auth_type: "trust",
        // A small cache, so that statements are evicted and prepared again.
        general: format!("max_prepared_statements = 3\nprepare_unnamed_after = {prepare_unnamed_after}\n"),
        ..Opts::default()
    }
}

async fn fuzz(seed: u64, cases: u64, from: u64) {
    let bench = Bench::start().await;
    let mut failures = Vec::new();
    for text in REGRESSIONS {
        let case = parse_case(text);
        assert!(valid(&case), "regression case breaks the rules: {text}");
        if let Some((t, diff)) = bench.check(&case).await {
            failures.push(format!("regression case fails on {}:\n  {text}\n  {diff}", t.name));
        }
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for n in 0..cases {
        let case = generate(&mut rng, CLIENTS, STEPS);
        assert!(valid(&case), "generated case breaks the rules: {case}");
        if n < from {
            continue;
        }
        if let Some((t, diff)) = bench.check(&case).await {
            let (small, small_diff) = bench.shrink(case.clone(), t).await;
            let small_diff = if small_diff.is_empty() { diff.clone() } else { small_diff };
            failures
                .push(format!("case {n} of seed {seed:#x} fails on {}:\n  shrunk: {small}\n  {small_diff}", t.name));
            if failures.len() >= 3 {
                break;
            }
        }
    }
    println!("statement fuzzer: seed {seed:#x}, {cases} cases and {} regression cases", REGRESSIONS.len());
    assert!(failures.is_empty(), "{} failing cases:\n{}", failures.len(), failures.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weir_answers_as_postgres_does() {
    let seed = std::env::var("WEIR_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(CI_SEED);
    let cases = std::env::var("WEIR_FUZZ_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(CI_CASES);
    let from = std::env::var("WEIR_FUZZ_FROM").ok().and_then(|s| s.parse().ok()).unwrap_or(0);
    fuzz(seed, cases, from).await;
}
