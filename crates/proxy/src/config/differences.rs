//! Where weir differs from PgBouncer on purpose, for a given config: the short
//! notes `weir check-config` prints and `weir migrate-config` writes at the
//! head of the weir.toml it makes. docs/moving-from-pgbouncer.md has the long
//! form of each. A behaviour that PgBouncer and weir share is not listed.

use super::{AuthType, Config};

/// One deliberate difference, and whether a config meets it.
struct Difference {
    applies: fn(&Config) -> bool,
    note: &'static str,
}

fn always(_: &Config) -> bool {
    true
}

const DIFFERENCES: &[Difference] = &[
    Difference {
        applies: always,
        note: "query_wait_timeout: a client whose wait runs out gets 53300 and keeps its connection \
               (PgBouncer closes it)",
    },
    Difference {
        applies: |c| c.weir.query_timeout.is_some_and(|d| !d.is_zero()),
        note: "query_timeout: the query is cancelled and its client gets 57014 and keeps its connection \
               (PgBouncer closes it)",
    },
    Difference {
        applies: always,
        note: "Postgres at its connection limit (53300) is backpressure: weir backs off and clients wait within \
               their budget, a first login included (PgBouncer fails that login)",
    },
    Difference {
        applies: always,
        note: "weir's own login refusals keep Postgres's SQLSTATEs (28P01, 28000, 3D000, 55000) with PgBouncer's \
               texts, where PgBouncer sends 08P01",
    },
    Difference {
        applies: |c| c.weir.server_fast_close,
        note: "server_fast_close: session clients are disconnected at RECONNECT even inside a transaction \
               (PgBouncer waits for the transaction to end)",
    },
    Difference {
        applies: |c| c.weir.auth_type == AuthType::Trust && c.weir.auth_file.is_none(),
        note: "auth_type = trust without an auth_file admits every user name (PgBouncer refuses every login)",
    },
    Difference {
        applies: |c| {
            let w = &c.weir;
            w.client_tls_cert_file.is_some() || w.server_tls_cert_file.is_some() || w.server_tls_ca_file.is_some()
        },
        note: "TLS (rustls): X.509 v3 certificates only, and host names from subjectAltName only (OpenSSL also \
               reads v1 certificates and the subject CN)",
    },
    Difference {
        applies: |c| c.databases.values().any(|d| d.host.contains(',')),
        note: "host lists: weir skips a host it cannot reach and, with target_session_attrs, keeps only servers \
               of the role asked for, finding the new primary after a failover (PgBouncer takes every listed host \
               in turn, reachable or not, and checks no role)",
    },
    Difference { applies: always, note: "no online restart (-R, SUSPEND) and no peering" },
];

/// The deliberate differences from PgBouncer that this config meets.
pub fn for_config(cfg: &Config) -> Vec<&'static str> {
    DIFFERENCES.iter().filter(|d| (d.applies)(cfg)).map(|d| d.note).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> Config {
        Config::from_toml(text, std::path::Path::new(".")).expect("valid")
    }

    #[test]
    fn notes_follow_the_keys_that_are_set() {
        let plain = for_config(&cfg("[weir]\nauth_type = \"md5\"\nauth_file = \"u.txt\"\n[databases.app]\n"));
        assert!(plain.iter().any(|n| n.starts_with("query_wait_timeout")), "{plain:#?}");
        assert!(!plain.iter().any(|n| n.starts_with("server_fast_close") || n.starts_with("query_timeout")));
        assert!(!plain.iter().any(|n| n.starts_with("TLS") || n.starts_with("auth_type")), "{plain:#?}");
        let set = for_config(&cfg(
            "[weir]\nauth_type = \"trust\"\nserver_fast_close = true\nquery_timeout = \"10s\"\n[databases.app]\n",
        ));
        for prefix in ["server_fast_close", "query_timeout", "auth_type = trust"] {
            assert!(set.iter().any(|n| n.starts_with(prefix)), "no note on {prefix}: {set:#?}");
        }
    }
}
