//! Append-batch framing (seed 000 §4): `uint32_be length | payload`, repeated.

use bytes::Bytes;

/// The most frames one batch may carry.
pub const MAX_FRAMES: usize = 512;
/// The largest batch body.
pub const MAX_BATCH_BYTES: usize = 32 << 20;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("frame {0} is empty; zero-length frames are invalid")]
    Empty(usize),
    #[error(
        "frame {index} is truncated: its 4-byte length and payload need {needed} bytes, and the \
         body has {left} left"
    )]
    Truncated {
        index: usize,
        /// Bytes the frame needs from where it starts: its 4-byte length, then its payload
        /// (4 while its length is not all there).
        needed: usize,
        /// Bytes the body has from there.
        left: usize,
    },
    #[error("a batch carries at most {MAX_FRAMES} frames")]
    TooMany,
    #[error(
        "the batch is empty: it carries at least one frame (a 4-byte big-endian length, then \
         that many bytes)"
    )]
    NoFrames,
}

/// Splits a batch body into its frames, each a zero-copy slice of `body`.
pub fn parse_frames(body: &Bytes) -> Result<Vec<Bytes>, FrameError> {
    let mut frames = Vec::new();
    let mut at = 0usize;
    while at < body.len() {
        let index = frames.len();
        if index == MAX_FRAMES {
            return Err(FrameError::TooMany);
        }
        let left = body.len() - at;
        let header = body.get(at..at + 4).ok_or(FrameError::Truncated {
            index,
            needed: 4,
            left,
        })?;
        let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
        if len == 0 {
            return Err(FrameError::Empty(index));
        }
        let start = at + 4;
        let end = start
            .checked_add(len)
            .filter(|end| *end <= body.len())
            .ok_or(FrameError::Truncated {
                index,
                needed: len.saturating_add(4),
                left,
            })?;
        frames.push(body.slice(start..end));
        at = end;
    }
    if frames.is_empty() {
        return Err(FrameError::NoFrames);
    }
    Ok(frames)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn frame(payload: &[u8]) -> Vec<u8> {
        let mut out = (payload.len() as u32).to_be_bytes().to_vec();
        out.extend_from_slice(payload);
        out
    }

    #[test]
    fn frames_split_at_their_length_prefixes() {
        let body = Bytes::from([frame(b"ab"), frame(b"c")].concat());
        assert_eq!(
            parse_frames(&body).unwrap(),
            vec![Bytes::from("ab"), Bytes::from("c")]
        );
    }

    #[test]
    fn empty_truncated_and_oversized_batches_are_refused() {
        assert_eq!(
            parse_frames(&Bytes::from(frame(b""))),
            Err(FrameError::Empty(0))
        );
        assert_eq!(
            parse_frames(&Bytes::from(vec![0, 0, 0])),
            Err(FrameError::Truncated {
                index: 0,
                needed: 4,
                left: 3
            })
        );
        assert_eq!(
            parse_frames(&Bytes::from([frame(b"a"), vec![0, 0, 0, 5, b'x']].concat())),
            Err(FrameError::Truncated {
                index: 1,
                needed: 9,
                left: 5
            })
        );
        assert_eq!(parse_frames(&Bytes::new()), Err(FrameError::NoFrames));
        let many = Bytes::from(frame(b"x").repeat(MAX_FRAMES + 1));
        assert_eq!(parse_frames(&many), Err(FrameError::TooMany));
        assert_eq!(
            parse_frames(&Bytes::from(frame(b"x").repeat(MAX_FRAMES)))
                .unwrap()
                .len(),
            MAX_FRAMES
        );
    }

    proptest! {
        #[test]
        fn arbitrary_bodies_never_panic(body in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = parse_frames(&Bytes::from(body));
        }

        #[test]
        fn framed_payloads_round_trip(payloads in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..16), 1..20)) {
            let body = Bytes::from(payloads.iter().flat_map(|p| frame(p)).collect::<Vec<u8>>());
            let frames = parse_frames(&body).unwrap();
            prop_assert_eq!(frames.iter().map(|f| f.to_vec()).collect::<Vec<_>>(), payloads);
        }
    }
}
