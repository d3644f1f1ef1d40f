//! The timestamp index through the engine: entries per step, and entries going with their
//! records.

use std::time::{Duration, Instant};

use bytes::Bytes;

use super::STEP_MS;
use crate::model::Record;
use crate::storage::{Change, Engine, FjallEngine, SyncMode, TimeBounds};

/// Ten appends to stream 1 of ten records each, append `i` timestamped from `i` steps on.
async fn ten_appends(engine: &FjallEngine) {
    for i in 0..10u64 {
        let records = (0..10u64)
            .map(|j| Record {
                seq: 10 * i + j,
                pos: 10 * i + j,
                timestamp_ms: (i * STEP_MS + j) as i64,
                arrival_ms: 0,
                starts_unit: true,
                headers: Vec::new(),
                body: Bytes::from_static(b"x"),
                command: false,
            })
            .collect();
        engine
            .commit(vec![Change::PutRecords(1, records, None)])
            .await
            .unwrap();
    }
}

/// Waits until the bounds for `timestamp` are `expected` (the purger works in the background).
async fn wait_for_bounds(engine: &FjallEngine, timestamp: u64, expected: TimeBounds) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let bounds = engine.time_bounds(1, timestamp).await.unwrap();
        if bounds == expected {
            return;
        }
        assert!(Instant::now() < deadline, "bounds stayed {bounds:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn each_append_in_a_later_step_is_an_entry_and_a_lookup_names_its_neighbours() {
    let dir = tempfile::tempdir().unwrap();
    let engine = FjallEngine::open(dir.path(), SyncMode::None, 0).unwrap();
    ten_appends(&engine).await;
    let bounds = engine.time_bounds(1, 3 * STEP_MS + 5).await.unwrap();
    assert_eq!(
        bounds,
        TimeBounds {
            earlier: Some(30),
            at_most: Some(40)
        }
    );
    let before_all = engine.time_bounds(1, 0).await.unwrap();
    assert_eq!(before_all.earlier, None);
    assert_eq!(before_all.at_most, Some(0));
    assert_eq!(
        engine.time_bounds(2, 0).await.unwrap(),
        TimeBounds::default()
    );
}

#[tokio::test]
async fn entries_go_with_the_records_a_trim_purges_and_a_removal_takes_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let engine = FjallEngine::open(dir.path(), SyncMode::None, 0).unwrap();
    ten_appends(&engine).await;
    engine
        .commit(vec![Change::TrimRecords(1, 55)])
        .await
        .unwrap();
    // Entries at 0 .. 50 name records below the trim point, which no read starts at.
    let after_the_trim = TimeBounds {
        earlier: None,
        at_most: Some(60),
    };
    wait_for_bounds(&engine, 5 * STEP_MS + 5, after_the_trim).await;
    let kept = engine.time_bounds(1, 7 * STEP_MS + 5).await.unwrap();
    assert_eq!(kept.earlier, Some(70));
    engine.commit(vec![Change::RemoveStream(1)]).await.unwrap();
    wait_for_bounds(&engine, u64::MAX, TimeBounds::default()).await;
}
