//! The extension endpoints of bucketed streams (seed 000 §2–§5):
//! `/{bucket}/{stream}/snapshot[/{offset}]`, `/retention[/{offset}]`, `/bootstrap`,
//! `/append-batch` and `/attrs`.

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::json;

use super::AppState;
use super::buckets::json_response;
use super::ds::{self, advertise_records, set_record_bounds};
use super::error::{self, Failure, Handled, empty, set};
use super::header_names;
use super::origin::Origin;
use super::request::{self, Query, Rejection};
use super::route::Extension;
use crate::model::batch::{self, FrameError};
use crate::model::content_type::{self, DEFAULT_CONTENT_TYPE};
use crate::model::headers::{self as hv, parse_canonical_u64};
use crate::model::wire::gather::Gather;
use crate::model::{Offset, attrs, names};
use crate::service::{AppendAck, Bootstrap, Position, StreamError, StreamResult};

/// An extension endpoint of the stream `stream` of `bucket`.
pub async fn serve(
    app: &AppState,
    bucket: &str,
    stream: &str,
    extension: Extension,
    request: axum::extract::Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let (method, uri, headers) = (parts.method, &parts.uri, &parts.headers);
    let query = uri.query();
    let result = async {
        let key = stream_key(bucket, stream)?;
        let at_offset = |offset: &str| {
            Offset::parse_token(offset)
                .map_err(|e| Rejection::bad_request(format!("{e} (in the path)")))
        };
        match (&extension, &method) {
            (Extension::Snapshot, &Method::GET | &Method::HEAD) => {
                latest_snapshot(app, &key, uri).await
            }
            (Extension::Snapshot, &Method::PUT) => {
                let at = record_position(query)?;
                publish_snapshot(app, &key, at, headers, body).await
            }
            (Extension::SnapshotAt(offset), &Method::PUT) => {
                let at = Position::Offset(at_offset(offset)?);
                publish_snapshot(app, &key, at, headers, body).await
            }
            (Extension::SnapshotAt(offset), &Method::GET | &Method::HEAD) => {
                read_snapshot(app, &key, at_offset(offset)?, method).await
            }
            (Extension::SnapshotAt(offset), &Method::DELETE) => {
                app.service
                    .delete_snapshot(&key, at_offset(offset)?)
                    .await?;
                Ok(empty(StatusCode::NO_CONTENT))
            }
            (Extension::Retention, &Method::PUT) => {
                set_retention(app, &key, record_position(query)?).await
            }
            (Extension::RetentionAt(offset), &Method::PUT) => {
                set_retention(app, &key, Position::Offset(at_offset(offset)?)).await
            }
            (Extension::Bootstrap, &Method::GET) => bootstrap(app, &key, query).await,
            (Extension::AppendBatch, &Method::POST) => append_batch(app, &key, headers, body).await,
            (Extension::Attrs, &Method::GET) => read_attrs(app, &key).await,
            (Extension::Attrs, &Method::PUT) => write_attrs(app, &key, headers, body).await,
            (Extension::StreamLd, &Method::GET) => {
                // A reconnecting EventSource's Last-Event-ID wins over `?after=`.
                let after = match request::header(headers, "last-event-id")? {
                    Some(id) => Some(sse_cursor(id, "Last-Event-ID")?),
                    None => (Query::parse(query).get("after")?)
                        .map(|after| sse_cursor(after, "after"))
                        .transpose()?,
                };
                let origin = Origin::of(headers, uri, &parts.extensions);
                Ok(super::streamld::sse(app, &key, &origin.http(), after.unwrap_or(0)).await?)
            }
            (_, &Method::OPTIONS) => Ok(ds::preflight()),
            (extension, _) => Ok(super::method_not_allowed(HeaderValue::from_static(
                allowed_methods(extension),
            ))),
        }
    };
    result
        .await
        .unwrap_or_else(|failure: Failure| failure.into_response_at(uri))
}

/// The methods an extension's endpoint takes.
fn allowed_methods(extension: &Extension) -> &'static str {
    match extension {
        Extension::Snapshot => "GET, HEAD, PUT, OPTIONS",
        Extension::SnapshotAt(_) => "GET, HEAD, PUT, DELETE, OPTIONS",
        Extension::Retention | Extension::RetentionAt(_) => "PUT, OPTIONS",
        Extension::Bootstrap | Extension::StreamLd => "GET, OPTIONS",
        Extension::AppendBatch => "POST, OPTIONS",
        Extension::Attrs => "GET, PUT, OPTIONS",
    }
}

