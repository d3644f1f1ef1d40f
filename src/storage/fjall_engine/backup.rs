//! Backups of a data directory, and restoring one into an empty directory.
//!
//! A backup is one file: every key of every keyspace as one database snapshot saw them, then
//! every staged body file those keys refer to, then an end entry with the number of entries and
//! a CRC-32 of every byte before it. The snapshot makes it consistent while the server writes:
//! an append is in it whole or not at all, and every append acknowledged before the backup
//! started is in it. Body files are not deleted between the snapshot and their opening (see
//! [`BodyFiles::pause_deletions`]), and an opened file stays readable after.
//!
//! Layout, integers big-endian:
//! - `MAGIC`;
//! - per key: `K`, the keyspace's name (u8 length), the key (u32 length), the value (u32 length);
//! - per body file: `F`, its number (u64), its bytes (u64 length);
//! - `E`, the number of entries (u64), the CRC-32 of everything before the `E` (u32).

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::MutexGuard;

use fjall::{Keyspace, Readable as _};

use super::body_files::{self, SnapshotFile};
use super::{Keyspaces, io as storage_io};
use crate::storage::StorageError;
use crate::storage::staged;

const MAGIC: &[u8] = b"RUNNEL BACKUP 1\n";
const KEY: u8 = b'K';
const FILE: u8 = b'F';
const END: u8 = b'E';

/// A restore commits its keys in batches of about this many bytes.
const RESTORE_BATCH_BYTES: usize = 16 << 20;

#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("cannot write the backup: {0}")]
    Write(io::Error),
    #[error("cannot read the backup: {0}")]
    Read(io::Error),
    #[error("cannot read staged body file {}: {error}", path.display())]
    BodyFile { path: PathBuf, error: io::Error },
    #[error(
        "not a Runnel backup (it does not start with {:?})",
        String::from_utf8_lossy(MAGIC)
    )]
    NotABackup,
    #[error("the backup is damaged: {0}")]
    Damaged(String),
    #[error("{} is not empty: a backup is restored into a new or empty directory only", .0.display())]
    NotEmpty(PathBuf),
    #[error("cannot write the restored directory {}: {error}", dir.display())]
    Restore { dir: PathBuf, error: io::Error },
}

/// What a backup holds, or what a restore wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackupSummary {
    pub keys: u64,
    pub files: u64,
    pub bytes: u64,
}

/// Writes a backup of `keyspaces` (whose staged body files are in `bodies`) to `out`.
/// `paused` holds body file deletions off; it is released once the files are open.
pub(super) fn write(
    keyspaces: &Keyspaces,
    bodies: &Path,
    paused: Option<MutexGuard<'_, ()>>,
    out: &mut dyn Write,
) -> Result<BackupSummary, BackupError> {
    let snapshot = keyspaces.db.snapshot();
    let mut files = Vec::new();
    for number in referred_files(&snapshot, keyspaces)? {
        let path = bodies.join(staged::file_name(number));
        match File::open(&path) {
            Ok(file) => files.push((number, file)),
            Err(error) => return Err(BackupError::BodyFile { path, error }),
        }
    }
    drop(paused);

    let mut out = Summing::new(BufWriter::with_capacity(1 << 20, out));
    out.write_all(MAGIC).map_err(BackupError::Write)?;
    let mut summary = BackupSummary::default();
    for (name, keyspace) in keyspaces.named() {
        for guard in snapshot.iter(keyspace) {
            let (key, value) = guard.into_inner().map_err(storage_io)?;
            write_key(&mut out, name, &key, &value).map_err(BackupError::Write)?;
            summary.keys += 1;
        }
    }
    for (number, file) in files {
        let path = bodies.join(staged::file_name(number));
        let body_file = |error| BackupError::BodyFile {
            path: path.clone(),
            error,
        };
        let len = file.metadata().map_err(body_file)?.len();
        out.write_all(&[FILE]).map_err(BackupError::Write)?;
        out.write_all(&number.to_be_bytes())
            .map_err(BackupError::Write)?;
        out.write_all(&len.to_be_bytes())
            .map_err(BackupError::Write)?;
        let copied = io::copy(&mut file.take(len), &mut out).map_err(BackupError::Write)?;
        if copied != len {
            let error = io::Error::new(io::ErrorKind::UnexpectedEof, "the file got shorter");
            return Err(body_file(error));
        }
        summary.files += 1;
    }
    let entries = summary.keys + summary.files;
    let crc = out.crc();
    out.write_all(&[END]).map_err(BackupError::Write)?;
    out.write_all(&entries.to_be_bytes())
        .map_err(BackupError::Write)?;
    out.write_all(&crc.to_be_bytes())
        .map_err(BackupError::Write)?;
    out.flush().map_err(BackupError::Write)?;
    summary.bytes = out.bytes;
    Ok(summary)
}

