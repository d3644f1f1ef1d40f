//! Append-batch framing: `batch::parse_frames` (`uint32_be length | payload`, repeated).
//!
//! Input: a batch body.
//! Properties: the result matches a straightforward reference parser exactly (frames or the
//! same error); frames that parse re-encode to exactly the body; limits hold.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use runnel::model::batch::{FrameError, MAX_FRAMES, parse_frames};

/// An independent reading of the framing rules.
fn reference(body: &[u8]) -> Result<Vec<&[u8]>, FrameError> {
    let mut frames = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        if frames.len() == MAX_FRAMES {
            return Err(FrameError::TooMany);
        }
        let index = frames.len();
        if rest.len() < 4 {
            return Err(FrameError::Truncated {
                index,
                needed: 4,
                left: rest.len(),
            });
        }
        let (header, tail) = rest.split_at(4);
        let len = u32::from_be_bytes(header.try_into().unwrap()) as usize;
        if len == 0 {
            return Err(FrameError::Empty(index));
        }
        if tail.len() < len {
            return Err(FrameError::Truncated {
                index,
                needed: 4 + len,
                left: rest.len(),
            });
        }
        let (frame, tail) = tail.split_at(len);
        frames.push(frame);
        rest = tail;
    }
    if frames.is_empty() {
        return Err(FrameError::NoFrames);
    }
    Ok(frames)
}

fuzz_target!(|data: &[u8]| {
    let body = Bytes::copy_from_slice(data);
    let parsed = parse_frames(&body);
    match (&parsed, reference(data)) {
        (Ok(frames), Ok(expected)) => {
            assert_eq!(frames.len(), expected.len());
            assert!((1..=MAX_FRAMES).contains(&frames.len()));
            let mut encoded = Vec::with_capacity(data.len());
            for (frame, want) in frames.iter().zip(&expected) {
                assert_eq!(frame.as_ref(), *want);
                assert!(!frame.is_empty());
                encoded.extend_from_slice(&(frame.len() as u32).to_be_bytes());
                encoded.extend_from_slice(frame);
            }
            assert_eq!(encoded, data, "frames must re-encode to the body");
        }
        (Err(error), Err(expected)) => assert_eq!(*error, expected),
        (got, expected) => panic!("parse_frames gave {got:?}, the reference {expected:?}"),
    }
});
