//! The S2 records API's rules over Runnel streams (seed 002): appends with headers, timestamps,
//! fencing and command records; reads by sequence number, timestamp or tail offset with S2's
//! limits; stream and basin configuration.

use std::collections::HashSet;
use std::sync::Arc;

use futures::StreamExt as _;
use serde::Deserialize as _;
use serde_json::{Value, json};

use super::append::Awaited as _;
use super::snapshots::RetentionMove;
use super::{
    CreateRequest, Creation, Ensured, ReadLease, Stream, StreamError, StreamResult, StreamService,
    now_ms,
};
use crate::model::cipher::{self, RecordKey};
use crate::model::ledger::append::DurableBefore;
use crate::model::ledger::s2::{self as s2_ledger, S2Sequence, Sequenced, ms};
use crate::model::record::Record;
use crate::model::s2::{self, BasinConfig, StreamConfig};
use crate::model::stream::{BucketMeta, RequestedConfig};
use crate::model::{Offset, names};
use crate::storage::Change;

/// Streams a basin delete removes at once (see `delete_basin`).
const BASIN_DELETES_AT_ONCE: usize = 64;

pub use crate::model::ledger::s2::{S2Ack, S2Position};
pub use crate::model::s2::{CheckedAppend, S2Append, S2Record};

/// Where an S2 read starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum S2Start {
    SeqNum(u64),
    Timestamp(u64),
    TailOffset(u64),
}

/// Bounds of an S2 read, counted over the whole session.
#[derive(Clone, Copy, Debug, Default)]
pub struct S2Limits {
    pub count: Option<u64>,
    /// Metered bytes.
    pub bytes: Option<u64>,
    /// Exclusive timestamp.
    pub until: Option<u64>,
}

impl S2Limits {
    /// A count or byte limit of 0: the read is over before it starts, wherever it starts.
    pub fn exhausted(&self) -> bool {
        self.count == Some(0) || self.bytes == Some(0)
    }
}

/// Records read in one step, and why the read stopped there.
#[derive(Debug)]
pub struct S2Batch {
    pub records: Vec<Record>,
    /// Where the next read continues.
    pub next_seq: u64,
    /// Metered bytes of `records`.
    pub metered: u64,
    /// A limit (count, bytes or until) was reached: the session is over.
    pub limit_reached: bool,
    /// The batch ends at the durable tail.
    pub at_tail: bool,
    pub tail: S2Position,
    /// The read memory its records count against (see `read_memory`): hold it while they, or
    /// what is rendered from them, are held.
    pub lease: ReadLease,
}

/// A configuration as stored.
fn config_value(config: &StreamConfig) -> Value {
    serde_json::to_value(config).unwrap_or_else(|_| json!({}))
}

/// Parses an S2 configuration object: a malformed one is a bad request, an impossible one
/// invalid.
pub fn parse_config<T: serde::de::DeserializeOwned + s2::CheckedConfig>(
    value: &Value,
) -> StreamResult<T> {
    let config = T::deserialize(value)
        .map_err(|e| StreamError::BadRequest(format!("invalid config: {e}")))?;
    config
        .check()
        .map_err(|e| StreamError::Invalid(format!("invalid config: {e}")))?;
    Ok(config)
}

/// Refuses a new stream in a basin that seals its streams' bodies (`stream_cipher`) unless it
/// is sealed too: only S2 creates, where the client gives the key, and mirrors of such streams
/// are. A Durable Streams create would hold its records in the clear.
pub(super) fn check_sealing(basin: &BucketMeta, requested: &RequestedConfig) -> StreamResult<()> {
    if requested.cipher.is_some() || requested.mirror_of.is_some() {
        return Ok(());
    }
    let sealed = (basin.s2_config.as_ref())
        .and_then(|config| BasinConfig::deserialize(config).ok())
        .is_some_and(|config| config.stream_cipher.is_some());
    if sealed {
        return Err(StreamError::Conflict(
            "the bucket's streams are encrypted (S2 stream_cipher): create them through S2",
        ));
    }
    Ok(())
}

/// The stream configuration a create or an ensure asks for; none asks for nothing in particular.
fn asked_stream_config(config: Option<&Value>) -> StreamResult<StreamConfig> {
    Ok(config.map(parse_config).transpose()?.unwrap_or_default())
}

