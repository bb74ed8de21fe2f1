//! Server errors about named statements (a name already held, missing on
//! this server, a failed or rolled-back transaction) and the statement
//! generations that stale-statement errors and DDL start.

use super::*;

fn error_with(code: &str, message: &str) -> Vec<u8> {
    msg(be::ERROR_RESPONSE, format!("SERROR\0C{code}\0M{message}\0\0").as_bytes())
}

/// The SQLSTATE and message text of an ErrorResponse frame body.
fn error_of(body: &[u8]) -> (String, String) {
    let f = crate::protocol::messages::parse_error_fields(body).unwrap();
    (f.code.clone(), f.message_text())
}

#[test]
fn parse_of_a_held_name_gets_the_servers_42p05_under_the_clients_name() {
    let mut s = Sim::new(20);
    s.sent(&[parse("s1", "select 1"), sync()].concat());
    s.recv(&[reply(be::PARSE_COMPLETE), rfq(b'I')].concat());
    let held = s.weir("s1");
    let sent = s.sent(&[parse("s1", "select 2"), bind("s1"), execute(), sync()].concat());
    assert_eq!(tags(&sent), "PBES");
    let p = &frames(&sent)[0].1;
    let p = read_parse(p).unwrap();
    assert_eq!((p.name, p.query), (held.as_bytes(), &b"select 2"[..]), "checked by the server, under the held name");
    let from_server = error_with("42P05", &format!("prepared statement \"{held}\" already exists"));
    let seen = s.recv(&[from_server, rfq(b'I')].concat());
    assert_eq!(tags(&seen), "EZ");
    let (code, text) = error_of(&frames(&seen)[0].1);
    assert_eq!((code.as_str(), text.as_str()), ("42P05", "prepared statement \"s1\" already exists"));
    assert_eq!(s.weir("s1"), held, "the client keeps its statement");
    // Close, then Parse: a new statement, as in Postgres.
    s.sent(&[target(fe::CLOSE, b'S', "s1"), sync()].concat());
    s.recv(&rfq(b'I'));
    let sent = s.sent(&[parse("s1", "select 2"), sync()].concat());
    assert_eq!(tags(&sent), "PS");
    assert_ne!(s.weir("s1"), held);
}

#[test]
fn parse_of_a_held_name_missing_on_this_server_meets_a_stand_in() {
    let mut s = Sim::new(20);
    s.sent(&[parse("s1", "select 1"), sync()].concat());
    s.recv(&[reply(be::PARSE_COMPLETE), rfq(b'I')].concat());
    let weir = s.weir("s1");
    s.switch_server(ServerStatements::default());
    // An empty statement under its name (it parses even in a failed
    // transaction), then the duplicate, which the server checks and refuses.
    let sent = s.sent(&[parse("s1", "select 1"), sync()].concat());
    assert_eq!(tags(&sent), "CPPS");
    let f = frames(&sent);
    let stand_in = read_parse(&f[1].1).unwrap();
    assert_eq!((stand_in.name, stand_in.query), (weir.as_bytes(), &b""[..]));
    let from_server = error_with("42P05", &format!("prepared statement \"{weir}\" already exists"));
    let seen = s.recv(&[reply(be::CLOSE_COMPLETE), reply(be::PARSE_COMPLETE), from_server, rfq(b'E')].concat());
    assert_eq!(tags(&seen), "EZ");
    assert_eq!(error_of(&frames(&seen)[0].1).1, "prepared statement \"s1\" already exists");
    // The stand-in is closed before the statement is prepared for real.
    s.sent(&query("rollback"));
    s.recv(&[msg(be::COMMAND_COMPLETE, b"ROLLBACK\0"), rfq(b'I')].concat());
    assert_eq!(tags(&s.sent(&[bind("s1"), execute(), sync()].concat())), "CPBES");
}

#[test]
fn parse_in_a_failed_transaction_gets_the_servers_answer() {
    let mut s = Sim::new(20);
    s.sent(&[parse("a", "select 1"), sync()].concat());
    s.recv(&[reply(be::PARSE_COMPLETE), rfq(b'E')].concat());
    let weir = s.weir("a");
    let sent = s.sent(&[parse("b", "select 1"), sync()].concat());
    assert_eq!(tags(&sent), "CPS", "not answered by weir");
    let f = frames(&sent);
    assert_eq!(read_target(&f[0].1).unwrap(), (b'S', weir.as_bytes()));
    assert_eq!(
        read_parse(&f[1].1).unwrap().name,
        weir.as_bytes(),
        "weir's statement, parsed again, not the unnamed one"
    );
    let seen =
        s.recv(&[reply(be::CLOSE_COMPLETE), error_with("25P02", "current transaction is aborted"), rfq(b'E')].concat());
    assert_eq!(tags(&seen), "EZ");
    assert!(!s.stage.statements.contains_key(&b"b"[..]));
    assert!(!s.server.contains(&weir), "closed on the server");
}

