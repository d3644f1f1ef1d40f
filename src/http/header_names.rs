//! The names of the headers read or written on every append, built once.
//!
//! A header named by a `&str` is parsed and validated again at each lookup or insert; these are
//! on the hot path, so they are named once here. Rarer headers keep their string names.

use axum::http::HeaderName;

pub const PRODUCER_ID: HeaderName = HeaderName::from_static("producer-id");
pub const PRODUCER_EPOCH: HeaderName = HeaderName::from_static("producer-epoch");
pub const PRODUCER_SEQ: HeaderName = HeaderName::from_static("producer-seq");
pub const STREAM_CLOSED: HeaderName = HeaderName::from_static("stream-closed");
pub const STREAM_SEQ: HeaderName = HeaderName::from_static("stream-seq");
pub const STREAM_RECORD_MATCH: HeaderName = HeaderName::from_static("stream-record-match");
pub const STREAM_NEXT_OFFSET: HeaderName = HeaderName::from_static("stream-next-offset");
pub const X_CONTENT_TYPE_OPTIONS: HeaderName = HeaderName::from_static("x-content-type-options");
pub const CROSS_ORIGIN_RESOURCE_POLICY: HeaderName =
    HeaderName::from_static("cross-origin-resource-policy");
pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
