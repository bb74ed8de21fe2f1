//! weir run from a pgbouncer.ini the way a PgBouncer user would: `weir
//! migrate-config` turns the ini into a weir.toml, the places in it are
//! pointed at this machine (listen and metrics ports, every database at the
//! test Postgres, the auth_file and hba file into a temp dir), `weir
//! check-config` must pass, and then the weir binary serves on it.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use weir_testkit::{PgServer, MD5_PASS, MD5_USER, SCRAM_PASS, SCRAM_USER, TRUST_PASS, TRUST_USER};

use crate::process::{weir_bin, WeirChild};

/// The auth_file every migrated config gets (plaintext passwords).
pub fn userlist() -> String {
    let users = [
        (SCRAM_USER, SCRAM_PASS),
        (MD5_USER, MD5_PASS),
        (TRUST_USER, TRUST_PASS),
        ("admin", "admin_pass"),
        ("stats", "stats_pass"),
    ];
    users.iter().map(|(u, p)| format!("\"{u}\" \"{p}\"\n")).collect()
}

/// The text after `tag` of each comment line of an ini that has it (the
/// corpus's instructions: `; corpus-userlist: "user" "secret"` adds an
/// auth_file line, `; corpus-setup: SQL` runs SQL on the test Postgres).
pub fn comments<'a>(ini_text: &'a str, tag: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    ini_text.lines().filter_map(move |l| l.split_once(tag)).map(|(_, rest)| rest.trim())
}

/// `weir migrate-config ini`: (the TOML, the warnings it printed).
pub fn migrate(ini: &Path) -> (String, String) {
    let out = Command::new(weir_bin()).arg("migrate-config").arg(ini).output().expect("run weir migrate-config");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "migrate-config {} failed: {stderr}", ini.display());
    (String::from_utf8(out.stdout).expect("UTF-8 TOML"), stderr)
}

/// Points a migrated config at this machine: weir and its metrics on free
/// loopback ports, every database at `pg`, the auth_file and hba file to
/// the files this module writes. TLS towards clients is left out (the
/// corpus has no certificates to give).
pub fn localize(toml_text: &str, pg: &PgServer, port: u16, metrics_port: u16) -> String {
    let mut t: toml::Table = toml_text.parse().expect("migrate-config writes valid TOML");
    let weir = t.get_mut("weir").and_then(toml::Value::as_table_mut).expect("a [weir] section");
    weir.insert("listen_addr".into(), format!("127.0.0.1:{port}").into());
    for (key, file) in [("auth_file", "userlist.txt"), ("auth_hba_file", "hba.conf")] {
        if weir.contains_key(key) {
            weir.insert(key.into(), file.into());
        }
    }
    weir.retain(|k, _| !k.starts_with("client_tls_"));
    weir.insert("server_login_retry".into(), "200ms".into());
    let metrics = t.entry("metrics").or_insert_with(|| toml::Table::new().into());
    metrics.as_table_mut().unwrap().insert("listen_addr".into(), format!("127.0.0.1:{metrics_port}").into());
    if let Some(dbs) = t.get_mut("databases").and_then(toml::Value::as_table_mut) {
        for (_, db) in dbs.iter_mut() {
            let db = db.as_table_mut().expect("a database table");
            db.insert("host".into(), "127.0.0.1".into());
            db.insert("port".into(), i64::from(pg.port()).into());
        }
    }
    toml::to_string(&t).expect("TOML")
}

/// A weir process on a migrated, localized config in its own temp dir.
pub struct MigratedWeir {
    weir: WeirChild,
    pub dir: PathBuf,
    pub port: u16,
    pub metrics_port: u16,
}

impl MigratedWeir {
    /// Migrates `ini`, localizes it (then `edit` may change the TOML text),
    /// checks it with `weir check-config` (which must pass) and starts weir.
    pub async fn start(pg: &PgServer, ini: &Path, edit: impl FnOnce(String) -> String) -> MigratedWeir {
        let dir = pg.data_dir().parent().unwrap().join(format!("weir-ini-{}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        let ini_text = std::fs::read_to_string(ini).unwrap_or_default();
        let extra: String = comments(&ini_text, "corpus-userlist:").map(|l| format!("{l}\n")).collect();
        std::fs::write(dir.join("userlist.txt"), userlist() + &extra).unwrap();
        std::fs::write(dir.join("hba.conf"), "host all all 127.0.0.1/32 md5\n").unwrap();
        let [port, metrics_port] = weir_testkit::free_ports();
        let (toml_text, _warnings) = migrate(ini);
        let config = dir.join("weir.toml");
        std::fs::write(&config, edit(localize(&toml_text, pg, port, metrics_port))).unwrap();
        let check = Command::new(weir_bin()).arg("check-config").arg(&config).output().expect("run check-config");
        assert!(
            check.status.success(),
            "check-config refused the config migrated from {}:\n{}\n--- weir.toml ---\n{}",
            ini.display(),
            String::from_utf8_lossy(&check.stderr),
            std::fs::read_to_string(&config).unwrap_or_default()
        );
        let w = MigratedWeir { weir: WeirChild::spawn(dir.clone(), &config), dir, port, metrics_port };
        let up = crate::eventually(Duration::from_secs(30), || TcpStream::connect(("127.0.0.1", port)).is_ok()).await;
        assert!(up, "weir did not start on the config from {}; its log:\n{}", ini.display(), w.logs());
        w
    }

    /// A connection string to weir.
    pub fn url(&self, user: &str, password: &str, db: &str) -> String {
        format!("postgres://{user}:{password}@127.0.0.1:{}/{db}", self.port)
    }

    /// weir's stderr so far.
    pub fn logs(&self) -> String {
        self.weir.logs()
    }

    /// The /metrics text.
    pub fn metrics(&self) -> String {
        crate::process::metrics_text(self.metrics_port)
    }
}
