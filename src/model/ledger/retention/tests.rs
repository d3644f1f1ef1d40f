//! Retention moves and S2 trims.

use super::*;
use crate::model::ledger::testing::Fixture;
use crate::model::stream::SnapshotInfo;

const NOW: i64 = 1_000;

fn with_snapshot_at(seq: u64) -> Fixture {
    let mut f = Fixture::text().at(10);
    f.meta.extra_mut().snapshot = Some(SnapshotInfo {
        offset: Offset::new(seq, seq),
        content_type: "a/b".into(),
        digest: "d".into(),
    });
    f
}

fn retain(f: &mut Fixture, seq: u64, why: RetentionMove) -> Result<Option<Retained>, Refusal> {
    let at = Offset::new(seq, seq);
    f.ledger().apply(Retain { at, why }, NOW)
}

#[test]
fn retention_may_not_pass_the_visible_snapshot_nor_move_without_one() {
    let mut f = with_snapshot_at(4);
    let passes = Err(Refusal::Conflict(Conflict::PassesSnapshot));
    assert_eq!(retain(&mut f, 5, RetentionMove::KeepSnapshot), passes);
    let mut without = Fixture::text().at(10);
    assert_eq!(retain(&mut without, 1, RetentionMove::KeepSnapshot), passes);
    let up_to_it = retain(&mut f, 4, RetentionMove::KeepSnapshot).unwrap();
    assert_eq!(
        up_to_it,
        Some(Retained {
            moved: true,
            snapshot_dropped: false
        })
    );
    assert_eq!(f.meta.retained_from, Offset::new(4, 4));
}

#[test]
fn a_removed_stream_is_not_found_before_retention_is_checked_against_its_snapshot() {
    let mut f = with_snapshot_at(4);
    f.removed = true;
    assert_eq!(
        retain(&mut f, 5, RetentionMove::KeepSnapshot),
        Err(Refusal::NotFound)
    );
}

#[test]
fn a_trim_takes_a_snapshot_it_passes_with_it() {
    let mut f = with_snapshot_at(4);
    let trimmed = retain(&mut f, 5, RetentionMove::Trim(5)).unwrap();
    assert_eq!(
        trimmed,
        Some(Retained {
            moved: true,
            snapshot_dropped: true
        })
    );
    assert!(f.meta.extra().snapshot.is_none());
}

#[test]
fn a_trim_settles_its_pending_mark_even_when_nothing_is_left_to_move() {
    let mut f = Fixture::text().at(10);
    f.meta.retained_from = Offset::new(6, 6);
    f.meta.extra_mut().pending_trim = Some(5);
    let settled = retain(&mut f, 0, RetentionMove::Trim(5)).unwrap();
    assert_eq!(
        settled,
        Some(Retained {
            moved: false,
            snapshot_dropped: false
        })
    );
    assert_eq!(f.meta.extra().pending_trim, None);
}

#[test]
fn a_trim_short_of_a_later_pending_one_leaves_it_pending() {
    let mut f = Fixture::text().at(10);
    f.meta.extra_mut().pending_trim = Some(8);
    retain(&mut f, 3, RetentionMove::Trim(3)).unwrap();
    assert_eq!(f.meta.extra().pending_trim, Some(8));
    assert_eq!(f.meta.retained_from, Offset::new(3, 3));
}

#[test]
fn retention_never_moves_back() {
    let mut f = with_snapshot_at(4);
    f.meta.retained_from = Offset::new(4, 4);
    assert_eq!(retain(&mut f, 2, RetentionMove::KeepSnapshot), Ok(None));
    assert_eq!(f.meta.retained_from, Offset::new(4, 4));
}
