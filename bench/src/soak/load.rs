//! The soak's steady load, running the whole time: connection churn,
//! long-lived clients in the simple, extended and named-prepared protocols,
//! ledger writers (unique client-chosen ids + a counter, the client's view of
//! every COMMIT recorded), clients that vanish mid-query and
//! mid-transaction, queued cancels, and a pipeline of several statements.
//! Every exchange is bounded by `OP_LIMIT`; what went wrong is recorded in
//! [`Stats`] with its time and SQLSTATE.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use rand::Rng;

use super::wire::{self, Conn, Fail, Reply};

/// The longest any single exchange may take before it counts as a hang.
pub const OP_LIMIT: Duration = Duration::from_secs(30);
/// How long a client waits before reconnecting after its connection broke
/// (so a pooler that accepts logins it cannot serve is not hammered, and
/// error counts are of clients, not of loop iterations).
const BROKEN_PAUSE: u64 = 50;
/// SQLSTATE query_canceled: the expected answer to a cancel.
const QUERY_CANCELED: &str = "57014";

/// What one ledger transaction's client saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// COMMIT answered with a COMMIT tag.
    Acked,
    /// Failed before COMMIT, or COMMIT answered ROLLBACK / a non-fatal error.
    Failed,
    /// The connection broke during COMMIT: it may or may not have committed.
    Ambiguous,
    /// The client vanished mid-transaction: never committed.
    Vanished,
}

/// One error a client saw.
#[derive(Debug, Clone)]
pub struct ErrorEvent {
    /// Seconds since the soak started.
    pub t: f64,
    /// SQLSTATE, or closed / io / timeout.
    pub code: String,
    /// Which kind of client saw it.
    pub who: &'static str,
}

/// Counters shared by the load, the faults and the sampler.
pub struct Stats {
    pub start: Instant,
    pub stop: AtomicBool,
    done: AtomicU64,
    latencies_us: Mutex<Vec<u32>>,
    pub errors: Mutex<Vec<ErrorEvent>>,
    /// The first message seen for each SQLSTATE.
    pub messages: Mutex<BTreeMap<String, String>>,
    pub ledger: Mutex<Vec<(i64, Outcome)>>,
    pub cancels_sent: AtomicU64,
    pub cancels_honoured: AtomicU64,
    pub vanished: AtomicU64,
    pub total_done: AtomicU64,
}

impl Stats {
    pub fn new() -> Stats {
        Stats {
            start: Instant::now(),
            stop: AtomicBool::new(false),
            done: AtomicU64::new(0),
            latencies_us: Mutex::new(Vec::new()),
            errors: Mutex::new(Vec::new()),
            messages: Mutex::new(BTreeMap::new()),
            ledger: Mutex::new(Vec::new()),
            cancels_sent: AtomicU64::new(0),
            cancels_honoured: AtomicU64::new(0),
            vanished: AtomicU64::new(0),
            total_done: AtomicU64::new(0),
        }
    }

    pub fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// A transaction (or statement round) completed after `since`.
    pub fn done(&self, since: Instant) {
        let us = u32::try_from(since.elapsed().as_micros()).unwrap_or(u32::MAX);
        self.done.fetch_add(1, Ordering::Relaxed);
        self.total_done.fetch_add(1, Ordering::Relaxed);
        self.latencies_us.lock().expect("latencies").push(us);
    }

    pub fn error(&self, who: &'static str, code: String) {
        let t = self.now();
        self.errors.lock().expect("errors").push(ErrorEvent { t, code, who });
    }

    /// Keeps the first message seen for `code`.
    pub fn note(&self, code: &str, message: &str) {
        self.messages.lock().expect("messages").entry(code.to_string()).or_insert_with(|| message.to_string());
    }

    fn record(&self, id: i64, outcome: Outcome) {
        self.ledger.lock().expect("ledger").push((id, outcome));
    }

