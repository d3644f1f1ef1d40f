//! Appends and closes: the body split and staged outside the stream lock, the ledger's decision
//! (`model::ledger::append`, the rules in their order of precedence) under it, then durability
//! outside it. An append batch (seed 000 §4) sequences each frame as an independent append and
//! makes them durable together.

use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;

use super::arrival::Arrival;
use super::heavy;
use super::stream::State;
use super::{Durable, StreamError, StreamResult, StreamService, now_ms};
use crate::model::json::{self, EmptyArray};
use crate::model::ledger::append::{
    Append, AppendAck, AppendRequest, Appended, DurableBefore, Repeated,
};
use crate::model::producer::ProducerState;
use crate::model::{Record, content_type};
use crate::service::Stream;
use crate::storage::{Change, Staged, StorageError};

/// Waits until what the ledger said must be durable before an acknowledgement (or a refusal)
/// goes out is durable.
pub(super) trait Awaited {
    fn reached(&self, durable: &Durable) -> bool;

    /// `error`, once the state it was decided on is durable.
    async fn refuse(self, stream: &Stream, error: StreamError) -> StreamError;

    /// Waits until it is durable; the stream going away first is `NotFound`, and its writes
    /// failing first a storage failure (it never will be durable).
    async fn durable(self, stream: &Stream) -> StreamResult<Durable>;
}

impl Awaited for DurableBefore {
    fn reached(&self, durable: &Durable) -> bool {
        durable.tail.seq >= self.seq && (durable.closed || !self.closed)
    }

    async fn refuse(self, stream: &Stream, error: StreamError) -> StreamError {
        match self.durable(stream).await {
            Ok(_) => error,
            Err(gone) => gone,
        }
    }

    async fn durable(self, stream: &Stream) -> StreamResult<Durable> {
        let mut rx = stream.subscribe();
        let durable = *rx
            .wait_for(|d| self.reached(d) || d.removed || d.write_failed)
            .await
            .map_err(|_| StreamError::NotFound)?;
        if self.reached(&durable) {
            Ok(durable)
        } else if durable.removed {
            Err(StreamError::NotFound)
        } else {
            Err(StorageError::Failed.into())
        }
    }
}

impl StreamService {
    pub async fn append(&self, name: &str, request: AppendRequest<'_>) -> StreamResult<AppendAck> {
        self.append_arrived(name, request, None).await
    }

    /// Takes the next place among `producer`'s appends in flight on `name`, for an append whose
    /// body is still to be received: pipelined requests are told apart by the order in which
    /// they began, not by the order in which their bodies happened to finish. `None` for an
    /// append without a producer, or when there is no such stream (the append then says so, in
    /// its order of checks).
    pub async fn arrive(&self, name: &str, producer: Option<&str>) -> Option<Arrival> {
        let producer = producer?;
        let stream = self.find(name, false).await.ok()?;
        Some(Arrival::take(&stream, producer))
    }

    /// [`Self::append`], placed where `arrival` (from [`Self::arrive`]) put it among its
    /// producer's appends in flight.
    pub async fn append_arrived(
        &self,
        name: &str,
        request: AppendRequest<'_>,
        arrival: Option<Arrival>,
    ) -> StreamResult<AppendAck> {
        let stream = self.find(name, false).await?;
        Self::writable(&stream)?;
        self.engine.room()?;
        // Taken now if not before, or if the stream was deleted and created again since.
        let mut arrival = match (arrival, &request.producer) {
            (Some(arrival), _) if arrival.is_on(&stream) => Some(arrival),
            (_, Some(claim)) => Some(Arrival::take(&stream, &claim.id)),
            (_, None) => None,
        };
        let bodies = parse_bodies(&stream, &request.body).await;
        let staged = match &bodies {
            Ok(bodies) => self.stage_append(&stream, &request, bodies).await?,
            Err(_) => None,
        };
        // Before the permit: the appends waited for need permits of their own.
        if let Some(arrival) = &arrival {
            wait_for_its_producer(&stream, arrival, &request).await;
        }
        let _permit = self
            .commit_permits
            .acquire()
            .await
            .map_err(|_| StorageError::Failed)?;
        // Either a commit to await, or an earlier append to wait for (a deduplicated retry).
        let decided = {
            let mut state = stream.lock();
            if let Some(arrival) = &mut arrival {
                arrival.decided(&mut state);
            }
            let append = Append {
                request: &request,
                bodies,
            };
            match state.ledger(&stream).apply(append, now_ms()) {
                Ok(appended) => Ok(self.carry_out(&stream, &mut state, appended, staged)),
                Err(refusal) => Err((refusal, DurableBefore::seen(&state.meta))),
            }
        };
        let (ack, commit, awaited) = match decided {
            Ok(carried_out) => carried_out,
            Err((refusal, seen)) => return Err(seen.refuse(&stream, refusal.into()).await),
        };
        if let Some(commit) = commit {
            commit.await?;
            return Ok(ack);
        }
        let durable = awaited.durable(&stream).await?;
        Ok(AppendAck {
            tail: ack.tail.max(durable.tail),
            ..ack
        })
    }

