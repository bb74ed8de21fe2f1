//! A fault-injecting TCP relay ([`Relay`]) to put between weir and Postgres
//! in tests: it forwards bytes with plain read/write loops so that each chunk
//! can be delayed or held, and it can delay upstream connects, freeze all
//! traffic silently, RST every connection, or refuse new ones.
//!
//! Semantics in one place:
//! * **connect delay** — slept once per accepted connection before dialling upstream.
//! * **latency** — slept before writing each chunk, in both directions.
//! * **freeze** — no byte moves in either direction on any connection (current or
//!   new); sockets stay open; new connections are accepted but upstream is not
//!   dialled. A chunk already read when the freeze hits is held, not delivered.
//! * **freeze_existing** — like freeze, but only for the connections accepted
//!   so far; later ones flow normally (a path that died under old connections
//!   while new ones get through, e.g. a NAT that dropped its mappings).
//! * **thaw** — everything resumes (after either kind of freeze): held chunks
//!   are delivered, pending connections dial upstream.
//! * **reset_all** — every current connection (both sides) is closed with RST.
//! * **refuse** — new connections are accepted and immediately RST-closed;
//!   they are counted by [`Relay::connections_refused`], not `connections_accepted`.
//! * The "connecting" phase counted by [`Relay::max_concurrent_connecting`]
//!   runs from accept until the upstream connect finishes (so it includes the
//!   connect delay and any wait caused by a freeze).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

const CHUNK: usize = 16 * 1024;

/// Which connections are frozen: all, or those with an id below `below`.
#[derive(Debug, Clone, Copy, Default)]
struct Freeze {
    all: bool,
    below: u64,
}

impl Freeze {
    fn applies(&self, id: u64) -> bool {
        self.all || id < self.below
    }
}

/// Handle to a running relay. Cheap to clone; the relay (accept loop and all
/// connection tasks) shuts down when the last clone is dropped.
#[derive(Clone)]
pub struct Relay {
    shared: Arc<Shared>,
    addr: SocketAddr,
    _guard: Arc<Guard>,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("addr", &self.addr)
            .field("upstream", &self.shared.upstream)
            .field("open", &self.connections_open())
            .finish()
    }
}

struct Shared {
    upstream: SocketAddr,
    connect_delay_ns: AtomicU64,
    latency_ns: AtomicU64,
    refuse: AtomicBool,
    frozen: watch::Sender<Freeze>,
    next_id: AtomicU64,
    reset_gen: watch::Sender<u64>,
    shutdown: watch::Sender<bool>,
    accepted: AtomicUsize,
    refused: AtomicUsize,
    open: AtomicUsize,
    connecting: AtomicUsize,
    max_connecting: AtomicUsize,
}

/// Stops everything when the last `Relay` clone goes away.
struct Guard {
    shared: Arc<Shared>,
    accept_task: JoinHandle<()>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.shared.shutdown.send_replace(true);
        // Aborting the accept task drops its JoinSet, which aborts every connection task.
        self.accept_task.abort();
    }
}

