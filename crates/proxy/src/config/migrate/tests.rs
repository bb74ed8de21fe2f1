//! migrate-config's tests: ini shapes in, weir.toml and warnings out.

use super::*;
use crate::config::{AuthType, Config, PoolMode};
use std::time::Duration;

const SAMPLE: &str = r#"
; a typical production pgbouncer.ini
[databases]
app = host=10.0.0.5 port=5433 dbname=app_prod pool_size=40 reserve_pool=5
reports = host=10.0.0.6 dbname='reports db' pool_mode=session user=reporter password=secret connect_query='SELECT 1' application_name=rep client_encoding=UTF8 datestyle=ISO timezone=UTC auth_user=pgb min_pool_size=2 max_db_connections=9 max_db_client_connections=5
* = host=10.0.0.7 auth_user=pgb

[pgbouncer]
listen_addr = *
listen_port = 6543
auth_type = scram-sha-256
auth_file = /etc/pgbouncer/userlist.txt
pool_mode = transaction
max_client_conn = 2000
default_pool_size = 25
query_wait_timeout = 5 ; must sit below your client's own deadline
server_idle_timeout = 0
query_timeout = 0
server_login_retry = 0.5
tcp_user_timeout = 9000
tcp_keepalive = 1
log_connections = 0
admin_users = admin, ops
ignore_startup_parameters = extra_float_digits,search_path
server_tls_protocols = secure
server_tls_ciphers = fast
logfile = /var/log/pgbouncer.log
stats_period = 60
frobnicate = 3

autodb_idle_timeout = 600
max_user_connections = 50

[users]
reporter = pool_mode=session pool_size=3 max_user_connections=7 query_timeout=5
"#;

#[test]
fn sample_migrates_to_a_valid_config() {
    let m = from_pgbouncer_ini(SAMPLE);
    let cfg =
        Config::from_toml(&m.toml, std::path::Path::new("/etc/weir")).unwrap_or_else(|e| panic!("{e}\n{}", m.toml));
    let g = &cfg.weir;
    assert_eq!(g.listen_addr.to_string(), "*:6543");
    assert_eq!(g.unix_socket_dir, "/tmp", "PgBouncer's default socket folder is kept");
    assert_eq!(g.auth_type, AuthType::ScramSha256);
    assert_eq!(g.max_client_conn, 2000);
    assert_eq!(g.default_pool_size, 25);
    assert_eq!(g.query_wait_timeout, Duration::from_secs(5));
    assert_eq!(g.server_login_retry, Duration::from_millis(500));
    assert_eq!(g.tcp_user_timeout, Some(Duration::from_secs(9)));
    assert_eq!(g.query_timeout, None);
    assert_eq!(g.stats_period, Duration::from_secs(60));
    assert!(g.tcp_keepalive && !g.log_connections);
    assert_eq!(g.admin_users, vec!["admin", "ops"]);
    assert_eq!(g.ignore_startup_parameters, vec!["extra_float_digits", "search_path"]);
    let app = cfg.pool_settings("app").unwrap();
    assert_eq!((app.host.as_str(), app.port, app.dbname.as_str()), ("10.0.0.5", 5433, "app_prod"));
    assert_eq!((app.pool_size, app.reserve_pool_size), (40, 5));
    let reports = cfg.pool_settings("reports").unwrap();
    assert_eq!((reports.dbname.as_str(), reports.pool_mode), ("reports db", PoolMode::Session));
    assert_eq!((reports.min_pool_size, reports.max_db_connections), (2, 9));
    assert_eq!(reports.connect_query, "SELECT 1");
    let want = [("client_encoding", "UTF8"), ("DateStyle", "ISO"), ("TimeZone", "UTC"), ("application_name", "rep")];
    assert_eq!(reports.startup_params, want.map(|(k, v)| (k.to_owned(), v.to_owned())));
    assert_eq!(cfg.forced_user("reports"), Some(("reporter", Some("secret"))));
    assert_eq!((cfg.auth_user("reports"), cfg.auth_user("unlisted")), ("pgb", "pgb"));
    assert_eq!(cfg.databases.len(), 3);
    let fallback = cfg.pool_settings("unlisted").unwrap();
    assert!(fallback.auto && fallback.host == "10.0.0.7" && fallback.dbname == "unlisted");
    assert!(!app.auto);
    assert_eq!(g.autodb_idle_timeout, Duration::from_secs(600));
    assert_eq!(g.max_user_connections, 50);
    let user = cfg.pool_settings_for("app", Some("reporter")).unwrap();
    assert_eq!((user.pool_mode, user.pool_size, user.max_user_connections), (PoolMode::Session, 3, 7));
}

