//! The stage against scripted client batches and server replies: what the
//! server receives, and what the client sees, in order. Errors on named
//! statements and the statement generations they start are in `errors.rs`.

use bytes::{Bytes, BytesMut};
use weir_metrics::PoolMetrics;

use super::*;
use crate::protocol::{
    extended::{read_bind_head, read_parse, read_target},
    scan_frames,
    tags::{backend as be, frontend as fe},
    HEADER_LEN,
};
use crate::server::conversation::STREAM_THRESHOLD;

mod edges;
mod errors;
mod outcomes;

fn msg(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut m = vec![tag];
    m.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
    m.extend_from_slice(body);
    m
}

fn parse(name: &str, q: &str) -> Vec<u8> {
    msg(fe::PARSE, &[name.as_bytes(), b"\0", q.as_bytes(), b"\0\0\0"].concat())
}

fn bind(stmt: &str) -> Vec<u8> {
    msg(fe::BIND, &[b"\0", stmt.as_bytes(), b"\0\0\0\0\0\0\0"].concat())
}

fn target(tag: u8, kind: u8, name: &str) -> Vec<u8> {
    msg(tag, &[&[kind][..], name.as_bytes(), b"\0"].concat())
}

fn execute() -> Vec<u8> {
    msg(fe::EXECUTE, b"\0\0\0\0\0")
}

fn sync() -> Vec<u8> {
    msg(fe::SYNC, b"")
}

fn query(sql: &str) -> Vec<u8> {
    msg(fe::QUERY, &[sql.as_bytes(), b"\0"].concat())
}

fn reply(tag: u8) -> Vec<u8> {
    msg(tag, b"")
}

fn rfq(s: u8) -> Vec<u8> {
    msg(be::READY_FOR_QUERY, &[s])
}

fn error() -> Vec<u8> {
    msg(be::ERROR_RESPONSE, b"SERROR\0C42P01\0Mboom\0\0")
}

fn tags(b: &[u8]) -> String {
    let mut t = String::new();
    scan_frames(b, 1 << 30, |tag, _| {
        t.push(tag as char);
        true
    })
    .unwrap();
    t
}

/// Frames of `b` as (tag, body).
fn frames(b: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut v = vec![];
    scan_frames(b, 1 << 30, |tag, f| {
        v.push((tag, f[HEADER_LEN..].to_vec()));
        true
    })
    .unwrap();
    v
}

/// One client on one server connection.
struct Sim {
    stage: ClientStatements,
    server: ServerStatements,
    conv: Conversation,
}

impl Sim {
    fn new(max: u32) -> Sim {
        let metrics = PoolMetrics::new("db", "u");
        let mut s = Sim {
            stage: ClientStatements::new(true, max, metrics),
            server: ServerStatements::default(),
            conv: Conversation::default(),
        };
        s.stage.begin(&mut s.server, &s.conv, 0);
        s
    }

    /// A new lease on another server connection.
    fn switch_server(&mut self, server: ServerStatements) -> ServerStatements {
        self.stage.end(&mut self.server);
        let old = std::mem::replace(&mut self.server, server);
        self.conv = Conversation::default();
        self.stage.begin(&mut self.server, &self.conv, 0);
        old
    }

    /// Client bytes in; the bytes the server gets out (and what stays).
    fn send(&mut self, client: &[u8]) -> (Vec<u8>, Vec<u8>) {
        let mut client_in = BytesMut::from(client);
        let ready = self.stage.outbound(&mut client_in, &self.conv, &mut self.server, 1 << 30).unwrap();
        let out = self.conv.scan_client(&client_in[..ready], 1 << 30).unwrap();
        assert_eq!(out.forward, ready, "everything ready is forwarded");
        (client_in[..ready].to_vec(), client_in[ready..].to_vec())
    }

    fn sent(&mut self, client: &[u8]) -> Vec<u8> {
        let (sent, rest) = self.send(client);
        assert!(rest.is_empty(), "nothing held back");
        sent
    }

    /// Server bytes in; what the client sees (synthetic replies included).
    fn recv(&mut self, server: &[u8]) -> Vec<u8> {
        let mut out = self.synth();
        let mut server_in = BytesMut::from(server);
        while !server_in.is_empty() {
            let scanned = self.conv.scan_server(&server_in, |_, _| {}).unwrap();
            let chunk = server_in.split_to(scanned.forward).freeze();
            // As the transfer loop does: an untracked client's bytes are
            // only observed, and pass as they are.
            if !self.stage.is_tracking() {
                self.stage.observe(&chunk);
            }
            out.extend_from_slice(&self.stage.inbound(chunk, &mut self.server));
            out.extend(self.synth());
        }
        out
    }

