//! weir's listening sockets: every TCP address of `listen_addr`, all on one
//! port (`*` binds `0.0.0.0` and `[::]`, the latter IPv6-only, and skips
//! IPv6 where the machine has none; with `so_reuseport`, shared with other
//! weirs on the host), and the Unix socket
//! `<unix_socket_dir>/.s.PGSQL.<port>` with unix_socket_mode and
//! unix_socket_group. A stale socket file (one nobody answers on) is
//! removed at start; weir's own file is removed when its listener closes.

use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use socket2::{Domain, Socket, Type};
use tokio::net::{TcpListener, UnixListener};
use weir_metrics::ConnAddr;

use crate::config::Config;
use crate::login::ClientStream;
use crate::state::StartError;

/// Pending connections the kernel queues per listener (PgBouncer's listen_backlog).
const BACKLOG: i32 = 128;

/// One listening socket.
pub(super) enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener, SocketFile),
}

impl Listener {
    /// The next client, with its address (`unix` and the port for the Unix socket).
    pub(super) async fn accept(&self) -> io::Result<(ClientStream, ConnAddr)> {
        match self {
            Listener::Tcp(l) => {
                let (socket, peer) = l.accept().await?;
                let _ = socket.set_nodelay(true);
                Ok((ClientStream::Plain(socket), ConnAddr::Tcp(peer)))
            }
            Listener::Unix(l, file) => {
                let (socket, _) = l.accept().await?;
                Ok((ClientStream::Unix(Box::new(socket)), ConnAddr::Unix(file.port)))
            }
        }
    }
}

/// weir's socket file: removed when dropped, unless another process has
/// replaced it since.
pub(super) struct SocketFile {
    path: PathBuf,
    ino: u64,
    port: u16,
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.ino() == self.ino) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Everything weir listens on.
pub(super) struct Bound {
    pub listeners: Vec<Listener>,
    pub tcp: Vec<SocketAddr>,
    pub unix: Option<PathBuf>,
}

/// Binds every address of the config; any failure is a start error (for
/// `*`, an IPv6 address the machine cannot have is skipped with a warning).
/// The TCP sockets listen last, once the Unix socket does: whoever sees
/// the TCP port answer (a supervisor's readiness probe, a test) can use the
/// Unix socket too. (The Unix socket's name needs the TCP port, so the TCP
/// sockets are bound first.)
pub(super) fn bind(cfg: &Config) -> Result<Bound, StartError> {
    let listen = &cfg.weir.listen_addr;
    let mut bound = Bound { listeners: Vec::new(), tcp: Vec::new(), unix: None };
    let mut tcp = Vec::new();
    let mut port = listen.port();
    for &want in listen.addrs() {
        let mut addr = want;
        addr.set_port(port);
        let listener = match bind_tcp(addr, cfg.weir.so_reuseport) {
            Ok(l) => l,
            Err(e) if listen.is_any() && addr.is_ipv6() && !bound.tcp.is_empty() && absent_family(&e) => {
                tracing::warn!(%addr, error = %e, "listen_addr *: no IPv6 here; listening on IPv4 only");
                continue;
            }
            Err(e) => return Err(StartError::Listen(addr.to_string(), e)),
        };
        let local = listener.local_addr().and_then(|a| a.as_socket().ok_or_else(|| io::ErrorKind::InvalidData.into()));
        let local = local.map_err(|e| StartError::Listen(addr.to_string(), e))?;
        port = local.port();
        bound.tcp.push(local);
        tcp.push((local, listener));
    }
    let mut unix = None;
    if let Some(path) = cfg.unix_socket_path(port) {
        let fail = |e: io::Error| StartError::Listen(path.display().to_string(), e);
        let (listener, file) = bind_unix(&path, port, cfg).map_err(fail)?;
        unix = Some(Listener::Unix(listener, file));
        bound.unix = Some(path);
    }
    for (local, socket) in tcp {
        let listener = listen_tcp(socket).map_err(|e| StartError::Listen(local.to_string(), e))?;
        bound.listeners.push(Listener::Tcp(listener));
    }
    bound.listeners.extend(unix);
    Ok(bound)
}

/// The machine lacks this address family (or address), as opposed to the
/// port being taken or not allowed.
fn absent_family(e: &io::Error) -> bool {
    !matches!(e.kind(), io::ErrorKind::AddrInUse | io::ErrorKind::PermissionDenied)
}

