//! What waits for, or answers as, the outcome of what went before: a
//! Describe in a failed transaction of a statement the server lacks, a
//! DEALLOCATE behind replies the server has not flushed, an error naming a
//! statement a later batch closed.

use super::*;

fn described_no_rows() -> Vec<u8> {
    [msg(be::PARAMETER_DESCRIPTION, b"\0\x01\0\0\0\x17"), reply(be::NO_DATA)].concat()
}

#[test]
fn weir_describes_a_statement_that_may_return_no_rows_and_keeps_the_answer() {
    let mut s = Sim::new(20);
    let sent = s.sent(&[parse("ins", "insert into t values ($1)"), parse("sel", "select 1"), sync()].concat());
    assert_eq!(tags(&sent), "PDPS", "its own Describe after the insert's Parse only");
    let f = frames(&sent);
    assert_eq!(read_target(&f[1].1).unwrap(), (b'S', s.weir("ins").as_bytes()));
    let seen = s.recv(&[reply(be::PARSE_COMPLETE), described_no_rows(), reply(be::PARSE_COMPLETE), rfq(b'I')].concat());
    assert_eq!(tags(&seen), "11Z", "its answer is weir's, not passed on");
    // The client's own Describe right after its Parse: no Describe of weir's.
    let sent = s.sent(&[parse("ins2", "delete from t"), target(fe::DESCRIBE, b'S', "ins2"), sync()].concat());
    assert_eq!(tags(&sent), "PDS");
    let seen = s.recv(
        &[reply(be::PARSE_COMPLETE), msg(be::PARAMETER_DESCRIPTION, b"\0\0"), reply(be::NO_DATA), rfq(b'I')].concat(),
    );
    assert_eq!(tags(&seen), "1tnZ", "the client's Describe is answered as ever");

    // A failed transaction on a server without them: Postgres describes
    // what returns no rows; weir answers as it did.
    s.switch_server(ServerStatements::default());
    s.sent(&query("select 1/0"));
    s.recv(&[error(), rfq(b'E')].concat());
    let sent = s.sent(&[target(fe::DESCRIBE, b'S', "ins"), target(fe::DESCRIBE, b'S', "ins2"), sync()].concat());
    assert_eq!(tags(&sent), "S", "nothing for the server to prepare");
    let seen = s.recv(&rfq(b'E'));
    assert_eq!(tags(&seen), "tntnZ");
    assert_eq!(frames(&seen)[0].1, b"\0\x01\0\0\0\x17", "the parameters it was described with");
    // A statement that returns rows: weir's Parse gets Postgres's 25P02.
    let sent = s.sent(&[target(fe::DESCRIBE, b'S', "sel"), sync()].concat());
    assert_eq!(tags(&sent), "PDS");
}

#[test]
fn a_describe_that_needs_a_prepare_waits_while_the_transaction_may_be_failing() {
    let mut s = Sim::new(20);
    s.sent(&[parse("ins", "insert into t values ($1)"), sync()].concat());
    s.recv(&[reply(be::PARSE_COMPLETE), described_no_rows(), rfq(b'T')].concat());
    s.switch_server(ServerStatements::default());
    let (sent, rest) = s.send(&[query("select 1/0"), target(fe::DESCRIBE, b'S', "ins"), sync()].concat());
    assert_eq!(tags(&sent), "Q", "the Describe waits for the query's outcome");
    assert_eq!(tags(&s.recv(&[error(), rfq(b'E')].concat())), "EZ");
    assert_eq!(tags(&s.sent(&rest)), "S");
    assert_eq!(tags(&s.recv(&rfq(b'E'))), "tnZ");
}

#[test]
fn deallocate_behind_unflushed_replies_flushes_them_first() {
    let mut s = Sim::new(20);
    let sent = s.sent(&[parse("s1", "select 1"), query("deallocate s1")].concat());
    assert_eq!(tags(&sent), "PH", "the server flushes the ParseComplete");
    let seen = s.recv(&reply(be::PARSE_COMPLETE));
    assert_eq!(tags(&seen), "1CZ", "then weir's answer to the DEALLOCATE");
}

#[test]
fn an_error_names_the_statement_as_the_client_named_it_when_a_later_batch_closed_it() {
    let mut s = Sim::new(20);
    s.sent(&[parse("s1", "select $1::int"), sync()].concat());
    s.recv(&[reply(be::PARSE_COMPLETE), rfq(b'I')].concat());
    let weir = s.weir("s1");
    let sent = s.sent(&[bind("s1"), sync(), target(fe::CLOSE, b'S', "s1"), sync()].concat());
    assert_eq!(tags(&sent), "BSS");
    let text = format!("bind message supplies 0 parameters, but prepared statement \"{weir}\" requires 1");
    let err = msg(be::ERROR_RESPONSE, format!("SERROR\0C08P01\0M{text}\0\0").as_bytes());
    let seen = s.recv(&[err, rfq(b'I'), rfq(b'I')].concat());
    assert_eq!(tags(&seen), "EZ3Z");
    let body = String::from_utf8_lossy(&frames(&seen)[0].1).into_owned();
    assert!(body.contains("statement \"s1\" requires 1"), "{body}");
}

#[test]
fn an_error_names_the_unnamed_statement_a_later_query_dropped() {
    let mut s = Sim::new(20);
    s.stage.prepare_unnamed_after(1);
    s.sent(&[parse("", "select $1::int"), sync()].concat());
    s.recv(&[reply(be::PARSE_COMPLETE), rfq(b'T')].concat());
    let weir = s.weir("");
    // The Bind fails; the query behind its Sync drops the unnamed statement
    // before the error comes back.
    let sent = s.sent(&[bind(""), sync(), query("rollback")].concat());
    assert_eq!(tags(&sent), "BSQ");
    let text = format!("bind message supplies 0 parameters, but prepared statement \"{weir}\" requires 1");
    let err = msg(be::ERROR_RESPONSE, format!("SERROR\0C08P01\0M{text}\0\0").as_bytes());
    let seen = s.recv(&[err, rfq(b'E'), msg(be::COMMAND_COMPLETE, b"ROLLBACK\0"), rfq(b'I')].concat());
    assert_eq!(tags(&seen), "EZCZ");
    let body = String::from_utf8_lossy(&frames(&seen)[0].1).into_owned();
    assert!(body.contains("statement \"\" requires 1"), "{body}");
}

#[test]
fn past_a_sync_the_server_is_skipping_to_a_message_waits_for_what_it_skips_to_be_undone() {
    let mut s = Sim::new(20);
    s.sent(&[parse("a", "select 1"), sync()].concat());
    s.recv(&[reply(be::PARSE_COMPLETE), rfq(b'I')].concat());
    // An error with no Sync sent: the server skips to the next one.
    assert_eq!(tags(&s.sent(&[bind("x"), msg(fe::FLUSH, b"")].concat())), "BH");
    assert_eq!(tags(&s.recv(&error())), "E");
    // The Parse of b (the server holds its text) is skipped; the Bind
    // past the Sync names a statement the client does not hold.
    let (sent, rest) = s.send(&[parse("b", "select 1"), sync(), bind("b"), execute(), sync()].concat());
    assert_eq!(tags(&sent), "S", "no ParseComplete of weir's for a skipped Parse; the Bind waits");
    assert_eq!(tags(&s.recv(&rfq(b'I'))), "Z");
    let sent = s.sent(&rest);
    assert_eq!(tags(&sent), "BES");
    assert!(frames(&sent)[0].1.starts_with(b"\0b\0"), "the client's own name: Postgres answers 26000");
}
