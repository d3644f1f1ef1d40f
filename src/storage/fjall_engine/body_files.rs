//! The directory of staged body files (see `storage::staged`): staging, reading, deleting, and
//! the cleanup at open of files nothing refers to.
//!
//! Two keyspaces say which files are referred to: `record_files` maps a stream's records to the
//! file holding their bodies (keyed like the last run that refers to it, so the purge that
//! deletes that run finds the entry and deletes the file), and `snapshot_files` maps a stream to
//! the file holding its snapshot, with the snapshot's length. Every file of the directory is in
//! one of them, or is deleted at the next open.
//!
//! Staged files are synced whatever `--sync` says: a commit may refer to a file only once the
//! file is durable, or a machine crash could keep the reference and lose the bytes. The cost
//! falls on the large request alone, not on the writer thread.

use std::collections::HashSet;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};

use bytes::Bytes;
use fjall::{Database, Keyspace};

use super::io;
use crate::storage::StorageError;
use crate::storage::staged::{self, Staged};

/// Bodies of at least this many bytes in all are staged: below it, copying them in the commit
/// costs less than the file, its sync and its directory sync.
pub(super) const STAGE_BYTES: usize = 1 << 20;

/// Spans of at least this many bytes are read by mapping the file rather than copying it into
/// the heap: for a catch-up read the copy was a third of the server's time, and catch-up reads of
/// 1 MiB bodies ran 15% faster mapped (A/B, 6 rounds). The threshold itself is not measured: it
/// keeps small reads, where a mapping's set-up and tear-down would weigh most, on the copy.
const MAP_BYTES: u64 = 64 << 10;

pub(super) const DIRECTORY: &str = "bodies";

pub(super) struct BodyFiles {
    dir: PathBuf,
    next: AtomicU64,
    /// The free-space reserve, for the error of a full disk.
    reserve: u64,
    /// To the thread that deletes files: unlinking a large file takes the file system a while
    /// (hundreds of milliseconds for a few hundred of them), which must not hold up the writer.
    deletions: Mutex<mpsc::Sender<Vec<u64>>>,
    /// Held by the deleting thread while it deletes, and by a backup while it takes its
    /// snapshot and opens the files the snapshot refers to (see [`BodyFiles::pause_deletions`]).
    deleting: Arc<Mutex<()>>,
}

/// What `snapshot_files` holds per stream: the file's number and the snapshot's length.
pub(super) struct SnapshotFile {
    pub(super) number: u64,
    pub(super) len: u64,
}

impl BodyFiles {
    /// Opens the directory under `data`, deleting every file that neither keyspace refers to.
    pub(super) fn open(
        data: &Path,
        record_files: &Keyspace,
        snapshot_files: &Keyspace,
        reserve: u64,
        unsynced: Option<Database>,
    ) -> Result<BodyFiles, StorageError> {
        let dir = data.join(DIRECTORY);
        if !dir.is_dir() {
            std::fs::create_dir_all(&dir).map_err(io)?;
            // The new directory's entry is synced before any commit can name a file in it.
            std::fs::File::open(data)
                .and_then(|parent| parent.sync_all())
                .map_err(io)?;
        }
        let mut referred = HashSet::new();
        for guard in record_files.iter() {
            let (_, value) = guard.into_inner().map_err(io)?;
            referred.insert(decode_number(&value)?);
        }
        for guard in snapshot_files.iter() {
            let (_, value) = guard.into_inner().map_err(io)?;
            referred.insert(SnapshotFile::decode(&value)?.number);
        }
        // Never a number something refers to, even a file that is missing: its references
        // would read the new file's bytes.
        let mut highest = referred.iter().copied().max();
        for entry in std::fs::read_dir(&dir).map_err(io)? {
            let entry = entry.map_err(io)?;
            let name = entry.file_name();
            let Some(number) = name.to_str().and_then(staged::file_number) else {
                continue;
            };
            highest = highest.max(Some(number));
            if !referred.remove(&number) {
                let file = entry.path();
                tracing::info!(file = %file.display(), "deleting an unreferenced staged body file");
                std::fs::remove_file(entry.path()).map_err(io)?;
            }
        }
        for number in referred {
            tracing::error!(
                file = %dir.join(staged::file_name(number)).display(),
                "a staged body file is referred to but missing: reads of what it held fail"
            );
        }
        let (deletions, deleted) = mpsc::channel::<Vec<u64>>();
        let deleter = dir.clone();
        let deleting = Arc::new(Mutex::new(()));
        let deleting_here = deleting.clone();
        std::thread::Builder::new()
            .name("runnel-unlink".into())
            .spawn(move || {
                for numbers in deleted {
                    // Commits not synced (`--sync none`) could be lost in a machine crash that
                    // keeps the deletion: the references would outlive their files. Synced
                    // first, they cannot.
                    if let Some(db) = &unsynced
                        && let Err(e) = db.persist(fjall::PersistMode::SyncAll)
                    {
                        let why = "could not sync before deleting staged body files";
                        tracing::warn!(error = %e, "{why}; they go at the next start");
                        continue;
                    }
                    let _deleting = deleting_here.lock().unwrap_or_else(|p| p.into_inner());
                    delete(&deleter, &numbers);
                }
            })
            .map_err(io)?;
        Ok(BodyFiles {
            dir,
            next: AtomicU64::new(highest.map_or(0, |n: u64| n.saturating_add(1))),
            reserve,
            deletions: Mutex::new(deletions),
            deleting,
        })
    }

