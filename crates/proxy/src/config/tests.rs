use super::*;

const MINIMAL: &str = r#"
[weir]
listen_addr = "127.0.0.1:6432"
auth_type = "trust"
[databases.app]
port = 5432
"#;

#[test]
fn minimal_config_gets_defaults() {
    let cfg = Config::from_toml(MINIMAL, Path::new("/etc/weir")).unwrap();
    let s = cfg.pool_settings("app").unwrap();
    assert_eq!(s.dbname, "app");
    assert_eq!(s.pool_size, 20);
    assert_eq!(s.pool_mode, PoolMode::Transaction);
    assert_eq!(cfg.weir.server_reset_query, "DISCARD ALL");
}

#[test]
fn admission_defaults_bound_the_queue_and_override_per_database() {
    let cfg = Config::from_toml(MINIMAL, Path::new(".")).unwrap();
    assert_eq!(cfg.pool_settings("app").unwrap().max_waiting_clients, 1000);
    assert_eq!(cfg.weir.max_waiting_clients_total, 2000);
    assert!(cfg.weir.wait_shedding && cfg.weir.deadline_start);
    let text = format!("{MINIMAL}max_waiting_clients = 50\n");
    let cfg = Config::from_toml(&text, Path::new(".")).unwrap();
    assert_eq!(cfg.pool_settings("app").unwrap().max_waiting_clients, 50);
}

#[test]
fn unknown_keys_are_errors() {
    let text = MINIMAL.replace("auth_type", "bogus_key = 1\nauth_type");
    let err = Config::from_toml(&text, Path::new(".")).unwrap_err();
    assert!(err.to_string().contains("bogus_key"), "{err}");
}

#[test]
fn durations_parse_and_override_per_database() {
    let text = format!("{MINIMAL}query_wait_timeout = \"250ms\"\npool_mode = \"session\"\n");
    let cfg = Config::from_toml(&text, Path::new(".")).unwrap();
    let s = cfg.pool_settings("app").unwrap();
    assert_eq!(s.query_wait_timeout, Duration::from_millis(250));
    assert_eq!(s.pool_mode, PoolMode::Session);
}

#[test]
fn wait_timeout_must_sit_below_client_deadline() {
    let text = format!("{MINIMAL}query_wait_timeout = \"1s\"\nclient_deadline = \"1s\"\n");
    let err = Config::from_toml(&text, Path::new(".")).unwrap_err().to_string();
    assert!(err.contains("must be below client_deadline"), "{err}");
}

#[test]
fn relative_auth_file_resolves_against_config_folder() {
    let text = MINIMAL.replace("auth_type = \"trust\"", "auth_type = \"md5\"\nauth_file = \"users.txt\"");
    let cfg = Config::from_toml(&text, Path::new("/etc/weir")).unwrap();
    assert_eq!(cfg.auth_file_path().unwrap(), PathBuf::from("/etc/weir/users.txt"));
}

#[test]
fn startup_parameter_lists_hold_setting_names() {
    for (line, key) in [
        ("track_extra_parameters = [\"a;b\"]", "track_extra_parameters"),
        ("track_extra_parameters = [\"weir.client_deadline\"]", "track_extra_parameters"),
        ("ignore_startup_parameters = [\"\"]", "ignore_startup_parameters"),
    ] {
        let text = MINIMAL.replace("auth_type", &format!("{line}\nauth_type"));
        let err = Config::from_toml(&text, Path::new(".")).unwrap_err().to_string();
        assert!(err.contains(key), "{line}: {err}");
    }
}

#[test]
fn migrated_metrics_port_follows_the_listen_port() {
    let metrics_of = |ini: &str| {
        let m = migrate::from_pgbouncer_ini(ini);
        let cfg = Config::from_toml(&m.toml, std::path::Path::new(".")).unwrap_or_else(|e| panic!("{e}\n{}", m.toml));
        cfg.metrics.listen_addr.expect("[metrics] listen_addr").port()
    };
    let ini = |port: &str| format!("[pgbouncer]\nauth_type = trust\n{port}[databases]\napp = host=db\n");
    assert_eq!(metrics_of(&ini("")), 9930, "PgBouncer's default port 6432");
    assert_eq!(metrics_of(&ini("listen_port = 6432\n")), 9930);
    assert_eq!(metrics_of(&ini("listen_port = 6433\n")), 9931, "a second weir on the host");
    assert_eq!(metrics_of(&ini("listen_port = 5432\n")), 8930);
    assert_eq!(migrate::metrics_port(Some(65000)), 65000 - 3498, "counts down past the port range");
}

#[test]
fn worker_threads_default_to_one_and_must_be_positive() {
    let cfg = Config::from_toml(MINIMAL, Path::new(".")).unwrap();
    assert_eq!(cfg.weir.worker_threads, 1);
    let two = MINIMAL.replace("auth_type", "worker_threads = 2\nauth_type");
    assert_eq!(Config::from_toml(&two, Path::new(".")).unwrap().weir.worker_threads, 2);
    let zero = MINIMAL.replace("auth_type", "worker_threads = 0\nauth_type");
    let err = Config::from_toml(&zero, Path::new(".")).unwrap_err();
    assert!(err.to_string().contains("weir.worker_threads: must be at least 1"), "{err}");
}
