//! The config's key names and current values as flat `key = value` text, for
//! `SHOW CONFIG`, `weir migrate-config` and the check that `config/weir.toml`
//! documents every key. Key names come from the serde derive itself, so a key
//! added to a struct shows up here without a list to keep in step.

use serde::de::{self, DeserializeOwned, Deserializer, Visitor};
use serde::Serialize;

use super::{Config, Database, General, MetricsSection, Peer, UserSettings};

/// A deserializer that only records the field list a derived struct asks for.
struct FieldNames(&'static [&'static str]);

impl<'de> Deserializer<'de> for &mut FieldNames {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("only struct field names are read"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Self::Error> {
        self.0 = fields;
        Err(de::Error::custom("only struct field names are read"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
        unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
    }
}

/// The keys a derived config struct accepts, in declaration order.
pub(crate) fn field_names<T: DeserializeOwned>() -> &'static [&'static str] {
    let mut names = FieldNames(&[]);
    let _ = T::deserialize(&mut names);
    names.0
}

/// Keys of the `[weir]` section.
pub(crate) fn general_keys() -> &'static [&'static str] {
    field_names::<General>()
}

/// Keys of the `[metrics]` section.
pub(crate) fn metrics_keys() -> &'static [&'static str] {
    field_names::<MetricsSection>()
}

/// Keys of a `[databases.NAME]` section.
pub(crate) fn database_keys() -> &'static [&'static str] {
    field_names::<Database>()
}

/// Keys of a `[users.NAME]` section.
pub(crate) fn user_keys() -> &'static [&'static str] {
    field_names::<UserSettings>()
}

/// Keys of a `[peers.ID]` section.
pub(crate) fn peer_keys() -> &'static [&'static str] {
    field_names::<Peer>()
}

/// `key → value` for every key of a section; unset optional keys are None.
/// Values are rendered as an operator would write them: strings bare,
/// lists comma-separated, everything else in TOML syntax.
pub(crate) fn values<T: Serialize + DeserializeOwned>(section: &T) -> Vec<(&'static str, Option<String>)> {
    let table = match toml::Value::try_from(section) {
        Ok(toml::Value::Table(t)) => t,
        _ => toml::map::Map::new(),
    };
    field_names::<T>().iter().map(|&k| (k, table.get(k).map(render))).collect()
}

fn render(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        toml::Value::Array(a) => a.iter().map(render).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}

/// One row of `SHOW CONFIG`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConfigRow {
    pub key: String,
    pub value: Option<String>,
    pub default: Option<String>,
    /// False for keys a reload cannot apply (they need a restart).
    pub changeable: bool,
}

/// Keys a reload reads but cannot apply to the running process.
pub(crate) const RESTART_KEYS: &[&str] = &[
    "listen_addr",
    "unix_socket_dir",
    "unix_socket_mode",
    "unix_socket_group",
    "log_format",
    "worker_threads",
    "metrics.listen_addr",
    "peer_id",
    "so_reuseport",
    "metrics.enabled",
];

