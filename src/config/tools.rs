//! The arguments of the data tools: `runnel backup`, `runnel restore` and `runnel verify`.

use std::path::PathBuf;

use clap::Args;

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
