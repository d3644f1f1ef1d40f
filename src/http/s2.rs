//! The S2 face (seed 002): basins and streams management under `/v1/basins` and `/v1/streams`,
//! and the records API (append, read, check-tail) over JSON and SSE. A basin is a bucket and an
//! S2 stream is the bucketed stream of the same name.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use base64::Engine as _;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::AppState;
use super::request::{self, Query, Rejection};
use crate::model::cipher::{CipherError, RecordKey};
use crate::model::headers::format_timestamp;
use crate::model::s2::{self, BasinConfig, EventId, StreamConfig};
use crate::model::{Offset, Record, names};
use crate::service::{
    S2Append, S2Batch, S2Limits, S2Position, S2Record, S2Start, Stream, StreamError, StreamSummary,
    now_ms,
};

/// How often an idle SSE session hears a `ping`.
const PING_INTERVAL: Duration = Duration::from_secs(10);
const MAX_LIST_LIMIT: usize = 1000;
const BASIN_NAME_RULE: &str = "basin names are 8-48 characters of a-z, 0-9 and '-', starting and ending with a letter or digit";

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/basins", get(list_basins).post(create_basin))
        .route("/v1/basins/{basin}", any(basin))
        .route("/v1/streams", get(list_streams).post(create_stream))
        .route("/v1/streams/{stream}", any(stream))
        .route("/v1/streams/{stream}/records", any(records))
        .route("/v1/streams/{stream}/records/tail", get(check_tail))
        .route("/v1/access-tokens", any(not_implemented))
        .route("/v1/access-tokens/{id}", any(not_implemented))
}

/// An S2 error response: `{"code","message"}` (or the special 412/416 bodies).
struct S2Error {
    status: StatusCode,
    body: Value,
}

