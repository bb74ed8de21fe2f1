//! A request's wait for a server: the pool's queue (watching the client's
//! socket and the cancel registry meanwhile), deadline-aware start, and the
//! last look at the client before its query goes to a server.

use std::task::Poll;
use std::time::{Duration, Instant};

use super::Session;
use tokio::io::AsyncWriteExt;

use crate::pool::{Lease, PoolError};
use crate::protocol::messages::{self, Severity};
use crate::protocol::sqlstate;
use crate::protocol::{scan_frames, tags::frontend as fe};
use crate::wire;

/// The NOTICE query_wait_notify sends (PgBouncer's words).
const QUEUED_NOTICE: &str = "No server connection available in postgres backend, client being queued";

/// While queued, read at most this much more from the client (to see it leave).
const WAIT_READ_LIMIT: usize = 1 << 20;

/// How a wait for a server ended.
pub(super) enum Wait {
    Got(Lease),
    Gone,
    Cancelled,
    Failed(PoolError),
}

impl Session<'_> {
    /// Deadline-aware start: Some when the client's deadline (declared, or
    /// the pool's client_deadline), less the wait since `waiting_since`
    /// (none: no wait), leaves less time than this pool's transactions take.
    /// Two atomic loads, and no clock reading, when no deadline is known.
    pub(super) fn too_late(&self, waiting_since: Option<Instant>) -> Option<PoolError> {
        let deadline = self.client_deadline()?;
        let needed = self.pool.estimate.start_threshold(deadline)?;
        let waited = waiting_since.map_or(Duration::ZERO, |t| t.elapsed());
        let left = deadline.saturating_sub(waited);
        (left < needed).then_some(PoolError::TooLate { left, needed })
    }

    /// Queues for a server while watching the client and the cancel registry.
    pub(super) async fn wait_for_server(&mut self, arrived: Instant) -> Wait {
        let budget = arrived + self.budget.under(self.pool.query_wait_timeout());
        // Deadline-aware start, decided early: a query that must start by
        // `start_by` to finish within its client's deadline waits only until
        // then (and admission sheds it at once when the queue ahead cannot
        // reach it by then), instead of learning it when a server frees up.
        let start_by = self.start_by(arrived).filter(|(by, _)| *by < budget);
        let deadline = start_by.map_or(budget, |(by, _)| by);
        let outcome = self.queue(arrived, deadline).await;
        match outcome {
            // The wait ate into the deadline: the server goes on unused.
            Wait::Got(lease) => match self.too_late(Some(arrived)) {
                Some(e) => {
                    drop(lease);
                    Wait::Failed(e)
                }
                None => Wait::Got(lease),
            },
            // Waited until the last moment the query could start.
            Wait::Failed(PoolError::WaitTimeout { .. }) if start_by.is_some() => {
                let needed = start_by.map_or(Duration::ZERO, |(_, needed)| needed);
                let left = self.client_deadline().map_or(Duration::ZERO, |d| d.saturating_sub(arrived.elapsed()));
                Wait::Failed(PoolError::TooLate { left, needed })
            }
            other => other,
        }
    }

    /// The client's deadline: declared, or the pool's client_deadline.
    fn client_deadline(&self) -> Option<Duration> {
        self.budget.declared().or_else(|| self.pool.estimate.client_deadline())
    }

    /// The last instant a query that arrived at `arrived` may start under
    /// deadline-aware start, and the time it needs left; None when no
    /// deadline is known or the rule is off or young.
    fn start_by(&self, arrived: Instant) -> Option<(Instant, Duration)> {
        let deadline = self.client_deadline()?;
        let needed = self.pool.estimate.start_threshold(deadline)?;
        Some((arrived + deadline.saturating_sub(needed), needed))
    }

    /// The wait in the pool's queue, until `deadline` (which the pool's
    /// expiry keeps: the wait has no timer of its own).
    async fn queue(&mut self, arrived: Instant, deadline: Instant) -> Wait {
        // Transaction mode: the pool hands servers over by the statement
        // the transaction starts with (session mode queues by login alone).
        let tagged = self.mode == crate::config::PoolMode::Transaction && self.tag_request();
        // Borrowed from the session (a field apart from those the wait
        // uses), so the wait's future holds a pointer, not the tag.
        let tag = self.statements.as_deref().and_then(|s| s.last.as_ref()).filter(|_| tagged);
        // Borrowed, not cloned: a clone and its drop touch the cancel slot's
        // count, a cold line by the time the server comes.
        let (slot, pool) = (&self.reg.slot, &self.pool);
        let acquire = pool.acquire_with(arrived, deadline, tag);
        tokio::pin!(acquire);
        // query_wait_notify: a NOTICE once the wait has lasted that long, on
        // the client's alarm timer (idle while no conversation runs; the
        // watchdog re-arms it), so the wait's future holds no timer of its own.
        let notify_after = pool.query_wait_notify();
        let mut notify = !notify_after.is_zero();
        if notify {
            self.alarm.set(arrived + notify_after);
        }
        // Biased: a cancel that came in the same instant a server freed up
        // wins, and the server goes on to the next waiter. A departure in
        // that instant wins too, through `settle`'s last look at the socket
        // (which reads what this branch would have read, without a poll of
        // its own): so a server handed over is taken without polling the
        // client socket, and the socket is polled only while the wait goes on.
        loop {
            tokio::select! {
                biased;
                _ = slot.cancelled_in_queue() => break Wait::Cancelled,
                r = &mut acquire => break match r {
                    Ok(lease) => Wait::Got(lease),
                    Err(e) => Wait::Failed(e),
                },
                () = std::future::poll_fn(|cx| if self.alarm.poll_fired(cx) { Poll::Ready(()) } else { Poll::Pending }), if notify => {
                    notify = false;
                    let mut out = bytes::BytesMut::new();
                    messages::error_response(&mut out, Severity::Notice, sqlstate::SUCCESSFUL_COMPLETION, QUEUED_NOTICE);
                    if self.client.write_all(&out).await.is_err() {
                        break Wait::Gone;
                    }
                }
                r = wire::fill(self.client, &mut self.client_in), if self.client_in.len() < WAIT_READ_LIMIT => {
                    if let Ok(n) = r {
                        pool.metrics.record_received(n);
                    }
                    if r.is_err() || terminate_in(&self.client_in, self.max_message) {
                        break Wait::Gone;
                    }
                }
            }
        }
    }

    /// The end of a wait. On `Got` the slot stays Waiting until `serve` has
    /// the server ready, so a cancel arriving meanwhile still stops the query
    /// from running.
    pub(super) fn settle(&mut self, outcome: Wait) -> Wait {
        let outcome = match outcome {
            Wait::Got(lease) if self.left_meanwhile() => {
                drop(lease);
                Wait::Gone
            }
            other => other,
        };
        if !matches!(outcome, Wait::Got(_)) {
            self.reg.slot.set_idle();
        }
        outcome
    }

    /// A last look at the client socket without waiting, just before its
    /// query would go to a server: EOF, a reset or a Terminate means it left.
    fn left_meanwhile(&mut self) -> bool {
        if self.client_in.capacity() - self.client_in.len() < 4096 {
            self.client_in.reserve(8192);
        }
        match self.client.try_read_buf(&mut self.client_in) {
            Ok(0) => true,
            Ok(n) => {
                self.pool.metrics.record_received(n);
                self.terminate_buffered()
            }
            Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
        }
    }

    pub(super) fn terminate_buffered(&self) -> bool {
        terminate_in(&self.client_in, self.max_message)
    }
}

/// Whether the client's buffered bytes hold a Terminate.
fn terminate_in(buf: &[u8], max_message: u32) -> bool {
    let mut seen = false;
    let _ = scan_frames(buf, max_message as usize, |tag, _| {
        seen = tag == fe::TERMINATE;
        !seen
    });
    seen
}
