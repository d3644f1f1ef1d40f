//! A body gathered from stored records without joining the large ones: a catch-up read hands
//! the socket the engine's own buffers, and only small pieces are copied together.

use std::collections::VecDeque;

use bytes::Bytes;

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

    pub fn finish(mut self) -> Gathered {
        self.flush_pending();
        Gathered {
            pieces: self.pieces,
            len: self.len,
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

/// A gathered body: its pieces, in order, and their length.
#[derive(Debug, Default)]
pub struct Gathered {
    pub pieces: VecDeque<Bytes>,
    pub len: u64,
}

impl Gathered {
    /// The whole body in one buffer; free when it is a single piece.
    pub fn into_bytes(mut self) -> Bytes {
        match self.pieces.len() {
            0 => Bytes::new(),
            1 => self.pieces.pop_front().unwrap_or_default(),
            _ => {
                let mut joined = Vec::with_capacity(usize::try_from(self.len).unwrap_or(0));
                for piece in &self.pieces {
                    joined.extend_from_slice(piece);
                }
                Bytes::from(joined)
            }
        }
    }
}

/// The pieces themselves, for a body that streams them among other frames.
impl IntoIterator for Gathered {
    type Item = Bytes;
    type IntoIter = std::collections::vec_deque::IntoIter<Bytes>;

    fn into_iter(self) -> Self::IntoIter {
        self.pieces.into_iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(pieces.len, 4 + SEND_AS_IS_FROM as u64);
        let mut expected = b"[1".to_vec();
        expected.extend(std::iter::repeat_n(b'x', SEND_AS_IS_FROM));
        expected.extend_from_slice(b",2");
        assert_eq!(pieces.into_bytes(), expected);
    }

    #[test]
    fn an_empty_gather_is_no_pieces() {
        let body = Gather::default().finish();
        assert!(body.pieces.is_empty());
        assert_eq!(body.len, 0);
    }
}
