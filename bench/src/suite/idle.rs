//! The memory scenario: N clients log in to a proxy (full md5 login over raw
//! tokio sockets) and then sit idle. The proxy's RSS before and after gives
//! its memory per idle client.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::{Buf, BytesMut};
use futures_util::stream::{self, StreamExt, TryStreamExt};
use postgres_protocol::authentication::md5_hash;
use postgres_protocol::message::{backend, frontend};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use weir_testkit::{APP_DB, MD5_PASS, MD5_USER};

use super::targets::{Id, Kind, Target};

/// Logins in flight at once.
const CONCURRENCY: usize = 64;
const LOGIN_LIMIT: Duration = Duration::from_secs(15);
const SETTLE: Duration = Duration::from_secs(2);

#[derive(Debug, Clone)]
pub struct IdleCell {
    pub id: Id,
    pub clients: usize,
    pub rss_before_kib: u64,
    pub rss_after_kib: u64,
    pub login_secs: f64,
}

impl IdleCell {
    pub fn bytes_per_client(&self) -> f64 {
        (self.rss_after_kib.saturating_sub(self.rss_before_kib) * 1024) as f64 / self.clients.max(1) as f64
    }
}

pub fn run(targets: &[Target], clients: usize) -> anyhow::Result<Vec<IdleCell>> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    let mut cells = vec![];
    for t in targets.iter().filter(|t| t.kind != Kind::Direct) {
        eprintln!("== {clients} idle clients on {}", t.label());
        let before = t.rss_kib().context("reading the proxy's RSS")?;
        let started = Instant::now();
        let conns = rt.block_on(open_all(t.port, clients))?;
        let login_secs = started.elapsed().as_secs_f64();
        std::thread::sleep(SETTLE);
        let after = t.rss_kib().context("reading the proxy's RSS")?;
        rt.block_on(check_some(conns.iter().step_by((clients / 10).max(1)).count(), t.port))?;
        let cell = IdleCell { id: t.id(), clients, rss_before_kib: before, rss_after_kib: after, login_secs };
        eprintln!(
            "   {}: RSS {} → {} KiB, {:.0} bytes per idle client (logins took {login_secs:.1} s)",
            t.label(),
            before,
            after,
            cell.bytes_per_client()
        );
        drop(conns);
        std::thread::sleep(Duration::from_secs(1));
        cells.push(cell);
    }
    Ok(cells)
}

async fn open_all(port: u16, n: usize) -> anyhow::Result<Vec<TcpStream>> {
    stream::iter(0..n)
        .map(|_| async move { tokio::time::timeout(LOGIN_LIMIT, login(port)).await.context("login timed out")? })
        .buffer_unordered(CONCURRENCY)
        .try_collect()
        .await
}

/// A few fresh clients still get answers while the idle ones sit there.
async fn check_some(n: usize, port: u16) -> anyhow::Result<()> {
    for _ in 0..n.min(10) {
        let mut s = login(port).await?;
        let mut buf = BytesMut::new();
        frontend::query("select 1", &mut buf)?;
        s.write_all(&buf).await?;
        let mut rbuf = BytesMut::new();
        tokio::time::timeout(LOGIN_LIMIT, until_ready(&mut s, &mut rbuf, None)).await.context("query timed out")??;
    }
    Ok(())
}

/// Startup, md5 password, and everything up to the first ReadyForQuery.
async fn login(port: u16) -> anyhow::Result<TcpStream> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await?;
    s.set_nodelay(true)?;
    let mut buf = BytesMut::new();
    frontend::startup_message([("user", MD5_USER), ("database", APP_DB)], &mut buf)?;
    s.write_all(&buf).await?;
    let mut rbuf = BytesMut::with_capacity(1024);
    until_ready(&mut s, &mut rbuf, Some(MD5_USER)).await?;
    Ok(s)
}

/// Reads messages until ReadyForQuery, answering an md5 challenge if `user` is set.
async fn until_ready(s: &mut TcpStream, rbuf: &mut BytesMut, user: Option<&str>) -> anyhow::Result<()> {
    loop {
        while let Some(msg) = backend::Message::parse(rbuf)? {
            match msg {
                backend::Message::AuthenticationMd5Password(body) => {
                    let hash = md5_hash(user.unwrap_or(MD5_USER).as_bytes(), MD5_PASS.as_bytes(), body.salt());
                    let mut out = BytesMut::new();
                    frontend::password_message(hash.as_bytes(), &mut out)?;
                    s.write_all(&out).await?;
                }
                backend::Message::ErrorResponse(_) => bail!("the proxy answered with an error"),
                backend::Message::ReadyForQuery(_) => return Ok(()),
                _ => {}
            }
        }
        if s.read_buf(rbuf).await? == 0 {
            bail!("connection closed during login");
        }
        let _ = rbuf.remaining();
    }
}
