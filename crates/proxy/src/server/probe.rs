//! Application-level liveness of a server connection that owes an answer:
//! the out-of-band probe (its settings are `watch::Watch`) that tells a silent but
//! busy server from a dead path. The clocks that decide when to probe run in
//! the client's transfer (`client::transfer_watchdog`).
//!
//! Keepalive (see `socket.rs`) catches a quiet path that drops packets,
//! because the kernel's own probes go unanswered. No socket option catches a
//! path whose far end still ACKs but forwards nothing (a stuck userspace
//! relay, load balancer or pooler in between): the kernel sees a healthy,
//! quiet connection, exactly like a long query. And TCP_USER_TIMEOUT (off by
//! default, as in PgBouncer) cannot tell a dead path from a backend that
//! stops reading while it works: it would cut off a COPY or a pipeline
//! behind a lock wait. So when a server that owes a response has sent no
//! byte, or has taken none of the bytes weir has for it, for
//! `server_check_silence`, weir asks Postgres itself, on a fresh connection
//! over the same address:
//!
//! 1. connect and log in as the pool's user, within `server_connect_timeout`;
//!    a timeout or I/O error means the path or the server is dead;
//! 2. `SELECT 1 FROM pg_stat_activity WHERE pid = <our backend> AND state =
//!    'active' AND wait_event IS DISTINCT FROM 'ClientWrite'`: a row means the
//!    backend is still working on our query (it is just slow); no row means it
//!    is gone, has finished (its answer was lost on the way) or is stuck
//!    writing to a path that does not drain, and the connection is dead.
//!    When weir has bytes the server does not take, a backend waiting to read
//!    (`ClientRead`) is cut off from them, and that is dead too.
//!
//! An ErrorResponse during the probe's login (too many connections, a
//! password problem) proves the server answers but not that our backend is
//! alive or dead, so it counts as alive: weir never kills a working query on a
//! guess.
//!
//! The probe's connection counts against its pool's limits (`ProbeRoom`):
//! it takes a place under pool_size + reserve_pool_size, max_db_connections
//! and max_user_connections, or that of an idle server of the pool, which it
//! closes. A pool whose every place is busy opens no session for it: the
//! probe then only asks the postmaster over the same path (an SSLRequest,
//! answered before any backend starts: no session, no slot under
//! max_connections). No answer within `server_connect_timeout` is a dead path;
//! an answer proves the path, and the backend is given the benefit of the
//! doubt (a lost answer on a path that still works is then found only once
//! the pool has a place again).
//!
//! A path that dies under many busy connections would otherwise send a herd
//! of probe logins at the server at once: at most `MAX_PROBES` run at a time
//! in the process, and an address whose probe could not even connect is
//! taken as dead, without another attempt, for `server_connect_timeout`.

use parking_lot::Mutex;
use std::time::Instant;

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;

use super::dial::{open, socket_path, ConnectError, ConnectSpec};
use super::handshake::LoginError;
use crate::protocol::{messages, tags::backend as be};
use crate::wire::{self, WireError};

/// Largest message the probe accepts.
const PROBE_MAX_MESSAGE: usize = 1 << 20;

/// Probes in flight at once, process-wide.
const MAX_PROBES: usize = 4;
static PROBES: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(MAX_PROBES);

/// Addresses whose last probe could not connect: (where, when, why).
static DEAD_PATHS: Mutex<Vec<(String, Instant, String)>> = Mutex::new(Vec::new());

/// What a probe found out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The backend is still working on our query, or nothing could be proved.
    Alive,
    /// The path or the backend is dead; the reason is for logs and the client.
    Dead(String),
}

/// Checks, on a new connection, whether backend `pid` is still working;
/// `unsent`: weir has bytes for it that its socket does not take.
pub(crate) async fn probe(spec: &ConnectSpec, pid: i32, unsent: bool) -> Verdict {
    let _permit = PROBES.acquire().await.expect("the probe semaphore is never closed");
    if let Some(why) = recently_dead(spec) {
        return Verdict::Dead(why);
    }
    let place = match &spec.probe_room.0 {
        Some(room) => match room.take() {
            Some(place) => Some(place),
            None => return path_only(spec, pid).await,
        },
        None => None,
    };
    let verdict = match tokio::time::timeout(spec.connect_timeout, ask(spec, pid, unsent)).await {
        Err(_) => path_dead(
            spec,
            format!("a fresh connection to the server did not answer within {:?}", spec.connect_timeout),
        ),
        Ok(Err(ProbeError::Connect(ConnectError::Login(LoginError::Server { message, .. })))) => {
            crate::span::client_event!(debug, pid, %message, "liveness probe refused by the server; assuming alive");
            Verdict::Alive
        }
        Ok(Err(ProbeError::Connect(e))) => path_dead(spec, format!("a fresh connection to the server failed: {e}")),
        Ok(Err(e)) => Verdict::Dead(format!("a fresh connection to the server failed: {e}")),
        Ok(Ok(true)) => Verdict::Alive,
        Ok(Ok(false)) if unsent => {
            Verdict::Dead(format!("backend {pid} is not reading, or waits for bytes that do not reach it"))
        }
        Ok(Ok(false)) => Verdict::Dead(format!("backend {pid} is no longer working on the query")),
    };
    drop(place);
    verdict
}

