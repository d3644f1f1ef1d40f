//! The Durable Streams face at `/v1/stream/{path}`: the base protocol over HTTP.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::Response;

use super::ds_view::{
    CACHE_HISTORIC, ChunkHead, Read, content_type, describe_chunk, etag_of, ok_with, render,
    set_record_range,
};
use super::error::{Handled, empty, set, set_number, set_tail};
use super::gather::Pieces;
use super::header_names;
use super::origin::Origin;
use super::request::{self, Query, Rejection};
use super::{AppState, long_poll, sse};
use crate::model::headers as hv;
use crate::model::records::{self, ReadParams, ReadView};
use crate::model::{Offset, ReadFrom, attrs, names};
use crate::service::{
    AppendAck, AppendRequest, BodyRange, CreateRequest, ForkRequest, ReadChunk, SharedBody,
    SharedRead, StreamError, StreamInfo,
};

pub(super) use super::ds_view::{advertise_records, set_record_bounds};

pub const EXPOSED_HEADERS: &str = "Stream-Next-Offset, Stream-Cursor, Stream-Up-To-Date, Stream-Closed, \
    Stream-TTL, Stream-Expires-At, Stream-SSE-Data-Encoding, Producer-Epoch, Producer-Seq, \
    Producer-Expected-Seq, Producer-Received-Seq, Stream-Extensions, Stream-Record-First, \
    Stream-Record-Start, Stream-Record-Next, Stream-Snapshot-Offset, Stream-Snapshot-Digest, \
    Stream-Retained-Offset, Stream-Data-Content-Type, ETag, Content-Type, Content-Encoding, Location, Vary";

const ALLOWED_METHODS: &str = "GET, POST, PUT, DELETE, HEAD, OPTIONS";
const ALLOWED_HEADERS: &str = "Content-Type, Authorization, If-None-Match, Stream-Seq, Stream-TTL, \
    Stream-Expires-At, Stream-Closed, Stream-Forked-From, Stream-Fork-Offset, Stream-Fork-Sub-Offset, \
    Stream-Attrs, Stream-Record-Match, Stream-Snapshot-Match, Producer-Id, Producer-Epoch, Producer-Seq, \
    Last-Event-ID";

/// Every base-protocol operation on the stream `key`, whichever surface addressed it. Takes the
/// request whole: extracting the URI and headers separately would copy them on every append.
pub async fn stream_request(app: &AppState, key: String, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let (method, uri, headers) = (parts.method, &parts.uri, &parts.headers);
    let query = uri.query();
    let advertise =
        matches!(method, Method::GET | Method::HEAD) && names::bucket_of(&key).is_some();
    // Every branch but the append is boxed: a request's future is as large as its largest
    // branch, and the append, by far the most frequent, would otherwise carry (and copy into
    // its box) the read's and the create's state too.
    let result = match method {
        Method::PUT => {
            Box::pin(create(
                app,
                key.clone(),
                uri,
                headers,
                &parts.extensions,
                body,
            ))
            .await
        }
        Method::POST => append(app, &key, headers, body).await,
        Method::GET => Box::pin(read(app, &key, query, headers)).await,
        Method::HEAD => Box::pin(head(app, &key)).await,
        Method::DELETE => Box::pin(delete(app, &key)).await,
        Method::OPTIONS => Ok(preflight()),
        _ => Ok(super::method_not_allowed(HeaderValue::from_static(
            ALLOWED_METHODS,
        ))),
    };
    let mut response = result.unwrap_or_else(|failure| failure.into_response_at(uri));
    // A 404 or 410 names the endpoint too: there a mirror hears from this server itself whether
    // the stream is gone, where a bare 404 may be a proxy's.
    let status = response.status();
    if advertise
        && (status.is_success() || status == StatusCode::NOT_FOUND || status == StatusCode::GONE)
    {
        // Worked out here, not up front: appends, the bulk of requests, never need it.
        let origin = Origin::of(headers, uri, &parts.extensions);
        set(
            &mut response,
            "link",
            &super::streamld::links(&origin, uri.path(), true),
        );
    }
    response
}

pub fn preflight() -> Response {
    let mut response = empty(StatusCode::NO_CONTENT);
    let headers = response.headers_mut();
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static(ALLOWED_METHODS),
    );
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static(ALLOWED_HEADERS),
    );
    headers.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("86400"),
    );
    response
}

