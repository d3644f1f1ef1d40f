//! Deletion, one test per rule and per precedence between two of them.

use super::*;
use crate::model::ledger::testing::Fixture;

const NOW: i64 = 1_000;

fn remove(f: &mut Fixture, still: bool) -> Removed {
    f.ledger().apply(Remove { still }, NOW)
}

#[test]
fn a_stream_removed_for_good_stays_so_whether_or_not_its_reason_still_holds() {
    let mut f = Fixture::text();
    f.removed = true;
    f.forks = 1;
    assert_eq!(remove(&mut f, false), Removed::Was(Removal::Hard));
    assert!(!f.meta.soft_deleted);
}

#[test]
fn a_reason_that_no_longer_holds_deletes_nothing() {
    let mut f = Fixture::text();
    assert_eq!(remove(&mut f, false), Removed::NotDue);
    assert!(!f.removed);
    f.forks = 1;
    f.meta.soft_deleted = true;
    assert_eq!(remove(&mut f, false), Removed::NotDue);
}

#[test]
fn a_stream_forks_read_through_is_deleted_softly_once() {
    let mut f = Fixture::text();
    f.forks = 1;
    assert_eq!(remove(&mut f, true), Removed::Now(Removal::Soft));
    assert!(f.meta.soft_deleted && !f.removed);
    assert_eq!(remove(&mut f, true), Removed::Was(Removal::Soft));
}

#[test]
fn a_stream_no_fork_reads_through_is_deleted_for_good() {
    let mut f = Fixture::text();
    assert_eq!(remove(&mut f, true), Removed::Now(Removal::Hard));
    assert!(f.removed);
}
