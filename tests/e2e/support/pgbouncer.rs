//! Debian's PgBouncer, started for a comparison test through the test kit's
//! launcher (`weir_testkit::pgbouncer`): the admin user logs in with trust;
//! no pool is used. Also reads a console's column names and type OIDs
//! through psycopg (tokio-postgres' simple queries carry no types).

use std::process::Command;

/// A running PgBouncer with `admin_user` in its admin_users.
pub struct PgBouncer {
    pub port: u16,
    _running: weir_testkit::pgbouncer::PgBouncer,
}

impl PgBouncer {
    /// Starts PgBouncer with database `app` on 127.0.0.1:`pg_port`; Err when
    /// it is not installed or does not start.
    pub fn start(pg_port: u16, admin_user: &str) -> Result<PgBouncer, String> {
        let dir = std::env::temp_dir().join(format!("weir-pgbouncer-{}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let open = |p: &std::path::Path, mode| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).map_err(|e| e.to_string())
        };
        open(&dir, 0o777)?;
        let users = dir.join("users.txt");
        std::fs::write(&users, format!("\"{admin_user}\" \"\"\n")).map_err(|e| e.to_string())?;
        open(&users, 0o644)?;
        let databases = format!("app = host=127.0.0.1 port={pg_port} dbname=app");
        let settings = format!("auth_type = trust\nauth_file = {}\nadmin_users = {admin_user}", users.display());
        let running =
            weir_testkit::pgbouncer::PgBouncer::start(&dir, &databases, &settings).map_err(|e| e.to_string())?;
        Ok(PgBouncer { port: running.port, _running: running })
    }

    /// PgBouncer's log so far.
    pub fn log(&self) -> String {
        self._running.log()
    }
}

/// What a console answered to one `SHOW`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Described {
    /// Column names and type OIDs, in order.
    Columns(Vec<(String, u32)>),
    /// No result set (PgBouncer's SHOW HELP is notices only).
    NoRows,
    /// The command failed (e.g. one this version lacks).
    Error(String),
}

const DESCRIBE: &str = r#"
import sys, psycopg
port, user, password = sys.argv[1:4]
conn = psycopg.connect(host="127.0.0.1", port=port, user=user, password=password, dbname="pgbouncer",
                       autocommit=True, prepare_threshold=None, connect_timeout=10)
for what in sys.argv[4:]:
    cur = conn.cursor()
    try:
        cur.execute("SHOW " + what)
    except psycopg.Error as e:
        print(what + "\tERROR\t" + str(e).splitlines()[0])
        continue
    if cur.description is None:
        print(what + "\tNONE")
    else:
        print(what + "\tCOLUMNS\t" + ",".join(d.name + ":" + str(d.type_code) for d in cur.description))
"#;

/// Runs `SHOW what` for each of `shows` on the console at 127.0.0.1:`port`
/// through psycopg, with the simple query protocol.
pub fn describe(port: u16, user: &str, password: &str, shows: &[&str]) -> Vec<(String, Described)> {
    let out = Command::new("python3")
        .args(["-c", DESCRIBE, &port.to_string(), user, password])
        .args(shows)
        .output()
        .expect("run python3");
    assert!(out.status.success(), "psycopg failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| {
            let mut parts = line.splitn(3, '\t');
            let what = parts.next().unwrap_or_default().to_owned();
            let described = match (parts.next(), parts.next()) {
                (Some("COLUMNS"), Some(cols)) => Described::Columns(
                    cols.split(',')
                        .map(|c| {
                            let (name, oid) = c.rsplit_once(':').expect("name:oid");
                            (name.to_owned(), oid.parse().expect("oid"))
                        })
                        .collect(),
                ),
                (Some("NONE"), _) => Described::NoRows,
                (_, rest) => Described::Error(rest.unwrap_or_default().to_owned()),
            };
            (what, described)
        })
        .collect()
}
