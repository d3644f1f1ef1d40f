use bytes::Bytes;

use super::super::body_files::STAGE_BYTES;
use super::super::{DataDir, FjallEngine, SyncMode};
use super::*;
use crate::model::Offset;
use crate::model::record::lay_out;
use crate::model::stream::StreamMeta;
use crate::storage::{Change, Engine};

/// An engine in `dir` with stream 1 (three small records) and stream 2 (a staged body between
/// two small ones).
async fn filled(dir: &Path) -> FjallEngine {
    let engine = FjallEngine::open(dir, SyncMode::Fsync, 0).unwrap();
    let small = lay_out(Offset::START, 1, vec![Bytes::from_static(b"a"); 3]);
    let bodies = vec![
        Bytes::from_static(b"b"),
        Bytes::from(vec![7; STAGE_BYTES + 1]),
        Bytes::from_static(b"c"),
    ];
    let staged = engine.stage(bodies.clone()).await.unwrap();
    let large = lay_out(Offset::START, 2, bodies);
    engine
        .commit(vec![
            Change::PutStream(1, Box::new(StreamMeta::new("one", "text/plain"))),
            Change::PutRecords(1, small, None),
            Change::PutStream(2, Box::new(StreamMeta::new("two", "text/plain"))),
            Change::PutRecords(2, large, Some(staged)),
        ])
        .await
        .unwrap();
    engine
}

async fn bodies_of(engine: &FjallEngine, id: u64) -> Vec<Bytes> {
    let records = engine.read(id, 0, u64::MAX, usize::MAX).await.unwrap();
    records.into_iter().map(|r| r.body).collect()
}

fn backed_up(engine: &FjallEngine, into: &Path) -> BackupSummary {
    let mut file = File::create(into).unwrap();
    engine.backup(&mut file).unwrap()
}

#[tokio::test]
async fn a_restored_backup_holds_every_stream_record_and_staged_body() {
    let dir = tempfile::tempdir().unwrap();
    let original = dir.path().join("original");
    let engine = filled(&original).await;
    let file = dir.path().join("backup");
    let taken = backed_up(&engine, &file);
    assert_eq!(taken.files, 1, "the staged body file is in the backup");

    let restored_dir = dir.path().join("restored");
    let restored = restore(&file, &restored_dir).unwrap();
    assert_eq!(restored, taken);
    let copy = FjallEngine::open(&restored_dir, SyncMode::Fsync, 0).unwrap();
    for id in [1, 2] {
        assert_eq!(bodies_of(&copy, id).await, bodies_of(&engine, id).await);
    }
    let names: Vec<_> = copy
        .recover()
        .unwrap()
        .streams
        .iter()
        .map(|s| s.meta.name.to_string())
        .collect();
    assert_eq!(names, ["one", "two"]);
}

#[tokio::test]
async fn a_backup_is_as_of_its_start_and_takes_in_no_later_append() {
    let dir = tempfile::tempdir().unwrap();
    let engine = filled(&dir.path().join("original")).await;
    let snapshot_then = {
        let mut out = Vec::new();
        let paused = engine.files.pause_deletions();
        let summary = write(
            &engine.keyspaces,
            engine.files.dir(),
            Some(paused),
            &mut out,
        )
        .unwrap();
        (summary, out)
    };
    let later = lay_out(Offset::new(3, 3), 9, vec![Bytes::from_static(b"later")]);
    engine
        .commit(vec![Change::PutRecords(1, later, None)])
        .await
        .unwrap();
    let file = dir.path().join("backup");
    std::fs::write(&file, &snapshot_then.1).unwrap();
    let restored_dir = dir.path().join("restored");
    restore(&file, &restored_dir).unwrap();
    let copy = FjallEngine::open(&restored_dir, SyncMode::Fsync, 0).unwrap();
    assert_eq!(bodies_of(&copy, 1).await.len(), 3);
    assert_eq!(bodies_of(&engine, 1).await.len(), 4);
}

#[tokio::test]
async fn a_damaged_backup_restores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let engine = filled(&dir.path().join("original")).await;
    let file = dir.path().join("backup");
    backed_up(&engine, &file);
    let mut bytes = std::fs::read(&file).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x55;
    std::fs::write(&file, &bytes).unwrap();

    let restored_dir = dir.path().join("restored");
    let refused = restore(&file, &restored_dir).unwrap_err();
    assert!(matches!(refused, BackupError::Damaged(_)), "{refused}");
    assert!(!restored_dir.exists(), "nothing was written");
}

#[tokio::test]
async fn a_backup_cut_short_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let engine = filled(&dir.path().join("original")).await;
    let file = dir.path().join("backup");
    backed_up(&engine, &file);
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() - 3]).unwrap();
    assert!(matches!(check(&file), Err(BackupError::Damaged(_))));
    std::fs::write(&file, b"not a backup").unwrap();
    assert!(matches!(check(&file), Err(BackupError::NotABackup)));
}

#[tokio::test]
async fn a_restore_never_writes_into_a_directory_that_holds_anything() {
    let dir = tempfile::tempdir().unwrap();
    let engine = filled(&dir.path().join("original")).await;
    let file = dir.path().join("backup");
    backed_up(&engine, &file);
    let occupied = dir.path().join("occupied");
    std::fs::create_dir(&occupied).unwrap();
    std::fs::write(occupied.join("keep"), b"mine").unwrap();
    let refused = restore(&file, &occupied).unwrap_err();
    assert!(matches!(refused, BackupError::NotEmpty(_)), "{refused}");
    assert_eq!(std::fs::read_dir(&occupied).unwrap().count(), 1);
}

#[tokio::test]
async fn an_offline_backup_equals_the_running_engines() {
    let dir = tempfile::tempdir().unwrap();
    let original = dir.path().join("original");
    let running = {
        let engine = filled(&original).await;
        let mut out = Vec::new();
        engine.backup(&mut out).unwrap();
        out
    };
    // The engine's threads let go of the directory as it drops.
    let offline = wait_for_offline(&original);
    let mut out = Vec::new();
    offline.backup(&mut out).unwrap();
    assert_eq!(out, running);
}

fn wait_for_offline(dir: &Path) -> DataDir {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match DataDir::open(dir) {
            Ok(data) => return data,
            Err(StorageError::Locked { .. }) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[tokio::test]
async fn a_check_finds_nothing_wrong_with_a_sound_directory_and_a_missing_body_file() {
    let dir = tempfile::tempdir().unwrap();
    let original = dir.path().join("original");
    let engine = filled(&original).await;
    let mut report = Vec::new();
    let sound = engine.verify(&mut report).unwrap();
    assert_eq!(
        (
            sound.problems,
            sound.streams,
            sound.records,
            sound.body_files
        ),
        (0, 2, 6, 1)
    );
    assert!(report.is_empty());

    for file in std::fs::read_dir(original.join("bodies")).unwrap() {
        std::fs::remove_file(file.unwrap().path()).unwrap();
    }
    let mut report = Vec::new();
    let damaged = engine.verify(&mut report).unwrap();
    assert_eq!(damaged.problems, 1);
    let report = String::from_utf8(report).unwrap();
    assert!(report.starts_with("damaged: staged body file"), "{report}");
}
