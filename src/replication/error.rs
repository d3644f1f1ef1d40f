//! What stops a mirror's replication session.

use crate::service::StreamError;

#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    #[error(
        "upstream {0} is not a bucket or bucketed stream URL (http[s]://host:port/bucket[/stream])"
    )]
    BadUrl(String),
    #[error("upstream request failed: {}", with_causes(.0))]
    Http(#[from] reqwest::Error),
    #[error("upstream {0} advertises no StreamLD websocket-replication Link")]
    NoEndpoint(String),
    #[error("upstream {0} does not exist (404 or 410)")]
    Missing(String),
    #[error("websocket: {0}")]
    WebSocket(#[from] tokio_tungstenite::tungstenite::Error),
    #[error(
        "upstream does not serve {0} to this mirror (it does not exist there, or the mirror's token may not read it)"
    )]
    NotServed(String),
    #[error("upstream sent an unusable message: {0}")]
    BadMessage(String),
    #[error("upstream no longer serves the snapshot of {0}")]
    SnapshotGone(String),
    #[error(transparent)]
    Stream(#[from] StreamError),
}

/// An error with the causes under it (reqwest's own message leaves out why a request failed,
/// such as a certificate the mirror does not trust).
fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        cause = inner.source();
    }
    text
}