impl Relay {
    /// Starts a relay listening on `127.0.0.1:0` that forwards to `upstream`.
    /// Must be called inside a tokio runtime.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Relay> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            upstream,
            connect_delay_ns: AtomicU64::new(0),
            latency_ns: AtomicU64::new(0),
            refuse: AtomicBool::new(false),
            frozen: watch::Sender::new(Freeze::default()),
            next_id: AtomicU64::new(1),
            reset_gen: watch::Sender::new(0),
            shutdown: watch::Sender::new(false),
            accepted: AtomicUsize::new(0),
            refused: AtomicUsize::new(0),
            open: AtomicUsize::new(0),
            connecting: AtomicUsize::new(0),
            max_connecting: AtomicUsize::new(0),
        });
        let accept_task = tokio::spawn(accept_loop(listener, shared.clone()));
        Ok(Relay { _guard: Arc::new(Guard { shared: shared.clone(), accept_task }), shared, addr })
    }

    /// The address clients should connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address the relay forwards to.
    pub fn upstream(&self) -> SocketAddr {
        self.shared.upstream
    }

    /// Delay applied once per new connection before dialling upstream.
    pub fn set_connect_delay(&self, d: Duration) {
        self.shared.connect_delay_ns.store(dur_ns(d), Ordering::Relaxed);
    }

    /// Delay applied before forwarding each chunk, in both directions.
    pub fn set_latency(&self, d: Duration) {
        self.shared.latency_ns.store(dur_ns(d), Ordering::Relaxed);
    }

    /// Silently stops all forwarding (current and new connections) without closing anything.
    pub fn freeze(&self) {
        self.shared.frozen.send_modify(|f| f.all = true);
    }

    /// Silently stops forwarding on the connections accepted so far (including
    /// ones still dialling upstream); connections accepted later are not affected.
    pub fn freeze_existing(&self) {
        let below = self.shared.next_id.load(Ordering::SeqCst);
        self.shared.frozen.send_modify(|f| f.below = below);
    }

    /// Undoes [`Self::freeze`] and [`Self::freeze_existing`]: held data is
    /// delivered and forwarding resumes.
    pub fn thaw(&self) {
        self.shared.frozen.send_replace(Freeze::default());
    }

    /// Closes every current connection (client and upstream side) with RST.
    pub fn reset_all(&self) {
        self.shared.reset_gen.send_modify(|g| *g += 1);
    }

    /// While on, new connections are accepted and immediately RST-closed.
    pub fn refuse(&self, on: bool) {
        self.shared.refuse.store(on, Ordering::SeqCst);
    }

    /// Connections accepted and handled (refused ones are not counted).
    pub fn connections_accepted(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Connections refused because of [`Self::refuse`].
    pub fn connections_refused(&self) -> usize {
        self.shared.refused.load(Ordering::SeqCst)
    }

    /// Client connections currently being handled (connecting or forwarding).
    pub fn connections_open(&self) -> usize {
        self.shared.open.load(Ordering::SeqCst)
    }

    /// Connections currently between accept and the end of their upstream connect.
    pub fn connecting_now(&self) -> usize {
        self.shared.connecting.load(Ordering::SeqCst)
    }

    /// Peak of [`Self::connecting_now`] since start.
    pub fn max_concurrent_connecting(&self) -> usize {
        self.shared.max_connecting.load(Ordering::SeqCst)
    }
}

fn dur_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut conns = JoinSet::new();
    let mut shutdown = shared.shutdown.subscribe();
    loop {
        while conns.try_join_next().is_some() {}
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = shutdown.wait_for(|s| *s) => return,
        };
        let (client, _peer) = match accepted {
            Ok(c) => c,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!("relay accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        if shared.refuse.load(Ordering::SeqCst) {
            shared.refused.fetch_add(1, Ordering::SeqCst);
            rst(client);
            continue;
        }
        shared.accepted.fetch_add(1, Ordering::SeqCst);
        // Subscribe before spawning so a reset_all() issued right after accept still applies.
        let reset_rx = shared.reset_gen.subscribe();
        let id = shared.next_id.fetch_add(1, Ordering::SeqCst);
        conns.spawn(handle_conn(shared.clone(), client, reset_rx, id));
    }
}

fn rst(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

/// Decrements a counter when dropped (task aborts included).
struct CountGuard<'a>(&'a AtomicUsize);

impl Drop for CountGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn handle_conn(shared: Arc<Shared>, client: TcpStream, mut reset_rx: watch::Receiver<u64>, id: u64) {
    shared.open.fetch_add(1, Ordering::SeqCst);
    let _open = CountGuard(&shared.open);
    let _ = client.set_nodelay(true);

