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
    #[error("frame {0} is truncated")]
    Truncated(usize),
    #[error("a batch carries at most {MAX_FRAMES} frames")]
    TooMany,
    #[error("a batch carries at least one frame")]
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
        let header = body.get(at..at + 4).ok_or(FrameError::Truncated(index))?;
        let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
        if len == 0 {
            return Err(FrameError::Empty(index));
        }
        let start = at + 4;
        let end = start
            .checked_add(len)
            .filter(|end| *end <= body.len())
            .ok_or(FrameError::Truncated(index))?;
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
            Err(FrameError::Truncated(0))
        );
        assert_eq!(
            parse_frames(&Bytes::from([frame(b"a"), vec![0, 0, 0, 5, b'x']].concat())),
            Err(FrameError::Truncated(1))
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
