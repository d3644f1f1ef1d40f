//! S2S sessions (`Content-Type: s2s/proto`), the binary streaming wire of S2's CLI and SDKs, and
//! unary protobuf bodies of the records API. The messages are [`s2_proto`]'s and their frames
//! [`s2s_frame`]'s; this file carries them over HTTP.
//!
//! A read session (GET) sends `ReadBatch` frames: records, then an empty batch carrying the tail
//! as a heartbeat. An append session (POST) reads `AppendInput` frames and answers each with an
//! `AppendAck`, in order, while later inputs are already being sequenced. A failure ends either
//! session with a terminal frame: the HTTP status and the JSON error body a unary call would get.

use futures::stream::FuturesOrdered;
use futures::{Stream as FuturesStream, StreamExt as _};
use s2_api::v1::stream::s2s::{CompressionAlgorithm, FrameDecoder, SessionMessage};
use tokio_util::codec::FramedRead;
use tokio_util::io::StreamReader;

use super::*;
use crate::model::wire::s2_proto::{self, AppendInputError};
use crate::model::wire::s2s_frame::{self, Unframable};
use crate::service::ReadLease;
use crate::service::sessions::s2_read::{self, Session, SessionEvent};

pub(in crate::http) const CONTENT_TYPE: &str = "s2s/proto";

/// Whether a request opens an S2S session.
pub(super) fn is_session(headers: &HeaderMap) -> bool {
    media_type(headers, header::CONTENT_TYPE).is_some_and(|m| m.eq_ignore_ascii_case(CONTENT_TYPE))
}

/// Whether a media type is protobuf, as S2 clients name it.
pub(super) fn is_protobuf(media_type: &str) -> bool {
    media_type.eq_ignore_ascii_case("application/protobuf")
        || media_type.eq_ignore_ascii_case("application/x-protobuf")
}

/// The first media type of a header, without parameters.
pub(super) fn media_type(headers: &HeaderMap, name: header::HeaderName) -> Option<&str> {
    let value = headers.get(name)?.to_str().ok()?;
    let first = value.split(',').next()?;
    Some(first.split(';').next()?.trim())
}

impl From<AppendInputError> for S2Error {
    fn from(error: AppendInputError) -> Self {
        match error {
            AppendInputError::Batch(e) => e.into(),
            other => bad("bad_proto", other),
        }
    }
}

/// A unary protobuf response.
pub(super) fn protobuf_response(message: &impl prost::Message) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/protobuf")],
        message.encode_to_vec(),
    )
        .into_response()
}

fn terminal(error: S2Error) -> Bytes {
    s2s_frame::terminal(error.status.as_u16(), error.body.to_string())
}

/// The terminal frame for a message that fits no frame: 422, the stream being fine.
fn unframable(error: Unframable) -> Bytes {
    terminal(S2Error::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid",
        error,
    ))
}

/// A read session over S2S.
pub(super) fn read_session(
    app: &AppState,
    headers: &HeaderMap,
    stream: Arc<Stream>,
    session: Session,
) -> Response {
    let compression = CompressionAlgorithm::from_accept_encoding(headers);
    let events = s2_read::events(app.service.clone(), stream, session);
    let frames = async_stream::stream! {
        futures::pin_mut!(events);
        while let Some(event) = events.next().await {
            let (pieces, goes_on) = session_frames(event, compression);
            for piece in pieces {
                yield Ok::<Bytes, std::io::Error>(piece);
            }
            if !goes_on {
                return;
            }
        }
    };
    streaming_response(Body::from_stream(frames), CONTENT_TYPE)
}

/// One session event's frames, and whether the session goes on after them.
fn session_frames(event: SessionEvent, compression: CompressionAlgorithm) -> (Vec<Bytes>, bool) {
    let mut lease = ReadLease::default();
    let message = match event {
        SessionEvent::Batch { mut batch, .. } => {
            lease = std::mem::take(&mut batch.lease);
            s2_proto::read_batch(&batch.records, told_tail(&batch))
        }
        SessionEvent::Heartbeat(tail) => s2_proto::heartbeat(tail),
        SessionEvent::End => return (Vec::new(), false),
        SessionEvent::Failed(error) => return (vec![terminal(error.into())], false),
    };
    let mut pieces = Vec::new();
    let framed = s2s_frame::batch_frames(compression, message, &mut pieces);
    let goes_on = framed.is_ok();
    if let Err(error) = framed {
        pieces.push(unframable(error));
    }
    // The read's memory stays counted until the batch's last piece is sent.
    if let Some(last) = pieces.pop() {
        pieces.push(lease.with_bytes(last));
    }
    (pieces, goes_on)
}

