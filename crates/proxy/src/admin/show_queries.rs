//! SHOW QUERIES: the statements that queued for a server, by fingerprint,
//! in every pool: which one holds the servers now, and what each cost.
//! A transaction is counted when it had to queue (`pool::queries`); the
//! rows come from the pools' tables, most servers held first, then most
//! server time. weir's own command (PgBouncer has none).

use std::sync::Arc;

use super::result::{int, text, Kind, ResultSet};
use crate::state::Shared;

use Kind::{Int, Text};

const COLUMNS: &[(&str, Kind)] = &[
    ("database", Text),
    ("user", Text),
    ("fingerprint", Text),
    ("query", Text),
    ("calls", Int),
    ("servers_held", Int),
    ("waiting", Int),
    ("server_time_us", Int),
    ("wait_time_us", Int),
    ("errors_57014", Int),
    ("errors_25p02", Int),
    ("errors_40p01", Int),
    ("errors_other", Int),
];

/// SHOW QUERIES.
pub(super) fn queries(shared: &Arc<Shared>) -> ResultSet {
    let mut rows = Vec::new();
    for pool in shared.pools.all() {
        for q in pool.queries() {
            rows.push((pool.key.clone(), q));
        }
    }
    rows.sort_by(|(_, a), (_, b)| b.held.cmp(&a.held).then(b.server_time.cmp(&a.server_time)));
    let mut rs = ResultSet::new(COLUMNS);
    for (key, q) in rows {
        let [canceled, aborted, deadlock, other] = q.errors;
        rs.push(vec![
            text(&key.database),
            text(&key.user),
            text(format!("{:016x}", q.fingerprint)),
            text(&*q.text),
            int(q.calls),
            int(q.held),
            int(q.waiting),
            int(q.server_time.as_micros() as u64),
            int(q.wait_time.as_micros() as u64),
            int(canceled),
            int(aborted),
            int(deadlock),
            int(other),
        ]);
    }
    rs
}
