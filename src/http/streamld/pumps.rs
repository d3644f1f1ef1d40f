//! A replication session's subscriptions: one per target (a stream or a bucket) the replica
//! joined, each with the pump that feeds it (see `service::sessions::replica_feed`), a later
//! join of the same target replacing it.

use std::collections::HashMap;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::model::streamld::Message;
use crate::model::wire::streamld_target::Target;
use crate::service::sessions::OwnedTask;
use crate::service::sessions::replica_feed::Outbox;

/// The most targets one session follows at once. A replica of many streams follows their
/// bucket; without a bound, joins of streams that do not exist, sent to a session that reads
/// slowly, would each leave a pump waiting for room.
pub const MAX_SUBSCRIPTIONS: usize = 10_000;

/// A live subscription of the session: dropping it (replaced, or the session ended) silences
/// its outbox, then aborts its pump.
struct Subscription {
    /// Which of the session's subscriptions this is, so a pump's end is not taken for that of
    /// a later subscription to the same target.
    generation: u64,
    ended: tokio_util::sync::DropGuard,
    /// Stops the pump when the subscription goes.
    _pump: OwnedTask,
}

/// A session's live subscriptions, by target. How many there are across sessions is
/// `runnel_replication_subscriptions` on `/metrics`.
#[derive(Default)]
pub(super) struct Subscriptions {
    live: HashMap<String, Subscription>,
    started: u64,
    /// The parent of every subscription's token: cancelled when the session ends, it silences
    /// what finished subscriptions still have queued too.
    session: CancellationToken,
    /// A pump could not go on (see [`Outbox::failed`]).
    pub(super) failed: CancellationToken,
}

const SUBSCRIPTIONS_GAUGE: &str = "runnel_replication_subscriptions";

impl Subscriptions {
    /// Starts a subscription to `target`, replacing (and silencing) the one before. `pump`
    /// gets the outbox and the subscription's generation.
    pub(super) fn replace<F>(
        &mut self,
        target: String,
        queue: &mpsc::Sender<(CancellationToken, Message)>,
        pump: impl FnOnce(Outbox, u64) -> F,
    ) where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        // The old subscription (if any) ends before the new one starts.
        self.forget(&target);
        self.started += 1;
        let subscription = self.session.child_token();
        let outbox = Outbox {
            queue: queue.clone(),
            subscription: subscription.clone(),
            failed: self.failed.clone(),
        };
        let started = Subscription {
            generation: self.started,
            ended: subscription.drop_guard(),
            _pump: OwnedTask::spawn(pump(outbox, self.started)),
        };
        self.live.insert(target, started);
        metrics::gauge!(SUBSCRIPTIONS_GAUGE).increment(1.0);
    }

    /// Whether a join of `target` may start: it replaces one, or the session follows fewer
    /// than [`MAX_SUBSCRIPTIONS`].
    pub(super) fn has_room_for(&self, target: &Target) -> bool {
        self.live.len() < MAX_SUBSCRIPTIONS || self.live.contains_key(&target.name())
    }

    /// Forgets the subscription to `target` whose pump ended, unless a later join replaced it.
    /// What it queued before it ended is still sent.
    pub(super) fn finished(&mut self, target: &str, generation: u64) {
        if self
            .live
            .get(target)
            .is_some_and(|s| s.generation == generation)
            && let Some(done) = self.live.remove(target)
        {
            done.ended.disarm();
            metrics::gauge!(SUBSCRIPTIONS_GAUGE).decrement(1.0);
        }
    }

    fn forget(&mut self, target: &str) {
        if self.live.remove(target).is_some() {
            metrics::gauge!(SUBSCRIPTIONS_GAUGE).decrement(1.0);
        }
    }

    /// Whether the replica ever joined anything on this session.
    pub(super) fn joined(&self) -> bool {
        self.started > 0
    }
}

impl Drop for Subscriptions {
    fn drop(&mut self) {
        self.session.cancel();
        metrics::gauge!(SUBSCRIPTIONS_GAUGE).decrement(self.live.len() as f64);
    }
}
