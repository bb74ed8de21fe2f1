//! The reply queue of a client weir does not track (yet): one byte per
//! reply the server owes, by kind, in the order the client's messages went.
//! It follows the replies as the full queue (`Expect`) would, but with none
//! of its cost (no statement names, no drops, no server-side bookkeeping,
//! none of which an untracked client has), and becomes that queue, entry
//! for entry, the moment tracking starts.

use std::collections::VecDeque;

use super::Expect;
use crate::protocol::{
    peek_header,
    tags::{backend as be, frontend as fe},
    HEADER_LEN,
};
use crate::server::conversation::MAX_SERVER_MESSAGE;

const PARSE: u8 = 0;
const BIND: u8 = 1;
const DESCRIBE: u8 = 2;
const CLOSE: u8 = 3;
const EXECUTE: u8 = 4;
const QUERY: u8 = 5;
const SYNC: u8 = 6;
const COPY_END: u8 = 7;

/// What the server owes an untracked client, in order: up to `INLINE`
/// kinds packed in a word (oldest in the low bits), the rest of a longer
/// pipeline (and the rare edits in the middle) in a deque.
#[derive(Debug, Default)]
pub(super) struct Owed {
    inline: u64,
    /// Kinds in `inline`; 0 whenever `spill` holds any.
    n: u32,
    spill: VecDeque<u8>,
}

/// Kinds a word holds, 4 bits each.
const INLINE: u32 = 16;

/// What a pass over replies found that the client's state must know.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Observed {
    /// Status byte of the last ReadyForQuery passed.
    pub status: Option<u8>,
    /// An error left no Sync queued: the server skips to the client's next.
    pub skipping: Option<bool>,
}

impl Owed {
    pub fn len(&self) -> usize {
        self.n as usize + self.spill.len()
    }

    pub fn clear(&mut self) {
        self.inline = 0;
        self.n = 0;
        self.spill.clear();
    }

    #[inline]
    fn push(&mut self, kind: u8) {
        if self.n < INLINE && self.spill.is_empty() {
            self.inline |= u64::from(kind) << (4 * self.n);
            self.n += 1;
        } else {
            self.kinds().push_back(kind);
        }
    }

    #[inline]
    fn front(&self) -> Option<u8> {
        if self.n > 0 {
            Some((self.inline & 0xf) as u8)
        } else {
            self.spill.front().copied()
        }
    }

    #[inline]
    fn pop_front(&mut self) {
        if self.n > 0 {
            self.inline >>= 4;
            self.n -= 1;
        } else {
            self.spill.pop_front();
        }
    }

    /// All kinds as one deque, for what edits the middle of the queue.
    fn kinds(&mut self) -> &mut VecDeque<u8> {
        while self.n > 0 {
            self.spill.push_back((self.inline & 0xf) as u8);
            self.inline >>= 4;
            self.n -= 1;
        }
        &mut self.spill
    }

    /// Queues what the server owes for a client message passed on untouched.
    #[inline]
    pub fn sent(&mut self, tag: u8, copy_in: &mut bool) {
        let kind = match tag {
            fe::PARSE => PARSE,
            fe::BIND => BIND,
            fe::DESCRIBE => DESCRIBE,
            fe::CLOSE => CLOSE,
            fe::EXECUTE => EXECUTE,
            fe::QUERY | fe::FUNCTION_CALL => QUERY,
            // Postgres ignores Sync during COPY IN.
            fe::SYNC if *copy_in => return,
            fe::SYNC => SYNC,
            fe::COPY_DONE | fe::COPY_FAIL => {
                *copy_in = false;
                COPY_END
            }
            _ => return,
        };
        self.push(kind);
    }

    /// Pops what the server messages in `src[at..]` answer (headers only).
    /// Returns the bytes of a message cut off at the end, still to come.
    pub fn observe(&mut self, src: &[u8], at: usize, seen: &mut Observed) -> u32 {
        if self.awaits_ready_only() {
            return self.observe_ready(src, at, seen);
        }
        self.observe_any(src, at, seen)
    }

    /// `observe` for any queue.
    fn observe_any(&mut self, src: &[u8], mut at: usize, seen: &mut Observed) -> u32 {
        while let Ok(Some((tag, total))) = peek_header(&src[at..], MAX_SERVER_MESSAGE) {
            let front = self.front();
            match tag {
                be::DATA_ROW => {}
                be::PARSE_COMPLETE => self.pop_if(front, PARSE),
                be::BIND_COMPLETE => self.pop_if(front, BIND),
                be::CLOSE_COMPLETE => self.pop_if(front, CLOSE),
                be::ROW_DESCRIPTION | be::NO_DATA => self.pop_if(front, DESCRIBE),
                be::COMMAND_COMPLETE | be::EMPTY_QUERY_RESPONSE | be::PORTAL_SUSPENDED => self.pop_if(front, EXECUTE),
                be::COPY_IN_RESPONSE | be::COPY_BOTH_RESPONSE if front == Some(EXECUTE) => self.drop_ignored_syncs(),
                be::ERROR_RESPONSE if !matches!(front, None | Some(QUERY) | Some(SYNC)) => {
                    let kinds = self.kinds();
                    let end = kinds.iter().position(|&k| k == SYNC);
                    kinds.drain(..end.unwrap_or(kinds.len()));
                    seen.skipping = Some(end.is_none());
                }
                be::READY_FOR_QUERY => {
                    if let Some(&s) = src.get(at + HEADER_LEN).filter(|_| total > HEADER_LEN) {
                        seen.status = Some(s);
                    }
                    self.through_sync(front);
                }
                _ => {}
            }
            let avail = src.len() - at;
            if avail < total {
                // A message length is an i32: the rest fits.
                return (total - avail) as u32;
            }
            at += total;
        }
        0
    }

