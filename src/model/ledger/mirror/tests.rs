//! A mirror's rules: its records continue its tail exactly, and its state follows the
//! upstream's.

use bytes::Bytes;

use super::*;
use crate::model::ledger::testing::Fixture;
use crate::model::record::lay_out;

const NOW: i64 = 1_000;

fn upstream_records(from: Offset, timestamp_ms: i64, bodies: &[&'static str]) -> Vec<Record> {
    let bodies = bodies.iter().map(|b| Bytes::from_static(b.as_bytes()));
    lay_out(from, timestamp_ms, bodies.collect())
}

fn snapshot(seq: u64) -> SnapshotInfo {
    SnapshotInfo {
        offset: Offset::new(seq, seq),
        content_type: "a/b".into(),
        digest: "d".into(),
    }
}

fn upstream<'u>(f: &Fixture, attrs: &'u Attrs) -> MirrorMeta<'u> {
    MirrorMeta {
        closed: false,
        tail: f.meta.tail,
        attrs,
        key_fingerprint: None,
        snapshot: None,
        new_snapshot: false,
        retained_from: f.meta.retained_from,
    }
}

#[test]
fn records_that_do_not_follow_one_another_are_refused_before_any_stream_is_involved() {
    let mut records = upstream_records(Offset::START, 5, &["a", "b"]);
    records[1].seq += 1;
    assert_eq!(
        MirrorBatch::new(&records).err(),
        Some(Refusal::Conflict(Conflict::MirrorGap))
    );
}

#[test]
fn a_removed_mirror_is_not_found_before_its_tail_is_compared() {
    let mut f = Fixture::text();
    f.removed = true;
    let records = upstream_records(Offset::new(7, 7), 5, &["a"]);
    let batch = MirrorBatch::new(&records).unwrap();
    assert_eq!(f.ledger().apply(batch, NOW), Err(Refusal::NotFound));
}

#[test]
fn a_mirrored_batch_must_start_at_the_mirrors_tail() {
    let mut f = Fixture::text().at(2);
    let records = upstream_records(Offset::new(3, 3), 5, &["a"]);
    let batch = MirrorBatch::new(&records).unwrap();
    assert_eq!(
        f.ledger().apply(batch, NOW),
        Err(Refusal::Conflict(Conflict::MirrorOffTail))
    );
    assert_eq!(f.meta.tail, Offset::new(2, 2));
}

#[test]
fn a_mirror_takes_its_upstreams_offsets_and_timestamps_never_going_back() {
    let mut f = Fixture::text().at(2);
    f.meta.last_timestamp_ms = 50;
    let records = upstream_records(Offset::new(2, 2), 5, &["ab", "c"]);
    let batch = MirrorBatch::new(&records).unwrap();
    f.ledger().apply(batch, NOW).unwrap();
    assert_eq!(f.meta.tail, Offset::new(4, 5));
    assert_eq!(f.meta.last_timestamp_ms, 50);
    let later = upstream_records(Offset::new(4, 5), 60, &["d"]);
    f.ledger()
        .apply(MirrorBatch::new(&later).unwrap(), NOW)
        .unwrap();
    assert_eq!(
        f.meta.last_timestamp_ms, 60,
        "the upstream's, not this clock"
    );
}

#[test]
fn a_mirror_closes_only_once_every_record_is_here() {
    let mut f = Fixture::text().at(2);
    let attrs = None;
    let behind = MirrorMeta {
        closed: true,
        tail: Offset::new(3, 3),
        ..upstream(&f, &attrs)
    };
    assert_eq!(f.ledger().apply(behind, NOW), Ok(None));
    assert!(!f.meta.closed);
    let caught_up = MirrorMeta {
        closed: true,
        ..upstream(&f, &attrs)
    };
    assert!(f.ledger().apply(caught_up, NOW).unwrap().is_some());
    assert!(f.meta.closed);
}

#[test]
fn a_mirror_retains_from_the_upstreams_start_only_forward_and_never_past_its_tail() {
    let mut f = Fixture::text().at(4);
    f.meta.retained_from = Offset::new(1, 1);
    let attrs = None;
    let past_tail = MirrorMeta {
        retained_from: Offset::new(5, 5),
        ..upstream(&f, &attrs)
    };
    assert_eq!(f.ledger().apply(past_tail, NOW), Ok(None));
    let back = MirrorMeta {
        retained_from: Offset::START,
        ..upstream(&f, &attrs)
    };
    assert_eq!(f.ledger().apply(back, NOW), Ok(None));
    let forward = MirrorMeta {
        retained_from: Offset::new(3, 3),
        ..upstream(&f, &attrs)
    };
    let changed = f.ledger().apply(forward, NOW).unwrap().unwrap();
    assert!(changed.retained && changed.snapshot.is_none());
    assert_eq!(f.meta.retained_from, Offset::new(3, 3));
}

#[test]
fn a_mirror_takes_a_new_upstream_snapshot_and_drops_one_the_upstream_no_longer_has() {
    let mut f = Fixture::text().at(4);
    let attrs = None;
    let shot = snapshot(2);
    let new = MirrorMeta {
        snapshot: Some(&shot),
        new_snapshot: true,
        ..upstream(&f, &attrs)
    };
    let changed = f.ledger().apply(new, NOW).unwrap().unwrap();
    assert_eq!(changed.snapshot, Some(SnapshotChange::Put));
    assert_eq!(f.meta.extra().snapshot.as_ref(), Some(&shot));
    let same = MirrorMeta {
        snapshot: Some(&shot),
        ..upstream(&f, &attrs)
    };
    assert_eq!(f.ledger().apply(same, NOW), Ok(None));
    let gone = upstream(&f, &attrs);
    let changed = f.ledger().apply(gone, NOW).unwrap().unwrap();
    assert_eq!(changed.snapshot, Some(SnapshotChange::Remove));
    assert!(f.meta.extra().snapshot.is_none());
}

#[test]
fn a_mirror_takes_the_upstreams_attributes_and_key_but_keeps_its_key_when_none_is_given() {
    let mut f = Fixture::text();
    let attrs = Some(serde_json::Map::from_iter([("t".into(), "x".into())]));
    let keyed = MirrorMeta {
        key_fingerprint: Some("k"),
        ..upstream(&f, &attrs)
    };
    assert!(f.ledger().apply(keyed, NOW).unwrap().is_some());
    assert_eq!(f.meta.extra().attrs, attrs);
    let unkeyed = upstream(&f, &attrs);
    assert_eq!(f.ledger().apply(unkeyed, NOW), Ok(None));
    assert_eq!(f.meta.extra().key_fingerprint.as_deref(), Some("k"));
}
