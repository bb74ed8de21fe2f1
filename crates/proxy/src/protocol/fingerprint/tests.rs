use super::*;

fn norm(text: &str) -> String {
    normalized(text.as_bytes(), usize::MAX)
}

fn fp(text: &str) -> Fingerprint {
    fingerprint(text.as_bytes()).fingerprint
}

fn lead(text: &str) -> Lead {
    fingerprint(text.as_bytes()).lead
}

/// A fingerprint is the hash of the normal form, and never 0.
fn consistent(text: &[u8]) {
    let scan = fingerprint(text);
    assert_ne!(scan.fingerprint.0, 0);
    let n = normalized(text, usize::MAX);
    if std::str::from_utf8(text).is_ok() && text.len() < STATEMENT_LIMIT {
        assert_eq!(scan.fingerprint, hash_of(&n), "{:?} -> {n:?}", String::from_utf8_lossy(text));
    }
    let _ = bare_end(text);
}

#[test]
fn literals_become_placeholders() {
    for (text, want) in [
        ("SELECT 42", "select ?"),
        ("SELECT 3.14, .5, 1., 1e10, 2.5E-3, 1_000", "select ? , ? , ? , ? , ? , ?"),
        ("SELECT 0x1F, 0o17, 0b101", "select ? , ? , ?"),
        ("SELECT -5, x - 5, x-5, x = -5, x=-5, (-1.5)", "select ? , x - ? , x - ? , x = ? , x = ? , ( ? )"),
        ("SELECT a[1]-2, f(x)-3, $1-4, 'a'-5", "select a [ ? ] - ? , f ( x ) - ? , $1 - ? , ? - ?"),
        ("SELECT * WHERE -1 < x AND -2 > y LIMIT -3", "select * where ? < x and ? > y limit ?"),
        ("SELECT 'it''s', ''", "select ? , ?"),
        (r"SELECT E'it\'s', e'\\', E'a''b'", "select ? , ? , ?"),
        ("SELECT $$a'b$$, $tag$x $$ y$tag$, $a$b$a$", "select ? , ? , ?"),
        ("SELECT B'101', X'1F', N'n', U&'d\\0061t'", "select ? , ? , ? , ?"),
        ("SELECT true, FALSE, True", "select ? , ? , ?"),
        ("SELECT x::int, 'a' || 'b'", "select x :: int , ? || ?"),
    ] {
        assert_eq!(norm(text), want, "{text}");
        consistent(text.as_bytes());
    }
}

#[test]
fn case_and_spacing_do_not_matter() {
    let a = "SELECT abalance FROM pgbench_accounts WHERE aid = 48213;";
    let b = "select ABALANCE from PGBENCH_ACCOUNTS where AID=7";
    assert_eq!(fp(a), fp(b));
    assert_eq!(norm(a), "select abalance from pgbench_accounts where aid = ?");
    assert_ne!(fp(a), fp("SELECT abalance FROM pgbench_accounts WHERE bid = 1"));
}

#[test]
fn params_stay_as_written() {
    assert_eq!(norm("SELECT $1, $12"), "select $1 , $12");
    assert_ne!(fp("SELECT * FROM t WHERE id = $1"), fp("SELECT * FROM t WHERE id = 1"));
    assert_eq!(norm("SELECT x$1 FROM t"), "select x$1 from t");
}

#[test]
fn comments_and_whitespace_fold() {
    let text = "  /* lead */ SELECT\t1 -- one\n\r\n+ /* a /* nested */ b */ 2 ;  \n";
    assert_eq!(norm(text), "select ? + ?");
    assert_eq!(fp(text), fp("select 1+2"));
    assert_eq!(norm("SELECT 1--x\n"), "select ?");
    assert_eq!(norm("SELECT a+-- c\nb, a*/* c */b"), "select a + b , a * b");
    assert_eq!(norm("SELECT 1 /* unterminated"), "select ?");
}

