//! Why the ledger refuses a command. Each face reports a refusal its own way; the service maps
//! these onto its errors.

use crate::model::Offset;
use crate::model::producer::ProducerError;
use crate::model::s2::{BatchError, TimestampError};

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("stream not found")]
    NotFound,
    /// Deleted while forks still read through it.
    #[error("stream has been deleted")]
    Gone,

    // A Durable Streams append.
    #[error("the stream is encrypted: write it through S2 with its key")]
    Encrypted,
    #[error("stream is closed")]
    Closed { tail: Offset },
    #[error("content type does not match the stream's")]
    ContentTypeMismatch,
    #[error(transparent)]
    Producer(#[from] ProducerError),
    #[error("record coordinates are only available on application/json streams")]
    NotRecordAware,
    #[error("Stream-Record-Match {expected} does not match the record tail {next}")]
    RecordMismatch {
        expected: u64,
        next: u64,
        tail: Offset,
    },
    #[error("Stream-Seq must increase: {received:?} is not greater than {last:?}")]
    StreamSeqRegression { last: String, received: String },
    /// The body does not split into messages (a JSON stream's body is not JSON).
    #[error("{0}")]
    MalformedBody(String),

    // An S2 append.
    #[error("this stream is encrypted: send its key")]
    KeyRequired,
    /// Its records are sealed under another key than the stream's.
    #[error("the records are sealed under another key than the stream's")]
    KeyMismatch,
    #[error("the stream is closed to appends")]
    ClosedToS2,
    #[error("fencing token does not match")]
    FencingMismatch { current: String },
    #[error("match_seq_num does not match the tail {next}")]
    SeqNumMismatch { next: u64 },
    #[error(transparent)]
    Timestamp(#[from] TimestampError),
    #[error(
        "a JSON stream takes no command records (fence, trim): its record ordinals are \
         consecutive messages"
    )]
    CommandOnJsonStream,
    #[error("records on a JSON stream carry one JSON value each: {0}")]
    NotOneJsonValue(String),
    /// The batch's JSON values, written in canonical form, no longer fit S2's limits.
    #[error("{0}, with its JSON values in canonical form")]
    CanonicalTooLarge(BatchError),

    /// A change that the stream's state rules out (a mirrored batch, a retention move).
    #[error("{}", .0.reason())]
    Conflict(Conflict),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Conflict {
    /// A mirrored batch whose records do not follow one another.
    MirrorGap,
    /// A mirrored batch that does not start at the mirror's tail.
    MirrorOffTail,
    /// Durable Streams retention asked to pass the visible snapshot.
    PassesSnapshot,
}

impl Conflict {
    pub fn reason(self) -> &'static str {
        match self {
            Conflict::MirrorGap => "replicated records do not follow one another",
            Conflict::MirrorOffTail => "replicated records do not continue the mirror's tail",
            Conflict::PassesSnapshot => "retention cannot pass the latest snapshot",
        }
    }
}

impl Refusal {
    /// Whether an append refused this way may be accepted once its producer's earlier appends
    /// land: a later sequence number, or the rest of a new epoch, sent before the appends it
    /// follows are decided.
    pub fn waits_for_its_producer(&self) -> bool {
        matches!(
            self,
            Refusal::Producer(
                ProducerError::SequenceGap { .. } | ProducerError::EpochBumpNotAtZero
            )
        )
    }

    /// Whether an append refused this way may be accepted once appends ahead of it land: what
    /// [`Self::waits_for_its_producer`] says, or a record match ahead of the tail.
    pub fn may_pass_later(&self) -> bool {
        match self {
            Refusal::RecordMismatch { expected, next, .. } => expected > next,
            refusal => refusal.waits_for_its_producer(),
        }
    }
}
