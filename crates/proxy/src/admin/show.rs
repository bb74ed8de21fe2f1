//! The `SHOW` commands: which module lists what. Each listing reads shared
//! state only and changes nothing; PgBouncer's columns come first (PgBouncer
//! 1.23's, in its order and with its types; the later columns of newer
//! versions after them), weir's own after them. The pools and databases are
//! in `show_pools`, the client and server connections in
//! `show_connections`, this process's settings, users, peers and state in
//! `show_process`, the statistics in `stats`. VERSION and HELP are answered
//! here.

use std::sync::Arc;

use super::command::{Show, SYNOPSIS};
use super::result::{text, Kind, ResultSet};
use super::{show_connections as connections, show_pools as pools, show_process as process, show_queries, stats};
use crate::state::Shared;

use Kind::Text;

/// Runs one SHOW.
pub fn show(what: Show, shared: &Arc<Shared>) -> ResultSet {
    match what {
        Show::Pools => pools::pools(shared),
        Show::Stats => stats::stats(shared),
        Show::StatsTotals => stats::stats_part(shared, false),
        Show::StatsAverages => stats::stats_part(shared, true),
        Show::Totals => stats::totals(shared),
        Show::Clients => connections::clients(shared),
        Show::Servers => connections::servers(shared),
        Show::Databases => pools::databases(shared),
        Show::Users => process::users(shared),
        Show::Config => process::config(shared),
        Show::Lists => pools::lists(shared),
        Show::Mem => process::mem(),
        Show::Sockets => connections::sockets(shared, false),
        Show::ActiveSockets => connections::sockets(shared, true),
        Show::DnsHosts => process::dns_hosts(),
        Show::DnsZones => process::dns_zones(),
        Show::Fds => process::fds(),
        Show::State => process::state(shared),
        Show::Peers => process::peers(shared),
        Show::PeerPools => process::peer_pools(shared),
        Show::Queries => show_queries::queries(shared),
        Show::Version => version(),
        Show::Help => help(),
    }
}

fn version() -> ResultSet {
    let mut rs = ResultSet::new(&[("version", Text)]);
    rs.push(vec![text(format!("weir {}", env!("CARGO_PKG_VERSION")))]);
    rs
}

fn help() -> ResultSet {
    let mut rs = ResultSet::new(&[("command", Text), ("description", Text)]);
    for (cmd, what) in SYNOPSIS {
        rs.push(vec![text(*cmd), text(*what)]);
    }
    rs
}
