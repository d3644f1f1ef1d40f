//! The stream service: every stream operation, whichever face asked for it.
//!
//! It owns the registry of streams by name, serialises writes per stream (a lock held only to
//! validate and sequence, never across I/O), submits them to the storage engine, and publishes
//! the durable tail that readers wait on.

mod append;
mod arrivals;
mod buckets;
mod cache;
mod error;
mod follow;
mod fork;
pub mod heavy;
mod live_frame;
mod read;
mod read_memory;
mod replication;
mod s2;
pub mod sessions;
mod shared_bodies;
mod snapshots;
mod stream;
mod time_seek;

#[cfg(test)]
mod tests;
#[cfg(test)]
pub(crate) use tests::one_text_stream;
mod tokens;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::model::json::{self, EmptyArray};
use crate::model::record::lay_out_arrived;
use crate::model::stream::{
    BucketMeta, ForkOrigin, MetaExtra, RequestedConfig, RequestedFork, SnapshotInfo, StreamMeta,
};
use crate::model::{Offset, Record, content_type, names};
use crate::storage::{Change, RecoveredStream, SharedEngine, Staged, StorageError, StreamId};

pub use crate::model::ledger::append::{AppendAck, AppendRequest};

pub use arrivals::Arrival;
pub use buckets::{BucketInfo, Listing, StreamSummary};
pub use cache::CacheLimits;
pub use error::{StreamError, StreamResult};
pub use follow::{
    Chunks, Deletion, End, Ends, Event, Follow, FollowOptions, S2Reads, Source, Step, Until,
};
pub use fork::ForkRequest;
pub use live_frame::{FrameView, LiveFrame};
pub use read::{ReadChunk, TailWatch, Wake};
pub use read_memory::ReadLease;
pub use replication::{Appeared, AppearingIn, MirrorStart, ReplicatedState};
pub use s2::{
    CheckedAppend, S2Ack, S2Append, S2Batch, S2Limits, S2Position, S2Record, S2Start,
    parse_config as parse_s2_config,
};
pub use shared_bodies::{BodyRange, SharedBody, SharedRead};
pub use snapshots::{Bootstrap, Position, digest as snapshot_digest};
pub use stream::{Durable, Stream};
pub use tokens::{IssueToken, Principal, Revocation, TokenError};

use stream::State;

/// Tunables of the service.
#[derive(Clone, Debug)]
pub struct ServiceConfig {
    /// The most body bytes one live read (long-poll, SSE event, replication batch) carries; at
    /// least one record is always returned.
    pub max_read_bytes: usize,
    /// The most body bytes one catch-up read response carries. Larger than a live read's: the
    /// reader asked for history, and fewer round trips carry it faster.
    pub catch_up_read_bytes: usize,
    /// The most body bytes all read responses hold at once; beyond it, reads get smaller
    /// chunks (see [`read_memory`]).
    pub read_memory_bytes: usize,
    /// The most bytes of catch-up bodies kept for readers of the same range (see
    /// [`shared_bodies`]); they count against `read_memory_bytes` too.
    pub shared_body_bytes: usize,
    pub cache: CacheLimits,
    /// Appends submitted to storage but not yet durable, across all streams.
    pub max_inflight_commits: usize,
    /// Streams one bucket may hold (`None`: no limit).
    pub max_streams_per_bucket: Option<usize>,
    /// Buckets this server mirrors whole, with their upstream (`scheme://host:port`): the
    /// mirror alone creates streams in them.
    pub mirrored_buckets: HashMap<String, String>,
    /// Streams this server mirrors alone (by key), with their upstream: the mirror alone
    /// creates them.
    pub mirrored_streams: HashMap<String, String>,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        ServiceConfig {
            max_read_bytes: 1 << 20,
            catch_up_read_bytes: 4 << 20,
            read_memory_bytes: 512 << 20,
            shared_body_bytes: 64 << 20,
            cache: CacheLimits::default(),
            max_inflight_commits: 8192,
            max_streams_per_bucket: None,
            mirrored_buckets: HashMap::new(),
            mirrored_streams: HashMap::new(),
        }
    }
}

pub struct StreamService {
    engine: SharedEngine,
    registry: Mutex<Registry>,
    next_id: AtomicU64,
    /// Bounds the commits queued in the engine; a permit is held until its commit is durable.
    commit_permits: Arc<Semaphore>,
    cache_budget: Arc<cache::CacheBudget>,
    read_memory: Arc<read_memory::ReadMemory>,
    shared_bodies: shared_bodies::SharedBodies,
    /// Every stream that comes into being (created, or swapped in by a mirror's rebuild), for
    /// bucket replication sessions: they start following it without rescanning their bucket.
    appeared: tokio::sync::broadcast::Sender<Appeared>,
    /// Cancelled when the server starts shutting down: live waits end at once.
    shutdown: CancellationToken,
    /// Set just before `shutdown` is cancelled: what a live reader checks on every event, where
    /// the token's own check would take its lock.
    stopping: Arc<AtomicBool>,
    tokens: Mutex<tokens::TokenRegistry>,
    /// S2 delete-on-empty: each configured stream found empty, with the tail it had then and
    /// since when (ms). Kept in memory only, so the wait starts afresh after a restart.
    empty_streams: Mutex<HashMap<StreamId, (u64, u64)>>,
    config: ServiceConfig,
    /// The service itself, for work that must outlive the request that starts it (see
    /// [`to_the_end`]).
    me: std::sync::Weak<StreamService>,
}

