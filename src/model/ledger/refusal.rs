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

    // Creating a stream, and forking one.
    #[error("Stream-Expires-At is in the past: the stream would expire as it is created")]
    ExpiresInThePast,
    #[error("bucket not found")]
    BucketNotFound,
    #[error("the bucket is being deleted")]
    BucketDeleting,
    #[error("bucket {bucket} holds its limit of {limit} streams")]
    BucketFull { bucket: String, limit: usize },
    #[error("{0} already exists")]
    AlreadyExists(&'static str),
    #[error("fork source has been deleted")]
    ForkSourceGone,
    #[error(
        "Stream-Forked-From: the source's fork chain holds {chain} streams, the most a chain may \
         hold; fork a stream nearer its root"
    )]
    ForkChainTooLong { chain: usize },
    /// The position is below the first retained offset.
    #[error("offset is before the first retained offset {first}")]
    Retained { first: Offset },

    // Snapshots.
    #[error("no such snapshot")]
    SnapshotNotFound,

    /// A change that the stream's state rules out (a mirrored batch, a retention move, a create
    /// over a stream that differs, a snapshot over another).
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
    /// A fork asked for another content type than its source's.
    ForkContentType,
    /// A create of a stream that exists, differently.
    Exists(Mismatch),
    /// A create of a stream deleted while forks still read through it.
    DeletedForForks,
    /// A create of a stream that expired while forks still read through it.
    ExpiredForForks,
    /// A Durable Streams create in a bucket whose streams are sealed (S2 `stream_cipher`).
    SealedBucket,
    /// A fork of a mirrored stream, on its mirror.
    ForkOfMirror,
    /// A fork before the snapshot of a source trimmed up to it.
    ForkBeforeSnapshot,
    /// The source's snapshot changed between the fork's plan and its creation.
    ForkSnapshotChanged,
    /// A mirror rebuild of a stream that forks read through.
    RebuildUnderForks,
    /// A snapshot publish at an offset that holds another snapshot.
    SnapshotDiffers,
    /// `Stream-Snapshot-Match` names another snapshot than the visible one.
    SnapshotMatch,
    /// A snapshot delete while retention has moved past the stream's start.
    SnapshotNeeded,
}

/// How an existing stream differs from a repeated create (the first difference, in this order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mismatch {
    ContentType,
    Ttl,
    ExpiresAt,
    Closed,
    Attrs,
    /// Both forks, of another source or at another point.
    OtherFork,
    /// One is a fork and the other not.
    ForkConfiguration,
}

impl Mismatch {
    pub fn reason(self) -> &'static str {
        match self {
            Mismatch::ContentType => "stream exists with a different content type",
            Mismatch::Ttl => "stream exists with a different Stream-TTL",
            Mismatch::ExpiresAt => "stream exists with a different Stream-Expires-At",
            Mismatch::Closed => "stream exists with a different closed state",
            Mismatch::Attrs => "stream exists with different attributes",
            Mismatch::OtherFork => "stream exists as a different fork",
            Mismatch::ForkConfiguration => "stream exists with a different fork configuration",
        }
    }
}

impl Conflict {
    pub fn reason(self) -> &'static str {
        match self {
            Conflict::MirrorGap => "replicated records do not follow one another",
            Conflict::MirrorOffTail => "replicated records do not continue the mirror's tail",
            Conflict::PassesSnapshot => "retention cannot pass the latest snapshot",
            Conflict::ForkContentType => "fork content type differs from the source's",
            Conflict::Exists(mismatch) => mismatch.reason(),
            Conflict::DeletedForForks => "stream was deleted and is still referenced by forks",
            Conflict::ExpiredForForks => "stream expired and is still referenced by forks",
            Conflict::SealedBucket => {
                "the bucket's streams are encrypted (S2 stream_cipher): create them through S2"
            }
            Conflict::ForkOfMirror => {
                "a mirrored stream cannot be forked on its mirror: fork it on its upstream"
            }
            Conflict::ForkBeforeSnapshot => {
                "the source's records before its snapshot are trimmed, and the fork offset is \
                 before the snapshot: fork at or after the snapshot's offset"
            }
            Conflict::ForkSnapshotChanged => {
                "the source's snapshot changed while the fork was made; try again"
            }
            Conflict::RebuildUnderForks => {
                "a fork reads through this mirrored stream, so it cannot be rebuilt"
            }
            Conflict::SnapshotDiffers => "a different snapshot is published at this offset",
            Conflict::SnapshotMatch => "Stream-Snapshot-Match does not match the visible snapshot",
            Conflict::SnapshotNeeded => {
                "the snapshot is needed by bootstrap: retention has moved past the stream start"
            }
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
