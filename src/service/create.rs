//! Creating a stream: planning a fork, splitting and staging the first records, then, under the
//! registry's lock, the ledger's rules (`model::ledger::create`) for a name that is taken, for
//! the bucket, and for the new stream's metadata; the creation is then committed and published.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;

use super::fork::{ForkPlan, ForkRequest};
use super::{
    Durable, StreamError, StreamInfo, StreamResult, StreamService, heavy, now_ms, to_the_end,
};
use crate::model::Offset;
use crate::model::json::{self, EmptyArray};
use crate::model::ledger::Ledger;
use crate::model::ledger::create::{
    self, Ask, Birth, Born, ForkBase, Inherited, MirrorOrigin, Recreate, Recreated,
    RequestedConfig, RequestedFork,
};
use crate::model::ledger::fork::TakeFork;
use crate::model::stream::SnapshotInfo;
use crate::model::{content_type, names};
use crate::service::Stream;
use crate::storage::{Change, Staged, StorageError};

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

/// Where a new mirror starts: at its upstream's retained start, so every offset matches, with
/// the upstream's snapshot (its description and blob) standing for what came before.
#[derive(Clone, Debug)]
pub struct MirrorStart {
    /// The upstream server (`scheme://host:port`).
    pub upstream: String,
    pub at: Offset,
    pub snapshot: Option<(SnapshotInfo, Bytes)>,
    /// When the upstream created its stream; the mirror's stream keeps it.
    pub created_ms: i64,
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

impl StreamService {
    /// Creates a stream, or confirms an identical one exists.
    pub async fn create(&self, mut request: CreateRequest) -> StreamResult<CreateOutcome> {
        let asked_fork = request.fork.as_ref().map(ForkRequest::requested);
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
                    let Some(existing) = self.existing_fork(&request.name, &fork.requested()).await
                    else {
                        return Err(e);
                    };
                    let requested = RequestedConfig::repeating_fork(
                        request.ask(asked_fork.as_ref()),
                        &existing.lock().meta,
                        now_ms(),
                    )?;
                    let info = self.confirm_existing(&existing, &requested).await?;
                    return Ok(CreateOutcome {
                        records: (info.tail.seq, info.tail.seq),
                        info,
                        created: false,
                    });
                }
            },
            None => None,
        };
        let inherited = plan.as_ref().map(|plan| Inherited {
            content_type: &plan.source.content_type,
            ttl_secs: plan.ttl_secs,
            expires_at_ms: plan.expires_at_ms,
        });
        let requested =
            RequestedConfig::resolve(request.ask(asked_fork.as_ref()), inherited, now_ms())?;
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
                        service.announce(&stream);
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

    /// The stream `name`, when it is a fork made as `fork` asks.
    async fn existing_fork(&self, name: &str, fork: &RequestedFork) -> Option<Arc<Stream>> {
        let existing = self.lock_registry().streams.get(name).cloned()?;
        if !existing.wait_ready().await {
            return None;
        }
        let same = {
            let state = existing.lock();
            let origin = state.meta.extra().fork.as_ref();
            !state.removed && !state.meta.soft_deleted && origin.is_some_and(|o| fork.matches(o))
        };
        same.then_some(existing)
    }

    /// What the stream `existing` makes of a create of its name (see [`Recreate`]): its info when
    /// the create repeats its own, `NotFound` when it went meanwhile (the create makes a new
    /// one).
    async fn confirm_existing(
        &self,
        existing: &Arc<Stream>,
        requested: &RequestedConfig,
    ) -> StreamResult<StreamInfo> {
        if !existing.wait_ready().await {
            return Err(StreamError::NotFound);
        }
        let recreated = {
            let mut state = existing.lock();
            let now = now_ms();
            let expired = existing.expired(&state, now);
            state
                .ledger(existing)
                .apply(Recreate { requested, expired }, now)?
        };
        match recreated {
            Recreated::Repeat => Ok(self.info(existing)),
            Recreated::Expired => {
                let removal = self.remove(existing).await?;
                Err(removal.refusing_recreate().into())
            }
        }
    }

    /// Stages the large bodies of a new stream (see [`StreamService::stage`]).
    pub(super) async fn stage_new(
        &self,
        bodies: &[Bytes],
        mirror: Option<&MirrorStart>,
        plan: Option<&ForkPlan>,
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
        plan: Option<&ForkPlan>,
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
            let limit = self.config.max_streams_per_bucket;
            let held = |limit: usize| {
                let prefix = names::bucket_prefix(bucket);
                (registry.streams_from(&prefix))
                    .take_while(|(key, _)| key.starts_with(&prefix))
                    .take(limit)
                    .count()
            };
            let meta = registry.buckets.get_key_value(bucket);
            let meta = meta.map(|(name, meta)| (name.as_str(), meta));
            create::admit(meta, requested, limit, held)?;
        }
        let (stream, changes) = self.build_stream(name, requested, plan, bodies, mirror, staged)?;
        let commit = self.engine.commit(changes);
        registry.insert(stream.clone());
        Ok(Some((stream, commit)))
    }

    /// A new stream as `requested` (see [`Ledger::create`]), not yet registered, and the changes
    /// that store it; a fork's source takes it first ([`TakeFork`]). `bodies` are its first
    /// records.
    pub(super) fn build_stream(
        &self,
        name: &str,
        requested: &RequestedConfig,
        plan: Option<&ForkPlan>,
        bodies: &[Bytes],
        mirror: Option<&MirrorStart>,
        staged: &StagedBodies,
    ) -> StreamResult<(Arc<Stream>, Vec<Change>)> {
        let now = now_ms();
        let snapshot = initial_snapshot(mirror, plan);
        let fork = match plan {
            Some(plan) => {
                let inherited = plan.snapshot.as_ref().map(|(info, _)| info);
                let take = TakeFork {
                    anchor: plan.anchor,
                    inherited,
                };
                let first = plan.source.lock().ledger(&plan.source).apply(take, now)?;
                Some(ForkBase {
                    source_id: plan.source.id,
                    source_name: &plan.source.name,
                    anchor: plan.anchor,
                    sub_offset: plan.sub_offset,
                    prefix: &plan.prefix,
                    first,
                    last_timestamp_ms: plan.source.durable().last_timestamp_ms,
                    snapshot: inherited,
                })
            }
            None => None,
        };
        let birth = Birth {
            name,
            requested,
            bodies: bodies.to_vec(),
            mirror: mirror.map(|m| MirrorOrigin {
                at: m.at,
                created_ms: m.created_ms,
                snapshot: m.snapshot.as_ref().map(|(info, _)| info),
            }),
            fork,
        };
        let Born { meta, records } = Ledger::create(birth, now);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let durable = Durable {
            tail: meta.tail,
            first: meta.retained_from,
            last_timestamp_ms: meta.last_timestamp_ms,
            meta_version: 0,
            closed: meta.closed,
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
        if let Some((_, blob)) = snapshot {
            changes.push(Change::PutSnapshot(
                id,
                blob.clone(),
                staged.snapshot.clone(),
            ));
        }
        Ok((stream, changes))
    }
}