impl StreamService {
    pub fn tail_position(&self, stream: &Stream) -> S2Position {
        let durable = stream.durable();
        S2Position {
            seq_num: durable.tail.seq,
            timestamp: ms(durable.last_timestamp_ms),
        }
    }

    /// The basin's S2 configuration. Every records request asks for it, so it looks up the one
    /// bucket and nothing else (no count of its streams, no copy of its stored JSON).
    pub fn basin_config(&self, basin: &str) -> StreamResult<BasinConfig> {
        self.with_bucket(basin, |meta| {
            let config = meta.s2_config.as_ref().map(parse_config).transpose()?;
            Ok(config.unwrap_or_default())
        })
    }

    /// The S2 configuration a stream created through another face than S2 gets: its basin's
    /// default stream configuration, when the basin has one.
    pub(super) fn default_s2_config_for(&self, name: &str) -> StreamResult<Option<StreamConfig>> {
        let Some(bucket) = names::bucket_of(name) else {
            return Ok(None);
        };
        let basin = match self.basin_config(bucket) {
            Err(StreamError::BucketNotFound) => return Ok(None), // reported by the create
            other => other?,
        };
        Ok(basin
            .default_stream_config
            .is_some()
            .then(|| StreamConfig::default().resolved_in(&basin)))
    }

    /// Finds an S2 stream, creating it first when the basin says so for this operation.
    pub async fn s2_stream(
        &self,
        basin: &str,
        name: &str,
        auto_create: Option<&Value>,
    ) -> StreamResult<Arc<Stream>> {
        let key = names::stream_key_in(basin, name)
            .map_err(|e| StreamError::BadRequest(e.to_string()))?;
        // Renewed once a read or an append is accepted, as on the other faces.
        match self.find(&key, false).await {
            Err(StreamError::NotFound) => {
                // A missing basin is reported before a missing stream.
                self.basin_config(basin)?;
                let Some(requested) = auto_create else {
                    return Err(StreamError::NotFound);
                };
                // `null`: the basin's default, which a stream created without one gets.
                let stream_config = Some(requested.clone()).filter(|c| !c.is_null());
                match self
                    .create_s2_stream(basin, name, stream_config, None)
                    .await
                {
                    Ok(_) | Err(StreamError::AlreadyExists(_)) => self.find(&key, false).await,
                    Err(e) => Err(e),
                }
            }
            other => other,
        }
    }

    /// Creates an S2 stream: a byte stream in the basin, with its S2 configuration.
    pub async fn create_s2_stream(
        &self,
        basin: &str,
        name: &str,
        config: Option<Value>,
        s2_creation: Option<String>,
    ) -> StreamResult<Creation> {
        let key = names::stream_key_in(basin, name)
            .map_err(|e| StreamError::BadRequest(e.to_string()))?;
        let asked = asked_stream_config(config.as_ref())?;
        let basin_config = self.basin_config(basin)?;
        let outcome = self
            .create(CreateRequest {
                name: key.clone(),
                content_type: Some(crate::model::content_type::DEFAULT_CONTENT_TYPE.to_string()),
                cipher: basin_config.stream_cipher.clone(),
                s2_config: Some(asked.resolved_in(&basin_config)),
                s2_creation: s2_creation.clone(),
                ..Default::default()
            })
            .await
            .map_err(|e| match e {
                // A stream made through Durable Streams with other settings (content type, TTL,
                // closed) still exists under this name, which is all S2 says.
                StreamError::Conflict(_) => StreamError::AlreadyExists("stream"),
                other => other,
            })?;
        if !outcome.created {
            let stream = self.find(&key, false).await?;
            let made_by = stream.lock().meta.extra().s2_creation.clone();
            return match s2_creation {
                Some(request) if made_by.as_ref() == Some(&request) => Ok(Creation::Repeated),
                _ => Err(StreamError::AlreadyExists("stream")),
            };
        }
        Ok(Creation::New)
    }