    // Connecting phase: delay, wait out a freeze, dial upstream.
    let now = shared.connecting.fetch_add(1, Ordering::SeqCst) + 1;
    shared.max_connecting.fetch_max(now, Ordering::SeqCst);
    let connecting = CountGuard(&shared.connecting);
    let mut frozen_rx = shared.frozen.subscribe();
    let dial = async {
        let delay = Duration::from_nanos(shared.connect_delay_ns.load(Ordering::Relaxed));
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let _ = frozen_rx.wait_for(|f| !f.applies(id)).await;
        TcpStream::connect(shared.upstream).await
    };
    let server = tokio::select! {
        r = dial => r,
        _ = reset_rx.changed() => { rst(client); return; }
    };
    drop(connecting);
    let server = match server {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!("relay upstream connect to {} failed: {e}", shared.upstream);
            rst(client);
            return;
        }
    };
    let _ = server.set_nodelay(true);

    let (mut client, mut server) = (client, server);
    let reset = {
        let (mut cr, mut cw) = client.split();
        let (mut sr, mut sw) = server.split();
        let pumps =
            async { tokio::try_join!(pump(&shared, id, &mut cr, &mut sw), pump(&shared, id, &mut sr, &mut cw)) };
        tokio::select! {
            _ = pumps => false,
            _ = reset_rx.changed() => true,
        }
    };
    if reset {
        let _ = client.set_zero_linger();
        let _ = server.set_zero_linger();
    }
}

