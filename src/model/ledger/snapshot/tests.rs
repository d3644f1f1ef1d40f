//! Publishing and deleting the visible snapshot, one test per rule and per precedence between
//! two of them.

use super::*;
use crate::model::ledger::testing::Fixture;

const NOW: i64 = 1_000;

fn snapshot_at(seq: u64, digest: &str) -> SnapshotInfo {
    SnapshotInfo {
        offset: Offset::new(seq, seq),
        content_type: "a/b".into(),
        digest: digest.into(),
    }
}

/// A stream of 10 records retained from 4, with its snapshot there (digest "d").
fn trimmed() -> Fixture {
    let mut f = Fixture::text().at(10);
    f.meta.retained_from = Offset::new(4, 4);
    f.meta.extra_mut().snapshot = Some(snapshot_at(4, "d"));
    f
}

fn publish(
    f: &mut Fixture,
    snapshot: SnapshotInfo,
    expected: Option<&str>,
) -> Result<Published, Refusal> {
    let publish = PublishSnapshot {
        snapshot,
        expected_digest: expected,
    };
    f.ledger().apply(publish, NOW)
}

#[test]
fn a_publish_on_a_deleted_stream_is_refused_even_as_a_repeat() {
    let mut f = trimmed();
    f.meta.soft_deleted = true;
    assert_eq!(
        publish(&mut f, snapshot_at(4, "d"), None),
        Err(Refusal::Gone)
    );
    f.removed = true;
    assert_eq!(
        publish(&mut f, snapshot_at(4, "d"), None),
        Err(Refusal::NotFound)
    );
}

#[test]
fn a_repeated_publish_succeeds_whatever_its_condition_and_renews() {
    let mut f = trimmed();
    let repeat = publish(&mut f, snapshot_at(4, "d"), Some("stale"));
    assert_eq!(repeat, Ok(Published::Repeat));
    assert_eq!(f.last_access_ms, NOW);
}

#[test]
fn another_snapshot_at_the_same_offset_conflicts_before_the_condition_is_checked() {
    let mut f = trimmed();
    assert_eq!(
        publish(&mut f, snapshot_at(4, "e"), Some("stale")),
        Err(Refusal::Conflict(Conflict::SnapshotDiffers))
    );
    assert_eq!(f.last_access_ms, 0, "a refused publish does not renew");
}

#[test]
fn a_failed_condition_is_refused_before_retention_is_checked() {
    let mut f = trimmed();
    assert_eq!(
        publish(&mut f, snapshot_at(2, "e"), Some("stale")),
        Err(Refusal::Conflict(Conflict::SnapshotMatch))
    );
    let mut without = Fixture::text().at(10);
    assert_eq!(
        publish(&mut without, snapshot_at(2, "e"), Some("d")),
        Err(Refusal::Conflict(Conflict::SnapshotMatch)),
        "a condition on a stream without a snapshot fails"
    );
}

#[test]
fn a_snapshot_before_the_retained_start_is_refused() {
    let mut f = trimmed();
    assert_eq!(
        publish(&mut f, snapshot_at(2, "e"), Some("d")),
        Err(Refusal::Retained {
            first: Offset::new(4, 4)
        })
    );
}

#[test]
fn a_new_snapshot_replaces_the_visible_one_and_renews() {
    let mut f = trimmed();
    assert_eq!(
        publish(&mut f, snapshot_at(6, "e"), Some("d")),
        Ok(Published::Replaced)
    );
    assert_eq!(f.meta.extra().snapshot, Some(snapshot_at(6, "e")));
    assert_eq!(f.last_access_ms, NOW);
}

fn delete(f: &mut Fixture, seq: u64) -> Result<(), Refusal> {
    let at = Offset::new(seq, seq);
    f.ledger().apply(DeleteSnapshot { at }, NOW)
}

#[test]
fn a_delete_of_another_snapshot_is_not_found_before_bootstrap_needs_it() {
    let mut f = trimmed();
    assert_eq!(delete(&mut f, 5), Err(Refusal::SnapshotNotFound));
    let mut without = Fixture::text().at(10);
    assert_eq!(delete(&mut without, 0), Err(Refusal::SnapshotNotFound));
}

#[test]
fn a_snapshot_bootstrap_starts_at_is_not_deleted() {
    let mut f = trimmed();
    assert_eq!(
        delete(&mut f, 4),
        Err(Refusal::Conflict(Conflict::SnapshotNeeded))
    );
    f.meta.retained_from = Offset::START;
    assert_eq!(delete(&mut f, 4), Ok(()));
    assert_eq!(f.meta.extra().snapshot, None);
}

#[test]
fn a_delete_on_a_removed_stream_is_not_found_as_a_stream() {
    let mut f = trimmed();
    f.removed = true;
    assert_eq!(delete(&mut f, 5), Err(Refusal::NotFound));
}
