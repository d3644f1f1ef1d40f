//! The bucketed surface (seed 000 §1): buckets at `/{bucket}`, their listing at
//! `/{bucket}/streams`, and streams at `/{bucket}/{stream}` with the same operations as the base
//! surface.

use std::sync::Arc;

use axum::extract::Request;
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::error::{Failure, Handled, empty};
use super::origin::Origin;
use super::request::{Query, Rejection};
use super::{AppState, ds, text_error};
use crate::model::names;
use crate::service::Principal;

/// The default and largest page of a bucket listing.
const MAX_LISTING_LIMIT: usize = 1000;

const BUCKET_METHODS: &str = "GET, PUT, DELETE, OPTIONS";

/// `/{bucket}`: create, describe, delete.
pub async fn bucket(
    app: AppState,
    principal: Arc<Principal>,
    bucket: String,
    request: Request,
) -> Response {
    let (parts, _) = request.into_parts();
    let origin = Origin::of(&parts.headers, &parts.uri, &parts.extensions);
    let (method, uri) = (parts.method, parts.uri);
    let describes = matches!(method, Method::GET | Method::HEAD);
    let result = async {
        names::validate_bucket_id(&bucket).map_err(|e| Rejection::bad_request(e.to_string()))?;
        match method {
            Method::PUT => {
                app.service.create_bucket(&bucket, None, None).await?;
                Ok(empty(StatusCode::CREATED))
            }
            Method::GET | Method::HEAD => {
                let info = app.service.bucket_info(&bucket)?;
                let scope = &principal.scope;
                let streams = app
                    .service
                    .bucket_stream_count(&bucket, |id| scope.covers_stream(&bucket, id))?;
                let body = json!({
                    "bucket_id": bucket,
                    "streams": streams,
                    "created_at_ms": info.created_ms,
                });
                Ok(json_response(StatusCode::OK, body.to_string()))
            }
            Method::DELETE => {
                app.service.delete_bucket(&bucket).await?;
                Ok(empty(StatusCode::NO_CONTENT))
            }
            Method::OPTIONS => Ok(ds::preflight()),
            _ => Ok(super::method_not_allowed(HeaderValue::from_static(
                BUCKET_METHODS,
            ))),
        }
    };
    let mut response = result
        .await
        .unwrap_or_else(|failure: Failure| failure.into_response_at(&uri));
    // A 404 names the endpoint too: there a mirror of the bucket hears from this server itself
    // that the bucket is gone, where a bare 404 may be a proxy's.
    let status = response.status();
    if describes && (status.is_success() || status == StatusCode::NOT_FOUND) {
        let link = super::streamld::links(&origin, &format!("/{bucket}"), false);
        if let Ok(value) = HeaderValue::from_str(&link) {
            response.headers_mut().insert(header::LINK, value);
        }
    }
    response
}

/// `/{bucket}/streams`: the bucket's listing (a stream cannot have that id).
pub fn listing(app: &AppState, principal: &Principal, bucket: &str, request: &Request) -> Response {
    match *request.method() {
        Method::GET | Method::HEAD => list(app, principal, bucket, request.uri().query())
            .unwrap_or_else(|f| f.into_response()),
        Method::OPTIONS => ds::preflight(),
        _ => text_error(
            StatusCode::BAD_REQUEST,
            &names::NameError::Reserved.to_string(),
        ),
    }
}

/// The streams of a bucket the caller may see.
fn list(app: &AppState, principal: &Principal, bucket: &str, query: Option<&str>) -> Handled {
    names::validate_bucket_id(bucket).map_err(|e| Rejection::bad_request(e.to_string()))?;
    let query = Query::parse(query);
    let prefix = query.get("prefix")?.unwrap_or_default();
    let after = query.get("after")?;
    let limit = match query.get("limit")? {
        None => MAX_LISTING_LIMIT,
        Some(text) => text
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_LISTING_LIMIT).contains(n))
            .ok_or_else(|| Rejection::bad_request("limit must be an integer from 1 to 1000"))?,
    };
    let scope = &principal.scope;
    let listing = app
        .service
        .list_streams(bucket, prefix, after, limit, |id| {
            scope.covers_stream(bucket, id)
        })?;
    let streams: Vec<_> = listing
        .streams
        .iter()
        .map(|s| {
            json!({
                "stream_id": s.stream_id,
                "status": if s.closed { "Closed" } else { "Open" },
                "content_type": s.content_type,
                "tail_offset": s.tail.pos,
                "next_offset": s.tail.to_string(),
                "created_at_ms": s.created_ms,
                "last_write_at_ms": s.last_write_ms,
            })
        })
        .collect();
    let mut body = json!({
        "bucket_id": bucket,
        "prefix": prefix,
        "stream_count": streams.len(),
        "has_more": listing.has_more,
    });
    if listing.has_more
        && let Some(last) = listing.streams.last()
    {
        body["next_cursor"] = json!(last.stream_id);
    }
    body["streams"] = json!(streams);
    Ok(json_response(StatusCode::OK, body.to_string()))
}

pub fn json_response(status: StatusCode, body: String) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}
