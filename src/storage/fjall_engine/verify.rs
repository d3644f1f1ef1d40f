//! Checking a data directory: every key of every keyspace is read (fjall checks each block's
//! checksum as it reads it) and decoded, each stream's stored records must follow one another
//! without a gap, and every staged body file a key refers to must be there, long enough, and
//! readable to its end. Nothing is written.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::path::Path;

use bytes::Bytes;
use fjall::{Keyspace, Readable as _, Snapshot};

use super::Keyspaces;
use super::body_files::{self, SnapshotFile};
use crate::model::access::TokenRecord;
use crate::model::stream::{BucketMeta, StreamMeta};
use crate::storage::codec::{self, Stored, decode_stored};
use crate::storage::{StorageError, StreamId, staged};

/// Problems past this many are counted, not each reported.
const REPORTED_PROBLEMS: u64 = 100;

/// What a check found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VerifySummary {
    pub streams: u64,
    pub records: u64,
    pub keys: u64,
    pub body_files: u64,
    pub problems: u64,
}

/// Checks `keyspaces` (staged body files in `bodies`), writing a line per problem to `report`.
pub(super) fn check(
    keyspaces: &Keyspaces,
    bodies: &Path,
    report: &mut dyn Write,
) -> io::Result<VerifySummary> {
    let snapshot = keyspaces.db.snapshot();
    let mut check = Check {
        snapshot: &snapshot,
        bodies,
        report,
        summary: VerifySummary::default(),
        files: BTreeMap::new(),
    };
    check.streams(&keyspaces.streams)?;
    check.records(&keyspaces.records)?;
    check.each("producers", &keyspaces.producers, |_, value| {
        codec::decode_producer(value).map(drop)
    })?;
    check.each("buckets", &keyspaces.buckets, |_, value| {
        json::<BucketMeta>(value)
    })?;
    check.each("tokens", &keyspaces.tokens, |_, value| {
        json::<TokenRecord>(value)
    })?;
    check.each("trims", &keyspaces.trims, |_, value| {
        codec::decode_trim(value).map(drop)
    })?;
    check.each("snapshots", &keyspaces.snapshots, |_, _| Ok(()))?;
    check.each("system", &keyspaces.system, |_, _| Ok(()))?;
    check.each("times", &keyspaces.times, |_, _| Ok(()))?;
    let mut referred = Vec::new();
    check.each("record_files", &keyspaces.record_files, |_, value| {
        referred.push((body_files::decode_number(value)?, 0));
        Ok(())
    })?;
    check.each("snapshot_files", &keyspaces.snapshot_files, |_, value| {
        let file = SnapshotFile::decode(value)?;
        referred.push((file.number, file.len));
        Ok(())
    })?;
    for (number, len) in referred {
        let needed = check.files.entry(number).or_default();
        *needed = (*needed).max(len);
    }
    check.body_files()?;
    Ok(check.summary)
}

struct Check<'a> {
    snapshot: &'a Snapshot,
    bodies: &'a Path,
    report: &'a mut dyn Write,
    summary: VerifySummary,
    /// Each staged body file referred to, with the length its references need.
    files: BTreeMap<u64, u64>,
}

impl Check<'_> {
    fn problem(&mut self, what: std::fmt::Arguments<'_>) -> io::Result<()> {
        self.summary.problems += 1;
        if self.summary.problems <= REPORTED_PROBLEMS {
            writeln!(self.report, "damaged: {what}")?;
        }
        Ok(())
    }

    /// Reads every key of `keyspace`, checking each with `decode`.
    fn each(
        &mut self,
        name: &str,
        keyspace: &Keyspace,
        mut decode: impl FnMut(&[u8], &[u8]) -> Result<(), StorageError>,
    ) -> io::Result<()> {
        for guard in self.snapshot.iter(keyspace) {
            let (key, value) = match guard.into_inner() {
                Ok(pair) => pair,
                Err(e) => {
                    // The rest of the keyspace cannot be reached past an unreadable block.
                    return self.problem(format_args!("{name}: cannot be read on: {e}"));
                }
            };
            self.summary.keys += 1;
            if let Err(e) = decode(&key, &value) {
                self.problem(format_args!("{name}: key {}: {e}", hex(&key)))?;
            }
        }
        Ok(())
    }

    fn streams(&mut self, keyspace: &Keyspace) -> io::Result<()> {
        let mut streams = 0;
        self.each("streams", keyspace, |key, value| {
            codec::split_key(key)?;
            json::<StreamMeta>(value)?;
            streams += 1;
            Ok(())
        })?;
        self.summary.streams = streams;
        Ok(())
    }

    /// Decodes every run, and checks that each stream's runs follow one another.
    fn records(&mut self, keyspace: &Keyspace) -> io::Result<()> {
        let mut last: Option<(StreamId, u64)> = None;
        let mut gaps = Vec::new();
        let mut records = 0;
        let mut files = Vec::new();
        self.each("records", keyspace, |key, value| {
            let (id, _) = codec::split_key(key)?;
            let seq = codec::record_seq(key)?;
            let stored = decode_stored(seq, Bytes::copy_from_slice(value))?;
            // A copy: `each` only lends the value, and a check is off every request's path.
            let (first, count) = match &stored {
                Stored::Held(run) => (run.first().map(|r| r.seq), run.len()),
                Stored::Filed(run) => {
                    let end = run.records.iter().map(|f| f.place + f.len).max();
                    files.push((run.file, end.unwrap_or(0)));
                    (run.records.first().map(|f| f.record.seq), run.records.len())
                }
            };
            records += count as u64;
            if let (Some((last_id, last_seq)), Some(first)) = (last, first)
                && last_id == id
                && first != last_seq + 1
            {
                gaps.push((id, last_seq, first));
            }
            last = Some((id, seq));
            Ok(())
        })?;
        self.summary.records = records;
        for (id, before, after) in gaps {
            let what =
                format_args!("records: stream {id} has no records between {before} and {after}");
            self.problem(what)?;
        }
        for (number, end) in files {
            let needed = self.files.entry(number).or_default();
            *needed = (*needed).max(end);
        }
        Ok(())
    }

    /// Reads every staged body file referred to, to its end.
    fn body_files(&mut self) -> io::Result<()> {
        let files = std::mem::take(&mut self.files);
        for (number, needed) in files {
            let path = self.bodies.join(staged::file_name(number));
            let read = std::fs::File::open(&path).and_then(|file| {
                let mut buffer = vec![0; 1 << 20];
                let mut file = file;
                let mut len = 0u64;
                loop {
                    match file.read(&mut buffer)? {
                        0 => return Ok(len),
                        n => len += n as u64,
                    }
                }
            });
            self.summary.body_files += 1;
            let shown = path.display();
            match read {
                Ok(len) if len < needed => self.problem(format_args!(
                    "staged body file {shown} holds {len} bytes, and its references need {needed}"
                ))?,
                Ok(_) => {}
                Err(e) => self.problem(format_args!("staged body file {shown}: {e}"))?,
            }
        }
        Ok(())
    }
}

fn json<T: serde::de::DeserializeOwned>(value: &[u8]) -> Result<(), StorageError> {
    serde_json::from_slice::<T>(value)
        .map(drop)
        .map_err(|e| StorageError::Corrupt(e.to_string()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
