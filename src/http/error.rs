//! Failures and the response pieces every face shares.

use axum::body::Body;
use axum::http::header::IntoHeaderName;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::header_names;
use super::request::Rejection;
use super::text_error;
use crate::model::Offset;
use crate::model::headers::HeaderError;
use crate::model::producer::ProducerError;
use crate::model::records::EXTENSION_TOKEN;
use crate::service::StreamError;
use crate::storage::StorageError;

/// Why a request failed, on its way to becoming a response.
pub enum Failure {
    Rejected(Rejection),
    Stream(StreamError),
}

impl From<Rejection> for Failure {
    fn from(r: Rejection) -> Self {
        Failure::Rejected(r)
    }
}

impl From<StreamError> for Failure {
    fn from(e: StreamError) -> Self {
        Failure::Stream(e)
    }
}

impl From<HeaderError> for Failure {
    fn from(e: HeaderError) -> Self {
        Failure::Rejected(Rejection::bad_request(e.0))
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        match self {
            Failure::Rejected(r) => text_error(r.status, &r.reason),
            Failure::Stream(e) => stream_error(e),
        }
    }
}

pub type Handled = Result<Response, Failure>;

impl Failure {
    /// The response to a request for `uri`: a write to a mirrored stream is redirected to the
    /// same path on its upstream.
    pub fn into_response_at(self, uri: &axum::http::Uri) -> Response {
        match self {
            Failure::Stream(StreamError::Mirrored { upstream }) => {
                let location = upstream_location(&upstream, uri);
                let mut response = text_error(
                    StatusCode::TEMPORARY_REDIRECT,
                    &format!("this stream is a read-only mirror; write to {location}"),
                );
                set(&mut response, "location", &location);
                response
            }
            other => other.into_response(),
        }
    }
}

/// Where a write refused by a mirror goes instead: the same path and query on its upstream.
pub fn upstream_location(upstream: &str, uri: &axum::http::Uri) -> String {
    let path = uri.path_and_query().map_or(uri.path(), |p| p.as_str());
    format!("{upstream}{path}")
}

pub fn stream_error(error: StreamError) -> Response {
    if let StreamError::Storage(e) = &error {
        tracing::error!(error = %e, "storage failure");
    }
    let (status, headers) = describe(&error);
    let mut response = text_error(status, &error.to_string());
    for (name, value) in headers {
        set(&mut response, name, &value);
    }
    response
}

