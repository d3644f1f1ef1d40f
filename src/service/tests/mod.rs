//! The service's unit tests that need no HTTP. Those of each file of `service/` sit beside it
//! (`append/tests.rs` for `append.rs`, and so on); the ones here test `mod.rs` itself: recovery
//! at start, streams coming and going, and expiry. This module holds the fixtures they all share:
//! test engines wrapping a memory engine, and the requests and streams most tests start from.

mod expiry;
mod lifecycle;
mod recovery;

use std::sync::Arc;

use bytes::Bytes;
use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::sync::Semaphore;

use super::{
    AppendRequest, CheckedAppend, CreateRequest, S2Append, S2Record, ServiceConfig, Stream,
    StreamService,
};
use crate::model::{ReadFrom, Record};
use crate::storage::{
    Change, Engine, MemoryEngine, Recovered, Staged, StorageError, StreamId, TimeBounds,
};

/// A test engine that changes one thing about the engine it wraps and passes the rest through:
/// it implements the hook it changes, and `Engine` comes from the impl below.
pub(super) trait Wrapping: Send + Sync + 'static {
    fn inner(&self) -> &dyn Engine;

    fn on_commit(&self, changes: Vec<Change>) -> BoxFuture<'static, Result<(), StorageError>> {
        self.inner().commit(changes)
    }

    fn on_stage(&self, bodies: Vec<Bytes>) -> BoxFuture<'static, Result<Staged, StorageError>> {
        self.inner().stage(bodies)
    }

    fn on_read(
        &self,
        id: StreamId,
        from: u64,
        until: u64,
        max: usize,
    ) -> BoxFuture<'static, Result<Vec<Record>, StorageError>> {
        self.inner().read(id, from, until, max)
    }

    fn on_recover(&self) -> Result<Recovered, StorageError> {
        self.inner().recover()
    }
}

impl<W: Wrapping> Engine for W {
    fn commit(&self, changes: Vec<Change>) -> BoxFuture<'static, Result<(), StorageError>> {
        self.on_commit(changes)
    }

    fn stages(&self, bytes: usize) -> bool {
        self.inner().stages(bytes)
    }

    fn stage(&self, bodies: Vec<Bytes>) -> BoxFuture<'static, Result<Staged, StorageError>> {
        self.on_stage(bodies)
    }

    fn read(
        &self,
        id: StreamId,
        from: u64,
        until: u64,
        max: usize,
    ) -> BoxFuture<'static, Result<Vec<Record>, StorageError>> {
        self.on_read(id, from, until, max)
    }

    fn time_bounds(
        &self,
        id: StreamId,
        timestamp_ms: u64,
    ) -> BoxFuture<'static, Result<TimeBounds, StorageError>> {
        self.inner().time_bounds(id, timestamp_ms)
    }

    fn read_snapshot(
        &self,
        id: StreamId,
    ) -> BoxFuture<'static, Result<Option<Bytes>, StorageError>> {
        self.inner().read_snapshot(id)
    }

    // `recover_each` stays the default, which goes through `recover`: a wrapper's recovery is
    // the one the service sees.
    fn recover(&self) -> Result<Recovered, StorageError> {
        self.on_recover()
    }

    fn room(&self) -> Result<(), StorageError> {
        self.inner().room()
    }
}

/// A memory engine whose commits complete only when the test lets them.
pub(super) struct GatedEngine {
    pub(super) inner: Arc<MemoryEngine>,
    gate: Arc<Semaphore>,
    /// Commits take effect only when the gate lets them through: until then the store holds
    /// what it held before, as a storage engine's does while its writer is behind. Otherwise
    /// they take effect at once and only their completion waits.
    held: bool,
}

impl GatedEngine {
    pub(super) fn new(gate: Arc<Semaphore>) -> GatedEngine {
        GatedEngine {
            inner: Arc::new(MemoryEngine::new()),
            gate,
            held: false,
        }
    }

    pub(super) fn held(gate: Arc<Semaphore>) -> GatedEngine {
        GatedEngine {
            held: true,
            ..GatedEngine::new(gate)
        }
    }
}

impl Wrapping for GatedEngine {
    fn inner(&self) -> &dyn Engine {
        self.inner.as_ref()
    }

    fn on_commit(&self, changes: Vec<Change>) -> BoxFuture<'static, Result<(), StorageError>> {
        let gate = self.gate.clone();
        // A memory engine's commit takes effect when called; a held one is called only later.
        let commit = if self.held {
            let inner = self.inner.clone();
            async move { inner.commit(changes).await }.boxed()
        } else {
            self.inner.commit(changes)
        };
        async move {
            gate.acquire()
                .await
                .map_err(|_| StorageError::Failed)?
                .forget();
            commit.await
        }
        .boxed()
    }
}

/// A memory engine whose commits wait for the test's gate and, once `fail` is set, fail as a
/// storage whose write failed does.
pub(super) struct FailingCommits {
    pub(super) inner: MemoryEngine,
    pub(super) gate: Arc<Semaphore>,
    pub(super) fail: Arc<std::sync::atomic::AtomicBool>,
}

impl Wrapping for FailingCommits {
    fn inner(&self) -> &dyn Engine {
        &self.inner
    }

    fn on_commit(&self, changes: Vec<Change>) -> BoxFuture<'static, Result<(), StorageError>> {
        let failing = self.fail.load(std::sync::atomic::Ordering::SeqCst);
        let commit = (!failing).then(|| self.inner.commit(changes));
        let gate = self.gate.clone();
        async move {
            gate.acquire()
                .await
                .map_err(|_| StorageError::Failed)?
                .forget();
            match commit {
                Some(commit) => commit.await,
                None => Err(StorageError::Io("the disk went away".into())),
            }
        }
        .boxed()
    }
}

pub(super) fn text(body: &str) -> AppendRequest<'static> {
    AppendRequest {
        content_type: Some("text/plain"),
        body: Bytes::copy_from_slice(body.as_bytes()),
        ..Default::default()
    }
}

pub(super) fn create_text(name: &str) -> CreateRequest {
    CreateRequest {
        name: name.into(),
        content_type: Some("text/plain".into()),
        ..Default::default()
    }
}

/// A service in memory holding one empty `text/plain` stream, `s`: where many tests start.
pub(crate) async fn one_text_stream() -> (Arc<StreamService>, Arc<Stream>) {
    let service =
        StreamService::open(Arc::new(MemoryEngine::new()), ServiceConfig::default()).unwrap();
    service.create(create_text("s")).await.unwrap();
    let stream = service.find("s", false).await.unwrap();
    (service, stream)
}

/// Every record of `stream` a reader gets from its start, following `next` until up to date.
pub(super) async fn read_whole(service: &StreamService, stream: &Arc<Stream>) -> Vec<String> {
    let mut at = service.resolve(stream, ReadFrom::Start).await.unwrap();
    let mut bodies = Vec::new();
    loop {
        let chunk = service.read_at(stream, at, None).await.unwrap();
        bodies.extend(
            chunk
                .records
                .iter()
                .map(|r| String::from_utf8_lossy(&r.body).into_owned()),
        );
        at = chunk.next;
        if chunk.up_to_date {
            return bodies;
        }
    }
}

/// An S2 batch of `n` plain records.
pub(super) fn plain_records(n: usize) -> CheckedAppend {
    S2Append {
        records: (0..n)
            .map(|_| S2Record {
                timestamp: None,
                headers: Vec::new(),
                body: Bytes::from_static(b"r"),
            })
            .collect(),
        match_seq_num: None,
        fencing_token: None,
    }
    .check()
    .unwrap()
}
