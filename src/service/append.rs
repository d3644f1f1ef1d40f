//! Appends and closes: validation in the protocol's order of precedence, sequencing under the
//! stream lock, then durability outside it. An append batch (seed 000 §4) sequences each frame as
//! an independent append and makes them durable together.

use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;

use super::arrivals::Arrival;
use super::heavy;
use super::stream::State;
use super::{Durable, StreamError, StreamResult, StreamService, now_ms};
use crate::model::json::{self, EmptyArray};
use crate::model::producer::{self, ProducerClaim, ProducerDecision, ProducerError, ProducerState};
use crate::model::record::lay_out_arrived;
use crate::model::stream::ClosingProducer;
use crate::model::{Offset, Record, content_type};
use crate::service::Stream;
use crate::storage::{Change, Staged, StorageError};

/// An append (or close) request, with header syntax already checked by the face.
#[derive(Clone, Debug, Default)]
pub struct AppendRequest<'a> {
    pub content_type: Option<&'a str>,
    pub body: Bytes,
    pub close: bool,
    pub producer: Option<ProducerClaim>,
    pub stream_seq: Option<&'a str>,
    /// `Stream-Record-Match`: append only if the record tail is this.
    pub record_match: Option<u64>,
}

/// The acknowledgement of an append, a close, or a deduplicated retry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppendAck {
    pub tail: Offset,
    pub closed: bool,
    /// Producer epoch and sequence to report, when the request carried producer headers.
    pub producer: Option<(u64, u64)>,
    /// Nothing was written: the request repeated one already applied.
    pub duplicate: bool,
    /// Records `[start, next)` this append created; for a duplicate the original's, or `None`
    /// when it is older than the appends its producer's state remembers.
    pub records: Option<(u64, u64)>,
    /// The stream is a JSON stream, so `records` are record coordinates worth reporting.
    pub record_aware: bool,
    /// The timestamp of the stream's last record after this append.
    pub timestamp_ms: i64,
}

/// What the stream lock decided for one append.
enum Decision {
    /// Write these records (and producer state); the stream metadata is already updated.
    Write {
        ack: AppendAck,
        records: Vec<Record>,
        producer: Option<(String, ProducerState)>,
        /// Metadata beyond the tail changed (Stream-Seq, closure) and must be stored too.
        meta_changed: bool,
    },
    /// Acknowledge without writing (a retry of an append already applied), once what the
    /// original did is durable.
    Acknowledge { ack: AppendAck, awaited: Awaited },
}

/// What acknowledging a retry waits for: the original's records durable, and for a repeated
/// close, the close itself (it adds no record, so the records alone say nothing of it).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Awaited {
    seq: u64,
    closed: bool,
}

impl Awaited {
    fn and(self, other: Awaited) -> Awaited {
        Awaited {
            seq: self.seq.max(other.seq),
            closed: self.closed || other.closed,
        }
    }

    fn reached(&self, durable: &Durable) -> bool {
        durable.tail.seq >= self.seq && (durable.closed || !self.closed)
    }

    /// What `state` shows now. A refusal decided on that state is sent only once this is
    /// durable, so it never reports a close, a tail or a producer's progress that a crash
    /// could still undo.
    pub(super) fn seen(state: &State) -> Awaited {
        Awaited {
            seq: state.meta.tail.seq,
            closed: state.meta.closed,
        }
    }

    /// `error`, once the state it was decided on is durable.
    pub(super) async fn refuse(self, stream: &Stream, error: StreamError) -> StreamError {
        match self.durable(stream).await {
            Ok(_) => error,
            Err(gone) => gone,
        }
    }

