//! The console's SET as a sequence, as in PgBouncer: settings that must
//! agree (a TLS key and its certificate, a verify-* sslmode and its CA file)
//! are taken in any order and take effect once they agree; a value wrong on
//! its own is refused with what is wrong; min_pool_size above pool_size is
//! capped, not refused; `SET verbose` raises the log level; a v1 certificate
//! is taken as a v3 one is.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use weir_e2e::process::WeirProcess;
use weir_e2e::{bounded, connect, eventually, pg, Harness, Opts, PgOptions, TRUST_PASS, TRUST_USER};

/// A CA; two certificates for 127.0.0.1 with their keys (`a`, `b`) signed
/// by it as v3; and `v1`, the same but as X.509 v1 (no extensions), the way
/// `openssl x509 -req` makes it without -extfile.
const GEN_CERTS: &str = r#"set -e
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 -subj "/CN=ca" -keyout ca.key -out ca.crt 2>/dev/null
for n in a b v1; do
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=localhost" -keyout $n.key -out $n.csr 2>/dev/null
  printf "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n" > $n.ext
  if [ $n = v1 ]; then ext=""; else ext="-extfile $n.ext"; fi
  openssl x509 -req -in $n.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 $ext -out $n.crt 2>/dev/null
  chmod 600 $n.key
done
"#;

struct Certs(PathBuf);

impl Certs {
    fn new() -> Certs {
        let dir = std::env::temp_dir().join(format!("weir-setseq-{}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = Command::new("sh").arg("-c").arg(GEN_CERTS).current_dir(&dir).output().expect("run openssl");
        assert!(out.status.success(), "openssl failed: {}", String::from_utf8_lossy(&out.stderr));
        Certs(dir)
    }
    fn path(&self, name: &str) -> String {
        self.0.join(name).display().to_string()
    }
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A console command as `admin` with psql: (succeeded, stdout, stderr),
/// stderr holding the WARNINGs.
async fn console(port: u16, sql: &str) -> (bool, String, String) {
    let conn = format!("host=127.0.0.1 port={port} dbname=weir user=admin password=admin_pass connect_timeout=10");
    let out = tokio::process::Command::new("psql").args(["-XAtq", "-d", &conn, "-c", sql]).kill_on_drop(true).output();
    let out = tokio::time::timeout(Duration::from_secs(30), out).await.expect("psql in time").unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).trim().to_owned();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

/// The running value of `key` in SHOW CONFIG.
async fn shown(port: u16, key: &str) -> String {
    let (ok, out, err) = console(port, "SHOW CONFIG").await;
    assert!(ok, "{err}");
    let line = out.lines().find(|l| l.starts_with(&format!("{key}|"))).unwrap_or_else(|| panic!("{key}: {out}"));
    line.split('|').nth(1).unwrap_or_default().to_owned()
}

/// psql over TLS to weir, checking weir's certificate against the CA.
fn psql_tls(port: u16, ca: &str) -> Result<String, String> {
    psql_tls_mode(port, ca, "verify-full")
}

fn psql_tls_mode(port: u16, ca: &str, mode: &str) -> Result<String, String> {
    let conn = format!(
        "host=127.0.0.1 port={port} dbname=app user={TRUST_USER} password={TRUST_PASS} sslmode={mode} sslrootcert={ca} connect_timeout=10"
    );
    let out = Command::new("psql").args(["-XAtq", "-d", &conn, "-c", "select 'tls:' || 1"]).output().unwrap();
    match out.status.success() {
        true => Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned()),
        false => Err(String::from_utf8_lossy(&out.stderr).trim().to_owned()),
    }
}

/// Client TLS key and certificate rotated with two SETs, key first: the
/// first is held (a WARNING names the certificate it waits for), the
/// second puts both in effect. A missing file and a file with no
/// certificate are refused, naming the problem; a v1 certificate is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_key_and_certificate_set_in_either_order() {
    bounded(120, async {
        let certs = Certs::new();
        let general = format!(
            "client_tls_sslmode = \"require\"\nclient_tls_cert_file = \"{}\"\nclient_tls_key_file = \"{}\"\n",
            certs.path("a.crt"),
            certs.path("a.key")
        );
        let h = Harness::start(Opts { auth_type: "trust", general, ..Opts::default() }).await;
        let port = h.addr().port();
        let ca = certs.path("ca.crt");
        assert_eq!(
            tokio::task::spawn_blocking({
                let ca = ca.clone();
                move || psql_tls(port, &ca)
            })
            .await
            .unwrap(),
            Ok("tls:1".into())
        );

        let (ok, _, warning) = console(port, &format!("SET client_tls_key_file = '{}'", certs.path("b.key"))).await;
        assert!(ok, "the key alone is accepted, not refused: {warning}");
        assert!(
            warning.contains("WARNING") && warning.contains("client_tls_cert_file"),
            "names what it waits for: {warning}"
        );
        assert_eq!(shown(port, "client_tls_key_file").await, certs.path("a.key"), "not in effect yet");
        let (ok, _, err) = console(port, &format!("SET client_tls_cert_file = '{}'", certs.path("b.crt"))).await;
        assert!(ok, "{err}");
        assert_eq!(shown(port, "client_tls_key_file").await, certs.path("b.key"), "both in effect");
        assert_eq!(shown(port, "client_tls_cert_file").await, certs.path("b.crt"));
        assert_eq!(
            tokio::task::spawn_blocking({
                let ca = ca.clone();
                move || psql_tls(port, &ca)
            })
            .await
            .unwrap(),
            Ok("tls:1".into())
        );

        let (ok, _, err) = console(port, "SET client_tls_cert_file = '/nonexistent/x.crt'").await;
        assert!(!ok && err.contains("/nonexistent/x.crt"), "a missing file is refused by name: {err}");
        let (ok, _, err) = console(port, &format!("SET client_tls_cert_file = '{}'", certs.path("b.key"))).await;
        assert!(!ok && err.contains("no PEM certificate"), "{err}");
        assert_eq!(shown(port, "client_tls_cert_file").await, certs.path("b.crt"), "the running one stays");

        // A v1 certificate (its name only in the CN "localhost") is served.
        let (ok, _, warning) = console(port, &format!("SET client_tls_key_file = '{}'", certs.path("v1.key"))).await;
        assert!(ok && warning.contains("client_tls_cert_file"), "held until the certificate agrees: {warning}");
        let (ok, _, err) = console(port, &format!("SET client_tls_cert_file = '{}'", certs.path("v1.crt"))).await;
        assert!(ok, "{err}");
        let v1 = tokio::task::spawn_blocking(move || psql_tls_mode(port, &ca, "verify-ca")).await.unwrap();
        assert_eq!(v1, Ok("tls:1".into()));

        // check-config takes a file naming it.
        let toml = certs.0.join("v1.toml");
        let text =
            "[weir]\nauth_type = \"trust\"\nclient_tls_sslmode = \"require\"\nclient_tls_cert_file = \"v1.crt\"\n\
                    client_tls_key_file = \"v1.key\"\n[databases.app]\n";
        std::fs::write(&toml, text).unwrap();
        let out = Command::new(weir_e2e::process::weir_bin()).arg("check-config").arg(&toml).output().unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{said}");
    })
    .await;
}

/// `SET server_tls_sslmode = verify-full` before its CA file: held, then in
/// effect with the CA, and weir's server connections verify Postgres's
/// certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_sslmode_before_its_ca_file() {
    bounded(120, async {
        let certs = Certs::new();
        let mut pg_opts = PgOptions::default();
        pg_opts.extra_conf.push(("ssl".into(), "on".into()));
        pg_opts.extra_conf.push(("ssl_cert_file".into(), format!("'{}'", certs.path("a.crt"))));
        pg_opts.extra_conf.push(("ssl_key_file".into(), format!("'{}'", certs.path("a.key"))));
        if Command::new("id").arg("-u").output().map(|o| o.stdout.starts_with(b"0\n")).unwrap_or(false) {
            for f in ["a.crt", "a.key"] {
                assert!(Command::new("chown").args(["postgres", &certs.path(f)]).status().unwrap().success());
            }
        }
        let h = Harness::start(Opts { auth_type: "trust", pg: pg_opts, ..Opts::default() }).await;
        let port = h.addr().port();
        let (ok, _, warning) = console(port, "SET server_tls_sslmode = 'verify-full'").await;
        assert!(ok && warning.contains("server_tls_ca_file"), "held, naming the CA file: {warning}");
        assert_eq!(shown(port, "server_tls_sslmode").await, "disable");
        let (ok, _, err) = console(port, &format!("SET server_tls_ca_file = '{}'", certs.path("ca.crt"))).await;
        assert!(ok, "{err}");
        assert_eq!(shown(port, "server_tls_sslmode").await, "verify-full");
        let c = connect(&h.url(TRUST_USER, TRUST_PASS)).await.expect("login");
        c.simple_query("select 1").await.expect("a query over a verified TLS server connection");
        let ssl = h.psql(&format!(
            "select bool_and(s.ssl)::text from pg_stat_ssl s join pg_stat_activity a using (pid) where a.usename = '{TRUST_USER}'"
        ));
        assert_eq!(ssl, "true");
    })
    .await;
}

