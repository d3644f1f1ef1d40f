//! Large bodies staged in files of their own: stored by reference, read back (mapped or
//! copied), and their files deleted once nothing refers to them.

use super::*;

/// The staged body files in the engine's directory.
fn body_files(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("bodies")).unwrap().count()
}

async fn until(what: &str, condition: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !condition() {
        assert!(std::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

fn large(fill: u8) -> Bytes {
    Bytes::from(vec![fill; STAGE_BYTES + 1])
}

async fn staged(engine: &FjallEngine, bodies: &[Bytes]) -> Staged {
    let bytes = bodies.iter().map(Bytes::len).sum();
    assert!(engine.stages(bytes));
    engine.stage(bodies.to_vec()).await.unwrap()
}

/// Creates stream 1 with `records`, their `bodies` staged.
async fn stream_of_staged(engine: &FjallEngine, bodies: &[Bytes], records: &[Record]) {
    let staged = staged(engine, bodies).await;
    let meta = crate::model::stream::StreamMeta::new("s", "text/plain");
    engine
        .commit(vec![
            Change::PutStream(1, Box::new(meta)),
            Change::PutRecords(1, records.to_vec(), Some(staged)),
        ])
        .await
        .unwrap();
}

/// The largest stored record value of stream `id`.
fn largest_value(engine: &FjallEngine, id: StreamId) -> usize {
    let stream = codec::record_key(id, 0)..=codec::record_key(id, u64::MAX);
    let records = engine.keyspaces.records.range(stream);
    records
        .map(|g| g.into_inner().unwrap().1.len())
        .max()
        .unwrap_or(0)
}

#[tokio::test]
async fn staged_bodies_are_stored_by_reference_and_read_back_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let bodies = vec![large(1), Bytes::from_static(b"small"), large(2)];
    let records = lay_out(Offset::START, 3, bodies.clone());
    {
        let engine = FjallEngine::open(dir.path(), SyncMode::Fsync, 0).unwrap();
        stream_of_staged(&engine, &bodies, &records).await;
        assert!(
            largest_value(&engine, 1) < 1024,
            "the commit stores where the bodies lie, not the bodies"
        );
        assert_eq!(engine.read(1, 0, 3, usize::MAX).await.unwrap(), records);
    }
    let engine = FjallEngine::open(dir.path(), SyncMode::Fsync, 0).unwrap();
    assert_eq!(body_files(dir.path()), 1);
    assert_eq!(engine.read(1, 0, 3, usize::MAX).await.unwrap(), records);
    assert_eq!(
        engine.read(1, 1, 3, 10).await.unwrap(),
        records[1..2],
        "a read from the middle stops at its budget"
    );
    assert_eq!(
        engine.recover().unwrap().streams[0].stored_end,
        Some(crate::storage::StoredEnd::of(&records[2]))
    );
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_read_of_most_of_a_staged_file_maps_it_and_a_read_of_a_small_part_copies() {
    let dir = tempfile::tempdir().unwrap();
    let bodies = vec![large(1), large(2), large(3), large(4)];
    let records = lay_out(Offset::START, 4, bodies.clone());
    let engine = FjallEngine::open(dir.path(), SyncMode::Fsync, 0).unwrap();
    stream_of_staged(&engine, &bodies, &records).await;
    // A mapping keeps the whole file on disk while a reader holds it, even once deleted.
    let part = engine.read(1, 1, 2, usize::MAX).await.unwrap();
    assert_eq!(part, records[1..2]);
    assert_eq!(body_files::mapped(dir.path()), 0, "a quarter of the file");
    let most = engine.read(1, 1, 4, usize::MAX).await.unwrap();
    assert_eq!(most, records[1..4]);
    assert_eq!(body_files::mapped(dir.path()), 1, "three quarters of it");
    drop(most);
    assert_eq!(body_files::mapped(dir.path()), 0);
}

#[tokio::test]
async fn a_staged_file_no_commit_refers_to_is_deleted() {
    let dir = tempfile::tempdir().unwrap();
    {
        let engine = FjallEngine::open(dir.path(), SyncMode::Fsync, 0).unwrap();
        let refused = staged(&engine, &[large(1)]).await;
        assert_eq!(body_files(dir.path()), 1);
        drop(refused);
        assert_eq!(
            body_files(dir.path()),
            0,
            "a refused request's file goes at once"
        );
        // As if the server died after its commit went to the writer, before it was durable.
        staged(&engine, &[large(2)]).await.hand_over();
        assert_eq!(body_files(dir.path()), 1);
        // Bodies the records do not share (equal copies) are stored in the commit.
        let body = large(3);
        let file = staged(&engine, std::slice::from_ref(&body)).await;
        let copy = Bytes::copy_from_slice(&body);
        let records = lay_out(Offset::START, 3, vec![copy]);
        engine
            .commit(vec![Change::PutRecords(1, records.clone(), Some(file))])
            .await
            .unwrap();
        assert!(largest_value(&engine, 1) > STAGE_BYTES);
        until("the unused file is deleted", || body_files(dir.path()) == 1).await;
        assert_eq!(engine.read(1, 0, 1, usize::MAX).await.unwrap(), records);
    }
    let _engine = FjallEngine::open(dir.path(), SyncMode::Fsync, 0).unwrap();
    assert_eq!(
        body_files(dir.path()),
        0,
        "the file never committed goes at open"
    );
}

#[tokio::test]
async fn trimming_past_a_staged_append_or_removing_its_stream_deletes_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let engine = FjallEngine::open(dir.path(), SyncMode::Fsync, 0).unwrap();
    for id in [1, 2] {
        let first = vec![large(1), large(2)];
        let records = lay_out(Offset::START, 3, first.clone());
        let file = staged(&engine, &first).await;
        let second = vec![large(3)];
        let more = lay_out(records[1].next_offset(), 3, second.clone());
        let other = staged(&engine, &second).await;
        engine
            .commit(vec![
                Change::PutRecords(id, records, Some(file)),
                Change::PutRecords(id, more, Some(other)),
            ])
            .await
            .unwrap();
    }
    assert_eq!(body_files(dir.path()), 4);
    engine
        .commit(vec![Change::TrimRecords(1, 1)])
        .await
        .unwrap();
    until("the trim is purged", || engine.pending_trims() == 0).await;
    assert_eq!(
        body_files(dir.path()),
        4,
        "a trim inside an append keeps its file"
    );
    engine
        .commit(vec![Change::TrimRecords(1, 2)])
        .await
        .unwrap();
    until("the trimmed append's file is deleted", || {
        body_files(dir.path()) == 3
    })
    .await;
    let kept = engine.read(1, 0, 3, usize::MAX).await.unwrap();
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].body, large(3));
    engine.commit(vec![Change::RemoveStream(2)]).await.unwrap();
    until("the removed stream's files are deleted", || {
        body_files(dir.path()) == 1
    })
    .await;
}