#[test]
fn quoted_identifiers_keep_case() {
    assert_eq!(norm(r#"SELECT "Foo", "a""b", U&"x" FROM "T""#), r#"select "Foo" , "a""b" , U&"x" from "T""#);
    assert_ne!(fp(r#"SELECT "Foo""#), fp(r#"SELECT "foo""#));
    assert_eq!(fp(r#"SELECT Foo"#), fp(r#"SELECT foo"#));
}

#[test]
fn literal_lists_fold() {
    assert_eq!(norm("SELECT * FROM t WHERE id IN (1, 2, 3)"), "select * from t where id in ( ? )");
    assert_eq!(fp("SELECT 1 WHERE x IN (1)"), fp("SELECT 1 WHERE x IN ('a', -2, 3.5, $$z$$)"));
    assert_eq!(norm("VALUES ((1, 2)), (3, x), (4,), ()"), "values ( ( ? ) ) , ( ? , x ) , ( ? , ) , ( )");
    assert_eq!(norm("SELECT f(1, $1), g(1"), "select f ( ? , $1 ) , g ( ?");
}

#[test]
fn boilerplate_is_skipped() {
    let update = "UPDATE t SET x = 1 WHERE id = 2";
    let scan = fingerprint(b"BEGIN; UPDATE t SET x = 1 WHERE id = 2; COMMIT");
    assert_eq!(scan, Scan { fingerprint: fp(update), lead: Lead::Statement });
    assert_eq!(normalized(b"BEGIN; UPDATE t SET x = 1 WHERE id = 2; COMMIT", 100), norm(update));
    assert_eq!(fingerprint(b"SET LOCAL x = 1; SELECT 1").fingerprint, fp("SELECT 1"));
    let many = "START TRANSACTION READ ONLY;SAVEPOINT a; RELEASE SAVEPOINT a;; SET x=1; SELECT 1";
    assert_eq!(fingerprint(many.as_bytes()), Scan { fingerprint: fp("select 1"), lead: Lead::Statement });
    assert_eq!(fp("CREATE FUNCTION f() AS $$ BEGIN; SET x; $$; SELECT 2"), fp("create function f ( ) as 'x'"));
    assert_eq!(fp("CREATE RULE r AS ON x DO (SET a; SET b); SELECT 1"), fp("create rule r as on x do (set a; set b)"));
}

#[test]
fn leads() {
    for text in ["BEGIN", "begin;", " BEGIN WORK ; ", "begin transaction", "START TRANSACTION", "/*x*/ begin;;"] {
        assert_eq!(lead(text), Lead::BareBegin, "{text}");
    }
    for text in [
        "BEGIN ISOLATION LEVEL SERIALIZABLE",
        "BEGIN; BEGIN",
        "BEGIN; SET x = 1",
        "SET x = 1",
        "SAVEPOINT a",
        "release a",
        "START TRANSACTION READ ONLY",
        "SET application_name = 'x'; BEGIN",
    ] {
        assert_eq!(lead(text), Lead::Boilerplate, "{text}");
    }
    for text in ["", " ; ", "SELECT 1", "START", "BEGIN; SELECT 1", "\"begin\"", "COMMIT"] {
        assert_eq!(lead(text), Lead::Statement, "{text}");
    }
    assert_eq!(fp("BEGIN ISOLATION LEVEL SERIALIZABLE; SET x = 1"), fp("begin isolation level serializable"));
    assert_eq!(fp("BEGIN; BEGIN"), fp("begin"));
    assert_eq!(fp(""), hash_of(""));
    assert_eq!(fp("SELECT 1\0; garbage '"), fp("SELECT 1"));
    assert_eq!(lead("BEGIN\0; SELECT 1"), Lead::BareBegin);
}

#[test]
fn bare_ends() {
    for (text, want) in [
        ("COMMIT", Some("COMMIT")),
        (" commit work ;; ", Some("COMMIT")),
        ("END TRANSACTION", Some("COMMIT")),
        ("end", Some("COMMIT")),
        ("ROLLBACK", Some("ROLLBACK")),
        ("-- x\nabort /* y */;", Some("ROLLBACK")),
        ("rollback transaction;", Some("ROLLBACK")),
        ("ROLLBACK\0 AND CHAIN", Some("ROLLBACK")),
        ("ROLLBACK TO SAVEPOINT a", None),
        ("COMMIT AND CHAIN", None),
        ("COMMIT PREPARED 'x'", None),
        ("COMMIT; COMMIT", None),
        ("COMMIT WORK WORK", None),
        ("\"commit\"", None),
        ("SELECT 1", None),
        ("", None),
    ] {
        assert_eq!(bare_end(text.as_bytes()), want, "{text}");
    }
    let mut long = b"COMMIT".to_vec();
    long.resize(STATEMENT_LIMIT + 10, b';');
    assert_eq!(bare_end(&long), None);
}

#[test]
fn normalized_is_cut_at_max() {
    assert_eq!(normalized(b"SELECT abc FROM t", 10), "select abc");
    assert_eq!(normalized("SELECT é".as_bytes(), 8), "select ");
    assert_eq!(normalized("SELECT é".as_bytes(), 9), "select é");
    assert_eq!(normalized(b"SELECT 1", 0), "");
    assert_eq!(normalized(b"SELECT \xff", 100), "select \u{fffd}");
}

#[test]
fn statements_are_looked_at_up_to_the_limit() {
    let mut long = b"SELECT ".to_vec();
    long.resize(STATEMENT_LIMIT - 4, b'x');
    let mut a = long.clone();
    a.extend_from_slice(b", 1, 2, 3");
    let mut b = long.clone();
    b.extend_from_slice(b", 4, 5, 6, 7, 8");
    assert_eq!(fingerprint(&a), fingerprint(&b));
    let mut set = b"SET x = '".to_vec();
    set.resize(STATEMENT_LIMIT + 10, b'y');
    set.extend_from_slice(b"'; SELECT 1");
    assert_eq!(fingerprint(&set).lead, Lead::Boilerplate);
    let sets = "SET x = 1;".repeat(1000) + "SELECT 1";
    assert_eq!(fingerprint(sets.as_bytes()).fingerprint, fp("SELECT 1"));
}

#[test]
fn hash_matches_normalized_text() {
    for text in [
        "SELECT * FROM t WHERE a = 'x' AND b IN (1,2) -- c",
        "INSERT INTO t (a, b) VALUES ($1, $2) RETURNING id;",
        "UPDATE \"T\" SET v = v + 1.5e3 WHERE k = E'\\n' OR k = $q$x$q$",
        "with x as (select 1) select * from x order by 1 desc",
        "SELECT '\u{263a}' AS smile, ünïcode FROM täble",
        "BEGIN; SET x TO 1; COMMIT",
        "SELECT 1 /* unterminated",
        "SELECT 'unterminated",
        "SELECT $tag$ unterminated",
    ] {
        consistent(text.as_bytes());
    }
}

#[test]
fn any_bytes_are_taken() {
    for a in 0..=255u8 {
        for b in 0..=255u8 {
            consistent(&[a, b]);
        }
    }
    let alphabet = b" \n-/*'\"$;(),.:e1xEuU&\\0a\0\xc3+=";
    for &a in alphabet {
        for &b in alphabet {
            for &c in alphabet {
                for &d in alphabet {
                    consistent(&[a, b, c, d]);
                }
            }
        }
    }
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for _ in 0..20_000 {
        let len = (next() % 64) as usize;
        let text: Vec<u8> = (0..len).map(|_| alphabet[(next() % alphabet.len() as u64) as usize]).collect();
        consistent(&text);
        let raw: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        consistent(&raw);
    }
}

#[test]
fn hex_is_16_digits() {
    assert_eq!(Fingerprint(0xab).hex(), "00000000000000ab");
    assert_eq!(fp("SELECT 1").hex().len(), 16);
}

#[test]
#[ignore = "micro-benchmark: run with -O and --ignored --nocapture"]
fn bench_fingerprint() {
    let text = std::hint::black_box(b"SELECT abalance FROM pgbench_accounts WHERE aid = 48213;");
    let rounds = 2_000_000u32;
    let start = std::time::Instant::now();
    for _ in 0..rounds {
        std::hint::black_box(fingerprint(std::hint::black_box(text)));
    }
    let ns = start.elapsed().as_nanos() / u128::from(rounds);
    println!("fingerprint: {ns} ns/call");
}