    fn synth(&mut self) -> Vec<u8> {
        self.stage.synthetic().map(|s| s.bytes.to_vec()).unwrap_or_default()
    }

    fn weir(&self, client: &str) -> String {
        self.stage.managed(client.as_bytes()).map(|s| s.weir.to_string()).unwrap()
    }
}

#[test]
fn unnamed_statements_pass_untouched_and_are_not_tracked() {
    let mut s = Sim::new(20);
    let batch = [parse("", "select 1"), bind(""), execute(), sync()].concat();
    assert_eq!(s.sent(&batch), batch);
    let replies =
        [reply(be::PARSE_COMPLETE), reply(be::BIND_COMPLETE), msg(be::COMMAND_COMPLETE, b"SELECT 1\0"), rfq(b'I')]
            .concat();
    assert_eq!(s.recv(&replies), replies);
    assert!(!s.stage.tracking);
}

#[test]
fn named_statement_is_renamed_and_prepared_again_on_another_server() {
    let mut s = Sim::new(20);
    let sent = s.sent(&[parse("s1", "select $1"), target(fe::DESCRIBE, b'S', "s1"), sync()].concat());
    let weir = s.weir("s1");
    let f = frames(&sent);
    assert_eq!(tags(&sent), "PDS");
    assert_eq!(read_parse(&f[0].1).unwrap().name, weir.as_bytes());
    assert_eq!(read_target(&f[1].1).unwrap(), (b'S', weir.as_bytes()));
    let replies =
        [reply(be::PARSE_COMPLETE), msg(be::PARAMETER_DESCRIPTION, b"\0\0"), reply(be::NO_DATA), rfq(b'I')].concat();
    assert_eq!(s.recv(&replies), replies);

    s.switch_server(ServerStatements::default());
    let sent = s.sent(&[bind("s1"), execute(), sync()].concat());
    assert_eq!(tags(&sent), "PBES", "weir prepares it first");
    let f = frames(&sent);
    assert_eq!(read_parse(&f[0].1).unwrap().query, b"select $1");
    let bind_at = 5 + f[0].1.len();
    assert_eq!(read_bind_head(&sent[bind_at..]).unwrap().unwrap().statement, weir.as_bytes());
    let seen = s.recv(
        &[reply(be::PARSE_COMPLETE), reply(be::BIND_COMPLETE), msg(be::COMMAND_COMPLETE, b"SELECT 1\0"), rfq(b'I')]
            .concat(),
    );
    assert_eq!(tags(&seen), "2CZ", "the extra ParseComplete is swallowed");
    assert_eq!(s.stage.metrics.server_parses(), 2);
    assert_eq!(s.stage.metrics.client_parses(), 1);
}

#[test]
fn parse_of_a_statement_already_on_the_server_is_answered_in_order() {
    let mut s = Sim::new(20);
    s.sent(&[parse("a", "select 1"), sync()].concat());
    s.recv(&[reply(be::PARSE_COMPLETE), rfq(b'I')].concat());
    // Another client's statement with the same text, same server: pipelined
    // behind an unnamed query, whose outcome (the transaction may fail)
    // decides Postgres's answer: the server's, for weir's statement
    // closed and parsed again.
    let mut other = Sim::new(20);
    other.server = std::mem::take(&mut s.server);
    other.stage.begin(&mut other.server, &other.conv, 0);
    other.stage.tracking = true;
    let batch = [bind(""), execute(), sync(), parse("b", "select 1"), target(fe::DESCRIBE, b'S', "b"), sync()].concat();
    let sent = other.sent(&batch);
    assert_eq!(tags(&sent), "BESCPDS");
    assert_eq!(other.weir("b"), s.weir("a"), "shared across clients");
    let seen = other.recv(
        &[
            reply(be::BIND_COMPLETE),
            msg(be::COMMAND_COMPLETE, b"SELECT 1\0"),
            rfq(b'I'),
            reply(be::CLOSE_COMPLETE),
            reply(be::PARSE_COMPLETE),
            msg(be::PARAMETER_DESCRIPTION, b"\0\0"),
            reply(be::NO_DATA),
            rfq(b'I'),
        ]
        .concat(),
    );
    assert_eq!(tags(&seen), "2CZ1tnZ");
}

