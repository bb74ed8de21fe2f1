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

/// Whether a timeout is on in `[weir]` or for some user.
fn set(
    c: &Config,
    general: fn(&super::General) -> Option<std::time::Duration>,
    user: fn(&super::UserSettings) -> Option<std::time::Duration>,
) -> bool {
    let on = |d: Option<std::time::Duration>| d.is_some_and(|d| !d.is_zero());
    on(general(&c.weir)) || c.users.values().any(|u| on(user(u)))
}

const DIFFERENCES: &[Difference] = &[
    Difference {
        applies: always,
        note: "query_wait_timeout: a client whose wait runs out gets 53300 and keeps its connection \
               (PgBouncer closes it)",
    },
    Difference {
        applies: |c| set(c, |g| g.query_timeout, |u| u.query_timeout),
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
        note: "weir's own login refusals keep Postgres's SQLSTATEs (28P01, 28000, 3D000, 55000, 53300) with \
               PgBouncer's texts, where PgBouncer sends 08P01",
    },
    Difference {
        applies: always,
        note: "SIGTERM and SHUTDOWN drain: idle clients are told at once and transactions finish within \
               shutdown_timeout (PgBouncer's SIGTERM waits for every client; SHUTDOWN WAIT_FOR_CLIENTS does that)",
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
    Difference {
        applies: |c| c.weir.sigterm == super::SigtermMode::Drain,
        note: "sigterm = \"drain\": SIGTERM tells idle clients at once (57P01) and weir ends within \
               shutdown_timeout (PgBouncer's SIGTERM waits for every client: sigterm = \"wait_for_clients\")",
    },
    Difference { applies: always, note: "no online restart (-R, SUSPEND)" },
    Difference {
        applies: always,
        note: "startup parameters (DateStyle, options -c, ...) are applied on a server and checked at login: a value \
               Postgres refuses is refused at connect with its SQLSTATE, as Postgres does, and the client takes the \
               server's spelling then (PgBouncer applies them at the client's first query, and logs its varcache \
               lines there)",
    },
    Difference {
        applies: |c| c.weir.max_prepared_statements > 0,
        note: "prepared statements: a Parse of a name the client already holds (42P05), or a Bind or Describe of \
               a name it does not hold (26000; after DEALLOCATE ALL or DISCARD ALL it holds none) gets Postgres's \
               error and the client keeps its connection (PgBouncer closes it)",
    },
    Difference {
        applies: |c| c.weir.max_prepared_statements > 0,
        note: "max_prepared_statements = 0 by SET or RELOAD: clients logged in before keep weir's handling of \
               their statements, which keep working (PgBouncer sends their names to servers that lack them: \
               26000); a higher or lower value reaches every client at its next transaction, as in PgBouncer",
    },
    Difference {
        applies: shorter_bounds,
        note: "liveness: weir bounds waits sooner than PgBouncer's defaults: client_login_timeout 10s (60s), \
               server_connect_timeout 5s (15s), keepalive probes after tcp_keepidle 5s on every socket, clients' \
               too (the kernel's 2h), server_check_silence 5s (none)",
    },
];

/// Some liveness setting is shorter than PgBouncer's default (weir's own
/// defaults are).
fn shorter_bounds(c: &Config) -> bool {
    use std::time::Duration;
    let w = &c.weir;
    w.client_login_timeout < Duration::from_secs(60)
        || w.server_connect_timeout < Duration::from_secs(15)
        || (w.tcp_keepalive && w.tcp_keepidle < Duration::from_secs(7200))
        || !w.server_check_silence.is_zero()
}

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
        assert!(plain.iter().any(|n| n.starts_with("liveness")), "weir's shorter default bounds: {plain:#?}");
        let pgbouncer_bounds = "client_login_timeout = \"60s\"\nserver_connect_timeout = \"15s\"\n\
            tcp_keepalive = false\nserver_check_silence = \"0s\"\n";
        let like = for_config(&cfg(&format!("[weir]\nauth_type = \"trust\"\n{pgbouncer_bounds}[databases.app]\n")));
        assert!(!like.iter().any(|n| n.starts_with("liveness")), "PgBouncer's bounds, no note: {like:#?}");
        assert!(!plain.iter().any(|n| n.starts_with("server_fast_close") || n.starts_with("query_timeout")));
        assert!(!plain.iter().any(|n| n.starts_with("TLS") || n.starts_with("auth_type")), "{plain:#?}");
        assert!(plain.iter().any(|n| n.starts_with("prepared statements")), "on by default: {plain:#?}");
        let off = for_config(&cfg("[weir]\nauth_type = \"trust\"\nmax_prepared_statements = 0\n[databases.app]\n"));
        assert!(!off.iter().any(|n| n.starts_with("prepared statements")), "{off:#?}");
        let set = for_config(&cfg(
            "[weir]\nauth_type = \"trust\"\nserver_fast_close = true\nquery_timeout = \"10s\"\n[databases.app]\n",
        ));
        for prefix in ["server_fast_close", "query_timeout", "auth_type = trust"] {
            assert!(set.iter().any(|n| n.starts_with(prefix)), "no note on {prefix}: {set:#?}");
        }
    }
}