    /// Every kind queued is answered by a ReadyForQuery alone (simple
    /// Queries and Syncs; none at all counts too): no other reply moves
    /// the queue, nor starts the skipping an error does.
    #[inline]
    fn awaits_ready_only(&self) -> bool {
        self.spill.is_empty() && (0..self.n).all(|i| matches!(((self.inline >> (4 * i)) & 0xf) as u8, QUERY | SYNC))
    }

    /// `observe` for a queue that `awaits_ready_only`: each ReadyForQuery
    /// pops the head (what `through_sync` does with a Query or Sync there,
    /// and nothing on an empty queue) and gives its status.
    fn observe_ready(&mut self, src: &[u8], mut at: usize, seen: &mut Observed) -> u32 {
        while let Ok(Some((tag, total))) = peek_header(&src[at..], MAX_SERVER_MESSAGE) {
            if tag == be::READY_FOR_QUERY {
                if let Some(&s) = src.get(at + HEADER_LEN).filter(|_| total > HEADER_LEN) {
                    seen.status = Some(s);
                }
                if self.n > 0 {
                    self.pop_front();
                }
            }
            let avail = src.len() - at;
            if avail < total {
                // A message length is an i32: the rest fits.
                return (total - avail) as u32;
            }
            at += total;
        }
        0
    }

    #[inline]
    fn pop_if(&mut self, front: Option<u8>, kind: u8) {
        if front == Some(kind) {
            self.pop_front();
        }
    }

    /// A ReadyForQuery ends the Sync or Query at the head, and whatever
    /// before it was never answered.
    fn through_sync(&mut self, front: Option<u8>) {
        if matches!(front, Some(SYNC | QUERY)) {
            self.pop_front();
            return;
        }
        let kinds = self.kinds();
        let end = kinds.iter().position(|&k| k == SYNC || k == QUERY);
        kinds.drain(..end.map_or(kinds.len(), |i| i + 1));
    }

    /// COPY IN started by the Execute at the head: Postgres ignores the
    /// Syncs up to the client's CopyDone or CopyFail.
    fn drop_ignored_syncs(&mut self) {
        let kinds = self.kinds();
        let mut end = kinds.iter().position(|&k| k == COPY_END).unwrap_or(kinds.len());
        let mut i = 1;
        while i < end {
            if kinds[i] == SYNC {
                kinds.remove(i);
                end -= 1;
            } else {
                i += 1;
            }
        }
    }

    /// The server skips what was queued from `from` on, up to the next Sync.
    /// Returns whether no Sync was queued (the skipping goes on).
    pub fn skipped(&mut self, from: usize) -> bool {
        let kinds = self.kinds();
        let end = kinds.iter().skip(from).position(|&k| k == SYNC).map(|i| from + i);
        kinds.drain(from..end.unwrap_or(kinds.len()));
        end.is_none()
    }

