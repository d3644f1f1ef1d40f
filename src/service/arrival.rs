//! One producer append's place among its stream's arrivals (see `arrivals`), held from when the
//! append arrives until it is decided.

use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::sync::Arc;

use tokio::sync::futures::OwnedNotified;

use super::Stream;
use super::stream::State;

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
        let number = arrivals.take(producer);
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
        (state.arrivals.as_deref_mut()?).earlier_undecided(self.number, self.producer)
    }

    /// Marks it decided, under the lock it was decided under.
    pub(super) fn decided(&mut self, state: &mut State) {
        if std::mem::replace(&mut self.decided, true) {
            return;
        }
        let Some(arrivals) = state.arrivals.as_deref_mut() else {
            return;
        };
        if arrivals.decide(self.number) {
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
