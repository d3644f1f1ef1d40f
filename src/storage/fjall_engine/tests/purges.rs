//! Trims and stream removals: records deleted in bounded chunks, after the group that hides
//! them, and purges resumed after a restart.

use super::*;

#[tokio::test]
async fn a_large_trim_deletes_in_bounded_chunks_while_other_streams_append() {
    let dir = tempfile::tempdir().unwrap();
    let engine = FjallEngine::open(dir.path(), SyncMode::None, 0).unwrap();
    fill(&engine, 1, 60_000).await;
    fill(&engine, 2, 0).await;
    let trim = engine.commit(vec![Change::TrimRecords(1, 50_000)]);
    // Appends to another stream, queued behind the trim and during its deletion.
    let mut worst = std::time::Duration::ZERO;
    let mut at = Offset::START;
    while at.seq < 20 || engine.pending_trims() > 0 {
        let records = lay_out(at, 0, vec![Bytes::from_static(b"y")]);
        at = records[0].next_offset();
        let started = std::time::Instant::now();
        engine
            .commit(vec![Change::PutRecords(2, records, None)])
            .await
            .unwrap();
        worst = worst.max(started.elapsed());
    }
    trim.await.unwrap();
    wait_purged(&engine, 1, 50_000).await;
    let kept = engine.read(1, 0, 60_000, usize::MAX).await.unwrap();
    assert_eq!(kept.len(), 10_000);
    assert_eq!(
        kept[0].seq, 50_000,
        "records at and after the trim point stay"
    );
    assert_eq!(
        engine.read(2, 0, at.seq, usize::MAX).await.unwrap().len() as u64,
        at.seq
    );
    let most = engine.stats().most_values_purged.load(Ordering::Relaxed);
    assert!(
        most <= PURGE_CHUNK as u64,
        "one group deleted {most} stored values; every append in it waited for that"
    );
    // Structural bound above; this wall-clock one is generous (debug build, shared CPU).
    assert!(
        worst < std::time::Duration::from_secs(2),
        "an append on another stream waited {worst:?}"
    );
}

#[test]
fn a_trim_deletes_nothing_and_each_purge_a_bounded_chunk_from_where_the_last_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let writer = bare_writer(dir.path());
    let chunk = PURGE_CHUNK as u64;
    let (before, count) = (2 * chunk + 100, 3 * chunk);
    write(&writer, vec![filled(1, count)]);
    write(&writer, vec![batch(vec![Change::TrimRecords(1, before)])]);
    assert_eq!(stored(&writer.keyspaces, 1, 0, count), count as usize);
    assert_eq!(stored_trim(&writer, 1), Some((before, 0)));
    for purged in [chunk, 2 * chunk, before] {
        write(&writer, vec![purge(1)]);
        assert_eq!(stored_trim(&writer, 1), Some((before, purged)));
        assert_eq!(
            stored(&writer.keyspaces, 1, 0, before),
            (before - purged) as usize
        );
    }
    let most = writer.stats.most_values_purged.load(Ordering::Relaxed);
    assert_eq!(most, chunk, "no group deleted more than one chunk");
    write(&writer, vec![purge(1)]);
    assert_eq!(stored_trim(&writer, 1), Some((before, before)), "done");
    assert_eq!(
        stored(&writer.keyspaces, 1, before, u64::MAX),
        (count - before) as usize,
        "records at and after the trim point stay"
    );
}

#[test]
fn a_purge_finds_records_written_in_its_own_group_before_the_trim() {
    let dir = tempfile::tempdir().unwrap();
    let writer = bare_writer(dir.path());
    write(
        &writer,
        vec![
            filled(1, 10),
            batch(vec![Change::TrimRecords(1, 8)]),
            purge(1),
        ],
    );
    assert_eq!(stored(&writer.keyspaces, 1, 0, 8), 0);
    assert_eq!(stored(&writer.keyspaces, 1, 8, 10), 2);
    assert_eq!(stored_trim(&writer, 1), Some((8, 8)));
}

#[test]
fn trimming_again_while_purging_moves_the_target_up_never_down() {
    let dir = tempfile::tempdir().unwrap();
    let writer = bare_writer(dir.path());
    let chunk = PURGE_CHUNK as u64;
    write(&writer, vec![filled(1, 4 * chunk)]);
    write(
        &writer,
        vec![batch(vec![Change::TrimRecords(1, chunk + 10)])],
    );
    write(&writer, vec![purge(1)]);
    write(
        &writer,
        vec![
            batch(vec![Change::TrimRecords(1, 3 * chunk)]),
            batch(vec![Change::TrimRecords(1, 5)]),
        ],
    );
    assert_eq!(stored_trim(&writer, 1), Some((3 * chunk, chunk)));
    while writer.trims.get(1).is_some_and(|t| t.pending()) {
        write(&writer, vec![purge(1)]);
    }
    assert_eq!(stored(&writer.keyspaces, 1, 0, 3 * chunk), 0);
    assert_eq!(
        stored(&writer.keyspaces, 1, 3 * chunk, u64::MAX),
        chunk as usize
    );
    assert_eq!(stored_trim(&writer, 1), Some((3 * chunk, 3 * chunk)));
}

