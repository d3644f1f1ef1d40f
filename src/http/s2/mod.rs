//! The S2 face (seed 002): basins and streams management under `/v1/basins` and `/v1/streams`,
//! and the records API (append, read, check-tail) over JSON and SSE. A basin is a bucket and an
//! S2 stream is the bucketed stream of the same name.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Value, json};

use super::AppState;
use super::request::{self, Part, Query, Rejection};
use crate::model::access::{Operation, Resource};
use crate::model::cipher::{CipherError, RecordKey};
use crate::model::names;
use crate::model::s2::{self, BasinConfig, EventId, Format, StreamConfig};
use crate::model::wire::s2_json;
use crate::service::{
    CheckedAppend, Creation, Ensured, Principal, ReadLimits, RecordBatch, RecordStart, S2Append,
    S2Position, Stream, StreamError, StreamService, StreamSummary, now_ms,
};

const MAX_LIST_LIMIT: usize = 1000;

mod manage;
mod records;
mod s2s;
mod tokens;

pub(super) use manage::{basin, create_basin, create_stream, list_basins, list_streams, stream};
pub(super) use records::{check_tail, is_unary_append, records};
pub(super) use s2s::CONTENT_TYPE as SESSION_CONTENT_TYPE;
pub(super) use tokens::{issue_token, list_tokens, revoke_token};

/// An S2 error response: `{"code","message"}` (or the special 412/416 bodies).
struct S2Error {
    status: StatusCode,
    body: Value,
    /// Set when a mirror refused a write: the upstream that takes it.
    upstream: Option<String>,
}

/// The longest error message sent. Messages may quote what a client sent, and an S2S session
/// carries its error in one frame of at most 2 MiB.
const MAX_MESSAGE_BYTES: usize = 4096;

impl S2Error {
    fn new(status: StatusCode, code: &str, message: impl std::fmt::Display) -> Self {
        let mut message = message.to_string();
        if message.len() > MAX_MESSAGE_BYTES {
            message.truncate(message.floor_char_boundary(MAX_MESSAGE_BYTES));
            message.push('…');
        }
        S2Error::with_body(status, json!({ "code": code, "message": message }))
    }

    fn with_body(status: StatusCode, body: Value) -> Self {
        S2Error {
            status,
            body,
            upstream: None,
        }
    }

    /// The response to a request for `uri`: a write refused by a mirror is redirected to the
    /// same path on its upstream, as on the other faces.
    fn at(self, uri: &Uri) -> Response {
        let upstream = self.upstream.clone();
        let mut response = self.into_response();
        if let Some(upstream) = upstream {
            let location = super::error::upstream_location(&upstream, uri);
            super::error::set(&mut response, header::LOCATION, &location);
        }
        response
    }
}

impl IntoResponse for S2Error {
    fn into_response(self) -> Response {
        (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            self.body.to_string(),
        )
            .into_response()
    }
}

