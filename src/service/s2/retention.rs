//! The S2 stream configurations that act over time (retention ages, delete-on-empty), and trims.

use std::collections::HashSet;
use std::sync::Arc;

use crate::model::Offset;
use crate::model::ledger::retention::RetentionMove;
use crate::model::ledger::s2::ms;
use crate::model::s2::{self, StreamConfig};
use crate::service::{Stream, StreamError, StreamResult, StreamService, now_ms};

impl StreamService {
    /// Applies the S2 stream configurations that act over time: retention ages, then
    /// delete-on-empty. Mirrors follow their upstream instead. Runs every few seconds.
    pub async fn enforce_s2_configs(&self) {
        let configured = self
            .streams_where_in_turn(
                |registry| &registry.streams,
                |s| {
                    if s.mirror_of.is_some() {
                        return None;
                    }
                    let state = s.lock();
                    let config = state.meta.extra().s2_config.as_ref()?;
                    (!state.removed).then(|| (s.clone(), config.clone()))
                },
            )
            .await;
        self.enforce_retention_ages(&configured).await;
        self.delete_empty_streams(&configured).await;
    }

    /// Trims the records older than their stream's `retention_policy.age`.
    async fn enforce_retention_ages(&self, configured: &[(Arc<Stream>, StreamConfig)]) {
        let with_age =
            configured
                .iter()
                .filter_map(|(stream, config)| match config.retention_policy {
                    Some(s2::RetentionPolicy::Age(age)) => Some((stream, age)),
                    _ => None,
                });
        let now = ms(now_ms());
        for (stream, age) in with_age {
            let durable = stream.durable();
            let cutoff = now.saturating_sub(age.saturating_mul(1000));
            if durable.first.seq >= durable.tail.seq {
                continue;
            }
            // Ages count from arrival: a client's timestamps (which may be anything, under
            // client-prefer or client-require) never make a record expire early.
            let expired = match self
                .first_at_or_after(stream, cutoff, durable.first.seq, durable.tail.seq, |r| {
                    r.arrival_ms
                })
                .await
            {
                Ok(keep_from) => self.trim(stream, keep_from).await,
                Err(e) => Err(e),
            };
            if let Err(e) = expired {
                tracing::warn!(stream = %stream.name, error = %e, "applying the retention age failed");
            }
        }
    }

    /// Deletes the streams with `delete_on_empty` once they have been empty for its
    /// `min_age_secs`, as S2 does: a stream never written to counts from its creation; one whose
    /// records are all trimmed (by retention or a trim command), from when this pass first found
    /// it empty, and an append in between, even one trimmed again since, starts the wait over.
    async fn delete_empty_streams(&self, configured: &[(Arc<Stream>, StreamConfig)]) {
        let now = ms(now_ms());
        let due: Vec<(&Arc<Stream>, u64)> = {
            let mut watched = self
                .empty_streams
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let mut still_empty = HashSet::new();
            let due = configured
                .iter()
                .filter_map(|(stream, config)| {
                    let rule = config.delete_on_empty.as_ref()?;
                    let durable = stream.durable();
                    let tail = durable.tail.seq;
                    if rule.min_age_secs().is_none() || durable.first.seq < tail {
                        return None;
                    }
                    if tail == 0 {
                        let created = ms(stream.lock().meta.created_ms);
                        return rule.due(created, now).then_some((stream, tail));
                    }
                    still_empty.insert(stream.id);
                    let seen = watched.entry(stream.id).or_insert((tail, now));
                    if seen.0 != tail {
                        *seen = (tail, now);
                    }
                    rule.due(seen.1, now).then_some((stream, tail))
                })
                .collect();
            watched.retain(|id, _| still_empty.contains(id));
            due
        };
        for (stream, tail) in due {
            // Nothing appended since it was found empty, checked again under its lock.
            match self
                .remove_if(stream, |state| state.meta.tail.seq == tail)
                .await
            {
                Ok(Some(_)) => {
                    tracing::info!(stream = %stream.name, "deleted: empty for its delete_on_empty min_age")
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(stream = %stream.name, error = %e, "delete-on-empty failed")
                }
            }
        }
    }

    /// Moves the stream's first record to `seq` (an S2 trim): older records are gone, and the
    /// trim command's pending mark goes in the same commit, also when nothing was left to trim.
    pub(in crate::service) async fn trim(
        &self,
        stream: &Arc<Stream>,
        seq: u64,
    ) -> StreamResult<()> {
        let durable = stream.durable();
        let at = if seq > durable.first.seq {
            match self
                .record_offset(stream, seq.min(durable.tail.seq), durable.tail)
                .await
            {
                Ok(at) => at,
                // Retention passed the point meanwhile: no record is left to trim, and the
                // pending mark goes all the same.
                Err(StreamError::RecordRetained { .. }) => Offset::START,
                Err(e) => return Err(e),
            }
        } else {
            Offset::START
        };
        self.move_retention(stream, at, RetentionMove::Trim(seq))
            .await
    }

    /// Carries out, at startup, the trim commands that were stored but not applied because the
    /// server stopped in between. Only then: while it runs, a pending trim may belong to a
    /// batch not yet durable, which the batch's own completion applies.
    pub async fn settle_pending_trims(&self) {
        let pending = self.streams_where(
            |registry| &registry.streams,
            "",
            |s| {
                let seq = s.lock().meta.extra().pending_trim?;
                (seq <= s.durable().tail.seq).then(|| (s.clone(), seq))
            },
        );
        for (stream, seq) in pending {
            if let Err(e) = self.trim(&stream, seq).await {
                tracing::warn!(stream = %stream.name, error = %e, "applying a trim command failed");
            }
        }
    }
}
