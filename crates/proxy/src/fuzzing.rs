//! Entry points for fuzzing weir's parsers. Each takes arbitrary bytes, runs
//! one parser or state machine over them, and checks what must hold for any
//! input: no panic, no slice past the input, lengths that add up, limits
//! kept. The cargo-fuzz targets in `crates/proxy/fuzz` call these; so do the
//! randomized tests below (mutated seed-corpus inputs), so the normal test
//! run exercises every parser with hostile bytes even without cargo-fuzz.

use std::net::IpAddr;

use bytes::BytesMut;

use crate::auth::hba::Hba;
use crate::auth::{ScramSecret, ScramServer, Secret, UserList};
use crate::protocol::startup::{self, StartupPacket, MAX_STARTUP_PACKET_LEN};
use crate::protocol::{decode_frame, extended, frame::read_cstr, messages, scan_frames, HEADER_LEN};
use crate::server::Conversation;

/// One fuzz target: any bytes in, a panic when an invariant breaks.
pub type Target = fn(&[u8]);

/// The targets by name, as in `crates/proxy/fuzz/Cargo.toml`.
pub const TARGETS: &[(&str, Target)] = &[
    ("frame", frame),
    ("startup", startup),
    ("conversation", conversation),
    ("userlist", userlist),
    ("scram", scram),
    ("error_fields", error_fields),
    ("hba", hba),
];

/// The frame decoder. The first byte picks a small message-size limit, so
/// "too long" is reached as often as "whole" and "partial".
pub fn frame(data: &[u8]) {
    let Some((&limit, data)) = data.split_first() else { return };
    let max = 4 + usize::from(limit) * 16;
    let mut visited = 0;
    let scanned = scan_frames(data, max, |tag, f| {
        assert_eq!(f.first(), Some(&tag));
        assert!(f.len() >= HEADER_LEN && f.len() - 1 <= max);
        visited += f.len();
        true
    });
    if let Ok(n) = scanned {
        assert_eq!(n, visited);
    }
    let mut buf = BytesMut::from(data);
    let mut consumed = 0;
    while let Ok(Some(f)) = decode_frame(&mut buf, max) {
        assert_eq!(f.body().len() + HEADER_LEN, f.bytes.len());
        consumed += f.bytes.len();
    }
    assert_eq!(consumed + buf.len(), data.len(), "decode_frame loses no byte");
    let mut rest = data;
    while read_cstr(&mut rest).is_ok() {}
}

/// The untagged startup packet: its length and its parse.
pub fn startup(data: &[u8]) {
    if let Ok(Some(len)) = startup::peek_len(data) {
        assert!((8..=MAX_STARTUP_PACKET_LEN).contains(&len));
    }
    if let Ok(StartupPacket::Startup { params, .. }) = startup::parse(data) {
        assert!(params.iter().all(|(k, _)| !k.is_empty()));
    }
}

/// Client and server bytes interleaved through one `Conversation`, in chunks
/// of a size the first byte picks, as the forwarding loop feeds them.
pub fn conversation(data: &[u8]) {
    let Some((&step, data)) = data.split_first() else { return };
    let step = usize::from(step % 64) + 1;
    let mut conv = Conversation::default();
    let (mut to_server, mut from_server) = (Vec::new(), Vec::new());
    for (i, chunk) in data.chunks(step).enumerate() {
        if i % 2 == 0 {
            to_server.extend_from_slice(chunk);
            match conv.scan_client(&to_server, 1 << 16) {
                Ok(out) if out.terminate => to_server.clear(),
                Ok(out) => drop(to_server.drain(..out.forward)),
                Err(_) => to_server.clear(),
            }
        } else {
            from_server.extend_from_slice(chunk);
            match conv.scan_server(&from_server, |_, _| {}) {
                Ok(scanned) => drop(from_server.drain(..scanned.forward)),
                Err(_) => from_server.clear(),
            }
        }
        let _ = (conv.is_clean(), conv.is_quiet(), conv.query_in_flight());
    }
}

/// The auth_file and its secrets.
pub fn userlist(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(users) = UserList::parse(text) {
        assert!(users.len() <= text.lines().count());
    }
    for line in text.lines() {
        let _ = Secret::parse(line);
        let _ = ScramSecret::parse(line);
    }
}

