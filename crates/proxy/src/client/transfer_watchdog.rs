//! The watchdog of one transfer: three clocks that run beside the
//! forwarding loop (`transfer.rs`) and end a conversation no socket option
//! would end. `server::probe` holds its settings and the out-of-band probe
//! it starts; this module decides when.
//!
//! * **query_timeout** (off by default). The clock starts when the server
//!   begins to owe a ReadyForQuery and restarts at each one it sends. When it
//!   runs out, weir sends Postgres a CancelRequest with the server's own key,
//!   exactly as a client would: Postgres answers 57014 and the client keeps
//!   its connection and its server. If the query has still not ended after a
//!   further `server_check_timeout` (the path is frozen, or the backend
//!   ignores the cancel), the client gets 08006 and the server connection is
//!   closed with reason `query_timeout`. PgBouncer instead drops the client
//!   at the first deadline.
//! * **server_check_silence** (5 s by default; PgBouncer has none). While
//!   weir waits on the server, the silence clock runs: the server owes an
//!   answer and sends no byte, or it takes none of the bytes weir has for it
//!   (mid-COPY IN, a pipeline behind a long query), while weir is reading.
//!   When it runs out, an out-of-band probe asks Postgres on a
//!   fresh connection whether our backend is still working (see
//!   `server::probe`). A slow query passes and the clock restarts, twice as
//!   long each time the same silence is probed again (up to 16 x: a query
//!   that stays silent for minutes costs a few probes, not one every 5 s);
//!   any server byte, or the server taking bytes it had left waiting, brings
//!   it back to `server_check_silence`. A dead path, dead server, or a
//!   backend that finished (its answer never came) or waits to read bytes
//!   that never reach it, gives the client 08006 and closes the connection
//!   with reason `unresponsive`. A backend that only stopped reading while it
//!   works (a lock, I/O, a long query) is left alone, where TCP_USER_TIMEOUT
//!   would cut it off. Waiting on the client (COPY IN, or a client too slow
//!   to read so that weir stopped reading) never counts as silence.
//! * **idle_transaction_timeout** (off by default). A client that leaves a
//!   transaction open (status T or E) and sends nothing for this long is
//!   disconnected with 08P01 "idle transaction timeout", as PgBouncer does;
//!   the server is not lost: the lease goes back through recovery, which
//!   rolls it back.
//!
//! * **transaction_timeout** (off by default). A client whose transaction
//!   (status T or E) has been open this long, working or idle, is
//!   disconnected with 08P01 "transaction timeout", as PgBouncer does; the
//!   server is recovered as above.
//!
//! * **the stall guard** (always on). weir holds whole client messages back
//!   while the server owes no ReadyForQuery: the server waits for the client,
//!   the client for weir, and no timeout above runs. That is a bug in weir;
//!   after `STALL_LIMIT` it is logged (warn, with the session's state) once
//!   per stall and counted (`weir_stalled_pipelines_total`). A stall that
//!   lasts `STALL_END` ends the session (XX000), and the server is recovered:
//!   the client would otherwise wait forever.
//!
//! Timers cost nothing on the byte path: the timer lives with the client
//! (`AlarmTimer`, one per session) and is moved only to an earlier deadline;
//! the clock is read when the timer fires, when a conversation starts owing,
//! and when a clock restarts, never per poll. As the timer stays with one
//! task, it is polled only after it was set or fired: in between it is
//! registered with the very waker a poll would give it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use weir_metrics::CloseReason;

use crate::protocol::{sqlstate, tags::status, SqlState};
use crate::server::cancel::CancelTarget;
use tokio::time::Sleep;

use crate::server::probe::{self, Verdict};
use crate::server::{forward_cancel, ConnectSpec, Conversation};

