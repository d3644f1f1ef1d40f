//! One mirror's life: reconnecting with backoff, and each replication session joined with the
//! cursors the mirror holds, its messages handed to the [`Mirror`] that applies them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message as WsMessage;

use super::discovery::{Discovered, discover};
use super::error::MirrorError;
use super::health::MirrorHealth;
use super::mirror::{Mirror, cursor_of, known_message};
use super::upstream::{Upstream, stream_key};
use crate::model::names;
use crate::model::streamld::{Message, SubscriptionRequest};
use crate::service::{StreamError, StreamService};

const MIN_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A session quiet this long is pinged; one quiet for twice as long is taken for dead (a
/// connection dropped without a close, by a NAT or a failed host) and the mirror reconnects.
const QUIET: Duration = Duration::from_secs(20);
/// The largest message the mirror takes: a record of the largest body any Runnel accepts
/// (`--max-body-bytes` at its highest) in its envelope, where it takes at most twice its size
/// (text of quotes and backslashes, each escaped; base64 takes 4/3). (tungstenite's default of
/// 16 MiB stopped a 13 MiB record, and with it the whole bucket, for good.)
const MAX_MESSAGE_BYTES: usize = 2 * crate::config::MAX_BODY_BYTES_LIMIT + (1 << 20);

/// How a mirror reaches its upstreams: the token it presents, if any, and the TLS it trusts for
/// `https` and `wss` (see [`tls::client_config`]).
#[derive(Clone)]
pub struct Credentials {
    pub token: Option<String>,
    pub tls: Arc<tokio_rustls::rustls::ClientConfig>,
}

/// Follows `url` for as long as the server runs, reconnecting with backoff, and keeps `health`
/// told whether it has a session. With a token, every request to the upstream carries it as a
/// bearer token.
pub async fn follow(
    service: Arc<StreamService>,
    url: String,
    credentials: Credentials,
    health: Arc<MirrorHealth>,
) {
    let upstream = match Upstream::parse(&url) {
        Ok(upstream) => upstream,
        Err(e) => {
            tracing::error!(error = %e, "cannot mirror");
            health.disconnected(&url, Some(e.to_string()), std::time::Instant::now());
            return;
        }
    };
    let authorization = match credentials.token.as_deref().map(bearer).transpose() {
        Ok(authorization) => authorization,
        Err(e) => {
            tracing::error!(error = %e, "cannot mirror");
            health.disconnected(&url, Some(e.to_string()), std::time::Instant::now());
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
            health.disconnected(&url, Some(e.to_string()), std::time::Instant::now());
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
        let ended = follow_once(&service, &connection, &upstream, &url, &health).await;
        let error = ended.as_ref().err().map(ToString::to_string);
        health.disconnected(&url, error, std::time::Instant::now());
        match ended {
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
    url: &str,
    health: &MirrorHealth,
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
    // The upstream upgraded the session and has the join: the mirror follows it (a bucket with
    // no streams yet sends nothing more). A join it refuses ends the session, and with it this.
    health.connected(url, std::time::Instant::now());

    let mut mirror = Mirror::new(service, http, upstream);
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
        if let Some(why) = mirror.rejoin() {
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
