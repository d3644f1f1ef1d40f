//! A mirror is read-only: writes to what it mirrors go to the upstream (a redirect), local
//! streams and forks that would clash with its copies are refused, and so are overlapping
//! mirror targets at start.

use std::time::Duration;

use crate::common::{Server, client, header};

use super::{BUCKET, append, create_bucket, no_redirects, put, s2_records, wait_until_mirrored};

#[tokio::test]
async fn a_bucket_mirror_takes_no_local_streams_or_forks_and_copies_a_close_it_joined_behind() {
    let http = client();
    let no_redirects = no_redirects();
    let upstream = Server::start(&["--memory"]);
    create_bucket(&http, &upstream).await;
    let s = upstream.url(&format!("/{BUCKET}/s"));
    assert_eq!(put(&http, &s, "text/plain", "one;").await.status(), 201);
    append(&http, &s, "text/plain", "two;").await;
    let close = http
        .post(&s)
        .header("stream-closed", "true")
        .send()
        .await
        .unwrap();
    assert!(close.status().is_success());

    // The mirror joins behind the close: it gets the records, then the closed state.
    let bucket = upstream.url(&format!("/{BUCKET}"));
    let mirror = Server::start(&["--memory", "--mirror-from", &bucket]);
    wait_until_mirrored(&http, &upstream, &mirror, &["s"]).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let head = http
            .head(mirror.url(&format!("/{BUCKET}/s")))
            .send()
            .await
            .unwrap();
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
    let local = no_redirects
        .put(mirror.url(&format!("/{BUCKET}/local")))
        .header("content-type", "text/plain")
        .send()
        .await
        .unwrap();
    assert_eq!(local.status(), 307);
    assert_eq!(
        header(&local, "location"),
        Some(upstream.url(&format!("/{BUCKET}/local")).as_str())
    );
    let bucket_delete = no_redirects
        .delete(mirror.url(&format!("/{BUCKET}")))
        .send()
        .await
        .unwrap();
    assert_eq!(
        bucket_delete.status(),
        307,
        "the mirrored bucket is the upstream's"
    );
    assert_eq!(
        header(&bucket_delete, "location"),
        Some(upstream.url(&format!("/{BUCKET}")).as_str())
    );
    // A fork would stop the mirror at the next rebuild of its source.
    let fork = http
        .put(mirror.url("/v1/stream/fork"))
        .header("content-type", "text/plain")
        .header("stream-forked-from", format!("/{BUCKET}/s"))
        .send()
        .await
        .unwrap();
    assert_eq!(fork.status(), 409);
}

#[tokio::test]
async fn s2_writes_to_a_mirror_are_redirected_to_the_upstream_in_s2s_error_shape() {
    let http = client();
    let no_redirects = no_redirects();
    let upstream = Server::start(&["--memory"]);
    create_bucket(&http, &upstream).await;
    let s = upstream.url(&format!("/{BUCKET}/s"));
    assert_eq!(put(&http, &s, "text/plain", "one;").await.status(), 201);
    let mirror = Server::start(&[
        "--memory",
        "--mirror-from",
        &upstream.url(&format!("/{BUCKET}")),
    ]);
    wait_until_mirrored(&http, &upstream, &mirror, &["s"]).await;

    let s2 = |method: reqwest::Method, path: &str, body: serde_json::Value| {
        no_redirects
            .request(method, mirror.url(path))
            .header("s2-basin", BUCKET)
            .header("content-type", "application/json")
            .body(body.to_string())
    };
    let refusals = [
        (
            "append",
            s2(
                reqwest::Method::POST,
                "/v1/streams/s/records",
                serde_json::json!({"records": [{"body": "two;"}]}),
            ),
            "/v1/streams/s/records",
        ),
        (
            "stream reconfiguration",
            s2(
                reqwest::Method::PATCH,
                "/v1/streams/s",
                serde_json::json!({"retention_policy": {"age": 60}}),
            ),
            "/v1/streams/s",
        ),
        (
            "stream creation",
            s2(
                reqwest::Method::POST,
                "/v1/streams",
                serde_json::json!({"stream": "local"}),
            ),
            "/v1/streams",
        ),
        (
            "basin reconfiguration",
            s2(
                reqwest::Method::PATCH,
                &format!("/v1/basins/{BUCKET}"),
                serde_json::json!({"create_stream_on_append": true}),
            ),
            &format!("/v1/basins/{BUCKET}"),
        ),
        (
            "basin deletion",
            s2(
                reqwest::Method::DELETE,
                &format!("/v1/basins/{BUCKET}"),
                serde_json::json!({}),
            ),
            &format!("/v1/basins/{BUCKET}"),
        ),
    ];
    for (what, request, path) in refusals {
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 307, "{what}");
        assert_eq!(
            header(&response, "location"),
            Some(upstream.url(path).as_str()),
            "{what}"
        );
        let body: serde_json::Value =
            serde_json::from_str(&response.text().await.unwrap()).unwrap();
        assert_eq!(body["code"], "mirrored", "{what}: {body}");
    }

    // Nothing changed on the mirror, and the upstream still holds one record.
    let config = http
        .get(mirror.url("/v1/streams/s"))
        .header("s2-basin", BUCKET)
        .send()
        .await
        .unwrap();
    let config: serde_json::Value = serde_json::from_str(&config.text().await.unwrap()).unwrap();
    assert!(config["retention_policy"].get("age").is_none(), "{config}");
    let basin = http
        .get(mirror.url(&format!("/v1/basins/{BUCKET}")))
        .send()
        .await
        .unwrap();
    assert_eq!(basin.status(), 200, "the mirrored basin is still there");
    let (status, records) = s2_records(&http, &mirror, "s").await;
    assert_eq!(status, 200);
    assert!(!records.contains("two;"), "{records}");
}

#[tokio::test]
async fn a_single_stream_mirror_refuses_to_create_the_stream_it_mirrors_locally() {
    // Whatever was written to a local stream of that name would be replaced by the upstream's
    // once it appears there: acknowledged writes silently lost.
    let http = client();
    let upstream = Server::start(&["--memory"]);
    create_bucket(&http, &upstream).await;
    let target = upstream.url(&format!("/{BUCKET}/one"));
    let mirror = Server::start(&["--memory", "--mirror-from", &target]);
    let local = no_redirects()
        .put(mirror.url(&format!("/{BUCKET}/one")))
        .header("content-type", "text/plain")
        .send()
        .await
        .unwrap();
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