/// Why the watchdog ended a conversation.
#[derive(Debug, thiserror::Error)]
pub enum WatchdogError {
    #[error(
        "query_timeout: the query ran longer than {}, and the server did not answer a cancel request within {} either; the connection to the server was closed",
        humantime::format_duration(*limit),
        humantime::format_duration(*grace)
    )]
    QueryTimeout { limit: Duration, grace: Duration },
    #[error("the server stopped answering: no data for {} while a query was in flight, and {why}", humantime::format_duration(*silence))]
    Unresponsive { silence: Duration, why: String },
    #[error("idle transaction timeout: the transaction was left open and idle for more than {}", humantime::format_duration(*.0))]
    IdleTransaction(Duration),
    #[error("transaction timeout: the transaction was open for more than {}", humantime::format_duration(*.0))]
    Transaction(Duration),
    /// Not an end: the stall guard found a stall (logged; the transfer
    /// counts it and goes on).
    #[error("pipeline stalled inside weir")]
    Stalled,
    /// The stall lasted `STALL_END`: the session ends rather than wait forever.
    #[error("pipeline stalled inside weir for {}: the session is ended rather than left waiting", humantime::format_duration(*.0))]
    StallEnded(Duration),
}

impl WatchdogError {
    pub fn sqlstate(&self) -> SqlState {
        match self {
            WatchdogError::QueryTimeout { .. } | WatchdogError::Unresponsive { .. } => sqlstate::CONNECTION_FAILURE,
            // PgBouncer's code: the client's connection ends here, and a
            // connection-exception class is what drivers and pools read as
            // "this connection is gone" (Postgres's own 25P03/25P04 are
            // class 25, which they read as a failed statement).
            WatchdogError::IdleTransaction(_) | WatchdogError::Transaction(_) => sqlstate::PROTOCOL_VIOLATION,
            WatchdogError::Stalled | WatchdogError::StallEnded(_) => sqlstate::INTERNAL_ERROR,
        }
    }

    /// How the server connection must be closed; None when it can be recovered.
    pub fn close_reason(&self) -> Option<CloseReason> {
        match self {
            WatchdogError::QueryTimeout { .. } => Some(CloseReason::QueryTimeout),
            WatchdogError::Unresponsive { .. } => Some(CloseReason::Unresponsive),
            WatchdogError::IdleTransaction(_)
            | WatchdogError::Transaction(_)
            | WatchdogError::Stalled
            | WatchdogError::StallEnded(_) => None,
        }
    }
}

type Probe = Pin<Box<dyn Future<Output = Verdict> + Send>>;

/// The watchdog's timer, kept with its client from one conversation to the
/// next (whatever server each one runs on), so a transaction costs no timer
/// allocation, registration or removal: the watchdog only moves it to an
/// earlier deadline, and otherwise lets it fire early and re-arms it then.
/// One that fires between conversations only wakes its client's task for
/// nothing.
#[derive(Debug, Default)]
pub(crate) struct AlarmTimer {
    sleep: Option<Pin<Box<Sleep>>>,
    /// When `sleep` is set to fire; None once it has fired.
    at: Option<Instant>,
    /// The waker `sleep` holds: the one it was polled with since it was
    /// last set. None when it must be polled (set anew, or fired).
    waker: Option<Waker>,
    /// The transaction clock (transaction_timeout): since the transaction
    /// began, as the conversation first saw it open. Kept here, with the
    /// client, rather than in each request's future.
    xact_since: Option<Instant>,
    /// Session mode: when the client's current transaction (or
    /// autocommitted statement) first sent the server anything, for SHOW
    /// STATS's transaction count and time (transaction mode counts each
    /// transaction as its server goes back).
    session_xact: Option<Instant>,
}

impl AlarmTimer {
    /// Session mode: the client sent its server a request; a transaction
    /// starts with it unless one is open.
    pub(crate) fn session_xact_begun(&mut self) {
        self.session_xact.get_or_insert_with(Instant::now);
    }

    /// Session mode: the server is idle again (no transaction open, nothing
    /// owed). How long the transaction that ended took, if one was open.
    pub(crate) fn session_xact_ended(&mut self) -> Option<Duration> {
        self.session_xact.take().map(|since| since.elapsed())
    }

