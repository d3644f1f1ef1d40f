//! The directory of staged body files (see `storage::staged`): staging, reading, deleting, and
//! the cleanup at open of files nothing refers to.
//!
//! Two keyspaces say which files are referred to: `record_files` maps a stream's records to the
//! file holding their bodies (keyed like the last run that refers to it, so the purge that
//! deletes that run finds the entry and deletes the file), and `snapshot_files` maps a stream to
//! the file holding its snapshot. Every file of the directory is in one of them, or is deleted at
//! the next open.

use std::collections::HashSet;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use fjall::Keyspace;

use super::io;
use crate::storage::StorageError;
use crate::storage::staged::{self, Staged};

/// Bodies of at least this many bytes in all are staged: below it, copying them in the commit
/// costs less than the file, its sync and its directory sync.
pub(super) const STAGE_BYTES: usize = 1 << 20;

const DIRECTORY: &str = "bodies";

pub(super) struct BodyFiles {
    dir: PathBuf,
    next: AtomicU64,
    sync: bool,
    /// The free-space reserve, for the error of a full disk.
    reserve: u64,
}

impl BodyFiles {
    /// Opens the directory under `data`, deleting every file that neither keyspace refers to.
    pub(super) fn open(
        data: &Path,
        record_files: &Keyspace,
        snapshot_files: &Keyspace,
        sync: bool,
        reserve: u64,
    ) -> Result<BodyFiles, StorageError> {
        let dir = data.join(DIRECTORY);
        std::fs::create_dir_all(&dir).map_err(io)?;
        let mut referred = HashSet::new();
        for keyspace in [record_files, snapshot_files] {
            for guard in keyspace.iter() {
                let (_, value) = guard.into_inner().map_err(io)?;
                referred.insert(decode_number(&value)?);
            }
        }
        let mut highest = None;
        for entry in std::fs::read_dir(&dir).map_err(io)? {
            let entry = entry.map_err(io)?;
            let name = entry.file_name();
            let Some(number) = name.to_str().and_then(staged::file_number) else {
                continue;
            };
            highest = highest.max(Some(number));
            if !referred.remove(&number) {
                tracing::info!(file = %entry.path().display(), "deleting a staged body file no commit refers to");
                std::fs::remove_file(entry.path()).map_err(io)?;
            }
        }
        for number in referred {
            tracing::error!(
                file = %dir.join(staged::file_name(number)).display(),
                "a staged body file is referred to but missing: reads of what it held end early"
            );
        }
        Ok(BodyFiles {
            dir,
            next: AtomicU64::new(highest.map_or(0, |n: u64| n.saturating_add(1))),
            sync,
            reserve,
        })
    }

    /// Writes `bodies` to a new file. Blocking.
    pub(super) fn stage(&self, bodies: Vec<Bytes>) -> Result<Staged, StorageError> {
        let number = self.next.fetch_add(1, Ordering::Relaxed);
        Staged::write(&self.dir, number, bodies, self.sync).map_err(|e| {
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
    /// to it was deleted (a trim, a removal, a newer snapshot) since the caller looked. Blocking.
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
        file.seek(SeekFrom::Start(place)).map_err(failed)?;
        let want = usize::try_from(len).map_err(|_| io("a staged body too large to read"))?;
        let mut out = Vec::with_capacity(want);
        file.take(len).read_to_end(&mut out).map_err(failed)?;
        if out.len() != want {
            return Err(StorageError::Corrupt(format!(
                "{} holds {} bytes at {place}, not the {len} referred to",
                path.display(),
                out.len()
            )));
        }
        Ok(Some(Bytes::from(out)))
    }

    /// The whole of file `number`, or `None` when it is gone. Blocking.
    pub(super) fn read_whole(&self, number: u64) -> Result<Option<Bytes>, StorageError> {
        let path = self.dir.join(staged::file_name(number));
        match std::fs::read(&path) {
            Ok(bytes) => Ok(Some(Bytes::from(bytes))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(format!("reading {}: {e}", path.display()))),
        }
    }

    /// Deletes files nothing refers to any more (their references' deletion is committed).
    /// A failure is logged: the file goes at the next open.
    pub(super) fn delete(&self, numbers: &[u64]) {
        for number in numbers {
            let path = self.dir.join(staged::file_name(*number));
            if let Err(e) = std::fs::remove_file(&path)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(file = %path.display(), error = %e, "could not delete a staged body file; it goes at the next start");
            }
        }
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
