//! What resolves names keys the shared statements, and the client's
//! unnamed statement follows Postgres where its state is not the last
//! ReadyForQuery's: behind an unanswered Sync, and after a failed Parse.

use super::*;

#[test]
fn a_search_path_of_its_own_or_a_set_gives_statements_of_the_clients_own() {
    let mut s = Sim::new(20);
    s.sent(&[parse("a", "select 1"), sync()].concat());
    s.recv(&[reply(be::PARSE_COMPLETE), rfq(b'I')].concat());
    let shared = s.weir("a");
    s.stage.resolves_names_with(Some("sa"));
    s.sent(&[parse("b", "select 1"), sync()].concat());
    s.recv(&[reply(be::PARSE_COMPLETE), rfq(b'I')].concat());
    let own = s.weir("b");
    assert_ne!(own, shared, "another search_path, another statement");
    s.sent(&query("set search_path = sb"));
    s.recv(&[msg(be::COMMAND_COMPLETE, b"SET\0"), rfq(b'I')].concat());
    s.sent(&[parse("c", "select 1"), sync()].concat());
    s.recv(&[reply(be::PARSE_COMPLETE), rfq(b'I')].concat());
    assert!(s.weir("c") != shared && s.weir("c") != own, "until the settings are read back, its own");
    s.stage.resolves_names_with(Some("sa"));
    s.sent(&[parse("d", "select 1"), sync()].concat());
    assert_eq!(s.weir("d"), own, "the same search_path shares again");
}

#[test]
fn a_held_unnamed_parse_behind_an_unanswered_sync_goes_to_the_server() {
    let mut s = Sim::new(20);
    s.stage.prepare_unnamed_after(1);
    s.sent(&[parse("", "select 1"), sync()].concat());
    s.recv(&[reply(be::PARSE_COMPLETE), rfq(b'T')].concat());
    // The server holds it: answered by weir.
    assert_eq!(tags(&s.sent(&[parse("", "select 1"), sync()].concat())), "S");
    assert_eq!(tags(&s.recv(&rfq(b'T'))), "1Z");
    // Behind a Sync not yet answered (an Execute that fails the
    // transaction), the server's own answer.
    let sent = s.sent(&[bind(""), execute(), sync(), parse("", "select 1"), sync()].concat());
    assert_eq!(tags(&sent), "BESPS");
    let f = frames(&sent);
    assert_eq!(read_parse(&f[3].1).unwrap().name, b"", "the client's own unnamed Parse");
    let from_server = [reply(be::BIND_COMPLETE), error(), rfq(b'E'), error(), rfq(b'E')].concat();
    assert_eq!(tags(&s.recv(&from_server)), "2EZEZ");
}

#[test]
fn a_parse_behind_a_sync_waits_for_the_outcome_of_a_statement_change_before_it() {
    let mut s = Sim::new(20);
    s.sent(&[parse("s1", "select 1"), sync()].concat());
    s.recv(&[reply(be::PARSE_COMPLETE), rfq(b'I')].concat());
    // The Close may be skipped: the Parse of its name after the Sync waits.
    let (sent, rest) =
        s.send(&[bind("x"), target(fe::CLOSE, b'S', "s1"), sync(), parse("s1", "select 2"), sync()].concat());
    assert_eq!(tags(&sent), "BS", "weir answers the Close; the Parse waits");
    assert_eq!(tags(&s.recv(&[error(), rfq(b'I')].concat())), "EZ", "the Close was skipped");
    // s1 is still the client's: the Parse gets the server's 42P05 for it.
    let sent = s.sent(&rest);
    assert_eq!(tags(&sent), "PS");
    assert_eq!(read_parse(&frames(&sent)[0].1).unwrap().name, s.weir("s1").as_bytes());
}

#[test]
fn after_a_failed_unnamed_parse_a_bind_gets_the_servers_26000() {
    let mut s = Sim::new(20);
    s.stage.prepare_unnamed_after(1);
    s.sent(&[parse("", "select 1"), sync()].concat());
    s.recv(&[error(), rfq(b'I')].concat());
    let sent = s.sent(&[bind(""), execute(), sync()].concat());
    assert_eq!(tags(&sent), "CBES", "the server's unnamed statement is closed first");
    let f = frames(&sent);
    assert_eq!(read_target(&f[0].1).unwrap(), (b'S', &b""[..]));
    assert_eq!(tags(&s.recv(&[reply(be::CLOSE_COMPLETE), error(), rfq(b'I')].concat())), "EZ");
    // A skipped unnamed Parse leaves the client's unnamed statement as it was.
    assert_eq!(tags(&s.sent(&[bind("x"), parse("", "select 2"), sync()].concat())), "BPS");
    assert_eq!(tags(&s.recv(&[error(), rfq(b'I')].concat())), "EZ");
    assert_eq!(tags(&s.sent(&[bind(""), sync()].concat())), "CBS");
    assert_eq!(tags(&s.recv(&[reply(be::CLOSE_COMPLETE), error(), rfq(b'I')].concat())), "EZ");
    // Parsed again (weir's statement closed first: its Parse failed in a
    // transaction that then ended in error), it is bound as weir's.
    let sent = s.sent(&[parse("", "select 1"), bind(""), sync()].concat());
    assert_eq!(tags(&sent), "CPBS");
    let f = frames(&sent);
    let weir = s.weir("");
    assert_eq!(read_bind_head(&msg(fe::BIND, &f[2].1)).unwrap().unwrap().statement, weir.as_bytes());
}

/// A held unnamed Parse is cut from the batch, and the Bind names weir's
/// statement: the same bytes whether the edited head fits where the Parse
/// was (a long text) or not (a short one), and the bytes of a message not
/// yet whole stay behind, as they came.
#[test]
fn a_held_unnamed_parse_is_cut_whether_or_not_the_edit_fits_in_its_place() {
    let mut s = Sim::new(20);
    s.stage.prepare_unnamed_after(1);
    let long = "select aid, bid, abalance, filler from pgbench_accounts where aid = $1";
    let partial = &execute()[..3];
    for text in [long, "select 1", long, "select 1"] {
        s.sent(&[parse("", text), bind(""), execute(), sync()].concat());
        let weir = s.weir("");
        let replies = [reply(be::BIND_COMPLETE), reply(be::COMMAND_COMPLETE), rfq(b'I')].concat();
        s.recv(&[&reply(be::PARSE_COMPLETE)[..], &replies].concat());
        let batch = [parse("", text), bind(""), execute(), sync(), partial.to_vec()].concat();
        let (sent, rest) = s.send(&batch);
        assert_eq!(sent, [bind(&weir), execute(), sync()].concat(), "{text}");
        assert_eq!(rest, partial, "{text}");
        assert_eq!(tags(&s.recv(&replies)), "12CZ", "{text}");
    }
}