/// Starts `work` on a task of its own at once (not when the result is first awaited), and
/// returns its result. What follows a commit (publishing the change, readying or releasing a
/// stream) must happen even when the request that submitted it goes away while the commit is in
/// flight: a stream left unready, or a change submitted but never published, would hold every
/// later request on it until a restart.
fn to_the_end<T: Send + 'static, E: From<StorageError> + Send + 'static>(
    work: impl Future<Output = Result<T, E>> + Send + 'static,
) -> impl Future<Output = Result<T, E>> {
    let task = tokio::spawn(work);
    async move {
        task.await
            .unwrap_or_else(|_| Err(StorageError::Failed.into()))
    }
}

/// Every stream by key, and every bucket. One lock, so that a stream is never created in a
/// bucket that is being deleted.
struct Registry {
    /// Keyed by the stream's own name (one allocation for both).
    streams: BTreeMap<Arc<str>, Arc<Stream>>,
    /// The streams that may expire (a TTL or an expiry time), which the expiry sweep walks
    /// several times a second: a server of a million streams, few of them with a TTL, must not
    /// walk them all that often.
    expiring: BTreeMap<Arc<str>, Arc<Stream>>,
    buckets: BTreeMap<String, BucketMeta>,
}

/// How many streams a walk over the registry looks at per hold of its lock, which every request
/// takes: about a tenth of a millisecond's work.
const WALKED_AT_ONCE: usize = 1024;

/// A walk over registered streams, in key order, in batches (see `StreamService::streams_where`).
struct Walk<'a, T> {
    /// Only streams whose keys start with this.
    prefix: &'a str,
    /// The last key walked.
    after: Option<Arc<str>>,
    picked: Vec<T>,
}

impl<'a, T> Walk<'a, T> {
    fn new(prefix: &'a str) -> Self {
        Walk {
            prefix,
            after: None,
            picked: Vec::new(),
        }
    }
}

impl Registry {
    fn new(
        streams: BTreeMap<Arc<str>, Arc<Stream>>,
        buckets: BTreeMap<String, BucketMeta>,
    ) -> Registry {
        let expiring = streams
            .iter()
            .filter(|(_, stream)| stream.may_expire)
            .map(|(name, stream)| (name.clone(), stream.clone()))
            .collect();
        Registry {
            streams,
            expiring,
            buckets,
        }
    }

    /// Registers `stream` under its name, in place of any stream registered under it.
    fn insert(&mut self, stream: Arc<Stream>) {
        if stream.may_expire {
            self.expiring.insert(stream.name.clone(), stream.clone());
        } else {
            self.expiring.remove(&stream.name);
        }
        self.streams.insert(stream.name.clone(), stream);
    }

    fn remove(&mut self, name: &str) {
        self.expiring.remove(name);
        self.streams.remove(name);
    }

    /// The streams whose keys sort at or after `start`, in key order.
    fn streams_from<'a>(
        &'a self,
        start: &'a str,
    ) -> impl Iterator<Item = (&'a Arc<str>, &'a Arc<Stream>)> + 'a {
        use std::ops::Bound;
        self.streams
            .range::<str, _>((Bound::Included(start), Bound::Unbounded))
    }
}

/// A create request, with header syntax already checked by the face.
#[derive(Clone, Debug, Default)]
pub struct CreateRequest {
    pub name: String,
    pub content_type: Option<String>,
    pub ttl_secs: Option<u64>,
    pub expires_at_ms: Option<i64>,
    pub closed: bool,
    pub body: Bytes,
    pub fork: Option<ForkRequest>,
    pub attrs: crate::model::attrs::Attrs,
    /// Seal record bodies with this cipher (S2 streams in an encrypting basin).
    pub cipher: Option<String>,
    /// Create the stream as a read-only mirror: of which upstream, from where.
    pub mirror: Option<MirrorStart>,
    /// The S2 create request making the stream ([`crate::model::s2::creation_key`]).
    pub s2_creation: Option<String>,
    /// The stream's S2 configuration, stored with it in the same commit.
    pub s2_config: Option<crate::model::s2::StreamConfig>,
}

/// Whether a create made something new, or was a retry of the S2 create request that made it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Creation {
    New,
    Repeated,
}

/// What an S2 ensure (`PUT`) did: made the resource, or found it and applied the configuration
/// over it (its stored configuration before and after).
#[derive(Clone, Debug, PartialEq)]
pub enum Ensured {
    Created,
    Existing {
        before: Option<serde_json::Value>,
        after: Option<serde_json::Value>,
    },
}

