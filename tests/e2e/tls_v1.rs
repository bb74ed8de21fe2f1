//! X.509 v1 certificates (what `openssl x509 -req` makes without
//! extensions), which OpenSSL and so PgBouncer accept: weir serves one to
//! clients, checks a client's and Postgres's with verify-full, and refuses
//! one signed by another CA.

use std::sync::Arc;

use weir_e2e::{Harness, Opts, TRUST_PASS, TRUST_USER};

use crate::tls::{blocking, pg_with_ssl_as, psql, Certs};

/// Two v3 CAs; v1 certificates: weir's and Postgres's for 127.0.0.1 and a
/// client's for trust_user, signed by `ca`, and the same from `rogue_ca`.
const GEN_V1_CERTS: &str = r#"set -e
ca() { openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 -subj "/CN=$1" -keyout $1.key -out $1.crt 2>/dev/null; }
v1() {
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=$3" -keyout $1.key -out $1.csr 2>/dev/null
  openssl x509 -req -in $1.csr -CA $2.crt -CAkey $2.key -CAcreateserial -days 3650 -out $1.crt 2>/dev/null
  chmod 600 $1.key
  openssl x509 -in $1.crt -noout -text | grep -q 'Version: 1 (0x0)'
}
ca ca; ca rogue_ca
v1 server ca 127.0.0.1; v1 client ca trust_user
v1 rogue_server rogue_ca 127.0.0.1; v1 rogue_client rogue_ca trust_user
"#;

fn tls_lines(certs: &Certs, server_ca: &str) -> String {
    format!(
        "client_tls_sslmode = \"verify-full\"\nclient_tls_cert_file = \"{}\"\nclient_tls_key_file = \"{}\"\n\
         client_tls_ca_file = \"{}\"\nserver_tls_sslmode = \"verify-full\"\nserver_tls_ca_file = \"{}\"\n\
         query_wait_timeout = \"3s\"\n",
        certs.path("server.crt"),
        certs.path("server.key"),
        certs.path("ca.crt"),
        certs.path(server_ca),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_certificates_verify_full_both_ways() {
    let certs = Certs::generate(GEN_V1_CERTS);
    let opts = Opts {
        auth_type: "trust",
        general: tls_lines(&certs, "ca.crt"),
        pg: pg_with_ssl_as(&certs, "server"),
        ..Opts::default()
    };
    let h = Arc::new(Harness::start(opts).await);
    let client = |cert: &'static str| {
        let (h, ca) = (h.clone(), certs.path("ca.crt"));
        let (crt, key) = (certs.path(&format!("{cert}.crt")), certs.path(&format!("{cert}.key")));
        blocking(move || psql(&h, &format!("sslmode=verify-full sslrootcert={ca} sslcert={crt} sslkey={key}")))
    };
    // psql checks weir's v1 certificate for 127.0.0.1 (its CN), weir checks
    // the client's and Postgres's.
    assert_eq!(client("client").await.as_deref(), Ok("tls:1"));
    let ssl = h.psql(&format!(
        "select bool_and(s.ssl) || ':' || count(*) from pg_stat_ssl s join pg_stat_activity a using (pid) where a.usename = '{TRUST_USER}'"
    ));
    assert_eq!(ssl, "true:1", "weir's server connection uses TLS");
    let rogue = client("rogue_client").await;
    assert!(rogue.as_ref().is_err_and(|e| e.contains("alert unknown ca")), "{rogue:?}");
    // psql trusting only the rogue CA refuses weir's certificate.
    let (h2, rogue_ca) = (h.clone(), certs.path("rogue_ca.crt"));
    let bad = blocking(move || psql(&h2, &format!("sslmode=verify-full sslrootcert={rogue_ca}"))).await;
    assert!(bad.as_ref().is_err_and(|e| e.contains("certificate verify failed")), "{bad:?}");
    assert_eq!(client("client").await.as_deref(), Ok("tls:1"), "the pool is unharmed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v1_server_certificate_from_another_ca_is_refused() {
    let certs = Certs::generate(GEN_V1_CERTS);
    let general = format!(
        "server_tls_sslmode = \"verify-full\"\nserver_tls_ca_file = \"{}\"\nquery_wait_timeout = \"3s\"\n",
        certs.path("ca.crt")
    );
    let opts = Opts { auth_type: "trust", general, pg: pg_with_ssl_as(&certs, "rogue_server"), ..Opts::default() };
    let h = Harness::start(opts).await;
    let err =
        match tokio::time::timeout(crate::tls::LIMIT, weir_e2e::connect(&h.url(TRUST_USER, TRUST_PASS))).await.unwrap()
        {
            Ok(c) => {
                c.query_one("select 1", &[]).await.expect_err("no server connection with a certificate from another CA")
            }
            Err(e) => e,
        };
    let text = format!("{err:?}");
    assert!(text.contains("certificate verify failed") && text.contains("UnknownIssuer"), "{text}");
}
