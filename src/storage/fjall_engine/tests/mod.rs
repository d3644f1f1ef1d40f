//! The fjall engine's unit tests: group commit and records stored in runs here, trims and
//! removals in `purges.rs`, bodies staged in files in `staged_bodies.rs`. This module holds the
//! fixtures they share: streams filled through the engine, and a bare writer to commit groups
//! one at a time.

use super::trims::PURGE_CHUNK;
use super::*;

use crate::model::Offset;
use crate::model::record::lay_out;

use std::time::Duration;

mod purges;
mod staged_bodies;

#[tokio::test]
async fn concurrent_batches_share_one_sync() {
    let dir = tempfile::tempdir().unwrap();
    let engine = FjallEngine::open(dir.path(), SyncMode::Fsync, 0).unwrap();
    let commits: Vec<_> = (0..200u64)
        .map(|i| {
            let records = lay_out(Offset::new(i, i), 0, vec![Bytes::from_static(b"x")]);
            engine.commit(vec![Change::PutRecords(1, records, None)])
        })
        .collect();
    for commit in commits {
        commit.await.unwrap();
    }
    let batches = engine.stats().batches.load(Ordering::Relaxed);
    let groups = engine.stats().groups.load(Ordering::Relaxed);
    assert_eq!(batches, 200);
    assert!(groups < 20, "200 queued batches took {groups} syncs");
}

/// Stream `id` with `count` one-byte records, committed in batches.
async fn fill(engine: &FjallEngine, id: StreamId, count: u64) {
    use crate::model::stream::StreamMeta;
    let meta = StreamMeta::new("s", "application/octet-stream");
    engine
        .commit(vec![Change::PutStream(id, Box::new(meta))])
        .await
        .unwrap();
    let mut at = Offset::START;
    while at.seq < count {
        let n = (count - at.seq).min(10_000) as usize;
        let records = lay_out(at, 0, vec![Bytes::from_static(b"x"); n]);
        at = records.last().unwrap().next_offset();
        engine.commit(one_key_each(id, records)).await.unwrap();
    }
}

/// Each record as a change of its own, so each is stored under a key of its own: the purge
/// tests count deletions in keys.
fn one_key_each(id: StreamId, records: Vec<Record>) -> Vec<Change> {
    let each = records
        .into_iter()
        .map(|r| Change::PutRecords(id, vec![r], None));
    each.collect()
}

/// How many records of stream `id` with `from <= seq < until` are physically stored.
fn stored(ks: &Keyspaces, id: StreamId, from: u64, until: u64) -> usize {
    let runs = ks
        .records
        .range(codec::record_key(id, from)..=codec::record_key(id, u64::MAX));
    let mut count = 0;
    for guard in runs {
        let (key, value) = guard.into_inner().unwrap();
        let run = decode_stored(codec::record_seq(&key).unwrap(), Bytes::from_owner(value));
        let seqs: Vec<u64> = match run.unwrap() {
            Stored::Held(records) => records.iter().map(|r| r.seq).collect(),
            Stored::Filed(run) => run.records.iter().map(|f| f.record.seq).collect(),
        };
        count += seqs
            .iter()
            .filter(|seq| (from..until).contains(*seq))
            .count();
    }
    count
}

fn stored_below(engine: &FjallEngine, id: StreamId, before: u64) -> usize {
    stored(&engine.keyspaces, id, 0, before)
}