/// A stream's metadata as faces report it.
#[derive(Clone, Debug)]
pub struct StreamInfo {
    pub content_type: String,
    /// JSON mode, and with it record coordinates (seed 000 §6).
    pub json: bool,
    pub tail: Offset,
    /// The first retained position.
    pub first: Offset,
    pub closed: bool,
    pub ttl_secs: Option<u64>,
    pub expires_at_ms: Option<i64>,
    pub snapshot: Option<crate::model::stream::SnapshotInfo>,
}

/// The result of a create request.
#[derive(Clone, Debug)]
pub struct CreateOutcome {
    pub info: StreamInfo,
    /// False when an identical stream already existed.
    pub created: bool,
    /// Records `[start, next)` the request's body created (empty at the tail when none).
    pub records: (u64, u64),
}

pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

impl StreamService {
    /// Rebuilds every stream from what the engine holds.
    pub fn open(engine: SharedEngine, config: ServiceConfig) -> Result<Arc<Self>, StorageError> {
        let mut rebuild = Rebuild::new(now_ms());
        let recovered = engine.recover_each(&mut |stream| rebuild.take(stream))?;
        let Rebuilt {
            streams,
            orphans,
            held_back_trims,
        } = rebuild.finish();
        let service = Arc::new_cyclic(|me| StreamService {
            me: me.clone(),
            engine,
            registry: Mutex::new(Registry::new(
                streams,
                recovered.buckets.into_iter().collect(),
            )),
            next_id: AtomicU64::new(recovered.next_id),
            commit_permits: Arc::new(Semaphore::new(config.max_inflight_commits)),
            cache_budget: cache::CacheBudget::new(config.cache),
            read_memory: read_memory::ReadMemory::new(config.read_memory_bytes),
            shared_bodies: shared_bodies::SharedBodies::new(config.shared_body_bytes),
            appeared: tokio::sync::broadcast::Sender::new(replication::APPEARED_BACKLOG),
            shutdown: CancellationToken::new(),
            stopping: Arc::new(AtomicBool::new(false)),
            tokens: Mutex::new(tokens::TokenRegistry::new(recovered.tokens)),
            empty_streams: Mutex::new(HashMap::new()),
            config,
        });
        let settle: Vec<Change> = orphans
            .into_iter()
            .map(Change::RemoveStream)
            .chain(held_back_trims)
            .collect();
        if !settle.is_empty() {
            // Enqueued now (the engine's contract); it completes in the background.
            drop(service.engine.commit(settle));
        }
        Ok(service)
    }

    /// Record bytes that read responses hold now (see [`read_memory`]).
    pub fn read_memory_held(&self) -> usize {
        self.read_memory.held()
    }

    fn lock_registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Finds a stream clients may use. `renew` slides its TTL window at once; reads and appends
    /// find without it and renew ([`Stream::renew`]) once the request is accepted.
    pub async fn find(&self, name: &str, renew: bool) -> StreamResult<Arc<Stream>> {
        loop {
            let stream = self
                .lock_registry()
                .streams
                .get(name)
                .cloned()
                .ok_or(StreamError::NotFound)?;
            if !stream.wait_ready().await {
                continue; // its creation failed; look again
            }
            let now = now_ms();
            let expired = {
                let mut state = stream.lock();
                if state.removed {
                    continue;
                }
                if state.meta.soft_deleted {
                    return Err(StreamError::Gone);
                }
                let expired = stream.expired(&state, now);
                if renew && !expired {
                    state
                        .ledger(&stream)
                        .apply(crate::model::ledger::Renew, now);
                }
                expired
            };
            if expired {
                return Err(match self.remove(&stream).await? {
                    Removal::Hard => StreamError::NotFound,
                    Removal::Soft => StreamError::Gone,
                });
            }
            return Ok(stream);
        }
    }

    pub async fn head(&self, name: &str) -> StreamResult<(Arc<Stream>, StreamInfo)> {
        let stream = self.find(name, false).await?;
        let info = self
            .settled(&stream, |state| Self::info_of(&stream, state))
            .await?;
        Ok((stream, info))
    }

    fn info(&self, stream: &Stream) -> StreamInfo {
        Self::info_of(stream, &stream.lock())
    }

    fn info_of(stream: &Stream, state: &stream::State) -> StreamInfo {
        let durable = stream.durable();
        StreamInfo {
            content_type: stream.content_type.to_string(),
            json: stream.json,
            tail: durable.tail,
            first: durable.first,
            closed: durable.closed,
            ttl_secs: state.meta.ttl_secs,
            expires_at_ms: state.meta.expires_at_ms,
            snapshot: state.meta.extra().snapshot.clone(),
        }
    }

