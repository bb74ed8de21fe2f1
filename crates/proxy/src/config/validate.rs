//! `Config::validate()`: every check, each with an error that says what to change.

use std::path::PathBuf;
use std::time::Duration;

use super::Config;

/// A config that cannot be used, with an explanation an operator can act on.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {0}: {1}")]
    Read(PathBuf, String),
    #[error("invalid TOML: {0}")]
    Parse(String),
    #[error("{key}: {why}")]
    Invalid { key: String, why: String },
}

fn invalid(key: impl Into<String>, why: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { key: key.into(), why: why.into() }
}

impl Config {
    /// Checks every rule; returns the first violation.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self.problems().into_iter().next() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Every rule this config breaks (`weir check-config` reports them all).
    pub fn problems(&self) -> Vec<ConfigError> {
        let mut found = Vec::new();
        self.check_general(&mut found);
        self.check_startup_parameters(&mut found);
        self.check_client_tls(&mut found);
        self.check_server_tls(&mut found);
        for (key, value) in [
            ("client_tls_protocols", &self.weir.client_tls_protocols),
            ("server_tls_protocols", &self.weir.server_tls_protocols),
        ] {
            if let Err(why) = super::tls_protocols::parse(value) {
                found.push(invalid(format!("weir.{key}"), why));
            }
        }
        for name in self.databases.keys() {
            self.check_database(name, &mut found);
        }
        for (name, u) in &self.users {
            if u.pool_size == Some(0) {
                found.push(invalid(format!("users.{name}.pool_size"), "must be at least 1"));
            }
        }
        self.check_peers(&mut found);
        found
    }

    fn check_general(&self, found: &mut Vec<ConfigError>) {
        let g = &self.weir;
        if g.default_pool_size == 0 {
            found.push(invalid("weir.default_pool_size", "must be at least 1"));
        }
        if g.max_client_conn == 0 {
            found.push(invalid("weir.max_client_conn", "must be at least 1"));
        }
        if g.worker_threads == 0 {
            found.push(invalid("weir.worker_threads", "must be at least 1"));
        }
        if g.server_connect_concurrency == 0 {
            found.push(invalid("weir.server_connect_concurrency", "must be at least 1"));
        }
        if !(g.max_fingerprint_share > 0.0 && g.max_fingerprint_share <= 1.0) {
            found.push(invalid("weir.max_fingerprint_share", "must be in (0, 1]"));
        }
        if !(g.client_deadline_fraction > 0.0 && g.client_deadline_fraction <= 1.0) {
            found.push(invalid("weir.client_deadline_fraction", "must be in (0, 1]"));
        }
        if g.stats_period < Duration::from_secs(1) {
            found.push(invalid("weir.stats_period", "must be at least 1s"));
        }
        if g.max_message_size < 1024 {
            found.push(invalid("weir.max_message_size", "must be at least 1024 bytes"));
        }
        if !matches!(g.auth_type, super::AuthType::Trust | super::AuthType::Any) && g.auth_file.is_none() {
            found.push(invalid("weir.auth_file", "is required unless auth_type = \"trust\" or \"any\""));
        }
        match (g.auth_type == super::AuthType::Hba, g.auth_hba_file.is_some()) {
            (true, false) => found.push(invalid("weir.auth_hba_file", "is required when auth_type = \"hba\"")),
            (false, true) => found.push(invalid("weir.auth_hba_file", "is used only with auth_type = \"hba\"")),
            _ => {}
        }
        // The console's names (the login's CONSOLE_DATABASES): no server
        // behind them to run auth_query on (PgBouncer's words).
        if matches!(g.auth_dbname.as_str(), "pgbouncer" | "weir") {
            let why = format!("cannot use the reserved \"{}\" database as an auth_dbname", g.auth_dbname);
            found.push(invalid("weir.auth_dbname", why));
        }
        if g.autodb_idle_timeout.is_zero() {
            found.push(invalid("weir.autodb_idle_timeout", "must be above zero"));
        }
        for (key, why) in super::listen::problems(self) {
            found.push(invalid(format!("weir.{key}"), why));
        }
    }