impl CreateRequest {
    /// What the request asks for, as the ledger reads it; `fork` is its fork request's.
    pub(super) fn ask<'a>(&'a self, fork: Option<&'a RequestedFork>) -> Ask<'a> {
        Ask {
            content_type: self.content_type.as_deref(),
            ttl_secs: self.ttl_secs,
            expires_at_ms: self.expires_at_ms,
            closed: self.closed,
            attrs: &self.attrs,
            cipher: self.cipher.as_deref(),
            mirror_of: self.mirror.as_ref().map(|m| m.upstream.as_str()),
            s2_creation: self.s2_creation.as_deref(),
            s2_config: self.s2_config.as_ref(),
            fork,
        }
    }
}

/// The staged bodies of a new stream: its first records', and its initial snapshot's.
pub(super) struct StagedBodies {
    records: Option<Staged>,
    snapshot: Option<Staged>,
}

/// The snapshot a new stream starts with: a mirror its upstream's, a fork of a trimmed stream
/// its source's.
fn initial_snapshot<'a>(
    mirror: Option<&'a MirrorStart>,
    plan: Option<&'a ForkPlan>,
) -> Option<&'a (SnapshotInfo, Bytes)> {
    mirror
        .and_then(|m| m.snapshot.as_ref())
        .or(plan.and_then(|p| p.snapshot.as_ref()))
}
