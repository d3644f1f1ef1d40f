//! A mirror's changes: the upstream's records, appended exactly as they are upstream (same
//! offsets, ordinals, bytes and timestamps), and the upstream's state beside them.

use super::{Command, Conflict, Ledger, Refusal};
use crate::model::attrs::Attrs;
use crate::model::offset::Offset;
use crate::model::record::Record;
use crate::model::stream::SnapshotInfo;

/// Records of the upstream that follow one another; checked when it is made, before any of them
/// is staged.
pub struct MirrorBatch<'r> {
    records: &'r [Record],
}

impl<'r> MirrorBatch<'r> {
    pub fn new(records: &'r [Record]) -> Result<Self, Refusal> {
        if records
            .windows(2)
            .any(|w| w[1].offset() != w[0].next_offset())
        {
            return Err(Refusal::Conflict(Conflict::MirrorGap));
        }
        Ok(MirrorBatch { records })
    }
}

impl Command for MirrorBatch<'_> {
    type Outcome = Result<(), Refusal>;

    /// Moves the tail past the batch, which must start at it. A mirror's tail timestamp is its
    /// upstream's, whatever this server's clock says.
    fn apply(self, ledger: &mut Ledger<'_>, _now_ms: i64) -> Result<(), Refusal> {
        if *ledger.removed {
            return Err(Refusal::NotFound);
        }
        let (Some(first), Some(last)) = (self.records.first(), self.records.last()) else {
            return Ok(());
        };
        if first.offset() != ledger.meta.tail {
            return Err(Refusal::Conflict(Conflict::MirrorOffTail));
        }
        let meta = &mut *ledger.meta;
        meta.tail = last.next_offset();
        meta.last_timestamp_ms = meta.last_timestamp_ms.max(last.timestamp_ms);
        Ok(())
    }
}

/// The upstream's state beside its records, to bring the mirror's to.
pub struct MirrorMeta<'u> {
    pub closed: bool,
    pub tail: Offset,
    pub attrs: &'u Attrs,
    pub key_fingerprint: Option<&'u str>,
    pub snapshot: Option<&'u SnapshotInfo>,
    /// The upstream's snapshot is new to the mirror (its blob was fetched).
    pub new_snapshot: bool,
    pub retained_from: Offset,
}

/// What happens to the mirror's snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SnapshotChange {
    /// The upstream's new snapshot is stored, with its blob.
    Put,
    /// The upstream has none any more.
    Remove,
}

/// What changed in the mirror's metadata, which is then stored whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MirrorMetaChanged {
    pub snapshot: Option<SnapshotChange>,
    /// The first retained offset moved up: the records below it go.
    pub retained: bool,
}

impl Command for MirrorMeta<'_> {
    /// `None`: the mirror's metadata already is the upstream's.
    type Outcome = Result<Option<MirrorMetaChanged>, Refusal>;

    fn apply(self, ledger: &mut Ledger<'_>, _now_ms: i64) -> Self::Outcome {
        if *ledger.removed {
            return Err(Refusal::NotFound);
        }
        let meta = &mut *ledger.meta;
        let mut changed = false;
        // Closed only once every record is here.
        if self.closed && meta.tail == self.tail && !meta.closed {
            meta.closed = true;
            changed = true;
        }
        if meta.extra().attrs != *self.attrs {
            meta.extra_mut().attrs = self.attrs.clone();
            changed = true;
        }
        if let Some(fingerprint) = self.key_fingerprint
            && meta.extra().key_fingerprint.as_deref() != Some(fingerprint)
        {
            meta.extra_mut().key_fingerprint = Some(fingerprint.to_owned());
            changed = true;
        }
        let snapshot = if self.new_snapshot {
            meta.extra_mut().snapshot = self.snapshot.cloned();
            Some(SnapshotChange::Put)
        } else if self.snapshot.is_none() && meta.extra().snapshot.is_some() {
            meta.extra_mut().snapshot = None;
            Some(SnapshotChange::Remove)
        } else {
            None
        };
        let retained = self.retained_from > meta.retained_from && self.retained_from <= meta.tail;
        if retained {
            meta.retained_from = self.retained_from;
        }
        if !(changed || snapshot.is_some() || retained) {
            return Ok(None);
        }
        Ok(Some(MirrorMetaChanged { snapshot, retained }))
    }
}

#[cfg(test)]
mod tests;
