//! The S2 records API: append and read (unary JSON or protobuf, long-poll, and SSE or S2S
//! sessions) and check-tail.

use std::sync::Arc;

use futures::StreamExt as _;

use super::super::gather::Pieces;
use super::s2s;
use super::*;
use crate::model::wire::{s2_proto, s2_sse_event};
use crate::service::S2Reads;
use crate::service::sessions::s2_read::{self, S2ReadRequest, Session, SessionEvent};

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

/// What opens a stream: the basin may create a missing one on appends or on reads. Check-tail
/// creates like a read but ignores `s2-stream-config`, as S2 does.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Opening {
    Append,
    Read,
    CheckTail,
}

/// Finds the stream of a records request, creating it when the basin is configured to.
///
/// `keyed`: whether the request carries an encryption key. In a basin that seals its streams, an
/// append or a read without one is refused for the missing key before it creates anything.
async fn records_stream(
    app: &AppState,
    headers: &HeaderMap,
    name: &str,
    opening: Opening,
    keyed: bool,
) -> Result<Arc<Stream>, S2Error> {
    let basin = basin_of(headers)?;
    valid_stream(&basin, name)?;
    let requested = match opening {
        Opening::CheckTail => None,
        Opening::Append | Opening::Read => stream_config_header(headers)?,
    };
    let config = app.service.basin_config(&basin)?;
    let auto = match opening {
        Opening::Append => config.create_stream_on_append,
        Opening::Read | Opening::CheckTail => config.create_stream_on_read,
    };
    let refused_for_its_key =
        config.stream_cipher.is_some() && !keyed && opening != Opening::CheckTail;
    // `null`: no config asked for, so the basin's default.
    let requested = requested.unwrap_or(Value::Null);
    let create = auto && !refused_for_its_key;
    match app
        .service
        .stream_in_bucket(&basin, name, create.then_some(&requested))
        .await
    {
        // It would have been created, sealed, for records that could not be sealed.
        Err(StreamError::NotFound) if auto && refused_for_its_key => {
            Err(StreamError::KeyRequired.into())
        }
        found => Ok(found?),
    }
}

/// The `s2-stream-config` header: the config a stream this request auto-creates gets. It is
/// checked on every request, whether or not it creates anything; any fault is 400 `bad_header`.
fn stream_config_header(headers: &HeaderMap) -> Result<Option<Value>, S2Error> {
    let Some(value) = headers.get("s2-stream-config") else {
        return Ok(None);
    };
    let fault = |e: &dyn std::fmt::Display| bad("bad_header", format!("s2-stream-config: {e}"));
    let text = value
        .to_str()
        .map_err(|_| bad("bad_header", "s2-stream-config is not text"))?;
    let config: Value = serde_json::from_str(text).map_err(|e| fault(&e))?;
    crate::service::parse_s2_config::<StreamConfig>(&config).map_err(|e| fault(&e))?;
    Ok(Some(config))
}

pub(in crate::http) async fn check_tail(app: AppState, name: String, request: Request) -> Response {
    let headers = request.headers();
    let result = async {
        let stream = records_stream(&app, headers, &name, Opening::CheckTail, false).await?;
        Ok::<_, S2Error>(json_response(
            StatusCode::OK,
            json!({ "tail": s2_json::position(app.service.tail_position(&stream)) }),
        ))
    };
    result.await.unwrap_or_else(IntoResponse::into_response)
}

/// The `s2-format` of a request.
fn format_of(headers: &HeaderMap) -> Result<Format, S2Error> {
    let value = headers.get("s2-format").map(|v| v.to_str().unwrap_or("?"));
    Format::named(value).ok_or_else(|| {
        bad(
            "bad_header",
            format!("unknown s2-format {:?}", value.unwrap_or_default()),
        )
    })
}

impl From<s2::JsonInputError> for S2Error {
    fn from(error: s2::JsonInputError) -> Self {
        match error {
            s2::JsonInputError::Malformed(m) => bad("bad_json", m),
            s2::JsonInputError::Undecodable(m) => bad("invalid", m),
        }
    }
}

/// The records route. It takes the request whole: axum's header, URI and query extractors
/// would each copy theirs on every append.
pub(in crate::http) async fn records(
    app: AppState,
    principal: Arc<Principal>,
    name: String,
    request: Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let headers = &parts.headers;
    let result = match parts.method {
        Method::POST => match CommandGuard::new(principal, headers, &name) {
            Ok(guard) if s2s::is_session(headers) => {
                append_session(&app, &name, headers, guard, body).await
            }
            Ok(guard) => append(&app, &name, headers, &guard, body).await,
            Err(e) => Err(e),
        },
        Method::GET => read(&app, &name, parts.uri.query(), headers).await,
        _ => Err(method_not_allowed()),
    };
    result.unwrap_or_else(|e| e.at(&parts.uri))
}