    /// True when the timer fired. Polls it only when it does not yet hold
    /// this task's waker; otherwise it will wake this task when it fires,
    /// and until then it reads as not elapsed.
    pub(crate) fn poll_fired(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(sleep) = self.sleep.as_mut() else { return false };
        let registered = self.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker()));
        if registered && !sleep.is_elapsed() {
            return false;
        }
        // A task out of its budget gets Pending before the timer is reached.
        let reached = tokio::task::coop::has_budget_remaining();
        if sleep.as_mut().poll(cx).is_ready() {
            self.at = None;
            self.waker = None;
            return true;
        }
        if !registered && reached {
            self.waker = Some(cx.waker().clone());
        }
        false
    }

    /// Sets the timer to fire at `at`.
    pub(crate) fn set(&mut self, at: Instant) {
        self.at = Some(at);
        self.waker = None;
        match self.sleep.as_mut() {
            Some(t) => t.as_mut().reset(at.into()),
            None => self.sleep = Some(Box::pin(tokio::time::sleep_until(at.into()))),
        }
    }
}

/// The clocks of one conversation (one call of `transfer::run`).
pub(crate) struct Watchdog<'a> {
    /// The settings, read through the spec (`spec.watch`) rather than
    /// copied: the watchdog is part of every request's future.
    spec: &'a Arc<ConnectSpec>,
    cancel: &'a CancelTarget,
    /// Query clock: since the server began owing, or last sent a ReadyForQuery.
    query_since: Option<Instant>,
    cancelled_at: Option<Instant>,
    /// Silence clock: since the last server byte while an answer is owed.
    silent_since: Option<Instant>,
    /// Server bytes arrived (or the server took bytes weir had left
    /// waiting) since the silence clock was last set.
    heard: bool,
    /// The silence is (also) the server taking none of weir's bytes: a
    /// backend waiting to read then is cut off from them.
    unsent: bool,
    /// Probes that found the server alive during this silence: the next
    /// one waits `silence` x 2^n (`MAX_SILENCE_BACKOFF` at most).
    alive_probes: u8,
    /// That wait, kept as `alive_probes` changes rather than worked out at
    /// each poll.
    silence_limit: Option<Duration>,
    probe: Option<Probe>,
    /// Idle-in-transaction clock: since the client last sent anything.
    idle_since: Option<Instant>,
    /// Stall clock: since weir began holding client messages while the
    /// server owed nothing.
    stalled_since: Option<Instant>,
    /// The stall's session state (`STALL_*` bits, the transaction status
    /// in the high byte): one field, as every request's future holds it.
    stall: u16,
    timer: &'a mut AlarmTimer,
}

/// How long weir may hold client messages while the server owes nothing
/// before the stall is reported.
pub(crate) const STALL_LIMIT: Duration = Duration::from_secs(2);
/// How long a stall may last before the session is ended.
pub(crate) const STALL_END: Duration = Duration::from_secs(10);
/// `Watchdog::stall`: this stall was reported.
const STALL_TOLD: u16 = 1;
/// `Watchdog::stall`: an extended-protocol batch was open when it began.
const STALL_IN_BATCH: u16 = 2;

impl<'a> Watchdog<'a> {
    /// The clocks for a conversation on the server with these parts.
    pub(crate) fn new(spec: &'a Arc<ConnectSpec>, cancel: &'a CancelTarget, timer: &'a mut AlarmTimer) -> Self {
        Watchdog {
            spec,
            cancel,
            query_since: None,
            cancelled_at: None,
            silent_since: None,
            heard: false,
            unsent: false,
            alive_probes: 0,
            silence_limit: spec.watch.silence,
            probe: None,
            idle_since: None,
            stalled_since: None,
            stall: 0,
            timer,
        }
    }

