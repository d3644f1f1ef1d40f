//! The control socket: how `runnel backup` and `runnel verify` reach a server that has the data
//! directory open (no other process can open it). A Unix socket in the data directory, readable
//! and writable by the server's user only: who may touch the data directory may back it up.
//!
//! A client sends one line, the command, and the server answers until it closes the connection:
//! - `backup`: the backup's bytes (see `storage::fjall_engine::backup`); a backup cut short
//!   (the server failed, and logged why) fails its check;
//! - `verify`: a line per problem, then [`verify_summary_line`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;

use crate::storage::{FjallEngine, VerifySummary};

/// The socket's name in the data directory.
pub const SOCKET_NAME: &str = "control.sock";

/// How long a client has to send its command.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest command line taken.
const COMMAND_MAX_BYTES: u64 = 64;

/// The socket of the data directory `dir`.
pub fn socket_path(dir: &Path) -> PathBuf {
    dir.join(SOCKET_NAME)
}

/// The last line of a `verify` answer.
pub fn verify_summary_line(summary: &VerifySummary) -> String {
    let VerifySummary {
        streams,
        records,
        keys,
        body_files,
        problems,
    } = summary;
    format!(
        "checked {streams} streams, {records} records, {keys} keys and {body_files} staged body \
         files: {problems} problems"
    )
}

/// The number of problems a [`verify_summary_line`] reports; `None` for any other line (an
/// answer cut short).
pub fn problems_in_summary_line(line: &str) -> Option<u64> {
    let counted = line.strip_prefix("checked ")?.rsplit_once(": ")?.1;
    counted.strip_suffix(" problems")?.parse().ok()
}

/// Serves the control socket of `dir` until `shutdown`, then removes it. A socket that cannot
/// be made (a path too long for one, a read-only directory) is logged, and the server goes on
/// without it: the tools then say that they cannot reach it.
pub fn spawn(dir: &Path, engine: Arc<FjallEngine>, shutdown: CancellationToken) {
    let path = socket_path(dir);
    let listener = match bind(&path) {
        Ok(listener) => listener,
        Err(e) => {
            let socket = path.display();
            tracing::warn!(%socket, error = %e, "no control socket: runnel backup and verify cannot reach this server");
            return;
        }
    };
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        tokio::spawn(answer(stream, engine.clone()));
                    }
                    Err(e) => tracing::warn!(error = %e, "control socket: accept failed"),
                },
            }
        }
        let _ = std::fs::remove_file(&path);
    });
}

/// Binds the socket, replacing one a server that is gone left behind (this server holds the
/// data directory's lock, so no other serves it), for the owner only.
fn bind(path: &Path) -> std::io::Result<UnixListener> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let listener = UnixListener::bind(path)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(listener)
}

async fn answer(stream: UnixStream, engine: Arc<FjallEngine>) {
    let mut reader = BufReader::new(stream);
    let mut command = String::new();
    let read = {
        let mut limited = (&mut reader).take(COMMAND_MAX_BYTES);
        tokio::time::timeout(COMMAND_TIMEOUT, limited.read_line(&mut command)).await
    };
    if !matches!(read, Ok(Ok(n)) if n > 0) {
        return;
    }
    let Ok(stream) = reader.into_inner().into_std() else {
        return;
    };
    // The work is blocking file I/O, written to the socket as it goes.
    let command = command.trim().to_owned();
    let done = tokio::task::spawn_blocking(move || run(&command, &engine, stream)).await;
    if let Ok(Err(e)) = done {
        tracing::warn!(error = %e, "control socket: the command failed");
    }
}

fn run(
    command: &str,
    engine: &FjallEngine,
    stream: std::os::unix::net::UnixStream,
) -> anyhow::Result<()> {
    use std::io::Write as _;
    stream.set_nonblocking(false)?;
    let mut out = std::io::BufWriter::new(stream);
    match command {
        "backup" => {
            let summary = engine.backup(&mut out)?;
            tracing::info!(
                keys = summary.keys,
                files = summary.files,
                bytes = summary.bytes,
                "backup sent"
            );
        }
        "verify" => {
            let summary = engine.verify(&mut out)?;
            writeln!(out, "{}", verify_summary_line(&summary))?;
            if summary.problems > 0 {
                tracing::error!(problems = summary.problems, "runnel verify found damage");
            }
        }
        other => writeln!(out, "unknown command {other:?}: backup or verify")?,
    }
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_verify_summary_line_reads_back_its_problem_count() {
        let summary = VerifySummary {
            streams: 2,
            records: 9,
            keys: 14,
            body_files: 1,
            problems: 3,
        };
        assert_eq!(
            problems_in_summary_line(&verify_summary_line(&summary)),
            Some(3)
        );
        assert_eq!(
            problems_in_summary_line("damaged: records: …: 4 problems"),
            None
        );
        assert_eq!(problems_in_summary_line(""), None);
    }
}
