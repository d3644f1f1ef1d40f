//! A mirror is read-only: writes to what it mirrors go to the upstream (a redirect), local
//! streams and forks that would clash with its copies are refused, and so are overlapping
//! mirror targets at start.

use std::time::Duration;

use reqwest::Method;
use serde_json::json;

use crate::common::{Client, Server, header, json_of};

use super::{BUCKET, append, bucket_mirror, s2_records, stream, wait_until_mirrored, with_bucket};

#[tokio::test]
async fn a_bucket_mirror_takes_no_local_streams_or_forks_and_copies_a_close_it_joined_behind() {
    let upstream = Server::start(&["--memory"]);
    let up = with_bucket(&upstream).await;
    let s = stream("s");
    assert_eq!(up.create(&s, "text/plain", "one;").await.status(), 201);
    append(&up, &s, "text/plain", "two;").await;
    let close = up
        .request(Method::POST, &s)
        .header("stream-closed", "true")
        .send()
        .await
        .unwrap();
    assert!(close.status().is_success());

    // The mirror joins behind the close: it gets the records, then the closed state.
    let mirror = bucket_mirror(&upstream);
    let down = Client::new(&mirror);
    wait_until_mirrored(&up, &down, &["s"]).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let head = down.head(&s).await;
        if header(&head, "stream-closed") == Some("true") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the mirror's copy stays open"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A stream made locally in the mirrored bucket would be deleted by the mirror: it goes to
    // the upstream instead.
    let no_redirects = Client::no_redirects(&mirror);
    let local = no_redirects
        .create(&stream("local"), "text/plain", "")
        .await;
    assert_eq!(local.status(), 307);
    assert_eq!(
        header(&local, "location"),
        Some(up.url(&stream("local")).as_str())
    );
    let bucket_delete = no_redirects.delete(&format!("/{BUCKET}")).await;
    assert_eq!(
        bucket_delete.status(),
        307,
        "the mirrored bucket is the upstream's"
    );
    assert_eq!(
        header(&bucket_delete, "location"),
        Some(up.url(&format!("/{BUCKET}")).as_str())
    );
    // A fork would stop the mirror at the next rebuild of its source.
    let fork = down
        .request(Method::PUT, "/v1/stream/fork")
        .header("content-type", "text/plain")
        .header("stream-forked-from", &s)
        .send()
        .await
        .unwrap();
    assert_eq!(fork.status(), 409);
}

#[tokio::test]
async fn s2_writes_to_a_mirror_are_redirected_to_the_upstream_in_s2s_error_shape() {
    let upstream = Server::start(&["--memory"]);
    let up = with_bucket(&upstream).await;
    assert_eq!(
        up.create(&stream("s"), "text/plain", "one;").await.status(),
        201
    );
    let mirror = bucket_mirror(&upstream);
    let down = Client::new(&mirror);
    wait_until_mirrored(&up, &down, &["s"]).await;

    let no_redirects = Client::no_redirects(&mirror);
    let s2 = |method: Method, path: &str, body: serde_json::Value| {
        no_redirects
            .s2(method, BUCKET, path)
            .header("content-type", "application/json")
            .body(body.to_string())
    };
    let basin = format!("/v1/basins/{BUCKET}");
    let refusals = [
        (
            "append",
            s2(
                Method::POST,
                "/v1/streams/s/records",
                json!({"records": [{"body": "two;"}]}),
            ),
            "/v1/streams/s/records",
        ),
        (
            "stream reconfiguration",
            s2(
                Method::PATCH,
                "/v1/streams/s",
                json!({"retention_policy": {"age": 60}}),
            ),
            "/v1/streams/s",
        ),
        (
            "stream creation",
            s2(Method::POST, "/v1/streams", json!({"stream": "local"})),
            "/v1/streams",
        ),
        (
            "basin reconfiguration",
            s2(
                Method::PATCH,
                &basin,
                json!({"create_stream_on_append": true}),
            ),
            &basin,
        ),
        (
            "basin deletion",
            s2(Method::DELETE, &basin, json!({})),
            &basin,
        ),
    ];
    for (what, request, path) in refusals {
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 307, "{what}");
        assert_eq!(
            header(&response, "location"),
            Some(up.url(path).as_str()),
            "{what}"
        );
        let body = json_of(response).await;
        assert_eq!(body["code"], "mirrored", "{what}: {body}");
    }

    // Nothing changed on the mirror, and the upstream still holds one record.
    let config = json_of(
        down.s2(Method::GET, BUCKET, "/v1/streams/s")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert!(config["retention_policy"].get("age").is_none(), "{config}");
    let basin = down.get(&basin).await;
    assert_eq!(basin.status(), 200, "the mirrored basin is still there");
    let (status, records) = s2_records(&down, "s").await;
    assert_eq!(status, 200);
    assert!(!records.contains("two;"), "{records}");
}

#[tokio::test]
async fn a_single_stream_mirror_refuses_to_create_the_stream_it_mirrors_locally() {
    // Whatever was written to a local stream of that name would be replaced by the upstream's
    // once it appears there: acknowledged writes silently lost.
    let upstream = Server::start(&["--memory"]);
    let up = with_bucket(&upstream).await;
    let target = up.url(&stream("one"));
    let mirror = Server::start(&["--memory", "--mirror-from", &target]);
    let local = Client::no_redirects(&mirror)
        .create(&stream("one"), "text/plain", "")
        .await;
    assert_eq!(local.status(), 307);
    assert_eq!(header(&local, "location"), Some(target.as_str()));
}

#[test]
fn overlapping_mirror_targets_stop_the_server_at_start() {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_runnel"))
        .args(["serve", "--memory", "--listen", "127.0.0.1:0"])
        .args(["--mirror-from", "http://127.0.0.1:9/docs"])
        .args(["--mirror-from", "http://127.0.0.1:9/docs/s"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the server started with overlapping --mirror-from targets");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success());
    assert!(stderr.contains("overlap"), "{stderr}");
}
