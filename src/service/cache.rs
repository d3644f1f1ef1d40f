//! The hot tail cache: each stream's most recent records, so live readers and fan-out are served
//! from memory. Bodies are shared `Bytes`, never copied per reader.
//!
//! Each stream keeps at most `per_stream_bytes` / `per_stream_records`; all streams together stay
//! within `total_bytes`, because a stream that appends while the total is over budget evicts its
//! own oldest records first. Its newest record too: a record larger than a stream's share, or
//! any while all caches are over budget, is read from storage instead (kept regardless, one
//! large record per stream would hold memory without bound). Bytes count what a record takes in
//! memory, itself included, not only its body.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::model::Record;
use crate::storage::ByteBudget;

#[derive(Clone, Copy, Debug)]
pub struct CacheLimits {
    pub per_stream_bytes: usize,
    pub per_stream_records: usize,
    pub total_bytes: usize,
}

impl Default for CacheLimits {
    fn default() -> Self {
        CacheLimits {
            per_stream_bytes: 1 << 20,
            per_stream_records: 4096,
            total_bytes: 256 << 20,
        }
    }
}

/// A cache's queue keeps room for this many records however few it holds (see
/// `Held::give_back_room`).
const SPARE_ROOM_KEPT: usize = 64;

/// The memory all tail caches share.
#[derive(Debug)]
pub struct CacheBudget {
    limits: CacheLimits,
    used: AtomicUsize,
}

impl CacheBudget {
    pub fn new(limits: CacheLimits) -> Arc<Self> {
        Arc::new(CacheBudget {
            limits,
            used: AtomicUsize::new(0),
        })
    }

    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }
}

/// One stream's cache: contiguous records ending at the stream's writer-side tail.
///
/// Most streams of a server are idle and never cache anything, so an empty cache is one null
/// pointer; its parts are allocated with its first records.
#[derive(Default)]
pub struct TailCache {
    held: Option<Box<Held>>,
}

struct Held {
    budget: Arc<CacheBudget>,
    records: VecDeque<Record>,
    bytes: usize,
}

impl TailCache {
    pub fn new() -> Self {
        TailCache::default()
    }

    /// Records `from <= seq < until`, up to about `max_bytes`, or `None` when the cache does not
    /// reach back to `from`.
    pub fn read(&self, from: u64, until: u64, max_bytes: usize) -> Option<Vec<Record>> {
        let records = &self.held.as_ref()?.records;
        let first = records.front()?.seq;
        let skip = usize::try_from(from.checked_sub(first)?).ok()?;
        let mut out = Vec::new();
        let mut budget = ByteBudget::new(max_bytes);
        for record in records.iter().skip(skip).take_while(|r| r.seq < until) {
            if !budget.take(record) {
                break;
            }
            out.push(record.clone());
        }
        Some(out)
    }

    /// Adds newly appended records, evicting the oldest beyond the limits of `budget` (the
    /// budget all caches share).
    pub fn push(&mut self, budget: &Arc<CacheBudget>, records: &[Record]) {
        if records.is_empty() {
            return;
        }
        let held = self.held.get_or_insert_with(|| {
            Box::new(Held {
                budget: budget.clone(),
                records: VecDeque::new(),
                bytes: 0,
            })
        });
        let limits = held.budget.limits;
        for record in records {
            // Room first: pushing past the record limit and evicting after would double the
            // queue's allocation for one record over.
            if held.records.len() >= limits.per_stream_records.max(1) {
                held.pop_oldest();
            }
            let size = memory_of(record);
            held.bytes += size;
            held.budget.used.fetch_add(size, Ordering::Relaxed);
            held.records.push_back(record.clone());
        }
        while !held.records.is_empty()
            && (held.bytes > limits.per_stream_bytes
                || held.records.len() > limits.per_stream_records
                || held.budget.used() > limits.total_bytes)
        {
            held.pop_oldest();
        }
        if held.records.is_empty() {
            // Its queue's room goes too: it may have held thousands of records.
            self.held = None;
        } else {
            held.give_back_room();
        }
    }
}

impl Held {
    /// Frees most of the queue's room once it is mostly empty. The budget counts the records
    /// held, not the room they once took: a stream that evicted itself down to a few records
    /// (its push found all caches over budget) kept room for the hundreds it had held, and with
    /// streams coming and going that memory grew with every stream ever written (about 22 KiB
    /// each in the 50M-record run) while the budget said all was well.
    fn give_back_room(&mut self) {
        let len = self.records.len();
        if self.records.capacity() > SPARE_ROOM_KEPT.max(4 * len) {
            self.records.shrink_to(2 * len);
        }
    }

    fn pop_oldest(&mut self) {
        if let Some(old) = self.records.pop_front() {
            let size = memory_of(&old);
            self.bytes -= size;
            self.budget.used.fetch_sub(size, Ordering::Relaxed);
        }
    }
}

