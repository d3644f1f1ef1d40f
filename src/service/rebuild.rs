//! Rebuilding the streams from what the storage engine recovered, as the server starts.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use super::{Durable, Stream};
use crate::storage::{Change, RecoveredStream, StreamId};

/// Rebuilds the streams as the engine recovers them, one at a time.
///
/// A fork needs its source's handle. Ids only grow and a source exists before its forks, so a
/// source's id is below its forks' ids; forks (few) wait until every plain stream is built, and
/// are then built in id order, each after its source.
pub(super) struct Rebuild {
    now: i64,
    /// The built streams and their ids: plain streams first, then forks, each part in id order.
    ids: Vec<StreamId>,
    built: Vec<Arc<Stream>>,
    forks: Vec<RecoveredStream>,
    /// Built streams that were deleted while forks read through them.
    soft_deleted: Vec<Arc<Stream>>,
    /// Built streams whose retention passed the records the engine still holds.
    untrimmed: Vec<Arc<Stream>>,
}

/// What [`Rebuild`] leaves to the service.
pub(super) struct Rebuilt {
    /// Every stream to register, by name.
    pub streams: BTreeMap<Arc<str>, Arc<Stream>>,
    /// The soft-deleted streams no fork reads any more (left by an interrupted cascade), which
    /// are to be removed.
    pub orphans: Vec<StreamId>,
    /// The deletions of records retention passed while forks held them, for streams no fork
    /// holds any more (the last one went before the deletion was committed).
    pub held_back_trims: Vec<Change>,
}

impl Rebuild {
    pub(super) fn new(now: i64) -> Self {
        Rebuild {
            now,
            ids: Vec::new(),
            built: Vec::new(),
            forks: Vec::new(),
            soft_deleted: Vec::new(),
            untrimmed: Vec::new(),
        }
    }

    pub(super) fn take(&mut self, recovered: RecoveredStream) {
        if recovered.meta.extra().fork.is_some() {
            self.forks.push(recovered);
        } else {
            self.build(recovered, None);
        }
    }

    pub(super) fn finish(mut self) -> Rebuilt {
        if !self.ids.is_sorted() {
            let mut plain: Vec<Arc<Stream>> = std::mem::take(&mut self.built);
            plain.sort_unstable_by_key(|s| s.id);
            self.ids = plain.iter().map(|s| s.id).collect();
            self.built = plain;
        }
        let plain = self.ids.len();
        let mut forks = std::mem::take(&mut self.forks);
        forks.sort_unstable_by_key(|s| s.id);
        for fork in forks {
            let source_id = fork.meta.extra().fork.as_ref().map(|o| o.source_id);
            // A fork whose source is missing is left out.
            if let Some(source) = source_id.and_then(|id| self.find(id, plain)) {
                source.lock().forks += 1;
                self.build(fork, Some(source));
            }
        }
        let orphans = self.orphans();
        let gone: HashSet<StreamId> = orphans.iter().copied().collect();
        // Collected whole, the map is built from sorted keys in one pass, with full nodes: much
        // faster than a million inserts one by one, and smaller.
        let streams = self
            .built
            .into_iter()
            .filter(|s| gone.is_empty() || !gone.contains(&s.id))
            .map(|stream| (stream.name.clone(), stream))
            .collect();
        let held_back_trims = self
            .untrimmed
            .iter()
            .filter(|s| !gone.contains(&s.id))
            .filter_map(|s| s.lock().trim_records(s.id))
            .collect();
        Rebuilt {
            streams,
            orphans,
            held_back_trims,
        }
    }

    fn build(&mut self, mut recovered: RecoveredStream, source: Option<Arc<Stream>>) {
        if let Some(end) = recovered.stored_end {
            let meta = &mut recovered.meta;
            meta.tail = meta.tail.max(end.next);
            meta.last_timestamp_ms = meta.last_timestamp_ms.max(end.timestamp_ms);
        }
        let durable = Durable {
            tail: recovered.meta.tail,
            first: recovered.meta.retained_from,
            last_timestamp_ms: recovered.meta.last_timestamp_ms,
            meta_version: 0,
            closed: recovered.meta.closed,
            ready: true,
            removed: false,
            soft_deleted: recovered.meta.soft_deleted,
            write_failed: false,
            meta_write_failed: false,
        };
        let soft_deleted = recovered.meta.soft_deleted;
        let untrimmed = recovered.meta.retained_from.seq > recovered.trimmed_before;
        let stream = Arc::new(Stream::new(
            recovered.id,
            recovered.meta,
            recovered.producers.into_iter().collect(),
            source,
            durable,
            self.now,
        ));
        if soft_deleted {
            self.soft_deleted.push(stream.clone());
        }
        if untrimmed {
            self.untrimmed.push(stream.clone());
        }
        self.ids.push(stream.id);
        self.built.push(stream);
    }

    /// The built stream `id`; the first `plain` built streams and the rest are each in id order.
    fn find(&self, id: StreamId, plain: usize) -> Option<Arc<Stream>> {
        let (plain_ids, fork_ids) = self.ids.split_at(plain);
        let at = match plain_ids.binary_search(&id) {
            Ok(at) => at,
            Err(_) => plain + fork_ids.binary_search(&id).ok()?,
        };
        Some(self.built[at].clone())
    }

    /// The soft-deleted streams no fork reads through any more, then any source only they kept
    /// alive.
    fn orphans(&self) -> Vec<StreamId> {
        let mut candidates = self.soft_deleted.clone();
        let mut removed = Vec::new();
        loop {
            let (orphans, kept): (Vec<_>, Vec<_>) =
                candidates.into_iter().partition(|s| s.lock().forks == 0);
            candidates = kept;
            if orphans.is_empty() {
                return removed;
            }
            for orphan in orphans {
                if let Some(source) = &orphan.source {
                    let mut state = source.lock();
                    state.forks = state.forks.saturating_sub(1);
                }
                removed.push(orphan.id);
            }
        }
    }
}
