//! What can go wrong in a stream operation, independent of the face that reports it.

use crate::model::Offset;
use crate::model::cipher::CipherError;
use crate::model::ledger::Refusal;
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
    #[error("the bucket is being deleted")]
    BucketDeleting,
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
    #[error("offset is before the first retained offset {first}")]
    Retained { first: Offset },
    #[error("record is before the first retained record {first}")]
    RecordRetained { first: u64, next: u64 },
    #[error("record is beyond the record tail {next}")]
    RecordBeyondTail { next: u64 },
    #[error("Stream-Record-Match {expected} does not match the record tail {next}")]
    RecordMismatch {
        expected: u64,
        next: u64,
        tail: Offset,
    },
    #[error("record coordinates are only available on application/json streams")]
    NotRecordAware,
    #[error("no such snapshot")]
    SnapshotNotFound,
    #[error("{0}")]
    Invalid(String),
    #[error("fencing token does not match")]
    FencingMismatch { current: String },
    #[error("match_seq_num does not match the tail {next}")]
    SeqNumMismatch { next: u64 },
    #[error("the position is beyond the tail")]
    BeyondTail { tail: u64, timestamp_ms: i64 },
    #[error("{0} already exists")]
    AlreadyExists(&'static str),
    #[error("the stream is encrypted: read and write it through S2 with its s2-encryption-key")]
    Encrypted,
    #[error("this stream is a read-only mirror; write to its upstream {upstream}")]
    Mirrored { upstream: String },
    #[error("this stream is encrypted: send its key in s2-encryption-key")]
    KeyRequired,
    #[error("{0}")]
    Forbidden(String),
    /// A configured limit (streams per bucket) is reached.
    #[error("{0}")]
    LimitReached(String),
    #[error("access token not found")]
    TokenNotFound,
    #[error(transparent)]
    Cipher(#[from] crate::model::cipher::CipherError),
    #[error(transparent)]
    Storage(#[from] StorageError),
}

pub type StreamResult<T> = Result<T, StreamError>;

impl From<Refusal> for StreamError {
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::NotFound => StreamError::NotFound,
            Refusal::Gone => StreamError::Gone,
            Refusal::Encrypted => StreamError::Encrypted,
            Refusal::Closed { tail } => StreamError::Closed { tail },
            Refusal::ContentTypeMismatch => StreamError::ContentTypeMismatch,
            Refusal::Producer(e) => StreamError::Producer(e),
            Refusal::NotRecordAware => StreamError::NotRecordAware,
            Refusal::RecordMismatch {
                expected,
                next,
                tail,
            } => StreamError::RecordMismatch {
                expected,
                next,
                tail,
            },
            Refusal::StreamSeqRegression { last, received } => {
                StreamError::StreamSeqRegression { last, received }
            }
            Refusal::MalformedBody(e) => StreamError::BadRequest(e),
            Refusal::KeyRequired => StreamError::KeyRequired,
            Refusal::KeyMismatch => CipherError::DecryptionFailed.into(),
            Refusal::FencingMismatch { current } => StreamError::FencingMismatch { current },
            Refusal::SeqNumMismatch { next } => StreamError::SeqNumMismatch { next },
            refusal @ (Refusal::ClosedToS2
            | Refusal::Timestamp(_)
            | Refusal::CommandOnJsonStream
            | Refusal::NotOneJsonValue(_)
            | Refusal::CanonicalTooLarge(_)) => StreamError::Invalid(refusal.to_string()),
            Refusal::Conflict(conflict) => StreamError::Conflict(conflict.reason()),
            refusal @ Refusal::ExpiresInThePast => StreamError::BadRequest(refusal.to_string()),
            Refusal::BucketNotFound => StreamError::BucketNotFound,
            Refusal::BucketDeleting => StreamError::BucketDeleting,
            refusal @ Refusal::BucketFull { .. } => StreamError::LimitReached(refusal.to_string()),
            Refusal::AlreadyExists(what) => StreamError::AlreadyExists(what),
            Refusal::ForkSourceGone => StreamError::ForkSourceGone,
            refusal @ Refusal::ForkChainTooLong { .. } => {
                StreamError::BadRequest(refusal.to_string())
            }
            Refusal::Retained { first } => StreamError::Retained { first },
            Refusal::SnapshotNotFound => StreamError::SnapshotNotFound,
        }
    }
}