    /// Starts or stops the clocks from where the conversation stands.
    /// `reading`: weir is reading from the server (not held back by a slow
    /// client). `unsent`: bytes for the server wait for its socket to take
    /// them. `client_quiet`: no client bytes are on their way to the server.
    /// `query_started`: when the running query started, if the caller knows
    /// (a clock that starts now starts from it, and reads none of its own).
    /// `held`: weir holds whole client messages it has not sent.
    pub(crate) fn update(
        &mut self,
        conv: &Conversation,
        reading: bool,
        unsent: bool,
        client_quiet: bool,
        query_started: Option<Instant>,
        held: bool,
    ) {
        if held && conv.owed() == 0 && !conv.copy_in() {
            if self.stalled_since.is_none() {
                self.stalled_since = Some(Instant::now());
                self.stall = (u16::from(conv.status()) << 8) | if conv.in_batch() { STALL_IN_BATCH } else { 0 };
            }
        } else if self.stalled_since.is_some() {
            self.stalled_since = None;
            self.stall = 0;
        }
        let owing = conv.owed() > 0 && !conv.copy_in();
        if !owing {
            self.query_since = None;
            self.cancelled_at = None;
        } else if self.query_since.is_none() && self.spec.watch.query_timeout.is_some() {
            self.query_since = Some(Instant::now());
        }
        self.unsent = unsent;
        if !((owing || unsent) && reading) {
            self.silent_since = None;
            self.probe = None;
        } else if (self.silent_since.is_none() || self.heard) && self.spec.watch.silence.is_some() {
            // Restarted here rather than in `heard`: the read that ends a
            // transaction then costs no clock reading. A silence of bytes
            // not taken (mid-COPY IN) starts now, not when the query began.
            let since = match (self.silent_since, query_started) {
                (None, Some(t)) if owing => t,
                _ => Instant::now(),
            };
            self.silent_since = Some(since);
            self.probe = None;
            if self.alive_probes != 0 {
                self.alive_probes = 0;
                self.silence_limit = self.spec.watch.silence;
            }
        }
        self.heard = false;
        if conv.status() == status::IDLE {
            self.timer.xact_since = None;
        } else if self.timer.xact_since.is_none() && self.spec.watch.transaction.is_some() {
            self.timer.xact_since = Some(Instant::now());
        }
        let idle_in_tx = client_quiet && conv.is_quiet() && conv.status() != status::IDLE;
        if !idle_in_tx {
            self.idle_since = None;
        } else if self.idle_since.is_none() && self.spec.watch.idle_transaction.is_some() {
            self.idle_since = Some(Instant::now());
        }
    }

    /// The client's clocks kept between conversations (session mode's
    /// transaction clock for SHOW STATS).
    pub(crate) fn timer(&mut self) -> &mut AlarmTimer {
        self.timer
    }

    /// The server sent bytes, or took bytes its socket had left waiting: it
    /// is alive. The silence clock restarts at the next `update` (which
    /// always comes before the alarm is polled again).
    pub(crate) fn heard(&mut self) {
        self.heard = true;
    }

    /// The server sent a ReadyForQuery: the next query gets a fresh clock.
    pub(crate) fn answered(&mut self) {
        if self.query_since.is_some() {
            self.query_since = Some(Instant::now());
            self.cancelled_at = None;
        }
    }

    /// The client sent bytes.
    pub(crate) fn client_spoke(&mut self) {
        if self.idle_since.is_some() {
            self.idle_since = Some(Instant::now());
        }
    }

    /// True when some clock runs or a probe is out.
    pub(crate) fn armed(&self) -> bool {
        self.query_since.is_some()
            || self.silent_since.is_some()
            || self.idle_since.is_some()
            || self.timer.xact_since.is_some()
            || self.stalled_since.is_some()
    }

    /// Ready when a clock ends the conversation. Cancel-safe: the timer and
    /// a probe in flight live in `self`, so a transfer that stops polling
    /// loses nothing. The clock is read only when the timer fires: until
    /// then no deadline has passed, because the timer is never later than
    /// the nearest one. A poll function, not an `async fn`: the forwarding
    /// loop polls it once per wait, and a future built for each wait (with
    /// a `select!` between the probe and the timer inside) cost more than
    /// the timer's own poll.
    pub(crate) fn poll_alarm(&mut self, cx: &mut Context<'_>) -> Poll<WatchdogError> {
        loop {
            let next = self.next_deadline();
            self.arm(next);
            if let Some(p) = self.probe.as_mut() {
                if let Poll::Ready(v) = p.as_mut().poll(cx) {
                    self.probe = None;
                    match self.judge(v) {
                        Some(e) => return Poll::Ready(e),
                        None => continue,
                    }
                }
            }
            if next.is_none() || !self.timer.poll_fired(cx) {
                return Poll::Pending;
            }
            if let Some(e) = self.check(Instant::now()) {
                return Poll::Ready(e);
            }
        }
    }

