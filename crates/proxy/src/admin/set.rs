//! `SET key = value`: changes one `[weir]` setting in the running config, as
//! if the file said so and was reloaded (the file itself is not written, so
//! the next RELOAD brings the file's value back, as in PgBouncer). The value
//! is read as `weir migrate-config` reads a pgbouncer.ini line, so
//! PgBouncer's spellings work (`query_timeout = 5` is five seconds), and so
//! do weir's own (`"5s"`). Settings a reload cannot change are refused.
//!
//! SETs are a sequence, as in PgBouncer: settings that must agree (a TLS
//! key and its certificate, a verify-* sslmode and its CA file, a client
//! TLS mode and its files) may be set in any order. A value that is good
//! on its own but disagrees with the running config is kept, not in effect
//! yet (a WARNING says what it waits for), until a later SET makes the set
//! agree; a RELOAD from the file forgets it.

use std::sync::Arc;

use super::control::{AdminError, Outcome};
use crate::config::{keys, migrate, Config};
use crate::protocol::sqlstate;
use crate::state::Shared;

/// The `[weir]` entries `key = value` stands for: PgBouncer's spelling
/// first, else weir's own for a weir key (a TOML value, or a bare string
/// such as `30s`; the config's types then check it).
fn entries(key: &str, value: &str) -> Result<toml::Table, AdminError> {
    match pgbouncer_entries(key, value) {
        Err(_) if keys::general_keys().contains(&key) => {
            let parsed = toml::from_str::<toml::Table>(&format!("v = {value}")).ok().and_then(|mut t| t.remove("v"));
            let value = parsed.unwrap_or_else(|| toml::Value::String(value.to_owned()));
            Ok(toml::Table::from_iter([(key.to_owned(), value)]))
        }
        other => other,
    }
}

fn pgbouncer_entries(key: &str, value: &str) -> Result<toml::Table, AdminError> {
    let m = migrate::from_pgbouncer_ini(&format!("[pgbouncer]\n{key} = {value}\n"));
    // Line 2 is the setting; warnings about the whole file (a missing
    // auth_file, no databases) do not concern SET.
    if let Some(w) = m.warnings.iter().find(|w| w.starts_with("line 2:")) {
        let why = w.split_once(": ").map_or(w.as_str(), |(_, rest)| rest);
        return Err(AdminError::new(sqlstate::INVALID_PARAMETER_VALUE, format!("SET {key}: {why}")));
    }
    let doc: toml::Table =
        toml::from_str(&m.toml).map_err(|e| AdminError::new(sqlstate::INTERNAL_ERROR, format!("SET {key}: {e}")))?;
    let mut weir = doc.get("weir").and_then(|w| w.as_table()).cloned().unwrap_or_default();
    // migrate-config writes what a whole ini implies (a listen address,
    // PgBouncer's defaults for pool_mode, unix_socket_dir and the login
    // log lines); SET changes only the key it names.
    let implied = migrate::from_pgbouncer_ini("[pgbouncer]\n").toml;
    let implied: toml::Table = toml::from_str(&implied).unwrap_or_default();
    if let Some(implied) = implied.get("weir").and_then(|w| w.as_table()) {
        let named = |k: &str| k == key || (key == "listen_port" && k == "listen_addr");
        weir.retain(|k, _| named(k) || !implied.contains_key(k));
    }
    Ok(weir)
}

/// Settings that must agree with one another, by the key SET names: each
/// group's keys.
const AGREEING: &[&[&str]] = &[
    &["server_tls_key_file", "server_tls_cert_file"],
    &["server_tls_sslmode", "server_tls_ca_file"],
    &["client_tls_sslmode", "client_tls_key_file", "client_tls_cert_file", "client_tls_ca_file"],
];

/// The keys `key` must agree with (none for a key of no group).
fn partners(key: &str) -> Vec<&'static str> {
    AGREEING.iter().filter(|g| g.contains(&key)).flat_map(|g| g.iter().copied()).filter(|k| *k != key).collect()
}