    /// Submits what the stream lock decided for one append: the ack, and either the commit
    /// to await or the earlier append a retry waits for.
    fn carry_out(
        &self,
        stream: &Arc<Stream>,
        state: &mut State,
        appended: Appended,
        staged: Option<Staged>,
    ) -> (
        AppendAck,
        Option<BoxFuture<'static, Result<(), StorageError>>>,
        DurableBefore,
    ) {
        match appended {
            Appended::Write {
                ack,
                records,
                producer,
                meta_changed,
            } => {
                let producer = producer.into_iter();
                let commit = self.submit(stream, state, records, producer, meta_changed, staged);
                (ack, Some(commit), DurableBefore::default())
            }
            Appended::Repeated(Repeated {
                ack,
                durable_before,
            }) => (ack, None, durable_before),
        }
    }

    /// Appends each frame as an independent append with its own result; the successful ones
    /// become durable together. The whole batch fails only when the stream cannot be written at
    /// all (missing, gone, or another content type).
    pub async fn append_batch(
        &self,
        name: &str,
        content_type: &str,
        frames: Vec<Bytes>,
    ) -> StreamResult<Vec<StreamResult<AppendAck>>> {
        let stream = self.find(name, false).await?;
        Self::writable(&stream)?;
        self.engine.room()?;
        if !content_type::same_media_type(content_type, &stream.content_type) {
            return Err(StreamError::ContentTypeMismatch);
        }
        let json = stream.json;
        // Only JSON is parsed: other bodies are taken as they are, however large.
        let size = if json {
            frames.iter().map(Bytes::len).sum()
        } else {
            0
        };
        let (parsed, frames) =
            heavy::by_size(size, move || (parse_frames(json, &frames), frames)).await;
        let parsed = parsed?;
        let staged = self.stage(parsed.iter().flatten().flatten()).await?;
        let _permit = self
            .commit_permits
            .acquire()
            .await
            .map_err(|_| StorageError::Failed)?;
        let (mut results, commit, awaited) = {
            let mut state = stream.lock();
            let mut results = Vec::with_capacity(frames.len());
            let mut records = Vec::new();
            let mut producers = Vec::new();
            let mut awaited: Option<DurableBefore> = None;
            let now = now_ms();
            for (frame, bodies) in frames.into_iter().zip(parsed) {
                let request = AppendRequest {
                    content_type: Some(content_type),
                    body: frame,
                    ..Default::default()
                };
                let append = Append {
                    request: &request,
                    bodies,
                };
                results.push(match state.ledger(&stream).apply(append, now) {
                    Ok(Appended::Write {
                        ack,
                        records: written,
                        producer,
                        ..
                    }) => {
                        records.extend(written);
                        producers.extend(producer);
                        Ok(ack)
                    }
                    Ok(Appended::Repeated(Repeated {
                        ack,
                        durable_before,
                    })) => {
                        awaited = Some(awaited.unwrap_or_default().and(durable_before));
                        Ok(ack)
                    }
                    Err(refusal) => Err(refusal.into()),
                });
            }
            if results.iter().any(Result::is_err) {
                let seen = DurableBefore::seen(&state.meta);
                awaited = Some(awaited.unwrap_or_default().and(seen));
            }
            let wrote = results
                .iter()
                .any(|r| r.as_ref().is_ok_and(|a| !a.duplicate));
            let commit = wrote.then(|| {
                let producers = producers.into_iter();
                self.submit(&stream, &mut state, records, producers, false, staged)
            });
            (results, commit, awaited)
        };
        let failed = match commit {
            Some(commit) => commit.await.err(),
            None => None,
        };
        // Retries are acknowledged once what they repeat is durable, as a single append's are;
        // the only way that wait fails is the stream going away.
        let gone = match (&failed, awaited) {
            (None, Some(awaited)) => awaited.durable(&stream).await.is_err(),
            _ => false,
        };
        if failed.is_some() || gone {
            for result in results.iter_mut().filter(|r| r.is_ok()) {
                *result = Err(match &failed {
                    Some(e) => StreamError::Storage(e.clone()),
                    None => StreamError::NotFound,
                });
            }
        }
        Ok(results)
    }

