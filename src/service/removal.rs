//! Streams going: a client's delete, expiry, and a fork's source following its last fork. A
//! stream that forks read through is deleted softly (gone for its own clients, kept for the
//! forks); the rules are the ledger's (`model::ledger::lifecycle`, `model::ledger::fork`).

use std::sync::Arc;

use super::stream::State;
use super::{Stream, StreamResult, StreamService, now_ms, to_the_end};
use crate::model::ledger::fork::{ReleaseFork, Released};
use crate::model::ledger::lifecycle::{Remove, Removed};
use crate::storage::Change;

pub use crate::model::ledger::lifecycle::Removal;

impl StreamService {
    pub async fn delete(&self, name: &str) -> StreamResult<()> {
        let stream = self.find(name, false).await?;
        Self::writable(&stream)?;
        self.remove(&stream).await.map(|_| ())
    }

    /// Deletes a stream: softly while forks still read through it, otherwise for good (and then
    /// its source may follow, if it was only kept for this fork).
    pub(super) fn remove<'a>(
        &'a self,
        stream: &'a Arc<Stream>,
    ) -> futures::future::BoxFuture<'a, StreamResult<Removal>> {
        Box::pin(async move {
            let removal = self.remove_if(stream, |_| true).await?;
            Ok(removal.unwrap_or(Removal::Hard))
        })
    }

    /// [`Self::remove`], if `still` holds of the stream under its lock: what made a background
    /// pass pick it (expired, empty) is checked again where no append can slip in between and
    /// be acknowledged, then deleted with the stream. `None` when it no longer holds.
    pub(super) fn remove_if<'a>(
        &'a self,
        stream: &'a Arc<Stream>,
        still: impl FnOnce(&State) -> bool + Send + 'a,
    ) -> futures::future::BoxFuture<'a, StreamResult<Option<Removal>>> {
        Box::pin(async move {
            let (removal, commit) = {
                let mut state = stream.lock();
                let still = still(&state);
                let removal = match state.ledger(stream).apply(Remove { still }, now_ms()) {
                    Removed::NotDue => return Ok(None),
                    Removed::Was(removal) => return Ok(Some(removal)),
                    Removed::Now(removal) => removal,
                };
                let change = match removal {
                    Removal::Soft => Change::PutStream(stream.id, Box::new(state.meta.clone())),
                    Removal::Hard => Change::RemoveStream(stream.id),
                };
                (removal, self.engine.commit(vec![change]))
            };
            if removal == Removal::Hard {
                self.forget(stream);
            }
            let (service, stream) = (self.me(), Arc::clone(stream));
            to_the_end(async move {
                commit.await?;
                match removal {
                    Removal::Hard => {
                        stream.publish(|d| d.removed = true);
                        service.release_source(&stream).await;
                    }
                    // Its live readers and replication sessions learn it is gone for them.
                    Removal::Soft => stream.publish(|d| d.soft_deleted = true),
                }
                Ok(Some(removal))
            })
            .await
        })
    }

    /// A fork is gone: its source loses a reference, and goes too if it was soft-deleted; if it
    /// stays, the records its retention passed while forks held them are deleted now.
    pub(super) async fn release_source(&self, fork: &Stream) {
        let Some(source) = &fork.source else { return };
        let Released {
            cascade,
            trim_below,
        } = source.lock().ledger(source).apply(ReleaseFork, now_ms());
        let trim = trim_below.map(|below| Change::TrimRecords(source.id, below));
        if cascade && let Err(e) = self.remove(source).await {
            tracing::warn!(stream = %source.name, error = %e, "removing a released fork source failed");
        }
        if let Some(trim) = trim
            && let Err(e) = self.engine.commit(vec![trim]).await
        {
            tracing::warn!(stream = %source.name, error = %e, "trimming a released fork source failed");
        }
    }

    /// Removes every stream whose TTL or expiry time has passed.
    pub async fn sweep_expired(&self) {
        let now = now_ms();
        let candidates = self
            .streams_where_in_turn(
                |registry| &registry.expiring,
                |s| {
                    let state = s.lock();
                    (!state.removed && !state.meta.soft_deleted && s.expired(&state, now))
                        .then(|| s.clone())
                },
            )
            .await;
        for stream in candidates {
            let still_expired =
                |state: &State| !state.meta.soft_deleted && stream.expired(state, now);
            if let Err(e) = self.remove_if(&stream, still_expired).await {
                tracing::warn!(stream = %stream.name, error = %e, "expiring a stream failed");
            }
        }
    }
}
