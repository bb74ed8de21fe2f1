//! A replication client's login (`replication=database` or a true
//! boolean): authenticated as any client of its database (auth_file,
//! auth_query, and with auth_type = "hba" the lines physical replication
//! matches by the `replication` keyword), its pool found, and the startup
//! parameters its own server gets (`Replicating`); then, once that server
//! has logged in (`crate::replication`), the greeting with the server's own
//! parameters, and the client's listing.

use std::sync::Arc;

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use weir_metrics::ConnAddr;

use super::authenticate::authenticate_pooled;
use super::error::ClientError;
use super::pooled::Budget;
use super::stream::ClientStream;
use super::{count_login, Start};
use crate::cancel_keys::{Registration, Secret};
use crate::config::Config;
use crate::params::ParamMap;
use crate::pool::Pool;
use crate::protocol::messages;
use crate::protocol::replication::Replication;
use crate::protocol::tags::{auth, status};
use crate::state::client_list::{ClientGuard, NewClient, Owner};
use crate::state::Shared;

/// An authenticated replication client, before its server is opened.
#[derive(Debug)]
pub struct Replicating {
    pub pool: Arc<Pool>,
    pub kind: Replication,
    /// The startup parameters its server gets beyond the database's: the
    /// client's parameters, its `options` as sent, and `replication`.
    pub startup: Vec<(String, String)>,
    /// How long it may wait for a place in its pool (query_wait_timeout,
    /// or less with a declared deadline).
    pub budget: Budget,
    /// The protocol version negotiated: 3.2 clients get a 32-byte key.
    pub minor: u16,
    pub peer: ConnAddr,
    /// Bytes the client sent past its login, unread.
    pub buf: BytesMut,
    /// Its connection id and place in the client counts, for its listing.
    pub(crate) listing: Option<super::Listing>,
}

/// Authenticates a replication client and finds its pool.
pub(super) async fn settle(
    socket: &mut ClientStream,
    buf: &mut BytesMut,
    shared: &Arc<Shared>,
    cfg: &Arc<Config>,
    start: Start,
) -> Result<Replicating, ClientError> {
    let Start { mut req, minor, peer } = start;
    let (key, credentials) = authenticate_pooled(socket, buf, shared, cfg, &mut req, peer).await?;
    if shared.admin.is_disabled(&key.database) {
        return Err(ClientError::Disabled(key.database));
    }
    let Some(pool) = shared.pool_for(cfg, &key, credentials) else {
        return Err(ClientError::UnknownDatabase(key.database));
    };
    let mut startup: Vec<(String, String)> =
        req.params.iter().chain(req.settings.iter()).map(|(k, v)| (k.to_owned(), v.to_owned())).collect();
    if let Some(options) = req.raw_options.take() {
        startup.push(("options".into(), options));
    }
    if let Some(value) = req.replication.startup_value() {
        startup.push(("replication".into(), value.into()));
    }
    let budget = Budget::new(req.declared_deadline, cfg.weir.client_deadline_fraction);
    Ok(Replicating { pool, kind: req.replication, startup, budget, minor, peer, buf: BytesMut::new(), listing: None })
}

impl Replicating {
    /// A cancel key for the client (4 bytes, or 32 for protocol 3.2).
    pub fn register(&self, shared: &Shared) -> (Registration, Secret) {
        let long_key = self.minor >= crate::protocol::startup::LONG_KEY_MINOR;
        shared.cancels.register_as(None, long_key)
    }
}

/// Greets a replication client once its server has logged in: AuthenticationOk,
/// the server's own parameters (its server is its alone: nothing to
/// reconcile), BackendKeyData with weir's key, ReadyForQuery.
pub async fn greet(socket: &mut ClientStream, server: &ParamMap, key: (i32, &[u8])) -> Result<(), ClientError> {
    let mut out = BytesMut::with_capacity(1024);
    messages::authentication(&mut out, auth::OK, &[]);
    for (k, v) in server.iter() {
        messages::parameter_status(&mut out, k, v);
    }
    messages::backend_key(&mut out, key.0, key.1);
    messages::ready_for_query(&mut out, status::IDLE);
    socket.write_all(&out).await.map_err(ClientError::Io)
}

/// The end of a replication client's login, greeted or refused (no place,
/// or its server's login failed): counted in weir_client_connections_total,
/// logged, and (greeted) listed for SHOW CLIENTS and KILL until the guard
/// drops.
pub fn finish(
    greeted: Result<(), ClientError>,
    shared: &Shared,
    login: &mut Replicating,
    reg: &Registration,
    application_name: &str,
) -> Result<ClientGuard, ClientError> {
    count_login(shared, &greeted);
    greeted?;
    if shared.config.load().weir.log_connections {
        tracing::info!(application_name, replication = login.kind.as_label(), "client logged in");
    }
    let listing = login.listing.take().expect("a replication login is listed once");
    Ok(shared.client_list.register(NewClient {
        id: listing.id,
        counted: Some(listing.counted),
        owner: Owner::Pool(login.pool.clone()),
        peer: login.peer,
        local: listing.local,
        application_name: application_name.to_owned(),
        key_pid: reg.pid,
        slot: Some(reg.slot.clone()),
        replication: login.kind,
    }))
}
