//! What a pool's servers are doing besides waiting idle (`Counts`): lent to
//! clients, opening, being cleaned up, holding a probe's or a replication
//! client's place. A server moves from one to another only through these
//! methods, each of which moves it whole, so that with the idle ones (and
//! the fleet's query) they add up to what the pool holds (`State::total`).

/// The pool's servers by what they are doing, idle ones aside.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Counts {
    /// Lent to clients.
    active: u32,
    /// Connects in flight.
    connecting: u32,
    /// Being cleaned up after a client left them dirty.
    recovering: u32,
    /// Liveness probe sessions holding a place of the pool (`places.rs`).
    probing: u32,
    /// Places replication clients hold (`replication.rs`): each is a server
    /// connection of its client's alone, never lent.
    replicating: u32,
}

impl Counts {
    /// Lent to clients.
    pub(super) fn active(&self) -> u32 {
        self.active
    }

    /// Connects in flight.
    pub(super) fn connecting(&self) -> u32 {
        self.connecting
    }

    /// Being cleaned up after their clients.
    pub(super) fn recovering(&self) -> u32 {
        self.recovering
    }

    /// Replication clients' places.
    pub(super) fn replicating(&self) -> u32 {
        self.replicating
    }

    /// All of them.
    pub(super) fn sum(&self) -> u32 {
        self.active + self.connecting + self.recovering + self.probing + self.replicating
    }

    /// A server was lent (from idle, or handed to a waiter).
    pub(super) fn lent(&mut self) {
        self.active += 1;
    }

    /// A lent server came back (to go on, or to close).
    pub(super) fn returned(&mut self) {
        self.active -= 1;
    }

    /// A lent server came back dirty: it is cleaned up before it goes on.
    pub(super) fn returned_dirty(&mut self) {
        self.active -= 1;
        self.recovering += 1;
    }

    /// The clean-up of a server ended (it goes on, or closes).
    pub(super) fn recovery_ended(&mut self) {
        self.recovering -= 1;
    }

    /// A connect started.
    pub(super) fn connect_started(&mut self) {
        self.connecting += 1;
    }

    /// A connect ended (its server, if one logged in, is handed over next).
    pub(super) fn connect_ended(&mut self) {
        self.connecting -= 1;
    }

    /// A liveness probe's session took a place of the pool.
    pub(super) fn probe_started(&mut self) {
        self.probing += 1;
    }

    /// A liveness probe's session gave its place back.
    pub(super) fn probe_ended(&mut self) {
        self.probing -= 1;
    }

    /// A replication client took a free place of the pool.
    pub(super) fn replication_started(&mut self) {
        self.replicating += 1;
    }

    /// A lent server's place became a replication client's.
    pub(super) fn lent_to_replication(&mut self) {
        self.active -= 1;
        self.replicating += 1;
    }

    /// A replication client gave its place back.
    pub(super) fn replication_ended(&mut self) {
        self.replicating -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_moves_whole_between_places() {
        let mut c = Counts::default();
        c.connect_started();
        c.connect_ended();
        c.lent();
        c.lent();
        c.returned_dirty();
        assert_eq!((c.active(), c.recovering(), c.sum()), (1, 1, 2));
        c.lent_to_replication();
        c.recovery_ended();
        assert_eq!((c.active(), c.replicating(), c.sum()), (0, 1, 1));
        c.probe_started();
        assert_eq!(c.sum(), 2);
    }
}
