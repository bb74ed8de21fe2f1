//! `same_shape`: a cheap test that two query texts have one fingerprint
//! without lexing the second, for a session whose queries differ only in
//! their numbers (`WHERE aid = 48213`, then `WHERE aid = 7`). It compares
//! eight bytes at a time and, where the texts differ, skips a run of digits
//! that starts a token in both (a number: not part of a word, a parameter
//! `$1`, a quoted identifier or a dollar quote's tag). Anything else that
//! differs answers false, which says nothing: the caller lexes.

/// True when `a` and `b` differ at most in runs of digits that start a
/// token in both, so that `fingerprint` gives them the same answer.
pub fn same_shape(a: &[u8], b: &[u8]) -> bool {
    let (mut i, mut j) = (0, 0);
    loop {
        let n = common_prefix(&a[i..], &b[j..]);
        i += n;
        j += n;
        if i == a.len() && j == b.len() {
            return true;
        }
        // They differ inside a run of digits (on one side at least), or
        // not in a number at all.
        let digit_at = |s: &[u8], k: usize| s.get(k).is_some_and(u8::is_ascii_digit);
        if !digit_at(a, i) && !digit_at(b, j) {
            return false;
        }
        // Back to the start of the run, which both texts share.
        while i > 0 && a[i - 1].is_ascii_digit() {
            i -= 1;
            j -= 1;
        }
        if !digit_at(a, i) || !digit_at(b, j) || (i > 0 && in_word(a[i - 1])) {
            return false;
        }
        i += digits(&a[i..]);
        j += digits(&b[j..]);
    }
}

/// A byte a number glued to it would belong to: a word's, a parameter's,
/// a quoted identifier's or a dollar quote tag's, or a number's own `.`
/// and exponent are not among them (a decimal's digits after `.` start a
/// run the same way in both texts).
fn in_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b == b'"' || b >= 0x80
}

fn digits(s: &[u8]) -> usize {
    s.iter().position(|b| !b.is_ascii_digit()).unwrap_or(s.len())
}

/// The length of the common prefix, eight bytes at a time.
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let word = |c: &[u8]| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]));
    let mut n = 0;
    for (x, y) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
        let diff = word(x) ^ word(y);
        if diff != 0 {
            return n + (diff.trailing_zeros() / 8) as usize;
        }
        n += 8;
    }
    n + a[n..].iter().zip(&b[n..]).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::super::fingerprint;
    use super::same_shape;

    #[test]
    fn numbers_that_start_a_token_are_skipped() {
        let same = [
            (
                "SELECT abalance FROM pgbench_accounts WHERE aid = 48213;",
                "SELECT abalance FROM pgbench_accounts WHERE aid = 7;",
            ),
            ("select 1.5, 2", "select 33.75, 4"),
            ("select x from t where a in (1, 2) and b = 3", "select x from t where a in (10, 20) and b = 99999999"),
            ("select 12345678901234567890", "select 1"),
            ("select '2024-01-01'::date", "select '1999-12-31'::date"),
        ];
        for (a, b) in same {
            assert!(same_shape(a.as_bytes(), b.as_bytes()), "{a} / {b}");
            assert_eq!(fingerprint(a.as_bytes()), fingerprint(b.as_bytes()), "{a} / {b}");
        }
    }

    #[test]
    fn anything_else_that_differs_is_not_the_same_shape() {
        let differ = [
            ("select * from t1", "select * from t2"),
            ("select $1", "select $2"),
            ("select \"1x\"", "select \"2x\""),
            ("select $t1$a$t1$", "select $t2$a$t2$"),
            ("select 1", "select 1 "),
            ("select 1", "select -1"),
            ("select 1 from a", "select 1 from b"),
            ("select x1 + 1", "select x2 + 1"),
            ("", "1"),
        ];
        for (a, b) in differ {
            assert!(!same_shape(a.as_bytes(), b.as_bytes()), "{a} / {b}");
        }
        assert!(same_shape(b"", b""));
        assert!(same_shape(b"select 1", b"select 1"));
    }
}
