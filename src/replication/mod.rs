//! Mirror mode: follow an upstream Runnel's bucket or stream over the StreamLD WebSocket
//! replication binding, reproducing it exactly and read-only.
//!
//! The mirror's cursor for a stream is its own tail: records and the tail are committed together,
//! so after any crash the mirror resumes from exactly what it durably holds. A `GapSignal` (the
//! upstream no longer has what comes next) rebuilds the stream from the upstream's retained
//! start and snapshot, then follows again.

use std::collections::{BTreeMap, HashMap};
use std::ops::RangeInclusive;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::{FutureExt, SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message as WsMessage;

use crate::model::stream::SnapshotInfo;
use crate::model::streamld::{self, GapSignal, Message, StreamState, SubscriptionRequest};
use crate::model::{Offset, Record, names};
use crate::service::{Durable, ReplicatedState, Stream, StreamError, StreamService};

pub mod tls;

const MIN_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Frames applied in one commit at most.
const APPLY_BATCH: usize = 1000;
/// A session quiet this long is pinged; one quiet for twice as long is taken for dead (a
/// connection dropped without a close, by a NAT or a failed host) and the mirror reconnects.
const QUIET: Duration = Duration::from_secs(20);
/// The largest message the mirror takes: a record of the largest body any Runnel accepts
/// (`--max-body-bytes` at its highest) in its envelope, where it takes at most twice its size
/// (text of quotes and backslashes, each escaped; base64 takes 4/3). (tungstenite's default of
/// 16 MiB stopped a 13 MiB record, and with it the whole bucket, for good.)
const MAX_MESSAGE_BYTES: usize = 2 * crate::config::MAX_BODY_BYTES_LIMIT + (1 << 20);

#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    #[error(
        "upstream {0} is not a bucket or bucketed stream URL (http[s]://host:port/bucket[/stream])"
    )]
    BadUrl(String),
    #[error("upstream request failed: {}", with_causes(.0))]
    Http(#[from] reqwest::Error),
    #[error("upstream {0} advertises no StreamLD websocket-replication Link")]
    NoEndpoint(String),
    #[error("upstream {0} does not exist (404 or 410)")]
    Missing(String),
    #[error("websocket: {0}")]
    WebSocket(#[from] tokio_tungstenite::tungstenite::Error),
    #[error(
        "upstream does not serve {0} to this mirror (it does not exist there, or the mirror's token may not read it)"
    )]
    NotServed(String),
    #[error("upstream sent an unusable message: {0}")]
    BadMessage(String),
    #[error("upstream no longer serves the snapshot of {0}")]
    SnapshotGone(String),
    #[error(transparent)]
    Stream(#[from] StreamError),
}

/// An error with the causes under it (reqwest's own message leaves out why a request failed,
/// such as a certificate the mirror does not trust).
fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        cause = inner.source();
    }
    text
}

/// What a mirror follows.
#[derive(Clone, Debug)]
struct Upstream {
    /// `scheme://host:port`
    base: String,
    bucket: String,
    /// One stream of the bucket, or all of them.
    stream: Option<String>,
}

impl Upstream {
    fn parse(url: &str) -> Result<Upstream, MirrorError> {
        let bad = || MirrorError::BadUrl(url.to_string());
        let (scheme, rest) = url
            .split_once("://")
            .filter(|(scheme, _)| matches!(*scheme, "http" | "https"))
            .ok_or_else(bad)?;
        let (host, path) = rest.split_once('/').ok_or_else(bad)?;
        let path = percent_encoding::percent_decode_str(path.trim_end_matches('/'))
            .decode_utf8()
            .map_err(|_| bad())?;
        let mut segments = path.splitn(2, '/');
        let bucket = segments
            .next()
            .filter(|b| names::validate_bucket_id(b).is_ok())
            .ok_or_else(bad)?;
        let stream = segments.next().map(str::to_string);
        if let Some(stream) = &stream {
            names::stream_key_in(bucket, stream).map_err(|_| bad())?;
        }
        Ok(Upstream {
            base: format!("{scheme}://{host}"),
            bucket: bucket.to_string(),
            stream,
        })
    }

    fn url(&self) -> String {
        match &self.stream {
            Some(stream) => format!("{}/{}/{}", self.base, self.bucket, encode(stream)),
            None => format!("{}/{}", self.base, self.bucket),
        }
    }
}

/// The bucket a `--mirror-from` URL mirrors whole, and its upstream (`scheme://host:port`);
/// `None` for the URL of one stream, or one that does not parse (`follow` reports that).
pub fn mirrored_bucket(url: &str) -> Option<(String, String)> {
    Upstream::parse(url)
        .ok()
        .filter(|upstream| upstream.stream.is_none())
        .map(|upstream| (upstream.bucket, upstream.base))
}