    /// Creates a stream, or confirms an identical one exists.
    pub async fn create(&self, mut request: CreateRequest) -> StreamResult<CreateOutcome> {
        if request.mirror.is_none() {
            self.creatable(&request.name)?;
            if request.s2_config.is_none() {
                request.s2_config = self.default_s2_config_for(&request.name)?;
            }
        }
        let plan = match &request.fork {
            Some(fork) => match self.plan_fork(fork).await {
                Ok(plan) => Some(plan),
                // A fork made as asked is answered as its creation was, whatever happened to its
                // source since: deleted (forks outlive it), or trimmed, or given a later
                // snapshot, past where a new fork could start.
                Err(e) => {
                    let Some(existing) = self.existing_fork(&request.name, fork).await else {
                        return Err(e);
                    };
                    let info = self.confirm_existing_fork(&existing, &request).await?;
                    return Ok(CreateOutcome {
                        records: (info.tail.seq, info.tail.seq),
                        info,
                        created: false,
                    });
                }
            },
            None => None,
        };
        let requested = requested_config(&request, plan.as_ref())?;
        let bodies = if content_type::is_json(&requested.content_type) {
            if request.body.is_empty() {
                Vec::new()
            } else {
                let body = request.body.clone();
                heavy::by_size(body.len(), move || {
                    json::messages(&body, EmptyArray::Allowed)
                })
                .await
                .map_err(|e| StreamError::BadRequest(e.to_string()))?
            }
        } else if request.body.is_empty() {
            Vec::new()
        } else {
            vec![request.body.clone()]
        };
        let staged = self
            .stage_new(&bodies, request.mirror.as_ref(), plan.as_ref())
            .await?;

        loop {
            let existing = self
                .lock_registry()
                .streams
                .get(request.name.as_str())
                .cloned();
            if let Some(existing) = existing {
                match self.confirm_existing(&existing, &requested).await {
                    Err(StreamError::NotFound) => continue, // removed meanwhile: create anew
                    other => {
                        return other.map(|info| CreateOutcome {
                            records: (info.tail.seq, info.tail.seq),
                            info,
                            created: false,
                        });
                    }
                }
            }
            let created = self.insert_new(
                &request.name,
                &requested,
                plan.as_ref(),
                &bodies,
                request.mirror.as_ref(),
                &staged,
            )?;
            let Some((stream, commit)) = created else {
                continue;
            };
            let service = self.me();
            let body_start = plan.as_ref().map_or(0, |p| p.tail().seq);
            return to_the_end(async move {
                match commit.await {
                    Ok(()) => {
                        stream.publish(|d| d.ready = true);
                        // No session listening is not an error.
                        let _ = service.appeared.send(Appeared::of(&stream));
                        let info = service.info(&stream);
                        Ok(CreateOutcome {
                            records: (body_start, info.tail.seq),
                            info,
                            created: true,
                        })
                    }
                    Err(e) => {
                        service.forget(&stream);
                        stream.lock().removed = true;
                        stream.publish(|d| d.removed = true);
                        service.release_source(&stream).await;
                        Err(e.into())
                    }
                }
            })
            .await;
        }
    }

    /// The stream `name`, when it is a fork made as `fork` asks (same source, offset when one
    /// is given, and sub-offset).
    async fn existing_fork(&self, name: &str, fork: &ForkRequest) -> Option<Arc<Stream>> {
        let existing = self.lock_registry().streams.get(name).cloned()?;
        if !existing.wait_ready().await {
            return None;
        }
        let same = {
            let state = existing.lock();
            let origin = state.meta.extra().fork.as_ref();
            !state.removed
                && !state.meta.soft_deleted
                && origin.is_some_and(|o| {
                    o.source_name == fork.source
                        && fork.offset.is_none_or(|at| at == o.offset)
                        && o.sub_offset == fork.sub_offset
                })
        };
        same.then_some(existing)
    }

    /// Confirms `existing`, a fork made as `request` asks, when its source can no longer be
    /// planned from: what the request gives must match it, as for any repeated creation; what a
    /// fork inherits from its source and the request leaves out is the fork's own.
    async fn confirm_existing_fork(
        &self,
        existing: &Arc<Stream>,
        request: &CreateRequest,
    ) -> StreamResult<StreamInfo> {
        let mut requested = requested_config(request, None)?;
        if request.content_type.is_none() {
            requested.content_type = existing.content_type.to_string();
        }
        if request.ttl_secs.is_none() && request.expires_at_ms.is_none() {
            let state = existing.lock();
            requested.ttl_secs = state.meta.ttl_secs;
            requested.expires_at_ms = state.meta.expires_at_ms;
        }
        self.confirm_existing(existing, &requested).await
    }

    async fn confirm_existing(
        &self,
        existing: &Arc<Stream>,
        requested: &RequestedConfig,
    ) -> StreamResult<StreamInfo> {
        if !existing.wait_ready().await {
            return Err(StreamError::NotFound);
        }
        let (soft_deleted, expired, mismatch) = {
            let state = existing.lock();
            if state.removed {
                return Err(StreamError::NotFound);
            }
            (
                state.meta.soft_deleted,
                existing.expired(&state, now_ms()),
                state.meta.mismatch(requested),
            )
        };
        if soft_deleted {
            return Err(StreamError::Conflict(
                "stream was deleted and is still referenced by forks",
            ));
        }
        if expired {
            return match self.remove(existing).await? {
                Removal::Hard => Err(StreamError::NotFound),
                Removal::Soft => Err(StreamError::Conflict(
                    "stream expired and is still referenced by forks",
                )),
            };
        }
        match mismatch {
            Some(reason) => Err(StreamError::Conflict(reason)),
            None => Ok(self.info(existing)),
        }
    }

