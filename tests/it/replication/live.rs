//! A mirror follows its upstream live. Appends flow; the mirror survives SIGKILL and resumes from
//! its own cursor; the upstream restarts and the mirror reconnects; retention moved past the
//! mirror's cursor takes the gap path and rebuilds from the snapshot. At the end both sides hold
//! the same bytes at the same offsets.

use std::path::Path;
use std::time::Duration;

use crate::common::{Server, client, header};

use super::{
    BUCKET, append, create_bucket, no_redirects, put, s2_records, view, wait_for_status,
    wait_until_mirrored,
};

fn joins(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("replication join"))
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mirror_follows_live_resumes_after_crashes_and_rebuilds_after_a_gap() {
    let dir = tempfile::tempdir().unwrap();
    let (up_dir, down_dir) = (dir.path().join("up"), dir.path().join("down"));
    let (up_log, down_log) = (dir.path().join("up.log"), dir.path().join("down.log"));
    let http = client();
    let data = |p: &Path| p.to_str().unwrap().to_string();

    let upstream = Server::start_logged(&["--data-dir", &data(&up_dir)], &up_log);
    let listen = upstream.base.trim_start_matches("http://").to_string();
    create_bucket(&http, &upstream).await;
    let bin = upstream.url(&format!("/{BUCKET}/bin"));
    let json = upstream.url(&format!("/{BUCKET}/events"));
    assert_eq!(
        put(&http, &bin, "application/octet-stream", "\u{0}\u{1}binary")
            .await
            .status(),
        201
    );
    assert_eq!(
        put(&http, &json, "application/json", r#"[{"n":0},{"n":1}]"#)
            .await
            .status(),
        201
    );
    for n in 2..20 {
        append(&http, &json, "application/json", &format!(r#"{{"n":{n}}}"#)).await;
        append(
            &http,
            &bin,
            "application/octet-stream",
            &format!("chunk-{n};"),
        )
        .await;
    }

    let mirror_args = |dir: &str| {
        vec![
            "--data-dir".to_string(),
            dir.to_string(),
            "--mirror-from".to_string(),
            format!("{}/{BUCKET}", upstream.base),
        ]
    };
    let args = mirror_args(&data(&down_dir));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mirror = Server::start_logged(&args, &down_log);
    wait_until_mirrored(&http, &upstream, &mirror, &["bin", "events"]).await;

    // Live: new appends and a stream created later arrive on their own.
    append(&http, &json, "application/json", r#"{"live":true}"#).await;
    assert_eq!(
        put(
            &http,
            &upstream.url(&format!("/{BUCKET}/later")),
            "text/plain",
            "late"
        )
        .await
        .status(),
        201
    );
    wait_until_mirrored(&http, &upstream, &mirror, &["bin", "events", "later"]).await;

    // The mirror is read-only: a write is redirected to the same path upstream.
    let no_redirects = no_redirects();
    let refused = no_redirects
        .post(mirror.url(&format!("/{BUCKET}/events")))
        .header("content-type", "application/json")
        .body("1")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 307);
    assert_eq!(
        header(&refused, "location"),
        Some(format!("{}/{BUCKET}/events", upstream.base).as_str())
    );

    // SIGKILL the mirror mid-stream; the upstream keeps going; the restarted mirror resumes from
    // the cursors it persisted (its join carries them), not from the beginning.
    let writer = tokio::spawn({
        let (http, json) = (http.clone(), json.clone());
        async move {
            for n in 0..200 {
                append(
                    &http,
                    &json,
                    "application/json",
                    &format!(r#"{{"burst":{n}}}"#),
                )
                .await;
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    mirror.kill();
    writer.await.unwrap();
    let joins_before = joins(&up_log).len();
    let mirror = Server::start_logged(&args, &down_log);
    wait_until_mirrored(&http, &upstream, &mirror, &["bin", "events", "later"]).await;
    let resumed = joins(&up_log)[joins_before..].join("\n");
    assert!(
        resumed.contains("\"events\": ") && !resumed.contains("\"events\": 0"),
        "resumed from its cursor: {resumed}"
    );
    assert!(
        resumed.contains("\"bin\": 19"),
        "the binary stream resumed at its 19 records: {resumed}"
    );

    // The upstream restarts on the same address; the mirror reconnects by itself.
    upstream.kill();
    let upstream = Server::start_logged(
        &["--data-dir", &data(&up_dir), "--listen", &listen],
        &up_log,
    );
    append(&http, &bin, "application/octet-stream", "after-restart;").await;
    wait_until_mirrored(&http, &upstream, &mirror, &["bin", "events", "later"]).await;

    // Retention moves past the mirror's cursor while it is down: on return it gets a gap and
    // rebuilds from the snapshot and the retained records.
    mirror.kill();
    for n in 0..5 {
        append(
            &http,
            &json,
            "application/json",
            &format!(r#"{{"after_gap":{n}}}"#),
        )
        .await;
    }
    let tail = header(
        &http.head(&json).send().await.unwrap(),
        "stream-next-offset",
    )
    .unwrap()
    .to_string();
    let snapshot = http
        .put(format!("{json}/snapshot/{tail}"))
        .header("content-type", "application/json")
        .body(r#"{"state":"folded"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(snapshot.status(), 204);
    let digest = header(&snapshot, "stream-snapshot-digest")
        .unwrap()
        .to_string();
    assert_eq!(
        http.put(format!("{json}/retention/{tail}"))
            .send()
            .await
            .unwrap()
            .status(),
        204
    );
    append(
        &http,
        &json,
        "application/json",
        r#"{"after_retention":true}"#,
    )
    .await;
    let mirror = Server::start_logged(&args, &down_log);
    wait_until_mirrored(&http, &upstream, &mirror, &["bin", "events", "later"]).await;
    assert!(
        std::fs::read_to_string(&down_log)
            .unwrap()
            .contains("gap: rebuilding"),
        "the gap path was taken"
    );
    let mirrored_json = mirror.url(&format!("/{BUCKET}/events"));
    let head = http.head(&mirrored_json).send().await.unwrap();
    assert_eq!(
        header(&head, "stream-snapshot-digest"),
        Some(digest.as_str())
    );
    assert_eq!(
        http.get(format!(
            "{mirrored_json}?offset=0000000000000000_0000000000000000"
        ))
        .send()
        .await
        .unwrap()
        .status(),
        410
    );

    // Caught up, the mirror reports no lag, and which upstream it follows.
    let head = http.head(&mirrored_json).send().await.unwrap();
    assert_eq!(
        header(&head, "stream-replication-lag-records"),
        Some("0"),
        "{:?}",
        head.headers()
    );
    assert_eq!(
        header(&head, "stream-mirror-of"),
        Some(upstream.base.as_str())
    );

    let metrics = http
        .get(mirror.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(&format!(
            "runnel_replication_lag_records{{stream=\"/{BUCKET}/events\",upstream=\"{}\"}} 0",
            upstream.base
        )),
        "{metrics}"
    );

    // Closing and new attributes reach the mirror too.
    let closed = http
        .post(&bin)
        .header("stream-closed", "true")
        .send()
        .await
        .unwrap();
    assert_eq!(closed.status(), 204);
    let attrs = http
        .put(format!("{bin}/attrs"))
        .header("content-type", "application/json")
        .body(r#"{"title":"mirrored"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(attrs.status(), 204);
    let mirrored_bin = mirror.url(&format!("/{BUCKET}/bin"));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let head = http.head(&mirrored_bin).send().await.unwrap();
        let title = http
            .get(format!("{mirrored_bin}/attrs"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if header(&head, "stream-closed") == Some("true") && title.contains("mirrored") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "close and attrs did not reach the mirror"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A stream deleted upstream is removed from the mirror.
    assert_eq!(
        http.delete(upstream.url(&format!("/{BUCKET}/later")))
            .send()
            .await
            .unwrap()
            .status(),
        204
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while http
        .head(mirror.url(&format!("/{BUCKET}/later")))
        .send()
        .await
        .unwrap()
        .status()
        != 404
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "deletion did not reach the mirror"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Record by record, both sides agree: same ordinals, same offsets, same bytes.
    for stream in ["events"] {
        let up = http
            .get(upstream.url(&format!(
                "/{BUCKET}/{stream}?tail_records=1000&record_view=envelope"
            )))
            .send()
            .await
            .unwrap();
        let down = http
            .get(mirror.url(&format!(
                "/{BUCKET}/{stream}?tail_records=1000&record_view=envelope"
            )))
            .send()
            .await
            .unwrap();
        assert_eq!(
            header(&up, "stream-record-start"),
            header(&down, "stream-record-start")
        );
        assert_eq!(up.text().await.unwrap(), down.text().await.unwrap());
    }
}

#[tokio::test]
async fn a_new_mirror_of_a_trimmed_stream_starts_at_the_retained_start_without_a_rebuild() {
    let http = client();
    let upstream = Server::start(&["--memory"]);
    create_bucket(&http, &upstream).await;
    let trimmed = upstream.url(&format!("/{BUCKET}/trimmed"));
    assert_eq!(
        put(&http, &trimmed, "text/plain", "a;b;").await.status(),
        201
    );
    let head = http.head(&trimmed).send().await.unwrap();
    let tail = header(&head, "stream-next-offset").unwrap().to_string();
    for step in ["snapshot", "retention"] {
        let r = http
            .put(format!("{trimmed}/{step}/{tail}"))
            .body("a;b;")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 204, "{step}");
    }
    append(&http, &trimmed, "text/plain", "c;").await;

    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("mirror.log");
    let mirror = Server::start_logged(
        &[
            "--memory",
            "--mirror-from",
            &upstream.url(&format!("/{BUCKET}")),
        ],
        &log,
    );
    wait_until_mirrored(&http, &upstream, &mirror, &["trimmed"]).await;
    append(&http, &trimmed, "text/plain", "d;").await;
    wait_until_mirrored(&http, &upstream, &mirror, &["trimmed"]).await;
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(!logged.contains("rebuilding"), "{logged}");
}

#[tokio::test]
async fn a_single_stream_mirror_follows_only_that_stream() {
    let http = client();
    let upstream = Server::start(&["--memory"]);
    create_bucket(&http, &upstream).await;
    let wanted = upstream.url(&format!("/{BUCKET}/wanted"));
    assert_eq!(
        put(&http, &wanted, "text/plain", "one;").await.status(),
        201
    );
    assert_eq!(
        put(
            &http,
            &upstream.url(&format!("/{BUCKET}/other")),
            "text/plain",
            "x"
        )
        .await
        .status(),
        201
    );
    let mirror = Server::start(&["--memory", "--mirror-from", &wanted]);
    append(&http, &wanted, "text/plain", "two;").await;
    wait_until_mirrored(&http, &upstream, &mirror, &["wanted"]).await;
    let other = http
        .head(mirror.url(&format!("/{BUCKET}/other")))
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 404, "only the named stream is mirrored");
}

#[tokio::test]
async fn stream_names_travel_percent_encoded_so_a_bucket_mirror_keeps_every_name_apart() {
    let http = client();
    let upstream = Server::start(&["--memory"]);
    create_bucket(&http, &upstream).await;
    // `a%20b` and `a b` are two streams; so is the S2 name `dir/x`.
    let (percent, space) = ("a%2520b", "a%20b");
    for (stream, body) in [(percent, "percent;"), (space, "space;")] {
        let url = upstream.url(&format!("/{BUCKET}/{stream}"));
        assert_eq!(put(&http, &url, "text/plain", body).await.status(), 201);
    }
    let created = http
        .post(upstream.url("/v1/streams"))
        .header("s2-basin", BUCKET)
        .header("content-type", "application/json")
        .body(r#"{"stream":"dir/x"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let s2_append = |body: &'static str| {
        http.post(upstream.url("/v1/streams/dir%2Fx/records"))
            .header("s2-basin", BUCKET)
            .header("content-type", "application/json")
            .body(format!(r#"{{"records":[{{"body":"{body}"}}]}}"#))
            .send()
    };
    assert_eq!(s2_append("one").await.unwrap().status(), 200);

    let mirror = Server::start(&[
        "--memory",
        "--mirror-from",
        &upstream.url(&format!("/{BUCKET}")),
    ]);
    wait_until_mirrored(&http, &upstream, &mirror, &[percent, space]).await;
    // Live appends land on the right copies too.
    for (stream, body) in [(percent, "percent-2;"), (space, "space-2;")] {
        append(
            &http,
            &upstream.url(&format!("/{BUCKET}/{stream}")),
            "text/plain",
            body,
        )
        .await;
    }
    assert_eq!(s2_append("two").await.unwrap().status(), 200);
    wait_until_mirrored(&http, &upstream, &mirror, &[percent, space]).await;
    let (_, _, body) = view(&http, &mirror.url(&format!("/{BUCKET}/{percent}"))).await;
    assert_eq!(body, b"percent;percent-2;");

    let upstream_records = s2_records(&http, &upstream, "dir/x").await;
    assert_eq!(upstream_records.0, 200);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while s2_records(&http, &mirror, "dir/x").await != upstream_records {
        assert!(
            tokio::time::Instant::now() < deadline,
            "dir/x was not mirrored: {:?}",
            s2_records(&http, &mirror, "dir/x").await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn an_encrypted_s2_stream_is_mirrored_sealed_and_reads_back_with_its_key() {
    let http = client();
    let upstream = Server::start(&["--memory"]);
    let json = |body: serde_json::Value| body.to_string();
    let basin = http
        .post(upstream.url("/v1/basins"))
        .header("content-type", "application/json")
        .body(json(serde_json::json!({
            "basin": BUCKET, "config": {"stream_cipher": "aes-256-gcm"}
        })))
        .send()
        .await
        .unwrap();
    assert_eq!(basin.status(), 201);
    let key = "a2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2s=";
    let s2 = |server: &Server, method: reqwest::Method, path: &str| {
        http.request(method, server.url(path))
            .header("content-type", "application/json")
            .header("s2-basin", BUCKET)
            .header("s2-encryption-key", key)
    };
    let created = s2(&upstream, reqwest::Method::POST, "/v1/streams")
        .body(json(serde_json::json!({"stream": "sec"})))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let appended = s2(&upstream, reqwest::Method::POST, "/v1/streams/sec/records")
        .body(json(
            serde_json::json!({"records": [{"body": "top secret"}]}),
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(appended.status(), 200);

    let mirror = Server::start(&[
        "--memory",
        "--mirror-from",
        &upstream.url(&format!("/{BUCKET}")),
    ]);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let read = loop {
        let read = s2(
            &mirror,
            reqwest::Method::GET,
            "/v1/streams/sec/records?seq_num=0",
        )
        .send()
        .await
        .unwrap();
        if read.status() == 200 {
            let body: serde_json::Value =
                serde_json::from_slice(&read.bytes().await.unwrap()).unwrap();
            if body["records"].as_array().is_some_and(|r| !r.is_empty()) {
                break body;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not mirrored in 10 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(read["records"][0]["body"], "top secret");
    // The copy is sealed as the original: no plain read of it.
    let plain = http
        .get(mirror.url(&format!("/{BUCKET}/sec?offset=-1")))
        .send()
        .await
        .unwrap();
    assert_eq!(plain.status(), 409);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_deleted_upstream_while_a_fork_holds_it_is_removed_from_a_live_mirror() {
    let http = client();
    let upstream = Server::start(&["--memory"]);
    create_bucket(&http, &upstream).await;
    let source = upstream.url(&format!("/{BUCKET}/src"));
    assert_eq!(put(&http, &source, "text/plain", "abc").await.status(), 201);
    let fork = http
        .put(upstream.url(&format!("/{BUCKET}/fork")))
        .header("content-type", "text/plain")
        .header("stream-forked-from", format!("/{BUCKET}/src"))
        .send()
        .await
        .unwrap();
    assert_eq!(fork.status(), 201);
    let mirror = Server::start(&[
        "--memory",
        "--mirror-from",
        &upstream.url(&format!("/{BUCKET}")),
    ]);
    wait_until_mirrored(&http, &upstream, &mirror, &["src"]).await;

    // Soft: the fork still reads through it, but for everyone else it is gone (410 upstream).
    assert_eq!(http.delete(&source).send().await.unwrap().status(), 204);
    assert_eq!(http.head(&source).send().await.unwrap().status(), 410);
    wait_for_status(&http, &mirror.url(&format!("/{BUCKET}/src")), 404).await;
}