/// Waits until the records below `before` are physically gone.
async fn wait_purged(engine: &FjallEngine, id: StreamId, before: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while engine.pending_trims() > 0 || stored_below(engine, id, before) > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "trimmed records still stored after 60 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// A writer with no threads around it, to write groups one at a time.
fn bare_writer(dir: &Path) -> Writer {
    let keyspaces = Keyspaces::open(dir).unwrap();
    let trims = Arc::new(Trims::load(&keyspaces.trims).unwrap());
    let ks = &keyspaces;
    let files = BodyFiles::open(dir, &ks.record_files, &ks.snapshot_files, 0, None).unwrap();
    Writer {
        keyspaces,
        sync: SyncMode::None,
        failed: Arc::default(),
        stats: Arc::default(),
        trims,
        files: Arc::new(files),
        times: TimeIndexer::default(),
        runtime: None,
    }
}

fn batch(changes: Vec<Change>) -> Submission {
    Submission {
        changes,
        done: oneshot::channel().0,
        purge: None,
    }
}

fn purge(id: StreamId) -> Submission {
    Submission {
        changes: Vec::new(),
        done: oneshot::channel().0,
        purge: Some(id),
    }
}

fn write(writer: &Writer, group: Vec<Submission>) {
    writer.write_group(&group, &mut 0, &mut 0).unwrap();
}

/// Stream `id` with one-byte records `0..count`, as one submission.
fn filled(id: StreamId, count: u64) -> Submission {
    use crate::model::stream::StreamMeta;
    let records = lay_out(
        Offset::START,
        0,
        vec![Bytes::from_static(b"x"); count as usize],
    );
    let meta = Box::new(StreamMeta::new("s", "text/plain"));
    let mut changes = vec![Change::PutStream(id, meta)];
    changes.extend(one_key_each(id, records));
    batch(changes)
}

fn stored_trim(writer: &Writer, id: StreamId) -> Option<(u64, u64)> {
    let value = writer.keyspaces.trims.get(codec::stream_key(id)).unwrap()?;
    Some(codec::decode_trim(&value).unwrap())
}

#[test]
fn submissions_a_failed_group_had_already_committed_succeed_and_the_rest_fail() {
    let dir = tempfile::tempdir().unwrap();
    let writer = bare_writer(dir.path());
    write(&writer, vec![filled(1, 3), filled(2, 1), filled(3, 1)]);
    // A corrupt file reference of stream 1: its removal fails after the commit it needs first.
    let corrupt = codec::record_key(1, 2);
    writer
        .keyspaces
        .record_files
        .insert(corrupt, b"bad")
        .unwrap();
    let append = |seq| {
        let records = lay_out(Offset::new(seq, seq), 0, vec![Bytes::from_static(b"y")]);
        vec![Change::PutRecords(2, records, None)]
    };
    let (queue, incoming) = std::sync::mpsc::channel();
    let mut answers = Vec::new();
    let remove = |id| vec![Change::RemoveStream(id)];
    // Two removals split the group twice; the second fails after its split.
    for changes in [append(1), remove(3), append(2), remove(1), append(3)] {
        let (done, answer) = oneshot::channel();
        let purge = None;
        queue
            .send(Submission {
                changes,
                done,
                purge,
            })
            .unwrap();
        answers.push(answer);
    }
    drop(queue);
    // All five are queued, so they form one group; the loop ends with the queue.
    let keyspaces = writer.keyspaces.clone();
    writer.run(incoming);
    let succeeded: Vec<bool> = answers
        .into_iter()
        .map(|a| a.blocking_recv().unwrap().is_ok())
        .collect();
    assert_eq!(succeeded, [true, true, true, false, false]);
    assert_eq!(stored(&keyspaces, 2, 0, u64::MAX), 3);
    assert_eq!(stored(&keyspaces, 3, 0, u64::MAX), 0);
}

#[tokio::test]
async fn a_batch_is_stored_in_runs_and_reads_back_from_any_seq() {
    use crate::model::stream::StreamMeta;
    let dir = tempfile::tempdir().unwrap();
    let engine = FjallEngine::open(dir.path(), SyncMode::None, 0).unwrap();
    // 1 KiB bodies: some sixty records to a run.
    let bodies = (0..500u32).map(|i| Bytes::from(vec![i as u8; 1024]));
    let records = lay_out(Offset::START, 0, bodies.collect());
    let meta = Box::new(StreamMeta::new("s", "application/octet-stream"));
    let changes = vec![
        Change::PutStream(1, meta),
        Change::PutRecords(1, records.clone(), None),
    ];
    engine.commit(changes).await.unwrap();
    let keys = engine
        .keyspaces
        .records
        .prefix(codec::stream_key(1))
        .count();
    assert!((5..=20).contains(&keys), "500 records under {keys} keys");
    for (from, until) in [
        (0, 500),
        (1, 2),
        (63, 130),
        (250, 251),
        (499, 500),
        (100, 99),
    ] {
        let read = engine.read(1, from, until, usize::MAX).await.unwrap();
        assert_eq!(read, records[from as usize..until.max(from) as usize]);
    }
    let budgeted = engine.read(1, 10, 500, 3 * (1024 + 8)).await.unwrap();
    assert_eq!(budgeted, records[10..13], "the budget stops mid-run");
    drop(engine);
    let engine = FjallEngine::open(dir.path(), SyncMode::None, 0).unwrap();
    let recovered = engine.recover().unwrap();
    let end = recovered.streams[0].stored_end;
    assert_eq!(end, Some(crate::storage::StoredEnd::of(&records[499])));
    engine
        .commit(vec![Change::TrimRecords(1, 250)])
        .await
        .unwrap();
    wait_purged(&engine, 1, 150).await; // below the run that holds 250
    let kept = engine.read(1, 0, 500, usize::MAX).await.unwrap();
    assert_eq!(kept, records[250..], "a trim mid-run keeps the rest whole");
}

#[test]
fn a_trim_inside_a_run_hides_its_head_and_the_trim_that_passes_it_deletes_it() {
    use crate::model::stream::StreamMeta;
    let dir = tempfile::tempdir().unwrap();
    let writer = bare_writer(dir.path());
    let records = lay_out(Offset::START, 0, vec![Bytes::from_static(b"x"); 6]);
    write(
        &writer,
        vec![batch(vec![
            Change::PutStream(1, Box::new(StreamMeta::new("s", "text/plain"))),
            Change::PutRecords(1, records[..3].to_vec(), None),
            Change::PutRecords(1, records[3..].to_vec(), None),
        ])],
    );
    write(&writer, vec![batch(vec![Change::TrimRecords(1, 4)])]);
    write(&writer, vec![purge(1)]);
    assert_eq!(stored(&writer.keyspaces, 1, 0, 3), 0, "the run below goes");
    assert_eq!(
        stored(&writer.keyspaces, 1, 3, 6),
        3,
        "the run across stays"
    );
    let floor = writer.trims.floor(1);
    let visible = FjallEngine::read_sync(
        &writer.keyspaces.records,
        &writer.files,
        &writer.trims,
        1,
        floor,
        6,
        usize::MAX,
    );
    assert_eq!(
        visible.unwrap(),
        records[4..],
        "but shows none below the trim"
    );
    write(&writer, vec![batch(vec![Change::TrimRecords(1, 6)])]);
    write(&writer, vec![purge(1)]);
    assert_eq!(stored(&writer.keyspaces, 1, 0, u64::MAX), 0);
    assert_eq!(stored_trim(&writer, 1), Some((6, 6)));
}