/// Resolves `Stream-Forked-From` (a stream's path on this server, or an absolute URL to it) to
/// the stream's key. A URL naming another server is refused: a fork's source must be here.
fn fork_source_key(value: &str, here: &Origin) -> Result<String, Rejection> {
    let path = match value.find("://") {
        Some(scheme_end) if !value.starts_with('/') => {
            if !here.addresses(value) {
                return Err(Rejection::bad_request(
                    "Stream-Forked-From names a stream on another server: a fork's source \
                     must be a stream of this server",
                ));
            }
            let after = &value[scheme_end + 3..];
            after.find('/').map_or("", |slash| &after[slash..])
        }
        _ => value,
    };
    let path = path.split(['?', '#']).next().unwrap_or_default();
    let decoded = names::decode_path(path)
        .map_err(|e| Rejection::bad_request(format!("Stream-Forked-From: {e}")))?;
    names::stream_key_of_path(&decoded)
        .map_err(|e| Rejection::bad_request(format!("Stream-Forked-From: {e}")))
}

async fn create(
    app: &AppState,
    name: String,
    uri: &Uri,
    headers: &HeaderMap,
    extensions: &axum::http::Extensions,
    body: Body,
) -> Handled {
    let ttl_secs = request::header(headers, "stream-ttl")?
        .map(hv::parse_ttl)
        .transpose()?;
    let expires_at_ms = request::header(headers, "stream-expires-at")?
        .map(hv::parse_expires_at)
        .transpose()?;
    if ttl_secs.is_some() && expires_at_ms.is_some() {
        return Err(
            Rejection::bad_request("send Stream-TTL or Stream-Expires-At, not both").into(),
        );
    }
    let forked_from = request::header(headers, "stream-forked-from")?;
    let fork_offset = request::header(headers, "stream-fork-offset")?;
    let sub_offset = request::header(headers, "stream-fork-sub-offset")?
        .map(hv::parse_sub_offset)
        .transpose()?;
    let fork = match forked_from {
        None if fork_offset.is_some() || sub_offset.is_some() => {
            return Err(Rejection::bad_request("fork headers require Stream-Forked-From").into());
        }
        None => None,
        Some(source) => {
            let offset = fork_offset
                .map(|o| match ReadFrom::parse(o) {
                    Ok(ReadFrom::At(offset)) => Ok(offset),
                    Ok(ReadFrom::Start) => Ok(Offset::START),
                    _ => Err(Rejection::bad_request(
                        "Stream-Fork-Offset must be an offset from this server",
                    )),
                })
                .transpose()?;
            let sub_offset = sub_offset.unwrap_or(0);
            if sub_offset > 0 && offset.is_none() {
                return Err(Rejection::bad_request(
                    "Stream-Fork-Sub-Offset requires Stream-Fork-Offset",
                )
                .into());
            }
            let source = fork_source_key(source, &Origin::of(headers, uri, extensions))?;
            // A fork reads its source: the caller must be allowed to (403 before the source is
            // looked up, so the answer says nothing of whether it exists).
            if !super::auth::may_read(extensions, &source) {
                return Err(StreamError::Forbidden(
                    "the access token does not permit reading the fork's source".into(),
                )
                .into());
            }
            Some(ForkRequest {
                source,
                offset,
                sub_offset,
            })
        }
    };
    let request = CreateRequest {
        name,
        content_type: request::header(headers, &header::CONTENT_TYPE)?.map(str::to_owned),
        ttl_secs,
        expires_at_ms,
        closed: hv::is_closed_flag(request::header(headers, &header_names::STREAM_CLOSED)?),
        body: request::body(headers, body, app.config.body).await?,
        fork,
        attrs: request::header(headers, "stream-attrs")?
            .map(|v| attrs::parse(v.as_bytes()))
            .transpose()
            .map_err(|e| Rejection::bad_request(e.to_string()))?
            .flatten(),
        cipher: None,
        mirror: None,
        s2_creation: None,
        s2_config: None,
    };
    let outcome = app.service.create(request).await?;
    let (info, created) = (&outcome.info, outcome.created);
    let mut response = empty(if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    });
    describe(&mut response, info);
    if info.json {
        set_record_range(&mut response, outcome.records);
    }
    if created {
        set(
            &mut response,
            "location",
            &format!(
                "{}{}",
                Origin::of(headers, uri, extensions).http(),
                uri.path()
            ),
        );
    }
    Ok(response)
}

/// The metadata headers of PUT and HEAD responses.
fn describe(response: &mut Response, info: &StreamInfo) {
    set(response, "content-type", &info.content_type);
    set_tail(response, info.tail, info.closed);
    if info.json {
        advertise_records(response);
    }
    if let Some(ttl) = info.ttl_secs {
        set(response, "stream-ttl", &ttl.to_string());
    }
    if let Some(at) = info.expires_at_ms {
        set(response, "stream-expires-at", &hv::format_timestamp(at));
    }
}