    /// Stages the large bodies of a new stream (see [`StreamService::stage`]).
    async fn stage_new(
        &self,
        bodies: &[Bytes],
        mirror: Option<&MirrorStart>,
        plan: Option<&fork::ForkPlan>,
    ) -> StreamResult<StagedBodies> {
        Ok(StagedBodies {
            records: self.stage(bodies.iter()).await?,
            snapshot: match initial_snapshot(mirror, plan) {
                Some((_, blob)) => self.stage(std::iter::once(blob)).await?,
                None => None,
            },
        })
    }

    /// Registers a new stream and submits its creation. `None` when the name was taken meanwhile.
    #[allow(clippy::type_complexity)]
    fn insert_new(
        &self,
        name: &str,
        requested: &RequestedConfig,
        plan: Option<&fork::ForkPlan>,
        bodies: &[Bytes],
        mirror: Option<&MirrorStart>,
        staged: &StagedBodies,
    ) -> StreamResult<
        Option<(
            Arc<Stream>,
            futures::future::BoxFuture<'static, Result<(), StorageError>>,
        )>,
    > {
        self.engine.room()?;
        let mut registry = self.lock_registry();
        if registry.streams.contains_key(name) {
            return Ok(None);
        }
        if let Some(bucket) = names::bucket_of(name) {
            match registry.buckets.get(bucket) {
                None => return Err(StreamError::BucketNotFound),
                Some(meta) if meta.deleting => return Err(StreamError::BucketDeleting),
                Some(meta) => s2::check_sealing(meta, requested)?,
            }
            if let Some(limit) = self.config.max_streams_per_bucket {
                let prefix = names::bucket_prefix(bucket);
                let held = registry
                    .streams_from(&prefix)
                    .take_while(|(key, _)| key.starts_with(&prefix))
                    .take(limit)
                    .count();
                if held >= limit {
                    return Err(StreamError::LimitReached(format!(
                        "bucket {bucket} holds its limit of {limit} streams"
                    )));
                }
            }
        }
        let (stream, changes) = self.build_stream(name, requested, plan, bodies, mirror, staged)?;
        let commit = self.engine.commit(changes);
        registry.insert(stream.clone());
        Ok(Some((stream, commit)))
    }

