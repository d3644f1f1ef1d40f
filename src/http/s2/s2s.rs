//! S2S sessions (`Content-Type: s2s/proto`), the binary streaming wire of S2's CLI and SDKs, and
//! the protobuf forms of the records API's messages. Framing and the `s2.v1` message types come
//! from the `s2-api` crate; this file only maps them to and from the service's types.
//!
//! A read session (GET) sends `ReadBatch` frames: records, then an empty batch carrying the tail
//! as a heartbeat. An append session (POST) reads `AppendInput` frames and answers each with an
//! `AppendAck`, in order, while later inputs are already being sequenced. A failure ends either
//! session with a terminal frame: the HTTP status and the JSON error body a unary call would get.

use futures::stream::FuturesOrdered;
use futures::{Stream as FuturesStream, StreamExt as _};
use prost::{Message as _, encoding};
use s2_api::v1::stream::proto;
use s2_api::v1::stream::s2s::{
    CompressionAlgorithm, FrameDecoder, SessionMessage, TerminalMessage,
};
use tokio_util::codec::FramedRead;
use tokio_util::io::StreamReader;

use super::session::{self, Session, SessionEvent};
use super::*;
use crate::service::ReadLease;
use crate::service::S2Ack;

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

/// The largest protobuf `AppendInput` a valid batch makes: protobuf spells a header out in at
/// most twice its metered bytes, a record's own fields in at most 19 bytes against its 8
/// metered ones, and a batch holds at most 1 MiB metered in 1000 records. A larger body is
/// refused before it is decoded.
const MAX_APPEND_INPUT_BYTES: usize = 3 << 20;

/// A unary protobuf `AppendInput`, refused as [`S2Append::check`] would refuse it when it is
/// larger than any valid batch or holds too many records, before it is decoded: decoded, an
/// empty record weighs 72 bytes against its 2 on the wire.
pub(super) fn decode_append(bytes: &[u8]) -> Result<S2Append, S2Error> {
    if bytes.len() > MAX_APPEND_INPUT_BYTES {
        return Err(s2::BatchError::TooLarge.into());
    }
    check_record_count(decode(bytes)?)?;
    Ok(append_of(decode(bytes)?))
}

/// An `AppendInput` read only for how many records it holds: each decodes to nothing, so
/// counting them allocates nothing.
#[derive(Clone, PartialEq, prost::Message)]
struct RecordCount {
    #[prost(message, repeated, tag = "1")]
    records: Vec<()>,
}

fn check_record_count(count: RecordCount) -> Result<(), S2Error> {
    if count.records.len() > s2::MAX_BATCH_RECORDS {
        return Err(s2::BatchError::RecordCount.into());
    }
    Ok(())
}

/// The records of an `AppendInput`, as the service takes them.
pub(super) fn append_of(input: proto::AppendInput) -> S2Append {
    S2Append {
        records: input
            .records
            .into_iter()
            .map(|r| S2Record {
                timestamp: r.timestamp,
                headers: r.headers.into_iter().map(|h| (h.name, h.value)).collect(),
                body: r.body,
            })
            .collect(),
        match_seq_num: input.match_seq_num,
        fencing_token: input.fencing_token,
    }
}

fn position(p: S2Position) -> proto::StreamPosition {
    proto::StreamPosition {
        seq_num: p.seq_num,
        timestamp: p.timestamp,
    }
}

pub(super) fn ack_message(ack: &S2Ack) -> proto::AppendAck {
    proto::AppendAck {
        start: Some(position(ack.start)),
        end: Some(position(ack.end)),
        tail: Some(position(ack.tail)),
    }
}

