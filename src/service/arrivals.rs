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

use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::sync::Arc;

use tokio::sync::Notify;
use tokio::sync::futures::OwnedNotified;

use super::Stream;
use super::stream::State;

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
    /// Whether an append waits for another to be decided.
    #[cfg(test)]
    pub(super) fn waited_on(&self) -> bool {
        self.decided
            .as_ref()
            .is_some_and(|notify| Arc::strong_count(notify) > 1)
    }
}

/// One producer append's place among its stream's arrivals, until it is decided (or dropped
/// undecided).
pub struct Arrival {
    stream: Arc<Stream>,
    number: u64,
    producer: u64,
    decided: bool,
}

impl Arrival {
    /// Takes the next place among `stream`'s arrivals, for an append of `producer`.
    pub(super) fn take(stream: &Arc<Stream>, producer: &str) -> Arrival {
        let producer = BuildHasherDefault::<DefaultHasher>::default().hash_one(producer);
        let mut state = stream.lock();
        let arrivals = state.arrivals.get_or_insert_with(Box::default);
        let number = arrivals.next;
        arrivals.next += 1;
        arrivals.undecided.push((number, producer));
        Arrival {
            stream: stream.clone(),
            number,
            producer,
            decided: false,
        }
    }

    /// Whether it is a place among `stream`'s arrivals.
    pub(super) fn is_on(&self, stream: &Arc<Stream>) -> bool {
        Arc::ptr_eq(&self.stream, stream)
    }

    /// Under the lock: when an append of the same producer that arrived before this one is
    /// still undecided, a future that completes once an append is decided after now (awaited
    /// outside the lock).
    pub(super) fn earlier_undecided(&self, state: &mut State) -> Option<OwnedNotified> {
        let arrivals = state.arrivals.as_deref_mut()?;
        let earlier = |(number, _): &&(u64, u64)| *number < self.number;
        let same = |(_, producer): &(u64, u64)| *producer == self.producer;
        if !arrivals.undecided.iter().take_while(earlier).any(same) {
            return None;
        }
        let notify = arrivals.decided.get_or_insert_with(Arc::default);
        Some(notify.clone().notified_owned())
    }

    /// Marks it decided, under the lock it was decided under.
    pub(super) fn decided(&mut self, state: &mut State) {
        if std::mem::replace(&mut self.decided, true) {
            return;
        }
        let Some(arrivals) = state.arrivals.as_deref_mut() else {
            return;
        };
        if let Some(at) = arrivals
            .undecided
            .iter()
            .position(|(n, _)| *n == self.number)
        {
            arrivals.undecided.remove(at);
        }
        if let Some(notify) = &arrivals.decided {
            notify.notify_waiters();
        }
        if arrivals.undecided.is_empty() {
            // Those waiting were woken and hold the notifier; the numbers start again at 0.
            state.arrivals = None;
        }
    }
}

impl Drop for Arrival {
    fn drop(&mut self) {
        if !self.decided {
            let stream = self.stream.clone();
            self.decided(&mut stream.lock());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::stream::tests::test_stream;

    #[tokio::test]
    async fn only_the_same_producers_earlier_undecided_append_is_waited_for_and_its_decision_wakes()
    {
        let stream = test_stream();
        let first = Arrival::take(&stream, "p");
        let other = Arrival::take(&stream, "q");
        let mut second = Arrival::take(&stream, "p");
        assert!(
            other.earlier_undecided(&mut stream.lock()).is_none(),
            "another producer's append is not waited for"
        );
        assert!(first.earlier_undecided(&mut stream.lock()).is_none());
        let wait = second
            .earlier_undecided(&mut stream.lock())
            .expect("the first is undecided");
        // Dropped undecided (its request went away): that counts as decided, and wakes.
        drop(first);
        tokio::time::timeout(std::time::Duration::from_secs(5), wait)
            .await
            .expect("woken");
        assert!(second.earlier_undecided(&mut stream.lock()).is_none());
        let third = Arrival::take(&stream, "p");
        second.decided(&mut stream.lock());
        assert!(third.earlier_undecided(&mut stream.lock()).is_none());
        drop((third, other));
        assert!(
            stream.lock().arrivals.is_none(),
            "nothing is kept once none is in flight"
        );
    }
}