    /// Names in the startup-parameter lists are plain setting names, weir's
    /// own `weir.*` names excepted. A name on both lists is ignored.
    fn check_startup_parameters(&self, found: &mut Vec<ConfigError>) {
        let g = &self.weir;
        let lists = [
            ("ignore_startup_parameters", &g.ignore_startup_parameters),
            ("track_extra_parameters", &g.track_extra_parameters),
        ];
        for (key, list) in lists {
            if let Some(bad) = list.iter().find(|n| !crate::params::valid_name(n) || n.starts_with("weir.")) {
                found
                    .push(invalid(format!("weir.{key}"), format!("\"{bad}\" is not a setting name a client may send")));
            }
        }
    }

    /// A configured file must exist (whether it loads is checked when it is
    /// read: start, reload, and `weir check-config`).
    fn check_exists(&self, key: &str, file: &Option<PathBuf>, found: &mut Vec<ConfigError>) {
        if let Some(p) = self.resolve(file).filter(|p| !p.is_file()) {
            found.push(invalid(format!("weir.{key}"), format!("{} does not exist", p.display())));
        }
    }

    /// TLS modes other than disable need a certificate and key; verify-* a CA.
    fn check_client_tls(&self, found: &mut Vec<ConfigError>) {
        let g = &self.weir;
        if g.client_tls_sslmode == super::ClientTlsMode::Disable {
            return;
        }
        let mode = || format!("is required when client_tls_sslmode = \"{}\"", g.client_tls_sslmode.as_str());
        let mut files =
            vec![("client_tls_cert_file", &g.client_tls_cert_file), ("client_tls_key_file", &g.client_tls_key_file)];
        if g.client_tls_sslmode.verifies_client() {
            files.push(("client_tls_ca_file", &g.client_tls_ca_file));
        }
        for (key, file) in files {
            match file {
                None => found.push(invalid(format!("weir.{key}"), mode())),
                Some(_) => self.check_exists(key, file, found),
            }
        }
    }

    /// verify-* need a CA; a client certificate needs its key and the other way round.
    fn check_server_tls(&self, found: &mut Vec<ConfigError>) {
        let g = &self.weir;
        self.check_exists("server_tls_ca_file", &g.server_tls_ca_file, found);
        self.check_exists("server_tls_cert_file", &g.server_tls_cert_file, found);
        self.check_exists("server_tls_key_file", &g.server_tls_key_file, found);
        use super::ServerTlsMode::{VerifyCa, VerifyFull};
        if matches!(g.server_tls_sslmode, VerifyCa | VerifyFull) && g.server_tls_ca_file.is_none() {
            let why = format!("is required when server_tls_sslmode = \"{}\"", g.server_tls_sslmode.as_str());
            found.push(invalid("weir.server_tls_ca_file", why));
        }
        if g.server_tls_cert_file.is_some() != g.server_tls_key_file.is_some() {
            found.push(invalid("weir.server_tls_key_file", "server_tls_cert_file and server_tls_key_file go together"));
        }
    }

    fn check_database(&self, name: &str, found: &mut Vec<ConfigError>) {
        let Some(s) = self.pool_settings(name) else { return };
        let key = |k: &str| format!("databases.{name}.{k}");
        let db = &self.databases[name];
        if db.password.is_some() && db.user.is_none() {
            found.push(invalid(key("password"), "is the forced user's password: set user too"));
        }
        if name == "weir" || name == "pgbouncer" {
            found.push(invalid(format!("databases.{name}"), "is reserved for the admin console"));
        }
        if let Err(why) = super::hosts::host_list(&db.host, &db.port) {
            found.push(invalid(key("host"), why));
        }
        if s.pool_size == 0 {
            found.push(invalid(key("pool_size"), "must be at least 1"));
        }
        if s.query_wait_timeout.is_zero() {
            found.push(invalid(key("query_wait_timeout"), "must be above zero"));
        }
        if let Some(deadline) = s.client_deadline.filter(|d| s.query_wait_timeout >= *d) {
            found.push(invalid(
                key("query_wait_timeout"),
                format!(
                    "query_wait_timeout ({}) must be below client_deadline ({}): a query still queued when the \
                     client's own deadline expires is abandoned by the client, and weir must answer it first so the \
                     client gets a clear error instead of cancelling and disconnecting",
                    humantime::format_duration(s.query_wait_timeout),
                    humantime::format_duration(deadline)
                ),
            ));
        }
    }
}