fn stream_key(bucket: &str, stream: &str) -> Result<String, Rejection> {
    names::bucket_stream_key(bucket, stream).map_err(|e| Rejection::bad_request(e.to_string()))
}

/// The StreamLD cursor in `value` (the `Last-Event-ID` header or the `after` parameter).
fn sse_cursor(value: &str, what: &str) -> Result<u64, Rejection> {
    crate::model::streamld::parse_cursor(value).ok_or_else(|| {
        Rejection::bad_request(format!(
            "{what} must be a StreamLD cursor, a non-negative integer such as an event id this stream sent (got {value:?})"
        ))
    })
}

/// The position named by `?record=N`, for the record variants of snapshot and retention.
fn record_position(query: Option<&str>) -> Result<Position, Rejection> {
    let query = Query::parse(query);
    let record = query.get("record")?.ok_or_else(|| {
        Rejection::bad_request("name an offset in the path, or a record with ?record=N")
    })?;
    parse_canonical_u64(record)
        .map(Position::Record)
        .ok_or_else(|| Rejection::bad_request("record must be a non-negative integer"))
}

async fn publish_snapshot(
    app: &AppState,
    key: &str,
    at: Position,
    headers: &HeaderMap,
    body: Body,
) -> Handled {
    // As at stream creation, a content type without the `type/subtype` shape (an empty one,
    // say) falls back to the default: bootstrap sends it as a MIME part's header.
    let content_type = request::header(headers, "content-type")?
        .filter(|given| content_type::is_well_formed(given))
        .unwrap_or(DEFAULT_CONTENT_TYPE)
        .to_string();
    let expected = request::header(headers, "stream-snapshot-match")?.map(str::to_owned);
    let blob = request::body(headers, body, app.config.body).await?;
    let (at, digest) = app
        .service
        .publish_snapshot(key, at, content_type, blob, expected.as_deref())
        .await?;
    let mut response = empty(StatusCode::NO_CONTENT);
    set(&mut response, "stream-snapshot-offset", &at.to_string());
    set(&mut response, "stream-snapshot-digest", &digest);
    Ok(response)
}

async fn latest_snapshot(app: &AppState, key: &str, uri: &Uri) -> Handled {
    let stream = app.service.find(key, false).await?;
    let info = app
        .service
        .latest_snapshot(&stream)
        .await?
        .ok_or(crate::service::StreamError::SnapshotNotFound)?;
    let offset = info.offset.to_string();
    let mut response = empty(StatusCode::TEMPORARY_REDIRECT);
    set(
        &mut response,
        "location",
        &format!("{}/{offset}", uri.path()),
    );
    set(&mut response, "stream-snapshot-offset", &offset);
    set(&mut response, "stream-snapshot-digest", &info.digest);
    Ok(response)
}

async fn read_snapshot(app: &AppState, key: &str, at: Offset, method: Method) -> Handled {
    let (stream, info, blob) = app.service.read_snapshot(key, at).await?;
    let durable = stream.durable();
    let mut response = if method == Method::HEAD {
        empty(StatusCode::OK)
    } else {
        (StatusCode::OK, blob).into_response()
    };
    set(&mut response, "content-type", &info.content_type);
    set(
        &mut response,
        "stream-snapshot-offset",
        &info.offset.to_string(),
    );
    set(&mut response, "stream-snapshot-digest", &info.digest);
    set(
        &mut response,
        "stream-next-offset",
        &info.offset.to_string(),
    );
    set(
        &mut response,
        "stream-up-to-date",
        if info.offset >= durable.tail {
            "true"
        } else {
            "false"
        },
    );
    if stream.json {
        // Next names the boundary Stream-Next-Offset does, the snapshot's (seed 000 §6.7).
        set_record_bounds(&mut response, durable.first.seq, info.offset.seq);
    }
    Ok(response)
}

async fn set_retention(app: &AppState, key: &str, at: Position) -> Handled {
    let at = app.service.set_retention(key, at).await?;
    let mut response = empty(StatusCode::NO_CONTENT);
    set(&mut response, "stream-retained-offset", &at.to_string());
    Ok(response)
}