#[test]
fn any_plain_and_pgbouncers_log_defaults_migrate() {
    for auth in ["any", "plain"] {
        let m = from_pgbouncer_ini(&format!(
            "[pgbouncer]\nauth_type = {auth}\nauth_file = u.txt\n[databases]\napp = host=db user=u\n"
        ));
        let cfg = Config::from_toml(&m.toml, std::path::Path::new(".")).expect("valid");
        assert_eq!(serde_json_like(cfg.weir.auth_type), auth);
        assert!(cfg.weir.log_connections && cfg.weir.log_disconnections, "PgBouncer's defaults");
        assert!(!m.warnings.iter().any(|w| w.contains("auth_type")), "{:?}", m.warnings);
    }
    let m = from_pgbouncer_ini("[pgbouncer]\nauth_type = trust\nlog_disconnections = 0\n[databases]\napp = host=db\n");
    assert!(m.warnings.iter().any(|w| w.contains("weir admits every user name")), "{:?}", m.warnings);
    let cfg = Config::from_toml(&m.toml, std::path::Path::new(".")).expect("valid");
    assert!(!cfg.weir.log_disconnections, "the ini's own value wins");
}

fn serde_json_like(t: AuthType) -> String {
    toml::Value::try_from(t).unwrap().as_str().unwrap().to_owned()
}

#[test]
fn client_idle_timeout_and_server_fast_close_carry_over() {
    let m = from_pgbouncer_ini(
        "[pgbouncer]\nauth_type = trust\nauth_file = u.txt\nclient_idle_timeout = 10\nserver_fast_close = 1\n",
    );
    assert!(m.warnings.is_empty(), "{:?}", m.warnings);
    let cfg = Config::from_toml(&m.toml, std::path::Path::new(".")).unwrap();
    assert_eq!(cfg.weir.client_idle_timeout, std::time::Duration::from_secs(10));
    assert!(cfg.weir.server_fast_close);
}

#[test]
fn pgbouncer_default_pool_mode_is_kept() {
    let m = from_pgbouncer_ini("[pgbouncer]\nauth_type = trust\n[databases]\napp = host=db\n");
    let cfg = Config::from_toml(&m.toml, std::path::Path::new(".")).expect("valid");
    assert_eq!(cfg.weir.pool_mode, PoolMode::Session, "PgBouncer's default, not weir's");
    assert!(m.toml.contains("[metrics]\n") && m.toml.contains("listen_addr = \"127.0.0.1:9930\""));
}

#[test]
fn each_setting_that_cannot_move_is_warned_about() {
    let m = from_pgbouncer_ini(SAMPLE);
    let warned = |needle: &str| m.warnings.iter().any(|w| w.contains(needle));
    for needle in ["server_idle_timeout", "server_tls_ciphers", "logfile", "frobnicate"] {
        assert!(warned(needle), "no warning about {needle}: {:#?}", m.warnings);
    }
    assert!(!warned("max_db_client_connections") && !warned("[users] reporter"), "{:#?}", m.warnings);
    assert!(!warned("query_timeout = 0"), "0 = off maps to unset: {:#?}", m.warnings);
    assert!(!warned("max_client_conn"));
    assert!(!warned("server_tls_protocols") && m.toml.contains("server_tls_protocols = \"secure\""), "carried");
    assert!(!warned("user=reporter") && !warned("* ") && !warned("auth_user"), "{:#?}", m.warnings);
    assert_eq!(m.warnings.len(), 4, "{:#?}", m.warnings);
}