async fn append(app: &AppState, name: &str, headers: &HeaderMap, body: Body) -> Handled {
    let producer = hv::parse_producer(
        request::header(headers, &header_names::PRODUCER_ID)?,
        request::header(headers, &header_names::PRODUCER_EPOCH)?,
        request::header(headers, &header_names::PRODUCER_SEQ)?,
    )?;
    let close = hv::is_closed_flag(request::header(headers, &header_names::STREAM_CLOSED)?);
    let content_type = request::header(headers, &header::CONTENT_TYPE)?;
    // Placed among the stream's appends in flight before the body arrives: see `arrive`.
    let arrival = app
        .service
        .arrive(name, producer.as_ref().map(|claim| claim.id.as_str()))
        .await;
    let body = request::body(headers, body, app.config.body).await?;
    if body.is_empty() && !close {
        return Err(Rejection::bad_request(
            "an append needs a body (or Stream-Closed: true to close)",
        )
        .into());
    }
    if !body.is_empty() && content_type.is_none() {
        return Err(Rejection::bad_request("an append with a body needs a Content-Type").into());
    }
    let has_body = !body.is_empty();
    let record_match = request::header(headers, &header_names::STREAM_RECORD_MATCH)?
        .map(|v| {
            hv::parse_canonical_u64(v).ok_or_else(|| {
                Rejection::bad_request("Stream-Record-Match must be a non-negative integer")
            })
        })
        .transpose()?;
    let request = AppendRequest {
        content_type,
        body,
        close,
        producer,
        stream_seq: request::header(headers, &header_names::STREAM_SEQ)?,
        record_match,
    };
    let ack = app.service.append_arrived(name, request, arrival).await?;
    let mut response = acknowledge(&ack, has_body);
    if ack.record_aware {
        advertise_records(&mut response);
        if let Some(records) = ack.records {
            set_record_range(&mut response, records);
        }
    }
    Ok(response)
}

fn acknowledge(ack: &AppendAck, has_body: bool) -> Response {
    // A producer's accepted append with data answers 200; everything else has nothing to say.
    let status = if ack.producer.is_some() && has_body && !ack.duplicate {
        StatusCode::OK
    } else {
        StatusCode::NO_CONTENT
    };
    let mut response = empty(status);
    set_tail(&mut response, ack.tail, ack.closed);
    if let Some((epoch, seq)) = ack.producer {
        set_number(&mut response, header_names::PRODUCER_EPOCH, epoch);
        set_number(&mut response, header_names::PRODUCER_SEQ, seq);
    }
    response
}

async fn head(app: &AppState, name: &str) -> Handled {
    let (stream, info) = app.service.head(name).await?;
    let mut response = empty(StatusCode::OK);
    describe(&mut response, &info);
    if info.json {
        set_record_bounds(&mut response, info.first.seq, info.tail.seq);
    }
    if let Some(snapshot) = &info.snapshot {
        set(
            &mut response,
            "stream-snapshot-offset",
            &snapshot.offset.to_string(),
        );
        set(&mut response, "stream-snapshot-digest", &snapshot.digest);
    }
    if let (Some(upstream), Some((records, seconds))) =
        (&stream.mirror_of, app.service.replication_lag(&stream))
    {
        set(&mut response, "stream-mirror-of", upstream);
        set(
            &mut response,
            "stream-replication-lag-records",
            &records.to_string(),
        );
        set(
            &mut response,
            "stream-replication-lag-seconds",
            &seconds.to_string(),
        );
    }
    set(&mut response, "cache-control", "no-store");
    Ok(response)
}

async fn delete(app: &AppState, name: &str) -> Handled {
    app.service.delete(name).await?;
    Ok(empty(StatusCode::NO_CONTENT))
}

/// How a GET wants its data.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Live {
    No,
    LongPoll,
    Sse,
}

async fn read(app: &AppState, name: &str, query: Option<&str>, headers: &HeaderMap) -> Handled {
    let query = Query::parse(query);
    let offset = query.get("offset")?;
    let record_read = records::parse_record_read(&ReadParams {
        offset,
        record: query.get("record")?,
        tail_records: query.get("tail_records")?,
        max_records: query.get("max_records")?,
        max_bytes: query.get("max_bytes")?,
        record_view: query.get("record_view")?,
    })
    .map_err(Rejection::bad_request)?;
    let from = match offset {
        None => ReadFrom::Start,
        Some(value) => ReadFrom::parse(value).map_err(|e| Rejection::bad_request(e.to_string()))?,
    };
    let live = match query.get("live")? {
        None => Live::No,
        Some("long-poll") => Live::LongPoll,
        Some("sse") => Live::Sse,
        Some(other) => {
            return Err(Rejection::bad_request(format!("unknown live mode {other:?}")).into());
        }
    };
    if live != Live::No && offset.is_none() && record_read.is_none() {
        return Err(Rejection::bad_request("live reads need an offset").into());
    }
    let client_cursor = query.get("cursor")?.and_then(|c| c.parse::<u64>().ok());
    // Read before the start is resolved, which renews the stream: a refused request renews
    // nothing.
    let if_none_match = match live {
        Live::No => request::header(headers, "if-none-match")?,
        Live::Sse | Live::LongPoll => None,
    };
    let stream = app.service.find(name, false).await?;
    let (start, view, max_records) = match record_read {
        Some(read) => {
            let start = app.service.resolve_record(&stream, read.start).await?;
            (start, ReadView::Records(read.view), read.max_records)
        }
        None => (
            app.service.resolve(&stream, from).await?,
            ReadView::Canonical,
            None,
        ),
    };
    let read = Read {
        stream,
        start,
        view,
        max_records,
        client_cursor,
    };
    match live {
        Live::Sse => Ok(sse::respond(app, read)),
        Live::LongPoll => long_poll::respond(app, read).await,
        Live::No => {
            if max_records.is_none()
                && let Some(shared) = app.service.shared_body(&read.stream, start, view)
            {
                return Ok(catch_up_shared(&read, &shared, if_none_match));
            }
            let chunk = app
                .service
                .read_history_at(&read.stream, start, max_records)
                .await?;
            let at_now = from == ReadFrom::Now && view == ReadView::Canonical;
            Ok(catch_up(app, &read, chunk, at_now, if_none_match))
        }
    }
}