    /// The full queue's entries for these, in order; leaves this empty.
    pub fn materialise(&mut self, into: &mut VecDeque<Expect>) {
        into.extend(self.kinds().drain(..).map(|k| match k {
            PARSE => Expect::Parse { pass: true, weir: None, client: None, refused: None },
            BIND => Expect::Bind { managed: None },
            DESCRIBE => Expect::Describe { managed: None },
            CLOSE => Expect::Close { pass: true, evicted: None },
            EXECUTE => Expect::Execute,
            QUERY => Expect::Query,
            SYNC => Expect::Sync,
            _ => Expect::CopyEnd,
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![tag];
        m.extend_from_slice(&(4 + body.len() as u32).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    fn sent(owed: &mut Owed, tags: &[u8]) {
        let mut copy_in = false;
        tags.iter().for_each(|&t| owed.sent(t, &mut copy_in));
    }

    #[test]
    fn a_pipeline_longer_than_a_word_keeps_its_order() {
        let mut owed = Owed::default();
        let segment = [fe::PARSE, fe::BIND, fe::DESCRIBE, fe::EXECUTE, fe::SYNC];
        (0..5).for_each(|_| sent(&mut owed, &segment));
        sent(&mut owed, &[fe::FLUSH, fe::QUERY]);
        assert_eq!(owed.len(), 26);
        // Two segments answered whole, the third up to its RowDescription,
        // which arrives cut off (its header pops the Describe).
        let mut replies = Vec::new();
        for _ in 0..2 {
            for (tag, body) in [
                (be::PARSE_COMPLETE, &b""[..]),
                (be::BIND_COMPLETE, b""),
                (be::ROW_DESCRIPTION, b"\0\0"),
                (be::DATA_ROW, b"\0\x01\0\0\0\x011"),
                (be::COMMAND_COMPLETE, b"SELECT 1\0"),
                (be::READY_FOR_QUERY, b"T"),
            ] {
                replies.extend(reply(tag, body));
            }
        }
        replies.extend(reply(be::PARSE_COMPLETE, b""));
        replies.extend(reply(be::BIND_COMPLETE, b""));
        replies.extend(&reply(be::ROW_DESCRIPTION, b"\0\0")[..6]);
        let mut seen = Observed::default();
        assert_eq!(owed.observe(&replies, 0, &mut seen), 1);
        assert_eq!(seen.status, Some(b'T'));
        assert_eq!(owed.len(), 26 - 13);
        let mut full = VecDeque::new();
        owed.materialise(&mut full);
        assert_eq!(owed.len(), 0);
        let kinds: String = full
            .iter()
            .map(|e| match e {
                Expect::Parse { .. } => 'P',
                Expect::Bind { .. } => 'B',
                Expect::Describe { .. } => 'D',
                Expect::Execute => 'E',
                Expect::Sync => 'S',
                Expect::Query => 'Q',
                _ => '?',
            })
            .collect();
        assert_eq!(kinds, "ESPBDESPBDESQ");
    }

    /// The walk for queues of Queries and Syncs leaves the queue, the status
    /// and the cut-off rest exactly as the walk for any queue does.
    #[test]
    fn queries_and_syncs_alone_are_observed_as_any_queue_is() {
        let row = [
            reply(be::ROW_DESCRIPTION, b"\0\0"),
            reply(be::DATA_ROW, b"\0\x01\0\0\0\x011"),
            reply(be::COMMAND_COMPLETE, b"SELECT 1\0"),
        ]
        .concat();
        let streams = [
            [row.clone(), reply(be::READY_FOR_QUERY, b"I")].concat(),
            [row.clone(), reply(be::READY_FOR_QUERY, b"T"), row.clone(), reply(be::READY_FOR_QUERY, b"E")].concat(),
            [reply(be::ERROR_RESPONSE, b"C42601\0\0"), reply(be::READY_FOR_QUERY, b"I")].concat(),
            [reply(be::COPY_IN_RESPONSE, b"\0\0\0"), reply(be::PARSE_COMPLETE, b""), reply(be::CLOSE_COMPLETE, b"")]
                .concat(),
            [row.clone(), reply(be::READY_FOR_QUERY, b"I"), reply(be::READY_FOR_QUERY, b"I")].concat(),
            [row.clone(), reply(be::READY_FOR_QUERY, b"I")[..5].to_vec()].concat(),
            row[..9].to_vec(),
        ];
        let queues: [&[u8]; 5] = [&[], &[fe::QUERY], &[fe::QUERY, fe::QUERY], &[fe::SYNC, fe::QUERY], &[fe::SYNC; 17]];
        for queue in queues {
            for stream in &streams {
                let (mut fast, mut any) = (Owed::default(), Owed::default());
                sent(&mut fast, queue);
                sent(&mut any, queue);
                assert_eq!(fast.awaits_ready_only(), queue.len() <= INLINE as usize);
                let (mut seen_fast, mut seen_any) = (Observed::default(), Observed::default());
                let rest = (fast.observe(stream, 0, &mut seen_fast), any.observe_any(stream, 0, &mut seen_any));
                assert_eq!(rest.0, rest.1);
                assert_eq!((seen_fast.status, seen_fast.skipping), (seen_any.status, seen_any.skipping));
                let (mut a, mut b) = (VecDeque::new(), VecDeque::new());
                fast.materialise(&mut a);
                any.materialise(&mut b);
                assert_eq!(format!("{a:?}"), format!("{b:?}"), "queue {queue:?}");
            }
        }
    }

    #[test]
    fn an_error_skips_to_the_sync_and_says_when_none_is_queued() {
        let mut owed = Owed::default();
        sent(&mut owed, &[fe::PARSE, fe::BIND, fe::EXECUTE, fe::SYNC, fe::PARSE, fe::BIND]);
        let mut seen = Observed::default();
        let replies = [reply(be::ERROR_RESPONSE, b"C42601\0\0"), reply(be::READY_FOR_QUERY, b"I")].concat();
        assert_eq!(owed.observe(&replies, 0, &mut seen), 0);
        assert_eq!((seen.skipping, seen.status, owed.len()), (Some(false), Some(b'I'), 2));
        let replies = [reply(be::PARSE_COMPLETE, b""), reply(be::ERROR_RESPONSE, b"C42601\0\0")].concat();
        let mut seen = Observed::default();
        owed.observe(&replies, 0, &mut seen);
        assert_eq!((seen.skipping, owed.len()), (Some(true), 0));
    }
}
