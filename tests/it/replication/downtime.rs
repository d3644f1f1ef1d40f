//! What changed upstream while a mirror was down, or while its upstream was away: deleted,
//! recreated and restored streams and buckets, and a stand-in that answers 404 to everything.

use std::path::Path;
use std::time::Duration;

use crate::common::{Client, Server};

use super::{BUCKET, append, stream, view, wait_for_status, wait_until_mirrored, with_bucket};

/// The flags of a mirror of the upstream's bucket that keeps its copy in `data`, so that it can
/// be killed and started again.
fn durable_bucket_mirror(data: &Path, upstream: &Server) -> Vec<String> {
    vec![
        "--data-dir".into(),
        data.to_str().unwrap().into(),
        "--mirror-from".into(),
        upstream.url(&format!("/{BUCKET}")),
    ]
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// Starts a mirror with `args`, waits until its `streams` match the upstream's, and SIGKILLs it.
async fn mirror_then_kill(up: &Client, args: &[String], streams: &[&str]) {
    let mirror = Server::start(&strs(args));
    wait_until_mirrored(up, &Client::new(&mirror), streams).await;
    mirror.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_deleted_upstream_while_a_bucket_mirror_is_down_is_removed_when_it_returns() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("mirror");
    let upstream = Server::start(&["--memory"]);
    let up = with_bucket(&upstream).await;
    for name in ["doomed", "kept"] {
        let created = up.create(&stream(name), "text/plain", "one;").await;
        assert_eq!(created.status(), 201);
    }
    let args = durable_bucket_mirror(&data, &upstream);
    mirror_then_kill(&up, &args, &["doomed", "kept"]).await;

    assert_eq!(up.delete(&stream("doomed")).await.status(), 204);
    append(&up, &stream("kept"), "text/plain", "two;").await;

    let mirror = Server::start(&strs(&args));
    let down = Client::new(&mirror);
    wait_until_mirrored(&up, &down, &["kept"]).await;
    wait_for_status(&down, &stream("doomed"), 404).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_deleted_upstream_while_its_mirror_is_down_is_emptied_on_the_mirror_when_it_returns()
 {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("mirror");
    let upstream = Server::start(&["--memory"]);
    let up = with_bucket(&upstream).await;
    for name in ["first", "second"] {
        let created = up.create(&stream(name), "text/plain", "one;").await;
        assert_eq!(created.status(), 201);
    }
    let args = durable_bucket_mirror(&data, &upstream);
    mirror_then_kill(&up, &args, &["first", "second"]).await;

    // A bucket is deleted once empty.
    for name in ["first", "second"] {
        assert_eq!(up.delete(&stream(name)).await.status(), 204);
    }
    let bucket = format!("/{BUCKET}");
    let deleted = up.delete(&bucket).await.status();
    assert!(deleted.is_success(), "{deleted}");
    wait_for_status(&up, &bucket, 404).await;

    let mirror = Server::start(&strs(&args));
    let down = Client::new(&mirror);
    for name in ["first", "second"] {
        wait_for_status(&down, &stream(name), 404).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_recreated_upstream_while_a_bucket_mirror_is_down_is_rebuilt_and_the_bucket_keeps_flowing()
 {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("mirror");
    let upstream = Server::start(&["--memory"]);
    let up = with_bucket(&upstream).await;
    let (reborn, other) = (stream("reborn"), stream("other"));
    assert_eq!(
        up.create(&reborn, "text/plain", "x1;x2;").await.status(),
        201
    );
    assert_eq!(up.create(&other, "text/plain", "o1;").await.status(), 201);
    let args = durable_bucket_mirror(&data, &upstream);
    mirror_then_kill(&up, &args, &["reborn", "other"]).await;

    // A new stream under the old name, with as many records as the mirror's cursor and longer
    // ones: nothing about the cursor alone tells the mirror its copy is stale.
    assert_eq!(up.delete(&reborn).await.status(), 204);
    let recreated = up.create(&reborn, "text/plain", "Y1;Y2;Y3;").await;
    assert_eq!(recreated.status(), 201);

    let mirror = Server::start(&strs(&args));
    let down = Client::new(&mirror);
    wait_until_mirrored(&up, &down, &["reborn", "other"]).await;
    // It goes on following the new stream, and the rest of the bucket.
    append(&up, &reborn, "text/plain", "Y4;").await;
    append(&up, &other, "text/plain", "o2;").await;
    wait_until_mirrored(&up, &down, &["reborn", "other"]).await;
    let (_, _, body) = view(&down, &reborn).await;
    assert_eq!(body, b"Y1;Y2;Y3;Y4;");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_stream_mirror_follows_its_stream_deleted_and_recreated_and_drops_it_when_gone() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("mirror");
    let upstream = Server::start(&["--memory"]);
    let up = with_bucket(&upstream).await;
    let single = stream("single");
    assert_eq!(up.create(&single, "text/plain", "one;").await.status(), 201);
    let source = up.url(&single);
    let args = [
        "--data-dir",
        data.to_str().unwrap(),
        "--mirror-from",
        &source,
    ];
    let mirror = Server::start(&args);
    let down = Client::new(&mirror);
    wait_until_mirrored(&up, &down, &["single"]).await;

    // Deleted and created again during the session: the mirror follows the new stream.
    assert_eq!(up.delete(&single).await.status(), 204);
    wait_for_status(&down, &single, 404).await;
    let recreated = up.create(&single, "text/plain", "new-one;").await;
    assert_eq!(recreated.status(), 201);
    append(&up, &single, "text/plain", "new-two;").await;
    wait_until_mirrored(&up, &down, &["single"]).await;
    let (_, _, body) = view(&down, &single).await;
    assert_eq!(body, b"new-one;new-two;");

    // Deleted while the mirror is down: its upstream answers 404, and the copy goes too.
    mirror.kill();
    assert_eq!(up.delete(&single).await.status(), 204);
    let mirror = Server::start(&args);
    wait_for_status(&Client::new(&mirror), &single, 404).await;
}

/// Answers every HTTP request on `listener` with a bare 404, as a proxy in front of a server
/// being redeployed may.
async fn answer_404_to_everything(listener: tokio::net::TcpListener) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    loop {
        let Ok((mut socket, _)) = listener.accept().await else {
            return;
        };
        tokio::spawn(async move {
            let mut request = Vec::new();
            let mut buffer = [0u8; 4096];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                match socket.read(&mut buffer).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => request.extend_from_slice(&buffer[..n]),
                }
            }
            let response =
                "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
            let _ = socket.write_all(response.as_bytes()).await;
        });
    }
}

/// Waits (up to 30 s) until the server log at `log` holds `needle` at least `times` times.
async fn wait_for_log(log: &Path, needle: &str, times: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.matches(needle).count() >= times {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the log never said {needle:?} {times} times:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_stream_mirror_keeps_its_copy_while_something_other_than_its_upstream_answers_404()
{
    let dir = tempfile::tempdir().unwrap();
    let (up_data, mirror_log) = (dir.path().join("up"), dir.path().join("mirror.log"));
    let up_args = |listen: &str| {
        let data = up_data.to_str().unwrap().to_string();
        vec![
            "--data-dir".to_string(),
            data,
            "--listen".into(),
            listen.into(),
        ]
    };
    let upstream = Server::start(&strs(&up_args("127.0.0.1:0")));
    let listen = upstream.base.trim_start_matches("http://").to_string();
    let up = with_bucket(&upstream).await;
    let kept = stream("kept");
    assert_eq!(up.create(&kept, "text/plain", "one;").await.status(), 201);
    let source = up.url(&kept);
    let mirror = Server::start_logged(&["--memory", "--mirror-from", &source], &mirror_log);
    let down = Client::new(&mirror);
    wait_until_mirrored(&up, &down, &["kept"]).await;

    // The upstream goes away and a proxy answers 404 in its place: the mirror keeps asking,
    // and keeps its copy meanwhile.
    upstream.kill();
    let proxy = tokio::net::TcpListener::bind(&listen).await.unwrap();
    let proxy = tokio::spawn(answer_404_to_everything(proxy));
    wait_for_log(&mirror_log, "does not exist (404", 2).await;
    let (_, _, body) = view(&down, &kept).await;
    assert_eq!(body, b"one;");

    // The upstream is back: the copy goes on from where it was.
    proxy.abort();
    let _ = proxy.await;
    let _upstream = Server::start(&strs(&up_args(&listen)));
    append(&up, &kept, "text/plain", "two;").await;
    wait_until_mirrored(&up, &down, &["kept"]).await;
    let (_, _, body) = view(&down, &kept).await;
    assert_eq!(body, b"one;two;");
}

/// Copies a stopped server's data directory, as a backup would.
fn copy_dir(from: &Path, to: &Path) {
    let _ = std::fs::remove_dir_all(to);
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(status.success(), "cp -a {from:?} {to:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_whose_upstream_was_restored_from_an_older_backup_and_written_again_is_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let (up_data, backup) = (dir.path().join("up"), dir.path().join("backup"));
    let start_upstream = |listen: Option<&str>| {
        let mut args = vec!["--data-dir", up_data.to_str().unwrap()];
        if let Some(listen) = listen {
            args.extend(["--listen", listen]);
        }
        Server::start(&args)
    };
    let mut upstream = start_upstream(None);
    let listen = upstream.base.trim_start_matches("http://").to_string();
    // The upstream comes back on the same address each time: one client serves them all.
    let up = with_bucket(&upstream).await;
    let s = stream("s");
    assert_eq!(up.create(&s, "text/plain", "r1;").await.status(), 201);
    append(&up, &s, "text/plain", "r2;").await;
    upstream.terminate(Duration::from_secs(10)).unwrap();
    copy_dir(&up_data, &backup);
    let mut upstream = start_upstream(Some(&listen));
    append(&up, &s, "text/plain", "r3;").await;

    let args = durable_bucket_mirror(&dir.path().join("mirror"), &upstream);
    mirror_then_kill(&up, &args, &["s"]).await;

    // The upstream comes back from the backup and takes a record of the same length where the
    // mirror's copy has r3: same ordinals, same offsets, another record.
    upstream.terminate(Duration::from_secs(10)).unwrap();
    std::fs::remove_dir_all(&up_data).unwrap();
    copy_dir(&backup, &up_data);
    let _upstream = start_upstream(Some(&listen));
    append(&up, &s, "text/plain", "R3;").await;
    append(&up, &s, "text/plain", "r4;").await;

    let mirror = Server::start(&strs(&args));
    let down = Client::new(&mirror);
    wait_until_mirrored(&up, &down, &["s"]).await;
    let (_, _, body) = view(&down, &s).await;
    assert_eq!(body, b"r1;r2;R3;r4;");
}
