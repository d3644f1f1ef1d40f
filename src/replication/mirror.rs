//! Applying what an upstream sends to the mirror's copies: states, records in batches, deletions,
//! and gaps, rebuilding a copy that no longer matches its upstream.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use futures::{FutureExt, SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message as WsMessage;

use super::error::MirrorError;
use super::gap::{GapAction, after_gap};
use super::upstream::{Upstream, stream_key};
use crate::model::stream::SnapshotInfo;
use crate::model::streamld::{self, GapSignal, Message, StreamState, SubscriptionRequest};
use crate::model::{Offset, Record, names};
use crate::service::{Durable, ReplicatedState, Stream, StreamError, StreamService};

/// Frames applied in one commit at most.
const APPLY_BATCH: usize = 1000;

/// A message from the upstream; `None` for a type this mirror does not know, which a newer
/// upstream may send and which is skipped rather than ending the session.
pub(super) fn known_message(text: &str) -> Result<Option<Message>, MirrorError> {
    match Message::parse_from_upstream(text) {
        Ok(message) => Ok(Some(message)),
        Err(streamld::MessageError::UnknownType(kind)) => {
            tracing::debug!(kind = %kind, "skipping a replication message of an unknown type");
            Ok(None)
        }
        Err(e) => Err(MirrorError::BadMessage(e.to_string())),
    }
}

fn record_of(event: &streamld::EventEnvelope) -> Result<Record, MirrorError> {
    streamld::record_of(event).ok_or_else(|| {
        MirrorError::BadMessage(format!("event {} is not a Runnel record", event.sequence))
    })
}

/// The cursor the mirror holds for a stream (the number of records it has, which is its tail),
/// and the timestamp of its last record when it holds that record: the upstream checks it is
/// still the record it has there (timestamps never go back along a stream, so the stream's
/// latest is its last record's).
pub(super) fn cursor_of(durable: &Durable) -> (u64, Option<i64>) {
    let holds_last = durable.tail.seq > durable.first.seq;
    (
        durable.tail.seq,
        holds_last.then_some(durable.last_timestamp_ms),
    )
}

pub(super) struct Mirror<'a> {
    service: &'a Arc<StreamService>,
    http: &'a reqwest::Client,
    upstream: &'a Upstream,
    /// The last state the upstream sent per stream URL, for rebuilding after a gap.
    states: HashMap<String, ReplicatedState>,
    /// The upstream's record tail per stream URL, as frames last reported it.
    upstream_tails: HashMap<String, u64>,
    /// Why the session must end so the mirror joins again with the cursors it now holds: a
    /// stream was rebuilt after diverging (in a bucket subscription the upstream's pump for it
    /// cannot be pointed elsewhere), or the one stream followed was deleted.
    rejoin: Option<String>,
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;
type Sink = futures::stream::SplitSink<Socket, WsMessage>;
type Source = futures::stream::SplitStream<Socket>;