#[test]
fn a_lone_parse_with_flush_is_answered_without_the_server() {
    let mut s = Sim::new(20);
    s.sent(&[parse("a", "select 1"), sync()].concat());
    s.recv(&[reply(be::PARSE_COMPLETE), rfq(b'I')].concat());
    let sent = s.sent(&[parse("b", "select 1"), msg(fe::FLUSH, b"")].concat());
    assert_eq!(tags(&sent), "H");
    assert_eq!(tags(&s.synth()), "1");
}

#[test]
fn a_parse_weir_answers_goes_out_with_the_replies_when_a_sync_follows() {
    let mut s = Sim::new(20);
    s.sent(&[parse("a", "select 1"), sync()].concat());
    s.recv(&[reply(be::PARSE_COMPLETE), rfq(b'I')].concat());
    let sent = s.sent(&[parse("b", "select 1"), bind("b"), execute(), sync()].concat());
    assert_eq!(tags(&sent), "BES");
    assert!(s.stage.synthetic().is_none(), "nothing written before the server answers");
    let seen = s.recv(&[reply(be::BIND_COMPLETE), msg(be::COMMAND_COMPLETE, b"SELECT 1\0"), rfq(b'I')].concat());
    assert_eq!(tags(&seen), "12CZ", "its ParseComplete in place, in the same bytes");
}

#[test]
fn error_mid_batch_skips_to_sync_and_undoes_assumptions() {
    let mut s = Sim::new(20);
    s.sent(&[parse("a", "select 1"), sync()].concat());
    s.recv(&[reply(be::PARSE_COMPLETE), rfq(b'I')].concat());
    // a: already there (answered by weir); bad: sent and fails; c: skipped.
    let batch =
        [parse("a2", "select 1"), parse("bad", "select nope"), bind("bad"), parse("c", "select 1"), sync()].concat();
    let sent = s.sent(&batch);
    assert_eq!(tags(&sent), "PBS");
    let seen = s.recv(&[error(), rfq(b'I')].concat());
    assert_eq!(tags(&seen), "1EZ", "the ParseComplete due before the failure still comes");
    assert!(s.stage.statements.contains_key(&b"a2"[..]));
    assert!(!s.stage.statements.contains_key(&b"bad"[..]), "a failed Parse defines nothing");
    assert!(!s.stage.statements.contains_key(&b"c"[..]), "a skipped Parse defines nothing");
    let bad = Statement::new(b"select nope", b"\0\0", s.stage.metrics.statements_epoch(), 0);
    assert!(!s.server.contains(&bad.weir));
}

#[test]
fn failing_injected_parse_reaches_the_client_in_place_of_its_bind() {
    let mut s = Sim::new(20);
    s.sent(&[parse("a", "select * from t"), sync()].concat());
    s.recv(&[reply(be::PARSE_COMPLETE), rfq(b'I')].concat());
    s.switch_server(ServerStatements::default());
    let sent = s.sent(&[bind("a"), execute(), sync()].concat());
    assert_eq!(tags(&sent), "PBES");
    let seen = s.recv(&[error(), rfq(b'I')].concat());
    assert_eq!(tags(&seen), "EZ");
    assert!(s.server.is_empty());
    assert!(s.stage.statements.contains_key(&b"a"[..]), "the client's statement stays");
}

#[test]
fn close_is_answered_by_weir_and_unknown_names_reach_postgres() {
    let mut s = Sim::new(20);
    s.sent(&[parse("a", "select 1"), sync()].concat());
    s.recv(&[reply(be::PARSE_COMPLETE), rfq(b'I')].concat());
    let sent = s.sent(&[target(fe::CLOSE, b'S', "a"), sync()].concat());
    assert_eq!(tags(&sent), "S");
    assert_eq!(tags(&s.recv(&rfq(b'I'))), "3Z");
    let sent = s.sent(&[bind("a"), execute(), sync()].concat());
    assert_eq!(read_bind_head(&sent).unwrap().unwrap().statement, b"a", "Postgres answers 26000 itself");
    assert_eq!(tags(&s.recv(&[error(), rfq(b'I')].concat())), "EZ");
}