/// A batch as `ReadBatch`; the tail is only told when the batch reached it, as in JSON.
pub(super) fn batch_message(batch: &S2Batch) -> proto::ReadBatch {
    let records = batch
        .records
        .iter()
        .map(|r| proto::SequencedRecord {
            seq_num: r.seq,
            timestamp: u64::try_from(r.timestamp_ms).unwrap_or(0),
            headers: r
                .headers
                .iter()
                .map(|(name, value)| proto::Header {
                    name: name.clone(),
                    value: value.clone(),
                })
                .collect(),
            body: r.body.clone(),
        })
        .collect();
    let tail = (batch.at_tail && !batch.records.is_empty()).then(|| position(batch.tail));
    proto::ReadBatch { records, tail }
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

/// A protobuf request body; anything that does not decode is `bad_proto`.
pub(super) fn decode<M: prost::Message + Default>(bytes: &[u8]) -> Result<M, S2Error> {
    M::decode(bytes).map_err(|e| bad("bad_proto", format!("invalid protobuf: {e}")))
}

fn terminal(error: S2Error) -> Bytes {
    SessionMessage::Terminal(TerminalMessage {
        status: error.status.as_u16(),
        body: error.body.to_string(),
    })
    .encode()
}

/// The largest frame S2 clients accept: its flag byte and payload, without the length prefix.
const MAX_FRAME_BYTES: usize = 2 << 20;

/// A regular frame, or (should a message not fit a frame) the terminal frame saying so.
///
/// Only a read can meet a message too large: the Durable Streams face takes records up to
/// `--max-body-bytes`, and one over 2 MiB fits no frame an S2 client decodes (nor does an S2
/// record of very many tiny headers, which protobuf spells out at twice their metered size).
/// That is no fault of the server's, and the stream is fine: the session ends with a 422 naming
/// the ways to read such a record.
fn frame(compression: CompressionAlgorithm, message: &impl prost::Message) -> Result<Bytes, Bytes> {
    let unframable = |e: &dyn std::fmt::Display| {
        terminal(S2Error::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            format!(
                "{e}: a record this large can only be read with the JSON records API or the \
                 Durable Streams face"
            ),
        ))
    };
    if compression == CompressionAlgorithm::None {
        return uncompressed_frame(message).map_err(|size| {
            unframable(&format!(
                "a batch of {size} bytes exceeds the {MAX_FRAME_BYTES}-byte S2S frame limit"
            ))
        });
    }
    SessionMessage::regular(compression, message)
        .map(|m| m.encode())
        .map_err(|e| unframable(&e))
}

/// An uncompressed regular frame, the message encoded straight into it: the 3-byte length of
/// what follows, a flag byte of 0, the message. The library's encoder encodes the message first
/// and then copies it into the frame, which in a read session copied every record body once
/// more. Refuses (with the frame's size) a message that does not fit a frame.
fn uncompressed_frame(message: &impl prost::Message) -> Result<Bytes, usize> {
    let size = 1 + message.encoded_len();
    if size > MAX_FRAME_BYTES {
        return Err(size);
    }
    let mut frame = frame_head(size, size);
    message.encode_raw(&mut frame);
    Ok(frame.freeze())
}

/// A buffer holding the start of an uncompressed regular frame of `size` bytes (flag byte and
/// payload), with room for `room` more bytes after its 3-byte length: the length, then a flag
/// byte of 0.
fn frame_head(size: usize, room: usize) -> bytes::BytesMut {
    let mut head = bytes::BytesMut::with_capacity(3 + room);
    head.extend_from_slice(&(size as u32).to_be_bytes()[1..]);
    head.extend_from_slice(&[0]);
    head
}

/// A read session over S2S.
pub(super) fn read_session(
    app: &AppState,
    headers: &HeaderMap,
    stream: Arc<Stream>,
    session: Session,
) -> Response {
    let compression = CompressionAlgorithm::from_accept_encoding(headers);
    let events = session::events(app.service.clone(), stream, session);
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
    session::streaming_response(Body::from_stream(frames), CONTENT_TYPE)
}

