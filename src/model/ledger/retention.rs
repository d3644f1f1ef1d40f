//! Moves of a stream's first retained offset: Durable Streams retention, which may not pass the
//! visible snapshot, and S2 trims, which take a snapshot they pass with them.

use super::{Command, Conflict, Ledger, Refusal};
use crate::model::offset::Offset;

/// Why the first retained offset moves, which decides what happens to the visible snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetentionMove {
    /// Durable Streams retention: bootstrap starts at the snapshot, so retention may not pass
    /// it (checked under the stream's lock, so a snapshot deleted meanwhile is seen).
    KeepSnapshot,
    /// An S2 trim to this sequence number: a snapshot it passes goes with the trimmed records,
    /// and the trim command's pending mark is cleared in the same commit.
    Trim(u64),
}

/// The command: retain the stream from `at`.
pub struct Retain {
    pub at: Offset,
    pub why: RetentionMove,
}

/// What a retention move changed; the stream's metadata is then stored whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retained {
    /// The first retained offset moved: the records below it go.
    pub moved: bool,
    /// The visible snapshot was below the new start and went with the records.
    pub snapshot_dropped: bool,
}

impl Command for Retain {
    /// `None`: nothing to change (already retained from there, no trim pending up to it).
    type Outcome = Result<Option<Retained>, Refusal>;

    fn apply(self, ledger: &mut Ledger<'_>, _now_ms: i64) -> Self::Outcome {
        let Retain { at, why } = self;
        if *ledger.removed {
            return Err(Refusal::NotFound);
        }
        let meta = &mut *ledger.meta;
        let moves = at > meta.retained_from;
        let snapshot = meta.extra().snapshot.as_ref();
        if moves && why == RetentionMove::KeepSnapshot && snapshot.is_none_or(|s| at > s.offset) {
            return Err(Refusal::Conflict(Conflict::PassesSnapshot));
        }
        let settles = match why {
            RetentionMove::Trim(seq) => meta.extra().pending_trim.is_some_and(|p| p <= seq),
            RetentionMove::KeepSnapshot => false,
        };
        if !moves && !settles {
            return Ok(None);
        }
        if settles {
            meta.extra_mut().pending_trim = None;
        }
        let mut snapshot_dropped = false;
        if moves {
            meta.retained_from = at;
            // A snapshot below the retained start no longer leads to the records after it:
            // bootstrap would skip the trimmed ones. It goes with them.
            if (meta.extra().snapshot.as_ref()).is_some_and(|s| s.offset < at) {
                meta.extra_mut().snapshot = None;
                snapshot_dropped = true;
            }
        }
        Ok(Some(Retained {
            moved: moves,
            snapshot_dropped,
        }))
    }
}

/// The records that may be deleted from storage, those below this sequence number, when the
/// stream is retained from `retained_from`: none while forks read through it (their history
/// stays on disk, hidden from the stream's own readers by the retained offset, until the last
/// of them goes).
pub fn deletable_below(retained_from: Offset, forks: u32) -> Option<u64> {
    let below = retained_from.seq;
    (forks == 0 && below > 0).then_some(below)
}

#[cfg(test)]
mod tests;
