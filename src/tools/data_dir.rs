//! `runnel backup`, `runnel restore` and `runnel verify`. A data directory a
//! server has open is reached through that server's control socket (see
//! `server::control`); one no server has is opened here, without changing it.

use std::io::{BufRead as _, BufReader, Write as _};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};

use crate::config::{BackupArgs, RestoreArgs, VerifyArgs};
use crate::server::control;
use crate::storage::{self, DataDir, StorageError};

/// Writes the backup to a file beside `out`, syncs and checks it, then gives it its name: `out`
/// is never a partial backup.
pub fn backup(args: &BackupArgs) -> anyhow::Result<()> {
    let partial = partial_path(&args.out);
    let result = write_backup(&args.data_dir, &partial);
    if result.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    result?;
    let summary = storage::check_backup(&partial).with_context(|| {
        let _ = std::fs::remove_file(&partial);
        "the backup came out damaged (the server's log says why)"
    })?;
    std::fs::rename(&partial, &args.out)
        .with_context(|| format!("cannot name the backup {}", args.out.display()))?;
    println!(
        "backed up {} keys and {} staged body files ({} bytes) to {}",
        summary.keys,
        summary.files,
        summary.bytes,
        args.out.display()
    );
    Ok(())
}

fn partial_path(out: &Path) -> PathBuf {
    let mut name = out.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    out.with_file_name(name)
}

fn write_backup(dir: &Path, partial: &Path) -> anyhow::Result<()> {
    let mut file = std::fs::File::create(partial)
        .with_context(|| format!("cannot create {}", partial.display()))?;
    match connect(dir, "backup")? {
        Some(mut server) => {
            std::io::copy(&mut server, &mut file).context("reading the backup from the server")?;
        }
        None => {
            open_offline(dir)?.backup(&mut file)?;
        }
    }
    file.sync_all().context("syncing the backup")?;
    Ok(())
}

pub fn restore(args: &RestoreArgs) -> anyhow::Result<()> {
    let summary = storage::restore_backup(&args.backup, &args.data_dir)?;
    println!(
        "restored {} keys and {} staged body files into {}",
        summary.keys,
        summary.files,
        args.data_dir.display()
    );
    Ok(())
}

/// Prints what the check found; an error when it found damage.
pub fn verify(args: &VerifyArgs) -> anyhow::Result<()> {
    if let Some(backup) = &args.backup {
        let summary = storage::check_backup(backup)?;
        println!(
            "{}: a sound backup of {} keys and {} staged body files",
            backup.display(),
            summary.keys,
            summary.files
        );
        return Ok(());
    }
    let dir = &args.data_dir;
    let problems = match connect(dir, "verify")? {
        Some(server) => {
            let mut last = String::new();
            for line in BufReader::new(server).lines() {
                let line = line.context("reading the server's answer")?;
                println!("{line}");
                last = line;
            }
            control::problems_in_summary_line(&last)
                .context("the server's answer ended early (its log says why)")?
        }
        None => {
            let mut stdout = std::io::stdout().lock();
            let summary = open_offline(dir)?.verify(&mut stdout)?;
            writeln!(stdout, "{}", control::verify_summary_line(&summary))?;
            summary.problems
        }
    };
    if problems > 0 {
        bail!("{} is damaged: {problems} problems", dir.display());
    }
    Ok(())
}

/// The server running on `dir`, with `command` sent; `None` when no server answers there.
fn connect(dir: &Path, command: &str) -> anyhow::Result<Option<UnixStream>> {
    let path = control::socket_path(dir);
    let mut stream = match UnixStream::connect(&path) {
        Ok(stream) => stream,
        // No socket, or one a stopped server left behind.
        Err(_) => return Ok(None),
    };
    writeln!(stream, "{command}").context("sending the command to the server")?;
    Ok(Some(stream))
}

fn open_offline(dir: &Path) -> anyhow::Result<DataDir> {
    DataDir::open(dir).map_err(|e| match e {
        StorageError::Locked { holder } => {
            let who = holder.map_or("another process".into(), |pid| format!("process {pid}"));
            let socket = control::socket_path(dir);
            anyhow::anyhow!(
                "{} is open in {who}, and no server answers on {}: stop it, or check its log for \
                 why it has no control socket",
                dir.display(),
                socket.display()
            )
        }
        other => anyhow::Error::new(other).context(format!("cannot open {}", dir.display())),
    })
}