/// The `AppendInput`s a client sends in an append session, until its body ends.
fn inputs(body: Body) -> impl FuturesStream<Item = Result<S2Append, S2Error>> + Send {
    let reader =
        StreamReader::new(body.into_data_stream().map(|chunk| {
            chunk.map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
        }));
    FramedRead::new(reader, FrameDecoder).map(move |frame| match frame {
        Ok(SessionMessage::Regular(data)) => Ok(s2_proto::append_of_frame(data)?),
        Ok(SessionMessage::Terminal(_)) => {
            Err(bad("bad_proto", "a client does not send terminal frames"))
        }
        Err(e) => Err(bad("bad_proto", format!("invalid frame: {e}"))),
    })
}

/// An append session over S2S: each input is sequenced as soon as it arrives (once `admit` lets
/// it, checking it and the caller's permission for its commands), and the acks go back in input
/// order as the batches become durable. The first failure ends the session with
/// a terminal frame, after the acks of every input sequenced before it.
pub(super) fn append_session(
    app: &AppState,
    headers: &HeaderMap,
    stream: Arc<Stream>,
    key: Option<RecordKey>,
    admit: impl Fn(S2Append) -> Result<CheckedAppend, S2Error> + Send + 'static,
    body: Body,
) -> Response {
    let compression = CompressionAlgorithm::from_accept_encoding(headers);
    let service = app.service.clone();
    let frames = async_stream::stream! {
        let inputs = inputs(body);
        futures::pin_mut!(inputs);
        let mut pending = FuturesOrdered::new();
        let mut inputs_open = true;
        let mut failure: Option<S2Error> = None;
        loop {
            tokio::select! {
                biased;
                Some(acked) = pending.next(), if !pending.is_empty() => match acked {
                    Ok(ack) => match s2s_frame::frame(compression, &s2_proto::ack_message(&ack)) {
                        Ok(bytes) => yield Ok::<Bytes, std::io::Error>(bytes),
                        Err(error) => {
                            yield Ok(unframable(error));
                            return;
                        }
                    },
                    Err(error) => {
                        yield Ok(terminal(S2Error::from(error)));
                        return;
                    }
                },
                input = inputs.next(), if inputs_open && failure.is_none() => match input {
                    None => inputs_open = false,
                    Some(Err(error)) => failure = Some(error),
                    Some(Ok(append)) => match admit(append) {
                        Err(refused) => failure = Some(refused),
                        Ok(append) => match service.sequence_records(&stream, append, key.as_ref()).await {
                            Ok(ack) => pending.push_back(ack),
                            Err(error) => failure = Some(error.into()),
                        },
                    },
                },
                else => break,
            }
        }
        if let Some(error) = failure {
            yield Ok(terminal(error));
        }
    };
    streaming_response(Body::from_stream(frames), CONTENT_TYPE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_util::codec::Decoder as _;

    #[tokio::test]
    async fn an_s2s_batch_holds_its_read_memory_until_its_last_frame_is_sent() {
        let (service, stream, session) = s2_read::tests::session_over_one_record().await;
        let events = s2_read::events(service.clone(), stream, session);
        futures::pin_mut!(events);
        let batch = events.next().await.expect("a batch");
        let (frames, goes_on) = session_frames(batch, CompressionAlgorithm::None);
        assert!(goes_on && !frames.is_empty());
        assert!(
            service.read_memory_held() > 0,
            "held while it waits to be sent"
        );
        drop(frames);
        assert_eq!(service.read_memory_held(), 0, "given back once sent");
    }

    #[test]
    fn a_message_that_fits_no_frame_ends_the_session_with_a_terminal_422() {
        let frame = unframable(
            s2s_frame::frame(
                CompressionAlgorithm::None,
                &s2_proto::read_batch(&[big_record()], None),
            )
            .unwrap_err(),
        );
        let decoded = FrameDecoder
            .decode(&mut bytes::BytesMut::from(&frame[..]))
            .unwrap();
        let Some(SessionMessage::Terminal(terminal)) = decoded else {
            panic!("expected a terminal frame, got {decoded:?}");
        };
        assert_eq!(terminal.status, 422);
        let body: Value = serde_json::from_str(&terminal.body).unwrap();
        assert_eq!(body["code"], "invalid");
    }

    fn big_record() -> crate::model::Record {
        crate::model::Record {
            seq: 0,
            pos: 0,
            timestamp_ms: 0,
            arrival_ms: 0,
            starts_unit: true,
            headers: Vec::new(),
            body: Bytes::from(vec![b'b'; s2s_frame::MAX_FRAME_BYTES]),
            command: false,
        }
    }
}