/// A `multipart/mixed` body: the snapshot part (or an empty one), then one part per retained
/// message after it.
async fn bootstrap(app: &AppState, key: &str, query: Option<&str>) -> Handled {
    if Query::parse(query).get("live")?.is_some() {
        return Err(Rejection::bad_request(
            "bootstrap is one-shot; tail with live reads afterwards",
        )
        .into());
    }
    let Bootstrap {
        stream,
        snapshot,
        start,
        tail,
    } = app.service.bootstrap(key).await?;
    let boundary = format!("runnel-{:032x}", rand::random::<u128>());
    let snapshot_offset = snapshot
        .as_ref()
        .map_or("-1".to_string(), |(info, _)| info.offset.to_string());
    let service = app.service.clone();
    let part_header =
        |content_type: &str| format!("--{boundary}\r\nContent-Type: {content_type}\r\n\r\n");
    let first = match &snapshot {
        Some((info, blob)) => [Bytes::from(part_header(&info.content_type)), blob.clone()],
        None => [Bytes::from(part_header(DEFAULT_CONTENT_TYPE)), Bytes::new()],
    };
    let record_header = Bytes::from(format!("\r\n{}", part_header(&stream.content_type)));
    let closing = Bytes::from(format!("\r\n--{boundary}--\r\n"));
    let parts_stream = stream.clone();
    let parts = async_stream::stream! {
        for piece in first {
            yield Ok::<Bytes, std::io::Error>(piece);
        }
        let mut at = start;
        while at.seq < tail.seq {
            let chunk = match service.read_history_at(&parts_stream, at, Some(tail.seq - at.seq)).await {
                Ok(chunk) if !chunk.records.is_empty() => chunk,
                Ok(_) => break,
                Err(e) => {
                    // Ending without the closing delimiter tells the client the body is incomplete.
                    tracing::warn!(stream = %parts_stream.name, error = %e, "bootstrap read failed");
                    return;
                }
            };
            // One frame per chunk rather than two per record: small parts are copied together.
            let parts = || chunk.records.iter().filter(|r| !r.command);
            let mut gather = Gather::sized_for(
                parts().map(|r| r.body.len()),
                parts().count() * record_header.len(),
            );
            for record in parts() {
                gather.push_slice(&record_header);
                gather.push(&record.body);
            }
            for piece in gather.finish() {
                yield Ok(piece);
            }
            at = chunk.next;
        }
        yield Ok(closing);
    };
    let mut response = (StatusCode::OK, Body::from_stream(parts)).into_response();
    let headers = response.headers_mut();
    if let Ok(value) = HeaderValue::from_str(&format!("multipart/mixed; boundary={boundary}")) {
        headers.insert(header::CONTENT_TYPE, value);
    }
    set(&mut response, "stream-snapshot-offset", &snapshot_offset);
    set(&mut response, "stream-next-offset", &tail.to_string());
    set(&mut response, "stream-up-to-date", "true");
    set(&mut response, "cache-control", "no-store");
    if stream.json {
        advertise_records(&mut response);
        // First is the stream's first retained record, as HEAD says (seed 000 §6.5), even
        // where the snapshot covers the records after it.
        set_record_bounds(&mut response, stream.durable().first.seq, tail.seq);
    }
    Ok(response)
}

/// Per-append controls that a batch cannot carry (§4.2). `Stream-Closed` asks for a close only
/// when it says `true`; any other value counts as absent (base protocol).
const BATCH_REFUSED_HEADERS: [&str; 5] = [
    "producer-id",
    "producer-epoch",
    "producer-seq",
    "stream-record-match",
    "stream-seq",
];

async fn append_batch(app: &AppState, key: &str, headers: &HeaderMap, body: Body) -> Handled {
    let closes = hv::is_closed_flag(request::header(headers, &header_names::STREAM_CLOSED)?);
    if let Some(name) = BATCH_REFUSED_HEADERS
        .iter()
        .copied()
        .find(|name| headers.contains_key(*name))
        .or(closes.then_some("stream-closed"))
    {
        return Err(Rejection::bad_request(format!(
            "{name} is not supported on append-batch; use a single append"
        ))
        .into());
    }
    let content_type = request::header(headers, "content-type")?
        .ok_or_else(|| Rejection::bad_request("append-batch needs a Content-Type"))?
        .to_string();
    let body = request::body(
        headers,
        body,
        app.config.body.at_most(batch::MAX_BATCH_BYTES),
    )
    .await?;
    let frames = batch::parse_frames(&body).map_err(|e| match e {
        FrameError::TooMany => Rejection::too_large(e.to_string()),
        other => Rejection::bad_request(other.to_string()),
    })?;
    let results = app.service.append_batch(key, &content_type, frames).await?;
    let mut response = json_response(StatusCode::OK, batch_results_json(&results));
    // Record ranges in the results come with the extension's token.
    let record_aware = |r: &StreamResult<AppendAck>| r.as_ref().is_ok_and(|ack| ack.record_aware);
    if results.iter().any(record_aware) {
        advertise_records(&mut response);
    }
    Ok(response)
}