/// The status of a failed stream operation, and the headers that say more.
pub fn describe(error: &StreamError) -> (StatusCode, Vec<(&'static str, String)>) {
    match error {
        StreamError::BadRequest(_) | StreamError::BadOffset(_) | StreamError::NotRecordAware => {
            (StatusCode::BAD_REQUEST, vec![])
        }
        StreamError::NotFound
        | StreamError::BucketNotFound
        | StreamError::ForkSourceNotFound
        | StreamError::SnapshotNotFound
        | StreamError::TokenNotFound => (StatusCode::NOT_FOUND, vec![]),
        StreamError::Forbidden(_) => (StatusCode::FORBIDDEN, vec![]),
        StreamError::LimitReached(_) | StreamError::BucketDeleting => {
            (StatusCode::CONFLICT, vec![])
        }
        StreamError::Gone => (StatusCode::GONE, vec![]),
        StreamError::Retained { first } => (
            StatusCode::GONE,
            vec![("stream-retained-offset", first.to_string())],
        ),
        // Record headers come with the extension's token: a client must not rely on them
        // without it (seed 000 §6).
        StreamError::RecordRetained { first, next } => (
            StatusCode::GONE,
            vec![
                ("stream-extensions", EXTENSION_TOKEN.into()),
                ("stream-record-first", first.to_string()),
                ("stream-record-next", next.to_string()),
            ],
        ),
        StreamError::RecordBeyondTail { next } => (
            StatusCode::BAD_REQUEST,
            vec![
                ("stream-extensions", EXTENSION_TOKEN.into()),
                ("stream-record-next", next.to_string()),
            ],
        ),
        StreamError::RecordMismatch { next, tail, .. } => (
            StatusCode::PRECONDITION_FAILED,
            vec![
                ("stream-extensions", EXTENSION_TOKEN.into()),
                ("stream-record-next", next.to_string()),
                ("stream-next-offset", tail.to_string()),
            ],
        ),
        StreamError::Conflict(_)
        | StreamError::ContentTypeMismatch
        | StreamError::StreamSeqRegression { .. }
        | StreamError::ForkSourceGone => (StatusCode::CONFLICT, vec![]),
        StreamError::Closed { tail } => (
            StatusCode::CONFLICT,
            vec![
                ("stream-closed", "true".into()),
                ("stream-next-offset", tail.to_string()),
            ],
        ),
        StreamError::Producer(ProducerError::StaleEpoch { current, .. }) => (
            StatusCode::FORBIDDEN,
            vec![("producer-epoch", current.to_string())],
        ),
        StreamError::Producer(ProducerError::EpochBumpNotAtZero) => {
            (StatusCode::BAD_REQUEST, vec![])
        }
        StreamError::Producer(ProducerError::SequenceGap { expected, received }) => (
            StatusCode::CONFLICT,
            vec![
                ("producer-expected-seq", expected.to_string()),
                ("producer-received-seq", received.to_string()),
            ],
        ),
        StreamError::Invalid(_) => (StatusCode::UNPROCESSABLE_ENTITY, vec![]),
        StreamError::FencingMismatch { .. } | StreamError::SeqNumMismatch { .. } => {
            (StatusCode::PRECONDITION_FAILED, vec![])
        }
        StreamError::BeyondTail { .. } => (StatusCode::RANGE_NOT_SATISFIABLE, vec![]),
        StreamError::AlreadyExists(_) | StreamError::Encrypted => (StatusCode::CONFLICT, vec![]),
        StreamError::Mirrored { upstream } => (
            StatusCode::TEMPORARY_REDIRECT,
            vec![("location", upstream.clone())],
        ),
        StreamError::KeyRequired | StreamError::Cipher(_) => (StatusCode::BAD_REQUEST, vec![]),
        StreamError::Storage(StorageError::Full { .. }) => (
            StatusCode::INSUFFICIENT_STORAGE,
            vec![("retry-after", "5".into())],
        ),
        StreamError::Storage(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            vec![("retry-after", "1".into())],
        ),
    }
}

/// A short machine-readable name of a failure, for JSON acknowledgements.
pub fn error_code(error: &StreamError) -> &'static str {
    match error {
        StreamError::BadRequest(_) => "bad_request",
        StreamError::BadOffset(_) => "bad_offset",
        StreamError::NotRecordAware => "not_record_aware",
        StreamError::NotFound | StreamError::BucketNotFound | StreamError::ForkSourceNotFound => {
            "not_found"
        }
        StreamError::SnapshotNotFound => "snapshot_not_found",
        StreamError::TokenNotFound => "access_token_not_found",
        StreamError::Forbidden(_) => "permission_denied",
        StreamError::LimitReached(_) => "limit_reached",
        StreamError::BucketDeleting => "bucket_deleting",
        StreamError::Gone => "stream_gone",
        StreamError::Retained { .. } | StreamError::RecordRetained { .. } => "retained",
        StreamError::RecordBeyondTail { .. } => "record_beyond_tail",
        StreamError::RecordMismatch { .. } => "record_mismatch",
        StreamError::Conflict(_) | StreamError::ForkSourceGone => "conflict",
        StreamError::ContentTypeMismatch => "content_type_mismatch",
        StreamError::StreamSeqRegression { .. } => "stream_seq_regression",
        StreamError::Closed { .. } => "stream_closed",
        StreamError::Producer(ProducerError::StaleEpoch { .. }) => "stale_producer_epoch",
        StreamError::Producer(ProducerError::EpochBumpNotAtZero) => "producer_epoch_seq",
        StreamError::Producer(ProducerError::SequenceGap { .. }) => "producer_seq_gap",
        StreamError::Invalid(_) => "invalid",
        StreamError::FencingMismatch { .. } => "fencing_token_mismatch",
        StreamError::SeqNumMismatch { .. } => "seq_num_mismatch",
        StreamError::BeyondTail { .. } => "beyond_tail",
        StreamError::AlreadyExists(_) => "resource_already_exists",
        StreamError::Encrypted => "encrypted",
        StreamError::Mirrored { .. } => "mirrored",
        StreamError::KeyRequired => "bad_header",
        StreamError::Cipher(_) => "decryption_failed",
        StreamError::Storage(StorageError::Full { .. }) => "storage_full",
        StreamError::Storage(_) => "unavailable",
    }
}

pub fn set(response: &mut Response, name: impl IntoHeaderName, value: &str) {
    if let Ok(value) = HeaderValue::from_str(value) {
        response.headers_mut().insert(name, value);
    }
}

/// Sets a numeric header (no intermediate `String`).
pub fn set_number(response: &mut Response, name: impl IntoHeaderName, value: u64) {
    response
        .headers_mut()
        .insert(name, HeaderValue::from(value));
}

pub fn set_tail(response: &mut Response, tail: Offset, closed: bool) {
    if tail.is_representable() {
        set(
            response,
            header_names::STREAM_NEXT_OFFSET,
            tail.token().as_str(),
        );
    } else {
        set(
            response,
            header_names::STREAM_NEXT_OFFSET,
            &tail.to_string(),
        );
    }
    if closed {
        set(response, header_names::STREAM_CLOSED, "true");
    }
}

/// Room for the headers a response usually carries (the shared ones, the request id, the
/// tail, a producer's position), so the map is allocated once instead of growing on every append.
const USUAL_HEADERS: usize = 12;

pub fn empty(status: StatusCode) -> Response {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = status;
    *response.headers_mut() = HeaderMap::with_capacity(USUAL_HEADERS);
    response
}
