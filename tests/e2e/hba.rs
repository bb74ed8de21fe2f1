//! auth_type = "hba" with auth_hba_file, through weir to a real Postgres
//! with tokio-postgres: each line's method is the one asked for, the first
//! match wins, `reject` and "no entry" are refused with 28000 in Postgres's
//! words, `hostssl` lines never match a plaintext client, the admin console
//! obeys the file too, and a reload applies a new file and keeps a bad one out.

use weir_e2e::{
    bounded, connect, sqlstate, Harness, Opts, APP_DB, MD5_PASS, MD5_USER, SCRAM_PASS, SCRAM_USER, TRUST_USER,
};

const HBA: &str = r#"
# TYPE   DATABASE  USER        ADDRESS                     METHOD
host     app       trust_user  127.0.0.1/32                trust
host     app       md5_user    127.0.0.0/8                 md5
host     app       scram_user  127.0.0.1 255.255.255.255   scram-sha-256
host     weir      admin       127.0.0.1/32                md5
host     all       mallory     all                         reject
hostssl  all       all         all                         trust
host     all       all         10.0.0.0/8                  trust
"#;

fn write_hba(path: &std::path::Path, text: &str) {
    std::fs::write(path, text).expect("write the hba file");
}

/// A login's SQLSTATE and message, or "ok" after a query.
async fn login_outcome(h: &Harness, user: &str, password: &str, db: &str) -> (String, String) {
    let url = format!("postgres://{user}:{password}@{}/{db}", h.addr());
    match connect(&url).await {
        Ok(c) => {
            let q = if db == "weir" { "SHOW VERSION" } else { "select 1" };
            c.simple_query(q).await.expect("query after login");
            ("ok".into(), String::new())
        }
        Err(e) => {
            (sqlstate(&e).unwrap_or_default(), e.as_db_error().map(|d| d.message().to_owned()).unwrap_or_default())
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hba_lines_choose_the_method_and_refuse_the_rest() {
    bounded(120, async {
        let dir = std::env::temp_dir().join(format!("weir-hba-{}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        let hba_path = dir.join("hba.conf");
        write_hba(&hba_path, HBA);
        let general = format!("auth_hba_file = \"{}\"", hba_path.display());
        let h = Harness::start(Opts { auth_type: "hba", general, ..Default::default() }).await;

        let cases = [
            ("trust line: any password", TRUST_USER, "not-the-password", APP_DB, "ok"),
            ("md5 line, right password", MD5_USER, MD5_PASS, APP_DB, "ok"),
            ("md5 line, wrong password", MD5_USER, "wrong", APP_DB, "28P01"),
            ("scram line, right password", SCRAM_USER, SCRAM_PASS, APP_DB, "ok"),
            ("scram line, wrong password", SCRAM_USER, "wrong", APP_DB, "28P01"),
            ("admin console by its line", "admin", "admin_pass", "weir", "ok"),
            ("admin console, wrong password", "admin", "wrong", "weir", "28P01"),
            ("reject line", "mallory", "x", APP_DB, "28000"),
            ("no line for this database", SCRAM_USER, SCRAM_PASS, "otherdb", "28000"),
            ("only a hostssl line would match", "nobody", "x", APP_DB, "28000"),
        ];
        for (what, user, password, db, want) in cases {
            let (code, message) = login_outcome(&h, user, password, db).await;
            assert_eq!(code, want, "{what}: {message}");
        }
        let (_, message) = login_outcome(&h, "mallory", "x", APP_DB).await;
        assert_eq!(
            message,
            r#"pg_hba.conf rejects connection for host "127.0.0.1", user "mallory", database "app", no encryption"#
        );
        let (_, message) = login_outcome(&h, "nobody", "x", APP_DB).await;
        assert_eq!(
            message,
            r#"no pg_hba.conf entry for host "127.0.0.1", user "nobody", database "app", no encryption"#
        );
        assert!(h.weir().shared().pools.get(APP_DB, "nobody").is_none(), "a refused client opens no pool");

        // A reload reads the file again: md5_user is now refused...
        let cfg = (*h.weir().shared().config.load()).clone();
        write_hba(&hba_path, &HBA.replace("host     app       md5_user    127.0.0.0/8                 md5", ""));
        h.weir().reload(cfg.clone()).expect("reload with a good file");
        assert_eq!(login_outcome(&h, MD5_USER, MD5_PASS, APP_DB).await.0, "28000");
        // ...and a file with an error is refused whole, the running rules kept.
        write_hba(&hba_path, "host all all all ldap\n");
        let err = h.weir().reload(cfg).expect_err("a bad hba file is refused");
        assert!(err.to_string().contains("line 1") && err.to_string().contains("ldap"), "{err}");
        assert_eq!(login_outcome(&h, TRUST_USER, "x", APP_DB).await.0, "ok", "the old rules stay");
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await
}

/// A config naming an hba file that does not parse does not start.
#[test]
fn a_bad_hba_file_stops_the_start() {
    let dir = std::env::temp_dir().join(format!("weir-hba-bad-{}", rand::random::<u32>()));
    std::fs::create_dir_all(&dir).unwrap();
    write_hba(&dir.join("hba.conf"), "host all all localhost md5\n");
    std::fs::write(dir.join("users.txt"), "").unwrap();
    let text = "[weir]\nlisten_addr = \"127.0.0.1:0\"\nauth_type = \"hba\"\nauth_file = \"users.txt\"\nauth_hba_file = \"hba.conf\"\n";
    let cfg = weir::Config::from_toml(text, &dir).expect("the config itself is valid");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let err = rt.block_on(weir::Weir::start(cfg)).expect_err("refused at start");
    assert!(err.to_string().contains("host names"), "{err}");
    let missing = weir::Config::from_toml("[weir]\nauth_type = \"hba\"\nauth_file = \"users.txt\"\n", &dir);
    assert!(missing.unwrap_err().to_string().contains("auth_hba_file"), "auth_type = \"hba\" needs the file");
    let _ = std::fs::remove_dir_all(&dir);
}