#[test]
fn a_statement_prepared_in_a_rolled_back_transaction_is_closed_before_reuse() {
    for (end, kept) in [("COMMIT", true), ("ROLLBACK", false)] {
        let mut s = Sim::new(20);
        s.sent(&query("begin; create type t as enum ('x'); savepoint p"));
        s.recv(&[msg(be::COMMAND_COMPLETE, b"BEGIN\0"), rfq(b'T')].concat());
        s.sent(&[parse("s", "select $1::t"), sync()].concat());
        s.recv(&[reply(be::PARSE_COMPLETE), rfq(b'T')].concat());
        let weir = s.weir("s");
        assert!(s.server.contains(&weir));
        s.sent(&query(&end.to_lowercase()));
        s.recv(&[msg(be::COMMAND_COMPLETE, format!("{end}\0").as_bytes()), rfq(b'I')].concat());
        assert_eq!(s.server.contains(&weir), kept, "{end}");
        assert_eq!(s.server.is_uncertain(&weir), !kept, "{end}");
        let mut other = Sim::new(20);
        other.server = std::mem::take(&mut s.server);
        other.stage.begin(&mut other.server, &other.conv, 0);
        let sent = other.sent(&[parse("s", "select $1::t"), sync()].concat());
        assert_eq!(tags(&sent), if kept { "S" } else { "CPS" }, "{end}: closed and prepared afresh");
    }
}

#[test]
fn a_lease_ending_mid_transaction_leaves_its_statements_uncertain() {
    let mut s = Sim::new(20);
    s.sent(&query("begin"));
    s.recv(&[msg(be::COMMAND_COMPLETE, b"BEGIN\0"), rfq(b'T')].concat());
    s.sent(&[parse("s", "select 1"), sync()].concat());
    s.recv(&[reply(be::PARSE_COMPLETE), rfq(b'T')].concat());
    let weir = s.weir("s");
    let old = s.switch_server(ServerStatements::default());
    assert!(old.is_uncertain(&weir));
}

#[test]
fn a_stale_statement_error_starts_a_new_generation_for_new_parses() {
    let mut s = Sim::new(20);
    s.sent(&[parse("s", "select $1::t"), sync()].concat());
    s.recv(&[reply(be::PARSE_COMPLETE), rfq(b'I')].concat());
    let weir = s.weir("s");
    s.sent(&[bind("s"), execute(), sync()].concat());
    let seen = s.recv(&[error_with("XX000", "cache lookup failed for type 16385"), rfq(b'I')].concat());
    assert_eq!(tags(&seen), "EZ", "the client gets the error, as from its own backend");
    // The statement it holds keeps its server-side plan, as a backend's would.
    let sent = s.sent(&[bind("s"), execute(), sync()].concat());
    assert_eq!(tags(&sent), "BES", "still the same statement: {weir}");
    s.recv(&[error_with("XX000", "cache lookup failed for type 16385"), rfq(b'I')].concat());
    // Prepared again (what a driver does after the error): a statement of its own.
    s.sent(&[target(fe::CLOSE, b'S', "s"), parse("s", "select $1::t"), sync()].concat());
    s.recv(&[reply(be::PARSE_COMPLETE), rfq(b'I')].concat());
    assert_ne!(s.weir("s"), weir, "a Parse after the error never maps to the stale statement");
    let sent = s.sent(&[bind("s"), execute(), sync()].concat());
    assert_eq!(tags(&sent), "BES");
}

#[test]
fn errors_on_the_clients_own_names_start_no_new_generation() {
    let mut s = Sim::new(20);
    s.sent(&[parse("s", "select 1"), sync()].concat());
    s.recv(&[reply(be::PARSE_COMPLETE), rfq(b'I')].concat());
    let epoch = s.stage.metrics.statements_epoch();
    s.sent(&[bind("unknown"), execute(), sync()].concat());
    s.recv(&[error_with("26000", "prepared statement \"unknown\" does not exist"), rfq(b'I')].concat());
    assert_eq!(s.stage.metrics.statements_epoch(), epoch);
    assert!(s.server.contains(&s.weir("s")));
}

