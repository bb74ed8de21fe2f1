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
        let g = &self.weir;
        if g.default_pool_size == 0 {
            return Err(invalid("weir.default_pool_size", "must be at least 1"));
        }
        if g.max_client_conn == 0 {
            return Err(invalid("weir.max_client_conn", "must be at least 1"));
        }
        if g.server_connect_concurrency == 0 {
            return Err(invalid("weir.server_connect_concurrency", "must be at least 1"));
        }
        if !(g.client_deadline_fraction > 0.0 && g.client_deadline_fraction <= 1.0) {
            return Err(invalid("weir.client_deadline_fraction", "must be in (0, 1]"));
        }
        if g.stats_period < Duration::from_secs(1) {
            return Err(invalid("weir.stats_period", "must be at least 1s"));
        }
        if g.max_message_size < 1024 {
            return Err(invalid("weir.max_message_size", "must be at least 1024 bytes"));
        }
        if g.auth_type != super::AuthType::Trust && g.auth_file.is_none() {
            return Err(invalid("weir.auth_file", "is required unless auth_type = \"trust\""));
        }
        match (g.auth_type == super::AuthType::Hba, g.auth_hba_file.is_some()) {
            (true, false) => return Err(invalid("weir.auth_hba_file", "is required when auth_type = \"hba\"")),
            (false, true) => return Err(invalid("weir.auth_hba_file", "is used only with auth_type = \"hba\"")),
            _ => {}
        }
        if !g.auth_user.is_empty() && !g.auth_query.contains("$1") {
            return Err(invalid("weir.auth_query", "must take the user name as $1"));
        }
        if !g.auth_dbname.is_empty() && !self.databases.contains_key(&g.auth_dbname) {
            return Err(invalid("weir.auth_dbname", "is not a database in [databases]"));
        }
        self.validate_startup_parameters()?;
        self.validate_client_tls()?;
        self.validate_server_tls()?;
        for name in self.databases.keys() {
            self.validate_database(name)?;
        }
        Ok(())
    }

    /// Names in the startup-parameter lists are plain setting names, weir's
    /// own `weir.*` names excepted. A name on both lists is ignored.
    fn validate_startup_parameters(&self) -> Result<(), ConfigError> {
        let g = &self.weir;
        let lists = [
            ("ignore_startup_parameters", &g.ignore_startup_parameters),
            ("track_extra_parameters", &g.track_extra_parameters),
        ];
        for (key, list) in lists {
            if let Some(bad) = list.iter().find(|n| !crate::params::valid_name(n) || n.starts_with("weir.")) {
                return Err(invalid(
                    format!("weir.{key}"),
                    format!("\"{bad}\" is not a setting name a client may send"),
                ));
            }
        }
        Ok(())
    }

    /// TLS modes other than disable need a certificate and key; verify-* a CA.
    /// Whether the files load is checked when the acceptor is built (start, reload).
    fn validate_client_tls(&self) -> Result<(), ConfigError> {
        let g = &self.weir;
        if g.client_tls_sslmode == super::ClientTlsMode::Disable {
            return Ok(());
        }
        let mode = || format!("is required when client_tls_sslmode = \"{}\"", g.client_tls_sslmode.as_str());
        for (key, file) in
            [("client_tls_cert_file", &g.client_tls_cert_file), ("client_tls_key_file", &g.client_tls_key_file)]
        {
            match self.resolve(file) {
                None => return Err(invalid(format!("weir.{key}"), mode())),
                Some(p) if !p.is_file() => {
                    return Err(invalid(format!("weir.{key}"), format!("{} does not exist", p.display())))
                }
                Some(_) => {}
            }
        }
        if g.client_tls_sslmode.verifies_client() {
            match self.resolve(&g.client_tls_ca_file) {
                None => return Err(invalid("weir.client_tls_ca_file", mode())),
                Some(p) if !p.is_file() => {
                    return Err(invalid("weir.client_tls_ca_file", format!("{} does not exist", p.display())))
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// verify-* need a CA; a client certificate needs its key and the other way round.
    fn validate_server_tls(&self) -> Result<(), ConfigError> {
        let g = &self.weir;
        let exists = |key: &str, file: &Option<PathBuf>| match self.resolve(file) {
            Some(p) if !p.is_file() => Err(invalid(format!("weir.{key}"), format!("{} does not exist", p.display()))),
            _ => Ok(()),
        };
        exists("server_tls_ca_file", &g.server_tls_ca_file)?;
        exists("server_tls_cert_file", &g.server_tls_cert_file)?;
        exists("server_tls_key_file", &g.server_tls_key_file)?;
        use super::ServerTlsMode::{VerifyCa, VerifyFull};
        if matches!(g.server_tls_sslmode, VerifyCa | VerifyFull) && g.server_tls_ca_file.is_none() {
            let why = format!("is required when server_tls_sslmode = \"{}\"", g.server_tls_sslmode.as_str());
            return Err(invalid("weir.server_tls_ca_file", why));
        }
        if g.server_tls_cert_file.is_some() != g.server_tls_key_file.is_some() {
            return Err(invalid(
                "weir.server_tls_key_file",
                "server_tls_cert_file and server_tls_key_file go together",
            ));
        }
        Ok(())
    }

    fn validate_database(&self, name: &str) -> Result<(), ConfigError> {
        let s = self.pool_settings(name).expect("key exists");
        let key = |k: &str| format!("databases.{name}.{k}");
        if name == "weir" || name == "pgbouncer" {
            return Err(invalid(format!("databases.{name}"), "is reserved for the admin console"));
        }
        if s.pool_size == 0 {
            return Err(invalid(key("pool_size"), "must be at least 1"));
        }
        if s.min_pool_size > s.pool_size {
            return Err(invalid(
                key("min_pool_size"),
                format!("{} exceeds pool_size {}", s.min_pool_size, s.pool_size),
            ));
        }
        if s.query_wait_timeout.is_zero() {
            return Err(invalid(key("query_wait_timeout"), "must be above zero"));
        }
        if let Some(deadline) = s.client_deadline {
            if s.query_wait_timeout >= deadline {
                return Err(invalid(
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
        Ok(())
    }
}
