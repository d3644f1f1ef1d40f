//! The stream ledger: every change to a stream's tail and metadata, decided in one place.
//!
//! A [`Ledger`] is a synchronous state machine over one stream's state: a command goes in with
//! the time it is decided at, and out comes what it does (the records to write, the
//! acknowledgement to send) or why it is refused. It does no I/O, reads no clock and holds no
//! cache: the service gathers the inputs, applies the command under the stream's lock, then
//! persists the outcome and publishes it. A refused command changes nothing.
//!
//! Each face's rules, in their order of precedence, are in the file of its command:
//! [`create`] (a new stream, and a create of a name that is taken), [`fork`] (what a fork asks
//! of its source), [`append`] (a Durable Streams append or close), [`s2`] (an S2 batch),
//! [`mirror`] (a mirrored batch and the upstream's state), [`retention`] (retention moves and
//! S2 trims), [`snapshot`] (publishing and deleting the visible snapshot), [`settings`]
//! (attributes and S2 configuration), [`lifecycle`] (deletion, soft and for good), and TTL
//! renewal ([`Renew`]) here.

pub mod append;
pub mod create;
pub mod fork;
pub mod lifecycle;
pub mod mirror;
mod refusal;
pub mod retention;
pub mod s2;
pub mod settings;
pub mod snapshot;

use std::collections::BTreeMap;

use super::producer::ProducerState;
use super::stream::StreamMeta;

pub use refusal::{Conflict, Mismatch, Refusal};

/// The state of one stream that the ledger decides over, borrowed from wherever the stream keeps
/// it (the service, under the stream's lock).
pub struct Ledger<'a> {
    pub meta: &'a mut StreamMeta,
    /// Each idempotent producer's progress, by producer id.
    pub producers: &'a mut BTreeMap<String, ProducerState>,
    /// When the stream was last read or written, from which its TTL counts.
    pub last_access_ms: &'a mut i64,
    /// The stream is deleted for good: nothing changes it any more.
    pub removed: &'a mut bool,
    /// How many forks read through this stream.
    pub forks: &'a mut u32,
    /// An `application/json` stream (derived from the content type, which never changes).
    pub json: bool,
}

/// A change the ledger can be asked for, and what it results in: for a command that may be
/// refused, a `Result` whose refusal left the ledger as it was.
pub trait Command {
    type Outcome;

    /// Applies the command to `ledger` at `now_ms`.
    fn apply(self, ledger: &mut Ledger<'_>, now_ms: i64) -> Self::Outcome;
}

impl Ledger<'_> {
    /// Applies `command`, decided at `now_ms`.
    pub fn apply<C: Command>(&mut self, command: C, now_ms: i64) -> C::Outcome {
        command.apply(self, now_ms)
    }

    /// The stream is still there for its own clients: neither removed nor soft-deleted (kept
    /// only for its forks).
    fn present(&self) -> Result<(), Refusal> {
        if *self.removed {
            return Err(Refusal::NotFound);
        }
        if self.meta.soft_deleted {
            return Err(Refusal::Gone);
        }
        Ok(())
    }

    /// The records are sealed with an S2 client's key.
    fn encrypted(&self) -> bool {
        self.meta.extra().cipher.is_some()
    }
}

/// Slides the TTL window: a read or a write of the stream was accepted. (Accepted appends renew
/// it themselves, as part of the append.)
pub struct Renew;

impl Command for Renew {
    type Outcome = ();

    fn apply(self, ledger: &mut Ledger<'_>, now_ms: i64) {
        *ledger.last_access_ms = now_ms;
    }
}

#[cfg(test)]
pub(crate) mod testing;