/// Forwards one direction until EOF (then half-closes the writer) or error.
async fn pump(
    shared: &Shared,
    id: u64,
    r: &mut tokio::net::tcp::ReadHalf<'_>,
    w: &mut tokio::net::tcp::WriteHalf<'_>,
) -> std::io::Result<()> {
    let mut frozen = shared.frozen.subscribe();
    let mut buf = vec![0u8; CHUNK];
    loop {
        let _ = frozen.wait_for(|f| !f.applies(id)).await;
        // `read` is cancel-safe: if a freeze arrives while blocked, nothing is lost.
        let n = tokio::select! {
            r = r.read(&mut buf) => r?,
            _ = frozen.wait_for(|f| f.applies(id)) => continue,
        };
        if n == 0 {
            let _ = w.shutdown().await;
            return Ok(());
        }
        let latency = Duration::from_nanos(shared.latency_ns.load(Ordering::Relaxed));
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        // Hold the chunk if we got frozen meanwhile.
        let _ = frozen.wait_for(|f| !f.applies(id)).await;
        w.write_all(&buf[..n]).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::timeout;

    const T: Duration = Duration::from_secs(5);

    async fn echo_server() -> (SocketAddr, JoinHandle<()>) {
        let l = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let addr = l.local_addr().unwrap();
        let h = tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = l.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    loop {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => {
                                if s.write_all(&buf[..n]).await.is_err() {
                                    return;
                                }
                            }
                        }
                    }
                });
            }
        });
        (addr, h)
    }

    async fn roundtrip(s: &mut TcpStream, msg: &[u8]) {
        timeout(T, s.write_all(msg)).await.unwrap().unwrap();
        let mut got = vec![0u8; msg.len()];
        timeout(T, s.read_exact(&mut got)).await.unwrap().unwrap();
        assert_eq!(got, msg);
    }

    /// Reads until error or EOF; true if that happened in time.
    async fn closes_soon(s: &mut TcpStream) -> bool {
        let mut buf = [0u8; 64];
        matches!(timeout(T, s.read(&mut buf)).await, Ok(Ok(0)) | Ok(Err(_)))
    }

    #[tokio::test]
    async fn relay_faults() {
        let (echo, echo_task) = echo_server().await;
        let relay = Relay::start(echo).await.unwrap();
        let mut c = timeout(T, TcpStream::connect(relay.addr())).await.unwrap().unwrap();
        roundtrip(&mut c, b"hello").await;
        assert_eq!(relay.connections_accepted(), 1);
        assert_eq!(relay.connections_open(), 1);

        // Freeze: nothing comes back, but the socket stays open.
        relay.freeze();
        tokio::time::sleep(Duration::from_millis(20)).await;
        timeout(T, c.write_all(b"x")).await.unwrap().unwrap();
        let mut one = [0u8; 1];
        assert!(
            timeout(Duration::from_millis(300), c.read(&mut one)).await.is_err(),
            "read must time out while frozen"
        );
        // A new connection while frozen is accepted but gets nothing.
        let mut c2 = timeout(T, TcpStream::connect(relay.addr())).await.unwrap().unwrap();
        timeout(T, c2.write_all(b"y")).await.unwrap().unwrap();
        assert!(timeout(Duration::from_millis(300), c2.read(&mut one)).await.is_err());
        assert_eq!(relay.connections_open(), 2);
        assert_eq!(relay.connecting_now(), 1);

        // Thaw: the held byte arrives, and the pending connection dials upstream.
        relay.thaw();
        timeout(T, c.read_exact(&mut one)).await.unwrap().unwrap();
        assert_eq!(&one, b"x");
        timeout(T, c2.read_exact(&mut one)).await.unwrap().unwrap();
        assert_eq!(&one, b"y");
        roundtrip(&mut c, b"again").await;

        // Latency.
        relay.set_latency(Duration::from_millis(100));
        let t0 = std::time::Instant::now();
        roundtrip(&mut c, b"slow").await;
        assert!(t0.elapsed() >= Duration::from_millis(200), "{:?}", t0.elapsed());
        relay.set_latency(Duration::ZERO);

        // reset_all: both clients see RST (error) or EOF.
        relay.reset_all();
        assert!(closes_soon(&mut c).await);
        assert!(closes_soon(&mut c2).await);
        timeout(T, async {
            while relay.connections_open() != 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .unwrap();

        // refuse: new connections fail or close immediately.
        relay.refuse(true);
        match timeout(T, TcpStream::connect(relay.addr())).await.unwrap() {
            Err(_) => {}
            Ok(mut c3) => assert!(closes_soon(&mut c3).await),
        }
        assert_eq!(relay.connections_refused(), 1);
        relay.refuse(false);
        let mut c4 = timeout(T, TcpStream::connect(relay.addr())).await.unwrap().unwrap();
        roundtrip(&mut c4, b"back").await;

        // Dropping the relay closes its connections.
        drop(relay);
        assert!(closes_soon(&mut c4).await);
        echo_task.abort();
    }

    #[tokio::test]
    async fn freeze_existing_spares_new_connections() {
        let (echo, echo_task) = echo_server().await;
        let relay = Relay::start(echo).await.unwrap();
        let mut old = timeout(T, TcpStream::connect(relay.addr())).await.unwrap().unwrap();
        roundtrip(&mut old, b"before").await;
        relay.freeze_existing();
        timeout(T, old.write_all(b"x")).await.unwrap().unwrap();
        let mut one = [0u8; 1];
        assert!(timeout(Duration::from_millis(300), old.read(&mut one)).await.is_err());
        let mut new = timeout(T, TcpStream::connect(relay.addr())).await.unwrap().unwrap();
        roundtrip(&mut new, b"fresh").await;
        relay.thaw();
        timeout(T, old.read_exact(&mut one)).await.unwrap().unwrap();
        assert_eq!(&one, b"x");
        echo_task.abort();
    }

    #[tokio::test]
    async fn connect_delay_and_peak_connecting() {
        let (echo, echo_task) = echo_server().await;
        let relay = Relay::start(echo).await.unwrap();
        relay.set_connect_delay(Duration::from_millis(300));
        let t0 = std::time::Instant::now();
        let mut clients = Vec::new();
        for _ in 0..3 {
            clients.push(timeout(T, TcpStream::connect(relay.addr())).await.unwrap().unwrap());
        }
        for c in &mut clients {
            roundtrip(c, b"ping").await;
        }
        assert!(t0.elapsed() >= Duration::from_millis(300));
        assert_eq!(relay.max_concurrent_connecting(), 3);
        assert_eq!(relay.connecting_now(), 0);
        assert_eq!(relay.connections_accepted(), 3);
        echo_task.abort();
    }

    #[tokio::test]
    async fn upstream_down_closes_client() {
        let port = crate::free_port();
        let relay = Relay::start(SocketAddr::from(([127, 0, 0, 1], port))).await.unwrap();
        let mut c = timeout(T, TcpStream::connect(relay.addr())).await.unwrap().unwrap();
        assert!(closes_soon(&mut c).await);
    }
}