/// Record bodies at least this long go into a read session's body as they are, shared with the
/// stored records; shorter ones are copied into the frame, since one write of many tiny pieces
/// costs more than copying them.
const SHARE_BODIES_FROM: usize = 16 * 1024;

/// A `ReadBatch` as frames, their pieces pushed to `out`. A batch too large for one frame is
/// split in two (the tail told with the second half), and so on: a read's batch keeps to 1 MiB
/// metered, but records of many short headers take about twice that in protobuf. `Err` when a
/// single record fits no frame: its terminal frame is then the last piece pushed.
fn batch_frames(
    compression: CompressionAlgorithm,
    mut message: proto::ReadBatch,
    out: &mut Vec<Bytes>,
) -> Result<(), ()> {
    if message.records.len() > 1 && 1 + message.encoded_len() > MAX_FRAME_BYTES {
        let second = proto::ReadBatch {
            records: message.records.split_off(message.records.len() / 2),
            tail: message.tail.take(),
        };
        batch_frames(compression, message, out)?;
        return batch_frames(compression, second, out);
    }
    match batch_frame(compression, message) {
        Ok(pieces) => {
            out.extend(pieces);
            Ok(())
        }
        Err(terminal) => {
            out.push(terminal);
            Err(())
        }
    }
}

/// One session event's frames, and whether the session goes on after them.
fn session_frames(event: SessionEvent, compression: CompressionAlgorithm) -> (Vec<Bytes>, bool) {
    let mut lease = ReadLease::default();
    let message = match event {
        SessionEvent::Batch { mut batch, .. } => {
            lease = std::mem::take(&mut batch.lease);
            batch_message(&batch)
        }
        SessionEvent::Heartbeat(tail) => proto::ReadBatch {
            records: Vec::new(),
            tail: Some(position(tail)),
        },
        SessionEvent::End => return (Vec::new(), false),
        SessionEvent::Failed(error) => return (vec![terminal(error.into())], false),
    };
    let mut pieces = Vec::new();
    let framed = batch_frames(compression, message, &mut pieces);
    // The read's memory stays counted until the batch's last piece is sent.
    if let Some(last) = pieces.pop() {
        pieces.push(lease.with_bytes(last));
    }
    (pieces, framed.is_ok())
}

/// A `ReadBatch`'s frame, in pieces: uncompressed, the larger record bodies are not copied (a
/// catch-up of 64 KiB records spent a tenth of its time copying them into frames). The pieces
/// together are the bytes [`frame`] gives.
fn batch_frame(
    compression: CompressionAlgorithm,
    message: proto::ReadBatch,
) -> Result<Vec<Bytes>, Bytes> {
    let size = 1 + message.encoded_len();
    // Compressed, or too large to frame (`frame` then gives the terminal frame): one piece.
    if compression != CompressionAlgorithm::None || size > MAX_FRAME_BYTES {
        return frame(compression, &message).map(|frame| vec![frame]);
    }
    let shared: usize = message
        .records
        .iter()
        .map(|r| r.body.len())
        .filter(|len| *len >= SHARE_BODIES_FROM)
        .sum();
    let mut copied = frame_head(size, size - shared);
    let mut pieces = Vec::new();
    // Prost writes a message's fields in tag order, so a record's body (tag 4) comes last, after
    // the fields encoded without it.
    for mut record in message.records {
        let len = record.encoded_len();
        encoding::encode_key(1, encoding::WireType::LengthDelimited, &mut copied);
        encoding::encode_varint(len as u64, &mut copied);
        let body = std::mem::take(&mut record.body);
        record.encode_raw(&mut copied);
        if body.is_empty() {
            continue;
        }
        encoding::encode_key(4, encoding::WireType::LengthDelimited, &mut copied);
        encoding::encode_varint(body.len() as u64, &mut copied);
        if body.len() < SHARE_BODIES_FROM {
            copied.extend_from_slice(&body);
        } else {
            pieces.push(copied.split().freeze());
            pieces.push(body);
        }
    }
    if let Some(tail) = &message.tail {
        encoding::message::encode(2, tail, &mut copied);
    }
    if !copied.is_empty() {
        pieces.push(copied.freeze());
    }
    Ok(pieces)
}

