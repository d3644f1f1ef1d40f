//! The command-line tools beside `runnel serve`: backup, restore and verify of a data directory
//! (`data_dir.rs`), and export of one stream from a running server (`export.rs`).

mod data_dir;
mod export;

pub use data_dir::{backup, restore, verify};
pub use export::export;