impl From<StreamError> for S2Error {
    fn from(error: StreamError) -> Self {
        let message = error.to_string();
        let (status, code) = match error {
            StreamError::FencingMismatch { current } => {
                return S2Error::with_body(
                    StatusCode::PRECONDITION_FAILED,
                    json!({ "fencing_token_mismatch": current }),
                );
            }
            StreamError::SeqNumMismatch { next } => {
                return S2Error::with_body(
                    StatusCode::PRECONDITION_FAILED,
                    json!({ "seq_num_mismatch": next }),
                );
            }
            StreamError::Mirrored { upstream } => {
                return S2Error {
                    upstream: Some(upstream),
                    ..S2Error::new(StatusCode::TEMPORARY_REDIRECT, "mirrored", message)
                };
            }
            StreamError::BeyondTail { tail, timestamp_ms } => {
                let position = S2Position {
                    seq_num: tail,
                    timestamp: u64::try_from(timestamp_ms).unwrap_or(0),
                };
                return S2Error::with_body(
                    StatusCode::RANGE_NOT_SATISFIABLE,
                    json!({ "tail": s2_json::position(position) }),
                );
            }
            StreamError::NotFound | StreamError::Gone => {
                (StatusCode::NOT_FOUND, "stream_not_found")
            }
            StreamError::BucketNotFound => (StatusCode::NOT_FOUND, "basin_not_found"),
            StreamError::BucketDeleting => (StatusCode::CONFLICT, "basin_deletion_pending"),
            StreamError::TokenNotFound => (StatusCode::NOT_FOUND, "access_token_not_found"),
            StreamError::Forbidden(_) => (StatusCode::FORBIDDEN, "permission_denied"),
            StreamError::LimitReached(_) => (StatusCode::CONFLICT, "limit_reached"),
            StreamError::AlreadyExists(_) => (StatusCode::CONFLICT, "resource_already_exists"),
            StreamError::Conflict(_) => (StatusCode::CONFLICT, "transaction_conflict"),
            StreamError::Storage(crate::storage::StorageError::Full { .. }) => {
                (StatusCode::INSUFFICIENT_STORAGE, "storage_full")
            }
            StreamError::Storage(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            StreamError::KeyRequired | StreamError::Cipher(CipherError::BadKey) => {
                (StatusCode::BAD_REQUEST, "bad_header")
            }
            StreamError::Cipher(CipherError::DecryptionFailed) => {
                (StatusCode::BAD_REQUEST, "decryption_failed")
            }
            StreamError::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_json"),
            _ => (StatusCode::UNPROCESSABLE_ENTITY, "invalid"),
        };
        S2Error::new(status, code, message)
    }
}

impl From<s2::BatchError> for S2Error {
    fn from(error: s2::BatchError) -> Self {
        S2Error::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid", error)
    }
}

impl From<Rejection> for S2Error {
    fn from(r: Rejection) -> Self {
        let code = match r.part {
            _ if r.status == StatusCode::PAYLOAD_TOO_LARGE => "invalid",
            _ if r.status == StatusCode::REQUEST_TIMEOUT => "request_timeout",
            Part::Header => "bad_header",
            Part::Query => "bad_query",
            Part::Body => "bad_json",
            Part::Other => "bad_request",
        };
        S2Error::new(r.status, code, r.reason)
    }
}

type S2Result = Result<Response, S2Error>;

fn method_not_allowed() -> S2Error {
    S2Error::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "bad_request",
        "method not allowed",
    )
}

/// The request headers S2 clients send, for CORS preflights.
const ALLOWED_HEADERS: &str = "Authorization, Content-Type, Content-Encoding, Accept, \
    Last-Event-ID, S2-Basin, S2-Format, S2-Request-Token, S2-Encryption-Key, S2-Stream-Config";

/// The answer to a CORS preflight on any S2 route, so browsers can use the S2 SDKs across
/// origins (the Durable Streams routes answer their own).
pub(super) fn preflight() -> Response {
    (
        StatusCode::NO_CONTENT,
        [
            (
                header::ACCESS_CONTROL_ALLOW_METHODS,
                "GET, POST, PUT, PATCH, DELETE, OPTIONS",
            ),
            (header::ACCESS_CONTROL_ALLOW_HEADERS, ALLOWED_HEADERS),
            (header::ACCESS_CONTROL_MAX_AGE, "86400"),
        ],
    )
        .into_response()
}

/// An error in S2's shape, for the layers in front of S2's handlers.
pub(super) fn error_response(status: StatusCode, code: &str, message: &str) -> Response {
    S2Error::new(status, code, message).into_response()
}

pub(super) fn method_not_allowed_response() -> Response {
    method_not_allowed().into_response()
}

/// 405 for a method an S2 route does not take, with the ones it does in `Allow`.
pub(super) fn not_allowed(allowed: &'static str) -> Response {
    let mut response = method_not_allowed_response();
    response
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allowed));
    response
}

/// Parts of S2's account API Runnel does not serve (nor does s2-lite): usage metrics and
/// locations. A clear `501` in S2's error shape, not a miss on the bucket routes.
pub(super) fn not_served(uri: &Uri) -> Response {
    S2Error::new(
        StatusCode::NOT_IMPLEMENTED,
        "not_implemented",
        format!("{} is not served by Runnel", uri.path()),
    )
    .into_response()
}

fn bad(code: &str, message: impl std::fmt::Display) -> S2Error {
    let status = if code == "invalid" {
        StatusCode::UNPROCESSABLE_ENTITY
    } else {
        StatusCode::BAD_REQUEST
    };
    S2Error::new(status, code, message)
}

