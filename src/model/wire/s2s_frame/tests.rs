use bytes::Bytes;
use prost::Message as _;
use s2_api::v1::stream::proto;
use s2_api::v1::stream::s2s::{CompressionAlgorithm, FrameDecoder, SessionMessage};
use tokio_util::codec::Decoder as _;

use super::*;

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
fn records_before_one_too_large_for_a_frame_are_framed_then_it_is_unframable() {
    let message = read_batch(&[10, 20, MAX_FRAME_BYTES]);
    let mut pieces = Vec::new();
    assert!(batch_frames(CompressionAlgorithm::None, message, &mut pieces).is_err());
    let sent: usize = decode_all(&pieces)
        .iter()
        .map(|m| match m {
            SessionMessage::Regular(data) => data
                .clone()
                .try_into_proto::<proto::ReadBatch>()
                .unwrap()
                .records
                .len(),
            other => panic!("expected regular frames, got {other:?}"),
        })
        .sum();
    assert_eq!(sent, 2);
}

#[test]
fn a_message_larger_than_a_frame_is_unframable_and_says_how_to_read_it() {
    let message = read_batch(&[MAX_FRAME_BYTES]);
    let framed = [
        frame(CompressionAlgorithm::None, &message),
        batch_frame(CompressionAlgorithm::None, message).map(|pieces| pieces.concat().into()),
    ];
    for framed in framed {
        let Err(unframable) = framed else {
            panic!("a frame over the limit was framed");
        };
        let reason = unframable.to_string();
        assert!(
            reason.contains("exceeds the 2097152-byte S2S frame limit"),
            "{reason}"
        );
        assert!(
            reason.ends_with("the JSON records API or the Durable Streams face"),
            "{reason}"
        );
    }
}

#[test]
fn a_terminal_frame_carries_the_status_and_body() {
    let mut frame = bytes::BytesMut::from(&terminal(422, "{}".into())[..]);
    let decoded = FrameDecoder.decode(&mut frame).unwrap();
    assert!(
        matches!(decoded, Some(SessionMessage::Terminal(t)) if t.status == 422 && t.body == "{}")
    );
}