/// The JSON array of per-frame results. A success is written by hand: a 512-frame batch built
/// and serialised 512 `Value` maps, a quarter of the request's CPU time. Failures are rare and
/// go through `json!`.
fn batch_results_json(results: &[StreamResult<AppendAck>]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(2 + results.len() * 96);
    out.push('[');
    for (i, result) in results.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        match result {
            // Offsets render as digits and `_`: nothing to escape.
            Ok(ack) => {
                let _ = write!(out, r#"{{"status":204,"stream_next_offset":"{}""#, ack.tail);
                if ack.record_aware
                    && let Some((start, next)) = ack.records
                {
                    let _ = write!(
                        out,
                        r#","stream_record_start":{start},"stream_record_next":{next}"#
                    );
                }
                out.push('}');
            }
            Err(e) => {
                let (status, _) = error::describe(e);
                let mut failure = json!({
                    "status": status.as_u16(),
                    "error_code": error::error_code(e),
                    "error": e.to_string(),
                });
                if let StreamError::Closed { tail } = e {
                    failure["stream_closed"] = json!(true);
                    failure["stream_next_offset"] = json!(tail.to_string());
                }
                out.push_str(&failure.to_string());
            }
        }
    }
    out.push(']');
    out
}

async fn read_attrs(app: &AppState, key: &str) -> Handled {
    let attrs = app.service.attrs(key).await?;
    Ok(json_response(StatusCode::OK, attrs::render(&attrs)))
}

async fn write_attrs(app: &AppState, key: &str, headers: &HeaderMap, body: Body) -> Handled {
    let given = request::header(headers, "content-type")?;
    if !given.is_some_and(content_type::is_json) {
        return Err(Rejection::bad_request(
            "attributes are sent as Content-Type: application/json",
        )
        .into());
    }
    let body = request::body(
        headers,
        body,
        app.config.body.at_most(attrs::MAX_ATTRS_BYTES + 1),
    )
    .await
    .map_err(|mut r| {
        if r.status == StatusCode::PAYLOAD_TOO_LARGE {
            r.status = StatusCode::BAD_REQUEST; // §5.1: oversized attributes are a 400
        }
        r
    })?;
    let attrs = attrs::parse(&body).map_err(|e| Rejection::bad_request(e.to_string()))?;
    app.service.set_attrs(key, attrs).await?;
    Ok(empty(StatusCode::NO_CONTENT))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn ack(record_aware: bool) -> AppendAck {
        AppendAck {
            tail: Offset::new(3, 300),
            closed: false,
            producer: None,
            duplicate: false,
            records: Some((2, 3)),
            record_aware,
            timestamp_ms: 0,
        }
    }

    #[test]
    fn batch_results_are_one_json_array_with_a_result_per_frame_in_order() {
        let closed = StreamError::Closed {
            tail: Offset::new(9, 900),
        };
        let results = [Ok(ack(false)), Ok(ack(true)), Err(closed)];
        let parsed: Value = serde_json::from_str(&batch_results_json(&results)).unwrap();
        let tail = Offset::new(3, 300).to_string();
        assert_eq!(
            parsed,
            json!([
                {"status": 204, "stream_next_offset": tail},
                {"status": 204, "stream_next_offset": tail,
                 "stream_record_start": 2, "stream_record_next": 3},
                {"status": 409, "error_code": "stream_closed",
                 "error": results[2].as_ref().unwrap_err().to_string(),
                 "stream_closed": true,
                 "stream_next_offset": Offset::new(9, 900).to_string()},
            ])
        );
        assert_eq!(batch_results_json(&[]), "[]");
    }
}
