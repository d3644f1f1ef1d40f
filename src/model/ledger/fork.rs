//! What a fork asks of its source: a source it may be made from, the snapshot it starts with
//! when the source's history is trimmed, the source taking it (one more fork reading through it),
//! and releasing it when the fork goes.

use super::retention::deletable_below;
use super::{Command, Conflict, Ledger, Refusal};
use crate::model::offset::Offset;
use crate::model::stream::SnapshotInfo;

/// The most streams a fork chain holds, the root included. Reads, deletions and cascades walk
/// the chain; the bound keeps each walk short and its nesting far from the stack's limit.
pub const MAX_FORK_CHAIN: usize = 128;

/// What decides whether a stream may be forked at all.
#[derive(Clone, Copy, Debug, Default)]
pub struct Source {
    /// It is a read-only mirror here.
    pub mirrored: bool,
    /// Its records are sealed with an S2 client's key.
    pub encrypted: bool,
    /// The streams of its fork chain, itself included.
    pub chain: usize,
}

impl Source {
    /// A mirror cannot be forked (a rebuild after a gap upstream could not keep the fork's
    /// history), nor a sealed stream (the fork would hold ciphertext no face could open), nor a
    /// stream whose chain is full.
    pub fn forkable(self) -> Result<(), Refusal> {
        if self.mirrored {
            return Err(Refusal::Conflict(Conflict::ForkOfMirror));
        }
        if self.encrypted {
            return Err(Refusal::Encrypted);
        }
        if self.chain >= MAX_FORK_CHAIN {
            return Err(Refusal::ForkChainTooLong { chain: self.chain });
        }
        Ok(())
    }
}

/// Whether a fork at `anchor` of a source retained from `first` inherits its snapshot: a fork
/// starts where its source's retained history does, and a stream that answers 410 below its
/// retained offset must bootstrap from a snapshot covering it (seed 000 §3.4). An anchor below
/// retention is refused when the source takes the fork.
pub fn inherits_snapshot(first: Offset, anchor: Offset) -> bool {
    first > Offset::START && anchor >= first
}

/// The inherited snapshot must not start after the fork does.
pub fn covers(snapshot: &SnapshotInfo, anchor: Offset) -> Result<(), Refusal> {
    if snapshot.offset > anchor {
        return Err(Refusal::Conflict(Conflict::ForkBeforeSnapshot));
    }
    Ok(())
}

/// The command on the source, as the fork is created: take a fork planned at `anchor` with
/// `inherited` (the snapshot the plan found). Checked again here, under the source's lock:
/// the source may have been deleted, retained past the anchor or given another snapshot since.
pub struct TakeFork<'a> {
    pub anchor: Offset,
    pub inherited: Option<&'a SnapshotInfo>,
}

impl Command for TakeFork<'_> {
    /// The source's first retained offset, where the fork's history starts.
    type Outcome = Result<Offset, Refusal>;

    fn apply(self, ledger: &mut Ledger<'_>, _now_ms: i64) -> Self::Outcome {
        if *ledger.removed || ledger.meta.soft_deleted {
            return Err(Refusal::ForkSourceGone);
        }
        let first = ledger.meta.retained_from;
        if self.anchor < first {
            return Err(Refusal::Retained { first });
        }
        if first > Offset::START && ledger.meta.extra().snapshot.as_ref() != self.inherited {
            return Err(Refusal::Conflict(Conflict::ForkSnapshotChanged));
        }
        *ledger.forks += 1;
        Ok(first)
    }
}

/// The command on the source when one of its forks is gone.
pub struct ReleaseFork;

/// What the source does once a fork let go of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Released {
    /// It was kept only for its forks, and the last one went: it goes too.
    pub cascade: bool,
    /// The records its retention passed while forks held them may go now: those below this.
    pub trim_below: Option<u64>,
}

impl Command for ReleaseFork {
    type Outcome = Released;

    fn apply(self, ledger: &mut Ledger<'_>, _now_ms: i64) -> Released {
        *ledger.forks = ledger.forks.saturating_sub(1);
        let gone = *ledger.removed;
        let cascade = *ledger.forks == 0 && ledger.meta.soft_deleted && !gone;
        let trim_below = (!gone && !cascade)
            .then(|| deletable_below(ledger.meta.retained_from, *ledger.forks))
            .flatten();
        Released {
            cascade,
            trim_below,
        }
    }
}

#[cfg(test)]
mod tests;