/// Every `[weir]` and `[metrics]` key with its live value and default.
pub(crate) fn config_rows(cfg: &Config) -> Vec<ConfigRow> {
    let general = values(&cfg.weir).into_iter().zip(values(&General::default()));
    let metrics = values(&cfg.metrics).into_iter().zip(values(&MetricsSection::default()));
    let prefixed = metrics.map(|((k, v), (_, d))| (format!("metrics.{k}"), v, d));
    general
        .map(|((k, v), (_, d))| (k.to_owned(), v, d))
        .chain(prefixed)
        .map(|(key, value, default)| ConfigRow {
            changeable: !RESTART_KEYS.contains(&key.as_str()),
            key,
            value,
            default,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The annotated example config in the repository.
    const EXAMPLE: &str = include_str!("../../../../config/weir.toml");
    /// The configuration reference.
    const REFERENCE: &str = include_str!("../../../../docs/configuration.md");

    /// Every key of every section, with its section as the config writes it.
    fn every_key() -> Vec<(&'static str, &'static str)> {
        let sections = [
            ("weir", general_keys()),
            ("metrics", metrics_keys()),
            ("databases.", database_keys()),
            ("users.", user_keys()),
            ("peers.", peer_keys()),
        ];
        sections.into_iter().flat_map(|(section, keys)| keys.iter().map(move |&k| (section, k))).collect()
    }

    #[test]
    fn field_names_come_from_the_derive() {
        assert!(general_keys().contains(&"listen_addr"));
        assert!(general_keys().contains(&"query_wait_timeout"));
        assert_eq!(metrics_keys(), &["listen_addr", "enabled"]);
        assert!(database_keys().contains(&"pool_size"));
        assert!(!field_names::<Config>().contains(&"base_dir"), "skipped fields are not keys");
    }

    #[test]
    fn values_render_like_an_operator_writes_them() {
        let g = General::default();
        let v: std::collections::HashMap<_, _> = values(&g).into_iter().collect();
        assert_eq!(v["query_wait_timeout"].as_deref(), Some("2m"));
        assert_eq!(v["pool_mode"].as_deref(), Some("transaction"));
        assert_eq!(v["tcp_keepalive"].as_deref(), Some("true"));
        assert_eq!(v["ignore_startup_parameters"].as_deref(), Some("extra_float_digits"));
        assert_eq!(v["auth_file"], None);
    }

    #[test]
    fn config_rows_cover_every_key_once() {
        let cfg =
            Config::from_toml("[weir]\nauth_type = \"trust\"\ndefault_pool_size = 7\n", std::path::Path::new("."))
                .unwrap();
        let rows = config_rows(&cfg);
        assert_eq!(rows.len(), general_keys().len() + metrics_keys().len());
        let size = rows.iter().find(|r| r.key == "default_pool_size").unwrap();
        assert_eq!((size.value.as_deref(), size.default.as_deref(), size.changeable), (Some("7"), Some("20"), true));
        assert!(!rows.iter().find(|r| r.key == "listen_addr").unwrap().changeable);
    }

    /// `config/weir.toml` is valid and mentions every key (set or commented out).
    #[test]
    fn example_config_documents_every_key() {
        let cfg = Config::from_toml(EXAMPLE, std::path::Path::new("/etc/weir")).expect("config/weir.toml is valid");
        assert!(!cfg.databases.is_empty());
        let documented = |section: &str, key: &str| {
            let mut in_section = false;
            EXAMPLE.lines().any(|line| {
                let line = line.trim_start_matches(['#', ' ']);
                if line.starts_with('[') {
                    in_section = line.trim_start_matches('[').starts_with(section);
                    return false;
                }
                in_section && line.strip_prefix(key).is_some_and(|rest| rest.trim_start().starts_with('='))
            })
        };
        for (section, key) in every_key() {
            assert!(documented(section, key), "config/weir.toml does not document [{section}] {key}");
        }
    }

    /// docs/configuration.md names every key, in code: `key`, `key = …`, or
    /// a `key = …` line of a TOML block (set or commented out).
    #[test]
    fn reference_names_every_key() {
        let named = |key: &str| {
            let in_code = ["`", " ", "="].iter().any(|after| REFERENCE.contains(&format!("`{key}{after}")));
            let in_block = REFERENCE.lines().any(|line| {
                let line = line.trim_start_matches(['#', ' ']);
                line.strip_prefix(key).is_some_and(|rest| rest.trim_start().starts_with('='))
            });
            in_code || in_block
        };
        let missing: Vec<String> =
            every_key().into_iter().filter(|(_, key)| !named(key)).map(|(s, k)| format!("[{s}] {k}")).collect();
        assert!(missing.is_empty(), "docs/configuration.md does not name: {}", missing.join(", "));
    }
}