    /// Keeps every file where it is while the guard lives: a snapshot taken under it refers
    /// only to files that exist until the guard goes, and a file opened by then stays readable
    /// after (an unlinked file lives on while open).
    pub(super) fn pause_deletions(&self) -> std::sync::MutexGuard<'_, ()> {
        self.deleting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The directory of the files.
    pub(super) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes `bodies` to a new file and syncs it. Blocking.
    pub(super) fn stage(&self, bodies: Vec<Bytes>) -> Result<Staged, StorageError> {
        let number = self.next.fetch_add(1, Ordering::Relaxed);
        Staged::write(&self.dir, number, bodies).map_err(|e| {
            if e.kind() == std::io::ErrorKind::StorageFull {
                StorageError::Full {
                    reserve: self.reserve,
                }
            } else {
                StorageError::Io(e.to_string())
            }
        })
    }

    /// `len` bytes at `place` in file `number`, or `None` when the file is gone: what referred
    /// to it was deleted (a trim, a removal) since the caller looked. Blocking.
    pub(super) fn read(
        &self,
        number: u64,
        place: u64,
        len: u64,
    ) -> Result<Option<Bytes>, StorageError> {
        let path = self.dir.join(staged::file_name(number));
        let mut file = match std::fs::File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(format!("opening {}: {e}", path.display()))),
        };
        let failed = |e: std::io::Error| io(format!("reading {}: {e}", path.display()));
        let held = file.metadata().map_err(failed)?.len();
        // Checked before anything is allocated for it: a corrupt reference must not size a
        // buffer.
        if place.checked_add(len).is_none_or(|end| end > held) {
            return Err(StorageError::Corrupt(format!(
                "{} holds {held} bytes, not the {len} at {place} referred to",
                path.display()
            )));
        }
        // A mapping keeps its whole file on disk while it lives, deleted or not, as long as a
        // slow reader takes to receive it: only a span that is most of its file is mapped, so
        // that holds at most twice what was read (a copy would hold as much memory instead).
        if len >= MAP_BYTES
            && len.saturating_mul(2) >= held
            && let Some(span) = map(&file, place, len)
        {
            return Ok(Some(span));
        }
        file.seek(SeekFrom::Start(place)).map_err(failed)?;
        let mut out = Vec::with_capacity(len as usize);
        file.take(len).read_to_end(&mut out).map_err(failed)?;
        if out.len() as u64 != len {
            return Err(StorageError::Corrupt(format!(
                "{} ended after {} of the {len} bytes at {place}",
                path.display(),
                out.len()
            )));
        }
        Ok(Some(Bytes::from(out)))
    }

    /// Deletes, in the background, files nothing refers to any more (their references'
    /// deletion is committed). A file not deleted (a failure, or a shutdown first) goes at the
    /// next open.
    pub(super) fn delete(&self, numbers: Vec<u64>) {
        if numbers.is_empty() {
            return;
        }
        let deletions = self.deletions.lock().unwrap_or_else(|p| p.into_inner());
        let _ = deletions.send(numbers);
    }
}

