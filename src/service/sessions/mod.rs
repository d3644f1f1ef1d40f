//! What the faces' live sessions decide, apart from their wire: which events an S2 read session
//! sends and where it starts, and what a StreamLD replica is sent. Each renders one follow of
//! the stream (see `docs/live-reads.md`); the faces only carry the result.

mod owned_task;
pub mod replica_feed;
pub mod s2_read;

pub use owned_task::OwnedTask;
