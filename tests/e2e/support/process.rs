//! weir as the built binary in a child process, for tests that need what
//! only a process has: signals, its own global metrics recorder (scraped over
//! HTTP), and an exit. The binary is built once per test run with
//! `cargo build --workspace --bins` (a no-op when it is fresh: the same
//! selection as `scripts/run-tests.py`'s, so the same features), or taken
//! from `WEIR_BIN`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use weir_testkit::{PgServer, APP_DB, MD5_PASS, MD5_USER, SCRAM_PASS, SCRAM_USER, TRUST_PASS, TRUST_USER};

/// The console users every process config has.
pub const ADMIN_USER: &str = "admin";
pub const ADMIN_PASS: &str = "admin_pass";
pub const STATS_USER: &str = "stats";
pub const STATS_PASS: &str = "stats_pass";

/// The weir binary, built on first use.
pub fn weir_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(p) = std::env::var_os("WEIR_BIN") {
            return PathBuf::from(p);
        }
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf();
        let status = Command::new(env!("CARGO"))
            .args(["build", "--quiet", "--workspace", "--bins"])
            .current_dir(&root)
            .status()
            .expect("run cargo build for the weir binary");
        assert!(status.success(), "cargo build --workspace --bins failed");
        // Test binaries live in <target>/<profile>/deps; the weir binary one level up.
        let exe = std::env::current_exe().expect("test binary path");
        let profile_dir = exe.parent().and_then(Path::parent).expect("target profile dir");
        let bin = profile_dir.join("weir");
        assert!(bin.exists(), "{} was not built", bin.display());
        bin
    })
    .clone()
}

/// A running weir process with its own config and userlist in a temp dir.
pub struct WeirProcess {
    weir: WeirChild,
    pub dir: PathBuf,
    pub config_path: PathBuf,
    pub port: u16,
    pub metrics_port: u16,
    pg_port: u16,
}

