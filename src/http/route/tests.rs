//! The route table's parsing and access classes, route by route.

use std::collections::BTreeSet;

use axum::http::{HeaderMap, HeaderValue, Method};

use super::*;
use crate::model::access::Operation::*;

fn access(method: Method, path: &str) -> Access {
    let mut headers = HeaderMap::new();
    headers.insert("s2-basin", HeaderValue::from_static("logs-basin"));
    Route::parse(path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .access(&method, &headers)
}

fn stream(basin: &str, stream: &str) -> Target {
    Target::Stream(basin.into(), stream.into())
}

fn basin(name: &str) -> Target {
    Target::Basin(name.into())
}

/// Which variant a route is, numbered. The match is exhaustive, so a new variant does not
/// compile until it is numbered here, and the test below then fails until a case covers it.
fn variant(route: &Route) -> usize {
    match route {
        Route::Health => 0,
        Route::Ready => 1,
        Route::Metrics => 2,
        Route::BaseStream { .. } => 3,
        Route::Replication => 4,
        Route::S2(s2) => match s2 {
            S2Route::Basins => 5,
            S2Route::Basin { .. } => 6,
            S2Route::Streams => 7,
            S2Route::Stream { .. } => 8,
            S2Route::Records { .. } => 9,
            S2Route::Tail { .. } => 10,
            S2Route::AccessTokens => 11,
            S2Route::AccessToken { .. } => 12,
            S2Route::NotServed => 13,
        },
        Route::Bucket { .. } => 14,
        Route::Listing { .. } => 15,
        Route::BucketStream { .. } => 16,
        Route::Extension { extension, .. } => match extension {
            Extension::Snapshot => 17,
            Extension::SnapshotAt(_) => 18,
            Extension::Retention => 19,
            Extension::RetentionAt(_) => 20,
            Extension::Bootstrap => 21,
            Extension::AppendBatch => 22,
            Extension::Attrs => 23,
            Extension::StreamLd => 24,
        },
    }
}
const VARIANTS: usize = 25;

/// Every route, with each method it serves, and the access class it needs.
fn every_route() -> Vec<(Method, &'static str, Access)> {
    let op = Access::Operation;
    vec![
        (Method::GET, "/healthz", Access::Public),
        (Method::GET, "/readyz", Access::Public),
        (Method::GET, "/metrics", op(AccountMetrics, Target::Account)),
        (Method::GET, "/v1/stream/a%2Fb", op(Read, stream("", "a/b"))),
        (Method::HEAD, "/v1/stream/a/b", op(Read, stream("", "a/b"))),
        (
            Method::PUT,
            "/v1/stream/x",
            op(CreateStream, stream("", "x")),
        ),
        (Method::POST, "/v1/stream/x", op(Append, stream("", "x"))),
        (
            Method::DELETE,
            "/v1/stream/x",
            op(DeleteStream, stream("", "x")),
        ),
        (
            Method::GET,
            "/v1/streamld/replication",
            Access::NarrowedByHandler,
        ),
        (Method::GET, "/v1/basins", op(ListBasins, Target::Account)),
        (Method::POST, "/v1/basins", Access::NarrowedByHandler),
        (
            Method::GET,
            "/v1/basins/b1",
            op(GetBasinConfig, basin("b1")),
        ),
        (Method::PUT, "/v1/basins/b1", op(CreateBasin, basin("b1"))),
        (
            Method::PATCH,
            "/v1/basins/b1",
            op(ReconfigureBasin, basin("b1")),
        ),
        (
            Method::DELETE,
            "/v1/basins/b1",
            op(DeleteBasin, basin("b1")),
        ),
        (
            Method::GET,
            "/v1/streams",
            op(ListStreams, basin("logs-basin")),
        ),
        (Method::POST, "/v1/streams", Access::NarrowedByHandler),
        (
            Method::GET,
            "/v1/streams/s",
            op(GetStreamConfig, stream("logs-basin", "s")),
        ),
        (
            Method::PUT,
            "/v1/streams/s",
            op(CreateStream, stream("logs-basin", "s")),
        ),
        (
            Method::PATCH,
            "/v1/streams/s",
            op(ReconfigureStream, stream("logs-basin", "s")),
        ),
        (
            Method::DELETE,
            "/v1/streams/s",
            op(DeleteStream, stream("logs-basin", "s")),
        ),
        (
            Method::POST,
            "/v1/streams/a%2Fb/records",
            op(Append, stream("logs-basin", "a/b")),
        ),
        (
            Method::GET,
            "/v1/streams/s/records",
            op(Read, stream("logs-basin", "s")),
        ),
        (
            Method::GET,
            "/v1/streams/s/records/tail",
            op(CheckTail, stream("logs-basin", "s")),
        ),
        (
            Method::GET,
            "/v1/access-tokens",
            op(ListAccessTokens, Target::Account),
        ),
        (Method::POST, "/v1/access-tokens", Access::NarrowedByHandler),
        (
            Method::DELETE,
            "/v1/access-tokens/t1",
            op(RevokeAccessToken, Target::AccessToken("t1".into())),
        ),
        (Method::GET, "/v1/metrics", Access::AnyToken),
        (Method::GET, "/v1/metrics/b/s", Access::AnyToken),
        (Method::GET, "/v1/locations", Access::AnyToken),
        (Method::GET, "/bkt1", op(GetBasinConfig, basin("bkt1"))),
        (Method::PUT, "/bkt1", op(CreateBasin, basin("bkt1"))),
        (Method::DELETE, "/bkt1", op(DeleteBasin, basin("bkt1"))),
        (Method::GET, "/bkt1/streams", op(ListStreams, basin("bkt1"))),
        (Method::GET, "/bkt1/s", op(Read, stream("bkt1", "s"))),
        (
            Method::PUT,
            "/bkt1/s",
            op(CreateStream, stream("bkt1", "s")),
        ),
        (Method::POST, "/bkt1/s", op(Append, stream("bkt1", "s"))),
        (
            Method::DELETE,
            "/bkt1/s",
            op(DeleteStream, stream("bkt1", "s")),
        ),
        (
            Method::GET,
            "/bkt1/s/snapshot",
            op(Read, stream("bkt1", "s")),
        ),
        (
            Method::PUT,
            "/bkt1/s/snapshot",
            op(Trim, stream("bkt1", "s")),
        ),
        (
            Method::GET,
            "/bkt1/s/snapshot/5",
            op(Read, stream("bkt1", "s")),
        ),
        (
            Method::PUT,
            "/bkt1/s/snapshot/5",
            op(Trim, stream("bkt1", "s")),
        ),
        (
            Method::DELETE,
            "/bkt1/s/snapshot/5",
            op(Trim, stream("bkt1", "s")),
        ),
        (
            Method::PUT,
            "/bkt1/s/retention",
            op(Trim, stream("bkt1", "s")),
        ),
        (
            Method::PUT,
            "/bkt1/s/retention/5",
            op(Trim, stream("bkt1", "s")),
        ),
        (
            Method::GET,
            "/bkt1/s/bootstrap",
            op(Read, stream("bkt1", "s")),
        ),
        (
            Method::POST,
            "/bkt1/s/append-batch",
            op(Append, stream("bkt1", "s")),
        ),
        (
            Method::GET,
            "/bkt1/s/attrs",
            op(GetStreamConfig, stream("bkt1", "s")),
        ),
        (
            Method::PUT,
            "/bkt1/s/attrs",
            op(ReconfigureStream, stream("bkt1", "s")),
        ),
        (
            Method::GET,
            "/bkt1/s/streamld",
            op(Read, stream("bkt1", "s")),
        ),
    ]
}

#[test]
fn every_route_has_its_access_class() {
    let mut seen = BTreeSet::new();
    for (method, path, expected) in every_route() {
        let route = Route::parse(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        seen.insert(variant(&route));
        assert_eq!(access(method.clone(), path), expected, "{method} {path}");
    }
    let missing: Vec<usize> = (0..VARIANTS).filter(|v| !seen.contains(v)).collect();
    assert!(missing.is_empty(), "routes with no case here: {missing:?}");
}

#[test]
fn a_preflight_needs_no_token_on_any_route() {
    for (_, path, _) in every_route() {
        assert_eq!(access(Method::OPTIONS, path), Access::Public, "{path}");
    }
}

#[test]
fn unknown_paths_are_no_route() {
    for path in [
        "/",
        "",
        "/v1",
        "/v1/stream/",
        "/v1/stream",
        "/v1/nothing",
        "/v1/streams/s/records/tail/more",
        "/v1/streams/s/other",
        "/v1/basins/b/more",
        "/v1/access-tokens/t/more",
        "/v1/streamld/other",
        "/bkt1/s/frobnicate",
        "/bkt1/s/bootstrap/5",
        "/bkt1/s/attrs/5",
        "/bkt1/s/snapshot/5/more",
        "/bkt1//s",
        "/bkt1/",
        "//",
    ] {
        assert_eq!(Route::parse(path), Err(RouteError::Unknown), "{path:?}");
    }
}

#[test]
fn a_path_that_spells_no_name_is_a_bad_name_not_a_route() {
    for (path, face) in [
        ("/v1/stream/a%zz", Face::DurableStreams),
        ("/bkt1/a%2", Face::DurableStreams),
        ("/bkt1/%ff%fe", Face::DurableStreams),
        ("/bkt1/s/snapshot/%zz", Face::DurableStreams),
        ("/v1/streams/%c3%28/records", Face::S2),
        ("/v1/basins/a%z", Face::S2),
    ] {
        assert!(
            matches!(Route::parse(path), Err(RouteError::BadName(f, _)) if f == face),
            "{path}"
        );
    }
}

#[test]
fn names_in_the_path_are_percent_decoded_once() {
    assert_eq!(
        Route::parse("/bkt1/a%2Fb/snapshot/0000000000000001_0000000000000003"),
        Ok(Route::Extension {
            bucket: "bkt1".into(),
            stream: "a/b".into(),
            extension: Extension::SnapshotAt("0000000000000001_0000000000000003".into()),
        })
    );
    assert_eq!(
        Route::parse("/v1/stream/a%2Fb/c"),
        Ok(Route::BaseStream {
            key: "/v1/stream/a/b/c".into()
        })
    );
}

#[test]
fn every_s2_route_and_only_those_answer_in_s2s_shape() {
    for (_, path, _) in every_route() {
        let route = Route::parse(path).expect("a route");
        let s2 = [
            "/v1/basins",
            "/v1/streams",
            "/v1/access-tokens",
            "/v1/metrics",
            "/v1/locations",
        ]
        .iter()
        .any(|prefix| path.starts_with(prefix));
        assert_eq!(route.face() == Face::S2, s2, "{path}");
    }
}

#[test]
fn route_labels_are_distinct_per_variant() {
    let mut by_label = std::collections::BTreeMap::new();
    for (_, path, _) in every_route() {
        let route = Route::parse(path).expect("a route");
        let variant = variant(&route);
        if let Some(other) = by_label.insert(route.label(), variant) {
            assert_eq!(other, variant, "{} labels two routes", route.label());
        }
    }
}

#[test]
fn closing_a_stream_needs_fence_as_well_as_append() {
    let mut closing = HeaderMap::new();
    closing.insert("stream-closed", HeaderValue::from_static("TRUE"));
    let mut not_closing = HeaderMap::new();
    not_closing.insert("stream-closed", HeaderValue::from_static("false"));
    for (path, target) in [
        ("/v1/stream/a/b", stream("", "a/b")),
        ("/bkt1/s", stream("bkt1", "s")),
    ] {
        let route = Route::parse(path).unwrap();
        assert_eq!(
            route.access(&Method::POST, &closing),
            Access::Operations(&[Append, Fence], target.clone())
        );
        assert_eq!(
            route.access(&Method::POST, &not_closing),
            Access::Operation(Append, target.clone())
        );
        // Creating a closed stream is creating it, and needs `create-stream` only.
        assert_eq!(
            route.access(&Method::PUT, &closing),
            Access::Operation(CreateStream, target)
        );
    }
}