/// The SCRAM server: a client-first and a client-final split at the first
/// NUL, and the whole input as a client-final after a valid client-first.
pub fn scram(data: &[u8]) {
    let secret = || ScramSecret::from_password_with("pw", b"fuzz-salt".to_vec(), 1);
    let at = data.iter().position(|&b| b == 0).unwrap_or(data.len());
    let (first, last) = (&data[..at], data.get(at + 1..).unwrap_or_default());
    let mut s = ScramServer::new(secret());
    if let Ok(server_first) = s.handle_client_first(first) {
        assert!(server_first.starts_with("r="));
        let _ = s.handle_client_final(last);
    }
    let mut s = ScramServer::new(secret());
    s.handle_client_first(b"n,,n=,r=fuzz").expect("a valid client-first");
    assert!(s.handle_client_final(data).is_err(), "no input proves the password without the server nonce");
}

/// ErrorResponse fields, ParameterStatus, and the extended-protocol readers.
pub fn error_fields(data: &[u8]) {
    let _ = messages::parse_error_fields(data);
    let _ = messages::parse_parameter_status(data);
    let _ = messages::error_is_fatal(data);
    let _ = extended::parse_name(data);
    let _ = extended::read_parse(data);
    let _ = extended::read_target(data);
    if let Ok(Some(head)) = extended::read_bind_head(data) {
        assert!(head.rest_at <= data.len());
    }
}

/// The auth_hba_file parser and matcher.
pub fn hba(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(hba) = Hba::parse(text) else { return };
    for peer in ["127.0.0.1", "10.1.2.3", "::1", "::ffff:10.0.0.1"] {
        let _ = hba.method(peer.parse::<IpAddr>().expect("static address"), "app", "alice");
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// Mutated inputs per target in a normal test run.
    const ROUNDS: usize = 10_000;

    fn seeds(target: &str) -> Vec<Vec<u8>> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus").join(target);
        let mut seeds: Vec<Vec<u8>> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("seed corpus {}: {e}", dir.display()))
            .map(|e| std::fs::read(e.unwrap().path()).unwrap())
            .collect();
        assert!(!seeds.is_empty(), "{} has no seeds", dir.display());
        seeds.sort();
        seeds
    }

    /// One random edit: flip, set, insert, delete, truncate, splice, or an
    /// extreme 4-byte length.
    fn mutate(rng: &mut StdRng, input: &mut Vec<u8>, other: &[u8]) {
        let at = if input.is_empty() { 0 } else { rng.gen_range(0..input.len()) };
        match rng.gen_range(0..7) {
            0 if !input.is_empty() => input[at] ^= 1 << rng.gen_range(0..8),
            1 if !input.is_empty() => input[at] = rng.gen(),
            2 => input.insert(at, rng.gen()),
            3 if !input.is_empty() => drop(input.remove(at)),
            4 => input.truncate(at),
            5 => input.extend_from_slice(&other[rng.gen_range(0..=other.len())..]),
            _ => {
                let len = [0i32, -1, 3, 4, 5, i32::MAX, i32::MIN, 10_000, 10_001][rng.gen_range(0..9)];
                let end = (at + 4).min(input.len());
                input.splice(at..end, len.to_be_bytes());
            }
        }
    }

    #[test]
    fn every_target_survives_mutated_seeds_and_random_bytes() {
        for (name, run) in super::TARGETS {
            let seeds = seeds(name);
            let mut rng = StdRng::seed_from_u64(0x5eed ^ name.len() as u64);
            for seed in &seeds {
                run(seed);
            }
            for round in 0..ROUNDS {
                let mut input = if round % 10 == 0 {
                    (0..rng.gen_range(0..256)).map(|_| rng.gen()).collect()
                } else {
                    seeds[rng.gen_range(0..seeds.len())].clone()
                };
                for _ in 0..rng.gen_range(1..6) {
                    let other = &seeds[rng.gen_range(0..seeds.len())];
                    mutate(&mut rng, &mut input, other);
                }
                run(&input);
            }
        }
    }
}