/// `len` bytes at `place` of `file`, mapped, with every page read in before this returns; `None`
/// where they are not mapped (another system, an old kernel, no mappings or memory left, a page
/// that could not be read in): then the caller copies them, and a disk error is that copy's.
///
/// A mapping stays valid only while its bytes stay as they were: a staged file is written once
/// and synced before anything refers to it, and afterwards only deleted, never truncated or
/// rewritten (an unlinked file lives on while mapped). Reading the pages in here means a disk
/// error is found now, as an error, not later as a signal when the bytes are touched; what is
/// left of that risk is a page evicted under memory pressure while a response still holds it,
/// and failing when read again.
#[cfg(target_os = "linux")]
fn map(file: &std::fs::File, place: u64, len: u64) -> Option<Bytes> {
    let len = usize::try_from(len).ok()?;
    // SAFETY: the file is never changed while mapped (above), and the mapping is read-only.
    let map = unsafe { memmap2::MmapOptions::new().offset(place).len(len).map(file) }.ok()?;
    map.advise(memmap2::Advice::PopulateRead).ok()?;
    Some(Bytes::from_owner(map))
}

#[cfg(not(target_os = "linux"))]
fn map(_: &std::fs::File, _: u64, _: u64) -> Option<Bytes> {
    None
}

fn delete(dir: &Path, numbers: &[u64]) {
    for number in numbers {
        let path = dir.join(staged::file_name(*number));
        if let Err(e) = std::fs::remove_file(&path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            let file = path.display();
            let later = "it goes at the next start";
            tracing::warn!(%file, error = %e, "could not delete a staged body file; {later}");
        }
    }
}

impl SnapshotFile {
    pub(super) fn encode(&self) -> [u8; 16] {
        let mut out = [0; 16];
        out[..8].copy_from_slice(&self.number.to_be_bytes());
        out[8..].copy_from_slice(&self.len.to_be_bytes());
        out
    }

    pub(super) fn decode(value: &[u8]) -> Result<SnapshotFile, StorageError> {
        let corrupt = || StorageError::Corrupt("a staged snapshot file reference".into());
        let (number, len) = value.split_at_checked(8).ok_or_else(corrupt)?;
        Ok(SnapshotFile {
            number: decode_number(number)?,
            len: decode_number(len)?,
        })
    }
}

pub(super) fn encode_number(number: u64) -> [u8; 8] {
    number.to_be_bytes()
}

pub(super) fn decode_number(value: &[u8]) -> Result<u64, StorageError> {
    let bytes: [u8; 8] = value
        .try_into()
        .map_err(|_| StorageError::Corrupt("a staged body file reference".into()))?;
    Ok(u64::from_be_bytes(bytes))
}

/// How many mappings of staged body files of the data directory `data` this process holds.
#[cfg(all(test, target_os = "linux"))]
pub(crate) fn mapped(data: &Path) -> usize {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let bodies = data.join(DIRECTORY);
    let bodies = bodies.to_str().unwrap();
    maps.lines().filter(|line| line.contains(bodies)).count()
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn a_mapped_span_holds_the_files_bytes_at_any_offset_and_outlives_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let bytes: Vec<u8> = (0..3 * MAP_BYTES).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        // Not a multiple of the page size: the mapping starts below it.
        let (place, len) = (1000, 2 * MAP_BYTES);
        let span = map(&file, place, len).expect("Linux maps");
        // A trim deletes the file while a reader still sends what it read.
        drop(file);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(span.len() as u64, len);
        assert!(span[..] == bytes[place as usize..(place + len) as usize]);
    }
}
