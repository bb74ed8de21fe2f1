//! The caps pools share (`max_db_connections` across a database's pools,
//! `max_user_connections` across a user's: `Cap`) and the place an eviction
//! freed under one of them, kept in the evicting pool's `State` for its next
//! connect (`Room`). Evicting is `evict.rs`.

use crate::server::CountSlot;

/// Which cap held a connect back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Cap {
    /// max_db_connections: the pools of this database share the count.
    Db,
    /// max_user_connections: the pools of this user share the count.
    User,
}

impl Cap {
    /// The setting that names the cap.
    pub(super) fn key(self) -> &'static str {
        match self {
            Cap::Db => "max_db_connections",
            Cap::User => "max_user_connections",
        }
    }
}

/// A place an eviction freed, kept for the evicting pool's next connect.
#[derive(Debug, Default)]
pub(super) struct Room {
    db: Option<CountSlot>,
    user: Option<CountSlot>,
}

impl Room {
    pub(super) fn give(&mut self, cap: Cap, slot: CountSlot) {
        match cap {
            Cap::Db => self.db = Some(slot),
            Cap::User => self.user = Some(slot),
        }
    }

    /// The kept place under `cap`, if there is one.
    pub(super) fn take(&mut self, cap: Cap) -> Option<CountSlot> {
        match cap {
            Cap::Db => self.db.take(),
            Cap::User => self.user.take(),
        }
    }

    /// A place is kept.
    pub(super) fn kept(&self) -> bool {
        self.db.is_some() || self.user.is_some()
    }

    /// Gives up whatever place is still kept; Some when one was.
    pub(super) fn release(&mut self) -> Option<()> {
        let had = self.kept();
        *self = Room::default();
        had.then_some(())
    }
}
