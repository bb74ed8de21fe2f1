//! A host list as PgBouncer runs, shows and logs it: with a name that does
//! not resolve listed first and `load_balance_hosts = "disable"`, clients
//! are served by the next host at once, the failed look-up is logged in
//! PgBouncer's words (`closing because: server DNS lookup failed`) and every
//! server goes to the host that answers; SHOW DATABASES and SHOW POOLS give
//! the database's load_balance_hosts (none for a single host), and a RELOAD
//! that changes it shows at once. With `disable`, new servers stay on the
//! host they went to: when it refuses they take the next one, and stay
//! there when the first answers again (PgBouncer's meaning).

use std::net::SocketAddr;

use weir_e2e::process::{rows, WeirProcess};
use weir_e2e::*;
use weir_testkit::Relay;

const LB_DB: &str = "lb";

/// `[databases.lb]`: a name that never resolves (`.invalid`), then the test's Postgres.
fn lb_section(pg_port: u16, balance: &str) -> String {
    format!(
        "[databases.{LB_DB}]\nhost = \"unresolvable-hostname.invalid,127.0.0.1\"\nport = {pg_port}\n\
         dbname = \"{APP_DB}\"\nload_balance_hosts = \"{balance}\"\n"
    )
}

async fn show_row(w: &WeirProcess, show: &str, key: &str, name: &str) -> std::collections::HashMap<String, String> {
    let out = w.admin(show).await.unwrap_or_else(|e| panic!("{show}: {e}"));
    let row = rows(&out).into_iter().find(|r| r[key] == name);
    row.unwrap_or_else(|| panic!("no {show} row for {name}: {out}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unresolvable_first_host_is_logged_skipped_and_shown() {
    let pg = pg().await;
    // The name is looked up once in the test, however slow the machine.
    let general = "server_connect_timeout = \"10s\"\ndns_max_ttl = \"10m\"";
    let w = WeirProcess::start(&pg, general, &lb_section(pg.port(), "disable")).await;

    // Two clients at once, each holding its server: two servers, both on
    // the host that answers, and no wait for server_login_retry.
    let url = w.url_for(SCRAM_USER, SCRAM_PASS, LB_DB);
    let (a, b) = (connect(&url).await.expect("a client of lb"), connect(&url).await.expect("another"));
    let (ra, rb) = tokio::join!(a.simple_query("begin; select pg_sleep(0.5)"), b.simple_query("begin; select 1"));
    ra.expect("served by the second host");
    rb.expect("served by the second host");
    let logs = w.logs();
    let dns = logs.matches("closing because: server DNS lookup failed").count();
    assert_eq!(dns, 1, "one failed look-up, logged as PgBouncer logs it:\n{logs}");
    assert!(
        logs.contains(&format!("{LB_DB}/{SCRAM_USER}@unresolvable-hostname.invalid:{} closing because", pg.port())),
        "the line names the host that did not resolve:\n{logs}"
    );
    let on_good = format!("{LB_DB}/{SCRAM_USER}@127.0.0.1:{} new connection to server", pg.port());
    assert!(logs.matches(&on_good).count() >= 2, "both servers on 127.0.0.1:\n{logs}");
    drop((a, b));

    let db = show_row(&w, "SHOW DATABASES", "name", LB_DB).await;
    assert_eq!(db["load_balance_hosts"], "disable");
    assert_eq!(show_row(&w, "SHOW DATABASES", "name", APP_DB).await["load_balance_hosts"], "", "one host: none");
    assert_eq!(show_row(&w, "SHOW POOLS", "database", LB_DB).await["load_balance_hosts"], "disable");

    w.write_config(general, &lb_section(pg.port(), "round-robin"));
    w.admin("RELOAD").await.expect("RELOAD");
    let db = show_row(&w, "SHOW DATABASES", "name", LB_DB).await;
    assert_eq!(db["load_balance_hosts"], "round-robin", "the reloaded value");
}

/// A client of `url` holding a server in an open transaction: the next
/// client needs a server of its own.
async fn holding(url: &str) -> tokio_postgres::Client {
    let c = connect(url).await.expect("a client of lb");
    c.simple_query("begin; select 1").await.expect("served");
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disable_stays_on_the_host_it_took_until_that_host_fails() {
    let pg = pg().await;
    let upstream: SocketAddr = format!("127.0.0.1:{}", pg.port()).parse().unwrap();
    let (a, b) = (Relay::start(upstream).await.unwrap(), Relay::start(upstream).await.unwrap());
    let (pa, pb) = (a.addr().port(), b.addr().port());
    let section = format!(
        "[databases.{LB_DB}]\nhost = \"127.0.0.1,127.0.0.1\"\nport = \"{pa},{pb}\"\ndbname = \"{APP_DB}\"\n\
         load_balance_hosts = \"disable\"\n"
    );
    let w = WeirProcess::start(&pg, "server_connect_timeout = \"5s\"", &section).await;
    let url = w.url_for(SCRAM_USER, SCRAM_PASS, LB_DB);
    let opened = |port: u16| {
        let line = format!("{LB_DB}/{SCRAM_USER}@127.0.0.1:{port} new connection to server");
        w.logs().matches(&line).count()
    };

    let first = holding(&url).await;
    assert_eq!((opened(pa), opened(pb)), (1, 0), "the first host:\n{}", w.logs());
    a.refuse(true);
    let second = holding(&url).await;
    assert_eq!((opened(pa), opened(pb)), (1, 1), "the next host once the first refuses:\n{}", w.logs());
    a.refuse(false);
    // weir asks the hosts that do not match again (every 10 s): the first is back.
    let back = format!("127.0.0.1:{pa} primary");
    wait_for("the first host to answer again", || async {
        show_row(&w, "SHOW DATABASES", "name", LB_DB).await["host_roles"].contains(&back)
    })
    .await;
    let third = holding(&url).await;
    assert_eq!((opened(pa), opened(pb)), (1, 2), "still the host the last connection took:\n{}", w.logs());
    drop((first, second, third));
}