/// The stream a `--mirror-from` URL mirrors alone (its key), and its upstream
/// (`scheme://host:port`); `None` for the URL of a bucket, or one that does not parse.
pub fn mirrored_stream(url: &str) -> Option<(String, String)> {
    let upstream = Upstream::parse(url).ok()?;
    let key = stream_key(&upstream.bucket, upstream.stream.as_deref()?).ok()?;
    Some((key, upstream.base))
}

/// Checks that no two `--mirror-from` targets overlap: the same bucket or stream twice, or a
/// stream of a bucket mirrored whole. Two sessions would then apply the same records, each
/// taking the other's for a divergence and rebuilding the copy over and over.
pub fn check_targets(urls: &[String]) -> Result<(), String> {
    let parsed: Vec<(&String, Upstream)> = urls
        .iter()
        .filter_map(|url| Upstream::parse(url).ok().map(|u| (url, u)))
        .collect();
    for (i, (url, target)) in parsed.iter().enumerate() {
        for (other_url, other) in &parsed[..i] {
            let overlap = target.bucket == other.bucket
                && (target.stream.is_none()
                    || other.stream.is_none()
                    || target.stream == other.stream);
            if overlap {
                return Err(format!(
                    "--mirror-from {other_url} and {url} overlap: each bucket or stream may be \
                     mirrored once (a bucket mirrored whole includes its streams)"
                ));
            }
        }
    }
    Ok(())
}