/// The numbers of the staged body files the snapshot's keys refer to.
fn referred_files(
    snapshot: &fjall::Snapshot,
    keyspaces: &Keyspaces,
) -> Result<Vec<u64>, StorageError> {
    let mut numbers = Vec::new();
    for guard in snapshot.iter(&keyspaces.record_files) {
        let (_, value) = guard.into_inner().map_err(storage_io)?;
        numbers.push(body_files::decode_number(&value)?);
    }
    for guard in snapshot.iter(&keyspaces.snapshot_files) {
        let (_, value) = guard.into_inner().map_err(storage_io)?;
        numbers.push(SnapshotFile::decode(&value)?.number);
    }
    numbers.sort_unstable();
    numbers.dedup();
    Ok(numbers)
}

fn write_key(out: &mut impl Write, keyspace: &str, key: &[u8], value: &[u8]) -> io::Result<()> {
    out.write_all(&[KEY, keyspace.len() as u8])?;
    out.write_all(keyspace.as_bytes())?;
    out.write_all(&(key.len() as u32).to_be_bytes())?;
    out.write_all(key)?;
    out.write_all(&(value.len() as u32).to_be_bytes())?;
    out.write_all(value)
}

/// Checks the backup at `path` whole (its layout, its end entry and its checksum) without
/// writing anything.
pub fn check(path: &Path) -> Result<BackupSummary, BackupError> {
    read(path, &mut |_| Ok(()))
}

/// Restores the backup at `path` into `dir`, which must be missing or empty. The backup is
/// checked whole first, so a damaged one writes nothing; what is restored is synced before
/// this returns.
pub fn restore(path: &Path, dir: &Path) -> Result<BackupSummary, BackupError> {
    check(path)?;
    let restoring = |error| BackupError::Restore {
        dir: dir.to_path_buf(),
        error,
    };
    if let Ok(mut entries) = std::fs::read_dir(dir)
        && entries.next().is_some()
    {
        return Err(BackupError::NotEmpty(dir.to_path_buf()));
    }
    std::fs::create_dir_all(dir).map_err(restoring)?;
    let keyspaces = Keyspaces::open(dir)?;
    let bodies = dir.join(body_files::DIRECTORY);
    std::fs::create_dir_all(&bodies).map_err(restoring)?;
    let mut batch = keyspaces.db.batch();
    let mut batched = 0;
    let summary = read(path, &mut |entry| {
        match entry {
            Entry::Key {
                keyspace,
                key,
                value,
            } => {
                let Some(keyspace) = by_name(&keyspaces, &keyspace) else {
                    return Err(BackupError::Damaged(format!(
                        "unknown keyspace {keyspace:?}"
                    )));
                };
                batched += key.len() + value.len();
                batch.insert(keyspace, key, value);
                if batched >= RESTORE_BATCH_BYTES {
                    std::mem::replace(&mut batch, keyspaces.db.batch())
                        .commit()
                        .map_err(storage_io)?;
                    batched = 0;
                }
            }
            Entry::File { number, bytes } => {
                let path = bodies.join(staged::file_name(number));
                let mut file = File::create(&path).map_err(restoring)?;
                file.write_all(&bytes).map_err(restoring)?;
                file.sync_all().map_err(restoring)?;
            }
        }
        Ok(())
    })?;
    batch.commit().map_err(storage_io)?;
    keyspaces
        .db
        .persist(fjall::PersistMode::SyncAll)
        .map_err(storage_io)?;
    for synced in [&bodies, dir] {
        File::open(synced)
            .and_then(|d| d.sync_all())
            .map_err(restoring)?;
    }
    Ok(summary)
}

fn by_name<'k>(keyspaces: &'k Keyspaces, name: &str) -> Option<&'k Keyspace> {
    keyspaces
        .named()
        .into_iter()
        .find(|(known, _)| *known == name)
        .map(|(_, keyspace)| keyspace)
}

/// One entry of a backup.
enum Entry {
    Key {
        keyspace: String,
        key: Vec<u8>,
        value: Vec<u8>,
    },
    File {
        number: u64,
        bytes: Vec<u8>,
    },
}

