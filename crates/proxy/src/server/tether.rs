//! The servers open to one host, each held by a duplicate of its socket,
//! so that weir can end them all at once. When a host stops being the one
//! that matches (a new primary found elsewhere, or it answered as a
//! standby), a transaction in flight on it must get its error now, not when
//! a keepalive or the silence probe finds a path that went quiet: shutting
//! the duplicate down ends the socket for its owner too, whose next read
//! returns end-of-file and whose client gets 08006 at once. Costs one file
//! descriptor per server connection and nothing per query.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use socket2::SockRef;
use tokio::net::TcpStream;

/// Every tied server of one host.
#[derive(Debug, Default)]
pub struct Tethers {
    socks: Mutex<HashMap<u64, socket2::Socket>>,
    next: AtomicU64,
}

/// One server's place among its host's; dropped with the connection.
#[derive(Debug)]
pub struct Tether {
    host: Arc<Tethers>,
    id: u64,
}

impl Tethers {
    /// Ties `tcp` to this host. None when the socket cannot be duplicated
    /// (out of file descriptors): the connection then ends only by itself.
    pub(crate) fn tie(self: &Arc<Self>, tcp: &TcpStream) -> Option<Tether> {
        let twin = SockRef::from(tcp).try_clone().ok()?;
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.socks.lock().insert(id, twin);
        Some(Tether { host: self.clone(), id })
    }

    /// Ends every tied server's socket (both ways); returns how many.
    pub(crate) fn cut_all(&self) -> usize {
        let socks = self.socks.lock();
        for s in socks.values() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        socks.len()
    }

    /// Servers tied now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.socks.lock().len()
    }
}

impl Drop for Tether {
    fn drop(&mut self) {
        self.host.socks.lock().remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn cutting_ends_the_owners_read_at_once() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (mut owner, accepted) = tokio::join!(async { TcpStream::connect(addr).await.unwrap() }, listener.accept());
        let _peer = accepted.unwrap();
        let host = Arc::new(Tethers::default());
        let tether = host.tie(&owner).expect("tied");
        assert_eq!(host.len(), 1);
        let reader = tokio::spawn(async move {
            let mut b = [0u8; 1];
            owner.read(&mut b).await.map(|n| (n, owner))
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!reader.is_finished(), "a quiet socket blocks its reader");
        assert_eq!(host.cut_all(), 1);
        let read = tokio::time::timeout(std::time::Duration::from_secs(5), reader).await;
        let (n, _owner) = read.expect("the read ends at once").unwrap().expect("end of file, not an error");
        assert_eq!(n, 0);
        drop(tether);
        assert_eq!(host.len(), 0, "a closed connection leaves its host's list");
    }
}