#[test]
fn ddl_starts_a_new_generation() {
    let mut s = Sim::new(20);
    s.sent(&[parse("s", "select 1"), sync()].concat());
    s.recv(&[reply(be::PARSE_COMPLETE), rfq(b'I')].concat());
    let epoch = s.stage.metrics.statements_epoch();
    s.sent(&query("ALTER TABLE t ALTER COLUMN a TYPE text"));
    s.recv(&[msg(be::COMMAND_COMPLETE, b"ALTER TABLE\0"), rfq(b'I')].concat());
    assert!(s.stage.metrics.statements_epoch() > epoch);
    // The held statement stays (Postgres revalidates its plan: a changed
    // result type is its 0A000); a new Parse of the text gets its own.
    let held = s.weir("s");
    assert!(s.server.contains(&held) && !s.server.is_uncertain(&held));
    s.sent(&[parse("t", "select 1"), sync()].concat());
    assert_ne!(s.weir("t"), held);
}

#[test]
fn an_error_on_a_bind_names_the_clients_statement_closed_after_it() {
    let mut s = Sim::new(20);
    s.sent(&[parse("s1", "select 1"), sync()].concat());
    s.recv(&[reply(be::PARSE_COMPLETE), rfq(b'I')].concat());
    let held = s.weir("s1");
    let sent = s.sent(&[bind("s1"), target(fe::CLOSE, b'S', "s1"), sync()].concat());
    assert_eq!(tags(&sent), "BS", "the Close is answered by weir");
    let text = format!("bind message supplies 1 parameters, but prepared statement \"{held}\" requires 0");
    let seen = s.recv(&[error_with("08P01", &text), rfq(b'I')].concat());
    assert_eq!(tags(&seen), "EZ", "the skipped Close gets no reply");
    let (code, text) = error_of(&frames(&seen)[0].1);
    let want = "bind message supplies 1 parameters, but prepared statement \"s1\" requires 0";
    assert_eq!((code.as_str(), text.as_str()), ("08P01", want));
    assert_eq!(s.weir("s1"), held, "the skipped Close leaves the statement");
}

/// A Bind of `stmt` with one parameter value.
fn bind_one(stmt: &str) -> Vec<u8> {
    msg(fe::BIND, &[b"\0", stmt.as_bytes(), b"\0\0\0\0\x01\0\0\0\x017\0\0"].concat())
}

#[test]
fn a_bind_postgres_refuses_for_its_count_gets_that_not_the_25p02_of_weirs_parse() {
    let mut s = Sim::new(20);
    s.sent(&[parse("s1", "select 1"), parse("s2", "select $1::int"), sync()].concat());
    s.recv(&[reply(be::PARSE_COMPLETE), reply(be::PARSE_COMPLETE), rfq(b'T')].concat());
    s.switch_server(ServerStatements::default());
    let aborted = || [error_with("25P02", "current transaction is aborted"), rfq(b'E')].concat();
    // The transaction failed before the Bind: the server refuses weir's Parse.
    let sent = s.sent(&[bind_one("s1"), execute(), sync()].concat());
    assert_eq!(tags(&sent), "PBES", "prepared first on this server");
    let seen = s.recv(&aborted());
    assert_eq!(tags(&seen), "EZ");
    let (code, text) = error_of(&frames(&seen)[0].1);
    let want = "bind message supplies 1 parameters, but prepared statement \"s1\" requires 0";
    assert_eq!((code.as_str(), text.as_str()), ("08P01", want), "Postgres checks the count first");
    // The right count: Postgres's own 25P02.
    s.sent(&[bind("s1"), execute(), sync()].concat());
    let seen = s.recv(&aborted());
    assert_eq!(error_of(&frames(&seen)[0].1).0, "25P02");
    // A text with a `$`: the count of the highest `$n`.
    s.sent(&[bind("s2"), execute(), sync()].concat());
    let seen = s.recv(&aborted());
    let want = "bind message supplies 0 parameters, but prepared statement \"s2\" requires 1";
    assert_eq!(error_of(&frames(&seen)[0].1), ("08P01".to_owned(), want.to_owned()));
    assert!(s.stage.statements.contains_key(&b"s1"[..]) && s.server.is_empty());
}
