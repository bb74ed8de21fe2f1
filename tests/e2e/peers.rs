//! weirs as peers behind one address: two and three weirs on one port
//! (so_reuseport), each with its own Unix socket; a client's query is
//! cancelled whichever of them gets the CancelRequest (the key names its
//! weir, which the others forward it to); a key no peer owns is dropped,
//! and a `[peers]` list that loops ends after three forwards. Then the
//! rolling restart: SHUTDOWN WAIT_FOR_CLIENTS (and SIGTERM with sigterm =
//! "wait_for_clients") closes the listener, keeps the clients, and exits
//! once the last has left, while the other weir on the port takes the new
//! connections and forwards the old client's cancel home.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weir::app::Shared;
use weir::{Config, Weir};
use weir_e2e::process::{rows, WeirProcess};
use weir_e2e::raw::Raw;
use weir_e2e::{bounded, wait_for, PgServer, SCRAM_PASS, SCRAM_USER, WAIT_LIMIT};
use weir_metrics::CancelOutcome;

const SLEEP: &str = "select pg_sleep(60)";

/// A group of weirs on one port, peer ids 1..=n, each with its own folder
/// (its auth_file and Unix socket).
struct Group {
    weirs: Vec<Option<Weir>>,
    dirs: Vec<PathBuf>,
    port: u16,
}

/// The folders of `n` peers, made, each with the auth_file.
fn peer_dirs(pg: &PgServer, n: usize) -> Vec<PathBuf> {
    let root = pg.data_dir().parent().unwrap();
    let tag = rand::random::<u16>();
    let dirs: Vec<PathBuf> = (1..=n).map(|i| root.join(format!("peer{i}-{tag}"))).collect();
    for dir in &dirs {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("userlist.txt"), weir_e2e::migrated::userlist()).unwrap();
    }
    dirs
}

/// `[peers.id]` pointing at the Unix socket in `dir`.
fn entry(id: usize, dir: &Path, port: u16) -> String {
    format!("[peers.{id}]\nhost = \"{}\"\nport = {port}\n", dir.display())
}

/// Starts peer `id` on `port` in `dir`, with `peers` (its `[peers]` tables).
async fn start_peer(pg: &PgServer, port: u16, id: usize, dir: &Path, peers: &str) -> Weir {
    let text = format!(
        "[weir]\nlisten_addr = \"127.0.0.1:{port}\"\nunix_socket_dir = \"{dir}\"\nso_reuseport = true\n\
         peer_id = {id}\nauth_type = \"md5\"\nauth_file = \"userlist.txt\"\n\
         [databases.app]\nhost = \"127.0.0.1\"\nport = {pg}\n{peers}",
        dir = dir.display(),
        pg = pg.port(),
    );
    let cfg = Config::from_toml(&text, dir).expect("a valid peer config");
    Weir::start(cfg).await.expect("a peer starts on the shared port")
}