/// Reads the backup at `path`, handing each entry to `each`, and checks its end.
fn read(
    path: &Path,
    each: &mut dyn FnMut(Entry) -> Result<(), BackupError>,
) -> Result<BackupSummary, BackupError> {
    let file = File::open(path).map_err(BackupError::Read)?;
    let total = file.metadata().map_err(BackupError::Read)?.len();
    let mut input = Summing::new(BufReader::with_capacity(1 << 20, file));
    let mut magic = [0; MAGIC.len()];
    if input.read_exact(&mut magic).is_err() || magic != MAGIC {
        return Err(BackupError::NotABackup);
    }
    let mut summary = BackupSummary::default();
    loop {
        let at = input.bytes;
        let crc = input.crc();
        let tag = read_array::<1>(&mut input)?[0];
        match tag {
            KEY => {
                let name_len = read_array::<1>(&mut input)?[0];
                let keyspace = String::from_utf8(read_bytes(&mut input, name_len.into(), total)?)
                    .map_err(|_| {
                    BackupError::Damaged(format!("a keyspace name at byte {at}"))
                })?;
                let key_len = u32::from_be_bytes(read_array(&mut input)?);
                let key = read_bytes(&mut input, key_len.into(), total)?;
                let value_len = u32::from_be_bytes(read_array(&mut input)?);
                let value = read_bytes(&mut input, value_len.into(), total)?;
                summary.keys += 1;
                each(Entry::Key {
                    keyspace,
                    key,
                    value,
                })?;
            }
            FILE => {
                let number = u64::from_be_bytes(read_array(&mut input)?);
                let len = u64::from_be_bytes(read_array(&mut input)?);
                let bytes = read_bytes(&mut input, len, total)?;
                summary.files += 1;
                each(Entry::File { number, bytes })?;
            }
            END => {
                let entries = u64::from_be_bytes(read_array(&mut input)?);
                let stated = u32::from_be_bytes(read_array(&mut input)?);
                if entries != summary.keys + summary.files {
                    let found = summary.keys + summary.files;
                    let why = format!("it says {entries} entries, and holds {found}");
                    return Err(BackupError::Damaged(why));
                }
                if stated != crc {
                    return Err(BackupError::Damaged("its checksum does not match".into()));
                }
                let mut rest = [0; 1];
                if input.read(&mut rest).map_err(BackupError::Read)? != 0 {
                    return Err(BackupError::Damaged("bytes follow its end".into()));
                }
                summary.bytes = input.bytes;
                return Ok(summary);
            }
            other => {
                let why = format!("an entry of unknown kind {other:#04x} at byte {at}");
                return Err(BackupError::Damaged(why));
            }
        }
    }
}

fn read_array<const N: usize>(input: &mut impl Read) -> Result<[u8; N], BackupError> {
    let mut bytes = [0; N];
    input.read_exact(&mut bytes).map_err(cut_short)?;
    Ok(bytes)
}

/// `len` bytes, refused before allocating when the file cannot hold them.
fn read_bytes(input: &mut impl Read, len: u64, total: u64) -> Result<Vec<u8>, BackupError> {
    if len > total {
        let why = format!("an entry of {len} bytes in a file of {total}");
        return Err(BackupError::Damaged(why));
    }
    let mut bytes = vec![0; len as usize];
    input.read_exact(&mut bytes).map_err(cut_short)?;
    Ok(bytes)
}

fn cut_short(error: io::Error) -> BackupError {
    match error.kind() {
        io::ErrorKind::UnexpectedEof => BackupError::Damaged("it ends before its end entry".into()),
        _ => BackupError::Read(error),
    }
}

/// A reader or writer that keeps the CRC-32 and the count of the bytes through it.
struct Summing<T> {
    inner: T,
    hasher: crc32fast::Hasher,
    bytes: u64,
}

impl<T> Summing<T> {
    fn new(inner: T) -> Self {
        Summing {
            inner,
            hasher: crc32fast::Hasher::new(),
            bytes: 0,
        }
    }

    fn crc(&self) -> u32 {
        self.hasher.clone().finalize()
    }
}

impl<W: Write> Write for Summing<W> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(bytes)?;
        self.hasher.update(&bytes[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<R: Read> Read for Summing<R> {
    fn read(&mut self, bytes: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(bytes)?;
        self.hasher.update(&bytes[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests;