    /// Creates an S2 stream, or makes the existing one's configuration what a stream created
    /// now would get (S2's ensure: "updated to the specified configuration, if different").
    pub async fn ensure_s2_stream(
        &self,
        basin: &str,
        name: &str,
        config: Option<Value>,
    ) -> StreamResult<Ensured> {
        match self
            .create_s2_stream(basin, name, config.clone(), None)
            .await
        {
            Ok(_) => Ok(Ensured::Created),
            Err(StreamError::AlreadyExists(_)) => {
                let key = names::stream_key_in(basin, name)
                    .map_err(|e| StreamError::BadRequest(e.to_string()))?;
                let stream = self.find(&key, false).await?;
                let before = self.stream_config_of(&stream);
                let asked = asked_stream_config(config.as_ref())?;
                let desired = asked.resolved_in(&self.basin_config(basin)?);
                let after = self.update_stream_config(&key, |_| Ok(desired)).await?;
                Ok(Ensured::Existing {
                    before: Some(before),
                    after: Some(after),
                })
            }
            Err(e) => Err(e),
        }
    }

    /// Creates a basin, or makes the existing one's configuration `config` (S2's ensure). A new
    /// basin's name must follow S2's rule; any existing bucket is a basin.
    pub async fn ensure_basin(&self, basin: &str, config: Option<Value>) -> StreamResult<Ensured> {
        self.bucket_writable(basin)?;
        if let Some(config) = &config {
            self.check_basin_config(config)?;
        }
        if self.bucket_info(basin).is_err() && !s2::is_valid_basin_name(basin) {
            return Err(StreamError::Invalid(s2::BASIN_NAME_RULE.into()));
        }
        match self.create_bucket(basin, config.clone(), None).await {
            Ok(_) => Ok(Ensured::Created),
            Err(StreamError::AlreadyExists(_)) => {
                let before = self.bucket_info(basin)?.s2_config;
                let desired = config.unwrap_or_else(|| Value::Object(Default::default()));
                let after = self
                    .update_basin_config(basin, |stored| *stored = desired)
                    .await?;
                Ok(Ensured::Existing {
                    before,
                    after: Some(after),
                })
            }
            Err(e) => Err(e),
        }
    }

    /// The stream's S2 configuration, as stored.
    pub fn stream_config_of(&self, stream: &Stream) -> Value {
        let config = stream.lock().meta.extra().s2_config.clone();
        config.map_or_else(|| Value::Object(Default::default()), |c| config_value(&c))
    }

    /// Applies an S2 reconfiguration: JSON Merge Patch over the stored configuration, where a
    /// field reset with `null` takes the basin's default again.
    pub async fn reconfigure_stream(
        &self,
        basin: &str,
        name: &str,
        patch: &Value,
    ) -> StreamResult<Value> {
        let key = names::stream_key_in(basin, name)
            .map_err(|e| StreamError::BadRequest(e.to_string()))?;
        let basin_config = self.basin_config(basin)?;
        self.update_stream_config(&key, |stored| {
            let mut patched = stored.clone();
            s2::merge_patch(&mut patched, patch);
            Ok(parse_config::<StreamConfig>(&patched)?.resolved_in(&basin_config))
        })
        .await
    }

    /// Changes the stored S2 configuration of a stream to what `change` makes of it.
    async fn update_stream_config(
        &self,
        key: &str,
        change: impl FnOnce(&Value) -> StreamResult<StreamConfig>,
    ) -> StreamResult<Value> {
        let stream = self.find(key, false).await?;
        Self::writable(&stream)?;
        let (config, commit) = {
            let mut state = stream.lock_present()?;
            let stored = (state.meta.extra().s2_config.as_ref())
                .map_or_else(|| Value::Object(Default::default()), config_value);
            let config = change(&stored)?;
            state.meta.extra_mut().s2_config = Some(config.clone());
            (
                config,
                self.engine.commit(vec![Change::PutStream(
                    stream.id,
                    Box::new(state.meta.clone()),
                )]),
            )
        };
        commit.await?;
        Ok(config_value(&config))
    }

    /// Applies an S2 reconfiguration to a basin.
    pub async fn reconfigure_basin(&self, basin: &str, patch: &Value) -> StreamResult<Value> {
        self.update_basin_config(basin, |config| s2::merge_patch(config, patch))
            .await
    }

    /// Changes the stored S2 configuration of a basin, and checks the result before it is
    /// stored.
    async fn update_basin_config(
        &self,
        basin: &str,
        change: impl FnOnce(&mut Value),
    ) -> StreamResult<Value> {
        self.bucket_writable(basin)?;
        let (config, commit) = {
            let mut registry = self.lock_registry();
            let meta = registry
                .buckets
                .get_mut(basin)
                .ok_or(StreamError::BucketNotFound)?;
            let mut config = meta
                .s2_config
                .clone()
                .unwrap_or_else(|| Value::Object(Default::default()));
            change(&mut config);
            self.check_basin_config(&config)?;
            meta.s2_config = Some(config.clone());
            (
                config,
                self.engine
                    .commit(vec![Change::PutBucket(basin.to_string(), meta.clone())]),
            )
        };
        commit.await?;
        Ok(config)
    }