    /// Completed count and p99 latency (ms) since the last call.
    pub fn take_second(&self) -> (u64, Option<f64>) {
        let n = self.done.swap(0, Ordering::Relaxed);
        let mut lat = std::mem::take(&mut *self.latencies_us.lock().expect("latencies"));
        if lat.is_empty() {
            return (n, None);
        }
        let k = (lat.len() * 99).div_ceil(100).saturating_sub(1);
        let (_, p99, _) = lat.select_nth_unstable(k);
        (n, Some(f64::from(*p99) / 1000.0))
    }
}

/// Where and as whom the load connects.
pub struct Ctx {
    pub addr: String,
    pub user: String,
    pub db: String,
    pub stats: Arc<Stats>,
}

impl Ctx {
    pub async fn connect(&self, who: &'static str) -> Option<Conn> {
        match Conn::connect(&self.addr, &self.user, &self.db, OP_LIMIT).await {
            Ok(c) => Some(c),
            Err(e) => {
                self.fail(who, &e);
                pause(100).await;
                None
            }
        }
    }

    /// Records a failed exchange.
    fn fail(&self, who: &'static str, e: &Fail) {
        if let Some(m) = e.message() {
            self.stats.note(&e.label(), m);
        }
        self.stats.error(who, e.label());
    }

    /// Records the reply's errors; true when there were none.
    fn clean(&self, who: &'static str, r: &Reply) -> bool {
        for (e, m) in r.errors.iter().zip(&r.messages) {
            self.stats.note(e, m);
            self.stats.error(who, e.clone());
        }
        r.errors.is_empty()
    }
}

