//! Read bodies gathered from stored records without joining the large ones: a catch-up read
//! hands the socket the engine's own buffers, and only small records are copied together.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::service::{ReadLease, SharedBody};
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

/// Pieces at least this long are sent as they are. Shorter ones are copied into a shared buffer,
/// because one write of many tiny pieces costs more than copying them.
const SEND_AS_IS_FROM: usize = 16 * 1024;

/// Builds a body piece by piece.
#[derive(Default)]
pub struct Gather {
    pieces: VecDeque<Bytes>,
    /// A small stored piece not copied yet: a body of one small record (a live tail's usual
    /// read) then goes out without a copy.
    held: Option<Bytes>,
    pending: Vec<u8>,
    /// How much `pending` reserves once something is copied into it. Reserving lazily keeps a
    /// body that turns out to be one small held record free of allocation.
    copy_hint: usize,
    len: u64,
}

impl Gather {
    /// A gather with room for the pieces of these lengths that it will copy, plus `extra` bytes.
    pub fn sized_for(lengths: impl Iterator<Item = usize>, extra: usize) -> Self {
        let copied: usize = lengths.filter(|len| *len < SEND_AS_IS_FROM).sum();
        Gather {
            copy_hint: copied + extra,
            ..Gather::default()
        }
    }

    /// Appends a stored buffer, shared rather than copied when it is large.
    pub fn push(&mut self, piece: &Bytes) {
        if piece.len() >= SEND_AS_IS_FROM {
            self.flush_pending();
            self.pieces.push_back(piece.clone());
            self.len += piece.len() as u64;
        } else if self.pending.is_empty() && self.held.is_none() {
            self.held = Some(piece.clone());
            self.len += piece.len() as u64;
        } else {
            self.push_slice(piece);
        }
    }

    /// Appends bytes by copying them.
    pub fn push_slice(&mut self, bytes: &[u8]) {
        if self.pending.capacity() == 0 {
            self.pending.reserve(self.copy_hint.max(bytes.len()));
        }
        if let Some(held) = self.held.take() {
            self.pending.extend_from_slice(&held);
        }
        self.pending.extend_from_slice(bytes);
        self.len += bytes.len() as u64;
    }

    pub fn finish(mut self) -> Pieces {
        self.flush_pending();
        Pieces {
            pieces: self.pieces,
            remaining: self.len,
            ..Pieces::default()
        }
    }

    fn flush_pending(&mut self) {
        if let Some(held) = self.held.take() {
            self.pieces.push_back(held);
        } else if !self.pending.is_empty() {
            self.pieces
                .push_back(Bytes::from(std::mem::take(&mut self.pending)));
        }
    }
}

/// A body of known length sent as a sequence of buffers.
#[derive(Debug, Default)]
pub struct Pieces {
    pieces: VecDeque<Bytes>,
    remaining: u64,
    /// The read memory its records count against, given back once the body is gone.
    _lease: ReadLease,
    /// The shared body it sends, whose read memory is given back once nobody holds it.
    _shared: Option<Arc<SharedBody>>,
}

impl Pieces {
    /// A body of one buffer.
    pub fn of(bytes: Bytes) -> Pieces {
        Pieces {
            remaining: bytes.len() as u64,
            pieces: VecDeque::from([bytes]),
            ..Pieces::default()
        }
    }

    /// This body, holding `lease` for as long as it lives.
    pub fn holding(self, lease: ReadLease) -> Pieces {
        Pieces {
            _lease: lease,
            ..self
        }
    }

    /// `pieces` of a body kept for every reader of its range, held while this is sent.
    pub fn shared(body: Arc<SharedBody>, pieces: &[Bytes]) -> Pieces {
        Pieces {
            pieces: pieces.iter().cloned().collect(),
            remaining: body.len() as u64,
            _shared: Some(body),
            ..Pieces::default()
        }
    }

    pub fn byte_len(&self) -> u64 {
        self.remaining
    }