    /// Deletes a basin with every stream in it (S2 semantics; the bucket API only deletes empty
    /// buckets). The work runs in its own task: a client that goes away does not cut the
    /// stream removals in flight short, which would leave their commits without the in-memory
    /// removals that follow them.
    pub async fn delete_basin(self: &Arc<Self>, basin: &str) -> StreamResult<()> {
        let (service, basin) = (Arc::clone(self), basin.to_string());
        tokio::spawn(async move { service.delete_basin_streams(&basin).await })
            .await
            .map_err(|_| StreamError::from(crate::storage::StorageError::Failed))?
    }

    async fn delete_basin_streams(&self, basin: &str) -> StreamResult<()> {
        self.bucket_writable(basin)?;
        // Marked first, so that a delete cut short by a crash is finished, not half done.
        self.set_deleting(basin, true).await?;
        loop {
            let listing = self.list_streams(basin, "", None, 1000, |_| true)?;
            if listing.streams.is_empty() {
                break;
            }
            // Many at once, so the group commit takes them together rather than one fsync each.
            let deletes = listing.streams.into_iter().map(|summary| async move {
                let key = names::stream_key_in(basin, &summary.stream_id)
                    .map_err(|e| StreamError::BadRequest(e.to_string()))?;
                match self.delete(&key).await {
                    Ok(()) | Err(StreamError::NotFound) | Err(StreamError::Gone) => Ok(()),
                    Err(e) => Err(e),
                }
            });
            let mut deletes =
                futures::stream::iter(deletes).buffer_unordered(BASIN_DELETES_AT_ONCE);
            // Each delete runs to its end (a dropped one could leave its commit without its
            // in-memory removal); the first failure is reported once all are done.
            let mut failed = None;
            while let Some(deleted) = deletes.next().await {
                if let Err(e) = deleted {
                    failed.get_or_insert(e);
                }
            }
            if let Some(e) = failed {
                return Err(e);
            }
        }
        match self.delete_bucket(basin).await {
            // Streams deleted while forks elsewhere still read them stay in the bucket: the
            // delete cannot finish, and the basin goes back to taking streams.
            Err(e @ StreamError::Conflict(_)) => {
                match self.set_deleting(basin, false).await {
                    // Deleted meanwhile by a concurrent delete: nothing left to unmark.
                    Ok(()) | Err(StreamError::BucketNotFound) => Err(e),
                    Err(other) => Err(other),
                }
            }
            other => other,
        }
    }

    /// Stores the basin's `deleting` mark, unless it already has that value.
    async fn set_deleting(&self, basin: &str, deleting: bool) -> StreamResult<()> {
        let commit = {
            let mut registry = self.lock_registry();
            let meta = (registry.buckets.get_mut(basin)).ok_or(StreamError::BucketNotFound)?;
            (meta.deleting != deleting).then(|| {
                meta.deleting = deleting;
                self.engine
                    .commit(vec![Change::PutBucket(basin.to_string(), meta.clone())])
            })
        };
        if let Some(commit) = commit {
            commit.await?;
        }
        Ok(())
    }

    /// Finishes the basin deletes the server stopped in the middle of.
    pub async fn finish_basin_deletes(self: &Arc<Self>) {
        let deleting: Vec<String> = {
            let registry = self.lock_registry();
            (registry.buckets.iter())
                .filter(|(_, meta)| meta.deleting)
                .map(|(name, _)| name.clone())
                .collect()
        };
        for basin in deleting {
            match self.delete_basin(&basin).await {
                Ok(()) => tracing::info!(basin = %basin, "finished deleting the basin"),
                Err(e) => tracing::warn!(basin = %basin, error = %e, "deleting the basin failed"),
            }
        }
    }

    /// Checks a basin configuration, including that its cipher is one Runnel offers.
    pub fn check_basin_config(&self, config: &Value) -> StreamResult<()> {
        let config: BasinConfig = parse_config(config)?;
        if let Some(cipher) = &config.stream_cipher {
            cipher::check_cipher(cipher)?;
        }
        Ok(())
    }

