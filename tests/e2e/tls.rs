//! TLS towards clients (client_tls_sslmode): each mode with psql (libpq
//! over OpenSSL) and with a raw rustls client for what psql 15 cannot do:
//! direct TLS (sslnegotiation=direct, ALPN "postgresql") and a CancelRequest
//! inside a TLS session. Certificates are made by the openssl CLI per test.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use weir::protocol::messages;
use weir::protocol::tags::{backend as be, startup as code};
use weir_e2e::raw::{error_fields, startup, Raw};
use weir_e2e::{pg, Harness, Opts, APP_DB, TRUST_PASS, TRUST_USER};

pub(crate) const LIMIT: Duration = Duration::from_secs(20);

/// A CA, weir's certificate for 127.0.0.1 signed by it, a client certificate
/// signed by it, and a rogue CA with a client and a server certificate of its own.
const GEN_CERTS: &str = r#"set -e
ca() { openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 -subj "/CN=$1" -keyout $1.key -out $1.crt 2>/dev/null; }
leaf() {
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=$4" -keyout $1.key -out $1.csr 2>/dev/null
  printf "$3" > $1.ext
  openssl x509 -req -in $1.csr -CA $2.crt -CAkey $2.key -CAcreateserial -days 3650 -extfile $1.ext -out $1.crt 2>/dev/null
  chmod 600 $1.key
}
ca ca; ca rogue_ca
leaf server ca "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n" localhost
leaf client ca "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n" trust_user
leaf rogue_client rogue_ca "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n" trust_user
leaf rogue_server rogue_ca "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n" localhost
"#;

pub(crate) struct Certs(PathBuf);

