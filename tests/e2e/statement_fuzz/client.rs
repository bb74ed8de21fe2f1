//! One run of a case on one target: the case's clients log in, send their
//! steps in order, and read every reply they are owed, which is kept (with
//! what differs by nature masked) for comparison.
//!
//! A client knows what it is owed as a backend would answer: one reply per
//! extended message, ReadyForQuery per Sync or simple query, and after an
//! ErrorResponse to an extended message nothing more up to the next Sync,
//! for what it sent already and for what it sends before that Sync. A read
//! that waits past `REPLY_LIMIT` fails the run. At the end each client
//! sends one more Sync and reads up to its ReadyForQuery, so that a reply
//! sent beyond what was owed shows too.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use weir::protocol::tags::backend as be;
use weir_e2e::raw::{error_fields, tagged, Raw};
use weir_e2e::TRUST_USER;

use super::case::{encode, Case, Op};
use weir::protocol::tags::frontend as fe;

/// How long a client waits for a reply it is owed.
const REPLY_LIMIT: Duration = Duration::from_secs(5);

/// One message as compared: its tag and its body with inherent differences masked.
pub type Msg = (char, String);

/// Where a run goes: an address, and startup parameters besides the user.
pub struct Target<'a> {
    pub addr: SocketAddr,
    pub startup: &'a [(&'a str, &'a str)],
}

/// Runs `case` on `target`: each client's compared replies, or the first
/// failure to get them.
pub async fn run(case: &Case, target: &Target<'_>) -> Result<Vec<Vec<Msg>>, String> {
    let mut clients = Vec::new();
    for _ in 0..case.clients {
        let raw = Raw::login_within(REPLY_LIMIT, target.addr, TRUST_USER, "", target.startup).await?;
        clients.push(Client { raw, owed: VecDeque::new(), skipping: false, seen: Vec::new(), defined: Vec::new() });
    }
    for (i, step) in case.steps.iter().enumerate() {
        let c = &mut clients[step.client];
        c.raw.send(&encode(step, &mut c.defined)).await?;
        for op in &step.ops {
            c.owe(op);
        }
        if step.reads() {
            c.read_owed().await.map_err(|e| format!("step {i} (client {}): {e}", step.client))?;
        }
    }
    let mut out = Vec::new();
    for (n, mut c) in clients.into_iter().enumerate() {
        c.raw.send(&tagged(fe::SYNC, &[])).await?;
        c.owe(&Op::Sync);
        c.read_owed().await.map_err(|e| format!("the last Sync (client {n}): {e}"))?;
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
    /// An extended message failed and no Sync was sent since: the backend
    /// answers nothing but the next Sync.
    skipping: bool,
    seen: Vec<Msg>,
    defined: Vec<(String, usize)>,
}

impl Client {
    fn owe(&mut self, op: &Op) {
        match op {
            Op::Flush => {}
            Op::Sync => {
                self.skipping = false;
                self.owed.push_back(Owed::Ready);
            }
            _ if self.skipping => {}
            Op::Query(_) => self.owed.push_back(Owed::Ready),
            _ => self.owed.push_back(Owed::Reply),
        }
    }

    /// Reads until nothing is owed.
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
                // No Sync sent yet: what is sent up to it is skipped.
                self.skipping = self.owed.is_empty();
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
