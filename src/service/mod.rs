//! The stream service: every stream operation, whichever face asked for it.
//!
//! It owns the registry of streams by name, serialises writes per stream (a lock held only to
//! validate and sequence, never across I/O), submits them to the storage engine, and publishes
//! the durable tail that readers wait on.

mod append;
mod arrival;
mod arrivals;
mod buckets;
mod cache;
mod create;
mod error;
mod follow;
mod fork;
pub mod heavy;
mod live_frame;
mod read;
mod read_memory;
mod rebuild;
mod registry;
mod removal;
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

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::model::Offset;
use crate::model::ledger::lifecycle::Removal;
use crate::storage::{Change, SharedEngine, StorageError, StreamId};

pub use crate::model::ledger::append::{AppendAck, AppendRequest};
pub use crate::model::ledger::create::Creation;

pub use arrival::Arrival;
pub use buckets::{BucketInfo, Listing, StreamSummary};
pub use cache::CacheLimits;
pub use create::{CreateOutcome, CreateRequest, MirrorStart};
pub use error::{StreamError, StreamResult};
pub use follow::{
    Chunks, Deletion, End, Ends, Event, Follow, FollowOptions, S2Reads, Source, Step, Until,
};
pub use fork::ForkRequest;
pub use live_frame::{FrameView, LiveFrame};
pub use read::{ReadChunk, TailWatch, Wake};
pub use read_memory::ReadLease;
pub use replication::{Appeared, AppearingIn, ReplicatedState};
pub use s2::{
    CheckedAppend, Ensured, ReadLimits, RecordBatch, RecordStart, S2Ack, S2Append, S2Position,
    S2Record, parse_config as parse_s2_config,
};
pub use shared_bodies::{BodyRange, SharedBody, SharedRead};
pub use snapshots::{Bootstrap, Position, digest as snapshot_digest};
pub use stream::{Durable, Stream};
pub use tokens::{IssueToken, Principal, Revocation, TokenError};

use rebuild::{Rebuild, Rebuilt};
use registry::Registry;
#[cfg(test)]
use registry::WALKED_AT_ONCE;

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

    /// The service as its own owner holds it.
    fn me(&self) -> Arc<StreamService> {
        self.me
            .upgrade()
            .expect("a service is only reached through the Arc that owns it")
    }
}
