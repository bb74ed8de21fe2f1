//! Forwarding a CancelRequest to Postgres on a new connection (with the
//! server's own key; `cancel_keys` decides whether a client's cancel gets here), and the gate
//! that keeps a server out of the pool while a cancel aimed at it is in flight
//! (so a late cancel can never hit the next client's query). A cancel goes
//! the way its connection went: TCP (TLS if the connection is), or the
//! server's Unix socket.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::Notify;

use super::stream::ServerStream;
use crate::protocol::messages;
use crate::tls::ServerTls;

/// Counts cancels in flight for one server connection, and says how a
/// cancel reaches it.
#[derive(Debug, Default)]
pub struct CancelGate {
    in_flight: AtomicUsize,
    /// A forward gave up before Postgres closed the cancel connection: the
    /// signal may still reach the backend at any time, so the gate never
    /// opens again and the connection is closed instead of lent.
    lost: AtomicBool,
    done: Notify,
    /// The connection uses TLS: so does its cancel (as libpq 17's), with the
    /// same client configuration and server name.
    tls: Option<(Arc<ServerTls>, String)>,
    /// The server's cancel key (4 bytes in 3.0, longer in 3.2): here, with
    /// the connection's other fixed facts, so that lending the target to a
    /// query costs nothing more.
    key: Box<[u8]>,
}

impl CancelGate {
    /// The gate of a connection whose cancel key is `key`, using TLS with
    /// `tls` towards a host if given.
    pub fn new(key: Box<[u8]>, tls: Option<(Arc<ServerTls>, String)>) -> Self {
        CancelGate { tls, key, ..CancelGate::default() }
    }

    pub fn is_open(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) == 0
    }

    /// Cancels aimed at this server not yet answered (SHOW POOLS).
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Waits until no cancel is in flight (or `limit` passes). Returns true if clear.
    pub async fn wait_clear(&self, limit: Duration) -> bool {
        let wait = async {
            loop {
                let notified = self.done.notified();
                if self.is_open() || self.lost.load(Ordering::Acquire) {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(limit, wait).await.is_ok() && self.is_open()
    }
}

/// Where a server connection went: the TCP address it reached, or the
/// Postgres Unix socket's path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelAddr {
    Tcp(SocketAddr),
    Unix(Arc<Path>),
}

impl CancelAddr {
    /// As SHOW SERVERS and the logs show it (`unix` and the port for a socket).
    pub fn shown(&self, port: u16) -> weir_metrics::ConnAddr {
        match self {
            CancelAddr::Tcp(a) => weir_metrics::ConnAddr::Tcp(*a),
            CancelAddr::Unix(_) => weir_metrics::ConnAddr::Unix(port),
        }
    }
}

/// Where and how to cancel a server's running query.
#[derive(Debug, Clone)]
pub struct CancelTarget {
    pub addr: CancelAddr,
    pub pid: i32,
    /// The gate, which also holds the server's cancel key.
    pub gate: Arc<CancelGate>,
}

/// Sends a CancelRequest and waits for Postgres to close the socket, which it
/// does after signalling the backend. The gate shuts when this is called (not
/// when the future first runs) and stays shut until then, so the server cannot
/// be lent to another client in between. A forward that fails or runs out of
/// time leaves the gate shut for good: the request may still be on its way
/// (a slow path or a busy postmaster), and its signal must not find the next
/// client's query.
pub(crate) fn forward_cancel(
    target: CancelTarget,
    limit: Duration,
) -> impl std::future::Future<Output = std::io::Result<()>> {
    target.gate.in_flight.fetch_add(1, Ordering::AcqRel);
    let ticket = GateTicket(target.gate.clone());
    async move {
        let result = match tokio::time::timeout(limit, send_cancel(&target)).await {
            Ok(r) => r,
            Err(_) => Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "cancel request timed out")),
        };
        if result.is_err() {
            target.gate.lost.store(true, Ordering::Release);
            // The ticket stays taken: the gate never opens again.
            std::mem::forget(ticket);
            target.gate.done.notify_waiters();
        } else {
            drop(ticket);
        }
        result
    }
}

/// Opens the gate again when the cancel is done, however the future ends.
struct GateTicket(Arc<CancelGate>);

impl Drop for GateTicket {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.0.done.notify_waiters();
    }
}

async fn send_cancel(target: &CancelTarget) -> std::io::Result<()> {
    let mut s = match (&target.addr, &target.gate.tls) {
        (CancelAddr::Unix(path), _) => ServerStream::Unix(UnixStream::connect(path).await?),
        (CancelAddr::Tcp(addr), Some((tls, host))) => {
            let tcp = TcpStream::connect(addr).await?;
            super::dial::negotiate_tls(tcp, tls, host).await.map_err(std::io::Error::other)?
        }
        (CancelAddr::Tcp(addr), None) => ServerStream::Plain(TcpStream::connect(addr).await?),
    };
    s.write_all(&messages::cancel_request_with_key(target.pid, &target.gate.key)).await?;
    s.flush().await?;
    let mut sink = [0u8; 64];
    // Postgres answers nothing and closes once the backend has been signalled.
    while s.read(&mut sink).await? > 0 {}
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A forward that runs out of time leaves the gate shut for good, and a
    /// wait for it says so at once; one that Postgres answers opens it.
    #[tokio::test]
    async fn a_forward_that_gives_up_never_opens_the_gate() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let target = CancelTarget {
            addr: CancelAddr::Tcp(addr),
            pid: 1,
            gate: Arc::new(CancelGate::new(vec![0; 4].into_boxed_slice(), None)),
        };
        // Takes the request and never closes: the forward times out.
        let forward = tokio::spawn(forward_cancel(target.clone(), Duration::from_millis(50)));
        let (silent, _) = listener.accept().await.unwrap();
        assert!(forward.await.unwrap().is_err());
        assert!(!target.gate.is_open());
        assert!(!target.gate.wait_clear(Duration::from_secs(5)).await);
        drop(silent);

        // Closes once the request is in, as Postgres does: the gate opens.
        let answered = CancelTarget { gate: Arc::new(CancelGate::new(vec![0; 4].into_boxed_slice(), None)), ..target };
        let forward = tokio::spawn(forward_cancel(answered.clone(), Duration::from_secs(5)));
        let (mut s, _) = listener.accept().await.unwrap();
        let mut request = [0u8; 16];
        s.read_exact(&mut request).await.unwrap();
        drop(s);
        forward.await.unwrap().expect("the request was taken");
        assert!(answered.gate.is_open());
        assert!(answered.gate.wait_clear(Duration::from_secs(5)).await);
    }
}