#[test]
fn eviction_closes_statements_from_earlier_leases() {
    let mut s = Sim::new(2);
    for (i, q) in ["select 1", "select 2"].iter().enumerate() {
        s.sent(&[parse(&format!("s{i}"), q), sync()].concat());
        s.recv(&[reply(be::PARSE_COMPLETE), rfq(b'I')].concat());
    }
    let server = s.switch_server(ServerStatements::default());
    s.switch_server(server);
    let sent = s.sent(&[parse("s2", "select 3"), sync()].concat());
    assert_eq!(tags(&sent), "CPS");
    let f = frames(&sent);
    assert_eq!(read_target(&f[0].1).unwrap().1, s.weir("s0").as_bytes());
    let seen = s.recv(&[reply(be::CLOSE_COMPLETE), reply(be::PARSE_COMPLETE), rfq(b'I')].concat());
    assert_eq!(tags(&seen), "1Z");
    assert_eq!(s.server.len(), 2);
    // s0 comes back when used.
    let sent = s.sent(&[bind("s0"), execute(), sync()].concat());
    assert_eq!(tags(&sent), "CPBES");
}

#[test]
fn a_new_max_bounds_the_cache_from_the_next_lease_and_zero_keeps_the_old() {
    let mut s = Sim::new(1);
    for (max, text, expect) in
        [(3, "select 1", "PS"), (3, "select 2", "PS"), (1, "select 3", "CCPS"), (0, "select 4", "CPS")]
    {
        s.stage.end(&mut s.server);
        s.stage.begin(&mut s.server, &s.conv, max);
        let sent = s.sent(&[parse(text, text), sync()].concat());
        assert_eq!(tags(&sent), expect, "max {max}: {text}");
        let closes = expect.matches('C').count();
        let replies: Vec<u8> = std::iter::repeat_n(reply(be::CLOSE_COMPLETE), closes).flatten().collect();
        s.recv(&[replies, reply(be::PARSE_COMPLETE), rfq(b'I')].concat());
    }
    assert_eq!(s.server.len(), 1, "max 0 left this client's bound at 1");
    assert_eq!(s.stage.q.binds, 0);
    s.sent(&[bind("select 4"), execute(), bind(""), execute(), sync()].concat());
    assert_eq!(s.stage.q.binds, 1, "a Bind of a named statement counts, an unnamed one does not");
    s.stage.publish_counts();
    assert_eq!((s.stage.metrics.binds(), s.stage.q.binds), (1, 0));
}

#[test]
fn deallocate_is_answered_by_weir() {
    let mut s = Sim::new(20);
    s.sent(&[parse("a", "select 1"), sync()].concat());
    s.recv(&[reply(be::PARSE_COMPLETE), rfq(b'T')].concat());
    let (sent, rest) = s.send(&query("DEALLOCATE a"));
    assert!(sent.is_empty() && rest.is_empty());
    let out = s.stage.synthetic().unwrap();
    assert_eq!(tags(&out.bytes), "CZ");
    assert_eq!(frames(&out.bytes)[1].1, b"T", "status of the open transaction");
    assert!(out.settled);
    assert!(s.stage.statements.is_empty());
    // In a failed transaction it fails, as in Postgres, and the statement stays.
    s.sent(&[parse("b", "select 2"), sync()].concat());
    s.recv(&[reply(be::PARSE_COMPLETE), rfq(b'E')].concat());
    s.send(&query("deallocate b;"));
    assert_eq!(tags(&s.synth()), "EZ");
    assert!(s.stage.statements.contains_key(&b"b"[..]));
}

#[test]
fn discard_all_makes_statements_uncertain_and_they_are_closed_before_reuse() {
    let mut s = Sim::new(20);
    s.sent(&[parse("a", "select 1"), sync()].concat());
    s.recv(&[reply(be::PARSE_COMPLETE), rfq(b'I')].concat());
    let weir = s.weir("a");
    assert_eq!(tags(&s.sent(&query("DISCARD ALL"))), "Q");
    s.recv(&[msg(be::COMMAND_COMPLETE, b"DISCARD ALL\0"), rfq(b'I')].concat());
    assert!(s.stage.statements.is_empty(), "the client's statements are gone, as in Postgres");
    assert!(s.server.is_uncertain(&weir));
    // The settings, read back, resolve names as before.
    s.stage.resolves_names_with(None);
    let sent = s.sent(&[parse("a", "select 1"), sync()].concat());
    assert_eq!(tags(&sent), "CPS");
    assert_eq!(tags(&s.recv(&[reply(be::CLOSE_COMPLETE), reply(be::PARSE_COMPLETE), rfq(b'I')].concat())), "1Z");
}

