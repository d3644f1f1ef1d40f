//! The `runnel` command line as an operator meets it: flags and their environment twins,
//! start-up refusals and what is written to the log.

use std::process::Output;
use std::time::Duration;

use crate::common::{Server, run_to_exit};

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn a_boolean_environment_twin_takes_1_for_true() {
    let data = tempfile::tempdir().unwrap();
    let output = run_to_exit(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data.path().to_str().unwrap(),
        ],
        &[("RUNNEL_MEMORY", "1")],
    );
    // Taken as true, `--memory` makes `--data-dir` pointless, which is refused by name.
    assert!(!output.status.success());
    let err = stderr(&output);
    assert!(err.contains("--data-dir does nothing here"), "{err}");
}

#[test]
fn rate_limit_without_auth_stops_start_up_with_the_reason() {
    let output = run_to_exit(
        &[
            "serve",
            "--memory",
            "--listen",
            "127.0.0.1:0",
            "--rate-limit",
            "5",
        ],
        &[],
    );
    assert!(!output.status.success());
    let err = stderr(&output);
    assert!(
        err.contains("--rate-limit does nothing here") && err.contains("--auth"),
        "{err}"
    );
}

#[test]
fn a_mirror_url_that_names_no_bucket_stops_start_up() {
    let output = run_to_exit(
        &[
            "serve",
            "--memory",
            "--listen",
            "127.0.0.1:0",
            "--mirror-from",
            "notaurl",
        ],
        &[],
    );
    assert!(!output.status.success());
    let err = stderr(&output);
    assert!(
        err.contains("--mirror-from: upstream notaurl is not a bucket or bucketed stream URL"),
        "{err}"
    );
}

#[test]
fn a_data_directory_in_use_names_the_process_that_holds_it() {
    let data = tempfile::tempdir().unwrap();
    let first = Server::on_disk(data.path());
    let output = run_to_exit(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            data.path().to_str().unwrap(),
        ],
        &[],
    );
    assert!(!output.status.success());
    let err = stderr(&output);
    assert!(
        err.contains(&format!(
            "the data directory is in use by process {}; stop it, or give this server another --data-dir",
            first.pid()
        )),
        "{err}"
    );
}

#[tokio::test]
async fn the_access_log_names_client_method_path_route_and_status() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("runnel.log");
    // `start_logged` runs with `RUST_LOG=runnel=info`, which includes `runnel::access`.
    let mut server = Server::start_logged(&["--memory"], &log);
    let response = crate::common::Client::new(&server)
        .get("/v1/stream/missing?offset=-1")
        .await;
    assert_eq!(response.status(), 404);
    server.terminate(Duration::from_secs(10));
    let text = std::fs::read_to_string(&log).unwrap();
    let line = text
        .lines()
        .find(|l| l.contains("runnel::access") && l.contains("/v1/stream/missing"))
        .unwrap_or_else(|| panic!("no access line in {text}"));
    for field in [
        "client=127.0.0.1:",
        "method=GET",
        "route=",
        "status=404",
        "bytes=",
        "request_id=",
    ] {
        assert!(line.contains(field), "{field} missing from {line}");
    }
}

#[test]
fn a_config_file_error_prints_its_cause_once() {
    let missing = run_to_exit(&["serve", "--config", "/nonexistent/runnel.toml"], &[]);
    let err = stderr(&missing);
    assert!(!missing.status.success());
    assert!(
        err.contains("cannot read config file /nonexistent/runnel.toml"),
        "{err}"
    );
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, "listne = \"127.0.0.1:1\"\n").unwrap();
    let unknown = run_to_exit(&["serve", "--config", path.to_str().unwrap()], &[]);
    let err = stderr(&unknown);
    assert!(!unknown.status.success());
    assert_eq!(err.matches("unknown field `listne`").count(), 1, "{err}");
}

#[test]
fn a_log_written_to_a_file_has_no_colour_codes() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("runnel.log");
    let mut server = Server::start_logged(&["--memory"], &log);
    server.terminate(Duration::from_secs(10));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("INFO"),
        "the server logged nothing at info: {text}"
    );
    assert!(!text.contains('\u{1b}'), "colour codes in a file: {text:?}");
}

#[test]
fn json_logs_are_one_object_per_line() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("runnel.log");
    let mut server = Server::start_logged(&["--memory", "--log-format", "json"], &log);
    server.terminate(Duration::from_secs(10));
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(!lines.is_empty(), "nothing logged");
    for line in lines {
        let event: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(
            event.get("level").is_some() && event.get("fields").is_some(),
            "{line}"
        );
    }
}
