//! What can go wrong in a stream operation, independent of the face that reports it.

use crate::model::Offset;
use crate::model::producer::ProducerError;
use crate::storage::StorageError;

#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("{0}")]
    BadRequest(String),
    #[error("stream not found")]
    NotFound,
    #[error("bucket not found")]
    BucketNotFound,
    #[error("stream has been deleted")]
    Gone,
    #[error("{0}")]
    Conflict(&'static str),
    #[error("stream is closed")]
    Closed { tail: Offset },
    #[error("content type does not match the stream's")]
    ContentTypeMismatch,
    #[error("Stream-Seq must increase: {received:?} is not greater than {last:?}")]
    StreamSeqRegression { last: String, received: String },
    #[error(transparent)]
    Producer(#[from] ProducerError),
    #[error("fork source not found")]
    ForkSourceNotFound,
    #[error("fork source has been deleted")]
    ForkSourceGone,
    #[error("{0}")]
    BadOffset(&'static str),
    #[error(transparent)]
    Storage(#[from] StorageError),
}

pub type StreamResult<T> = Result<T, StreamError>;