    /// Stages one append's bodies (see [`Self::stage`]) unless the append can never write them:
    /// a retry of an append already applied, or a refusal no append still in flight can lift,
    /// must not cost a file and its fsync (producers retry large appends after a timeout). An
    /// append that waits on appends in flight ahead of it (a pipelining producer's next sequence
    /// number) is staged like theirs: it is decided after them. The state can still change
    /// before the commit; bodies not staged are then committed inline.
    pub(super) async fn stage_append(
        &self,
        stream: &Stream,
        request: &AppendRequest<'_>,
        bodies: &[Bytes],
    ) -> StreamResult<Option<Staged>> {
        if !self.engine.stages(bodies.iter().map(Bytes::len).sum()) {
            return Ok(None);
        }
        let never_writes = match request.check(&stream.lock().ledger(stream)) {
            Ok(None) => false,
            Ok(Some(_repeated)) => true,
            Err(refusal) => !refusal.may_pass_later(),
        };
        if never_writes {
            return Ok(None);
        }
        self.stage(bodies.iter()).await
    }

    /// Writes large bodies to a file of their own, when the engine would rather not copy them
    /// into their commit (see `storage::staged`). Before any lock: it does I/O.
    pub(super) async fn stage<'a>(
        &self,
        bodies: impl Iterator<Item = &'a Bytes> + Clone,
    ) -> StreamResult<Option<Staged>> {
        if !self.engine.stages(bodies.clone().map(Bytes::len).sum()) {
            return Ok(None);
        }
        Ok(Some(self.engine.stage(bodies.cloned().collect()).await?))
    }

    /// Caches the records and submits them, with the producers' states and, when more than the
    /// tail changed, the stream's metadata. (The tail itself need not be stored with every
    /// append: recovery finds it after the last stored record.) Once the commit is durable, the
    /// stream's new tail is published to readers; that runs on its own task, so records are
    /// never left durable but unseen because the request that wrote them went away.
    pub(super) fn submit(
        &self,
        stream: &Arc<Stream>,
        state: &mut State,
        records: Vec<Record>,
        producers: impl Iterator<Item = (String, ProducerState)>,
        meta_changed: bool,
        staged: Option<Staged>,
    ) -> BoxFuture<'static, Result<(), StorageError>> {
        let mut changes = Vec::with_capacity(3);
        if meta_changed || records.is_empty() {
            changes.push(Change::PutStream(stream.id, Box::new(state.meta.clone())));
        }
        changes.extend(producers.map(|(id, p)| Change::PutProducer(stream.id, id, p)));
        state.recent.push(&self.cache_budget, &records);
        if !records.is_empty() {
            changes.push(Change::PutRecords(stream.id, records, staged));
        }
        let commit = self.engine.commit(changes);
        let (tail, timestamp_ms, closed) = (
            state.meta.tail,
            state.meta.last_timestamp_ms,
            state.meta.closed,
        );
        let stream = Arc::clone(stream);
        Box::pin(super::to_the_end(async move {
            if let Err(e) = commit.await {
                stream.publish_write_failure();
                return Err(e);
            }
            stream.publish_tail(tail, timestamp_ms, closed);
            Ok(())
        }))
    }
}

/// Splits a body into record bodies: JSON messages, or the bytes as one record. The result is
/// reported at its place in the precedence order, so parsing can happen outside the lock.
async fn parse_bodies(stream: &Stream, body: &Bytes) -> Result<Vec<Bytes>, String> {
    if stream.json && !body.is_empty() {
        let body = body.clone();
        heavy::by_size(body.len(), move || split_bodies(true, &body)).await
    } else {
        split_bodies(stream.json, body)
    }
}

fn split_bodies(json: bool, body: &Bytes) -> Result<Vec<Bytes>, String> {
    if body.is_empty() {
        Ok(Vec::new())
    } else if json {
        json::messages(body, EmptyArray::Rejected).map_err(|e| e.to_string())
    } else {
        Ok(vec![body.clone()])
    }
}

/// Each frame of a batch split as [`parse_bodies`] does; too many JSON messages in all is a bad
/// request for the whole batch.
fn parse_frames(json: bool, frames: &[Bytes]) -> StreamResult<Vec<Result<Vec<Bytes>, String>>> {
    let mut parsed = Vec::with_capacity(frames.len());
    let mut messages = 0;
    for frame in frames {
        let bodies = split_bodies(json, frame);
        messages += bodies.as_ref().map_or(0, Vec::len);
        if messages > json::MAX_MESSAGES {
            return Err(StreamError::BadRequest(format!(
                "a batch holds at most {} JSON messages in all",
                json::MAX_MESSAGES
            )));
        }
        parsed.push(bodies);
    }
    Ok(parsed)
}

/// Waits while `request` would be refused in a way that an append of its producer which arrived
/// before it, and is not decided yet, may still change (see `arrivals`).
async fn wait_for_its_producer(stream: &Stream, arrival: &Arrival, request: &AppendRequest<'_>) {
    loop {
        let wait = {
            let mut state = stream.lock();
            let Some(wait) = arrival.earlier_undecided(&mut state) else {
                return;
            };
            match request.check(&state.ledger(stream)) {
                Err(refusal) if refusal.waits_for_its_producer() => wait,
                _ => return,
            }
        };
        wait.await;
    }
}

#[cfg(test)]
mod tests;
