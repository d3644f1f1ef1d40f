//! Reading HTTP requests: header values, query parameters and bodies, each with a clear 4xx.

use axum::body::Body;
use axum::http::header::AsHeaderName;
use axum::http::{HeaderMap, StatusCode};
use bytes::Bytes;

/// A request that cannot be served as sent: its status and a short reason for the client.
#[derive(Debug)]
pub struct Rejection {
    pub status: StatusCode,
    pub reason: String,
}

impl Rejection {
    pub fn bad_request(reason: impl Into<String>) -> Self {
        Rejection {
            status: StatusCode::BAD_REQUEST,
            reason: reason.into(),
        }
    }
}

/// The value of a header sent at most once, as visible ASCII text.
pub fn header<N>(headers: &HeaderMap, name: N) -> Result<Option<&str>, Rejection>
where
    N: AsHeaderName + Copy + std::fmt::Display,
{
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(Rejection::bad_request(format!(
            "{name} must be sent at most once"
        )));
    }
    value
        .to_str()
        .map(|v| Some(v.trim()))
        .map_err(|_| Rejection::bad_request(format!("{name} must be visible ASCII text")))
}

/// Query parameters by name; a parameter may appear at most once.
pub struct Query {
    pairs: Vec<(String, String)>,
}

impl Query {
    pub fn parse(raw: Option<&str>) -> Query {
        let pairs = form_urlencoded::parse(raw.unwrap_or_default().as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        Query { pairs }
    }

    pub fn get(&self, name: &str) -> Result<Option<&str>, Rejection> {
        let mut values = self
            .pairs
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.as_str());
        let first = values.next();
        if values.next().is_some() {
            return Err(Rejection::bad_request(format!(
                "query parameter {name} must appear at most once"
            )));
        }
        Ok(first)
    }
}

/// Reads the whole body, refusing more than `limit` bytes with 413.
pub async fn body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, Rejection> {
    let too_large = || Rejection {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        reason: format!("request body exceeds the limit of {limit} bytes"),
    };
    let declared = header(headers, "content-length")?
        .map(|v| {
            v.parse::<u64>()
                .map_err(|_| Rejection::bad_request("Content-Length must be an integer"))
        })
        .transpose()?;
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(too_large());
    }
    let bytes = axum::body::to_bytes(body, limit).await.map_err(|e| {
        let over_limit = std::iter::successors(Some(&e as &dyn std::error::Error), |e| e.source())
            .any(|e| e.is::<http_body_util::LengthLimitError>());
        if over_limit {
            too_large()
        } else {
            Rejection::bad_request(format!("could not read the request body: {e}"))
        }
    })?;
    Ok(owned(bytes))
}

/// Bodies below this size get their own allocation.
const SMALL_BODY: usize = 16 * 1024;

/// A small body arrives as a slice of the connection's read buffer; kept as it is (in the hot
/// tail cache, say), it would pin that whole buffer. Copying a few hundred bytes once is far
/// cheaper than the memory it frees.
fn owned(bytes: Bytes) -> Bytes {
    if bytes.len() < SMALL_BODY {
        Bytes::copy_from_slice(&bytes)
    } else {
        bytes
    }
}