impl S2Error {
    fn new(status: StatusCode, code: &str, message: impl std::fmt::Display) -> Self {
        S2Error {
            status,
            body: json!({ "code": code, "message": message.to_string() }),
        }
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
                return S2Error {
                    status: StatusCode::PRECONDITION_FAILED,
                    body: json!({ "fencing_token_mismatch": current }),
                };
            }
            StreamError::SeqNumMismatch { next } => {
                return S2Error {
                    status: StatusCode::PRECONDITION_FAILED,
                    body: json!({ "seq_num_mismatch": next }),
                };
            }
            StreamError::BeyondTail { tail, timestamp_ms } => {
                let position = S2Position {
                    seq_num: tail,
                    timestamp: u64::try_from(timestamp_ms).unwrap_or(0),
                };
                return S2Error {
                    status: StatusCode::RANGE_NOT_SATISFIABLE,
                    body: json!({ "tail": position_json(position) }),
                };
            }
            StreamError::NotFound | StreamError::Gone => {
                (StatusCode::NOT_FOUND, "stream_not_found")
            }
            StreamError::BucketNotFound => (StatusCode::NOT_FOUND, "basin_not_found"),
            StreamError::AlreadyExists(_) => (StatusCode::CONFLICT, "resource_already_exists"),
            StreamError::Conflict(_) => (StatusCode::CONFLICT, "transaction_conflict"),
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

impl From<Rejection> for S2Error {
    fn from(r: Rejection) -> Self {
        let code = if r.status == StatusCode::PAYLOAD_TOO_LARGE {
            "invalid"
        } else {
            "bad_request"
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

fn bad(code: &str, message: impl std::fmt::Display) -> S2Error {
    let status = if code == "invalid" {
        StatusCode::UNPROCESSABLE_ENTITY
    } else {
        StatusCode::BAD_REQUEST
    };
    S2Error::new(status, code, message)
}

fn json_response(status: StatusCode, body: Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn position_json(position: S2Position) -> Value {
    json!({ "seq_num": position.seq_num, "timestamp": position.timestamp })
}

async fn not_implemented() -> Response {
    S2Error::new(
        StatusCode::NOT_IMPLEMENTED,
        "not_implemented",
        "access tokens are not supported yet",
    )
    .into_response()
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

fn valid_basin(name: &str) -> Result<String, S2Error> {
    names::validate_bucket_id(name).map_err(|e| bad("bad_header", e))?;
    Ok(name.to_string())
}

fn valid_stream(basin: &str, stream: &str) -> Result<(), S2Error> {
    names::bucket_stream_key(basin, stream)
        .map(|_| ())
        .map_err(|e| bad("bad_path", e))
}

fn stream_key(basin: &str, stream: &str) -> Result<String, S2Error> {
    names::bucket_stream_key(basin, stream).map_err(|e| bad("bad_path", e))
}

/// A JSON request body; any problem with it is `bad_json`.
async fn json_body<T: serde::de::DeserializeOwned>(
    app: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<Option<T>, S2Error> {
    let bytes = request::body(headers, body, app.config.max_body_bytes).await?;
    if bytes.is_empty() {
        return Ok(None);
    }
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(crate::model::content_type::is_json);
    if !is_json {
        return Err(bad("bad_json", "expected Content-Type: application/json"));
    }
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| bad("bad_json", e))
}

fn limit_of(query: &Query) -> Result<usize, S2Error> {
    match query.get("limit")? {
        None => Ok(MAX_LIST_LIMIT),
        Some(text) => text
            .parse::<usize>()
            .map(|n| n.clamp(1, MAX_LIST_LIMIT))
            .map_err(|_| bad("bad_query", "limit must be an integer")),
    }
}

// ---- basins ----------------------------------------------------------------------------------

fn basin_info(name: &str, created_ms: i64) -> Value {
    json!({ "name": name, "scope": null, "created_at": format_timestamp(created_ms), "deleted_at": null, "state": "active" })
}

fn config_json<T: serde::Serialize + Default + serde::de::DeserializeOwned>(
    stored: Option<&Value>,
) -> Value {
    let typed: T = stored
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .unwrap_or_default();
    serde_json::to_value(typed).unwrap_or(Value::Null)
}

async fn list_basins(State(app): State<AppState>, RawQuery(query): RawQuery) -> Response {
    let result = (|| {
        let query = Query::parse(query.as_deref());
        let prefix = query.get("prefix")?.unwrap_or_default();
        let (page, has_more) =
            app.service
                .list_buckets(prefix, query.get("start_after")?, limit_of(&query)?);
        let basins: Vec<Value> = page
            .iter()
            .map(|(name, meta)| basin_info(name, meta.created_ms))
            .collect();
        Ok::<_, S2Error>(json_response(
            StatusCode::OK,
            json!({ "basins": basins, "has_more": has_more }),
        ))
    })();
    result.unwrap_or_else(IntoResponse::into_response)
}

#[derive(Deserialize)]
struct CreateBasin {
    basin: String,
    #[serde(default)]
    config: Option<Value>,
}

async fn create_basin(State(app): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let result = async {
        let request: CreateBasin = json_body(&app, &headers, body)
            .await?
            .ok_or_else(|| bad("bad_json", "a body is required"))?;
        if !s2::is_valid_basin_name(&request.basin) {
            return Err(bad(
                "invalid",
                "basin names are 8-48 characters of a-z, 0-9 and '-', starting and ending with a letter or digit",
            ));
        }
        let config = validated_basin(&app, request.config)?;
        app.service.create_bucket(&request.basin, config).await?;
        let info = app.service.bucket_info(&request.basin)?;
        Ok::<_, S2Error>(json_response(
            StatusCode::CREATED,
            basin_info(&request.basin, info.created_ms),
        ))
    };
    result.await.unwrap_or_else(IntoResponse::into_response)
}

/// A configuration object that parses as `T` (unknown fields refused).
fn validated<T: serde::de::DeserializeOwned>(
    config: Option<Value>,
) -> Result<Option<Value>, S2Error> {
    match config {
        None | Some(Value::Null) => Ok(None),
        Some(value) => {
            crate::service::parse_s2_config::<T>(&value)?;
            Ok(Some(value))
        }
    }
}

fn validated_basin(app: &AppState, config: Option<Value>) -> Result<Option<Value>, S2Error> {
    match config {
        None | Some(Value::Null) => Ok(None),
        Some(value) => {
            app.service.check_basin_config(&value)?;
            Ok(Some(value))
        }
    }
}

/// The `s2-encryption-key` header, when sent.
fn key_of(headers: &HeaderMap) -> Result<Option<RecordKey>, S2Error> {
    headers
        .get("s2-encryption-key")
        .map(|value| {
            let text = value
                .to_str()
                .map_err(|_| bad("bad_header", "s2-encryption-key is not text"))?;
            RecordKey::from_base64(text).map_err(|e| bad("bad_header", e))
        })
        .transpose()
}

#[derive(Deserialize, Default)]
struct Reconfigure {
    #[serde(default)]
    config: Option<Value>,
}

async fn basin(
    State(app): State<AppState>,
    Path(basin): Path<String>,
    method: Method,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let result = async {
        if method == Method::PUT
            && !s2::is_valid_basin_name(&basin)
            && names::validate_bucket_id(&basin).is_err()
        {
            return Err(bad("invalid", BASIN_NAME_RULE));
        }
        names::validate_bucket_id(&basin).map_err(|e| bad("bad_path", e))?;
        match method {
            Method::GET => {
                let info = app.service.bucket_info(&basin)?;
                Ok(json_response(
                    StatusCode::OK,
                    config_json::<BasinConfig>(info.s2_config.as_ref()),
                ))
            }
            Method::PUT => {
                let request: Reconfigure =
                    json_body(&app, &headers, body).await?.unwrap_or_default();
                let config = validated_basin(&app, request.config)?;
                if app.service.bucket_info(&basin).is_err() && !s2::is_valid_basin_name(&basin) {
                    return Err(bad("invalid", BASIN_NAME_RULE));
                }
                match app.service.create_bucket(&basin, config.clone()).await {
                    Ok(()) => {
                        let info = app.service.bucket_info(&basin)?;
                        Ok(json_response(
                            StatusCode::CREATED,
                            basin_info(&basin, info.created_ms),
                        ))
                    }
                    Err(StreamError::AlreadyExists(_)) => {
                        if let Some(config) = config {
                            app.service.reconfigure_basin(&basin, &config).await?;
                        }
                        let info = app.service.bucket_info(&basin)?;
                        Ok(json_response(
                            StatusCode::OK,
                            basin_info(&basin, info.created_ms),
                        ))
                    }
                    Err(e) => Err(e.into()),
                }
            }
            Method::PATCH => {
                let patch: Value = json_body(&app, &headers, body)
                    .await?
                    .unwrap_or(Value::Object(Default::default()));
                let config = app.service.reconfigure_basin(&basin, &patch).await?;
                Ok(json_response(
                    StatusCode::OK,
                    config_json::<BasinConfig>(Some(&config)),
                ))
            }
            Method::DELETE => {
                app.service.delete_basin(&basin).await?;
                Ok(StatusCode::ACCEPTED.into_response())
            }
            _ => Err(method_not_allowed()),
        }
    };
    result.await.unwrap_or_else(IntoResponse::into_response)
}

// ---- streams ---------------------------------------------------------------------------------

fn stream_info(summary: &StreamSummary) -> Value {
    json!({
        "name": summary.stream_id,
        "created_at": format_timestamp(summary.created_ms),
        "deleted_at": null,
        "cipher": summary.cipher,
    })
}

/// The `StreamInfo` of a stream just created or confirmed.
async fn stream_info_of(app: &AppState, key: &str) -> Result<Value, S2Error> {
    let stream = app.service.find(key, false).await?;
    Ok(stream_info(&app.service.stream_summary(&stream)))
}

async fn list_streams(
    State(app): State<AppState>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    let result = (|| {
        let basin = basin_of(&headers)?;
        let query = Query::parse(query.as_deref());
        let prefix = query.get("prefix")?.unwrap_or_default();
        let listing = app.service.list_streams(
            &basin,
            prefix,
            query.get("start_after")?,
            limit_of(&query)?,
        )?;
        let streams: Vec<Value> = listing.streams.iter().map(stream_info).collect();
        Ok::<_, S2Error>(json_response(
            StatusCode::OK,
            json!({ "streams": streams, "has_more": listing.has_more }),
        ))
    })();
    result.unwrap_or_else(IntoResponse::into_response)
}

#[derive(Deserialize)]
struct CreateStream {
    stream: String,
    #[serde(default)]
    config: Option<Value>,
}

async fn create_stream(State(app): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    let result = async {
        let basin = basin_of(&headers)?;
        let request: CreateStream = json_body(&app, &headers, body)
            .await?
            .ok_or_else(|| bad("bad_json", "a body is required"))?;
        valid_stream(&basin, &request.stream)?;
        let config = validated::<StreamConfig>(request.config)?;
        app.service
            .create_s2_stream(&basin, &request.stream, config)
            .await?;
        let key = stream_key(&basin, &request.stream)?;
        Ok::<_, S2Error>(json_response(
            StatusCode::CREATED,
            stream_info_of(&app, &key).await?,
        ))
    };
    result.await.unwrap_or_else(IntoResponse::into_response)
}

async fn stream(
    State(app): State<AppState>,
    Path(name): Path<String>,
    method: Method,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let result = async {
        let basin = basin_of(&headers)?;
        let key = stream_key(&basin, &name)?;
        match method {
            Method::GET => {
                app.service.bucket_info(&basin)?;
                let stream = app.service.find(&key, false).await?;
                Ok(json_response(
                    StatusCode::OK,
                    config_json::<StreamConfig>(Some(&app.service.stream_config_of(&stream))),
                ))
            }
            Method::PUT => {
                let request: Reconfigure =
                    json_body(&app, &headers, body).await?.unwrap_or_default();
                let config = validated::<StreamConfig>(request.config)?;
                match app
                    .service
                    .create_s2_stream(&basin, &name, config.clone())
                    .await
                {
                    Ok(()) => Ok(json_response(
                        StatusCode::CREATED,
                        stream_info_of(&app, &key).await?,
                    )),
                    Err(StreamError::AlreadyExists(_)) => {
                        if let Some(config) = config {
                            app.service.reconfigure_stream(&key, &config).await?;
                        }
                        Ok(json_response(
                            StatusCode::OK,
                            stream_info_of(&app, &key).await?,
                        ))
                    }
                    Err(e) => Err(e.into()),
                }
            }
            Method::PATCH => {
                app.service.bucket_info(&basin)?;
                let patch: Value = json_body(&app, &headers, body)
                    .await?
                    .unwrap_or(Value::Object(Default::default()));
                let config = app.service.reconfigure_stream(&key, &patch).await?;
                Ok(json_response(
                    StatusCode::OK,
                    config_json::<StreamConfig>(Some(&config)),
                ))
            }
            Method::DELETE => {
                app.service.bucket_info(&basin)?;
                app.service.delete(&key).await?;
                Ok(StatusCode::ACCEPTED.into_response())
            }
            _ => Err(method_not_allowed()),
        }
    };
    result.await.unwrap_or_else(IntoResponse::into_response)
}

/// Finds the stream of a records request, creating it when the basin is configured to.
async fn records_stream(
    app: &AppState,
    headers: &HeaderMap,
    name: &str,
    on_append: bool,
) -> Result<Arc<Stream>, S2Error> {
    let basin = basin_of(headers)?;
    valid_stream(&basin, name)?;
    let config = app.service.basin_config(&basin)?;
    let auto = if on_append {
        config.create_stream_on_append
    } else {
        config.create_stream_on_read
    };
    let requested = match headers.get("s2-stream-config") {
        Some(value) => {
            let text = value
                .to_str()
                .map_err(|_| bad("bad_header", "s2-stream-config is not text"))?;
            Some(
                serde_json::from_str(text)
                    .map_err(|e| bad("bad_header", format!("s2-stream-config: {e}")))?,
            )
        }
        None => Some(Value::Null),
    };
    Ok(app
        .service
        .s2_stream(&basin, name, if auto { requested.as_ref() } else { None })
        .await?)
}

async fn check_tail(
    State(app): State<AppState>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Response {
    let result = async {
        let stream = records_stream(&app, &headers, &name, false).await?;
        Ok::<_, S2Error>(json_response(
            StatusCode::OK,
            json!({ "tail": position_json(app.service.tail_position(&stream)) }),
        ))
    };
    result.await.unwrap_or_else(IntoResponse::into_response)
}

// ---- records ---------------------------------------------------------------------------------

/// How record bytes travel in JSON (`s2-format`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Format {
    Raw,
    Base64,
}

impl Format {
    fn of(headers: &HeaderMap) -> Result<Format, S2Error> {
        match headers
            .get("s2-format")
            .map(|v| v.to_str().unwrap_or("?").trim())
        {
            None | Some("raw") | Some("json") => Ok(Format::Raw),
            Some("base64") | Some("json-binsafe") => Ok(Format::Base64),
            Some(other) => Err(bad("bad_header", format!("unknown s2-format {other:?}"))),
        }
    }

    fn decode(self, text: &str) -> Result<Bytes, S2Error> {
        match self {
            Format::Raw => Ok(Bytes::copy_from_slice(text.as_bytes())),
            Format::Base64 => base64::engine::general_purpose::STANDARD
                .decode(text)
                .map(Bytes::from)
                .map_err(|e| bad("invalid", format!("invalid base64: {e}"))),
        }
    }

    fn encode(self, bytes: &[u8]) -> String {
        match self {
            Format::Raw => String::from_utf8_lossy(bytes).into_owned(),
            Format::Base64 => base64::engine::general_purpose::STANDARD.encode(bytes),
        }
    }
}

#[derive(Deserialize)]
struct AppendInput {
    records: Vec<AppendRecord>,
    #[serde(default)]
    match_seq_num: Option<u64>,
    #[serde(default)]
    fencing_token: Option<String>,
}

#[derive(Deserialize)]
struct AppendRecord {
    #[serde(default)]
    timestamp: Option<u64>,
    #[serde(default)]
    headers: Vec<(String, String)>,
    #[serde(default)]
    body: Option<String>,
}

async fn records(
    State(app): State<AppState>,
    Path(name): Path<String>,
    method: Method,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let result = match method {
        Method::POST => append(&app, &name, &headers, body).await,
        Method::GET => read(&app, &name, query.as_deref(), &headers).await,
        _ => Err(method_not_allowed()),
    };
    result.unwrap_or_else(IntoResponse::into_response)
}

async fn append(app: &AppState, name: &str, headers: &HeaderMap, body: Body) -> S2Result {
    let format = Format::of(headers)?;
    let input: AppendInput = json_body(app, headers, body)
        .await?
        .ok_or_else(|| bad("bad_json", "a body is required"))?;
    let mut records = Vec::with_capacity(input.records.len());
    for record in input.records {
        let mut decoded = Vec::with_capacity(record.headers.len());
        for (header_name, value) in &record.headers {
            decoded.push((format.decode(header_name)?, format.decode(value)?));
        }
        let body = format.decode(record.body.as_deref().unwrap_or_default())?;
        records.push(S2Record {
            timestamp: record.timestamp,
            headers: decoded,
            body,
        });
    }
    let stream = records_stream(app, headers, name, true).await?;
    let append = S2Append {
        records,
        match_seq_num: input.match_seq_num,
        fencing_token: input.fencing_token,
    };
    let ack = app
        .service
        .s2_append(&stream, append, key_of(headers)?.as_ref())
        .await?;
    Ok(json_response(
        StatusCode::OK,
        json!({ "start": position_json(ack.start), "end": position_json(ack.end), "tail": position_json(ack.tail) }),
    ))
}

/// The read request's parameters, parsed.
struct ReadRequest {
    start: Option<S2Start>,
    clamp: bool,
    limits: S2Limits,
    wait: Option<u64>,
}

fn parse_read(query: Option<&str>) -> Result<ReadRequest, S2Error> {
    let query = Query::parse(query);
    let number = |name: &str| -> Result<Option<u64>, S2Error> {
        query
            .get(name)?
            .map(|v| {
                v.parse::<u64>().map_err(|_| {
                    bad(
                        "bad_query",
                        format!("{name} must be a non-negative integer"),
                    )
                })
            })
            .transpose()
    };
    let starts = [
        number("seq_num")?.map(S2Start::SeqNum),
        number("timestamp")?.map(S2Start::Timestamp),
        number("tail_offset")?.map(S2Start::TailOffset),
    ];
    let mut given = starts.into_iter().flatten();
    let start = given.next();
    if given.next().is_some() {
        return Err(bad(
            "invalid",
            "give at most one of seq_num, timestamp and tail_offset",
        ));
    }
    let clamp = match query.get("clamp")? {
        None => false,
        Some("true") => true,
        Some("false") => false,
        Some(_) => return Err(bad("bad_query", "clamp must be true or false")),
    };
    let limits = S2Limits {
        count: number("count")?,
        bytes: number("bytes")?,
        until: number("until")?,
    };
    if let (Some(S2Start::Timestamp(ts)), Some(until)) = (start, limits.until)
        && ts >= until
    {
        return Err(bad("invalid", "timestamp must be before until"));
    }
    let wait = number("wait")?;
    if wait.is_some_and(|w| w > u64::from(u32::MAX)) {
        return Err(bad("bad_query", "wait is too large"));
    }
    Ok(ReadRequest {
        start,
        clamp,
        limits,
        wait,
    })
}

fn wants_sse(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .and_then(|accept| accept.split(',').next())
        .is_some_and(|first| first.trim().starts_with("text/event-stream"))
}

async fn read(app: &AppState, name: &str, query: Option<&str>, headers: &HeaderMap) -> S2Result {
    let format = Format::of(headers)?;
    let key = key_of(headers)?;
    let mut request = parse_read(query)?;
    let sse = wants_sse(headers);
    let resume = match headers.get("last-event-id") {
        Some(value) if sse => Some(
            value
                .to_str()
                .ok()
                .and_then(EventId::parse)
                .ok_or_else(|| bad("bad_header", "Last-Event-ID must be seq_num,count,bytes"))?,
        ),
        _ => None,
    };
    let stream = records_stream(app, headers, name, false).await?;
    let bounded = request.limits.count.is_some()
        || request.limits.bytes.is_some()
        || request.limits.until.is_some();
    let wait = request.wait.unwrap_or(0);
    // Unary reads are always bounded, so they follow only when asked to wait.
    let may_follow = if sse { !bounded || wait > 0 } else { wait > 0 };
    if let Some(resume) = resume {
        request.start = Some(S2Start::SeqNum(resume.last_seq + 1));
        request.limits.count = request.limits.count.map(|c| c.saturating_sub(resume.count));
        request.limits.bytes = request.limits.bytes.map(|b| b.saturating_sub(resume.bytes));
    }
    let start = app
        .service
        .s2_resolve(
            &stream,
            request.start.unwrap_or(S2Start::TailOffset(0)),
            request.clamp,
        )
        .await?;
    let durable = stream.durable();
    if start >= durable.tail.seq && !may_follow {
        return Err(StreamError::BeyondTail {
            tail: durable.tail.seq,
            timestamp_ms: durable.last_timestamp_ms,
        }
        .into());
    }
    if stream.encrypted && key.is_none() {
        return Err(StreamError::KeyRequired.into());
    }
    if sse {
        let idle = request.wait.map(Duration::from_secs);
        let session = Session {
            start,
            limits: request.limits,
            may_follow,
            idle,
            resume,
            format,
            key,
        };
        return Ok(sse_session(app, stream, session));
    }
    let mut batch = app
        .service
        .s2_read(
            &stream,
            start,
            request.limits,
            s2::UNARY_MAX_RECORDS,
            s2::UNARY_MAX_BYTES,
        )
        .await?;
    if batch.records.is_empty() && !batch.limit_reached && wait > 0 {
        let timeout = Duration::from_secs(wait.min(s2::UNARY_MAX_WAIT_SECS));
        app.service
            .wait_beyond(&stream, Offset::new(start.max(batch.next_seq), 0), timeout)
            .await;
        batch = app
            .service
            .s2_read(
                &stream,
                start,
                request.limits,
                s2::UNARY_MAX_RECORDS,
                s2::UNARY_MAX_BYTES,
            )
            .await?;
    }
    app.service
        .s2_open(&stream, key.as_ref(), &mut batch.records)?;
    Ok(json_response(StatusCode::OK, batch_json(&batch, format)))
}

fn record_json(record: &Record, format: Format) -> Value {
    let mut out = json!({ "seq_num": record.seq, "timestamp": u64::try_from(record.timestamp_ms).unwrap_or(0) });
    if !record.headers.is_empty() {
        let headers: Vec<Value> = record
            .headers
            .iter()
            .map(|(n, v)| json!([format.encode(n), format.encode(v)]))
            .collect();
        out["headers"] = Value::Array(headers);
    }
    if !record.body.is_empty() {
        out["body"] = json!(format.encode(&record.body));
    }
    out
}

fn batch_json(batch: &S2Batch, format: Format) -> Value {
    let records: Vec<Value> = batch
        .records
        .iter()
        .map(|r| record_json(r, format))
        .collect();
    let mut out = json!({ "records": records });
    if batch.at_tail && !batch.records.is_empty() {
        out["tail"] = position_json(batch.tail);
    }
    out
}

/// What an SSE read session was asked for.
struct Session {
    start: u64,
    limits: S2Limits,
    may_follow: bool,
    /// How long the session may go without a new record before it ends.
    idle: Option<Duration>,
    resume: Option<EventId>,
    format: Format,
    key: Option<RecordKey>,
}

/// An SSE read session: `batch` events, a `ping` on catching up and while idle, `[DONE]` when a
/// limit or the idle wait ends it, an `error` event when it fails.
fn sse_session(app: &AppState, stream: Arc<Stream>, session: Session) -> Response {
    let service = app.service.clone();
    let Session {
        start,
        limits,
        may_follow,
        idle,
        resume,
        format,
        key,
    } = session;
    let events = async_stream::stream! {
        let mut next = start;
        let mut count = resume.map_or(0, |r| r.count);
        let mut bytes = resume.map_or(0, |r| r.bytes);
        let mut remaining = limits;
        let mut caught_up = false;
        let mut idle_deadline = idle.map(|d| Instant::now() + d);
        loop {
            let read = service.s2_read(&stream, next, remaining, s2::UNARY_MAX_RECORDS, s2::UNARY_MAX_BYTES).await;
            let batch = match read.and_then(|mut batch| {
                service.s2_open(&stream, key.as_ref(), &mut batch.records).map(|()| batch)
            }) {
                Ok(batch) => batch,
                Err(e) => {
                    yield Ok::<Bytes, std::io::Error>(error_event(e));
                    return;
                }
            };
            if let Some(last) = batch.records.last() {
                count += batch.records.len() as u64;
                bytes += batch.metered;
                remaining.count = remaining.count.map(|c| c.saturating_sub(batch.records.len() as u64));
                remaining.bytes = remaining.bytes.map(|b| b.saturating_sub(batch.metered));
                let id = EventId { last_seq: last.seq, count, bytes };
                next = batch.next_seq;
                idle_deadline = idle.map(|d| Instant::now() + d);
                yield Ok(Bytes::from(format!("event: batch\nid: {id}\ndata: {}\n\n", batch_json(&batch, format))));
            }
            if batch.limit_reached || (batch.at_tail && !may_follow) {
                yield Ok(Bytes::from_static(b"data: [DONE]\n\n"));
                return;
            }
            if !batch.at_tail {
                continue;
            }
            if !caught_up {
                caught_up = true;
                yield Ok(ping(service.tail_position(&stream)));
            }
            // Caught up: wait for new records, pinging while idle, until the idle bound passes.
            loop {
                let now = Instant::now();
                if idle_deadline.is_some_and(|d| now >= d) {
                    yield Ok(Bytes::from_static(b"data: [DONE]\n\n"));
                    return;
                }
                let wait = idle_deadline.map_or(PING_INTERVAL, |d| PING_INTERVAL.min(d - now));
                let seen = service.wait_beyond(&stream, Offset::new(next, 0), wait).await;
                if seen.removed {
                    yield Ok(error_event(StreamError::NotFound));
                    return;
                }
                if seen.tail.seq > next {
                    break;
                }
                if seen.closed {
                    // Closed through Durable Streams: no record will ever follow.
                    yield Ok(Bytes::from_static(b"data: [DONE]\n\n"));
                    return;
                }
                yield Ok(ping(service.tail_position(&stream)));
            }
        }
    };
    let mut response = (StatusCode::OK, Body::from_stream(events)).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache, no-transform"),
    );
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

fn ping(tail: S2Position) -> Bytes {
    let data =
        json!({ "timestamp": u64::try_from(now_ms()).unwrap_or(0), "tail": position_json(tail) });
    Bytes::from(format!("event: ping\ndata: {data}\n\n"))
}

fn error_event(error: StreamError) -> Bytes {
    let S2Error { body, .. } = S2Error::from(error);
    Bytes::from(format!("event: error\ndata: {body}\n\n"))
}