/// The memory a cached record takes: with small records the record itself weighs about as much
/// as its body, and a budget of body bytes alone would hold twice what it says.
fn memory_of(record: &Record) -> usize {
    let header_places = record.headers.len() * std::mem::size_of::<(bytes::Bytes, bytes::Bytes)>();
    std::mem::size_of::<Record>() + header_places + record.held_len()
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Offset;
    use crate::model::record::lay_out;
    use bytes::Bytes;

    fn records(from: u64, n: u64, size: usize) -> Vec<Record> {
        let bodies = (0..n).map(|_| Bytes::from(vec![b'x'; size])).collect();
        lay_out(Offset::new(from, from * size as u64), 0, bodies)
    }

    #[test]
    fn reads_are_served_only_from_where_the_cache_begins() {
        let budget = CacheBudget::new(CacheLimits {
            per_stream_bytes: 1000,
            per_stream_records: 3,
            total_bytes: 1000,
        });
        let mut cache = TailCache::new();
        assert!(cache.read(0, 1, usize::MAX).is_none(), "nothing cached yet");
        cache.push(&budget, &records(0, 5, 1));
        assert!(
            cache.read(1, 5, usize::MAX).is_none(),
            "records 0 and 1 were evicted"
        );
        let got = cache.read(2, 4, usize::MAX).unwrap();
        assert_eq!(got.iter().map(|r| r.seq).collect::<Vec<_>>(), [2, 3]);
    }

    #[test]
    fn a_cache_that_evicts_itself_down_to_a_few_records_gives_back_their_room() {
        let each = memory_of(&records(0, 1, 10)[0]);
        let budget = CacheBudget::new(CacheLimits {
            per_stream_bytes: usize::MAX,
            per_stream_records: usize::MAX,
            total_bytes: 1000 * each,
        });
        let mut other = TailCache::new();
        other.push(&budget, &records(0, 999, 10));
        // All caches are over budget once these are in: this stream evicts all but one.
        let mut cache = TailCache::new();
        cache.push(&budget, &records(0, 1000, 10));
        let held = cache.held.as_ref().expect("one record kept");
        assert_eq!(held.records.len(), 1);
        assert!(
            held.records.capacity() <= SPARE_ROOM_KEPT,
            "room for {} records kept for 1",
            held.records.capacity()
        );
    }

    #[test]
    fn all_caches_together_stay_within_the_total_budget() {
        let each = memory_of(&records(0, 1, 10)[0]);
        let budget = CacheBudget::new(CacheLimits {
            per_stream_bytes: 10 * each,
            per_stream_records: 100,
            total_bytes: 15 * each,
        });
        let mut a = TailCache::new();
        let mut b = TailCache::new();
        a.push(&budget, &records(0, 10, 10));
        b.push(&budget, &records(0, 10, 10));
        assert!(budget.used() <= 15 * each);
        assert_eq!(b.read(5, 10, usize::MAX).unwrap().len(), 5);
        drop(a);
        drop(b);
        assert_eq!(budget.used(), 0, "dropped caches return their memory");
    }

    #[test]
    fn while_all_caches_are_over_budget_an_appending_stream_keeps_not_even_its_newest_record() {
        let each = memory_of(&records(0, 1, 10)[0]);
        let budget = CacheBudget::new(CacheLimits {
            per_stream_bytes: 10 * each,
            per_stream_records: 100,
            total_bytes: 10 * each,
        });
        let (mut a, mut b) = (TailCache::new(), TailCache::new());
        a.push(&budget, &records(0, 10, 10));
        b.push(&budget, &records(0, 1, 10));
        assert_eq!(budget.used(), 10 * each, "within the total");
        assert!(b.read(0, 1, usize::MAX).is_none(), "read from storage");
        assert!(b.held.is_none(), "nothing held for it");
    }

    #[test]
    fn a_record_larger_than_a_streams_share_is_not_kept() {
        let budget = CacheBudget::new(CacheLimits {
            per_stream_bytes: 1000,
            per_stream_records: 100,
            total_bytes: 1 << 20,
        });
        let mut cache = TailCache::new();
        cache.push(&budget, &records(0, 1, 5000));
        assert!(cache.read(0, 1, usize::MAX).is_none());
        assert_eq!(budget.used(), 0);
        cache.push(&budget, &records(1, 1, 10));
        assert_eq!(
            cache.read(1, 2, usize::MAX).unwrap().len(),
            1,
            "small ones are"
        );
    }

    #[test]
    fn the_budget_counts_what_a_record_takes_not_only_its_body() {
        let each = memory_of(&records(0, 1, 1)[0]);
        assert!(each > 1);
        let budget = CacheBudget::new(CacheLimits {
            per_stream_bytes: 10 * each,
            per_stream_records: 1000,
            total_bytes: 1 << 20,
        });
        let mut cache = TailCache::new();
        cache.push(&budget, &records(0, 20, 1));
        assert_eq!(cache.read(10, 20, usize::MAX).unwrap().len(), 10);
        assert!(cache.read(9, 20, usize::MAX).is_none());
        assert_eq!(budget.used(), 10 * each);
    }

    #[test]
    fn a_full_cache_never_allocates_room_for_more_than_its_record_limit() {
        let budget = CacheBudget::new(CacheLimits {
            per_stream_bytes: 1 << 20,
            per_stream_records: 64,
            total_bytes: 1 << 20,
        });
        let mut cache = TailCache::new();
        for seq in 0..200 {
            cache.push(&budget, &records(seq, 1, 1));
        }
        let held = cache.held.as_ref().unwrap();
        assert_eq!(held.records.len(), 64);
        assert!(held.records.capacity() < 128, "{}", held.records.capacity());
    }

    #[test]
    fn a_read_at_the_far_end_of_a_full_cache_returns_only_newer_records() {
        let budget = CacheBudget::new(CacheLimits::default());
        let mut cache = TailCache::new();
        cache.push(&budget, &records(0, 4096, 1));
        let got = cache.read(4094, u64::MAX, usize::MAX).unwrap();
        assert_eq!(got.iter().map(|r| r.seq).collect::<Vec<_>>(), [4094, 4095]);
        assert!(cache.read(4096, u64::MAX, usize::MAX).unwrap().is_empty());
        assert!(cache.read(5000, u64::MAX, usize::MAX).unwrap().is_empty());
    }
}
