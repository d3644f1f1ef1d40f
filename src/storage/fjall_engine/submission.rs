//! What goes into the writer's queue: a batch of changes from a commit, or a purge chunk.

use tokio::sync::oneshot;

use crate::storage::{Change, StorageError, StreamId};

pub(super) struct Submission {
    pub(super) changes: Vec<Change>,
    pub(super) done: oneshot::Sender<Result<(), StorageError>>,
    /// Delete the next chunk of this stream's trimmed records (sent by the purger only).
    pub(super) purge: Option<StreamId>,
}