    /// Appends an S2 batch atomically. On an encrypted stream, bodies are sealed with `key`.
    pub async fn s2_append(
        self: &Arc<Self>,
        stream: &Arc<Stream>,
        append: CheckedAppend,
        key: Option<&RecordKey>,
    ) -> StreamResult<S2Ack> {
        self.s2_sequence(stream, append, key).await?.await
    }

    /// Checks and sequences an S2 batch, and returns its acknowledgement, which resolves once
    /// the batch is durable (and any trim it commands is applied). Batches sequenced one after
    /// another are acknowledged in that order, so an append session can sequence its next input
    /// while earlier ones become durable; `match_seq_num` is checked against the sequenced
    /// tail. The completion runs on its own task: the tail is published even if nobody waits.
    pub async fn s2_sequence(
        self: &Arc<Self>,
        stream: &Arc<Stream>,
        append: CheckedAppend,
        key: Option<&RecordKey>,
    ) -> StreamResult<impl Future<Output = StreamResult<S2Ack>> + Send + 'static> {
        Self::writable(stream)?;
        self.engine.room()?;
        let mut prepared = append.records;
        let fingerprint = s2_ledger::prepare(&mut prepared, stream.json, stream.encrypted, key)?;
        let permit = Arc::clone(&self.commit_permits)
            .acquire_owned()
            .await
            .map_err(|_| crate::storage::StorageError::Failed)?;
        let sequenced = {
            let mut state = stream.lock();
            let batch = S2Sequence {
                records: prepared,
                fencing_token: append.fencing_token.as_deref(),
                match_seq_num: append.match_seq_num,
                fingerprint: fingerprint.as_deref(),
            };
            match state.ledger(stream).apply(batch, now_ms()) {
                Ok(Sequenced {
                    ack,
                    records,
                    trim,
                    meta_changed,
                }) => {
                    // An S2 batch is at most 1 MiB: too small to be worth staging.
                    let none = std::iter::empty();
                    let commit = self.submit(stream, &mut state, records, none, meta_changed, None);
                    Ok((ack, trim, commit))
                }
                Err(refusal) => Err((refusal, DurableBefore::seen(&state.meta))),
            }
        };
        let (ack, trim, commit) = match sequenced {
            Ok(sequenced) => sequenced,
            Err((refusal, seen)) => return Err(seen.refuse(stream, refusal.into()).await),
        };
        let (service, stream) = (Arc::clone(self), Arc::clone(stream));
        let completion = tokio::spawn(async move {
            commit.await?;
            drop(permit);
            if let Some(trim) = trim {
                service.trim(&stream, trim).await?;
            }
            Ok(ack)
        });
        Ok(async move {
            completion
                .await
                .map_err(|_| StreamError::from(crate::storage::StorageError::Failed))?
        })
    }

    /// Opens the sealed bodies of records read from an encrypted stream.
    pub fn s2_open(
        &self,
        stream: &Stream,
        key: Option<&RecordKey>,
        records: &mut [Record],
    ) -> StreamResult<()> {
        if !stream.encrypted {
            return Ok(());
        }
        let key = key.ok_or(StreamError::KeyRequired)?;
        for record in records.iter_mut().filter(|r| !r.command) {
            record.body = key.open(&record.body)?;
        }
        Ok(())
    }

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
    pub(super) async fn trim(&self, stream: &Arc<Stream>, seq: u64) -> StreamResult<()> {
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

    /// Where an S2 read starts, as a sequence number; 416 (`BeyondTail`) past the tail unless
    /// `clamp`.
    pub async fn s2_resolve(
        &self,
        stream: &Arc<Stream>,
        start: S2Start,
        clamp: bool,
    ) -> StreamResult<u64> {
        let durable = stream.durable();
        let (first, tail) = (durable.first.seq, durable.tail.seq);
        let beyond = || StreamError::BeyondTail {
            tail,
            timestamp_ms: durable.last_timestamp_ms,
        };
        match start {
            S2Start::SeqNum(seq) if seq > tail => {
                if clamp {
                    Ok(tail)
                } else {
                    Err(beyond())
                }
            }
            S2Start::SeqNum(seq) => Ok(seq.max(first)),
            S2Start::TailOffset(n) => Ok(tail.saturating_sub(n).max(first)),
            S2Start::Timestamp(ts) => {
                let last_ts = ms(durable.last_timestamp_ms);
                if first == tail || ts > last_ts {
                    // No retained record is at or after `ts`: start at the tail, if allowed.
                    return if clamp || ts <= last_ts {
                        Ok(tail)
                    } else {
                        Err(beyond())
                    };
                }
                self.first_at_or_after(stream, ts, first, tail, |r| r.timestamp_ms)
                    .await
            }
        }
    }

    /// The first retained record with a timestamp at or after `ts`. Timestamps never decrease
    /// along a stream, so a binary search over sequence numbers finds it.
    /// The first record in `low..high` whose `time` (timestamp or arrival, both never
    /// decreasing) is at least `ts`.
    async fn first_at_or_after(
        &self,
        stream: &Arc<Stream>,
        ts: u64,
        mut low: u64,
        mut high: u64,
        time: fn(&Record) -> i64,
    ) -> StreamResult<u64> {
        while low < high {
            let mid = low + (high - low) / 2;
            let found = self.collect(stream, mid, mid + 1, 0).await?;
            // Retention passed it while this looked: it was older than anything left.
            let Some(record) = found.first() else {
                low = mid + 1;
                continue;
            };
            if ms(time(record)) >= ts {
                high = mid;
            } else {
                low = mid + 1;
            }
        }
        Ok(low)
    }

    /// Reads the next records from `from`, within `limits` (already reduced by what the session
    /// delivered) and at most `max_records` / `max_bytes` in this step.
    pub async fn s2_read(
        &self,
        stream: &Arc<Stream>,
        from: u64,
        limits: S2Limits,
        max_records: u64,
        max_bytes: u64,
    ) -> StreamResult<S2Batch> {
        stream.renew();
        let durable = stream.durable();
        let tail = S2Position {
            seq_num: durable.tail.seq,
            timestamp: ms(durable.last_timestamp_ms),
        };
        let from = from.max(durable.first.seq);
        let count_cap = limits.count.unwrap_or(u64::MAX).min(max_records);
        let bytes_cap = limits.bytes.unwrap_or(u64::MAX).min(max_bytes);
        let until = durable.tail.seq.min(from.saturating_add(count_cap));
        // Fewer bytes while other reads hold most of the read memory: the reader then gets a
        // smaller batch, and reads on.
        let mut lease = self
            .read_memory
            .lease(usize::try_from(bytes_cap).unwrap_or(usize::MAX));
        let candidates = if from < until {
            self.collect(stream, from, until, lease.bytes()).await?
        } else {
            Vec::new()
        };
        let mut records = Vec::with_capacity(candidates.len());
        let mut metered = 0u64;
        let mut limit_reached =
            limits.count.is_some_and(|c| c == 0) || limits.bytes.is_some_and(|b| b == 0);
        for record in candidates {
            if limits
                .until
                .is_some_and(|until| ms(record.timestamp_ms) >= until)
            {
                limit_reached = true;
                break;
            }
            let size = s2_metered_size(stream, &record);
            if metered + size > bytes_cap {
                let past_limit = limits.bytes.is_some_and(|b| metered + size > b);
                // A record larger than one step (a Durable Streams append may be; S2 caps
                // records at 1 MiB) goes alone rather than never: a reader would wait on it
                // forever. The client's own limit still stops it.
                if !records.is_empty() || past_limit {
                    limit_reached |= past_limit;
                    break;
                }
            }
            metered += size;
            records.push(record);
        }
        lease.keep(records.iter().map(Record::held_len).sum());
        let delivered = records.len() as u64;
        limit_reached |= limits.count.is_some_and(|c| delivered >= c);
        limit_reached |= limits.bytes.is_some_and(|b| metered >= b);
        let next_seq = records.last().map_or(from, |r| r.seq + 1);
        Ok(S2Batch {
            records,
            next_seq,
            metered,
            limit_reached,
            at_tail: next_seq >= durable.tail.seq,
            tail,
            lease,
        })
    }
}

/// A stored record's S2 metered size: of its plaintext, on an encrypted stream as on any other,
/// so that reads meter what appends did (read limits and SSE event ids count these sizes).
fn s2_metered_size(stream: &Stream, record: &Record) -> u64 {
    let sealed = stream.encrypted && !record.command;
    let body_len = if sealed {
        cipher::opened_len(record.body.len())
    } else {
        record.body.len()
    };
    s2::metered_size_of(&record.headers, body_len)
}

#[cfg(test)]
mod tests;
