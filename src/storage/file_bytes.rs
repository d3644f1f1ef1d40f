//! Buffers whose bytes live in a file, so that a socket can be handed the file instead.
//!
//! Writing a buffer to a TCP socket copies every byte into the kernel; `sendfile` from a file
//! queues references to the file's cached pages instead. For a body sent to many readers (a
//! catch-up read of a popular range) that copy was a third of the server's time. A buffer made
//! here is a read-only mapping of its file, registered by address for as long as it lives, so
//! that whoever holds only a slice of it (a connection writing the body frames hyper hands it)
//! can find the file and the place in it ([`span_of`]).
//!
//! A registered file is never written again: the socket may still be sending its pages after the
//! buffer is gone, and the bytes sent must be the bytes the buffer held.

use std::fs::File;
use std::sync::Arc;

use bytes::Bytes;

/// Where a slice of a registered buffer lies in its file.
pub struct FileSpan {
    pub file: Arc<File>,
    pub offset: u64,
}

/// The file behind `slice`, when it lies inside one buffer made here.
pub fn span_of(slice: &[u8]) -> Option<FileSpan> {
    registry::span_of(slice)
}

/// `pieces`, back to back, in a new in-memory file, as one buffer; `None` where there are no
/// such files (another system, or none left to make), and then the caller keeps the pieces.
pub fn in_memory_file<'a>(pieces: impl IntoIterator<Item = &'a [u8]>) -> Option<Bytes> {
    registry::in_memory_file(pieces)
}

/// Runs of at least this many bytes are moved into a file; fewer cost less to copy than the
/// file costs to make.
const MOVE_FROM: usize = 16 * 1024;

/// The same bytes as `pieces`, with each run of pieces not in a file already moved into one
/// in-memory file (as long as it is worth it, and possible).
pub fn into_files(pieces: &[Bytes]) -> Vec<Bytes> {
    let mut moved = Vec::with_capacity(pieces.len());
    let mut run: Vec<Bytes> = Vec::new();
    for piece in pieces {
        if is_file_backed(piece) {
            move_run(&mut run, &mut moved);
            moved.push(piece.clone());
        } else {
            run.push(piece.clone());
        }
    }
    move_run(&mut run, &mut moved);
    moved
}

/// Moves `run` to the end of `out`, as one in-memory file where that is worth it and possible.
fn move_run(run: &mut Vec<Bytes>, out: &mut Vec<Bytes>) {
    let len: usize = run.iter().map(Bytes::len).sum();
    if len >= MOVE_FROM
        && let Some(file) = in_memory_file(run.iter().map(|piece| &piece[..]))
    {
        out.push(file);
        run.clear();
    } else {
        out.append(run);
    }
}

/// Whether `bytes` is (a slice of) a buffer made here.
pub fn is_file_backed(bytes: &[u8]) -> bool {
    registry::span_of(bytes).is_some()
}