fn encode(segment: &str) -> String {
    percent_encoding::utf8_percent_encode(segment, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// How a mirror reaches its upstreams: the token it presents, if any, and the TLS it trusts for
/// `https` and `wss` (see [`tls::client_config`]).
#[derive(Clone)]
pub struct Credentials {
    pub token: Option<String>,
    pub tls: Arc<tokio_rustls::rustls::ClientConfig>,
}

/// Follows `url` for as long as the server runs, reconnecting with backoff. With a token, every
/// request to the upstream carries it as a bearer token.
pub async fn follow(service: Arc<StreamService>, url: String, credentials: Credentials) {
    let upstream = match Upstream::parse(&url) {
        Ok(upstream) => upstream,
        Err(e) => {
            tracing::error!(error = %e, "cannot mirror");
            return;
        }
    };
    let authorization = match credentials.token.as_deref().map(bearer).transpose() {
        Ok(authorization) => authorization,
        Err(e) => {
            tracing::error!(error = %e, "cannot mirror");
            return;
        }
    };
    let mut default_headers = reqwest::header::HeaderMap::new();
    if let Some(value) = &authorization {
        default_headers.insert(reqwest::header::AUTHORIZATION, value.clone());
    }
    let http = match reqwest::Client::builder()
        // Bounds on connecting and on each read, not on a whole response: a large snapshot
        // over a slow link takes as long as it takes, so long as its bytes keep coming.
        .connect_timeout(Duration::from_secs(30))
        .read_timeout(Duration::from_secs(30))
        .default_headers(default_headers)
        .use_preconfigured_tls((*credentials.tls).clone())
        .build()
    {
        Ok(http) => http,
        Err(e) => {
            tracing::error!(error = %e, "cannot mirror: no HTTP client");
            return;
        }
    };
    let mut backoff = MIN_BACKOFF;
    loop {
        let started = tokio::time::Instant::now();
        let connection = Connection {
            http: &http,
            authorization: authorization.as_ref(),
            tls: &credentials.tls,
        };
        match follow_once(&service, &connection, &upstream).await {
            Ok(Ended::Rejoin) => {
                // Rebuilt a stream (or lost the one followed): join again without waiting long.
                backoff = MIN_BACKOFF;
            }
            Ok(Ended::Closed) => {
                tracing::info!(upstream = %url, "replication session ended; reconnecting")
            }
            Ok(Ended::Stale) => {}
            Err(e) => {
                tracing::warn!(upstream = %url, error = %e, "replication session failed; reconnecting")
            }
        }
        if started.elapsed() > MAX_BACKOFF {
            backoff = MIN_BACKOFF;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// The `Authorization` value for a token.
fn bearer(token: &str) -> Result<reqwest::header::HeaderValue, MirrorError> {
    let mut value =
        reqwest::header::HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
            MirrorError::BadMessage("the mirror token is not a valid header value".into())
        })?;
    value.set_sensitive(true);
    Ok(value)
}

/// What discovery found at the upstream URL.
enum Discovered {
    /// The target exists, followed through this replication endpoint.
    Endpoint(String),
    /// The upstream answered 404 or 410; with the endpoint, when the answer named one (the
    /// upstream's own answer, not a proxy's), where its replication session says for certain.
    Missing(Option<String>),
}

/// Discovers the upstream's replication endpoint through its `Link` header (on a `HEAD`: the
/// mirror wants the headers, not the stream).
async fn discover(http: &reqwest::Client, upstream: &Upstream) -> Result<Discovered, MirrorError> {
    let response = http.head(upstream.url()).send().await?;
    let endpoint = replication_link(response.headers());
    // 410: deleted while forks read through it, which a mirror does not follow.
    if matches!(
        response.status(),
        reqwest::StatusCode::NOT_FOUND | reqwest::StatusCode::GONE
    ) {
        return Ok(Discovered::Missing(endpoint));
    }
    endpoint
        .map(Discovered::Endpoint)
        .ok_or_else(|| MirrorError::NoEndpoint(upstream.url()))
}

/// The StreamLD WebSocket replication endpoint a response's `Link` headers name.
fn replication_link(headers: &reqwest::header::HeaderMap) -> Option<String> {
    let links = headers
        .get_all("link")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect::<Vec<_>>()
        .join(",");
    links
        .split(',')
        .find(|link| link.contains(streamld::REL_WEBSOCKET))
        .and_then(|link| {
            link.split_once('<')?
                .1
                .split_once('>')
                .map(|(url, _)| url.trim().to_string())
        })
}

/// How a replication session ended without failing.
enum Ended {
    /// The upstream closed it.
    Closed,
    /// The mirror ended it to join again (see `Mirror::rejoin`).
    Rejoin,
    /// A snapshot named by the upstream was gone when the mirror fetched it (replaced or
    /// deleted since): join again, with the usual backoff, so that a snapshot replaced faster
    /// than the mirror can fetch it does not make it rejoin in a tight loop.
    Stale,
}

/// What a session reaches the upstream with.
struct Connection<'a> {
    http: &'a reqwest::Client,
    authorization: Option<&'a reqwest::header::HeaderValue>,
    tls: &'a Arc<tokio_rustls::rustls::ClientConfig>,
}

/// One connection: join with the cursors the mirror holds, then apply what arrives.
async fn follow_once(
    service: &Arc<StreamService>,
    connection: &Connection<'_>,
    upstream: &Upstream,
) -> Result<Ended, MirrorError> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
    let http = connection.http;
    let endpoint = match discover(http, upstream).await? {
        Discovered::Endpoint(endpoint) => endpoint,
        // The stream or bucket this mirror follows may be gone upstream (and may come back
        // later). Only the upstream's replication session says so for certain (`StreamDeleted`
        // for each stream), so the mirror joins there to hear it while it still holds copies; a
        // 404 that names no endpoint may be a proxy's, during a redeploy, and they are kept.
        Discovered::Missing(endpoint) => match endpoint {
            Some(endpoint) if holds_copies(service, upstream).await? => endpoint,
            _ => return Err(MirrorError::Missing(upstream.url())),
        },
    };
    let mut request = endpoint.as_str().into_client_request()?;
    if let Some(value) = connection.authorization {
        request
            .headers_mut()
            .insert(reqwest::header::AUTHORIZATION, value.clone());
    }
    let tls = tokio_tungstenite::Connector::Rustls(connection.tls.clone());
    let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
        .max_message_size(Some(MAX_MESSAGE_BYTES))
        .max_frame_size(Some(MAX_MESSAGE_BYTES));
    let (socket, _) =
        tokio_tungstenite::connect_async_tls_with_config(request, Some(config), true, Some(tls))
            .await?;
    let (mut sink, mut incoming) = socket.split();
    let join = match &upstream.stream {
        Some(stream) => {
            let key = stream_key(&upstream.bucket, stream)?;
            let (after, last_timestamp) = match service.find(&key, false).await {
                Ok(stream) => cursor_of(&stream.durable()),
                Err(_) => (0, None),
            };
            SubscriptionRequest {
                stream: upstream.url(),
                after: Some(after),
                last_timestamp,
                ..Default::default()
            }
        }
        None => {
            let prefix = names::bucket_prefix(&upstream.bucket);
            let mut cursors = BTreeMap::new();
            let mut last_timestamps = BTreeMap::new();
            for stream in service.bucket_streams(&upstream.bucket).iter() {
                let name = &stream.name[prefix.len()..];
                let (after, last_timestamp) = cursor_of(&stream.durable());
                cursors.insert(name.to_string(), after);
                if let Some(timestamp) = last_timestamp {
                    last_timestamps.insert(name.to_string(), timestamp);
                }
            }
            SubscriptionRequest {
                stream: upstream.url(),
                cursors: Some(cursors),
                last_timestamps: Some(last_timestamps),
                ..Default::default()
            }
        }
    };
    tracing::info!(upstream = %upstream.url(), "joining upstream");
    sink.send(WsMessage::Text(Message::Subscribe(join).to_json().into()))
        .await?;

    let mut mirror = Mirror {
        service,
        http,
        upstream,
        states: HashMap::new(),
        upstream_tails: HashMap::new(),
        rejoin: None,
    };
    let mut pinged = false;
    loop {
        let message = match tokio::time::timeout(QUIET, incoming.next()).await {
            Ok(Some(message)) => message,
            Ok(None) => break,
            Err(_) if pinged => {
                tracing::warn!(upstream = %upstream.url(), "upstream silent; reconnecting");
                return Ok(Ended::Closed);
            }
            Err(_) => {
                sink.send(WsMessage::Ping(Bytes::new())).await?;
                pinged = true;
                continue;
            }
        };
        pinged = false;
        let text = match message? {
            WsMessage::Text(text) => text,
            WsMessage::Close(_) => return Ok(Ended::Closed),
            _ => continue,
        };
        let Some(message) = known_message(&text)? else {
            continue;
        };
        match mirror.receive(message, &mut incoming, &mut sink).await {
            // Replaced or deleted upstream since the state that named it: a join again gets the
            // stream as it is now (or its deletion), where waiting for the next message would
            // leave records of a stream the mirror could not make.
            Err(MirrorError::SnapshotGone(url)) => {
                tracing::info!(upstream = %upstream.url(), stream = %url, "a snapshot named by the upstream is gone; joining again");
                return Ok(Ended::Stale);
            }
            other => other?,
        }
        if let Some(why) = &mirror.rejoin {
            tracing::info!(upstream = %upstream.url(), reason = %why, "ending the replication session to join again");
            return Ok(Ended::Rejoin);
        }
    }
    Ok(Ended::Closed)
}

/// Whether the mirror holds a copy of the stream it follows, or of any in the bucket it follows.
async fn holds_copies(service: &StreamService, upstream: &Upstream) -> Result<bool, MirrorError> {
    let Some(stream) = &upstream.stream else {
        return Ok(!service.bucket_streams(&upstream.bucket).is_empty());
    };
    match service
        .find(&stream_key(&upstream.bucket, stream)?, false)
        .await
    {
        Ok(_) => Ok(true),
        Err(StreamError::NotFound | StreamError::Gone) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// A message from the upstream; `None` for a type this mirror does not know, which a newer
/// upstream may send and which is skipped rather than ending the session.
fn known_message(text: &str) -> Result<Option<Message>, MirrorError> {
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

fn stream_key(bucket: &str, stream: &str) -> Result<String, MirrorError> {
    names::stream_key_in(bucket, stream).map_err(|e| MirrorError::BadMessage(e.to_string()))
}

/// The cursor the mirror holds for a stream (the number of records it has, which is its tail),
/// and the timestamp of its last record when it holds that record: the upstream checks it is
/// still the record it has there (timestamps never go back along a stream, so the stream's
/// latest is its last record's).
fn cursor_of(durable: &Durable) -> (u64, Option<i64>) {
    let holds_last = durable.tail.seq > durable.first.seq;
    (
        durable.tail.seq,
        holds_last.then_some(durable.last_timestamp_ms),
    )
}

struct Mirror<'a> {
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

impl Mirror<'_> {
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
    async fn receive(
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

/// What a mirror does about a gap in one of its streams.
#[derive(Debug, PartialEq, Eq)]
enum GapAction {
    /// Join again from the copy's tail; the upstream answers with its state as it is now, then
    /// the records after the tail, or the gap again.
    JoinAgain,
    /// Start the copy over from the upstream's last state: at its retained start, with its
    /// snapshot.
    Rebuild,
}

/// What to do about `gap`, given the records the upstream held when it last sent its state
/// (`held`, by ordinal) and the copy's tail.
///
/// The copy goes on from its tail when the upstream held it: so it is for a new copy of a
/// trimmed stream, made at the upstream's retained start after its join went out with cursor 0.
/// It also joins again when the gap is newer than the state, as when the upstream trimmed while
/// it sent the records before: a rebuild from that state would start the copy over at a start
/// the upstream no longer holds, behind the copy's own tail, and readers would see the stream
/// go back. The join brings the state that explains the gap.
fn after_gap(
    gap: &GapSignal,
    held: Option<RangeInclusive<u64>>,
    copy_tail: Option<u64>,
) -> GapAction {
    let Some(held) = held.filter(|_| !gap.diverged) else {
        return GapAction::Rebuild;
    };
    let copy_is_held = copy_tail.is_some_and(|tail| held.contains(&tail));
    let state_is_older =
        (gap.oldest_available).is_some_and(|oldest| oldest.saturating_sub(1) > *held.start());
    if copy_is_held || state_is_older {
        GapAction::JoinAgain
    } else {
        GapAction::Rebuild
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_mirror_targets_are_refused() {
        let urls = |list: &[&str]| list.iter().map(|u| u.to_string()).collect::<Vec<_>>();
        assert!(check_targets(&urls(&["http://a:1/docs", "http://a:1/logs/s"])).is_ok());
        assert!(check_targets(&urls(&["http://a:1/docs/x", "http://a:1/docs/y"])).is_ok());
        for overlapping in [
            ["http://a:1/docs", "http://a:1/docs/s"],
            ["http://a:1/docs/s", "http://a:1/docs"],
            ["http://a:1/docs", "http://b:2/docs"],
            ["http://a:1/docs/s", "http://b:2/docs/s"],
        ] {
            assert!(
                check_targets(&urls(&overlapping)).is_err(),
                "{overlapping:?}"
            );
        }
    }

    #[test]
    fn a_message_of_an_unknown_type_is_skipped_and_a_malformed_one_refused() {
        let unknown = r#"{"@type": "runnel:SomethingNewer", "stream": "http://h/b/s"}"#;
        assert!(known_message(unknown).unwrap().is_none());
        let gap = r#"{"@type": "GapSignal", "oldestAvailable": 3}"#;
        assert!(matches!(known_message(gap), Ok(Some(Message::Gap(_)))));
        assert!(known_message("not json").is_err());
        assert!(known_message(r#"{"@type": "GapSignal", "oldestAvailable": "x"}"#).is_err());
    }

    fn gap(oldest_seq: u64, diverged: bool) -> GapSignal {
        GapSignal {
            oldest_available: Some(streamld::sequence_of(oldest_seq)),
            diverged,
            ..Default::default()
        }
    }

    #[test]
    fn a_gap_newer_than_the_state_held_joins_again_rather_than_rebuilding_the_copy_from_it() {
        // The state said 0..=10; the copy went on to 15; the upstream then trimmed to 20.
        assert_eq!(
            after_gap(&gap(20, false), Some(0..=10), Some(15)),
            GapAction::JoinAgain
        );
        // No copy yet: the join brings the state to make it from.
        assert_eq!(
            after_gap(&gap(20, false), Some(0..=10), None),
            GapAction::JoinAgain
        );
    }

    #[test]
    fn a_gap_the_state_explains_rebuilds_the_copy_unless_the_copy_is_held() {
        assert_eq!(
            after_gap(&gap(20, false), Some(20..=30), Some(15)),
            GapAction::Rebuild
        );
        assert_eq!(
            after_gap(&gap(20, false), Some(20..=30), Some(20)),
            GapAction::JoinAgain,
            "a new copy made at the retained start goes on from there"
        );
        assert_eq!(
            after_gap(&gap(20, true), Some(20..=30), Some(25)),
            GapAction::Rebuild,
            "a diverged copy is rebuilt wherever its tail is"
        );
        assert_eq!(
            after_gap(&GapSignal::default(), None, Some(25)),
            GapAction::Rebuild
        );
    }

    #[test]
    fn upstream_urls_name_a_bucket_or_one_of_its_streams() {
        let bucket = Upstream::parse("http://127.0.0.1:9/docs").unwrap();
        assert_eq!(
            (bucket.base.as_str(), bucket.bucket.as_str(), bucket.stream),
            ("http://127.0.0.1:9", "docs", None)
        );
        let stream = Upstream::parse("http://h:1/docs/a%20b/").unwrap();
        assert_eq!(stream.stream.as_deref(), Some("a b"));
        assert_eq!(stream.url(), "http://h:1/docs/a%20b");
        let nested = Upstream::parse("http://h:1/docs/users/42").unwrap();
        assert_eq!(
            nested.stream.as_deref(),
            Some("users/42"),
            "S2 names may hold '/'"
        );
        for bad in [
            "docs",
            "ftp://h:1/docs",
            "http://h:1",
            "http://h:1/v1",
            "http://h:1/docs/%2E%2E",
        ] {
            assert!(Upstream::parse(bad).is_err(), "{bad}");
        }
    }
}