#[test]
fn discard_all_from_an_untracked_client_still_updates_the_server_cache() {
    let mut s = Sim::new(20);
    s.server.insert(Arc::from("weir_x"), 20);
    s.sent(&query("discard all"));
    assert!(s.server.is_uncertain("weir_x"));
    assert!(!s.stage.tracking);
}

#[test]
fn session_features_pin_and_session_set_is_noted_without_a_notice() {
    let mut s = Sim::new(20);
    s.sent(&query("SET search_path = x"));
    let seen = s.recv(&[msg(be::COMMAND_COMPLETE, b"SET\0"), rfq(b'I')].concat());
    assert_eq!(tags(&seen), "CZ", "the server's replies only");
    assert!(s.stage.take_settings_touched(), "read back when the lease ends");
    assert!(!s.stage.take_settings_touched());
    assert!(s.stage.pinned().is_none());
    s.sent(&query("LISTEN jobs"));
    assert_eq!(s.stage.pinned(), Some("LISTEN"));
    assert_eq!(s.stage.metrics.pinned(), 1);
    s.sent(&query("select pg_advisory_lock(1)"));
    assert_eq!(s.stage.metrics.pinned(), 1, "counted once per session");
}

#[test]
fn naming_starts_mid_pipeline_with_nothing_held_back() {
    let mut s = Sim::new(20);
    s.sent(&query("select 1"));
    let sent = s.sent(&[parse("a", "select 1"), sync()].concat());
    assert_eq!(tags(&sent), "PS", "nothing waits for the server's answer to the query");
    assert!(s.stage.tracking);
    let replies = [msg(be::COMMAND_COMPLETE, b"SELECT 1\0"), rfq(b'I'), reply(be::PARSE_COMPLETE), rfq(b'I')].concat();
    assert_eq!(tags(&s.recv(&replies)), "CZ1Z");
}

/// psycopg's auto-prepare in a pipeline: unnamed groups, then a named Parse
/// of the same text (already prepared on this server, so weir answers it)
/// and Binds on it, then Sync and Flush.
#[test]
fn a_named_parse_answered_by_weir_waits_behind_the_replies_owed_before_it() {
    let mut first = Sim::new(20);
    first.sent(&[parse("a", "select 42"), sync()].concat());
    first.recv(&[reply(be::PARSE_COMPLETE), rfq(b'I')].concat());
    let mut s = Sim::new(20);
    s.server = std::mem::take(&mut first.server);
    s.stage.begin(&mut s.server, &s.conv, 0);
    let group = [parse("", "select 42"), bind(""), execute()].concat();
    let named = [parse("_pg3_0", "select 42"), bind("_pg3_0"), execute(), bind("_pg3_0"), execute()].concat();
    let flush = msg(fe::FLUSH, b"");
    let sent = s.sent(&[group.clone(), group, named, sync(), flush].concat());
    assert_eq!(tags(&sent), "PBEPBEBEBESH", "all sent, the named Parse answered by weir");
    assert!(s.synth().is_empty(), "weir's ParseComplete waits for the replies owed before it");
    let done = msg(be::COMMAND_COMPLETE, b"SELECT 1\0");
    let g = [reply(be::PARSE_COMPLETE), reply(be::BIND_COMPLETE), done.clone()].concat();
    let b = [reply(be::BIND_COMPLETE), done].concat();
    let seen = s.recv(&[g.clone(), g, b.clone(), b, rfq(b'I')].concat());
    assert_eq!(tags(&seen), "12C12C12C2CZ", "Postgres's order");
}

#[test]
fn a_long_bind_has_its_head_rewritten_and_streams() {
    let mut s = Sim::new(20);
    s.sent(&[parse("a", "select $1::bytea"), sync()].concat());
    s.recv(&[reply(be::PARSE_COMPLETE), rfq(b'I')].concat());
    let weir = s.weir("a");
    let param = vec![7u8; STREAM_THRESHOLD * 2];
    let mut body = b"\0a\0\0\0\0\x01".to_vec();
    body.extend_from_slice(&(param.len() as i32).to_be_bytes());
    body.extend_from_slice(&param);
    body.extend_from_slice(b"\0\0");
    let big = msg(fe::BIND, &body);
    let (first, second) = big.split_at(STREAM_THRESHOLD + 100);
    let (sent1, rest) = s.send(first);
    assert!(rest.is_empty());
    let head = read_bind_head(&sent1).unwrap().unwrap();
    assert_eq!(head.statement, weir.as_bytes());
    let (sent2, _) = s.send(second);
    let whole = [sent1, sent2].concat();
    assert_eq!(tags(&whole), "B", "one well-formed message");
    assert_eq!(whole.len(), big.len() + weir.len() - 1);
    assert_eq!(&whole[whole.len() - param.len() - 2..whole.len() - 2], &param[..]);
}

