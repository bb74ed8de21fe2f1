//! Replication connections as the wire shows them, with no I/O: the
//! `replication` startup parameter (`database` for logical replication, a
//! boolean for physical), and `Boundaries`, which follows a byte stream's
//! message boundaries from the 5-byte headers alone, so that a relay that
//! forwards bytes untouched knows where it may end a stream or put a
//! message of its own.

use super::HEADER_LEN;

/// What a client's `replication` startup parameter asked for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Replication {
    /// No replication: an ordinary client.
    #[default]
    None,
    /// `replication=database`: a logical walsender connected to a database.
    Logical,
    /// `replication=true` (or any true boolean): a physical walsender.
    Physical,
}

impl Replication {
    /// Postgres's reading of the parameter: `database`, or a boolean as
    /// `parse_bool` takes it (`on`, `off`, `true`, `false`, `yes`, `no`, `1`,
    /// `0`, and unique prefixes of the words), in any case. None: invalid.
    pub fn parse(value: &str) -> Option<Replication> {
        let v = value.to_ascii_lowercase();
        if v == "database" {
            return Some(Replication::Logical);
        }
        let prefix_of = |word: &str, min: usize| v.len() >= min && word.starts_with(v.as_str());
        let truth = if prefix_of("true", 1) || prefix_of("yes", 1) || prefix_of("on", 2) || v == "1" {
            true
        } else if prefix_of("false", 1) || prefix_of("no", 1) || prefix_of("off", 2) || v == "0" {
            false
        } else {
            return None;
        };
        Some(if truth { Replication::Physical } else { Replication::None })
    }

    /// The value weir sends Postgres in the server connection's startup packet.
    pub fn startup_value(self) -> Option<&'static str> {
        match self {
            Replication::None => None,
            Replication::Logical => Some("database"),
            Replication::Physical => Some("true"),
        }
    }

    /// As SHOW CLIENTS and SHOW SERVERS name it (PgBouncer's words).
    pub fn as_label(self) -> &'static str {
        match self {
            Replication::None => "none",
            Replication::Logical => "logical",
            Replication::Physical => "physical",
        }
    }

    pub fn is_some(self) -> bool {
        self != Replication::None
    }
}

/// Where a byte stream of tagged messages stands: inside a message (how many
/// of its bytes are still to come), or between two. Fed the bytes in the
/// order they pass; reads only the headers, never a body.
#[derive(Debug, Clone, Default)]
pub struct Boundaries {
    /// Bytes of the current message's body still to come.
    body_left: usize,
    /// A header being read across chunks: its bytes so far.
    header: [u8; HEADER_LEN],
    header_len: usize,
    /// The tag of the last message whose header was read.
    last_tag: u8,
}

impl Boundaries {
    /// Follows `bytes` through the stream; returns false if a header holds a
    /// length below 4 (the stream is not the protocol, or is corrupt).
    pub fn feed(&mut self, mut bytes: &[u8]) -> bool {
        while !bytes.is_empty() {
            if self.body_left > 0 {
                let n = self.body_left.min(bytes.len());
                self.body_left -= n;
                bytes = &bytes[n..];
                continue;
            }
            let n = (HEADER_LEN - self.header_len).min(bytes.len());
            self.header[self.header_len..self.header_len + n].copy_from_slice(&bytes[..n]);
            self.header_len += n;
            bytes = &bytes[n..];
            if self.header_len == HEADER_LEN {
                let h = self.header;
                let len = i32::from_be_bytes([h[1], h[2], h[3], h[4]]);
                if len < 4 {
                    return false;
                }
                self.last_tag = h[0];
                self.body_left = len as usize - 4;
                self.header_len = 0;
            }
        }
        true
    }

    /// The bytes fed so far end exactly where a message ends.
    pub fn at_boundary(&self) -> bool {
        self.body_left == 0 && self.header_len == 0
    }

    /// How many of `next`'s bytes reach the end of the current message (0
    /// at a boundary), or None if `next` ends before it does.
    pub fn to_boundary(&self, next: &[u8]) -> Option<usize> {
        let mut probe = self.clone();
        if probe.at_boundary() {
            return Some(0);
        }
        // A header cut short: read the rest of it from `next` first.
        let mut used = 0;
        if probe.header_len > 0 {
            let n = HEADER_LEN - probe.header_len;
            if next.len() < n || !probe.feed(&next[..n]) {
                return None;
            }
            used = n;
        }
        let end = used + probe.body_left;
        (end <= next.len()).then_some(end)
    }

    /// The tag of the last message whose header has passed.
    pub fn last_tag(&self) -> u8 {
        self.last_tag
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parameter_as_postgres_reads_it() {
        for v in ["database", "DATABASE"] {
            assert_eq!(Replication::parse(v), Some(Replication::Logical), "{v}");
        }
        for v in ["true", "on", "yes", "1", "t", "y", "TRUE", "On"] {
            assert_eq!(Replication::parse(v), Some(Replication::Physical), "{v}");
        }
        for v in ["false", "off", "no", "0", "f", "n", "of"] {
            assert_eq!(Replication::parse(v), Some(Replication::None), "{v}");
        }
        for v in ["o", "2", "", "databases", "maybe"] {
            assert_eq!(Replication::parse(v), None, "{v:?}");
        }
        assert_eq!(Replication::Logical.startup_value(), Some("database"));
        assert_eq!(Replication::Physical.startup_value(), Some("true"));
        assert_eq!(Replication::None.as_label(), "none");
    }

    fn msg(tag: u8, body_len: usize) -> Vec<u8> {
        let mut m = vec![tag];
        m.extend_from_slice(&((body_len + 4) as i32).to_be_bytes());
        m.extend(std::iter::repeat_n(7u8, body_len));
        m
    }

    #[test]
    fn boundaries_follow_headers_across_any_split() {
        let mut stream = msg(b'd', 10);
        stream.extend(msg(b'Z', 1));
        stream.extend(msg(b'c', 0));
        for cut in 0..stream.len() {
            for cut2 in cut..stream.len() {
                let mut b = Boundaries::default();
                assert!(b.feed(&stream[..cut]));
                assert!(b.feed(&stream[cut..cut2]));
                assert!(b.feed(&stream[cut2..]));
                assert!(b.at_boundary());
                assert_eq!(b.last_tag(), b'c');
            }
        }
        let mut b = Boundaries::default();
        b.feed(&stream[..3]);
        assert!(!b.at_boundary());
        assert_eq!(b.to_boundary(&stream[3..]), Some(12), "the rest of the first message");
        assert_eq!(b.to_boundary(&stream[3..8]), None, "not enough bytes yet");
        b.feed(&stream[3..15]);
        assert!(b.at_boundary());
        assert_eq!(b.to_boundary(&[]), Some(0));
    }

    #[test]
    fn a_length_below_four_is_not_the_protocol() {
        let mut b = Boundaries::default();
        assert!(!b.feed(&[b'd', 0, 0, 0, 3]));
    }
}