    /// Acts on deadlines that have passed: sends the cancel, starts a probe,
    /// or returns the error that ends the conversation.
    fn check(&mut self, now: Instant) -> Option<WatchdogError> {
        if let (Some(since), Some(limit)) = (self.query_since, self.spec.watch.query_timeout) {
            match self.cancelled_at {
                None if now >= since + limit => {
                    crate::span::client_event!(info, pid = self.cancel.pid, "query_timeout: cancelling the query");
                    tokio::spawn(forward_cancel(self.cancel.clone(), self.spec.watch.cancel_grace));
                    self.cancelled_at = Some(now);
                }
                Some(at) if now >= at + self.spec.watch.cancel_grace => {
                    return Some(WatchdogError::QueryTimeout { limit, grace: self.spec.watch.cancel_grace });
                }
                _ => {}
            }
        }
        if let (Some(since), Some(limit)) = (self.silent_since, self.silence_limit) {
            if self.probe.is_none() && now >= since + limit {
                crate::span::client_event!(
                    info,
                    pid = self.cancel.pid,
                    "server silent while owing an answer: probing it"
                );
                let (spec, pid, unsent) = (self.spec.clone(), self.cancel.pid, self.unsent);
                self.probe = Some(Box::pin(async move { probe::probe(&spec, pid, unsent).await }));
            }
        }
        if let (Some(since), Some(limit)) = (self.idle_since, self.spec.watch.idle_transaction) {
            if now >= since + limit {
                return Some(WatchdogError::IdleTransaction(limit));
            }
        }
        if let (Some(since), Some(limit)) = (self.timer.xact_since, self.spec.watch.transaction) {
            if now >= since + limit {
                return Some(WatchdogError::Transaction(limit));
            }
        }
        if let Some(since) = self.stalled_since {
            if now >= since + self.stall_limit() {
                if self.stall & STALL_TOLD != 0 {
                    return Some(WatchdogError::StallEnded(now - since));
                }
                return Some(self.report_stall(now - since));
            }
        }
        None
    }

    /// How long after its start the stall is next acted on: reported, then ended.
    fn stall_limit(&self) -> Duration {
        if self.stall & STALL_TOLD == 0 {
            STALL_LIMIT
        } else {
            STALL_END
        }
    }

    /// A stall: logged once with the session's state; the caller counts it.
    fn report_stall(&mut self, held_for: Duration) -> WatchdogError {
        self.stall |= STALL_TOLD;
        crate::span::client_event!(
            warn,
            pid = self.cancel.pid,
            held_ms = held_for.as_millis() as u64,
            pending_rfq = 0,
            in_batch = self.stall & STALL_IN_BATCH != 0,
            status = %char::from((self.stall >> 8) as u8),
            "pipeline stalled inside weir: client messages held while the server owes no answer"
        );
        WatchdogError::Stalled
    }

    fn judge(&mut self, verdict: Verdict) -> Option<WatchdogError> {
        match verdict {
            Verdict::Alive => {
                crate::span::client_event!(debug, pid = self.cancel.pid, "silent server is still working");
                self.silent_since = Some(Instant::now());
                self.alive_probes = (self.alive_probes + 1).min(MAX_SILENCE_BACKOFF);
                self.silence_limit = self.spec.watch.silence.map(|s| s * (1u32 << self.alive_probes));
                None
            }
            Verdict::Dead(why) => {
                crate::span::client_event!(warn, pid = self.cancel.pid, %why, "server connection is dead");
                Some(WatchdogError::Unresponsive { silence: self.spec.watch.silence.unwrap_or_default(), why })
            }
        }
    }

    /// The nearest deadline of the clocks that run (usually the silence
    /// clock alone: one addition).
    fn next_deadline(&self) -> Option<Instant> {
        let mut next = None;
        let mut consider = |at: Instant| {
            if next.is_none_or(|n| at < n) {
                next = Some(at);
            }
        };
        if let (Some(since), Some(limit), None) = (self.silent_since, self.silence_limit, &self.probe) {
            consider(since + limit);
        }
        match (self.query_since, self.spec.watch.query_timeout, self.cancelled_at) {
            (Some(_), _, Some(at)) => consider(at + self.spec.watch.cancel_grace),
            (Some(since), Some(limit), None) => consider(since + limit),
            _ => {}
        }
        if let (Some(since), Some(limit)) = (self.idle_since, self.spec.watch.idle_transaction) {
            consider(since + limit);
        }
        if let (Some(since), Some(limit)) = (self.timer.xact_since, self.spec.watch.transaction) {
            consider(since + limit);
        }
        if let Some(since) = self.stalled_since {
            consider(since + self.stall_limit());
        }
        next
    }