/// Catch-up bodies of at least this many bytes are left for other readers of the same range.
/// Below it, the in-memory file that holds one costs more than reading and rendering it again.
const SHARE_FROM: u64 = 64 << 10;

/// A catch-up read's answer from the records just read; a large body is left for the next
/// readers of the same range.
fn catch_up(
    app: &AppState,
    read: &Read,
    chunk: ReadChunk,
    at_now: bool,
    if_none_match: Option<&str>,
) -> Response {
    let head = ChunkHead::of(&chunk);
    answer(read, &head, at_now, if_none_match, || {
        let (content_type, body) = render(read, &chunk.records);
        // A chunk cut short to spare memory would keep its later readers on short chunks (one
        // that reached the tail is whole).
        let cut_short = chunk.cut_for_memory && !chunk.up_to_date;
        let ordinary = read.max_records.is_none() && !cut_short;
        if body.byte_len() < SHARE_FROM || !ordinary {
            return (content_type, body.holding(chunk.lease));
        }
        let range = BodyRange {
            start: head.start,
            next: head.next,
            short_of_tail: !head.up_to_date,
            first_shown: head.first_shown,
        };
        let shared = Arc::new(SharedBody::new(
            range,
            body.into_iter().collect(),
            chunk.lease,
        ));
        app.service
            .share_body(&read.stream, read.view, shared.clone());
        let body = Pieces::shared(shared.clone(), &shared.pieces());
        (content_type, body)
    })
}

/// A catch-up read's answer from a body another read left.
fn catch_up_shared(read: &Read, shared: &SharedRead, if_none_match: Option<&str>) -> Response {
    answer(
        read,
        &ChunkHead::of_shared(shared),
        false,
        if_none_match,
        || {
            let pieces = shared.body.pieces_for_another_reader();
            (
                content_type(read),
                Pieces::shared(shared.body.clone(), &pieces),
            )
        },
    )
}

/// A catch-up read's answer: the body `render` makes, or 304 when the client holds it already.
fn answer<'a>(
    read: &'a Read,
    head: &ChunkHead,
    at_now: bool,
    if_none_match: Option<&str>,
    render: impl FnOnce() -> (&'a str, Pieces),
) -> Response {
    let etag = etag_of(read, head);
    let mut response = if !at_now && if_none_match.is_some_and(|tags| matches_etag(tags, &etag)) {
        empty(StatusCode::NOT_MODIFIED)
    } else {
        let (content_type, body) = render();
        ok_with(content_type, body)
    };
    describe_chunk(&mut response, read, head);
    if at_now {
        set(&mut response, "cache-control", "no-store");
    } else {
        set(&mut response, "etag", &etag);
        set(
            &mut response,
            "cache-control",
            if head.up_to_date {
                "no-cache"
            } else {
                CACHE_HISTORIC
            },
        );
    }
    response
}

/// Whether an `If-None-Match` list names `etag`, by weak comparison (RFC 9110 §13.1.2): a
/// `W/` prefix is ignored (proxies that compress weaken tags), and `*` matches.
fn matches_etag(if_none_match: &str, etag: &str) -> bool {
    if_none_match
        .split(',')
        .map(str::trim)
        .any(|tag| tag == "*" || tag.strip_prefix("W/").unwrap_or(tag) == etag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn if_none_match_compares_weakly_and_star_matches() {
        let tag = "\"7:a:b\"";
        assert!(matches_etag("\"7:a:b\"", tag));
        assert!(matches_etag("\"x\", W/\"7:a:b\"", tag));
        assert!(matches_etag("*", tag));
        assert!(!matches_etag("\"7:a:c\", W/\"x\"", tag));
    }
}