/// SET key = value.
pub(super) fn set(shared: &Arc<Shared>, key: &str, value: &str) -> Outcome {
    let restart = |k: &str| keys::RESTART_KEYS.contains(&k) || k == "listen_port";
    if restart(key) {
        let msg = format!("{key} cannot be changed at run time: it needs a restart (SHOW CONFIG: changeable = no)");
        return Err(AdminError::new(sqlstate::CANT_CHANGE_RUNTIME_PARAM, msg));
    }
    let changes = entries(key, value)?;
    if changes.is_empty() {
        let msg = format!("SET {key}: nothing to change");
        return Err(AdminError::new(sqlstate::INVALID_PARAMETER_VALUE, msg));
    }
    let refused = |e: String| AdminError::new(sqlstate::INVALID_PARAMETER_VALUE, format!("SET {key} = {value}: {e}"));
    let current = shared.config.load();
    // The value alone (the running config with it and nothing pending) must
    // be good, but for the settings it must agree with.
    let alone = candidate(&current, &toml::Table::new(), &changes, false).map_err(&refused)?;
    let mut pending = shared.admin.pending();
    pending.extend(changes);
    let applied = candidate(&current, &pending, &toml::Table::new(), true)
        .and_then(|cfg| shared.reload(cfg).map_err(|e| e.to_string()));
    match applied {
        Ok(notes) => {
            shared.admin.set_pending(toml::Table::new());
            tracing::info!(key, value, "SET");
            Ok(notes.into_iter().map(|n| (sqlstate::WARNING, n)).collect())
        }
        Err(why) => {
            let others = partners(key);
            let own = own_problem(&alone, key);
            if others.is_empty() || own.is_some() {
                return Err(refused(own.unwrap_or(why)));
            }
            shared.admin.set_pending(pending);
            let waits = others.join(", ");
            let note = format!("SET {key} = {value}: accepted, not in effect until it agrees with {waits}: {why}");
            tracing::info!(key, value, "SET, waiting for {waits}: {why}");
            Ok(vec![(sqlstate::WARNING, note)])
        }
    }
}

/// The running config with `pending` and then `changes` over its `[weir]`,
/// its types checked, and with `validate` its rules (its files are loaded
/// by `Shared::reload`).
fn candidate(current: &Config, pending: &toml::Table, changes: &toml::Table, validate: bool) -> Result<Config, String> {
    let mut doc = toml::Table::try_from(current).map_err(|e| e.to_string())?;
    if let Some(weir) = doc.get_mut("weir").and_then(|w| w.as_table_mut()) {
        weir.extend(pending.clone());
        weir.extend(changes.clone());
    }
    let mut cfg: Config = doc.try_into().map_err(|e: toml::de::Error| e.message().to_owned())?;
    cfg.base_dir = current.base_dir.clone();
    if validate {
        cfg.validate().map_err(|e| e.to_string())?;
    }
    Ok(cfg)
}

/// What is wrong with `key`'s own value in `cfg` (its file missing or not
/// loading), as opposed to its disagreeing with another setting.
fn own_problem(cfg: &Config, key: &str) -> Option<String> {
    let g = &cfg.weir;
    let file = match key {
        "server_tls_key_file" => &g.server_tls_key_file,
        "server_tls_cert_file" => &g.server_tls_cert_file,
        "server_tls_ca_file" => &g.server_tls_ca_file,
        "client_tls_key_file" => &g.client_tls_key_file,
        "client_tls_cert_file" => &g.client_tls_cert_file,
        "client_tls_ca_file" => &g.client_tls_ca_file,
        _ => return None,
    };
    let path = cfg.resolve(file)?;
    let loaded = match key {
        "server_tls_key_file" | "client_tls_key_file" => crate::tls::load_key(&path).map(drop),
        "server_tls_ca_file" | "client_tls_ca_file" => crate::tls::load_roots(&path).map(drop),
        _ => crate::tls::load_certs(&path).map(drop),
    };
    loaded.err().map(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_read_as_pgbouncer_writes_them() {
        let t = entries("query_timeout", "5").unwrap();
        assert_eq!(t.get("query_timeout").and_then(|v| v.as_str()), Some("5s"), "{t:?}");
        let t = entries("default_pool_size", "7").unwrap();
        assert_eq!(t.get("default_pool_size").and_then(|v| v.as_integer()), Some(7), "{t:?}");
        assert!(!t.contains_key("listen_addr"));
        let t = entries("stats_period", "2s").unwrap();
        assert_eq!(t.get("stats_period").and_then(|v| v.as_str()), Some("2s"), "weir's spelling: {t:?}");
        for (key, value) in [("min_pool_size", "10"), ("server_idle_timeout", "50"), ("verbose", "1")] {
            let t = entries(key, value).unwrap();
            assert_eq!(t.keys().collect::<Vec<_>>(), [key], "only the key SET names: {t:?}");
        }
        let t = entries("pool_mode", "session").unwrap();
        assert_eq!(t.get("pool_mode").and_then(|v| v.as_str()), Some("session"));
        let e = entries("frobnicate", "1").unwrap_err();
        assert!(e.message.contains("frobnicate"), "{e}");
    }
}