/// Whether `request` (on the records route) is a unary append that S2's layers have nothing to
/// do for: a `POST` whose body is not compressed and which opens no session (its response, an
/// ack, is too small to compress).
pub(in crate::http) fn is_unary_append(request: &Request) -> bool {
    let headers = request.headers();
    request.method() == Method::POST
        && !headers.contains_key(header::CONTENT_ENCODING)
        && !s2s::is_session(headers)
}

/// Command records need their own permission (`fence`, `trim`) beyond `append`.
pub(super) struct CommandGuard {
    principal: Arc<Principal>,
    basin: String,
    stream: String,
}

impl CommandGuard {
    fn new(principal: Arc<Principal>, headers: &HeaderMap, stream: &str) -> Result<Self, S2Error> {
        Ok(CommandGuard {
            principal,
            basin: basin_of(headers)?,
            stream: stream.to_string(),
        })
    }

    /// Checks the batch on its own (422 when malformed), then the caller's permission for the
    /// commands it carries.
    pub(super) fn admit(&self, append: S2Append) -> Result<CheckedAppend, S2Error> {
        let append = append.check()?;
        self.permit_commands(&append)?;
        Ok(append)
    }

    fn permit_commands(&self, append: &CheckedAppend) -> Result<(), S2Error> {
        for record in &append.records {
            let op = match record.command {
                Some(s2::Command::Fence(_)) => Operation::Fence,
                Some(s2::Command::Trim(_)) => Operation::Trim,
                None => continue,
            };
            let resource = Resource::Stream {
                basin: &self.basin,
                stream: &self.stream,
            };
            permit(&self.principal, op, resource)?;
        }
        Ok(())
    }
}

async fn append_session(
    app: &AppState,
    name: &str,
    headers: &HeaderMap,
    guard: CommandGuard,
    body: Body,
) -> S2Result {
    let key = key_of(headers)?;
    let stream = records_stream(app, headers, name, Opening::Append, key.is_some()).await?;
    // Refused before the session opens, where the refusal can still redirect.
    StreamService::writable(&stream)?;
    let admit = move |append| guard.admit(append);
    Ok(s2s::append_session(app, headers, stream, key, admit, body))
}

async fn append(
    app: &AppState,
    name: &str,
    headers: &HeaderMap,
    guard: &CommandGuard,
    body: Body,
) -> S2Result {
    let protobuf_in = s2s::media_type(headers, header::CONTENT_TYPE).is_some_and(s2s::is_protobuf);
    let append = if protobuf_in {
        let bytes = request::body(headers, body, body_limits(app)).await?;
        s2_proto::decode_append(&bytes)?
    } else {
        json_append(app, headers, body).await?
    };
    let append = guard.admit(append)?;
    // A header fault is refused before the lookup, which may create the stream.
    let key = key_of(headers)?;
    let stream = records_stream(app, headers, name, Opening::Append, key.is_some()).await?;
    let ack = app
        .service
        .append_records(&stream, append, key.as_ref())
        .await?;
    if wants_protobuf(headers) {
        return Ok(s2s::protobuf_response(&s2_proto::ack_message(&ack)));
    }
    Ok(json_text_response(StatusCode::OK, s2_json::ack(&ack)))
}

/// A JSON `AppendInput`, its bytes decoded per `s2-format`.
async fn json_append(app: &AppState, headers: &HeaderMap, body: Body) -> Result<S2Append, S2Error> {
    let format = format_of(headers)?;
    let bytes = json_bytes(headers, body, body_limits(app)).await?;
    if bytes.is_empty() {
        return Err(bad("bad_json", "a body is required"));
    }
    let size = bytes.len();
    let parse = move || s2::parse_append_json(&bytes, format);
    Ok(crate::service::heavy::by_size(size, parse).await?)
}

/// Whether the response should be protobuf: the first media type of `Accept` says so.
fn wants_protobuf(headers: &HeaderMap) -> bool {
    s2s::media_type(headers, header::ACCEPT).is_some_and(s2s::is_protobuf)
}

