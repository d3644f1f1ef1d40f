//! The order in which a producer's appends to a stream arrived, so that a refusal its earlier
//! append may still lift waits for that append to be decided.
//!
//! Appends are decided under the stream lock in the order they reach it. A pipelining producer
//! sends its appends on connections of their own; each reaches the lock only once its body has
//! arrived, and a large one only once that body is also written to a file of its own and synced
//! (`storage::staged`). So they reach the lock in any order, and a later sequence number decided
//! first is refused as a gap that the earlier ones, already under way, were about to fill: the
//! producer must wait and send it again, body and all. So each producer append takes a number
//! when it arrives (the DS face: when its request head does, before its body), and one that
//! would be refused in a way its producer's earlier append can change (see
//! `Refusal::waits_for_its_producer` in `model::ledger`) first waits until every append of that
//! producer that arrived before it is decided.
//!
//! Only the same producer's earlier appends are waited for, so the wait is bounded and nobody
//! else's slow upload holds anyone up: the earliest undecided append never waits, and an append
//! that ends undecided (refused, failed, its request gone, its body never finished) counts as
//! decided.
//!
//! This file holds a stream's queue of arrivals (kept in its state, under its lock); one
//! append's place in it is an [`super::arrival::Arrival`].

use std::sync::Arc;

use tokio::sync::Notify;
use tokio::sync::futures::OwnedNotified;

/// A stream's producer appends that arrived and are not decided yet. It exists only while there
/// are some: most streams have none in flight most of the time, and a million idle ones should
/// not carry it.
#[derive(Default)]
pub(super) struct Arrivals {
    next: u64,
    /// Number and producer (hashed: a collision only makes an append wait for another's
    /// decision), in arrival order.
    undecided: Vec<(u64, u64)>,
    /// Woken when an append is decided; made by the first append that waits.
    decided: Option<Arc<Notify>>,
}

impl Arrivals {
    /// Numbers an append of `producer` that arrives now.
    pub(super) fn take(&mut self, producer: u64) -> u64 {
        let number = self.next;
        self.next += 1;
        self.undecided.push((number, producer));
        number
    }

    /// When an append of `producer` that arrived before `number` is still undecided, a future
    /// that completes once an append is decided after now.
    pub(super) fn earlier_undecided(
        &mut self,
        number: u64,
        producer: u64,
    ) -> Option<OwnedNotified> {
        let earlier = |(n, _): &&(u64, u64)| *n < number;
        let same = |(_, p): &(u64, u64)| *p == producer;
        if !self.undecided.iter().take_while(earlier).any(same) {
            return None;
        }
        let notify = self.decided.get_or_insert_with(Arc::default);
        Some(notify.clone().notified_owned())
    }

    /// Marks the append `number` decided and wakes those waiting; true when none is left
    /// undecided (those waiting were woken and hold the notifier: the queue may go, and the
    /// numbers start again at 0).
    pub(super) fn decide(&mut self, number: u64) -> bool {
        if let Some(at) = self.undecided.iter().position(|(n, _)| *n == number) {
            self.undecided.remove(at);
        }
        if let Some(notify) = &self.decided {
            notify.notify_waiters();
        }
        self.undecided.is_empty()
    }

    /// Whether an append waits for another to be decided.
    #[cfg(test)]
    pub(super) fn waited_on(&self) -> bool {
        self.decided
            .as_ref()
            .is_some_and(|notify| Arc::strong_count(notify) > 1)
    }
}