impl WeirProcess {
    /// Starts weir in front of `pg` with extra `[weir]` lines (`general`) and
    /// extra `[databases.app]` lines; waits until it accepts connections.
    pub async fn start(pg: &PgServer, general: &str, database: &str) -> WeirProcess {
        let dir = pg.data_dir().parent().unwrap().join(format!("weir-proc-{}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("userlist.txt"), userlist()).unwrap();
        let [port, metrics_port] = weir_testkit::free_ports();
        let config_path = dir.join("weir.toml");
        write_config(&config_path, [port, metrics_port, pg.port()], general, database);
        let weir = WeirChild::spawn(dir.clone(), &config_path);
        let p = WeirProcess { weir, dir, config_path, port, metrics_port, pg_port: pg.port() };
        let ready =
            crate::eventually(Duration::from_secs(30), || TcpStream::connect(("127.0.0.1", p.port)).is_ok()).await;
        assert!(ready, "weir did not start listening; its log:\n{}", p.logs());
        p
    }

    /// Rewrites the config file (a later SIGHUP or RELOAD applies it).
    pub fn write_config(&self, general: &str, database: &str) {
        write_config(&self.config_path, [self.port, self.metrics_port, self.pg_port], general, database);
    }

    pub fn pid(&self) -> u32 {
        self.weir.child.id()
    }

    /// Sends a signal by name ("HUP", "TERM", "INT").
    pub fn signal(&self, name: &str) {
        let ok = Command::new("kill").arg(format!("-{name}")).arg(self.pid().to_string()).status().unwrap().success();
        assert!(ok, "kill -{name} failed");
    }

    /// The exit status once the process has ended, within `limit`.
    pub async fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let end = Instant::now() + limit;
        loop {
            if let Some(status) = self.weir.child.try_wait().unwrap() {
                return Some(status);
            }
            if Instant::now() >= end {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// weir's stderr so far.
    pub fn logs(&self) -> String {
        self.weir.logs()
    }

    /// A connection string to weir for database `db`.
    pub fn url_for(&self, user: &str, password: &str, db: &str) -> String {
        format!("postgres://{user}:{password}@127.0.0.1:{}/{db}", self.port)
    }

    /// A connection string to weir's `app` database.
    pub fn url(&self, user: &str, password: &str) -> String {
        self.url_for(user, password, APP_DB)
    }

    /// Runs `psql -c sql` against weir; Ok(stdout) or Err(stderr). Unaligned
    /// output, `|` between fields, header included.
    pub async fn psql(&self, user: &str, password: &str, db: &str, sql: &str) -> Result<String, String> {
        psql_at(self.port, user, password, db, sql).await
    }

    /// The console as the admin user.
    pub async fn admin(&self, sql: &str) -> Result<String, String> {
        self.psql(ADMIN_USER, ADMIN_PASS, "weir", sql).await
    }

    /// The SHOW POOLS row of `app` for `user`, as column -> value.
    pub async fn pool_row(&self, user: &str) -> std::collections::HashMap<String, String> {
        let out = self.admin("SHOW POOLS").await.expect("SHOW POOLS");
        let row = rows(&out).into_iter().find(|r| r["database"] == APP_DB && r["user"] == user);
        row.unwrap_or_else(|| panic!("no SHOW POOLS row for {user}: {out}"))
    }

    /// GET `path` on the metrics port: (status code, body, time taken).
    pub fn http_get(&self, path: &str) -> (u16, String, Duration) {
        http_get(self.metrics_port, path)
    }

    /// The /metrics text.
    pub fn metrics(&self) -> String {
        metrics_text(self.metrics_port)
    }
}

/// Writes the config `WeirProcess` runs on: `ports` are weir's, its
/// metrics' and Postgres's.
fn write_config(path: &Path, ports: [u16; 3], general: &str, database: &str) {
    let [port, metrics_port, pg_port] = ports;
    let text = format!(
        r#"[weir]
listen_addr = "127.0.0.1:{port}"
auth_type = "md5"
auth_file = "userlist.txt"
server_login_retry = "200ms"
admin_users = ["{ADMIN_USER}"]
stats_users = ["{STATS_USER}"]
{general}
[metrics]
listen_addr = "127.0.0.1:{metrics_port}"
[databases.app]
host = "127.0.0.1"
port = {pg_port}
{database}
"#
    );
    std::fs::write(path, text).unwrap();
}

/// A running weir binary and its temp dir. On drop it is killed, its log is
/// printed when the test panicked, and the dir is removed.
pub struct WeirChild {
    child: Child,
    dir: PathBuf,
}

impl WeirChild {
    /// Starts `weir --config config` at log level info, its stderr in
    /// `dir/weir.log`.
    pub fn spawn(dir: PathBuf, config: &Path) -> WeirChild {
        let log = std::fs::File::create(dir.join("weir.log")).unwrap();
        let child = Command::new(weir_bin())
            .arg("--config")
            .arg(config)
            .env("WEIR_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn weir");
        WeirChild { child, dir }
    }

    /// weir's stderr so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(self.dir.join("weir.log")).unwrap_or_default()
    }
}

impl Drop for WeirChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- weir log ---\n{}", self.logs());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The /metrics text of a weir whose metrics listen on `port`.
pub fn metrics_text(port: u16) -> String {
    let (status, body, _) = http_get(port, "/metrics");
    assert_eq!(status, 200, "{body}");
    body
}

fn userlist() -> String {
    [
        (SCRAM_USER, SCRAM_PASS),
        (MD5_USER, MD5_PASS),
        (TRUST_USER, TRUST_PASS),
        (ADMIN_USER, ADMIN_PASS),
        (STATS_USER, STATS_PASS),
    ]
    .iter()
    .map(|(u, p)| format!("\"{u}\" \"{p}\"\n"))
    .collect()
}

/// `psql -XAtq -v ON_ERROR_STOP=1 -c sql` (the binary `psql`) over the Unix
/// socket `dir/.s.PGSQL.port`, to database `app`: its trimmed output, or
/// its stderr.
pub async fn psql_over_socket(
    psql: &Path,
    dir: &Path,
    port: u16,
    user: &str,
    password: &str,
    sql: &str,
) -> Result<String, String> {
    let out = tokio::process::Command::new(psql)
        .args(["-h", &dir.display().to_string(), "-p", &port.to_string(), "-U", user, "-d", crate::APP_DB])
        .args(["-XAtq", "-v", "ON_ERROR_STOP=1", "-c", sql])
        .env("PGPASSWORD", password)
        .env_remove("PGHOST")
        .env_remove("PGPORT")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), out)
        .await
        .map_err(|_| "psql over the socket: no answer in 60 s".to_owned())?
        .map_err(|e| format!("run psql: {e}"))?;
    if !out.status.success() {
        return Err(format!("psql over {}/.s.PGSQL.{port}: {}", dir.display(), String::from_utf8_lossy(&out.stderr)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// `psql -X -A -F'|' -v ON_ERROR_STOP=1 -c sql` against 127.0.0.1:`port`, bounded by 60 s.
pub async fn psql_at(port: u16, user: &str, password: &str, db: &str, sql: &str) -> Result<String, String> {
    let out = tokio::process::Command::new("psql")
        .args([
            "-X",
            "-A",
            "-F",
            "|",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-U",
            user,
            "-d",
            db,
            "-c",
            sql,
        ])
        .env("PGPASSWORD", password)
        .env("PGCONNECT_TIMEOUT", "10")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), out)
        .await
        .map_err(|_| "psql timed out".to_string())?
        .map_err(|e| e.to_string())?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.success() {
        Ok(stdout)
    } else {
        Err(format!("{stderr}{stdout}"))
    }
}

/// Rows of unaligned psql output as maps column → value.
pub fn rows(psql_out: &str) -> Vec<std::collections::HashMap<String, String>> {
    // Skips blank lines and psql's "(N rows)" footer.
    let is_footer = |l: &str| l.starts_with('(') && l.ends_with(')');
    let mut lines = psql_out.lines().filter(|l| !l.is_empty() && !is_footer(l));
    let Some(header) = lines.next() else { return Vec::new() };
    let cols: Vec<&str> = header.split('|').collect();
    lines.map(|l| cols.iter().map(|c| c.to_string()).zip(l.split('|').map(str::to_owned)).collect()).collect()
}

/// A blocking HTTP/1.1 GET on 127.0.0.1:`port`.
pub fn http_get(port: u16, path: &str) -> (u16, String, Duration) {
    let started = Instant::now();
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect to the metrics port");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).expect("read the HTTP response");
    let elapsed = started.elapsed();
    let status = raw.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = raw.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body, elapsed)
}

/// The sum of every sample of `name` whose labels include all of `labels`.
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, rest) = series.split_once('{').unwrap_or((series, ""));
            let wanted = n == name && labels.iter().all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")));
            wanted.then(|| value.parse::<f64>().ok()).flatten()
        })
        .sum()
}
