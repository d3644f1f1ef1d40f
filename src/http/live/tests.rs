use std::time::Duration;

use super::*;

/// An application over `service` as the live readers' unit tests need it: no
/// authentication, a long-poll timeout of a second.
pub(in crate::http) fn app_over(service: Arc<crate::service::StreamService>) -> AppState {
    let config = super::super::HttpConfig {
        long_poll_timeout: Duration::from_secs(1),
        body: super::super::request::BodyLimits {
            max_bytes: 1 << 20,
            idle: Duration::from_secs(1),
        },
        sse_max_duration: Duration::from_secs(60),
        auth: None,
        max_live_readers: 10,
        send_timeout: Duration::from_secs(1),
        max_header_bytes: 64 << 10,
    };
    AppState::new(service, config, None)
}

fn live(request: &Request) -> bool {
    let route = Route::parse(request.uri().path()).expect("a route");
    is_live(&route, request)
}

fn append_session(request: &Request) -> bool {
    let route = Route::parse(request.uri().path()).expect("a route");
    is_append_session(&route, request)
}

fn get(uri: &str, headers: &[(&str, &str)]) -> Request {
    let mut request = Request::builder().method(Method::GET).uri(uri);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.body(Body::empty()).unwrap()
}

#[test]
fn live_reads_are_recognised_by_parameter_path_and_media_type() {
    assert!(live(&get("/v1/stream/s?offset=-1&live=sse", &[])));
    assert!(live(&get("/v1/stream/s?live=long-poll", &[])));
    assert!(live(&get("/docs/s1/streamld", &[])));
    assert!(live(&get(
        "/v1/streams/s/records",
        &[("accept", "Text/Event-Stream")]
    )));
    assert!(live(&get(
        "/v1/streams/s/records",
        &[("accept", " text/event-stream , */*")]
    )));
    assert!(live(&get(
        "/v1/streams/s/records",
        &[("content-type", "S2S/PROTO")]
    )));
    assert!(live(&get("/v1/streams/s/records?wait=5", &[])));
}

#[test]
fn append_sessions_are_recognised_in_any_case() {
    let post = |content_type: &str| {
        Request::builder()
            .method(Method::POST)
            .uri("/v1/streams/s/records")
            .header("content-type", content_type)
            .body(Body::empty())
            .unwrap()
    };
    assert!(append_session(&post("s2s/proto")));
    assert!(append_session(&post("S2S/Proto; charset=x")));
    assert!(!append_session(&post("application/json")));
}

#[test]
fn other_requests_are_not_live() {
    assert!(!live(&get("/v1/stream/s?offset=-1", &[])));
    assert!(!live(&get("/v1/streams/s/records?wait=0", &[])));
    assert!(!live(&get(
        "/v1/streams/s/records",
        &[("accept", "*/*, text/event-stream")]
    )));
    assert!(!live(&get(
        "/v1/streams/s/records",
        &[("accept", "text/event")]
    )));
    let post = Request::builder()
        .method(Method::POST)
        .uri("/v1/stream/s?live=sse")
        .body(Body::empty())
        .unwrap();
    assert!(!live(&post));
    assert!(
        !live(&get("/v1/streams/s?wait=5", &[])),
        "only the records route waits"
    );
    assert!(!live(&get(
        "/v1/stream/s",
        &[("accept", "text/event-stream")]
    )));
}

fn token_principal(expires_ms: Option<i64>) -> Arc<Principal> {
    Arc::new(Principal {
        token_id: Some("reader".into()),
        expires_ms,
        ..Principal::operator()
    })
}

#[tokio::test]
async fn a_streaming_body_sends_no_frame_once_its_token_is_revoked() {
    let principal = token_principal(None);
    let frames = futures::stream::iter([1, 2]);
    let mut body = ends_with_token(frames, Some(principal.clone()));
    assert_eq!(body.next().await, Some(1));
    // Revoked while the next frame is already ready: the watcher task has not run yet.
    principal.revoked.revoke();
    assert_eq!(body.next().await, None);
}

#[tokio::test]
async fn a_streaming_body_sends_no_frame_once_its_token_has_expired() {
    let expired = token_principal(Some(now_ms() - 1));
    let mut body = ends_with_token(futures::stream::iter([1]), Some(expired));
    assert_eq!(body.next().await, None);
    let valid = token_principal(Some(now_ms() + 60_000));
    let mut body = ends_with_token(futures::stream::iter([1]), Some(valid));
    assert_eq!(body.next().await, Some(1));
}
