//! S2S frames (`s2s/proto`), the binary session wire of S2's CLI and SDKs: a 3-byte length, a
//! flag byte, a protobuf message (see [`super::s2_proto`]). The frame format itself is the
//! `s2-api` crate's; this file frames read batches without copying their large bodies, splits
//! a batch too large for one frame, and says when a message fits no frame.

use bytes::{Bytes, BytesMut};
use prost::Message as _;
use prost::encoding;
use s2_api::v1::stream::proto;
use s2_api::v1::stream::s2s::{CompressionAlgorithm, SessionMessage, TerminalMessage};

/// The largest frame S2 clients accept: its flag byte and payload, without the length prefix.
pub const MAX_FRAME_BYTES: usize = 2 << 20;

/// Record bodies at least this long go into a read session's body as they are, shared with the
/// stored records; shorter ones are copied into the frame, since one write of many tiny pieces
/// costs more than copying them.
const SHARE_BODIES_FROM: usize = 16 * 1024;

/// A message that fits no frame.
///
/// Only a read can meet one: the Durable Streams face takes records up to `--max-body-bytes`,
/// and one over 2 MiB fits no frame an S2 client decodes (nor does an S2 record of very many
/// tiny headers, which protobuf spells out at twice their metered size). That is no fault of
/// the server's, and the stream is fine: the message names the ways to read such a record.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0}: a record this large can only be read with the JSON records API or the Durable Streams \
     face"
)]
pub struct Unframable(String);

/// The terminal frame that ends a session: the HTTP status and the JSON error body a unary
/// call would get.
pub fn terminal(status: u16, body: String) -> Bytes {
    SessionMessage::Terminal(TerminalMessage { status, body }).encode()
}

/// A regular frame holding `message`.
pub fn frame(
    compression: CompressionAlgorithm,
    message: &impl prost::Message,
) -> Result<Bytes, Unframable> {
    if compression == CompressionAlgorithm::None {
        return uncompressed_frame(message).map_err(|size| {
            Unframable(format!(
                "a batch of {size} bytes exceeds the {MAX_FRAME_BYTES}-byte S2S frame limit"
            ))
        });
    }
    SessionMessage::regular(compression, message)
        .map(|m| m.encode())
        .map_err(|e| Unframable(e.to_string()))
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
fn frame_head(size: usize, room: usize) -> BytesMut {
    let mut head = BytesMut::with_capacity(3 + room);
    head.extend_from_slice(&(size as u32).to_be_bytes()[1..]);
    head.extend_from_slice(&[0]);
    head
}

/// A `ReadBatch` as frames, their pieces pushed to `out`. A batch too large for one frame is
/// split in two (the tail told with the second half), and so on: a read's batch keeps to 1 MiB
/// metered, but records of many short headers take about twice that in protobuf. `Err` when a
/// single record fits no frame, after the frames of the records before it.
pub fn batch_frames(
    compression: CompressionAlgorithm,
    mut message: proto::ReadBatch,
    out: &mut Vec<Bytes>,
) -> Result<(), Unframable> {
    if message.records.len() > 1 && 1 + message.encoded_len() > MAX_FRAME_BYTES {
        let second = proto::ReadBatch {
            records: message.records.split_off(message.records.len() / 2),
            tail: message.tail.take(),
        };
        batch_frames(compression, message, out)?;
        return batch_frames(compression, second, out);
    }
    out.extend(batch_frame(compression, message)?);
    Ok(())
}

/// A `ReadBatch`'s frame, in pieces: uncompressed, the larger record bodies are not copied (a
/// catch-up of 64 KiB records spent a tenth of its time copying them into frames). The pieces
/// together are the bytes [`frame`] gives.
fn batch_frame(
    compression: CompressionAlgorithm,
    message: proto::ReadBatch,
) -> Result<Vec<Bytes>, Unframable> {
    let size = 1 + message.encoded_len();
    // Compressed, or too large to frame (`frame` then says so): one piece.
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

#[cfg(test)]
mod tests;
