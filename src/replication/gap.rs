//! What a mirror does when its upstream no longer holds what comes next in a stream.

use std::ops::RangeInclusive;

use crate::model::streamld::GapSignal;

/// What a mirror does about a gap in one of its streams.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum GapAction {
    /// Join again from the copy's tail; the upstream answers with its state as it is now, then
    /// the records after the tail, or the gap again.
    JoinAgain,
    /// Start the copy over from the upstream's last state: at its retained start, with its
    /// snapshot.
    Rebuild,
}

/// What to do about `gap`, given the records the upstream held when it last sent its state
/// (`held`, by ordinal) and the copy's tail.
///
/// The copy goes on from its tail when the upstream held it: so it is for a new copy of a
/// trimmed stream, made at the upstream's retained start after its join went out with cursor 0.
/// It also joins again when the gap is newer than the state, as when the upstream trimmed while
/// it sent the records before: a rebuild from that state would start the copy over at a start
/// the upstream no longer holds, behind the copy's own tail, and readers would see the stream
/// go back. The join brings the state that explains the gap.
pub(super) fn after_gap(
    gap: &GapSignal,
    held: Option<RangeInclusive<u64>>,
    copy_tail: Option<u64>,
) -> GapAction {
    let Some(held) = held.filter(|_| !gap.diverged) else {
        return GapAction::Rebuild;
    };
    let copy_is_held = copy_tail.is_some_and(|tail| held.contains(&tail));
    let state_is_older =
        (gap.oldest_available).is_some_and(|oldest| oldest.saturating_sub(1) > *held.start());
    if copy_is_held || state_is_older {
        GapAction::JoinAgain
    } else {
        GapAction::Rebuild
    }
}

#[cfg(test)]
mod tests;