impl<'a> Mirror<'a> {
    pub(super) fn new(
        service: &'a Arc<StreamService>,
        http: &'a reqwest::Client,
        upstream: &'a Upstream,
    ) -> Mirror<'a> {
        Mirror {
            service,
            http,
            upstream,
            states: HashMap::new(),
            upstream_tails: HashMap::new(),
            rejoin: None,
        }
    }

    /// Why the session must end so the mirror joins again, once it must.
    pub(super) fn rejoin(&self) -> Option<&str> {
        self.rejoin.as_deref()
    }

    /// The local key of an upstream stream URL, which must be in the mirrored bucket, and be
    /// the stream followed when only one is: an upstream speaks for nothing else here.
    /// The upstream percent-encodes the name in the IRI; any name a bucket can hold (S2's rule,
    /// which allows `/`) maps to the same name here.
    fn key_of(&self, url: &str) -> Result<String, MirrorError> {
        let path = streamld::iri_path(url)
            .ok_or_else(|| MirrorError::BadMessage(format!("stream URL {url}")))?;
        let stream = path
            .strip_prefix(&names::bucket_prefix(&self.upstream.bucket))
            .ok_or_else(|| {
                MirrorError::BadMessage(format!("stream {url} is outside the mirrored bucket"))
            })?;
        if self
            .upstream
            .stream
            .as_deref()
            .is_some_and(|followed| followed != stream)
        {
            return Err(MirrorError::BadMessage(format!(
                "stream {url} is not the stream followed"
            )));
        }
        stream_key(&self.upstream.bucket, stream)
    }

    /// Remembers how far the upstream is, for the mirror's replication lag.
    fn note_upstream_tail(&mut self, frame: &streamld::ReplicationFrame) {
        if let Some(next) = frame.upstream_next {
            self.upstream_tails
                .insert(frame.event.stream_id.clone(), next.saturating_sub(1));
        }
    }

    /// The mirror of the stream at `url`; a new one is made in one step, with the upstream's
    /// snapshot fetched first.
    async fn stream(&self, url: &str) -> Result<Arc<Stream>, MirrorError> {
        let key = self.key_of(url)?;
        let state = self
            .states
            .get(url)
            .ok_or_else(|| MirrorError::BadMessage(format!("records of {url} before its state")))?;
        match self.service.find(&key, false).await {
            Ok(stream) => return Ok(stream),
            Err(StreamError::NotFound) => {}
            Err(e) => return Err(e.into()),
        }
        let blob = self.fetch_snapshot(url, state.snapshot.as_ref()).await?;
        Ok(self
            .service
            .mirror_stream(&key, &self.upstream.base, state, blob)
            .await?)
    }

    async fn apply_state(&mut self, message: &StreamState) -> Result<(), MirrorError> {
        let bad = |what: &str| {
            MirrorError::BadMessage(format!("{what} in the state of {}", message.stream))
        };
        let offset = |token: &str| Offset::parse_token(token).map_err(|_| bad("offset"));
        let state = ReplicatedState {
            content_type: message.content_type.clone(),
            closed: message.closed,
            attrs: message.attrs.clone(),
            ttl_secs: message.ttl_secs,
            expires_at_ms: message.expires_at_ms,
            retained_from: offset(&message.retained_from)?,
            tail: offset(&message.tail)?,
            snapshot: match &message.snapshot {
                Some(s) => Some(SnapshotInfo {
                    offset: offset(&s.offset)?,
                    content_type: s.content_type.clone(),
                    digest: s.digest.clone(),
                }),
                None => None,
            },
            created_ms: message.created_ms,
            cipher: message.cipher.clone(),
            key_fingerprint: message.key_fingerprint.clone(),
        };
        self.states.insert(message.stream.clone(), state.clone());
        let stream = self.stream(&message.stream).await?;
        let local = self.service.replicated_state(&stream)?;
        if local.cipher != state.cipher {
            // A copy made before ciphers were replicated holds sealed bodies as plain ones.
            return self
                .rebuild_diverged(&message.stream, "the upstream stream is sealed otherwise")
                .await;
        }
        if local.created_ms != state.created_ms {
            // Deleted and created again upstream while the mirror was not looking: the copy
            // holds the old stream's records.
            return self
                .rebuild_diverged(&message.stream, "the upstream stream was created anew")
                .await;
        }
        stream
            .upstream_tail
            .fetch_max(state.tail.seq, std::sync::atomic::Ordering::Relaxed);
        let new_snapshot = (state.snapshot.as_ref())
            .filter(|snapshot| !self.service.has_snapshot(&stream, snapshot));
        let blob = self.fetch_snapshot(&message.stream, new_snapshot).await?;
        Ok(self.service.mirror_state(&stream, &state, blob).await?)
    }

    /// The blob of the upstream's `snapshot` of the stream at `url`, when there is one to fetch.
    async fn fetch_snapshot(
        &self,
        url: &str,
        snapshot: Option<&SnapshotInfo>,
    ) -> Result<Option<Bytes>, MirrorError> {
        let Some(snapshot) = snapshot else {
            return Ok(None);
        };
        let response = self
            .http
            .get(format!("{url}/snapshot/{}", snapshot.offset))
            .send()
            .await?;
        if response.status() == reqwest::StatusCode::NOT_FOUND {
            return Err(MirrorError::SnapshotGone(url.to_string()));
        }
        let blob = response.error_for_status()?.bytes().await?;
        // Checked as it arrived: a blob that is not the snapshot described is never stored.
        let (blob, digest) = crate::service::heavy::by_size(blob.len(), {
            let content_type = snapshot.content_type.clone();
            move || {
                let digest = crate::service::snapshot_digest(&content_type, &blob);
                (blob, digest)
            }
        })
        .await;
        if digest != snapshot.digest {
            return Err(MirrorError::BadMessage(format!(
                "the snapshot of {url} at {} does not match its digest",
                snapshot.offset
            )));
        }
        Ok(Some(blob))
    }

    async fn apply_records(&mut self, records: Vec<(String, Record)>) -> Result<(), MirrorError> {
        let mut run: Vec<Record> = Vec::new();
        let mut run_url = String::new();
        for (url, record) in records {
            if url != run_url && !run.is_empty() {
                self.apply_run(&run_url, std::mem::take(&mut run)).await?;
                if self.rejoin.is_some() {
                    return Ok(());
                }
            }
            run_url = url;
            run.push(record);
        }
        if !run.is_empty() {
            self.apply_run(&run_url, run).await?;
        }
        Ok(())
    }

    async fn apply_run(&mut self, url: &str, records: Vec<Record>) -> Result<(), MirrorError> {
        let stream = self.stream(url).await?;
        if let Some(tail) = self.upstream_tails.get(url) {
            stream
                .upstream_tail
                .fetch_max(*tail, std::sync::atomic::Ordering::Relaxed);
        }
        match self.service.mirror_records(&stream, records).await {
            // The records do not continue the copy: it is not the upstream's stream any more.
            Err(StreamError::Conflict(why)) => self.rebuild_diverged(url, why).await,
            applied => Ok(applied?),
        }
    }

    /// The mirror of `url` no longer matches its upstream: rebuild it from the upstream's state,
    /// then end the session, so the mirror joins again with the rebuilt copy's cursor.
    async fn rebuild_diverged(&mut self, url: &str, why: &str) -> Result<(), MirrorError> {
        tracing::warn!(stream = %url, reason = why, "the mirror diverged from its upstream: rebuilding it");
        self.rebuild_from_upstream(url).await?;
        self.rejoin = Some(format!("rebuilt {url}: {why}"));
        Ok(())
    }

    /// Starts the mirror of `url` over from the upstream's last state: at its retained start,
    /// with its snapshot (fetched first: readers keep the old copy meanwhile).
    async fn rebuild_from_upstream(&self, url: &str) -> Result<Arc<Stream>, MirrorError> {
        let key = self.key_of(url)?;
        let Some(state) = self.states.get(url) else {
            return Err(MirrorError::BadMessage(format!(
                "no state of {url} to rebuild it from"
            )));
        };
        let blob = self.fetch_snapshot(url, state.snapshot.as_ref()).await?;
        Ok(self
            .service
            .mirror_rebuild(&key, &self.upstream.base, state, blob)
            .await?)
    }

    /// Applies one message from the upstream. A frame is applied together with the frames that
    /// have already arrived after it, in one commit.
    pub(super) async fn receive(
        &mut self,
        message: Message,
        incoming: &mut Source,
        sink: &mut Sink,
    ) -> Result<(), MirrorError> {
        let Message::Frame(frame) = message else {
            return self.apply(message, sink).await;
        };
        self.note_upstream_tail(&frame);
        let mut records = vec![(frame.event.stream_id.clone(), record_of(&frame.event)?)];
        while records.len() < APPLY_BATCH {
            let Some(Some(Ok(WsMessage::Text(next)))) = incoming.next().now_or_never() else {
                break;
            };
            let Some(message) = known_message(&next)? else {
                continue;
            };
            match message {
                Message::Frame(frame) => {
                    self.note_upstream_tail(&frame);
                    records.push((frame.event.stream_id.clone(), record_of(&frame.event)?))
                }
                other => {
                    self.apply_records(std::mem::take(&mut records)).await?;
                    if self.rejoin.is_none() {
                        self.apply(other, sink).await?;
                    }
                    break;
                }
            }
        }
        self.apply_records(records).await
    }

    async fn apply(&mut self, message: Message, sink: &mut Sink) -> Result<(), MirrorError> {
        match message {
            Message::State(state) => self.apply_state(&state).await,
            Message::Deleted(deleted) => {
                let key = self.key_of(&deleted.stream)?;
                self.states.remove(&deleted.stream);
                self.upstream_tails.remove(&deleted.stream);
                self.service.mirror_remove(&key).await?;
                if self.upstream.stream.is_some() {
                    // The upstream follows a stream's one incarnation: a stream created again
                    // under the name needs a new join, after discovery finds it.
                    self.rejoin = Some(format!("{} was deleted upstream", deleted.stream));
                }
                Ok(())
            }
            Message::Gap(gap) => self.rebuild(gap, sink).await,
            Message::Frame(frame) => {
                self.apply_records(vec![(
                    frame.event.stream_id.clone(),
                    record_of(&frame.event)?,
                )])
                .await
            }
            Message::Subscribe(_) => Ok(()),
        }
    }

    /// The upstream no longer holds what the mirror needs next: join again from the copy's tail
    /// or start the copy over from the upstream's state (see [`after_gap`]).
    async fn rebuild(&mut self, gap: GapSignal, sink: &mut Sink) -> Result<(), MirrorError> {
        let url = gap.stream.clone().unwrap_or_else(|| self.upstream.url());
        if gap.oldest_available.is_none() && !self.states.contains_key(&url) {
            // Not a gap in a stream it sent: the upstream does not serve the target at all.
            return Err(MirrorError::NotServed(url));
        }
        let copy = match self.service.find(&self.key_of(&url)?, false).await {
            Ok(stream) => Some(stream),
            Err(StreamError::NotFound) => None,
            Err(e) => return Err(e.into()),
        };
        let held = (self.states.get(&url)).map(|state| state.retained_from.seq..=state.tail.seq);
        let copy_tail = copy.as_ref().map(|stream| stream.durable().tail.seq);
        let (after, last_timestamp) = match after_gap(&gap, held, copy_tail) {
            GapAction::JoinAgain => {
                tracing::info!(stream = %url, oldest_available = ?gap.oldest_available, "gap: joining again from the copy's tail");
                copy.map_or((0, None), |stream| cursor_of(&stream.durable()))
            }
            GapAction::Rebuild => {
                if gap.diverged {
                    tracing::warn!(stream = %url, "the upstream holds other records than the mirror's copy (restored from an older backup?): rebuilding the copy from the upstream");
                } else {
                    tracing::info!(stream = %url, oldest_available = ?gap.oldest_available, "gap: rebuilding the mirror from the upstream");
                }
                cursor_of(&self.rebuild_from_upstream(&url).await?.durable())
            }
        };
        let join = SubscriptionRequest {
            stream: url,
            after: Some(after),
            last_timestamp,
            ..Default::default()
        };
        sink.send(WsMessage::Text(Message::Subscribe(join).to_json().into()))
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
