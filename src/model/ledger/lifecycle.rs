//! Deleting a stream: softly while forks still read through it (gone for its own clients, its
//! records kept for the forks), otherwise for good.

use super::{Command, Ledger};

/// How a stream was deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Removal {
    /// Kept for the forks that read through it; gone for its own clients (410).
    Soft,
    /// Gone for good (404).
    Hard,
}

/// The command: delete the stream, if `still` (what made a background pass pick it, such as
/// expiry or emptiness, checked again under the stream's lock; `true` for a client's delete).
pub struct Remove {
    pub still: bool,
}

/// What a deletion did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Removed {
    /// Its reason no longer holds: nothing changed.
    NotDue,
    /// It was already deleted this way: nothing to write.
    Was(Removal),
    /// Deleted now: softly (its metadata, marked, is stored) or for good (its data goes).
    Now(Removal),
}

impl Command for Remove {
    type Outcome = Removed;

    /// A stream gone for good stays so, whatever the reason; a reason that no longer holds
    /// changes nothing; then forks decide between soft and for good.
    fn apply(self, ledger: &mut Ledger<'_>, _now_ms: i64) -> Removed {
        if *ledger.removed {
            return Removed::Was(Removal::Hard);
        }
        if !self.still {
            return Removed::NotDue;
        }
        if *ledger.forks > 0 {
            if ledger.meta.soft_deleted {
                return Removed::Was(Removal::Soft);
            }
            ledger.meta.soft_deleted = true;
            return Removed::Now(Removal::Soft);
        }
        *ledger.removed = true;
        Removed::Now(Removal::Hard)
    }
}

#[cfg(test)]
mod tests;