    /// The whole body in one buffer; free when it is a single piece.
    pub fn into_bytes(mut self) -> Bytes {
        match self.pieces.len() {
            0 => Bytes::new(),
            1 => self.pieces.pop_front().unwrap_or_default(),
            _ => {
                let mut joined = Vec::with_capacity(usize::try_from(self.remaining).unwrap_or(0));
                for piece in &self.pieces {
                    joined.extend_from_slice(piece);
                }
                Bytes::from(joined)
            }
        }
    }
}

/// The pieces themselves, for a body that streams them among other frames.
impl IntoIterator for Pieces {
    type Item = Bytes;
    type IntoIter = std::collections::vec_deque::IntoIter<Bytes>;

    fn into_iter(self) -> Self::IntoIter {
        self.pieces.into_iter()
    }
}

impl Body for Pieces {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let next = self.pieces.pop_front();
        if let Some(piece) = &next {
            self.remaining -= piece.len() as u64;
        }
        Poll::Ready(next.map(|piece| Ok(Frame::data(piece))))
    }

    fn is_end_stream(&self) -> bool {
        self.pieces.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    fn big(byte: u8) -> Bytes {
        Bytes::from(vec![byte; SEND_AS_IS_FROM])
    }

    #[test]
    fn large_pieces_are_shared_not_copied() {
        let large = big(b'a');
        let mut gather = Gather::default();
        gather.push(&large);
        let body = gather.finish().into_bytes();
        assert_eq!(body.as_ptr(), large.as_ptr());
    }

    #[test]
    fn a_lone_small_piece_is_shared_not_copied() {
        let small = Bytes::from_static(b"one record");
        let mut gather = Gather::default();
        gather.push(&small);
        assert_eq!(gather.finish().into_bytes().as_ptr(), small.as_ptr());
    }

    #[test]
    fn small_pieces_are_joined_once_there_are_two() {
        let mut gather = Gather::default();
        gather.push(&Bytes::from_static(b"ab"));
        gather.push(&Bytes::from_static(b"cd"));
        gather.push_slice(b"e");
        let pieces = gather.finish();
        assert_eq!(pieces.pieces.len(), 1);
        assert_eq!(pieces.into_bytes(), "abcde");
    }

    #[test]
    fn small_pieces_between_large_ones_are_joined_in_order() {
        let mut gather = Gather::default();
        gather.push_slice(b"[");
        gather.push(&Bytes::from_static(b"1"));
        gather.push(&big(b'x'));
        gather.push_slice(b",");
        gather.push(&Bytes::from_static(b"2"));
        let pieces = gather.finish();
        assert_eq!(pieces.pieces.len(), 3, "small, large, small");
        assert_eq!(pieces.size_hint().exact(), Some(4 + SEND_AS_IS_FROM as u64));
        let mut expected = b"[1".to_vec();
        expected.extend(std::iter::repeat_n(b'x', SEND_AS_IS_FROM));
        expected.extend_from_slice(b",2");
        assert_eq!(pieces.into_bytes(), expected);
    }

    #[tokio::test]
    async fn the_body_reports_its_exact_length_and_yields_every_piece() {
        let mut gather = Gather::default();
        gather.push(&big(b'a'));
        gather.push(&big(b'b'));
        let body = gather.finish();
        assert_eq!(body.size_hint().exact(), Some(2 * SEND_AS_IS_FROM as u64));
        let collected = body.collect().await.unwrap().to_bytes();
        assert_eq!(collected.len(), 2 * SEND_AS_IS_FROM);
        assert!(collected[..SEND_AS_IS_FROM].iter().all(|b| *b == b'a'));
        assert!(collected[SEND_AS_IS_FROM..].iter().all(|b| *b == b'b'));
    }

    #[test]
    fn an_empty_gather_is_an_empty_body() {
        let body = Gather::default().finish();
        assert!(body.is_end_stream());
        assert_eq!(body.size_hint().exact(), Some(0));
    }
}