impl Group {
    /// `peers(dirs, port, i)`: the `[peers]` tables of weir `i`.
    async fn start(pg: &PgServer, n: usize, peers: impl Fn(&[PathBuf], u16, usize) -> String) -> Group {
        let [port] = weir_testkit::free_ports();
        let dirs = peer_dirs(pg, n);
        let mut weirs = Vec::new();
        for i in 1..=n {
            weirs.push(Some(start_peer(pg, port, i, &dirs[i - 1], &peers(&dirs, port, i)).await));
        }
        Group { weirs, dirs, port }
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    fn shared(&self, i: usize) -> &Arc<Shared> {
        self.weirs[i - 1].as_ref().expect("running").shared()
    }

    fn socket(&self, i: usize) -> PathBuf {
        self.dirs[i - 1].join(format!(".s.PGSQL.{}", self.port))
    }
}

/// Every other weir of the group, as `[peers]`.
fn others(dirs: &[PathBuf], port: u16, i: usize) -> String {
    (1..=dirs.len()).filter(|&j| j != i).map(|j| entry(j, &dirs[j - 1], port)).collect()
}

/// The peer a key's pid names (PgBouncer's layout: its second and third bytes).
fn owner(pid: i32) -> usize {
    let b = pid.to_be_bytes();
    usize::from(u16::from_le_bytes([b[1], b[2]]))
}

/// A CancelRequest over a Unix socket, held until weir closes it.
async fn cancel_over(socket: &Path, key: (i32, i32)) {
    let mut s = tokio::net::UnixStream::connect(socket).await.expect("the peer's Unix socket");
    s.write_all(&weir::protocol::messages::cancel_request(key.0, key.1)).await.unwrap();
    let mut sink = [0u8; 16];
    let closed = tokio::time::timeout(WAIT_LIMIT, async { while s.read(&mut sink).await.unwrap_or(0) > 0 {} });
    closed.await.expect("weir closes a cancel connection once it is handled");
}

/// A client through the shared port running SLEEP, and the weir it landed on.
async fn sleeper(g: &Group, direct: &tokio_postgres::Client) -> (Raw, usize) {
    let mut raw = Raw::login(g.addr(), SCRAM_USER, SCRAM_PASS, &[]).await.unwrap();
    let at = owner(raw.key().0);
    raw.send_query(SLEEP).await.unwrap();
    weir_e2e::until_running(direct, SLEEP, 1).await;
    (raw, at)
}

async fn expect_cancelled(raw: &mut Raw) {
    let reply = tokio::time::timeout(WAIT_LIMIT, raw.reply()).await.expect("the query ends").unwrap();
    assert_eq!(reply.code(), Some("57014"), "{:?}", reply.error);
}

/// For every weir of the group as the one the CancelRequest reaches, a
/// running query is cancelled, wherever its client is; then cancels
/// through the shared port, which the kernel gives to any of them.
async fn cancels_reach_home(n: usize) {
    let pg = weir_e2e::pg().await;
    let g = Group::start(&pg, n, others).await;
    let direct = weir_e2e::direct_client(&pg).await;
    let mut landed = vec![0; n + 1];
    for target in 1..=n {
        let (mut raw, at) = sleeper(&g, &direct).await;
        assert!((1..=n).contains(&at), "the key names one of the group: {at}");
        landed[at] += 1;
        let forwarded_before = g.shared(target).cancels.metrics.cancels(CancelOutcome::Peer);
        cancel_over(&g.socket(target), raw.key()).await;
        expect_cancelled(&mut raw).await;
        if target != at {
            let forwarded = g.shared(target).cancels.metrics.cancels(CancelOutcome::Peer);
            assert_eq!(forwarded, forwarded_before + 1, "weir {target} sent weir {at}'s key home");
        }
        raw.terminate().await;
    }
    for _ in 0..2 * n {
        let (mut raw, _) = sleeper(&g, &direct).await;
        weir_e2e::raw::cancel(g.addr(), raw.key()).await.unwrap();
        expect_cancelled(&mut raw).await;
        raw.terminate().await;
    }
    let forwarded: u64 = (1..=n).map(|i| g.shared(i).cancels.metrics.cancels(CancelOutcome::Peer)).sum();
    assert!(forwarded >= (n - 1) as u64, "the cancels of other weirs' clients went home: {forwarded}");
    let unknown: u64 = (1..=n).map(|i| g.shared(i).cancels.metrics.cancels(CancelOutcome::Unknown)).sum();
    assert_eq!(unknown, 0, "no cancel was lost");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_weirs_on_one_port_cancel_from_either() {
    bounded(240, cancels_reach_home(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_weirs_on_one_port_cancel_from_any() {
    bounded(240, cancels_reach_home(3)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_key_is_dropped_and_a_loop_ends() {
    bounded(240, async {
        let pg = weir_e2e::pg().await;
        // Peer 3 is nobody: weir 1 says it is weir 2, weir 2 says it is weir 1.
        let g = Group::start(&pg, 2, |dirs, port, i| {
            let other = 3 - i;
            format!("{}{}", entry(other, &dirs[other - 1], port), entry(3, &dirs[other - 1], port))
        })
        .await;
        let key_of = |peer: u16, last: u8| {
            let [lo, hi] = peer.to_le_bytes();
            (i32::from_be_bytes([0x11, lo, hi, 0x22]), i32::from_be_bytes([1, 2, 3, last]))
        };
        cancel_over(&g.socket(1), key_of(3, 0x03)).await;
        let peer = |i| g.shared(i).cancels.metrics.cancels(CancelOutcome::Peer);
        let unknown = |i| g.shared(i).cancels.metrics.cancels(CancelOutcome::Unknown);
        wait_for("three forwards, then a drop", || async { peer(1) + peer(2) == 3 && unknown(1) + unknown(2) == 1 })
            .await;
        assert_eq!((peer(1), peer(2), unknown(2)), (2, 1, 1), "1 -> 2 -> 1 -> 2, which drops it");
        // A peer no [peers] lists: dropped where it lands.
        cancel_over(&g.socket(1), key_of(9, 0x03)).await;
        assert_eq!(unknown(1), 1);
        // Nothing was harmed.
        let mut raw = Raw::login(g.addr(), SCRAM_USER, SCRAM_PASS, &[]).await.unwrap();
        assert_eq!(raw.query_one("select 'fine'").await, "fine");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_keeps_clients_and_their_cancels() {
    bounded(240, async {
        let pg = weir_e2e::pg().await;
        let direct = weir_e2e::direct_client(&pg).await;
        // Weir 1 alone on the port: its client lands there.
        let [port] = weir_testkit::free_ports();
        let dirs = peer_dirs(&pg, 2);
        let one = start_peer(&pg, port, 1, &dirs[0], &entry(2, &dirs[1], port)).await;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let mut old = Raw::login(addr, SCRAM_USER, SCRAM_PASS, &[]).await.unwrap();
        assert_eq!(owner(old.key().0), 1);
        // Weir 2 joins; weir 1 is told to go once its clients have.
        let two = start_peer(&pg, port, 2, &dirs[1], &entry(1, &dirs[0], port)).await;
        let one_shared = one.shared().clone();
        let leaving = tokio::spawn(one.wait_for_clients());
        wait_for("weir 1's listener closed", || async { !one_shared.is_ready() }).await;
        // New clients all reach weir 2 now (one the kernel had queued at
        // weir 1 as it closed is refused: it tries again).
        for _ in 0..6 {
            let mut raw = match Raw::login(addr, SCRAM_USER, SCRAM_PASS, &[]).await {
                Ok(raw) => raw,
                Err(_) => Raw::login(addr, SCRAM_USER, SCRAM_PASS, &[]).await.unwrap(),
            };
            assert_eq!(owner(raw.key().0), 2, "only weir 2 listens");
            assert_eq!(raw.query_one("select 'new'").await, "new");
            raw.terminate().await;
        }
        // The old client still queries on weir 1, and a cancel through the
        // port (weir 2's now) reaches it there.
        assert_eq!(old.query_one("select 'still here'").await, "still here");
        old.send_query(SLEEP).await.unwrap();
        weir_e2e::until_running(&direct, SLEEP, 1).await;
        weir_e2e::raw::cancel(addr, old.key()).await.unwrap();
        expect_cancelled(&mut old).await;
        assert_eq!(two.shared().cancels.metrics.cancels(CancelOutcome::Peer), 1);
        assert!(!leaving.is_finished(), "weir 1 waits for its client");
        old.terminate().await;
        tokio::time::timeout(WAIT_LIMIT, leaving).await.expect("weir 1 ends once its client has left").unwrap();
        drop(two);
        dirs.iter().for_each(|d| drop(std::fs::remove_dir_all(d)));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_waits_for_clients_when_asked() {
    bounded(240, async {
        let pg = weir_e2e::pg().await;
        let general = "sigterm = \"wait_for_clients\"\npeer_id = 1\n[peers.1]\nhost = \"/nowhere\"\n\
                       [peers.2]\nhost = \"10.0.0.2\"\npool_size = 3\n";
        let mut w = WeirProcess::start(&pg, general, "").await;
        let peers = rows(&w.admin("SHOW PEERS").await.unwrap());
        assert_eq!(peers.len(), 1, "its own entry is not a peer: {peers:?}");
        let peer = &peers[0];
        let shown = [&peer["peer_id"], &peer["host"], &peer["port"], &peer["pool_size"]].map(String::as_str);
        assert_eq!(shown, ["2", "10.0.0.2", "6432", "3"]);
        let addr = SocketAddr::from(([127, 0, 0, 1], w.port));
        let mut client = Raw::login(addr, SCRAM_USER, SCRAM_PASS, &[]).await.unwrap();
        w.signal("TERM");
        wait_for("the listener closed", || async { tokio::net::TcpStream::connect(addr).await.is_err() }).await;
        assert_eq!(client.query_one("select 'after SIGTERM'").await, "after SIGTERM", "an idle client stays");
        assert!(w.wait_exit(Duration::from_millis(500)).await.is_none(), "weir waits for its client");
        client.terminate().await;
        let status = w.wait_exit(WAIT_LIMIT).await.expect("weir exits once its last client has left");
        assert!(status.success(), "{status:?}\n{}", w.logs());

        // The console's SHUTDOWN WAIT_FOR_CLIENTS does the same, whatever
        // sigterm says.
        let mut w = WeirProcess::start(&pg, "", "").await;
        let addr = SocketAddr::from(([127, 0, 0, 1], w.port));
        let mut client = Raw::login(addr, SCRAM_USER, SCRAM_PASS, &[]).await.unwrap();
        w.admin("SHUTDOWN WAIT_FOR_CLIENTS").await.unwrap();
        wait_for("the listener closed", || async { tokio::net::TcpStream::connect(addr).await.is_err() }).await;
        assert_eq!(client.query_one("select 'after SHUTDOWN'").await, "after SHUTDOWN");
        client.terminate().await;
        let status = w.wait_exit(WAIT_LIMIT).await.expect("weir exits once its last client has left");
        assert!(status.success(), "{status:?}\n{}", w.logs());
    })
    .await;
}
