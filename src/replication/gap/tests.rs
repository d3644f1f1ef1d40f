//! What a mirror does about a gap, given the state it last had and its copy's tail.

use super::*;
use crate::model::streamld;

fn gap(oldest_seq: u64, diverged: bool) -> GapSignal {
    GapSignal {
        oldest_available: Some(streamld::sequence_of(oldest_seq)),
        diverged,
        ..Default::default()
    }
}

#[test]
fn a_gap_newer_than_the_state_held_joins_again_rather_than_rebuilding_the_copy_from_it() {
    // The state said 0..=10; the copy went on to 15; the upstream then trimmed to 20.
    assert_eq!(
        after_gap(&gap(20, false), Some(0..=10), Some(15)),
        GapAction::JoinAgain
    );
    // No copy yet: the join brings the state to make it from.
    assert_eq!(
        after_gap(&gap(20, false), Some(0..=10), None),
        GapAction::JoinAgain
    );
}

#[test]
fn a_gap_the_state_explains_rebuilds_the_copy_unless_the_copy_is_held() {
    assert_eq!(
        after_gap(&gap(20, false), Some(20..=30), Some(15)),
        GapAction::Rebuild
    );
    assert_eq!(
        after_gap(&gap(20, false), Some(20..=30), Some(20)),
        GapAction::JoinAgain,
        "a new copy made at the retained start goes on from there"
    );
    assert_eq!(
        after_gap(&gap(20, true), Some(20..=30), Some(25)),
        GapAction::Rebuild,
        "a diverged copy is rebuilt wherever its tail is"
    );
    assert_eq!(
        after_gap(&GapSignal::default(), None, Some(25)),
        GapAction::Rebuild
    );
}