#[test]
fn auth_query_settings_carry_over() {
    let ini = "[pgbouncer]\nauth_type = md5\nauth_file = u.txt\nauth_user = pgb_auth\n\
               auth_query = SELECT usename, passwd FROM my_shadow WHERE usename=$1\nauth_dbname = app\n\
               [databases]\napp = host=10.0.0.5\n";
    let m = from_pgbouncer_ini(ini);
    assert!(!m.warnings.iter().any(|w| w.contains("auth_")), "{:#?}", m.warnings);
    let cfg = Config::from_toml(&m.toml, std::path::Path::new("/etc/weir")).expect("valid");
    assert_eq!(cfg.weir.auth_user, "pgb_auth");
    assert_eq!(cfg.weir.auth_query, "SELECT usename, passwd FROM my_shadow WHERE usename=$1");
    assert_eq!(cfg.weir.auth_dbname, "app");
}

#[test]
fn missing_auth_file_and_odd_lines_are_reported() {
    let m = from_pgbouncer_ini(
        "[pgbouncer]\nauth_type = md5\n%include other.ini\nnonsense\n[databases]\nx-y = host=/tmp port=5432\n",
    );
    assert!(m.warnings.iter().any(|w| w.contains("auth_file is not set")));
    assert!(m.warnings.iter().any(|w| w.contains("%include")));
    assert!(m.warnings.iter().any(|w| w.contains("nonsense")));
    assert!(m.toml.contains("[databases.x-y]\nhost = \"/tmp\""), "a Unix-socket host carries over: {}", m.toml);
}

#[test]
fn listening_keys_carry_over() {
    let ini = "[pgbouncer]\nauth_type = trust\nauth_file = u.txt\nlisten_addr = 127.0.0.1, ::1\nlisten_port = 7432\n\
               unix_socket_dir = /var/run/pgbouncer\nunix_socket_mode = 0770\nunix_socket_group = postgres\n\
               [databases]\napp = host=/var/run/postgresql port=5433\n";
    let m = from_pgbouncer_ini(ini);
    assert!(m.warnings.is_empty(), "{:#?}", m.warnings);
    let cfg =
        Config::from_toml(&m.toml, std::path::Path::new("/etc/weir")).unwrap_or_else(|e| panic!("{e}\n{}", m.toml));
    assert_eq!(cfg.weir.listen_addr.to_string(), "127.0.0.1:7432,[::1]:7432");
    assert_eq!(cfg.unix_socket_path(7432).unwrap(), std::path::Path::new("/var/run/pgbouncer/.s.PGSQL.7432"));
    assert_eq!((cfg.unix_socket_mode_bits(), cfg.weir.unix_socket_group.as_str()), (Some(0o770), "postgres"));
    assert_eq!(cfg.pool_settings("app").unwrap().host, "/var/run/postgresql");
    let off = from_pgbouncer_ini("[pgbouncer]\nauth_type = trust\nunix_socket_dir =\n");
    let cfg = Config::from_toml(&off.toml, std::path::Path::new("/etc/weir")).expect("valid");
    assert_eq!(cfg.unix_socket_path(6432), None, "an empty unix_socket_dir stays off");
}

#[test]
fn conninfo_handles_quotes_and_spaces() {
    let kv = conninfo(" host = db  dbname='a \\'b\\' c' port=1 ");
    assert_eq!(
        kv,
        vec![("host".into(), "db".into()), ("dbname".into(), "a 'b' c".into()), ("port".into(), "1".into())]
    );
    assert_eq!(strip_comment("a = 'x;y' ; note"), "a = 'x;y' ");
    assert_eq!(strip_comment("password=abc#def"), "password=abc#def");
    assert_eq!(seconds(0.25), "250ms");
    assert_eq!(toml_key("my db"), "\"my db\"");
}

