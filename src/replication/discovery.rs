//! Finding an upstream's replication endpoint from the `Link` headers of its stream or bucket.

use super::error::MirrorError;
use super::upstream::Upstream;
use crate::model::streamld;

/// What discovery found at the upstream URL.
pub(super) enum Discovered {
    /// The target exists, followed through this replication endpoint.
    Endpoint(String),
    /// The upstream answered 404 or 410; with the endpoint, when the answer named one (the
    /// upstream's own answer, not a proxy's), where its replication session says for certain.
    Missing(Option<String>),
}

/// Discovers the upstream's replication endpoint through its `Link` header (on a `HEAD`: the
/// mirror wants the headers, not the stream).
pub(super) async fn discover(
    http: &reqwest::Client,
    upstream: &Upstream,
) -> Result<Discovered, MirrorError> {
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