#[test]
fn a_lease_ending_mid_batch_leaves_its_statements_uncertain() {
    let mut s = Sim::new(20);
    s.sent(&[parse("a", "select 1"), sync()].concat());
    let weir = s.weir("a");
    s.stage.end(&mut s.server);
    assert!(!s.server.contains(&weir) && s.server.is_uncertain(&weir));
}

#[test]
fn off_when_max_is_zero_or_in_session_mode() {
    let metrics = PoolMetrics::new("db", "u");
    let mut stage = ClientStatements::new(false, 200, metrics.clone());
    let batch = [parse("a", "listen x"), sync()].concat();
    let mut client_in = BytesMut::from(&batch[..]);
    let mut server = ServerStatements::default();
    assert_eq!(stage.outbound(&mut client_in, &Conversation::default(), &mut server, 1 << 20).unwrap(), batch.len());
    assert!(stage.pinned().is_none());
    let mut s = Sim::new(0);
    assert_eq!(s.sent(&batch), batch);
    assert_eq!(
        s.recv(&[reply(be::PARSE_COMPLETE), rfq(b'I')].concat()),
        [reply(be::PARSE_COMPLETE), rfq(b'I')].concat()
    );
    let _ = Bytes::new();
}

#[test]
fn malformed_messages_do_not_panic() {
    let mut s = Sim::new(20);
    s.sent(&[parse("a", "select 1"), sync()].concat());
    s.recv(&[reply(be::PARSE_COMPLETE), rfq(b'I')].concat());
    for bad in [
        msg(fe::PARSE, b"a\0select"),
        msg(fe::BIND, b"\0"),
        msg(fe::DESCRIBE, b""),
        msg(fe::CLOSE, b"S"),
        msg(fe::QUERY, b""),
    ] {
        let mut client_in = BytesMut::from(&[bad, sync()].concat()[..]);
        let _ = s.stage.outbound(&mut client_in, &s.conv, &mut s.server, 1 << 20);
    }
    // Replies the queue does not expect pass through.
    let odd = [reply(be::PARSE_COMPLETE), reply(be::CLOSE_COMPLETE), rfq(b'I'), rfq(b'I')].concat();
    let mut st = ClientStatements::new(true, 20, PoolMetrics::new("d", "u"));
    st.tracking = true;
    assert_eq!(&st.inbound(Bytes::from(odd.clone()), &mut s.server)[..], &odd[..]);
}

#[test]
fn syncs_ignored_during_an_extended_copy_are_not_expected() {
    let mut s = Sim::new(20);
    s.sent(&[parse("c", "copy t from stdin"), sync()].concat());
    s.recv(&[reply(be::PARSE_COMPLETE), rfq(b'I')].concat());
    s.sent(&[bind("c"), execute(), sync()].concat());
    let seen = s.recv(&[reply(be::BIND_COMPLETE), msg(be::COPY_IN_RESPONSE, b"\0\0\0")].concat());
    assert_eq!(tags(&seen), "2G");
    s.sent(&[msg(fe::COPY_DATA, b"1\n"), sync(), msg(fe::COPY_DONE, b""), sync()].concat());
    let seen = s.recv(&[msg(be::COMMAND_COMPLETE, b"COPY 1\0"), rfq(b'I')].concat());
    assert_eq!(tags(&seen), "CZ");
    assert!(s.stage.q.expect.is_empty(), "{:?}", s.stage.q.expect);
    assert!(s.conv.is_clean());
    // The queue is still aligned: a statement on a new server is prepared and
    // its ParseComplete swallowed.
    s.switch_server(ServerStatements::default());
    s.sent(&[bind("c"), execute(), sync()].concat());
    assert_eq!(tags(&s.recv(&[reply(be::PARSE_COMPLETE), reply(be::BIND_COMPLETE)].concat())), "2");
}
