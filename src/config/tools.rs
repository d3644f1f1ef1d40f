//! The arguments of the tools: `runnel backup`, `runnel restore`, `runnel verify` and
//! `runnel export`.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

use super::DEFAULT_DATA_DIR;

#[derive(Debug, Args)]
pub struct BackupArgs {
    /// The data directory to back up. With a server running on it, the backup is taken through
    /// the server (its control socket in the directory); without one, from the directory.
    #[arg(long, env = "RUNNEL_DATA_DIR", default_value = DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
    /// The backup file to write. It appears only once complete and checked.
    pub out: PathBuf,
}

#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// The backup file, as `runnel backup` wrote it.
    pub backup: PathBuf,
    /// Where to restore it: a directory that is missing or empty. Start a server on it with
    /// `runnel serve --data-dir` afterwards.
    #[arg(long, env = "RUNNEL_DATA_DIR", default_value = DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The data directory to check, through a server running on it or from the directory.
    #[arg(long, env = "RUNNEL_DATA_DIR", default_value = DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
    /// Check this backup file instead of a data directory.
    #[arg(long, conflicts_with = "data_dir")]
    pub backup: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// The stream: BUCKET/STREAM, or /v1/stream/NAME for a base-surface stream.
    pub stream: String,
    /// The server to read it from (a data directory no server has: start one on it first).
    #[arg(long, env = "RUNNEL_SERVER", default_value = "http://127.0.0.1:4437")]
    pub server: String,
    /// A bearer token that may read the stream, for a server run with --auth.
    #[arg(long, env = "RUNNEL_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// raw: the stream's bytes as they are; jsonl: a JSON stream's messages, one a line.
    #[arg(long, value_enum, default_value_t = ExportFormat::Raw)]
    pub format: ExportFormat,
    /// Write to this file rather than to standard output.
    #[arg(long, short)]
    pub out: Option<PathBuf>,
    /// Root certificates (PEM) to trust for an https server, besides the system's.
    #[arg(long)]
    pub ca_cert: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ExportFormat {
    Raw,
    Jsonl,
}