async fn pause(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

/// Connect, one transaction, disconnect.
pub async fn churn(ctx: Arc<Ctx>) {
    while !ctx.stats.stopped() {
        let t = Instant::now();
        if let Some(mut c) = ctx.connect("churn").await {
            match c.simple("begin; select 1; commit", OP_LIMIT).await {
                Ok(r) if ctx.clean("churn", &r) => ctx.stats.done(t),
                Ok(_) => {}
                Err(e) => ctx.fail("churn", &e),
            }
            c.terminate().await;
        }
        pause(10).await;
    }
}

/// Which protocol a long-lived client speaks.
#[derive(Clone, Copy)]
pub enum Protocol {
    Simple,
    Extended,
    Named,
}

/// A long-lived client: short statements in a loop, reconnecting after a failure.
pub async fn long_lived(ctx: Arc<Ctx>, protocol: Protocol) {
    let who = match protocol {
        Protocol::Simple => "simple",
        Protocol::Extended => "extended",
        Protocol::Named => "named",
    };
    let mut conn: Option<Conn> = None;
    let mut parsed = false;
    let mut i = 0u64;
    while !ctx.stats.stopped() {
        let Some(c) = conn.as_mut() else {
            conn = ctx.connect(who).await;
            parsed = false;
            continue;
        };
        i += 1;
        let n = (i % 1000).to_string();
        let msg = match protocol {
            Protocol::Simple => wire::query(&format!("select {n}")),
            Protocol::Extended | Protocol::Named => {
                let mut out = BytesMut::new();
                let name = if matches!(protocol, Protocol::Named) { "soak_named" } else { "" };
                wire::extended(&mut out, name, "select $1::int", &[&n], parsed);
                wire::sync(&mut out);
                out
            }
        };
        let t = Instant::now();
        match c.exchange(&msg, 1, OP_LIMIT).await {
            Ok(r) if ctx.clean(who, &r) && r.rows == 1 => {
                ctx.stats.done(t);
                parsed = matches!(protocol, Protocol::Named);
            }
            Ok(r) if r.errors.is_empty() => ctx.stats.error(who, format!("rows={}", r.rows)),
            Ok(_) => {}
            Err(e) => {
                ctx.fail(who, &e);
                conn = None;
                pause(BROKEN_PAUSE).await;
            }
        }
        pause(3).await;
    }
}

/// The ledger writer `w`: BEGIN; INSERT a row with a unique id; UPDATE the
/// counter; COMMIT. Odd writers use the extended protocol, even ones simple.
pub async fn ledger(ctx: Arc<Ctx>, w: i64) {
    let mut conn: Option<Conn> = None;
    let mut seq = 0i64;
    while !ctx.stats.stopped() {
        let Some(c) = conn.as_mut() else {
            conn = ctx.connect("ledger").await;
            continue;
        };
        seq += 1;
        let id = w * 10_000_000_000 + seq;
        let t = Instant::now();
        let (outcome, broken) = ledger_txn(&ctx, c, id, w % 2 == 1).await;
        ctx.stats.record(id, outcome);
        if outcome == Outcome::Acked {
            ctx.stats.done(t);
        }
        if broken {
            conn = None;
            pause(BROKEN_PAUSE).await;
        }
    }
}

/// One ledger transaction: its outcome, and whether the connection broke.
async fn ledger_txn(ctx: &Ctx, c: &mut Conn, id: i64, extended: bool) -> (Outcome, bool) {
    let steps = [
        ("begin", vec![]),
        ("insert into soak_ledger(id, writer) values ($1::bigint, $2::text)", vec![id.to_string(), "w".into()]),
        ("update soak_counter set n = n + 1 where id = 1", vec![]),
    ];
    for (sql, params) in &steps {
        let msg = statement(sql, params, extended);
        match c.exchange(&msg, 1, OP_LIMIT).await {
            Ok(r) if ctx.clean("ledger", &r) => {}
            Ok(_) => {
                let _ = c.simple("rollback", OP_LIMIT).await;
                return (Outcome::Failed, false);
            }
            Err(e) => {
                ctx.fail("ledger", &e);
                return (Outcome::Failed, true);
            }
        }
    }
    match c.exchange(&statement("commit", &[], extended), 1, OP_LIMIT).await {
        Ok(r) if r.errors.is_empty() && r.tags.last().is_some_and(|t| t == "COMMIT") => (Outcome::Acked, false),
        Ok(r) => {
            ctx.clean("ledger", &r);
            if r.errors.is_empty() {
                ctx.stats.error("ledger", "commit-rolled-back".into());
            }
            (Outcome::Failed, false)
        }
        Err(e) => {
            ctx.fail("ledger", &e);
            (Outcome::Ambiguous, true)
        }
    }
}

fn statement(sql: &str, params: &[String], extended: bool) -> BytesMut {
    if !extended {
        let mut sql = sql.to_string();
        for (i, p) in params.iter().enumerate().rev() {
            sql = sql.replace(&format!("${}", i + 1), &format!("'{p}'"));
        }
        return wire::query(&sql);
    }
    let mut out = BytesMut::new();
    let params: Vec<&str> = params.iter().map(String::as_str).collect();
    wire::extended(&mut out, "", sql, &params, false);
    wire::sync(&mut out);
    out
}

/// Clients that vanish without Terminate: mid-query (a pg_sleep in flight)
/// and mid-transaction (after inserting a ledger row that must never appear).
pub async fn vanisher(ctx: Arc<Ctx>) {
    let mut seq = 0i64;
    while !ctx.stats.stopped() {
        seq += 1;
        if let Some(mut c) = ctx.connect("vanish").await {
            if seq % 2 == 0 {
                let _ = c.write(&wire::query("select pg_sleep(2)")).await;
                let ms = rand::thread_rng().gen_range(5..80);
                pause(ms).await;
            } else {
                let id = 99 * 10_000_000_000 + seq;
                let sql = format!("begin; insert into soak_ledger(id, writer) values ({id}, 'vanish')");
                if let Ok(r) = c.simple(&sql, OP_LIMIT).await {
                    if r.errors.is_empty() {
                        ctx.stats.record(id, Outcome::Vanished);
                    }
                }
            }
            ctx.stats.vanished.fetch_add(1, Ordering::Relaxed);
            drop(c);
        }
        pause(150).await;
    }
}

/// A client whose queries are cancelled shortly after they are sent: while
/// they are queued for a server or running. 57014 is the expected answer.
pub async fn canceller(ctx: Arc<Ctx>) {
    let mut conn: Option<Conn> = None;
    while !ctx.stats.stopped() {
        let Some(c) = conn.as_mut() else {
            conn = ctx.connect("cancel").await;
            continue;
        };
        let Some(key) = c.key else {
            ctx.stats.error("cancel", "no-key".into());
            return;
        };
        let reply = async {
            c.write(&wire::query("select pg_sleep(0.3)")).await?;
            let ms = rand::thread_rng().gen_range(0..40);
            pause(ms).await;
            wire::cancel(&ctx.addr, key).await;
            ctx.stats.cancels_sent.fetch_add(1, Ordering::Relaxed);
            c.exchange(&[], 1, OP_LIMIT).await
        };
        match reply.await {
            Ok(r) => {
                if r.errors.iter().any(|e| e == QUERY_CANCELED) {
                    ctx.stats.cancels_honoured.fetch_add(1, Ordering::Relaxed);
                }
                for (e, m) in r.errors.iter().zip(&r.messages).filter(|(e, _)| *e != QUERY_CANCELED) {
                    ctx.stats.note(e, m);
                    ctx.stats.error("cancel", e.clone());
                }
            }
            Err(e) => {
                ctx.fail("cancel", &e);
                conn = None;
                pause(BROKEN_PAUSE).await;
            }
        }
        pause(100).await;
    }
}

/// A pipeline: three statements and a Sync, then two and a Sync, in one write.
pub async fn pipeline(ctx: Arc<Ctx>) {
    let mut conn: Option<Conn> = None;
    while !ctx.stats.stopped() {
        let Some(c) = conn.as_mut() else {
            conn = ctx.connect("pipeline").await;
            continue;
        };
        let mut out = BytesMut::new();
        for i in 0..3 {
            wire::extended(&mut out, "", "select $1::int", &[&i.to_string()], false);
        }
        wire::sync(&mut out);
        for i in 3..5 {
            wire::extended(&mut out, "", "select $1::int + 1", &[&i.to_string()], false);
        }
        wire::sync(&mut out);
        let t = Instant::now();
        match c.exchange(&out, 2, OP_LIMIT).await {
            Ok(r) if ctx.clean("pipeline", &r) && r.rows == 5 => ctx.stats.done(t),
            Ok(r) if r.errors.is_empty() => ctx.stats.error("pipeline", format!("rows={}", r.rows)),
            Ok(_) => {}
            Err(e) => {
                ctx.fail("pipeline", &e);
                conn = None;
                pause(BROKEN_PAUSE).await;
            }
        }
        pause(5).await;
    }
}

/// Short-lived clients for a fault (a connect burst, an admission burst):
/// each connects and runs `sql` `rounds` times. Returns (ok, failed).
pub async fn burst(ctx: Arc<Ctx>, clients: usize, sql: &'static str, rounds: usize, who: &'static str) -> (u64, u64) {
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let ctx = ctx.clone();
            tokio::spawn(async move {
                let mut c = match Conn::connect(&ctx.addr, &ctx.user, &ctx.db, OP_LIMIT).await {
                    Ok(c) => c,
                    Err(e) => {
                        ctx.fail(who, &e);
                        return false;
                    }
                };
                for _ in 0..rounds {
                    match c.simple(sql, OP_LIMIT).await {
                        Ok(r) if ctx.clean(who, &r) => {}
                        Ok(_) => return false,
                        Err(e) => {
                            ctx.fail(who, &e);
                            return false;
                        }
                    }
                }
                c.terminate().await;
                true
            })
        })
        .collect();
    let (mut ok, mut failed) = (0, 0);
    for t in tasks {
        match t.await {
            Ok(true) => ok += 1,
            _ => failed += 1,
        }
    }
    (ok, failed)
}
