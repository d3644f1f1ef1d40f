//! The visible snapshot (seed 000 §3): publishing one at a retained offset, and deleting it
//! while bootstrap does not need it.

use super::{Command, Conflict, Ledger, Refusal};
use crate::model::offset::Offset;
use crate::model::stream::SnapshotInfo;

/// The command: make `snapshot` the visible one, if the visible one is `expected_digest` (when
/// the request names one).
pub struct PublishSnapshot<'a> {
    pub snapshot: SnapshotInfo,
    pub expected_digest: Option<&'a str>,
}

/// What an accepted publish does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Published {
    /// The same snapshot is there already: a repeat, acknowledged once the first is durable.
    Repeat,
    /// The snapshot is the visible one now: store it (blob and metadata).
    Replaced,
}

impl Command for PublishSnapshot<'_> {
    type Outcome = Result<Published, Refusal>;

    /// A repeat succeeds as the first publish did, whatever it was conditioned on (a client
    /// retrying after a lost response must not see a conflict); another snapshot at the offset
    /// conflicts; then the condition, then retention (which may have moved since the offset was
    /// checked). An accepted publish renews the stream.
    fn apply(self, ledger: &mut Ledger<'_>, now_ms: i64) -> Self::Outcome {
        ledger.present()?;
        let PublishSnapshot {
            snapshot,
            expected_digest,
        } = self;
        let meta = &mut *ledger.meta;
        let current = meta.extra().snapshot.as_ref();
        let published = match current.filter(|s| s.offset == snapshot.offset) {
            Some(same) if same.digest == snapshot.digest => Published::Repeat,
            Some(_) => return Err(Refusal::Conflict(Conflict::SnapshotDiffers)),
            None => {
                if let Some(expected) = expected_digest
                    && current.is_none_or(|s| s.digest != expected)
                {
                    return Err(Refusal::Conflict(Conflict::SnapshotMatch));
                }
                if snapshot.offset < meta.retained_from {
                    return Err(Refusal::Retained {
                        first: meta.retained_from,
                    });
                }
                meta.extra_mut().snapshot = Some(snapshot);
                Published::Replaced
            }
        };
        *ledger.last_access_ms = now_ms;
        Ok(published)
    }
}

/// The command: delete the visible snapshot, which must be the one at `at`.
pub struct DeleteSnapshot {
    pub at: Offset,
}

impl Command for DeleteSnapshot {
    type Outcome = Result<(), Refusal>;

    /// Bootstrap starts at the snapshot once retention has moved past the stream's start, so
    /// then it stays.
    fn apply(self, ledger: &mut Ledger<'_>, _now_ms: i64) -> Self::Outcome {
        ledger.present()?;
        let meta = &mut *ledger.meta;
        if (meta.extra().snapshot.as_ref()).is_none_or(|s| s.offset != self.at) {
            return Err(Refusal::SnapshotNotFound);
        }
        if meta.retained_from > Offset::START {
            return Err(Refusal::Conflict(Conflict::SnapshotNeeded));
        }
        meta.extra_mut().snapshot = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