/// The read request's query parameters.
fn parse_read(query: Option<&str>) -> Result<S2ReadRequest, S2Error> {
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
        number("seq_num")?.map(RecordStart::SeqNum),
        number("timestamp")?.map(RecordStart::Timestamp),
        number("tail_offset")?.map(RecordStart::TailOffset),
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
    let limits = ReadLimits {
        count: number("count")?,
        bytes: number("bytes")?,
        until: number("until")?,
    };
    if let (Some(RecordStart::Timestamp(ts)), Some(until)) = (start, limits.until)
        && ts >= until
    {
        return Err(bad("invalid", "timestamp must be before until"));
    }
    let wait = number("wait")?;
    if wait.is_some_and(|w| w > u64::from(u32::MAX)) {
        return Err(bad("bad_query", "wait is too large"));
    }
    Ok(S2ReadRequest {
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
    let format = format_of(headers)?;
    let key = key_of(headers)?;
    let mut request = parse_read(query)?;
    let s2s_session = s2s::is_session(headers);
    let sse = !s2s_session && wants_sse(headers);
    let streaming = sse || s2s_session;
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
    let stream = records_stream(app, headers, name, Opening::Read, key.is_some()).await?;
    let may_follow = request.may_follow(streaming);
    if let Some(resume) = resume {
        request = request.resumed(resume);
    }
    let start = app
        .service
        .s2_read_start(&stream, &request, may_follow)
        .await?;
    if stream.encrypted && key.is_none() {
        return Err(StreamError::KeyRequired.into());
    }
    if streaming {
        let session = Session {
            start,
            limits: request.limits,
            may_follow,
            idle: request.wait.map(Duration::from_secs),
            resume,
            key,
        };
        if s2s_session {
            return Ok(s2s::read_session(app, headers, stream, session));
        }
        return Ok(sse_session(app, stream, session, format));
    }
    let wait = request.wait.unwrap_or(0);
    let mut batch = if wait == 0 {
        let read = app.service.read_records(
            &stream,
            start,
            request.limits,
            s2::UNARY_MAX_RECORDS,
            s2::UNARY_MAX_BYTES,
        );
        let mut batch = read.await?;
        app.service
            .open_sealed(&stream, key.as_ref(), &mut batch.records)?;
        batch
    } else {
        let timeout = Duration::from_secs(wait.min(s2::UNARY_MAX_WAIT_SECS));
        let source = S2Reads::from(start, request.limits, key);
        s2_read::wait_for_records(&app.service, stream, source, timeout).await?
    };
    let (content_type, rendered) = if wants_protobuf(headers) {
        let message = s2_proto::read_batch(&batch.records, told_tail(&batch));
        (
            "application/protobuf",
            prost::Message::encode_to_vec(&message),
        )
    } else {
        let json = s2_json::read_batch(&batch.records, told_tail(&batch), format);
        ("application/json", json)
    };
    // The read memory its records took stays taken until the response is sent.
    let body = Pieces::of(Bytes::from(rendered)).holding(std::mem::take(&mut batch.lease));
    Ok((
        StatusCode::OK,
        [(header::CONTENT_TYPE, content_type)],
        Body::new(body),
    )
        .into_response())
}

/// A read session over SSE: `batch` events, `ping` heartbeats, `data: [DONE]` at a normal end,
/// an `error` event (and no `[DONE]`) when it fails.
fn sse_session(app: &AppState, stream: Arc<Stream>, session: Session, format: Format) -> Response {
    let rendered = s2_read::events(app.service.clone(), stream, session)
        .map(move |event| Ok::<Bytes, std::io::Error>(sse_event(event, format)));
    streaming_response(Body::from_stream(rendered), "text/event-stream")
}

/// One session event as SSE.
fn sse_event(event: SessionEvent, format: Format) -> Bytes {
    match event {
        SessionEvent::Batch { mut batch, id } => {
            let json = s2_json::read_batch(&batch.records, told_tail(&batch), format);
            let event = s2_sse_event::batch(id, &json);
            // The read's memory stays counted until the event is sent.
            std::mem::take(&mut batch.lease).with_bytes(event)
        }
        SessionEvent::Heartbeat(tail) => s2_sse_event::ping(now_ms(), tail),
        SessionEvent::End => Bytes::from_static(s2_sse_event::DONE),
        SessionEvent::Failed(error) => s2_sse_event::error(&S2Error::from(error).body),
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt as _;

    use super::*;

    #[tokio::test]
    async fn an_sse_batch_holds_its_read_memory_until_it_is_sent() {
        let (service, stream, session) = s2_read::tests::session_over_one_record().await;
        let events = s2_read::events(service.clone(), stream, session);
        futures::pin_mut!(events);
        let batch = events.next().await.expect("a batch");
        assert!(matches!(batch, SessionEvent::Batch { .. }));
        let rendered = sse_event(batch, Format::Raw);
        assert!(
            service.read_memory_held() > 0,
            "held while it waits to be sent"
        );
        drop(rendered);
        assert_eq!(service.read_memory_held(), 0, "given back once sent");
    }
}
