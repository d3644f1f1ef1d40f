//! Mirror mode: follow an upstream Runnel's bucket or stream over the StreamLD WebSocket
//! replication binding, reproducing it exactly and read-only.
//!
//! The mirror's cursor for a stream is its own tail: records and the tail are committed together,
//! so after any crash the mirror resumes from exactly what it durably holds. A `GapSignal` (the
//! upstream no longer has what comes next) rebuilds the stream from the upstream's retained
//! start and snapshot, then follows again.
//!
//! `upstream.rs` parses what a mirror follows, `discovery.rs` finds its replication endpoint,
//! `session.rs` keeps a session joined, `health.rs` tells `/readyz` whether it is, `mirror.rs` applies what arrives, and `gap.rs` decides
//! what a gap calls for.

mod discovery;
mod error;
mod gap;
mod health;
mod mirror;
mod session;
pub mod tls;
mod upstream;

pub use error::MirrorError;
pub use health::{MirrorHealth, RECONNECT_GRACE};
pub use session::{Credentials, follow};
pub use upstream::{check_targets, check_token, mirrored_bucket, mirrored_stream};