#[tokio::test]
async fn a_staged_snapshot_replaced_or_removed_deletes_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let engine = FjallEngine::open(dir.path(), SyncMode::Fsync, 0).unwrap();
    let put = |blob: &Bytes, staged: Option<Staged>| {
        engine.commit(vec![Change::PutSnapshot(5, blob.clone(), staged)])
    };
    let first = large(1);
    put(
        &first,
        Some(staged(&engine, std::slice::from_ref(&first)).await),
    )
    .await
    .unwrap();
    assert_eq!(engine.read_snapshot(5).await.unwrap(), Some(first));
    let second = large(2);
    let file = staged(&engine, std::slice::from_ref(&second)).await;
    put(&second, Some(file)).await.unwrap();
    until("the replaced snapshot's file is deleted", || {
        body_files(dir.path()) == 1
    })
    .await;
    assert_eq!(engine.read_snapshot(5).await.unwrap(), Some(second));
    let small = Bytes::from_static(b"{}");
    put(&small, None).await.unwrap();
    until("a file replaced by a held snapshot is deleted", || {
        body_files(dir.path()) == 0
    })
    .await;
    assert_eq!(engine.read_snapshot(5).await.unwrap(), Some(small));
    let third = large(3);
    let file = staged(&engine, std::slice::from_ref(&third)).await;
    put(&third, Some(file)).await.unwrap();
    drop(engine);
    let engine = FjallEngine::open(dir.path(), SyncMode::Fsync, 0).unwrap();
    assert_eq!(engine.read_snapshot(5).await.unwrap(), Some(third));
    engine
        .commit(vec![Change::RemoveSnapshot(5)])
        .await
        .unwrap();
    until("a removed snapshot's file is deleted", || {
        body_files(dir.path()) == 0
    })
    .await;
    assert_eq!(engine.read_snapshot(5).await.unwrap(), None);
}

#[tokio::test]
async fn a_body_file_lost_under_its_records_or_snapshot_is_an_error_not_a_gap() {
    let dir = tempfile::tempdir().unwrap();
    let engine = FjallEngine::open(dir.path(), SyncMode::Fsync, 0).unwrap();
    let first = vec![large(1)];
    let records = lay_out(Offset::START, 3, first.clone());
    let held = lay_out(records[0].next_offset(), 3, vec![Bytes::from_static(b"x")]);
    let second = vec![large(2)];
    let last = lay_out(held[0].next_offset(), 3, second.clone());
    let (one, two) = (
        staged(&engine, &first).await,
        staged(&engine, &second).await,
    );
    let gone = dir
        .path()
        .join("bodies")
        .join(staged::file_name(two.number()));
    engine
        .commit(vec![
            Change::PutRecords(1, records.clone(), Some(one)),
            Change::PutRecords(1, held.clone(), None),
            Change::PutRecords(1, last, Some(two)),
        ])
        .await
        .unwrap();
    std::fs::remove_file(gone).unwrap();
    assert!(
        matches!(
            engine.read(1, 0, 3, usize::MAX).await,
            Err(StorageError::Corrupt(_))
        ),
        "records whose file is lost are an error, not passed off as trimmed"
    );

    let blob = large(3);
    let file = staged(&engine, std::slice::from_ref(&blob)).await;
    let lost = dir
        .path()
        .join("bodies")
        .join(staged::file_name(file.number()));
    engine
        .commit(vec![Change::PutSnapshot(2, blob, Some(file))])
        .await
        .unwrap();
    std::fs::remove_file(lost).unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(10), engine.read_snapshot(2));
    assert!(
        matches!(answer.await, Ok(Err(StorageError::Corrupt(_)))),
        "a snapshot whose file is lost is an error, at once"
    );
}