impl Certs {
    pub(crate) fn new() -> Certs {
        Certs::generate(GEN_CERTS)
    }
    /// The files a shell `script` makes with the openssl CLI.
    pub(crate) fn generate(script: &str) -> Certs {
        let dir = std::env::temp_dir().join(format!("weir-tls-{}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = Command::new("sh").arg("-c").arg(script).current_dir(&dir).output().expect("run openssl");
        assert!(out.status.success(), "openssl failed: {}", String::from_utf8_lossy(&out.stderr));
        Certs(dir)
    }
    pub(crate) fn path(&self, name: &str) -> String {
        self.0.join(name).display().to_string()
    }
    /// `[weir]` lines for a mode, with weir's certificate and the CA.
    pub(crate) fn general(&self, mode: &str) -> String {
        format!(
            "client_tls_sslmode = \"{mode}\"\nclient_tls_cert_file = \"{}\"\nclient_tls_key_file = \"{}\"\nclient_tls_ca_file = \"{}\"\n",
            self.path("server.crt"),
            self.path("server.key"),
            self.path("ca.crt")
        )
    }
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn start(certs: &Certs, mode: &str) -> Harness {
    Harness::start(Opts { auth_type: "trust", general: certs.general(mode), ..Opts::default() }).await
}

/// Runs `select 1` through weir with psql and the given connection options.
pub(crate) fn psql(h: &Harness, opts: &str) -> Result<String, String> {
    let conn = format!(
        "host=127.0.0.1 port={} dbname={APP_DB} user={TRUST_USER} password={TRUST_PASS} connect_timeout=10 {opts}",
        h.addr().port()
    );
    let out = Command::new("psql").args(["-XAtq", "-d", &conn, "-c", "select 'tls:' || 1"]).output().expect("run psql");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

pub(crate) async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::time::timeout(LIMIT, tokio::task::spawn_blocking(f)).await.expect("bounded").unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_serves_tls_and_refuses_plaintext() {
    let certs = Certs::new();
    let h = Arc::new(start(&certs, "require").await);
    let h2 = h.clone();
    let ok = blocking(move || psql(&h2, "sslmode=require")).await;
    assert_eq!(ok.as_deref(), Ok("tls:1"));
    let h2 = h.clone();
    let refused = blocking(move || psql(&h2, "sslmode=disable")).await.expect_err("plaintext refused");
    assert!(refused.contains("SSL required"), "{refused}");
    let e = weir_e2e::connect(&h.url(TRUST_USER, TRUST_PASS)).await.expect_err("tokio-postgres without TLS is refused");
    assert_eq!(weir_e2e::sqlstate(&e).as_deref(), Some("28000"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_full_client_checks_weirs_certificate() {
    let certs = Certs::new();
    let h = Arc::new(start(&certs, "prefer").await);
    let (h2, ca) = (h.clone(), certs.path("ca.crt"));
    let ok = blocking(move || psql(&h2, &format!("sslmode=verify-full sslrootcert={ca}"))).await;
    assert_eq!(ok.as_deref(), Ok("tls:1"));
    let (h2, rogue) = (h.clone(), certs.path("rogue_ca.crt"));
    let bad = blocking(move || psql(&h2, &format!("sslmode=verify-full sslrootcert={rogue}"))).await;
    assert!(bad.as_ref().is_err_and(|e| e.contains("certificate verify failed")), "{bad:?}");
    // prefer also serves plaintext clients.
    let h2 = h.clone();
    assert_eq!(blocking(move || psql(&h2, "sslmode=disable")).await.as_deref(), Ok("tls:1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_ca_requires_a_client_certificate_that_verifies() {
    let certs = Certs::new();
    let h = Arc::new(start(&certs, "verify-ca").await);
    let with = |cert: &str| {
        let (h, cert, key) = (h.clone(), certs.path(&format!("{cert}.crt")), certs.path(&format!("{cert}.key")));
        blocking(move || psql(&h, &format!("sslmode=require sslcert={cert} sslkey={key}")))
    };
    assert_eq!(with("client").await.as_deref(), Ok("tls:1"));
    let rogue = with("rogue_client").await;
    assert!(
        rogue.as_ref().is_err_and(|e| e.contains("alert unknown ca")),
        "a client certificate from another CA is refused: {rogue:?}"
    );
    let h2 = h.clone();
    let none = blocking(move || psql(&h2, "sslmode=require sslcert=/nonexistent sslkey=/nonexistent")).await;
    assert!(
        none.as_ref().is_err_and(|e| e.contains("alert certificate required")),
        "no client certificate is refused: {none:?}"
    );
    // The pool is unharmed: a good client still gets in.
    assert_eq!(with("client").await.as_deref(), Ok("tls:1"));
}

fn connector(ca: &Path) -> tokio_rustls::TlsConnector {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"postgresql".to_vec()];
    tokio_rustls::TlsConnector::from(Arc::new(cfg))
}

/// TLS through SSLRequest (`direct` false) or a ClientHello at once.
async fn tls_connect(h: &Harness, ca: &Path, direct: bool) -> tokio_rustls::client::TlsStream<TcpStream> {
    let mut tcp = TcpStream::connect(h.addr()).await.unwrap();
    if !direct {
        tcp.write_all(&messages::encryption_request(code::SSL_REQUEST)).await.unwrap();
        assert_eq!(tcp.read_u8().await.unwrap(), b'S');
    }
    let name = ServerName::try_from("127.0.0.1").unwrap();
    connector(ca).connect(name, tcp).await.expect("TLS handshake with weir")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_tls_and_a_cancel_inside_tls() {
    let certs = Certs::new();
    let h = start(&certs, "require").await;
    let ca = certs.0.join("ca.crt");
    tokio::time::timeout(LIMIT, async {
        let mut s = Raw::new(tls_connect(&h, &ca, true).await);
        s.start(TRUST_USER, TRUST_PASS, &[]).await.expect("login over direct TLS");
        let (pid, secret) = s.key();
        s.send_query("select pg_sleep(60)").await.unwrap();
        // Let the query reach Postgres, then cancel it over a second TLS session.
        assert!(
            weir_e2e::eventually(weir_e2e::WAIT_LIMIT, || h
                .psql("select count(*) from pg_stat_activity where query = 'select pg_sleep(60)'")
                == "1")
            .await
        );
        let mut c = tls_connect(&h, &ca, false).await;
        c.write_all(&messages::cancel_request(pid, secret)).await.unwrap();
        c.flush().await.unwrap();
        let cancelled = s.reply().await.unwrap();
        assert_eq!(cancelled.code(), Some("57014"), "the sleep was cancelled: {cancelled:?}");
        // The session goes on over TLS.
        let tags: Vec<u8> = s.exchange(&weir_e2e::raw::query("select 1")).await.iter().map(|(t, _)| *t).collect();
        assert_eq!(tags, b"TDCZ");
    })
    .await
    .expect("bounded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_pipelined_after_ssl_request_is_a_protocol_violation() {
    let certs = Certs::new();
    let h = start(&certs, "prefer").await;
    tokio::time::timeout(LIMIT, async {
        let mut c = Raw::connect(h.addr()).await;
        let mut both = messages::encryption_request(code::SSL_REQUEST).to_vec();
        both.extend_from_slice(&startup(&[("user", TRUST_USER), ("database", APP_DB)]));
        c.send(&both).await.unwrap();
        let (tag, body) = c.read_msg().await.unwrap();
        assert_eq!(
            (tag, error_fields(&body).0.as_str()),
            (be::ERROR_RESPONSE, "08P01"),
            "never 'S', never plaintext accepted"
        );
    })
    .await
    .expect("bounded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disable_answers_n_and_reload_picks_up_new_certificates() {
    let certs = Certs::new();
    let h = Harness::start(Opts { auth_type: "trust", ..Opts::default() }).await;
    let mut tcp = TcpStream::connect(h.addr()).await.unwrap();
    tcp.write_all(&messages::encryption_request(code::SSL_REQUEST)).await.unwrap();
    assert_eq!(tokio::time::timeout(LIMIT, tcp.read_u8()).await.unwrap().unwrap(), b'N');
    drop(tcp);
    // RELOAD turns TLS on with the CA's certificate ...
    let mut cfg = (*h.weir().shared().config.load()).clone();
    cfg.weir.client_tls_sslmode = weir::config::ClientTlsMode::Require;
    cfg.weir.client_tls_cert_file = Some(certs.0.join("server.crt"));
    cfg.weir.client_tls_key_file = Some(certs.0.join("server.key"));
    h.weir().reload(cfg.clone()).expect("reload with TLS");
    let _ = tokio::time::timeout(LIMIT, tls_connect(&h, &certs.0.join("ca.crt"), false)).await.expect("bounded");
    // ... and a later RELOAD reads the files again: the rogue CA's certificate now.
    cfg.weir.client_tls_cert_file = Some(certs.0.join("rogue_server.crt"));
    cfg.weir.client_tls_key_file = Some(certs.0.join("rogue_server.key"));
    h.weir().reload(cfg.clone()).expect("reload with new certificate");
    let _ = tokio::time::timeout(LIMIT, tls_connect(&h, &certs.0.join("rogue_ca.crt"), false)).await.expect("bounded");
    // A reload whose key does not load is refused; the running certificate stays.
    cfg.weir.client_tls_key_file = Some(certs.0.join("ca.srl"));
    assert!(h.weir().reload(cfg).is_err());
    let _ = tokio::time::timeout(LIMIT, tls_connect(&h, &certs.0.join("rogue_ca.crt"), false)).await.expect("bounded");
}

/// A Postgres with ssl = on and the CA-signed certificate for 127.0.0.1.
fn pg_with_ssl(certs: &Certs) -> weir_e2e::PgOptions {
    pg_with_ssl_as(certs, "server")
}

/// A Postgres with ssl = on and the certificate `name`.crt (key `name`.key).
/// Postgres wants its key owned by its own user with mode 0600.
pub(crate) fn pg_with_ssl_as(certs: &Certs, name: &str) -> weir_e2e::PgOptions {
    let run_as_root = Command::new("id").arg("-u").output().map(|o| o.stdout.starts_with(b"0\n")).unwrap_or(false);
    let (crt, key) = (certs.path(&format!("{name}.crt")), certs.path(&format!("{name}.key")));
    if run_as_root {
        for f in [&crt, &key] {
            let st = Command::new("chown").args(["postgres", f]).status().expect("chown");
            assert!(st.success());
        }
    }
    let mut pg = weir_e2e::PgOptions::default();
    pg.extra_conf.push(("ssl".into(), "on".into()));
    pg.extra_conf.push(("ssl_cert_file".into(), format!("'{crt}'")));
    pg.extra_conf.push(("ssl_key_file".into(), format!("'{key}'")));
    pg
}

fn server_tls(mode: &str, ca: &str) -> String {
    format!("server_tls_sslmode = \"{mode}\"\nserver_tls_ca_file = \"{ca}\"\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_verify_full_encrypts_weirs_connections_to_postgres() {
    let certs = Certs::new();
    let opts = Opts {
        auth_type: "trust",
        general: server_tls("verify-full", &certs.path("ca.crt")),
        pg: pg_with_ssl(&certs),
        ..Opts::default()
    };
    let h = Harness::start(opts).await;
    let c = tokio::time::timeout(LIMIT, weir_e2e::connect(&h.url(TRUST_USER, TRUST_PASS))).await.unwrap().unwrap();
    let got: i32 = tokio::time::timeout(LIMIT, c.query_one("select 41 + 1", &[])).await.unwrap().unwrap().get(0);
    assert_eq!(got, 42);
    // Many round trips and a large result over the TLS server connection.
    let rows = c.query("select repeat('x', 1000) from generate_series(1, 2000)", &[]).await.unwrap();
    assert_eq!(rows.len(), 2000);
    let ssl = h.psql(&format!(
        "select bool_and(s.ssl) || ':' || count(*) from pg_stat_ssl s join pg_stat_activity a using (pid) where a.usename = '{TRUST_USER}'"
    ));
    assert_eq!(ssl, "true:1", "weir's server connection uses TLS");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_certificate_from_another_ca_fails_with_a_clear_error() {
    let certs = Certs::new();
    let opts = Opts {
        auth_type: "trust",
        general: format!("{}query_wait_timeout = \"2s\"\n", server_tls("verify-ca", &certs.path("rogue_ca.crt"))),
        pg: pg_with_ssl(&certs),
        ..Opts::default()
    };
    let h = Harness::start(opts).await;
    let err = match tokio::time::timeout(LIMIT, weir_e2e::connect(&h.url(TRUST_USER, TRUST_PASS))).await.unwrap() {
        Ok(c) => c.query_one("select 1", &[]).await.expect_err("no server connection without a verified certificate"),
        Err(e) => e,
    };
    let text = format!("{err:?}");
    assert!(text.contains("server_tls_sslmode = verify-ca") && text.contains("certificate"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_require_refuses_a_postgres_without_tls_and_prefer_falls_back() {
    let pg = Arc::new(pg().await);
    let general = "server_tls_sslmode = \"require\"\nquery_wait_timeout = \"2s\"\n".to_string();
    let h = Harness::start_with(pg.clone(), Opts { auth_type: "trust", general, ..Opts::default() }).await;
    let err = match tokio::time::timeout(LIMIT, weir_e2e::connect(&h.url(TRUST_USER, TRUST_PASS))).await.unwrap() {
        Ok(c) => c.query_one("select 1", &[]).await.expect_err("require: no plaintext fallback"),
        Err(e) => e,
    };
    assert!(format!("{err:?}").contains("does not accept TLS"), "{err:?}");
    drop(h);
    let general = "server_tls_sslmode = \"prefer\"\n".to_string();
    let h = Harness::start_with(pg, Opts { auth_type: "trust", general, ..Opts::default() }).await;
    let c = tokio::time::timeout(LIMIT, weir_e2e::connect(&h.url(TRUST_USER, TRUST_PASS))).await.unwrap().unwrap();
    let got: i32 = c.query_one("select 1", &[]).await.unwrap().get(0);
    assert_eq!(got, 1);
}

/// A TCP forwarder to `upstream` that records the first 8 bytes each
/// connection sent (an SSLRequest, a CancelRequest, a StartupMessage's start).
async fn recording_forwarder(upstream: std::net::SocketAddr) -> (u16, Arc<std::sync::Mutex<Vec<[u8; 8]>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut down, _)) = listener.accept().await {
            let record = record.clone();
            tokio::spawn(async move {
                let mut first = [0u8; 8];
                if down.read_exact(&mut first).await.is_err() {
                    return;
                }
                record.lock().unwrap().push(first);
                let Ok(mut up) = TcpStream::connect(upstream).await else { return };
                if up.write_all(&first).await.is_ok() {
                    let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                }
            });
        }
    });
    (port, seen)
}

/// With TLS towards Postgres, a cancel goes over TLS too (SSLRequest, the
/// handshake, then the CancelRequest), as libpq 17 sends it: no connection
/// to Postgres ever starts with a plaintext CancelRequest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_tls_cancels_go_over_tls() {
    let certs = Certs::new();
    let general = server_tls("require", &certs.path("ca.crt"));
    let opts = Opts { auth_type: "trust", general, pg: pg_with_ssl(&certs), ..Opts::default() };
    let h = Harness::start(opts).await;
    let (port, seen) = recording_forwarder(format!("127.0.0.1:{}", h.pg.port()).parse().unwrap()).await;
    let mut cfg = (*h.weir().shared().config.load()).clone();
    cfg.databases.get_mut("app").unwrap().port = weir::config::Ports::one(port);
    h.weir().reload(cfg).expect("reload towards the forwarder");
    let c = tokio::time::timeout(LIMIT, weir_e2e::connect(&h.url(TRUST_USER, TRUST_PASS))).await.unwrap().unwrap();
    let token = c.cancel_token();
    let direct = h.direct().await;
    let canceller = tokio::spawn(async move {
        weir_e2e::until_running(&direct, "select pg_sleep(20)", 1).await;
        token.cancel_query(tokio_postgres::NoTls).await
    });
    let err = tokio::time::timeout(LIMIT, c.simple_query("select pg_sleep(20)")).await.unwrap().unwrap_err();
    canceller.await.unwrap().unwrap();
    assert_eq!(weir_e2e::sqlstate(&err).as_deref(), Some("57014"), "{err:?}");
    let codes: Vec<i32> = seen.lock().unwrap().iter().map(|b| i32::from_be_bytes([b[4], b[5], b[6], b[7]])).collect();
    assert!(codes.len() >= 2, "a server connection and a cancel connection: {codes:?}");
    assert!(codes.iter().all(|&c| c == code::SSL_REQUEST), "every connection to Postgres starts TLS: {codes:?}");
    assert!(!codes.contains(&code::CANCEL_REQUEST));
}
