//! The memory that read responses hold, bounded across all readers. A read leases the bytes it
//! may read; while many readers hold leases (a client that reads slowly keeps its response
//! alive), new reads get smaller chunks instead of more memory. Reads never wait: each may
//! always read at least [`MIN_LEASE`] bytes (and one whole record), so every reader makes
//! progress.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// What a read may always take, however much other reads hold.
pub const MIN_LEASE: usize = 64 << 10;

pub struct ReadMemory {
    held: AtomicUsize,
    limit: usize,
}

impl ReadMemory {
    pub fn new(limit: usize) -> Arc<ReadMemory> {
        Arc::new(ReadMemory {
            held: AtomicUsize::new(0),
            limit,
        })
    }

    /// Leases up to `want` bytes: less when other reads hold most of the limit.
    pub fn lease(self: &Arc<Self>, want: usize) -> ReadLease {
        let free = self.limit.saturating_sub(self.held.load(Ordering::Relaxed));
        let bytes = want.min(free.max(MIN_LEASE));
        self.held.fetch_add(bytes, Ordering::Relaxed);
        ReadLease {
            memory: Some(Arc::clone(self)),
            bytes,
        }
    }

    /// Bytes leased now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }
}

/// Bytes a read holds until its response is gone.
#[derive(Default)]
pub struct ReadLease {
    memory: Option<Arc<ReadMemory>>,
    bytes: usize,
}

impl ReadLease {
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Holds what the read used: gives back the rest, or counts the more it took (a read
    /// always takes its first record whole, however large: 64 MiB on a lease of 1 MiB).
    pub fn keep(&mut self, used: usize) {
        if let Some(memory) = &self.memory {
            if used < self.bytes {
                memory.held.fetch_sub(self.bytes - used, Ordering::Relaxed);
            } else {
                memory.held.fetch_add(used - self.bytes, Ordering::Relaxed);
            }
        }
        self.bytes = used;
    }

    /// `bytes` that hold this lease until the last of their clones is dropped: a response piece
    /// rendered from the records read keeps their memory counted until it is sent.
    pub fn with_bytes(self, bytes: impl AsRef<[u8]> + Send + 'static) -> bytes::Bytes {
        bytes::Bytes::from_owner(Leased {
            bytes,
            _lease: self,
        })
    }
}

/// Bytes and the lease they hold.
struct Leased<B> {
    bytes: B,
    _lease: ReadLease,
}

impl<B: AsRef<[u8]>> AsRef<[u8]> for Leased<B> {
    fn as_ref(&self) -> &[u8] {
        self.bytes.as_ref()
    }
}

impl Drop for ReadLease {
    fn drop(&mut self) {
        if let Some(memory) = &self.memory {
            memory.held.fetch_sub(self.bytes, Ordering::Relaxed);
        }
    }
}

impl std::fmt::Debug for ReadLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ReadLease({} bytes)", self.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_get_less_once_others_hold_the_limit_but_never_nothing() {
        let memory = ReadMemory::new(10 * MIN_LEASE);
        let big = memory.lease(8 * MIN_LEASE);
        assert_eq!(big.bytes(), 8 * MIN_LEASE);
        let squeezed = memory.lease(8 * MIN_LEASE);
        assert_eq!(squeezed.bytes(), 2 * MIN_LEASE, "what is left");
        let floor = memory.lease(8 * MIN_LEASE);
        assert_eq!(floor.bytes(), MIN_LEASE, "at least the floor");
        let small = memory.lease(100);
        assert_eq!(small.bytes(), 100, "never more than asked");
        drop((big, squeezed, floor, small));
        assert_eq!(memory.held(), 0);
    }

    #[test]
    fn a_read_of_one_record_larger_than_its_lease_counts_the_whole_record() {
        let memory = ReadMemory::new(10 * MIN_LEASE);
        let mut lease = memory.lease(MIN_LEASE);
        lease.keep(64 * MIN_LEASE);
        assert_eq!(
            (lease.bytes(), memory.held()),
            (64 * MIN_LEASE, 64 * MIN_LEASE)
        );
        let next = memory.lease(MIN_LEASE);
        assert_eq!(next.bytes(), MIN_LEASE, "later reads still get the floor");
        drop((lease, next));
        assert_eq!(memory.held(), 0);
    }

    #[test]
    fn bytes_holding_a_lease_give_it_back_when_the_last_of_them_goes() {
        let memory = ReadMemory::new(10 * MIN_LEASE);
        let bytes = memory.lease(1000).with_bytes(b"rendered".to_vec());
        let piece = bytes.slice(2..);
        drop(bytes);
        assert_eq!(memory.held(), 1000, "a piece of them still holds it");
        assert_eq!(&piece[..], b"ndered");
        drop(piece);
        assert_eq!(memory.held(), 0);
    }

    #[test]
    fn a_read_gives_back_what_it_did_not_use() {
        let memory = ReadMemory::new(10 * MIN_LEASE);
        let mut lease = memory.lease(4 * MIN_LEASE);
        lease.keep(1000);
        assert_eq!((lease.bytes(), memory.held()), (1000, 1000));
        drop(lease);
        assert_eq!(memory.held(), 0);
    }
}