#[test]
fn the_head_names_the_differences_the_config_meets() {
    let m = from_pgbouncer_ini("[pgbouncer]\nauth_type = md5\nauth_file = u.txt\nserver_fast_close = 1\n");
    let head: Vec<&str> = m.toml.lines().take_while(|l| l.starts_with('#')).collect();
    assert!(head.iter().any(|l| l.contains("differs from PgBouncer on purpose")), "{head:#?}");
    assert!(head.iter().any(|l| l.contains("server_fast_close: session clients")), "{head:#?}");
    assert!(!head.iter().any(|l| l.contains("TLS (rustls)")), "no TLS file is set: {head:#?}");
    Config::from_toml(&m.toml, std::path::Path::new(".")).expect("still valid");
}

#[test]
fn host_lists_and_load_balance_hosts_carry_over() {
    let ini = "[pgbouncer]\nauth_type = trust\nauth_file = u.txt\ndns_max_ttl = 5\n[databases]\n\
               app = host=10.0.0.1,10.0.0.2 port=5433 load_balance_hosts=round-robin\n\
               two = host=a,b port=5432,5433 load_balance_hosts=disable\n";
    let m = from_pgbouncer_ini(ini);
    let cfg = Config::from_toml(&m.toml, std::path::Path::new(".")).unwrap_or_else(|e| panic!("{e}\n{}", m.toml));
    let app = cfg.pool_settings("app").unwrap();
    let hosts: Vec<(&str, u16)> = app.hosts.iter().map(|h| (h.host.as_str(), h.port)).collect();
    assert_eq!(hosts, [("10.0.0.1", 5433), ("10.0.0.2", 5433)]);
    assert_eq!(app.load_balance_hosts, crate::config::LoadBalanceHosts::RoundRobin);
    assert_eq!(app.target_session_attrs, crate::config::TargetSessionAttrs::Any, "PgBouncer checks no role");
    let two = cfg.pool_settings("two").unwrap();
    assert_eq!(two.hosts.iter().map(|h| h.port).collect::<Vec<_>>(), [5432, 5433]);
    assert_eq!(two.load_balance_hosts, crate::config::LoadBalanceHosts::Disable);
    assert_eq!(cfg.weir.dns_max_ttl, Duration::from_secs(5));
    let advice: Vec<_> = m.warnings.iter().filter(|w| w.contains("target_session_attrs = \"read-write\"")).collect();
    assert_eq!(advice.len(), 2, "each host list is told how to keep writes on the primary: {:#?}", m.warnings);
    assert!(!m.warnings.iter().any(|w| w.contains("one host")), "{:#?}", m.warnings);
}

/// PgBouncer's test of peering appends these lines to its ini: they carry
/// over, an id out of range or a key no peer has is warned about, and the
/// SIGTERM kept is PgBouncer's.
#[test]
fn peers_and_so_reuseport_carry_over() {
    let ini = "[pgbouncer]\nauth_type = trust\nso_reuseport=1\npeer_id=2\n[peers]\n\
               1 = host=/tmp/bouncer1 port=6789\n3 = host=10.0.0.3 pool_size=4\n0 = host=x\n4 = host=h weight=2\n\
               2 = host=/tmp/bouncer2 port=6789\n";
    let m = from_pgbouncer_ini(ini);
    let cfg = Config::from_toml(&m.toml, std::path::Path::new(".")).unwrap_or_else(|e| panic!("{e}\n{}", m.toml));
    assert_eq!((cfg.weir.peer_id, cfg.weir.so_reuseport), (2, true));
    assert_eq!(cfg.weir.sigterm, crate::config::SigtermMode::WaitForClients);
    let one = cfg.peer(1).unwrap();
    assert_eq!((one.host.as_str(), one.port, one.pool_size), ("/tmp/bouncer1", 6789, None));
    let three = cfg.peer(3).unwrap();
    assert_eq!((three.host.as_str(), three.port, three.pool_size), ("10.0.0.3", 6432, Some(4)));
    assert!(cfg.peers.contains_key("2"), "its own entry is kept (and ignored)");
    assert!(m.warnings.iter().any(|w| w.contains("[peers] 0")), "{:?}", m.warnings);
    assert!(m.warnings.iter().any(|w| w.contains("weight=2")), "{:?}", m.warnings);
    assert!(!m.warnings.iter().any(|w| w.contains("peer_id") || w.contains("so_reuseport")), "{:?}", m.warnings);
}
