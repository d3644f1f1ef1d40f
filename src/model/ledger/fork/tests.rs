//! What a fork asks of its source, one test per rule and per precedence between two of them.

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

#[test]
fn a_mirror_is_refused_as_a_source_before_its_sealing_and_its_chain() {
    let all = Source {
        mirrored: true,
        encrypted: true,
        chain: MAX_FORK_CHAIN,
    };
    assert_eq!(
        all.forkable(),
        Err(Refusal::Conflict(Conflict::ForkOfMirror))
    );
}

#[test]
fn a_sealed_source_is_refused_before_its_chain_is_looked_at() {
    let sealed = Source {
        encrypted: true,
        chain: MAX_FORK_CHAIN,
        ..Source::default()
    };
    assert_eq!(sealed.forkable(), Err(Refusal::Encrypted));
}

#[test]
fn a_fork_chain_holds_at_most_its_limit_of_streams() {
    let full = Source {
        chain: MAX_FORK_CHAIN,
        ..Source::default()
    };
    assert_eq!(
        full.forkable(),
        Err(Refusal::ForkChainTooLong {
            chain: MAX_FORK_CHAIN
        })
    );
    let room = Source {
        chain: MAX_FORK_CHAIN - 1,
        ..Source::default()
    };
    assert_eq!(room.forkable(), Ok(()));
}

#[test]
fn a_fork_inherits_the_snapshot_only_of_a_trimmed_source_and_not_before_it() {
    assert!(!inherits_snapshot(Offset::START, Offset::new(5, 5)));
    assert!(!inherits_snapshot(Offset::new(3, 3), Offset::new(2, 2)));
    assert!(inherits_snapshot(Offset::new(3, 3), Offset::new(3, 3)));
    let snapshot = snapshot_at(4, "d");
    assert_eq!(
        covers(&snapshot, Offset::new(3, 3)),
        Err(Refusal::Conflict(Conflict::ForkBeforeSnapshot))
    );
    assert_eq!(covers(&snapshot, Offset::new(4, 4)), Ok(()));
}

fn take(f: &mut Fixture, anchor: u64, inherited: Option<&SnapshotInfo>) -> Result<Offset, Refusal> {
    let anchor = Offset::new(anchor, anchor);
    f.ledger().apply(TakeFork { anchor, inherited }, NOW)
}

/// A source retained from 3, with its snapshot there.
fn trimmed() -> Fixture {
    let mut f = Fixture::text().at(10);
    f.meta.retained_from = Offset::new(3, 3);
    f.meta.extra_mut().snapshot = Some(snapshot_at(3, "d"));
    f
}

#[test]
fn a_source_deleted_meanwhile_is_gone_before_its_retention_is_checked() {
    for removed in [true, false] {
        let mut f = trimmed();
        f.removed = removed;
        f.meta.soft_deleted = !removed;
        assert_eq!(take(&mut f, 1, None), Err(Refusal::ForkSourceGone));
        assert_eq!(f.forks, 0);
    }
}

#[test]
fn an_anchor_retention_passed_meanwhile_is_refused_before_the_snapshot_is_compared() {
    let mut f = trimmed();
    assert_eq!(
        take(&mut f, 2, None),
        Err(Refusal::Retained {
            first: Offset::new(3, 3)
        })
    );
    assert_eq!(f.forks, 0);
}

#[test]
fn a_trimmed_sources_snapshot_must_be_the_one_the_fork_planned_with() {
    let mut f = trimmed();
    let other = snapshot_at(3, "other");
    assert_eq!(
        take(&mut f, 5, Some(&other)),
        Err(Refusal::Conflict(Conflict::ForkSnapshotChanged))
    );
    assert_eq!(f.forks, 0);
    let planned = snapshot_at(3, "d");
    assert_eq!(take(&mut f, 5, Some(&planned)), Ok(Offset::new(3, 3)));
    assert_eq!(f.forks, 1, "the source counts the fork it took");
}

#[test]
fn an_untrimmed_sources_snapshot_is_not_compared() {
    let mut f = Fixture::text().at(10);
    f.meta.extra_mut().snapshot = Some(snapshot_at(3, "d"));
    assert_eq!(take(&mut f, 5, None), Ok(Offset::START));
}

fn release(f: &mut Fixture) -> Released {
    f.ledger().apply(ReleaseFork, NOW)
}

#[test]
fn a_source_kept_only_for_its_forks_goes_with_the_last_and_is_not_trimmed_first() {
    let mut f = trimmed();
    f.meta.soft_deleted = true;
    f.forks = 2;
    assert_eq!(
        release(&mut f),
        Released {
            cascade: false,
            trim_below: None
        },
        "a fork still holds it"
    );
    assert_eq!(
        release(&mut f),
        Released {
            cascade: true,
            trim_below: None
        }
    );
}

#[test]
fn a_source_released_by_its_last_fork_deletes_what_its_retention_passed() {
    let mut f = trimmed();
    f.forks = 1;
    assert_eq!(
        release(&mut f),
        Released {
            cascade: false,
            trim_below: Some(3)
        }
    );
}

#[test]
fn a_removed_source_is_neither_removed_again_nor_trimmed() {
    let mut f = trimmed();
    f.removed = true;
    f.meta.soft_deleted = true;
    f.forks = 1;
    assert_eq!(
        release(&mut f),
        Released {
            cascade: false,
            trim_below: None
        }
    );
}