    /// Waits until it is durable; the stream going away first is `NotFound`, and its writes
    /// failing first a storage failure (it never will be durable).
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
            match decide(&stream, &mut state, &request, bodies) {
                Ok(decision) => {
                    stream.renew_locked(&mut state);
                    Ok(self.carry_out(&stream, &mut state, decision, staged))
                }
                Err(error) => Err((error, Awaited::seen(&state))),
            }
        };
        let (ack, commit, awaited) = match decided {
            Ok(carried_out) => carried_out,
            Err((error, seen)) => return Err(seen.refuse(&stream, error).await),
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
        decision: Decision,
        staged: Option<Staged>,
    ) -> (
        AppendAck,
        Option<BoxFuture<'static, Result<(), StorageError>>>,
        Awaited,
    ) {
        match decision {
            Decision::Write {
                ack,
                records,
                producer,
                meta_changed,
            } => {
                let producer = producer.into_iter();
                let commit = self.submit(stream, state, records, producer, meta_changed, staged);
                (ack, Some(commit), Awaited::default())
            }
            Decision::Acknowledge { ack, awaited } => (ack, None, awaited),
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
            let mut awaited: Option<Awaited> = None;
            for (frame, bodies) in frames.into_iter().zip(parsed) {
                let request = AppendRequest {
                    content_type: Some(content_type),
                    body: frame,
                    ..Default::default()
                };
                results.push(match decide(&stream, &mut state, &request, bodies) {
                    Ok(Decision::Write {
                        ack,
                        records: written,
                        producer,
                        ..
                    }) => {
                        records.extend(written);
                        producers.extend(producer);
                        Ok(ack)
                    }
                    Ok(Decision::Acknowledge { ack, awaited: more }) => {
                        awaited = Some(awaited.unwrap_or_default().and(more));
                        Ok(ack)
                    }
                    Err(e) => Err(e),
                });
            }
            if results.iter().any(Result::is_ok) {
                stream.renew_locked(&mut state);
            }
            if results.iter().any(Result::is_err) {
                awaited = Some(awaited.unwrap_or_default().and(Awaited::seen(&state)));
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
        let never_writes = match check(stream, &stream.lock(), request) {
            Ok(None) => false,
            Ok(Some(_acknowledge)) => true,
            Err(refusal) => !may_pass_later(&refusal),
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

/// Validates one append against the stream's state and, when it writes, updates the state.
fn decide(
    stream: &Arc<Stream>,
    state: &mut State,
    request: &AppendRequest<'_>,
    bodies: Result<Vec<Bytes>, String>,
) -> StreamResult<Decision> {
    if let Some(acknowledge) = check(stream, state, request)? {
        return Ok(acknowledge);
    }
    let tail = state.meta.tail;
    let bodies = bodies.map_err(StreamError::BadRequest)?;
    let arrival = now_ms();
    let timestamp = arrival.max(state.meta.last_timestamp_ms);
    let records = lay_out_arrived(tail, timestamp, arrival, bodies);
    let new_tail = records.last().map_or(tail, Record::next_offset);
    let range = (tail.seq, new_tail.seq);

    let meta = &mut state.meta;
    meta.tail = new_tail;
    if !records.is_empty() {
        // The timestamp of the last record: a close alone adds none.
        meta.last_timestamp_ms = timestamp;
    }
    if let Some(seq) = &request.stream_seq {
        meta.extra_mut().last_stream_seq = Some((*seq).to_owned());
    }
    if request.close {
        meta.closed = true;
        meta.extra_mut().closed_by = request.producer.as_ref().map(|c| ClosingProducer {
            id: c.id.clone(),
            epoch: c.epoch,
            seq: c.seq,
        });
    }
    let producer = request.producer.as_ref().map(|claim| {
        let producer = match state.producers.get_mut(&claim.id) {
            Some(known) => {
                known.advance(claim.epoch, claim.seq, range);
                known.clone()
            }
            None => {
                let first = ProducerState::first(claim.epoch, claim.seq, range);
                state.producers.insert(claim.id.clone(), first.clone());
                first
            }
        };
        (claim.id.clone(), producer)
    });
    let ack = AppendAck {
        tail: new_tail,
        closed: request.close,
        producer: request.producer.as_ref().map(|c| (c.epoch, c.seq)),
        duplicate: false,
        records: Some(range),
        record_aware: stream.json,
        timestamp_ms: state.meta.last_timestamp_ms,
    };
    Ok(Decision::Write {
        ack,
        records,
        producer,
        meta_changed: request.close || request.stream_seq.is_some(),
    })
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
            match check(stream, &state, request) {
                Err(refusal) if waits_for_its_producer(&refusal) => wait,
                _ => return,
            }
        };
        wait.await;
    }
}

/// Whether an append refused with `refusal` may be accepted once its producer's earlier appends
/// land: a later sequence number, or the rest of a new epoch, sent before the appends it follows
/// are decided.
fn waits_for_its_producer(refusal: &StreamError) -> bool {
    matches!(
        refusal,
        StreamError::Producer(
            ProducerError::SequenceGap { .. } | ProducerError::EpochBumpNotAtZero
        )
    )
}

/// Whether an append refused with `refusal` may be accepted once appends ahead of it land: a
/// producer's later sequence number, or the rest of a new epoch, sent before the appends it
/// follows are decided, or a record match ahead of the tail.
fn may_pass_later(refusal: &StreamError) -> bool {
    match refusal {
        StreamError::RecordMismatch { expected, next, .. } => expected > next,
        refusal => waits_for_its_producer(refusal),
    }
}

/// The checks of [`decide`] that change nothing: a refusal, a retry to acknowledge without
/// writing, or `None` when the append writes.
fn check(
    stream: &Stream,
    state: &State,
    request: &AppendRequest<'_>,
) -> StreamResult<Option<Decision>> {
    if state.removed {
        return Err(StreamError::NotFound);
    }
    if state.meta.soft_deleted {
        return Err(StreamError::Gone);
    }
    if stream.encrypted {
        return Err(StreamError::Encrypted);
    }
    let tail = state.meta.tail;

    if state.meta.closed {
        let closing_retry = match (&request.producer, &state.meta.extra().closed_by) {
            (Some(claim), Some(by)) => {
                claim.id == by.id && claim.epoch == by.epoch && claim.seq == by.seq
            }
            _ => false,
        };
        let plain_close_retry =
            request.body.is_empty() && request.close && request.producer.is_none();
        if !(closing_retry || plain_close_retry) {
            return Err(StreamError::Closed { tail });
        }
        let records = request
            .producer
            .as_ref()
            .and_then(|c| state.producers.get(&c.id))
            .map_or((tail.seq, tail.seq), |p| p.records);
        let ack = AppendAck {
            tail,
            closed: true,
            producer: request.producer.as_ref().map(|c| (c.epoch, c.seq)),
            duplicate: true,
            records: Some(records),
            record_aware: stream.json,
            timestamp_ms: state.meta.last_timestamp_ms,
        };
        return Ok(Some(Decision::Acknowledge {
            ack,
            awaited: Awaited {
                seq: tail.seq,
                closed: true,
            },
        }));
    }

    if !request.body.is_empty() {
        let given = request.content_type.unwrap_or_default();
        if !content_type::same_media_type(given, &stream.content_type) {
            return Err(StreamError::ContentTypeMismatch);
        }
    }

    if let Some(claim) = &request.producer
        && let ProducerDecision::Duplicate { epoch, last_seq } =
            producer::decide(state.producers.get(&claim.id), claim)?
    {
        let records = state
            .producers
            .get(&claim.id)
            .and_then(|p| p.records_of(claim.seq));
        let ack = AppendAck {
            tail,
            closed: false,
            producer: Some((epoch, last_seq)),
            duplicate: true,
            records,
            record_aware: stream.json,
            timestamp_ms: state.meta.last_timestamp_ms,
        };
        return Ok(Some(Decision::Acknowledge {
            ack,
            awaited: Awaited {
                seq: records.map_or(tail.seq, |(_, next)| next),
                closed: false,
            },
        }));
    }

    if let Some(expected) = request.record_match {
        if !stream.json {
            return Err(StreamError::NotRecordAware);
        }
        if expected != tail.seq {
            return Err(StreamError::RecordMismatch {
                expected,
                next: tail.seq,
                tail,
            });
        }
    }

    if let (Some(received), Some(last)) = (&request.stream_seq, &state.meta.extra().last_stream_seq)
        && received.as_bytes() <= last.as_bytes()
    {
        return Err(StreamError::StreamSeqRegression {
            last: last.clone(),
            received: (*received).to_owned(),
        });
    }

    Ok(None)
}

#[cfg(test)]
mod tests;
