//! Read bodies sent as the pieces they were gathered in (see `model::wire::gather`), holding
//! the read memory their records count against until they are gone.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;

use crate::model::wire::gather::Gathered;
use crate::service::{ReadLease, SharedBody};
use http_body::{Body, Frame, SizeHint};

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
}

impl From<Gathered> for Pieces {
    fn from(body: Gathered) -> Self {
        Pieces {
            pieces: body.pieces,
            remaining: body.len,
            ..Pieces::default()
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
    use http_body_util::BodyExt;

    use super::*;
    use crate::model::wire::gather::Gather;

    #[tokio::test]
    async fn the_body_reports_its_exact_length_and_yields_every_piece() {
        let big = |byte| Bytes::from(vec![byte; 20_000]);
        let mut gather = Gather::default();
        gather.push(&big(b'a'));
        gather.push(&big(b'b'));
        let body = Pieces::from(gather.finish());
        assert_eq!(body.size_hint().exact(), Some(40_000));
        let collected = body.collect().await.unwrap().to_bytes();
        assert_eq!(collected.len(), 40_000);
        assert!(collected[..20_000].iter().all(|b| *b == b'a'));
        assert!(collected[20_000..].iter().all(|b| *b == b'b'));
    }

    #[test]
    fn an_empty_gather_is_an_empty_body() {
        let body = Pieces::from(Gather::default().finish());
        assert!(body.is_end_stream());
        assert_eq!(body.size_hint().exact(), Some(0));
    }
}