/// The `AppendInput`s a client sends in an append session, until its body ends.
fn inputs(body: Body) -> impl FuturesStream<Item = Result<S2Append, S2Error>> + Send {
    let reader =
        StreamReader::new(body.into_data_stream().map(|chunk| {
            chunk.map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
        }));
    let invalid = |e: std::io::Error| bad("bad_proto", format!("invalid AppendInput frame: {e}"));
    FramedRead::new(reader, FrameDecoder).map(move |frame| match frame {
        Ok(SessionMessage::Regular(data)) => {
            // Counted first, as a unary body is: a frame of 2 MiB holds a million empty records.
            check_record_count(data.clone().try_into_proto().map_err(invalid)?)?;
            data.try_into_proto::<proto::AppendInput>()
                .map(append_of)
                .map_err(invalid)
        }
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
                    Ok(ack) => match frame(compression, &ack_message(&ack)) {
                        Ok(bytes) => yield Ok::<Bytes, std::io::Error>(bytes),
                        Err(last) => {
                            yield Ok(last);
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
                        Ok(append) => match service.s2_sequence(&stream, append, key.as_ref()).await {
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
    session::streaming_response(Body::from_stream(frames), CONTENT_TYPE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_util::codec::Decoder as _;

    #[tokio::test]
    async fn an_s2s_batch_holds_its_read_memory_until_its_last_frame_is_sent() {
        let (service, stream, session) = session::tests::session_over_one_record().await;
        let events = session::events(service.clone(), stream, session);
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

    fn read_batch(bodies: &[usize]) -> proto::ReadBatch {
        let records = bodies
            .iter()
            .enumerate()
            .map(|(i, len)| proto::SequencedRecord {
                seq_num: i as u64,
                timestamp: 1_700_000_000_000 + i as u64,
                headers: vec![proto::Header {
                    name: Bytes::from_static(b"name"),
                    value: Bytes::from(format!("value {i}")),
                }],
                body: Bytes::from(vec![b'b'; *len]),
            })
            .collect();
        proto::ReadBatch {
            records,
            tail: Some(proto::StreamPosition {
                seq_num: 9,
                timestamp: 10,
            }),
        }
    }

    #[test]
    fn an_uncompressed_frame_is_byte_for_byte_the_librarys() {
        for bodies in [vec![], vec![0], vec![10, 1000, 5], vec![100_000; 10]] {
            let message = read_batch(&bodies);
            let library = SessionMessage::regular(CompressionAlgorithm::None, &message)
                .unwrap()
                .encode();
            assert_eq!(frame(CompressionAlgorithm::None, &message), Ok(library));
        }
    }

    #[test]
    fn a_read_batch_frame_in_pieces_is_the_whole_frame_and_shares_large_bodies() {
        let shapes = [
            vec![],
            vec![0, 0],
            vec![10, 1000, 5],
            vec![SHARE_BODIES_FROM - 1, SHARE_BODIES_FROM],
            vec![100_000, 3, 70_000],
            vec![65_536; 15],
        ];
        for bodies in shapes {
            let message = read_batch(&bodies);
            let whole = frame(CompressionAlgorithm::None, &message).unwrap();
            let pieces = batch_frame(CompressionAlgorithm::None, message.clone()).unwrap();
            assert_eq!(pieces.concat(), whole, "bodies {bodies:?}");
            for record in message
                .records
                .iter()
                .filter(|r| r.body.len() >= SHARE_BODIES_FROM)
            {
                assert!(
                    pieces.iter().any(|p| p.as_ptr() == record.body.as_ptr()),
                    "a body of {} bytes was copied",
                    record.body.len()
                );
            }
        }
        let heartbeat = proto::ReadBatch {
            records: Vec::new(),
            tail: Some(proto::StreamPosition {
                seq_num: 3,
                timestamp: 4,
            }),
        };
        let whole = frame(CompressionAlgorithm::None, &heartbeat).unwrap();
        assert_eq!(
            batch_frame(CompressionAlgorithm::None, heartbeat).unwrap(),
            vec![whole]
        );
    }

    /// The messages of a run of frames.
    fn decode_all(pieces: &[Bytes]) -> Vec<SessionMessage> {
        let mut buffer = bytes::BytesMut::from(&pieces.concat()[..]);
        let mut messages = Vec::new();
        while let Some(message) = FrameDecoder.decode(&mut buffer).unwrap() {
            messages.push(message);
        }
        assert!(buffer.is_empty());
        messages
    }

    #[test]
    fn a_batch_too_large_for_a_frame_is_split_and_arrives_whole_with_the_tail_last() {
        // 40 records of 10,000 one-byte headers each: about 40 KB metered apiece, 80 KB in
        // protobuf; 3.2 MB together.
        let mut message = read_batch(&[10; 40]);
        for record in &mut message.records {
            record.headers = (0..10_000)
                .map(|_| proto::Header {
                    name: Bytes::from_static(b"n"),
                    value: Bytes::from_static(b"v"),
                })
                .collect();
        }
        assert!(message.encoded_len() > MAX_FRAME_BYTES);
        for compression in [CompressionAlgorithm::None, CompressionAlgorithm::Zstd] {
            let mut pieces = Vec::new();
            assert!(batch_frames(compression, message.clone(), &mut pieces).is_ok());
            let batches: Vec<proto::ReadBatch> = decode_all(&pieces)
                .into_iter()
                .map(|m| match m {
                    SessionMessage::Regular(data) => data.try_into_proto().unwrap(),
                    other => panic!("expected regular frames, got {other:?}"),
                })
                .collect();
            assert!(batches.len() > 1);
            let records: Vec<_> = batches.iter().flat_map(|b| b.records.clone()).collect();
            assert_eq!(records, message.records);
            let tails: Vec<bool> = batches.iter().map(|b| b.tail.is_some()).collect();
            assert_eq!(tails.last(), Some(&true));
            assert_eq!(tails.iter().filter(|t| **t).count(), 1);
        }
    }

    #[test]
    fn records_before_one_too_large_for_a_frame_are_sent_then_the_terminal() {
        let message = read_batch(&[10, 20, MAX_FRAME_BYTES]);
        let mut pieces = Vec::new();
        assert!(batch_frames(CompressionAlgorithm::None, message, &mut pieces).is_err());
        let messages = decode_all(&pieces);
        let sent: usize = messages
            .iter()
            .filter_map(|m| match m {
                SessionMessage::Regular(data) => Some(
                    data.clone()
                        .try_into_proto::<proto::ReadBatch>()
                        .unwrap()
                        .records
                        .len(),
                ),
                _ => None,
            })
            .sum();
        assert_eq!(sent, 2);
        assert!(matches!(messages.last(), Some(SessionMessage::Terminal(t)) if t.status == 422));
    }

    #[test]
    fn a_message_larger_than_a_frame_becomes_a_terminal_422() {
        let message = read_batch(&[MAX_FRAME_BYTES]);
        let framed = [
            frame(CompressionAlgorithm::None, &message),
            batch_frame(CompressionAlgorithm::None, message).map(|pieces| pieces.concat().into()),
        ];
        for framed in framed {
            let Err(last) = framed else {
                panic!("a frame over the limit was framed");
            };
            let decoded = FrameDecoder
                .decode(&mut bytes::BytesMut::from(&last[..]))
                .unwrap();
            assert!(matches!(decoded, Some(SessionMessage::Terminal(t)) if t.status == 422));
        }
    }
}