/// The probe of a pool with no place to spare: whether the postmaster
/// answers an SSLRequest over the same path, within server_connect_timeout.
async fn path_only(spec: &ConnectSpec, pid: i32) -> Verdict {
    crate::span::client_event!(debug, pid, "no place in the pool for a probe session; checking the path only");
    match tokio::time::timeout(spec.connect_timeout, postmaster_answers(spec)).await {
        Ok(Ok(())) => Verdict::Alive,
        Ok(Err(e)) => path_dead(spec, format!("a fresh connection to the server failed: {e}")),
        Err(_) => path_dead(
            spec,
            format!("a fresh connection to the server did not answer within {:?}", spec.connect_timeout),
        ),
    }
}

/// Sends an SSLRequest and reads the one-byte answer; then hangs up.
async fn postmaster_answers(spec: &ConnectSpec) -> std::io::Result<()> {
    use tokio::io::AsyncReadExt;
    let request = messages::encryption_request(crate::protocol::tags::startup::SSL_REQUEST);
    let mut answer = [0u8; 1];
    if spec.host.starts_with('/') {
        let mut s = tokio::net::UnixStream::connect(socket_path(&spec.host, spec.port)).await?;
        s.write_all(&request).await?;
        s.read_exact(&mut answer).await?;
    } else {
        let mut s = super::dial::tcp(spec).await?;
        s.write_all(&request).await?;
        s.read_exact(&mut answer).await?;
    }
    Ok(())
}

/// Why the address's last probe failed, if that was within server_connect_timeout.
fn recently_dead(spec: &ConnectSpec) -> Option<String> {
    let mut dead = DEAD_PATHS.lock();
    dead.retain(|(_, at, _)| at.elapsed() < spec.connect_timeout);
    let path = spec.shown();
    dead.iter().find(|(p, _, _)| *p == path).map(|(_, _, why)| why.clone())
}

fn path_dead(spec: &ConnectSpec, why: String) -> Verdict {
    let mut dead = DEAD_PATHS.lock();
    let path = spec.shown();
    dead.retain(|(p, _, _)| *p != path);
    dead.push((path, Instant::now(), why.clone()));
    Verdict::Dead(why)
}

#[derive(Debug, thiserror::Error)]
enum ProbeError {
    #[error("{0}")]
    Connect(#[from] ConnectError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Wire(#[from] WireError),
}

/// Logs in and asks whether `pid` is active; true if it is.
async fn ask(spec: &ConnectSpec, pid: i32, unsent: bool) -> Result<bool, ProbeError> {
    let (mut stream, mut buf, _) = open(spec).await?;
    let mut out = BytesMut::new();
    messages::query(&mut out, &active_sql(pid, unsent));
    stream.write_all(&out).await?;
    let mut rows = 0;
    let mut failed = false;
    loop {
        let frame = wire::read_frame(&mut stream, &mut buf, PROBE_MAX_MESSAGE).await?;
        match frame.tag {
            be::DATA_ROW => rows += 1,
            be::ERROR_RESPONSE => failed = true,
            be::READY_FOR_QUERY => break,
            _ => {}
        }
    }
    out.clear();
    messages::terminate(&mut out);
    let _ = stream.write_all(&out).await;
    // A check query that errors proves nothing about our backend.
    Ok(rows > 0 || failed)
}

/// Whether `pid` works on a query: active, and not stuck writing to us (nor,
/// when weir has bytes it does not take, waiting to read them).
fn active_sql(pid: i32, unsent: bool) -> String {
    let waits = if unsent { "('ClientWrite', 'ClientRead')" } else { "('ClientWrite')" };
    format!(
        "SELECT 1 FROM pg_catalog.pg_stat_activity WHERE pid = {pid} AND state = 'active' \
         AND coalesce(wait_event, '') NOT IN {waits}"
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::watch::{ProbeRoom, Watch};
    use super::*;

    #[tokio::test]
    async fn unreachable_server_is_dead() {
        let port = weir_testkit::free_port();
        let spec = ConnectSpec {
            host: "127.0.0.1".into(),
            port,
            addr: None,
            user: "u".into(),
            credentials: crate::auth::Credentials::None,
            dbname: "d".into(),
            liveness: super::super::socket::Liveness::from_config(&crate::config::General::default()),
            connect_timeout: Duration::from_secs(2),
            watch: Watch::default(),
            tls: None,
            startup_params: Vec::new(),
            connect_query: String::new(),
            probe_room: ProbeRoom::default(),
            refuses_3_2: Default::default(),
        };
        assert!(matches!(probe(&spec, 1, false).await, Verdict::Dead(_)));
    }
}