#[cfg(target_os = "linux")]
mod registry {
    use std::collections::BTreeMap;
    use std::fs::File;
    use std::io::Write;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, PoisonError, RwLock};

    use bytes::Bytes;

    use super::FileSpan;

    /// The live buffers, by the address each starts at.
    static REGIONS: RwLock<BTreeMap<usize, Region>> = RwLock::new(BTreeMap::new());
    /// How many there are: most processes, most of the time, have none to look through.
    static LIVE: AtomicUsize = AtomicUsize::new(0);
    /// The most at once. Each holds its file open: past this many no new one is made, so that
    /// slow readers holding many cannot use up the process's file descriptors.
    const MAX_LIVE: usize = 4096;

    struct Region {
        end: usize,
        file: Arc<File>,
        offset: u64,
    }

    pub(super) fn span_of(slice: &[u8]) -> Option<FileSpan> {
        span_at(slice.as_ptr() as usize, slice.len())
    }

    /// The file behind the `len` bytes at address `start`.
    pub(super) fn span_at(start: usize, len: usize) -> Option<FileSpan> {
        if LIVE.load(Ordering::Relaxed) == 0 || len == 0 {
            return None;
        }
        let regions = REGIONS.read().unwrap_or_else(PoisonError::into_inner);
        let (base, region) = regions.range(..=start).next_back()?;
        (start.checked_add(len)? <= region.end).then(|| FileSpan {
            file: region.file.clone(),
            offset: region.offset + (start - base) as u64,
        })
    }

    pub(super) fn in_memory_file<'a>(pieces: impl IntoIterator<Item = &'a [u8]>) -> Option<Bytes> {
        if LIVE.load(Ordering::Relaxed) >= MAX_LIVE {
            return None;
        }
        let fd = rustix::fs::memfd_create("runnel-body", rustix::fs::MemfdFlags::CLOEXEC).ok()?;
        let mut file = File::from(fd);
        let mut len = 0;
        for piece in pieces {
            file.write_all(piece).ok()?;
            len += piece.len();
        }
        if len == 0 {
            return Some(Bytes::new());
        }
        map(Arc::new(file), 0, len)
    }

    fn map(file: Arc<File>, offset: u64, len: usize) -> Option<Bytes> {
        // SAFETY: the mapping is read-only, and a registered file is never written again (see
        // the module's documentation), so the bytes under it never change.
        let map = unsafe {
            memmap2::MmapOptions::new()
                .offset(offset)
                .len(len)
                .map(&*file)
        }
        .ok()?;
        let start = map.as_ptr() as usize;
        let region = Region {
            end: start + map.len(),
            file,
            offset,
        };
        REGIONS
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(start, region);
        LIVE.fetch_add(1, Ordering::Relaxed);
        Some(Bytes::from_owner(Registered(map)))
    }

    /// A registered mapping. It leaves the registry before it is unmapped, so an address is
    /// never found registered while something else may be mapped there.
    struct Registered(memmap2::Mmap);

    impl AsRef<[u8]> for Registered {
        fn as_ref(&self) -> &[u8] {
            &self.0
        }
    }

    impl Drop for Registered {
        fn drop(&mut self) {
            let start = self.0.as_ptr() as usize;
            REGIONS
                .write()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&start);
            LIVE.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod registry {
    use bytes::Bytes;

    use super::FileSpan;

    pub(super) fn span_of(_: &[u8]) -> Option<FileSpan> {
        None
    }

    pub(super) fn in_memory_file<'a>(_: impl IntoIterator<Item = &'a [u8]>) -> Option<Bytes> {
        None
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    #[test]
    fn an_in_memory_file_holds_the_pieces_back_to_back() {
        let body = in_memory_file([&b"abc"[..], b"", b"defg"]).expect("Linux has memfd");
        assert_eq!(&body[..], b"abcdefg");
    }

    #[test]
    fn runs_of_pieces_not_in_files_are_moved_into_one_file_each() {
        let in_file = in_memory_file([&[b'f'; MOVE_FROM][..]]).unwrap();
        let heap = |byte: u8, len: usize| Bytes::from(vec![byte; len]);
        let pieces = [
            heap(b'a', 10),
            heap(b'b', MOVE_FROM),
            in_file.clone(),
            heap(b'c', 10),
        ];
        let moved = into_files(&pieces);
        assert_eq!(
            moved.len(),
            3,
            "[a b] in one file, the file as it was, [c] left"
        );
        assert!(is_file_backed(&moved[0]) && moved[0].len() == 10 + MOVE_FROM);
        assert_eq!(moved[1].as_ptr(), in_file.as_ptr());
        assert!(!is_file_backed(&moved[2]));
        assert_eq!(moved.concat(), pieces.concat());
    }

    #[test]
    fn a_slice_of_a_file_backed_buffer_is_found_at_its_place_in_the_file() {
        let bytes: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        let body = in_memory_file([&bytes[..]]).unwrap();
        let slice = body.slice(70_000..90_000);
        let span = span_of(&slice).expect("registered");
        assert_eq!(span.offset, 70_000);
        let mut read = vec![0; slice.len()];
        span.file.read_exact_at(&mut read, span.offset).unwrap();
        assert_eq!(read, &slice[..]);
    }

    #[test]
    fn heap_bytes_and_slices_running_past_a_buffer_are_not_file_backed() {
        let body = in_memory_file([&[7u8; 5000][..]]).unwrap();
        assert!(registry::span_at(body.as_ptr() as usize, body.len() + 1).is_none());
        assert!(!is_file_backed(&vec![7u8; 5000]));
        assert!(is_file_backed(&body));
    }

    #[test]
    fn a_dropped_buffer_is_no_longer_registered() {
        let body = in_memory_file([&[1u8; 8192][..]]).unwrap();
        let (start, len) = (body.as_ptr() as usize, body.len());
        assert!(registry::span_at(start, len).is_some());
        drop(body);
        assert!(registry::span_at(start, len).is_none());
    }
}