    /// A new stream as `requested`, not yet registered, and the changes that store it: a fork
    /// starts after its inherited history, a mirror where its upstream's retained records start
    /// (with the upstream's snapshot), any other stream at the start; `bodies` are its first
    /// records.
    fn build_stream(
        &self,
        name: &str,
        requested: &RequestedConfig,
        plan: Option<&fork::ForkPlan>,
        bodies: &[Bytes],
        mirror: Option<&MirrorStart>,
        staged: &StagedBodies,
    ) -> StreamResult<(Arc<Stream>, Vec<Change>)> {
        let now = now_ms();
        let retained_from = mirror.map_or(Offset::START, |m| m.at);
        let (start, mut records) = match plan {
            Some(plan) => (plan.tail(), plan.prefix.clone()),
            None => (retained_from, Vec::new()),
        };
        // Timestamps never go back along a stream, a fork's included: its source's may be ahead
        // of this clock (S2 client timestamps).
        let inherited_ms = records
            .last()
            .map(|r| r.timestamp_ms)
            .or(plan.map(|p| p.source.durable().last_timestamp_ms))
            .unwrap_or(0);
        records.extend(lay_out_arrived(
            start,
            now.max(inherited_ms),
            now,
            bodies.to_vec(),
        ));
        let tail = records.last().map_or(start, Record::next_offset);
        // An empty stream's latest timestamp is 0 (S2's tail of a new stream); a fork starts from
        // its inherited history.
        let last_timestamp_ms = records.last().map_or(inherited_ms, |r| r.timestamp_ms);
        let mut meta = StreamMeta {
            ttl_secs: requested.ttl_secs,
            expires_at_ms: requested.expires_at_ms,
            closed: requested.closed,
            tail,
            last_timestamp_ms,
            // A mirror is its upstream's stream: it keeps the upstream's creation time, which
            // tells it apart from a later stream of the same name.
            created_ms: mirror.map_or(now, |m| m.created_ms),
            retained_from,
            ..StreamMeta::new(name, &requested.content_type)
        };
        let initial_snapshot = initial_snapshot(mirror, plan);
        meta.set_extra(MetaExtra {
            fork: plan.map(|p| ForkOrigin {
                source_id: p.source.id,
                source_name: p.source.name.to_string(),
                offset: p.anchor,
                sub_offset: p.sub_offset,
            }),
            attrs: requested.attrs.clone(),
            cipher: requested.cipher.clone(),
            mirror_of: requested.mirror_of.clone(),
            s2_creation: requested.s2_creation.clone(),
            s2_config: requested.s2_config.clone(),
            snapshot: initial_snapshot.map(|(info, _)| info.clone()),
            ..MetaExtra::default()
        });
        if let Some(plan) = plan {
            let mut source = plan.source.lock();
            if source.removed || source.meta.soft_deleted {
                return Err(StreamError::ForkSourceGone);
            }
            // Checked again under the lock: retention may have moved since the plan was made.
            let first = source.meta.retained_from;
            if plan.anchor < first {
                return Err(StreamError::Retained { first });
            }
            let inherited = plan.snapshot.as_ref().map(|(info, _)| info);
            if first > Offset::START && source.meta.extra().snapshot.as_ref() != inherited {
                return Err(StreamError::Conflict(
                    "the source's snapshot changed while the fork was made; try again",
                ));
            }
            // The fork's history starts where its source's does.
            meta.retained_from = first;
            source.forks += 1;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let durable = Durable {
            tail,
            first: meta.retained_from,
            last_timestamp_ms,
            meta_version: 0,
            closed: requested.closed,
            ready: false,
            removed: false,
            soft_deleted: false,
            write_failed: false,
            meta_write_failed: false,
        };
        let stream = Arc::new(Stream::new(
            id,
            meta.clone(),
            BTreeMap::new(),
            plan.map(|p| p.source.clone()),
            durable,
            now,
        ));
        stream.lock().recent.push(&self.cache_budget, &records);
        let mut changes = vec![Change::PutStream(id, Box::new(meta))];
        if !records.is_empty() {
            changes.push(Change::PutRecords(id, records, staged.records.clone()));
        }
        if let Some((_, blob)) = initial_snapshot {
            changes.push(Change::PutSnapshot(
                id,
                blob.clone(),
                staged.snapshot.clone(),
            ));
        }
        Ok((stream, changes))
    }

    /// The service as its own owner holds it.
    fn me(&self) -> Arc<StreamService> {
        self.me
            .upgrade()
            .expect("a service is only reached through the Arc that owns it")
    }

    /// Drops the registry entry of `stream`, if the name still maps to it.
    fn forget(&self, stream: &Arc<Stream>) {
        let mut registry = self.lock_registry();
        if registry
            .streams
            .get(&stream.name)
            .is_some_and(|s| Arc::ptr_eq(s, stream))
        {
            registry.remove(&stream.name);
        }
    }

    pub async fn delete(&self, name: &str) -> StreamResult<()> {
        let stream = self.find(name, false).await?;
        Self::writable(&stream)?;
        self.remove(&stream).await.map(|_| ())
    }

    /// Deletes a stream: softly while forks still read through it, otherwise for good (and then
    /// its source may follow, if it was only kept for this fork).
    fn remove<'a>(
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
    fn remove_if<'a>(
        &'a self,
        stream: &'a Arc<Stream>,
        still: impl FnOnce(&State) -> bool + Send + 'a,
    ) -> futures::future::BoxFuture<'a, StreamResult<Option<Removal>>> {
        Box::pin(async move {
            let (removal, commit) = {
                let mut state: std::sync::MutexGuard<'_, State> = stream.lock();
                if state.removed {
                    return Ok(Some(Removal::Hard));
                }
                if !still(&state) {
                    return Ok(None);
                }
                if state.forks > 0 {
                    if state.meta.soft_deleted {
                        return Ok(Some(Removal::Soft));
                    }
                    state.meta.soft_deleted = true;
                    let commit = self.engine.commit(vec![Change::PutStream(
                        stream.id,
                        Box::new(state.meta.clone()),
                    )]);
                    (Removal::Soft, commit)
                } else {
                    state.removed = true;
                    (
                        Removal::Hard,
                        self.engine.commit(vec![Change::RemoveStream(stream.id)]),
                    )
                }
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
    async fn release_source(&self, fork: &Stream) {
        let Some(source) = &fork.source else { return };
        let (cascade, trim) = {
            let mut state = source.lock();
            state.forks = state.forks.saturating_sub(1);
            let cascade = state.forks == 0 && state.meta.soft_deleted && !state.removed;
            let trim = (!state.removed && !cascade)
                .then(|| state.trim_records(source.id))
                .flatten();
            (cascade, trim)
        };
        if cascade && let Err(e) = self.remove(source).await {
            tracing::warn!(stream = %source.name, error = %e, "removing a released fork source failed");
        }
        if let Some(trim) = trim
            && let Err(e) = self.engine.commit(vec![trim]).await
        {
            tracing::warn!(stream = %source.name, error = %e, "trimming a released fork source failed");
        }
    }

    /// How many streams and buckets the server holds, and the hot cache's memory.
    pub fn counts(&self) -> (usize, usize, usize) {
        let registry = self.lock_registry();
        (
            registry.streams.len(),
            registry.buckets.len(),
            self.cache_budget.used(),
        )
    }

    /// Bytes of stream data retained (appended and not trimmed), across all streams.
    pub fn retained_bytes(&self) -> u64 {
        let mut retained = 0;
        self.streams_where(
            |registry| &registry.streams,
            "",
            |s| -> Option<()> {
                let d = s.durable();
                retained += d.tail.pos.saturating_sub(d.first.pos);
                None
            },
        );
        retained
    }

    /// What `pick` makes of each stream of the registry's map `of` whose key starts with
    /// `prefix`, that it picks, in key order. The walk takes the registry lock for
    /// [`WALKED_AT_ONCE`] streams at a time, so a server of a million streams does not hold
    /// every request up for the whole walk; a stream registered or removed meanwhile may be
    /// seen or not.
    fn streams_where<T>(
        &self,
        of: impl Fn(&Registry) -> &BTreeMap<Arc<str>, Arc<Stream>>,
        prefix: &str,
        mut pick: impl FnMut(&Arc<Stream>) -> Option<T>,
    ) -> Vec<T> {
        let mut walk = Walk::new(prefix);
        while self.walk_on(&mut walk, &of, &mut pick) {}
        walk.picked
    }

    /// [`Self::streams_where`] for the background tasks, which let the other tasks of their
    /// thread run between batches: a walk of a million streams takes about 100 ms.
    async fn streams_where_in_turn<T>(
        &self,
        of: impl Fn(&Registry) -> &BTreeMap<Arc<str>, Arc<Stream>>,
        mut pick: impl FnMut(&Arc<Stream>) -> Option<T>,
    ) -> Vec<T> {
        let mut walk = Walk::new("");
        while self.walk_on(&mut walk, &of, &mut pick) {
            tokio::task::yield_now().await;
        }
        walk.picked
    }

    /// Takes `walk` one batch on; false once it has walked all its streams.
    fn walk_on<T>(
        &self,
        walk: &mut Walk<'_, T>,
        of: impl Fn(&Registry) -> &BTreeMap<Arc<str>, Arc<Stream>>,
        mut pick: impl FnMut(&Arc<Stream>) -> Option<T>,
    ) -> bool {
        use std::ops::Bound;
        let registry = self.lock_registry();
        let last = walk.after.take();
        let from = last
            .as_deref()
            .map_or(Bound::Included(walk.prefix), Bound::Excluded);
        let keys = of(&registry).range::<str, _>((from, Bound::Unbounded));
        let keys = keys.take_while(|(name, _)| name.starts_with(walk.prefix));
        let mut last: Option<&Arc<str>> = None;
        for (walked, (name, stream)) in keys.enumerate() {
            if walked == WALKED_AT_ONCE {
                walk.after = last.cloned();
                return true;
            }
            last = Some(name);
            walk.picked.extend(pick(stream));
        }
        false
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

/// Rebuilds the streams as the engine recovers them, one at a time.
///
/// A fork needs its source's handle. Ids only grow and a source exists before its forks, so a
/// source's id is below its forks' ids; forks (few) wait until every plain stream is built, and
/// are then built in id order, each after its source.
struct Rebuild {
    now: i64,
    /// The built streams and their ids: plain streams first, then forks, each part in id order.
    ids: Vec<StreamId>,
    built: Vec<Arc<Stream>>,
    forks: Vec<RecoveredStream>,
    /// Built streams that were deleted while forks read through them.
    soft_deleted: Vec<Arc<Stream>>,
    /// Built streams whose retention passed the records the engine still holds.
    untrimmed: Vec<Arc<Stream>>,
}

/// What [`Rebuild`] leaves to the service.
struct Rebuilt {
    /// Every stream to register, by name.
    streams: BTreeMap<Arc<str>, Arc<Stream>>,
    /// The soft-deleted streams no fork reads any more (left by an interrupted cascade), which
    /// are to be removed.
    orphans: Vec<StreamId>,
    /// The deletions of records retention passed while forks held them, for streams no fork
    /// holds any more (the last one went before the deletion was committed).
    held_back_trims: Vec<Change>,
}

impl Rebuild {
    fn new(now: i64) -> Self {
        Rebuild {
            now,
            ids: Vec::new(),
            built: Vec::new(),
            forks: Vec::new(),
            soft_deleted: Vec::new(),
            untrimmed: Vec::new(),
        }
    }

    fn take(&mut self, recovered: RecoveredStream) {
        if recovered.meta.extra().fork.is_some() {
            self.forks.push(recovered);
        } else {
            self.build(recovered, None);
        }
    }

    fn finish(mut self) -> Rebuilt {
        if !self.ids.is_sorted() {
            let mut plain: Vec<Arc<Stream>> = std::mem::take(&mut self.built);
            plain.sort_unstable_by_key(|s| s.id);
            self.ids = plain.iter().map(|s| s.id).collect();
            self.built = plain;
        }
        let plain = self.ids.len();
        let mut forks = std::mem::take(&mut self.forks);
        forks.sort_unstable_by_key(|s| s.id);
        for fork in forks {
            let source_id = fork.meta.extra().fork.as_ref().map(|o| o.source_id);
            // A fork whose source is missing is left out.
            if let Some(source) = source_id.and_then(|id| self.find(id, plain)) {
                source.lock().forks += 1;
                self.build(fork, Some(source));
            }
        }
        let orphans = self.orphans();
        let gone: HashSet<StreamId> = orphans.iter().copied().collect();
        // Collected whole, the map is built from sorted keys in one pass, with full nodes: much
        // faster than a million inserts one by one, and smaller.
        let streams = self
            .built
            .into_iter()
            .filter(|s| gone.is_empty() || !gone.contains(&s.id))
            .map(|stream| (stream.name.clone(), stream))
            .collect();
        let held_back_trims = self
            .untrimmed
            .iter()
            .filter(|s| !gone.contains(&s.id))
            .filter_map(|s| s.lock().trim_records(s.id))
            .collect();
        Rebuilt {
            streams,
            orphans,
            held_back_trims,
        }
    }

    fn build(&mut self, mut recovered: RecoveredStream, source: Option<Arc<Stream>>) {
        if let Some(end) = recovered.stored_end {
            let meta = &mut recovered.meta;
            meta.tail = meta.tail.max(end.next);
            meta.last_timestamp_ms = meta.last_timestamp_ms.max(end.timestamp_ms);
        }
        let durable = Durable {
            tail: recovered.meta.tail,
            first: recovered.meta.retained_from,
            last_timestamp_ms: recovered.meta.last_timestamp_ms,
            meta_version: 0,
            closed: recovered.meta.closed,
            ready: true,
            removed: false,
            soft_deleted: recovered.meta.soft_deleted,
            write_failed: false,
            meta_write_failed: false,
        };
        let soft_deleted = recovered.meta.soft_deleted;
        let untrimmed = recovered.meta.retained_from.seq > recovered.trimmed_before;
        let stream = Arc::new(Stream::new(
            recovered.id,
            recovered.meta,
            recovered.producers.into_iter().collect(),
            source,
            durable,
            self.now,
        ));
        if soft_deleted {
            self.soft_deleted.push(stream.clone());
        }
        if untrimmed {
            self.untrimmed.push(stream.clone());
        }
        self.ids.push(stream.id);
        self.built.push(stream);
    }

    /// The built stream `id`; the first `plain` built streams and the rest are each in id order.
    fn find(&self, id: StreamId, plain: usize) -> Option<Arc<Stream>> {
        let (plain_ids, fork_ids) = self.ids.split_at(plain);
        let at = match plain_ids.binary_search(&id) {
            Ok(at) => at,
            Err(_) => plain + fork_ids.binary_search(&id).ok()?,
        };
        Some(self.built[at].clone())
    }

    /// The soft-deleted streams no fork reads through any more, then any source only they kept
    /// alive.
    fn orphans(&self) -> Vec<StreamId> {
        let mut candidates = self.soft_deleted.clone();
        let mut removed = Vec::new();
        loop {
            let (orphans, kept): (Vec<_>, Vec<_>) =
                candidates.into_iter().partition(|s| s.lock().forks == 0);
            candidates = kept;
            if orphans.is_empty() {
                return removed;
            }
            for orphan in orphans {
                if let Some(source) = &orphan.source {
                    let mut state = source.lock();
                    state.forks = state.forks.saturating_sub(1);
                }
                removed.push(orphan.id);
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Removal {
    Soft,
    Hard,
}

/// What a create request asks for, with the defaults a fork inherits from its source filled in.
fn requested_config(
    request: &CreateRequest,
    plan: Option<&fork::ForkPlan>,
) -> StreamResult<RequestedConfig> {
    let content_type = match (&request.content_type, plan) {
        (Some(given), Some(plan))
            if !content_type::same_media_type(given, &plan.source.content_type) =>
        {
            return Err(StreamError::Conflict(
                "fork content type differs from the source's",
            ));
        }
        (Some(given), _) if content_type::is_well_formed(given) => given.clone(),
        (_, Some(plan)) => plan.source.content_type.to_string(),
        _ => content_type::DEFAULT_CONTENT_TYPE.to_string(),
    };
    // A mirror copies its upstream's value as it is; a client asking for a stream that is gone
    // before it exists is told so.
    if request.mirror.is_none() && request.expires_at_ms.is_some_and(|at| at <= now_ms()) {
        return Err(StreamError::BadRequest(
            "Stream-Expires-At is in the past: the stream would expire as it is created".into(),
        ));
    }
    let (ttl_secs, expires_at_ms) = match (plan, request.ttl_secs, request.expires_at_ms) {
        (Some(plan), None, None) => (plan.ttl_secs, plan.expires_at_ms),
        (_, ttl, expires) => (ttl, expires),
    };
    Ok(RequestedConfig {
        content_type,
        ttl_secs,
        expires_at_ms,
        closed: request.closed,
        attrs: request.attrs.clone(),
        cipher: request.cipher.clone(),
        mirror_of: request.mirror.as_ref().map(|m| m.upstream.clone()),
        s2_creation: request.s2_creation.clone(),
        s2_config: request.s2_config.clone(),
        fork: request.fork.as_ref().map(|f| RequestedFork {
            source_name: f.source.clone(),
            offset: f.offset,
            sub_offset: f.sub_offset,
        }),
    })
}

/// The staged bodies of a new stream: its first records', and its initial snapshot's.
struct StagedBodies {
    records: Option<Staged>,
    snapshot: Option<Staged>,
}

/// The snapshot a new stream starts with: a mirror its upstream's, a fork of a trimmed stream
/// its source's.
fn initial_snapshot<'a>(
    mirror: Option<&'a MirrorStart>,
    plan: Option<&'a fork::ForkPlan>,
) -> Option<&'a (SnapshotInfo, Bytes)> {
    mirror
        .and_then(|m| m.snapshot.as_ref())
        .or(plan.and_then(|p| p.snapshot.as_ref()))
}
