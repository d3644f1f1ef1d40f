//! The registry: every stream by name, and every bucket, behind one lock; and walks over it
//! that hold the lock a batch at a time.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{Stream, StreamService};
use crate::model::stream::BucketMeta;

/// Every stream by key, and every bucket. One lock, so that a stream is never created in a
/// bucket that is being deleted.
pub(super) struct Registry {
    /// Keyed by the stream's own name (one allocation for both).
    pub streams: BTreeMap<Arc<str>, Arc<Stream>>,
    /// The streams that may expire (a TTL or an expiry time), which the expiry sweep walks
    /// several times a second: a server of a million streams, few of them with a TTL, must not
    /// walk them all that often.
    pub expiring: BTreeMap<Arc<str>, Arc<Stream>>,
    pub buckets: BTreeMap<String, BucketMeta>,
}

/// How many streams a walk over the registry looks at per hold of its lock, which every request
/// takes: about a tenth of a millisecond's work.
pub(super) const WALKED_AT_ONCE: usize = 1024;

/// A walk over registered streams, in key order, in batches (see `StreamService::streams_where`).
struct Walk<'a, T> {
    /// Only streams whose keys start with this.
    prefix: &'a str,
    /// The last key walked.
    after: Option<Arc<str>>,
    picked: Vec<T>,
}

impl<'a, T> Walk<'a, T> {
    fn new(prefix: &'a str) -> Self {
        Walk {
            prefix,
            after: None,
            picked: Vec::new(),
        }
    }
}

impl Registry {
    pub(super) fn new(
        streams: BTreeMap<Arc<str>, Arc<Stream>>,
        buckets: BTreeMap<String, BucketMeta>,
    ) -> Registry {
        let expiring = streams
            .iter()
            .filter(|(_, stream)| stream.may_expire)
            .map(|(name, stream)| (name.clone(), stream.clone()))
            .collect();
        Registry {
            streams,
            expiring,
            buckets,
        }
    }

    /// Registers `stream` under its name, in place of any stream registered under it.
    pub(super) fn insert(&mut self, stream: Arc<Stream>) {
        if stream.may_expire {
            self.expiring.insert(stream.name.clone(), stream.clone());
        } else {
            self.expiring.remove(&stream.name);
        }
        self.streams.insert(stream.name.clone(), stream);
    }

    pub(super) fn remove(&mut self, name: &str) {
        self.expiring.remove(name);
        self.streams.remove(name);
    }

    /// The streams whose keys sort at or after `start`, in key order.
    pub(super) fn streams_from<'a>(
        &'a self,
        start: &'a str,
    ) -> impl Iterator<Item = (&'a Arc<str>, &'a Arc<Stream>)> + 'a {
        use std::ops::Bound;
        self.streams
            .range::<str, _>((Bound::Included(start), Bound::Unbounded))
    }
}

impl StreamService {
    pub(super) fn lock_registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Drops the registry entry of `stream`, if the name still maps to it.
    pub(super) fn forget(&self, stream: &Arc<Stream>) {
        let mut registry = self.lock_registry();
        if registry
            .streams
            .get(&stream.name)
            .is_some_and(|s| Arc::ptr_eq(s, stream))
        {
            registry.remove(&stream.name);
        }
    }

    /// How many streams and buckets the server holds, and the hot cache's memory.
    pub fn counts(&self) -> (usize, usize, usize) {
        let registry = self.lock_registry();
        (
            registry.streams.len(),
            registry.buckets.len(),
            self.cache_budget.used(),
        )
    }

    /// Bytes of stream data retained (appended and not trimmed), across all streams.
    pub fn retained_bytes(&self) -> u64 {
        let mut retained = 0;
        self.streams_where(
            |registry| &registry.streams,
            "",
            |s| -> Option<()> {
                let d = s.durable();
                retained += d.tail.pos.saturating_sub(d.first.pos);
                None
            },
        );
        retained
    }

    /// What `pick` makes of each stream of the registry's map `of` whose key starts with
    /// `prefix`, that it picks, in key order. The walk takes the registry lock for
    /// [`WALKED_AT_ONCE`] streams at a time, so a server of a million streams does not hold
    /// every request up for the whole walk; a stream registered or removed meanwhile may be
    /// seen or not.
    pub(super) fn streams_where<T>(
        &self,
        of: impl Fn(&Registry) -> &BTreeMap<Arc<str>, Arc<Stream>>,
        prefix: &str,
        mut pick: impl FnMut(&Arc<Stream>) -> Option<T>,
    ) -> Vec<T> {
        let mut walk = Walk::new(prefix);
        while self.walk_on(&mut walk, &of, &mut pick) {}
        walk.picked
    }

    /// [`Self::streams_where`] for the background tasks, which let the other tasks of their
    /// thread run between batches: a walk of a million streams takes about 100 ms.
    pub(super) async fn streams_where_in_turn<T>(
        &self,
        of: impl Fn(&Registry) -> &BTreeMap<Arc<str>, Arc<Stream>>,
        mut pick: impl FnMut(&Arc<Stream>) -> Option<T>,
    ) -> Vec<T> {
        let mut walk = Walk::new("");
        while self.walk_on(&mut walk, &of, &mut pick) {
            tokio::task::yield_now().await;
        }
        walk.picked
    }

    /// Takes `walk` one batch on; false once it has walked all its streams.
    fn walk_on<T>(
        &self,
        walk: &mut Walk<'_, T>,
        of: impl Fn(&Registry) -> &BTreeMap<Arc<str>, Arc<Stream>>,
        mut pick: impl FnMut(&Arc<Stream>) -> Option<T>,
    ) -> bool {
        use std::ops::Bound;
        let registry = self.lock_registry();
        let last = walk.after.take();
        let from = last
            .as_deref()
            .map_or(Bound::Included(walk.prefix), Bound::Excluded);
        let keys = of(&registry).range::<str, _>((from, Bound::Unbounded));
        let keys = keys.take_while(|(name, _)| name.starts_with(walk.prefix));
        let mut last: Option<&Arc<str>> = None;
        for (walked, (name, stream)) in keys.enumerate() {
            if walked == WALKED_AT_ONCE {
                walk.after = last.cloned();
                return true;
            }
            last = Some(name);
            walk.picked.extend(pick(stream));
        }
        false
    }
}