/// min_pool_size above pool_size is taken and capped by it, and changes
/// nothing else; SET verbose exists and brings debug lines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_pool_size_capped_and_verbose() {
    bounded(120, async {
        let pg = pg().await;
        let w = WeirProcess::start(&pg, "default_pool_size = 3", "").await;
        let mode = shown(w.port, "pool_mode").await;
        let (ok, _, err) = console(w.port, "SET min_pool_size = 10").await;
        assert!(ok, "accepted as in PgBouncer: {err}");
        assert_eq!(shown(w.port, "pool_mode").await, mode, "a SET changes only the key it names");
        assert_eq!(shown(w.port, "log_disconnections").await, "false", "nor PgBouncer's defaults for others");
        let dbs = weir_e2e::process::rows(&w.admin("SHOW DATABASES").await.unwrap());
        let app = dbs.iter().find(|r| r["name"] == "app").expect("app in SHOW DATABASES");
        assert_eq!((app["pool_size"].as_str(), app["min_pool_size"].as_str()), ("3", "3"), "capped by pool_size");

        assert!(!w.logs().contains(" DEBUG "), "no debug lines at verbose 0");
        let (ok, _, err) = console(w.port, "SET verbose = 1").await;
        assert!(ok, "{err}");
        assert_eq!(shown(w.port, "verbose").await, "1");
        // A user not in the auth_file is asked for a password all the same
        // (a debug line says so).
        assert!(connect(&w.url("ghost", "x")).await.is_err());
        assert!(eventually(weir_e2e::WAIT_LIMIT, || w.logs().contains(" DEBUG ")).await, "{}", w.logs());
    })
    .await;
}
