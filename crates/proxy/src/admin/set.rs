//! `SET key = value`: changes one `[weir]` setting in the running config, as
//! if the file said so and was reloaded (the file itself is not written, so
//! the next RELOAD brings the file's value back, as in PgBouncer). The value
//! is read as `weir migrate-config` reads a pgbouncer.ini line, so
//! PgBouncer's spellings work (`query_timeout = 5` is five seconds), and so
//! do weir's own (`"5s"`). Settings a reload cannot change are refused.

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
    // migrate-config always writes a listen address; SET never changes it.
    if key != "listen_addr" && key != "listen_port" {
        weir.remove("listen_addr");
    }
    // What migrate-config writes for a whole file that does not set them
    // (PgBouncer's default pool_mode, its socket folder) is no part of this
    // SET: `SET server_idle_timeout = 50` must not also switch pool_mode.
    let whole_file = file_defaults();
    weir.retain(|k, _| k == key || !whole_file.contains_key(k));
    Ok(weir)
}

/// The `[weir]` entries migrate-config writes for an ini that sets nothing.
fn file_defaults() -> toml::Table {
    let m = migrate::from_pgbouncer_ini("[pgbouncer]\n");
    let doc = toml::from_str::<toml::Table>(&m.toml).unwrap_or_default();
    doc.get("weir").and_then(|w| w.as_table()).cloned().unwrap_or_default()
}

/// SET key = value.
pub fn set(shared: &Arc<Shared>, key: &str, value: &str) -> Outcome {
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
    let current = shared.config.load();
    let mut doc = toml::Table::try_from(&*current)
        .map_err(|e| AdminError::new(sqlstate::INTERNAL_ERROR, format!("SET {key}: {e}")))?;
    if let Some(weir) = doc.get_mut("weir").and_then(|w| w.as_table_mut()) {
        weir.extend(changes);
    }
    let refused = |e: String| AdminError::new(sqlstate::INVALID_PARAMETER_VALUE, format!("SET {key} = {value}: {e}"));
    let mut cfg: Config = doc.try_into().map_err(|e: toml::de::Error| refused(e.message().to_owned()))?;
    cfg.base_dir = current.base_dir.clone();
    cfg.validate().map_err(|e| refused(e.to_string()))?;
    let notes = shared.reload(cfg).map_err(|e| refused(e.to_string()))?;
    tracing::info!(key, value, "SET");
    Ok(notes.into_iter().map(|n| (sqlstate::WARNING, n)).collect())
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
        let t = entries("server_idle_timeout", "50").unwrap();
        assert_eq!(t.keys().collect::<Vec<_>>(), ["server_idle_timeout"], "nothing but the key: {t:?}");
        let t = entries("pool_mode", "session").unwrap();
        assert_eq!(t.get("pool_mode").and_then(|v| v.as_str()), Some("session"), "{t:?}");
        let e = entries("frobnicate", "1").unwrap_err();
        assert!(e.message.contains("frobnicate"), "{e}");
    }
}
