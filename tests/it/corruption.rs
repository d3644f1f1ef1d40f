//! Corrupt or torn storage is detected when the server starts, reported clearly, and never
//! served as data. The storage engine checksums every journal batch and every table block.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::{Client, Server};

const RECORDS: usize = 50;

/// Writes RECORDS appends ("record-N;") to `/v1/stream/s`, then kills the server.
async fn write_and_kill(dir: &Path) {
    let server = Server::on_disk(dir);
    let http = Client::new(&server);
    let created = http.create("/v1/stream/s", "text/plain", "").await;
    assert_eq!(created.status(), 201);
    for i in 0..RECORDS {
        let appended = http
            .append("/v1/stream/s", "text/plain", format!("record-{i:04};"))
            .await;
        assert_eq!(appended.status(), 204);
    }
    server.kill();
}

fn journal(dir: &Path) -> std::path::PathBuf {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "jnl"))
        .expect("a journal file")
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[tokio::test]
async fn a_corrupted_journal_is_refused_at_start_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    write_and_kill(dir.path()).await;
    let path = journal(dir.path());
    let mut bytes = std::fs::read(&path).unwrap();
    let at = find(&bytes, b"record-0020;").expect("the record is in the journal");
    bytes[at + 7] ^= 0xff;
    std::fs::write(&path, bytes).unwrap();

    let mut child = Command::new(env!("CARGO_BIN_EXE_runnel"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the server started on a corrupt journal"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(!status.success());
    assert!(!stdout.contains("listening"), "it never accepted a request");
    assert!(
        stderr.contains("cannot open data directory") && stderr.contains("Checksum"),
        "the error says what is wrong: {stderr}"
    );
}

#[tokio::test]
async fn a_torn_journal_tail_drops_only_the_torn_batch_and_serves_no_part_of_it() {
    let dir = tempfile::tempdir().unwrap();
    write_and_kill(dir.path()).await;
    let path = journal(dir.path());
    let mut bytes = std::fs::read(&path).unwrap();
    // Tear the last append: keep its first bytes, zero the rest, as a crash mid-write would.
    let last = format!("record-{:04};", RECORDS - 1);
    let at = find(&bytes, last.as_bytes()).expect("the last record is in the journal");
    let end = bytes[at..]
        .iter()
        .position(|b| *b == 0)
        .map_or(bytes.len(), |n| at + n);
    for byte in &mut bytes[at + 4..end + 64] {
        *byte = 0;
    }
    std::fs::write(&path, bytes).unwrap();

    let server = Server::on_disk(dir.path());
    let body = Client::new(&server)
        .read("/v1/stream/s", "-1")
        .await
        .text()
        .await
        .unwrap();
    let records: Vec<&str> = body.split_terminator(';').collect();
    assert_eq!(records.len(), RECORDS - 1, "only the torn batch is gone");
    for (i, record) in records.iter().enumerate() {
        assert_eq!(*record, format!("record-{i:04}"), "whole records, in order");
    }
}
