//! The stream model: pure, synchronous types and protocol rules. No I/O, no async.

pub mod access;
pub mod attrs;
pub mod batch;
pub mod cipher;
pub mod content_type;
pub mod cursor;
pub mod headers;
pub mod json;
pub mod ledger;
pub mod names;
pub mod offset;
pub mod producer;
pub mod provision;
pub mod record;
pub mod records;
pub mod s2;
pub mod sse;
pub mod stream;
pub mod streamld;
pub mod wire;

pub use offset::{Offset, ReadFrom};
pub use record::Record;
