//! Appends and closes: validation in the protocol's order of precedence, sequencing under the
//! stream lock, then durability outside it.

use std::sync::Arc;

use bytes::Bytes;

use super::{StreamError, StreamResult, StreamService, now_ms};
use crate::model::json::{self, EmptyArray};
use crate::model::producer::{self, ProducerClaim, ProducerDecision, ProducerState};
use crate::model::record::lay_out;
use crate::model::stream::ClosingProducer;
use crate::model::{Offset, Record, content_type};
use crate::service::Stream;
use crate::storage::Change;

/// An append (or close) request, with header syntax already checked by the face.
#[derive(Clone, Debug, Default)]
pub struct AppendRequest {
    pub content_type: Option<String>,
    pub body: Bytes,
    pub close: bool,
    pub producer: Option<ProducerClaim>,
    pub stream_seq: Option<String>,
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
    /// Records `[start, next)` this append created (for a duplicate, the original's).
    pub records: (u64, u64),
}

/// What the stream lock decided: write something, or acknowledge without writing once the
/// record `wait_for_seq` is durable.
enum Plan {
    Write {
        ack: AppendAck,
        commit: futures::future::BoxFuture<'static, Result<(), crate::storage::StorageError>>,
    },
    Acknowledge {
        ack: AppendAck,
        wait_for_seq: u64,
    },
}

impl StreamService {
    pub async fn append(&self, name: &str, request: AppendRequest) -> StreamResult<AppendAck> {
        let stream = self.find(name, true).await?;
        // Parse outside the lock; the result is reported at its place in the precedence order.
        let bodies = if request.body.is_empty() {
            Ok(Vec::new())
        } else if stream.json {
            json::messages(&request.body, EmptyArray::Rejected).map_err(|e| e.to_string())
        } else {
            Ok(vec![request.body.clone()])
        };
        let _permit = self
            .commit_permits
            .acquire()
            .await
            .map_err(|_| StreamError::Storage(crate::storage::StorageError::Failed))?;
        match self.sequence(&stream, &request, bodies)? {
            Plan::Write { ack, commit } => {
                commit.await?;
                stream.publish_tail(ack.tail, ack.closed);
                Ok(ack)
            }
            Plan::Acknowledge { ack, wait_for_seq } => {
                let mut rx = stream.subscribe();
                let durable = rx
                    .wait_for(|d| d.tail.seq >= wait_for_seq || d.removed)
                    .await
                    .map_err(|_| StreamError::NotFound)?;
                if durable.removed {
                    return Err(StreamError::NotFound);
                }
                Ok(AppendAck {
                    tail: ack.tail.max(durable.tail),
                    ..ack
                })
            }
        }
    }

    /// Validates the append against the stream's state and, if it writes, submits it to storage.
    fn sequence(
        &self,
        stream: &Arc<Stream>,
        request: &AppendRequest,
        bodies: Result<Vec<Bytes>, String>,
    ) -> StreamResult<Plan> {
        let mut state = stream.lock();
        if state.removed {
            return Err(StreamError::NotFound);
        }
        if state.meta.soft_deleted {
            return Err(StreamError::Gone);
        }
        let tail = state.meta.tail;

        if state.meta.closed {
            let closing_retry = match (&request.producer, &state.meta.closed_by) {
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
                records,
            };
            return Ok(Plan::Acknowledge {
                ack,
                wait_for_seq: tail.seq,
            });
        }

        if !request.body.is_empty() {
            let given = request.content_type.as_deref().unwrap_or_default();
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
                .map_or((tail.seq, tail.seq), |p| p.records);
            let ack = AppendAck {
                tail,
                closed: state.meta.closed,
                producer: Some((epoch, last_seq)),
                duplicate: true,
                records,
            };
            return Ok(Plan::Acknowledge {
                ack,
                wait_for_seq: records.1,
            });
        }

        if let (Some(received), Some(last)) = (&request.stream_seq, &state.meta.last_stream_seq)
            && received.as_bytes() <= last.as_bytes()
        {
            return Err(StreamError::StreamSeqRegression {
                last: last.clone(),
                received: received.clone(),
            });
        }

        let bodies = bodies.map_err(StreamError::BadRequest)?;
        let timestamp = now_ms().max(state.meta.last_timestamp_ms);
        let records = lay_out(tail, timestamp, bodies);
        let new_tail = records.last().map_or(tail, Record::next_offset);
        let range = (tail.seq, new_tail.seq);

        let meta = &mut state.meta;
        meta.tail = new_tail;
        meta.last_timestamp_ms = timestamp;
        if let Some(seq) = &request.stream_seq {
            meta.last_stream_seq = Some(seq.clone());
        }
        if request.close {
            meta.closed = true;
            meta.closed_by = request.producer.as_ref().map(|c| ClosingProducer {
                id: c.id.clone(),
                epoch: c.epoch,
                seq: c.seq,
            });
        }
        let mut changes = Vec::with_capacity(3);
        changes.push(Change::PutStream(stream.id, Box::new(meta.clone())));
        if let Some(claim) = &request.producer {
            let producer = ProducerState {
                epoch: claim.epoch,
                last_seq: claim.seq,
                records: range,
            };
            changes.push(Change::PutProducer(
                stream.id,
                claim.id.clone(),
                producer.clone(),
            ));
            state.producers.insert(claim.id.clone(), producer);
        }
        state.recent.push(&records);
        if !records.is_empty() {
            changes.push(Change::PutRecords(stream.id, records));
        }
        let ack = AppendAck {
            tail: new_tail,
            closed: request.close,
            producer: request.producer.as_ref().map(|c| (c.epoch, c.seq)),
            duplicate: false,
            records: range,
        };
        let commit = self.engine.commit(changes);
        Ok(Plan::Write { ack, commit })
    }
}