#[test]
fn a_stream_removed_during_its_purge_leaves_no_records_and_no_trim_state() {
    let dir = tempfile::tempdir().unwrap();
    let writer = bare_writer(dir.path());
    let chunk = PURGE_CHUNK as u64;
    write(&writer, vec![filled(1, 3 * chunk), filled(2, 10)]);
    write(
        &writer,
        vec![batch(vec![Change::TrimRecords(1, 2 * chunk)])],
    );
    write(&writer, vec![purge(1)]);
    write(
        &writer,
        vec![batch(vec![Change::RemoveStream(1)]), purge(1)],
    );
    while writer.trims.get(1).is_some() {
        write(&writer, vec![purge(1)]);
    }
    assert_eq!(stored(&writer.keyspaces, 1, 0, u64::MAX), 0);
    assert_eq!(stored_trim(&writer, 1), None);
    assert_eq!(writer.trims.get(1), None);
    // A trim that arrives after the removal leaves nothing behind either.
    write(&writer, vec![batch(vec![Change::TrimRecords(1, 10)])]);
    write(&writer, vec![purge(1)]);
    assert_eq!(stored_trim(&writer, 1), None);
    assert_eq!(writer.trims.get(1), None);
    assert_eq!(
        stored(&writer.keyspaces, 2, 0, u64::MAX),
        10,
        "others untouched"
    );
}

#[tokio::test]
async fn an_interrupted_purge_resumes_at_the_next_open() {
    let dir = tempfile::tempdir().unwrap();
    {
        // Stopped after one chunk, as a crash would leave it.
        let writer = bare_writer(dir.path());
        write(&writer, vec![filled(1, 10_000)]);
        write(&writer, vec![batch(vec![Change::TrimRecords(1, 8_000)])]);
        write(&writer, vec![purge(1)]);
        assert_eq!(stored_trim(&writer, 1), Some((8_000, PURGE_CHUNK as u64)));
    }
    let engine = FjallEngine::open(dir.path(), SyncMode::Fsync, 0).unwrap();
    let first = engine.read(1, 0, 10, usize::MAX).await.unwrap();
    assert!(
        first.is_empty(),
        "trimmed records stay hidden while they are purged"
    );
    let recovered = engine.recover().unwrap();
    assert_eq!(recovered.streams[0].stored_end.unwrap().next.seq, 10_000);
    wait_purged(&engine, 1, 8_000).await;
    let kept = engine.read(1, 0, 10_000, usize::MAX).await.unwrap();
    assert_eq!(kept.len(), 2_000);
    assert_eq!(kept[0].seq, 8_000);
}

#[test]
fn removing_a_long_stream_deletes_nothing_at_once_and_each_purge_a_bounded_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let writer = bare_writer(dir.path());
    let chunk = PURGE_CHUNK as u64;
    let count = 3 * chunk + 5;
    write(&writer, vec![filled(1, count), filled(2, 10)]);
    write(&writer, vec![batch(vec![Change::RemoveStream(1)])]);
    assert_eq!(
        stored(&writer.keyspaces, 1, 0, u64::MAX),
        count as usize,
        "the removal's own group deletes no records"
    );
    assert_eq!(writer.trims.floor(1), u64::MAX, "but no read sees them");
    let mut purges = 0;
    while writer.trims.get(1).is_some() {
        let before = stored(&writer.keyspaces, 1, 0, u64::MAX);
        write(&writer, vec![purge(1)]);
        let after = stored(&writer.keyspaces, 1, 0, u64::MAX);
        assert!(
            before - after <= PURGE_CHUNK,
            "one purge deleted {}",
            before - after
        );
        purges += 1;
    }
    assert_eq!(purges, 4);
    assert_eq!(stored(&writer.keyspaces, 1, 0, u64::MAX), 0);
    assert_eq!(stored_trim(&writer, 1), None, "no state is left behind");
    assert_eq!(
        stored(&writer.keyspaces, 2, 0, u64::MAX),
        10,
        "others untouched"
    );
}

#[tokio::test]
async fn a_removal_interrupted_before_its_records_are_deleted_finishes_at_the_next_open() {
    let dir = tempfile::tempdir().unwrap();
    {
        // Stopped right after the removal, as a crash would leave it.
        let writer = bare_writer(dir.path());
        write(&writer, vec![filled(1, 10_000), filled(2, 3)]);
        write(&writer, vec![batch(vec![Change::RemoveStream(1)])]);
    }
    let engine = FjallEngine::open(dir.path(), SyncMode::Fsync, 0).unwrap();
    assert!(engine.read(1, 0, 10, usize::MAX).await.unwrap().is_empty());
    let recovered = engine.recover().unwrap();
    assert_eq!(recovered.streams.len(), 1, "only stream 2 is recovered");
    wait_purged(&engine, 1, u64::MAX).await;
    assert!(
        engine
            .keyspaces
            .trims
            .get(codec::stream_key(1))
            .unwrap()
            .is_none()
    );
    assert_eq!(engine.read(2, 0, 10, usize::MAX).await.unwrap().len(), 3);
}

#[test]
fn removing_a_short_stream_deletes_its_records_in_its_own_group_and_keeps_no_state() {
    let dir = tempfile::tempdir().unwrap();
    let writer = bare_writer(dir.path());
    let chunk = PURGE_CHUNK as u64;
    write(&writer, vec![filled(1, chunk), filled(2, 10)]);
    write(&writer, vec![batch(vec![Change::RemoveStream(1)])]);
    assert_eq!(stored(&writer.keyspaces, 1, 0, u64::MAX), 0);
    assert_eq!(stored_trim(&writer, 1), None);
    assert_eq!(writer.trims.get(1), None, "nothing is left for the purger");
    assert_eq!(
        stored(&writer.keyspaces, 2, 0, u64::MAX),
        10,
        "others untouched"
    );
}
