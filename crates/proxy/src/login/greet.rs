//! The greeting that ends a login: AuthenticationOk, every ParameterStatus,
//! BackendKeyData and ReadyForQuery in one buffer, for a pooled client and
//! for the console; and the parameters each is told.

use bytes::BytesMut;

use super::startup::Request;
use crate::params::{ParamMap, FIXED, TRACKED};
use crate::protocol::{
    messages,
    tags::{auth, status},
};

/// The client's reported parameters: its own values over the server's
/// defaults, for every one a client can change (a SET of any of them, such
/// as default_transaction_read_only, is then undone on the next client's
/// server).
pub(super) fn client_params(req: &Request, server: &ParamMap) -> ParamMap {
    let mut p = ParamMap::new();
    for name in TRACKED {
        if let Some(v) = req.params.get(name).or_else(|| server.get(name)) {
            p.set(name, v);
        }
    }
    let listed = |list: &[&str], k: &str| list.iter().any(|f| f.eq_ignore_ascii_case(k));
    for (k, v) in server.iter().filter(|(k, _)| !listed(FIXED, k) && !listed(TRACKED, k)) {
        p.set(k, v);
    }
    p
}

/// Room for a whole greeting (Postgres reports about 15 parameters).
const GREETING_CAPACITY: usize = 1024;

/// AuthenticationOk, every ParameterStatus, BackendKeyData and ReadyForQuery,
/// in one buffer: the server's parameters with the client's values, then
/// any the client has and the server does not report. The key is the pid
/// and weir's secret (4 bytes, or 32 for a 3.2 client).
pub(super) fn greeting(server: &ParamMap, client: &ParamMap, key: (i32, &[u8])) -> BytesMut {
    let mut out = BytesMut::with_capacity(GREETING_CAPACITY);
    messages::authentication(&mut out, auth::OK, &[]);
    let mut overridden = 0;
    for (k, v) in server.iter() {
        let value = client.get(k).inspect(|_| overridden += 1);
        messages::parameter_status(&mut out, k, value.unwrap_or(v));
    }
    if overridden < client.len() {
        for (k, v) in client.iter().filter(|(k, _)| server.get(k).is_none()) {
            messages::parameter_status(&mut out, k, v);
        }
    }
    messages::backend_key(&mut out, key.0, key.1);
    messages::ready_for_query(&mut out, status::IDLE);
    out
}

/// The parameters the console reports, as PgBouncer's console does.
pub(super) fn console_params() -> ParamMap {
    let mut p = ParamMap::new();
    p.set("server_version", concat!(env!("CARGO_PKG_VERSION"), "/weir"));
    p.set("server_encoding", "UTF8");
    p.set("client_encoding", "UTF8");
    p.set("DateStyle", "ISO");
    p.set("TimeZone", "UTC");
    p.set("integer_datetimes", "on");
    p.set("standard_conforming_strings", "on");
    p
}