    /// Points the timer at `next` unless it already fires at or before it
    /// (it then fires early and is re-armed: clocks that move on every byte
    /// cost no timer reset).
    fn arm(&mut self, next: Option<Instant>) {
        let Some(at) = next else { return };
        if self.timer.at.is_some_and(|t| t <= at) {
            return;
        }
        self.timer.set(at);
    }
}

/// Doublings of the silence between probes of one long silent query.
const MAX_SILENCE_BACKOFF: u8 = 4;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_silent_query_found_alive_is_probed_ever_less_often() {
        let cfg = crate::config::Config::from_toml(
            "[weir]\nauth_type = \"trust\"\nserver_check_silence = \"5s\"\n[databases.app]\n",
            std::path::Path::new("."),
        )
        .unwrap();
        let key = crate::pool::PoolKey { database: "app".into(), user: "u".into() };
        let opts = crate::pool::PoolOptions::from_config(&cfg, &key, crate::auth::Credentials::None).unwrap();
        let spec = Arc::new(opts.spec);
        let cancel = CancelTarget {
            addr: crate::server::cancel::CancelAddr::Tcp("127.0.0.1:1".parse().unwrap()),
            pid: 1,
            gate: Default::default(),
        };
        let mut timer = AlarmTimer::default();
        let mut w = Watchdog::new(&spec, &cancel, &mut timer);
        let limits: Vec<u64> = (0..6)
            .map(|_| {
                let s = w.silence_limit.unwrap().as_secs();
                w.judge(Verdict::Alive);
                s
            })
            .collect();
        assert_eq!(limits, vec![5, 10, 20, 40, 80, 80]);
    }

    /// Polled once after it is set, looked at (not polled) in between, the
    /// timer still wakes its task when it fires, also after it was moved to
    /// an earlier deadline. A timer that lost its waker hangs here.
    #[tokio::test]
    async fn a_timer_polled_once_wakes_its_task_when_it_fires() {
        let mut timer = AlarmTimer::default();
        timer.set(Instant::now() + Duration::from_secs(3600));
        let mut polls = 0;
        let fired = std::future::poll_fn(|cx| {
            polls += 1;
            if polls == 3 {
                timer.set(Instant::now() + Duration::from_millis(20));
            }
            if timer.poll_fired(cx) {
                return Poll::Ready(());
            }
            // Polls 2, 4 and 5 find the timer registered with this task.
            if polls < 5 {
                assert!(timer.waker.is_some(), "poll {polls} registered the timer");
                cx.waker().wake_by_ref();
            }
            Poll::Pending
        });
        tokio::time::timeout(Duration::from_secs(60), fired).await.expect("the timer woke its task");
        assert!(timer.at.is_none() && timer.waker.is_none(), "a fired timer is polled again once set");
    }

    #[test]
    fn errors_carry_the_right_codes_and_reasons() {
        let q = WatchdogError::QueryTimeout { limit: Duration::from_secs(1), grace: Duration::from_secs(2) };
        assert_eq!(q.sqlstate(), sqlstate::CONNECTION_FAILURE);
        assert_eq!(q.close_reason(), Some(CloseReason::QueryTimeout));
        assert!(q.to_string().contains("query_timeout"));
        let i = WatchdogError::IdleTransaction(Duration::from_secs(1));
        assert_eq!(i.sqlstate(), sqlstate::PROTOCOL_VIOLATION);
        assert_eq!(i.close_reason(), None, "the server is rolled back and kept");
        let u = WatchdogError::Unresponsive { silence: Duration::from_secs(5), why: "x".into() };
        assert_eq!(u.close_reason(), Some(CloseReason::Unresponsive));
    }
}
