//! The size of a request's future. Every level of a request's future is moved into its parent
//! as it starts, so an append pays a copy of each level: a rare branch that is not boxed makes
//! every request carry its state. These bounds fail when one slips in.

use std::sync::Arc;

use axum::body::Body;

use super::live::tests::app_over;
use super::*;
use crate::service::{ServiceConfig, StreamService};
use crate::storage::MemoryEngine;

/// A stream request's future is 4.5 KiB (8 KiB while an S2 append's branch and the streaming
/// requests' state rode in it): room to grow a little, not to carry another route.
const REQUEST_FUTURE_MAX_BYTES: usize = 5120;

/// An S2 records request's future is 2.2 KiB (5 KiB while stream creation's state rode in it).
const S2_RECORDS_FUTURE_MAX_BYTES: usize = 3072;

fn handler() -> Handler {
    let service = StreamService::open(Arc::new(MemoryEngine::new()), ServiceConfig::default())
        .expect("a service");
    Handler::new(app_over(service))
}

fn post(uri: &str) -> Request {
    Request::builder()
        .method(Method::POST)
        .uri(uri)
        .body(Body::empty())
        .expect("a request")
}

#[test]
fn a_requests_future_carries_no_rare_branchs_state() {
    let handler = handler();
    let serving = handler.clone().serve(post("/v1/stream/a"));
    let size = std::mem::size_of_val(&serving);
    assert!(
        size <= REQUEST_FUTURE_MAX_BYTES,
        "a request's future is {size} bytes (at most {REQUEST_FUTURE_MAX_BYTES})"
    );
}

#[test]
fn an_s2_appends_future_carries_no_creations_state() {
    let handler = handler();
    let principal = crate::service::Principal::shared_operator();
    let appending = s2::records(
        handler.app.clone(),
        principal,
        "s".into(),
        post("/v1/streams/s/records"),
    );
    let size = std::mem::size_of_val(&appending);
    assert!(
        size <= S2_RECORDS_FUTURE_MAX_BYTES,
        "an S2 records future is {size} bytes (at most {S2_RECORDS_FUTURE_MAX_BYTES})"
    );
}