/// A TCP socket bound with SO_REUSEADDR (as tokio's `bind`), and with
/// SO_REUSEPORT when `reuseport` (so_reuseport: weirs on one host share the
/// port, and the kernel spreads connections over them); IPv6-only on IPv6
/// addresses so that `[::]` and `0.0.0.0` can share a port; it listens once
/// `listen_tcp` says so.
fn bind_tcp(addr: SocketAddr, reuseport: bool) -> io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    if reuseport {
        socket.set_reuse_port(true)?;
    }
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    Ok(socket)
}

fn listen_tcp(socket: Socket) -> io::Result<TcpListener> {
    socket.listen(BACKLOG)?;
    TcpListener::from_std(socket.into())
}

/// The Unix listener at `path`, after removing a stale socket there; then
/// the file's mode and group.
fn bind_unix(path: &Path, port: u16, cfg: &Config) -> io::Result<(UnixListener, SocketFile)> {
    remove_stale(path)?;
    let listener = UnixListener::bind(path)?;
    let mode = cfg.unix_socket_mode_bits().unwrap_or(0o777);
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    let group = &cfg.weir.unix_socket_group;
    if !group.is_empty() {
        let gid = group_id(group)?;
        std::os::unix::fs::chown(path, None, Some(gid))?;
    }
    let ino = std::fs::symlink_metadata(path)?.ino();
    tracing::info!(path = %path.display(), mode = format!("{mode:04o}"), "weir is listening on a Unix socket");
    Ok((listener, SocketFile { path: path.to_owned(), ino, port }))
}

/// Removes a socket file nobody answers on (a weir or PgBouncer that did not
/// clean up); one that answers, or a file that is not a socket, is an error.
fn remove_stale(path: &Path) -> io::Result<()> {
    let Ok(meta) = std::fs::symlink_metadata(path) else { return Ok(()) };
    if !meta.file_type().is_socket() {
        return Err(io::Error::new(io::ErrorKind::AlreadyExists, "a file that is not a socket is in the way"));
    }
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(io::Error::new(io::ErrorKind::AddrInUse, "another process is listening on this socket"));
    }
    tracing::info!(path = %path.display(), "removing a stale Unix socket");
    std::fs::remove_file(path)
}

/// unix_socket_group: a group number, or a name looked up in /etc/group.
pub fn group_id(group: &str) -> io::Result<u32> {
    if let Ok(gid) = group.parse() {
        return Ok(gid);
    }
    let groups = std::fs::read_to_string("/etc/group")?;
    groups
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(':');
            let name = fields.next()?;
            let gid = fields.nth(1)?.parse().ok()?;
            (name == group).then_some(gid)
        })
        .next()
        .ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("unix_socket_group \"{group}\" is not in /etc/group"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With so_reuseport two listeners share one port; without, the second
    /// bind fails.
    #[test]
    fn so_reuseport_shares_a_port() {
        let first = bind_tcp("127.0.0.1:0".parse().unwrap(), true).unwrap();
        let port = first.local_addr().unwrap().as_socket().unwrap().port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        first.listen(BACKLOG).unwrap();
        let second = bind_tcp(addr, true).expect("a second listener on the same port");
        second.listen(BACKLOG).unwrap();
        let alone = bind_tcp("127.0.0.1:0".parse().unwrap(), false).unwrap();
        let port = alone.local_addr().unwrap().as_socket().unwrap().port();
        alone.listen(BACKLOG).unwrap();
        assert!(bind_tcp(format!("127.0.0.1:{port}").parse().unwrap(), false).is_err());
    }

    #[test]
    fn groups_by_number_or_name() {
        assert_eq!(group_id("0").unwrap(), 0);
        assert_eq!(group_id("root").unwrap(), 0, "root is group 0 in /etc/group");
        let e = group_id("no-such-group-here").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }

    /// A socket file that answers nobody is replaced; a plain file is not touched.
    #[test]
    fn stale_sockets_go_other_files_stay() {
        let dir = std::env::temp_dir().join(format!("weir-stale-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join(".s.PGSQL.1");
        drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
        // A process another test forks in that instant holds the listener
        // until it execs, and a connect then succeeds: ask again meanwhile.
        let removed = (0..500).any(|_| {
            let gone = remove_stale(&sock).is_ok();
            if !gone {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            gone
        });
        assert!(removed && !sock.exists());
        let live = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        assert_eq!(remove_stale(&sock).unwrap_err().kind(), io::ErrorKind::AddrInUse);
        drop(live);
        std::fs::remove_file(&sock).unwrap();
        std::fs::write(&sock, "not a socket").unwrap();
        assert!(remove_stale(&sock).is_err());
        assert!(sock.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