/// A 200 response whose body is a live session, kept out of caches and proxy buffers.
fn streaming_response(body: Body, content_type: &'static str) -> Response {
    let mut response = (StatusCode::OK, body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, no-transform"),
    );
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

fn json_response(status: StatusCode, body: Value) -> Response {
    json_text_response(status, body.to_string())
}

fn json_text_response(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// The tail a batch tells its reader: only when the batch reached it, and not on an empty one.
fn told_tail(batch: &RecordBatch) -> Option<S2Position> {
    (batch.at_tail && !batch.records.is_empty()).then_some(batch.tail)
}

/// Refuses what the caller's token does not allow (for resources named in a request body,
/// which the authorization layer cannot see).
fn permit(principal: &Principal, op: Operation, resource: Resource<'_>) -> Result<(), S2Error> {
    if principal.scope.allows(op, resource) {
        Ok(())
    } else {
        Err(S2Error::new(
            StatusCode::FORBIDDEN,
            "permission_denied",
            "the access token does not permit this operation on this resource",
        ))
    }
}

/// The basin of a records or streams request: the `s2-basin` header, else a `{basin}.` prefix
/// of the Host.
fn basin_of(headers: &HeaderMap) -> Result<String, S2Error> {
    let header_value = |name: &str| {
        headers.get(name).map(|v| {
            v.to_str()
                .map_err(|_| bad("bad_header", format!("{name} is not text")))
        })
    };
    if let Some(basin) = header_value("s2-basin").transpose()? {
        return valid_basin(basin.trim());
    }
    let host = header_value("host").transpose()?.unwrap_or_default();
    let host = host.rsplit_once(':').map_or(host, |(name, port)| {
        if port.bytes().all(|b| b.is_ascii_digit()) {
            name
        } else {
            host
        }
    });
    match host.split_once('.') {
        Some((label, rest))
            if !rest.is_empty() && !host.bytes().all(|b| b.is_ascii_digit() || b == b'.') =>
        {
            valid_basin(label)
        }
        _ => Err(bad(
            "bad_header",
            "missing header s2-basin (or a {basin}. host prefix)",
        )),
    }
}

/// The basin a request names (header or host), if any; for classifying requests.
pub(crate) fn basin_name(headers: &HeaderMap) -> Option<String> {
    basin_of(headers).ok()
}

fn valid_basin(name: &str) -> Result<String, S2Error> {
    names::validate_bucket_id(name).map_err(|e| bad("bad_header", e))?;
    Ok(name.to_string())
}

fn valid_stream(basin: &str, stream: &str) -> Result<(), S2Error> {
    names::stream_key_in(basin, stream)
        .map(|_| ())
        .map_err(|e| bad("bad_path", e))
}

fn stream_key(basin: &str, stream: &str) -> Result<String, S2Error> {
    names::stream_key_in(basin, stream).map_err(|e| bad("bad_path", e))
}

/// A JSON request body's bytes (empty when there is none); a body that is not JSON is
/// `bad_json`.
/// The largest S2 request body: a batch is at most 1 MiB metered, which JSON (base64, escapes)
/// can make a few times larger; more is refused before it is parsed.
const MAX_S2_BODY_BYTES: usize = 16 << 20;

fn body_limits(app: &AppState) -> request::BodyLimits {
    app.config.body.at_most(MAX_S2_BODY_BYTES)
}

/// The largest body of a request that manages basins, streams or tokens. Their configurations
/// are a handful of fields; a basin's is kept as sent and read on every request to its streams.
const MAX_CONTROL_BODY_BYTES: usize = 64 << 10;

async fn json_bytes(
    headers: &HeaderMap,
    body: Body,
    limits: request::BodyLimits,
) -> Result<Bytes, S2Error> {
    let bytes = request::body(headers, body, limits).await?;
    crate::model::json::check_value_count(&bytes).map_err(|e| bad("bad_json", e))?;
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(crate::model::content_type::is_json);
    if !bytes.is_empty() && !is_json {
        return Err(bad("bad_json", "expected Content-Type: application/json"));
    }
    Ok(bytes)
}

/// A JSON request body; any problem with it is `bad_json`.
async fn json_body<T: serde::de::DeserializeOwned>(
    app: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<Option<T>, S2Error> {
    let limits = body_limits(app).at_most(MAX_CONTROL_BODY_BYTES);
    let bytes = json_bytes(headers, body, limits).await?;
    if bytes.is_empty() {
        return Ok(None);
    }
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| bad("bad_json", e))
}

/// A JSON request body that must be there; a missing one is `bad_json` too.
async fn required_json_body<T: serde::de::DeserializeOwned>(
    app: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<T, S2Error> {
    json_body(app, headers, body)
        .await?
        .ok_or_else(|| bad("bad_json", "a body is required"))
}

fn limit_of(query: &Query) -> Result<usize, S2Error> {
    match query.get("limit")? {
        None => Ok(MAX_LIST_LIMIT),
        Some(text) => text
            .parse::<usize>()
            // 0 asks for no particular limit, as in S2.
            .map(|n| {
                if n == 0 {
                    MAX_LIST_LIMIT
                } else {
                    n.min(MAX_LIST_LIMIT)
                }
            })
            .map_err(|_| bad("bad_query", "limit must be an integer")),
    }
}
