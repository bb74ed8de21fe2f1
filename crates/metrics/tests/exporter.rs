//! End-to-end test of the exporter over a plain std TcpStream.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use weir_metrics::{
    install, set_build_info, CancelOutcome, CloseReason, GlobalMetrics, PoolMetrics, ServerConnGuard, ServerState,
};

fn request(addr: SocketAddr, raw: &str) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(raw.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").expect("complete response");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, head.to_owned(), body.to_owned())
}

fn get(addr: SocketAddr, path: &str) -> (u16, String, String) {
    request(addr, &format!("GET {path} HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n\r\n"))
}

fn metric_line<'a>(text: &'a str, name: &str, must_contain: &[&str]) -> Option<&'a str> {
    text.lines().find(|l| l.starts_with(&format!("{name}{{")) && must_contain.iter().all(|c| l.contains(c)))
}

#[test]
fn exporter_end_to_end() {
    let ready = Arc::new(AtomicBool::new(false));
    let r = Arc::clone(&ready);
    let exp = install("127.0.0.1:0".parse().unwrap(), Arc::new(move || r.load(Ordering::SeqCst))).unwrap();
    assert!(exp.is_global());
    let addr = exp.local_addr();

    let pool = PoolMetrics::new("exp_db", "exp_user");
    let g = ServerConnGuard::opened(Arc::clone(&pool), Duration::from_millis(7));
    g.close(CloseReason::IdleTimeout);
    drop(ServerConnGuard::opened(Arc::clone(&pool), Duration::from_millis(3)));
    pool.add_servers(ServerState::Idle, 4);
    let global = GlobalMetrics::new();
    global.record_cancel(CancelOutcome::Forwarded);
    set_build_info("9.9.9-test");

    let (status, head, body) = get(addr, "/metrics");
    assert_eq!(status, 200);
    assert!(head.contains("Content-Type: text/plain; version=0.0.4"), "{head}");
    let db = r#"database="exp_db""#;
    let opened = metric_line(&body, "weir_server_connections_opened_total", &[db]);
    assert!(opened.unwrap_or_default().ends_with(" 2"), "{body}");
    let idle = metric_line(&body, "weir_server_connections_closed_total", &[db, "idle_timeout"]);
    assert!(idle.unwrap_or_default().ends_with(" 1"), "{body}");
    let dropped = metric_line(&body, "weir_server_connections_closed_total", &[db, r#""dropped""#]);
    assert!(dropped.unwrap_or_default().ends_with(" 1"), "{body}");
    let servers = metric_line(&body, "weir_pool_servers", &[db, r#"state="idle""#]);
    assert!(servers.unwrap_or_default().ends_with(" 4"), "{body}");
    assert!(metric_line(&body, "weir_server_connections_opened_per_second", &[db, r#"window="10s""#]).is_some());
    assert!(body.contains("weir_server_connect_duration_seconds_bucket{"), "{body}");
    assert!(body.contains("# HELP weir_server_connections_opened_total"), "{body}");
    assert!(metric_line(&body, "weir_cancel_requests_total", &["forwarded"]).is_some(), "{body}");
    assert!(metric_line(&body, "weir_build_info", &["9.9.9-test"]).is_some(), "{body}");
    assert!(weir_metrics::render().unwrap().contains("exp_db"));
    for process in ["process_resident_memory_bytes ", "process_open_fds "] {
        let line = body.lines().find(|l| l.starts_with(process)).unwrap_or_else(|| panic!("{process}: {body}"));
        let value: f64 = line[process.len()..].parse().unwrap();
        assert!(value > 0.0, "{line}");
    }

    // A removed pool's series leave /metrics with it.
    let gone = PoolMetrics::new("exp_gone_db", "exp_user");
    assert!(get(addr, "/metrics").2.contains(r#"database="exp_gone_db""#));
    drop(gone);
    assert!(!get(addr, "/metrics").2.contains("exp_gone_db"));

    assert_eq!(get(addr, "/healthz"), (200, get(addr, "/healthz").1, "ok\n".into()));
    let (status, _, body) = get(addr, "/readyz");
    assert_eq!((status, body.as_str()), (503, "not ready\n"));
    ready.store(true, Ordering::SeqCst);
    let (status, _, body) = get(addr, "/readyz");
    assert_eq!((status, body.as_str()), (200, "ready\n"));
    assert_eq!(get(addr, "/nope").0, 404);
    assert_eq!(get(addr, "/metrics?x=1").0, 200);
    assert_eq!(request(addr, "garbage\r\n\r\n").0, 400);
    let (status, head, body) = request(addr, "HEAD /healthz HTTP/1.1\r\n\r\n");
    assert_eq!((status, body.as_str()), (200, ""));
    assert!(head.contains("Content-Length: 3"));

    // A second exporter in the same process shares the global recorder.
    let exp2 = install("127.0.0.1:0".parse().unwrap(), Arc::new(|| true)).unwrap();
    assert!(exp2.is_global());
    assert!(get(exp2.local_addr(), "/metrics").2.contains("exp_db"));
    drop(exp2);

    // A silent client does not block other requests.
    let _slow = TcpStream::connect(addr).unwrap();
    let t = Instant::now();
    assert_eq!(get(addr, "/healthz").0, 200);
    assert!(t.elapsed() < Duration::from_secs(1));

    // A panicking readiness check reads as not ready.
    let exp3 = install("127.0.0.1:0".parse().unwrap(), Arc::new(|| panic!("probe"))).unwrap();
    assert_eq!(get(exp3.local_addr(), "/readyz").0, 503);
    assert_eq!(get(exp3.local_addr(), "/healthz").0, 200);

    drop(exp);
    assert!(TcpStream::connect(addr).is_err(), "listener closed after drop");
}
