//! A mirror follows its upstream live. Appends flow; the mirror survives SIGKILL and resumes from
//! its own cursor; the upstream restarts and the mirror reconnects; retention moved past the
//! mirror's cursor takes the gap path and rebuilds from the snapshot. At the end both sides hold
//! the same bytes at the same offsets.

use std::path::Path;
use std::time::Duration;

use reqwest::Method;
use serde_json::json;

use crate::common::{Client, Server, header, json_of};

use super::{
    BUCKET, append, bucket_mirror, s2_records, stream, view, wait_for_status, wait_until_mirrored,
    with_bucket,
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
    let data = |p: &Path| p.to_str().unwrap().to_string();

    let upstream = Server::start_logged(&["--data-dir", &data(&up_dir)], &up_log);
    let listen = upstream.base.trim_start_matches("http://").to_string();
    let up = with_bucket(&upstream).await;
    let (bin, json) = (stream("bin"), stream("events"));
    let octets = "application/octet-stream";
    let created = up.create(&bin, octets, "\u{0}\u{1}binary").await;
    assert_eq!(created.status(), 201);
    let created = up
        .create(&json, "application/json", r#"[{"n":0},{"n":1}]"#)
        .await;
    assert_eq!(created.status(), 201);
    for n in 2..20 {
        append(&up, &json, "application/json", format!(r#"{{"n":{n}}}"#)).await;
        append(&up, &bin, octets, format!("chunk-{n};")).await;
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
    let down = Client::new(&mirror);
    wait_until_mirrored(&up, &down, &["bin", "events"]).await;

    // Live: new appends and a stream created later arrive on their own.
    append(&up, &json, "application/json", r#"{"live":true}"#).await;
    let created = up.create(&stream("later"), "text/plain", "late").await;
    assert_eq!(created.status(), 201);
    wait_until_mirrored(&up, &down, &["bin", "events", "later"]).await;

    // The mirror is read-only: a write is redirected to the same path upstream.
    let refused = Client::no_redirects(&mirror)
        .append(&json, "application/json", "1")
        .await;
    assert_eq!(refused.status(), 307);
    assert_eq!(
        header(&refused, "location"),
        Some(format!("{}/{BUCKET}/events", upstream.base).as_str())
    );

    // SIGKILL the mirror mid-stream; the upstream keeps going; the restarted mirror resumes from
    // the cursors it persisted (its join carries them), not from the beginning.
    let writer = tokio::spawn({
        let (up, json) = (up.clone(), json.clone());
        async move {
            for n in 0..200 {
                let burst = format!(r#"{{"burst":{n}}}"#);
                append(&up, &json, "application/json", burst).await;
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    mirror.kill();
    writer.await.unwrap();
    let joins_before = joins(&up_log).len();
    let mirror = Server::start_logged(&args, &down_log);
    let down = Client::new(&mirror);
    wait_until_mirrored(&up, &down, &["bin", "events", "later"]).await;
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
    append(&up, &bin, octets, "after-restart;").await;
    wait_until_mirrored(&up, &down, &["bin", "events", "later"]).await;

    // Retention moves past the mirror's cursor while it is down: on return it gets a gap and
    // rebuilds from the snapshot and the retained records.
    mirror.kill();
    for n in 0..5 {
        let after_gap = format!(r#"{{"after_gap":{n}}}"#);
        append(&up, &json, "application/json", after_gap).await;
    }
    let tail = up.next_offset(&json).await;
    let snapshot = up
        .request(Method::PUT, &format!("{json}/snapshot/{tail}"))
        .header("content-type", "application/json")
        .body(r#"{"state":"folded"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(snapshot.status(), 204);
    let digest = header(&snapshot, "stream-snapshot-digest")
        .unwrap()
        .to_string();
    let retention = up
        .send(Method::PUT, &format!("{json}/retention/{tail}"))
        .await;
    assert_eq!(retention.status(), 204);
    append(
        &up,
        &json,
        "application/json",
        r#"{"after_retention":true}"#,
    )
    .await;
    let mirror = Server::start_logged(&args, &down_log);
    let down = Client::new(&mirror);
    wait_until_mirrored(&up, &down, &["bin", "events", "later"]).await;
    assert!(
        std::fs::read_to_string(&down_log)
            .unwrap()
            .contains("gap: rebuilding"),
        "the gap path was taken"
    );
    let head = down.head(&json).await;
    assert_eq!(
        header(&head, "stream-snapshot-digest"),
        Some(digest.as_str())
    );
    let before_retention = down.read(&json, "0000000000000000_0000000000000000").await;
    assert_eq!(before_retention.status(), 410);

    // Caught up, the mirror reports no lag, and which upstream it follows.
    let head = down.head(&json).await;
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

    let metrics = down.metrics().await;
    assert!(
        metrics.contains(&format!(
            "runnel_replication_lag_records{{stream=\"/{BUCKET}/events\",upstream=\"{}\"}} 0",
            upstream.base
        )),
        "{metrics}"
    );

    // Closing and new attributes reach the mirror too.
    let closed = up
        .request(Method::POST, &bin)
        .header("stream-closed", "true")
        .send()
        .await
        .unwrap();
    assert_eq!(closed.status(), 204);
    let attrs = up
        .send_json(
            Method::PUT,
            &format!("{bin}/attrs"),
            &json!({"title": "mirrored"}),
        )
        .await;
    assert_eq!(attrs.status(), 204);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let head = down.head(&bin).await;
        let title = down
            .get(&format!("{bin}/attrs"))
            .await
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
    assert_eq!(up.delete(&stream("later")).await.status(), 204);
    wait_for_status(&down, &stream("later"), 404).await;

    // Record by record, both sides agree: same ordinals, same offsets, same bytes.
    for name in ["events"] {
        let envelopes = format!("{}?tail_records=1000&record_view=envelope", stream(name));
        let (up, down) = (up.get(&envelopes).await, down.get(&envelopes).await);
        assert_eq!(
            header(&up, "stream-record-start"),
            header(&down, "stream-record-start")
        );
        assert_eq!(up.text().await.unwrap(), down.text().await.unwrap());
    }
}

#[tokio::test]
async fn a_new_mirror_of_a_trimmed_stream_starts_at_the_retained_start_without_a_rebuild() {
    let upstream = Server::start(&["--memory"]);
    let up = with_bucket(&upstream).await;
    let trimmed = stream("trimmed");
    let created = up.create(&trimmed, "text/plain", "a;b;").await;
    assert_eq!(created.status(), 201);
    let tail = up.next_offset(&trimmed).await;
    for step in ["snapshot", "retention"] {
        let r = up
            .request(Method::PUT, &format!("{trimmed}/{step}/{tail}"))
            .body("a;b;")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 204, "{step}");
    }
    append(&up, &trimmed, "text/plain", "c;").await;

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
    let down = Client::new(&mirror);
    wait_until_mirrored(&up, &down, &["trimmed"]).await;
    append(&up, &trimmed, "text/plain", "d;").await;
    wait_until_mirrored(&up, &down, &["trimmed"]).await;
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(!logged.contains("rebuilding"), "{logged}");
}

#[tokio::test]
async fn a_single_stream_mirror_follows_only_that_stream() {
    let upstream = Server::start(&["--memory"]);
    let up = with_bucket(&upstream).await;
    let wanted = stream("wanted");
    assert_eq!(up.create(&wanted, "text/plain", "one;").await.status(), 201);
    let other = up.create(&stream("other"), "text/plain", "x").await;
    assert_eq!(other.status(), 201);
    let mirror = Server::start(&["--memory", "--mirror-from", &up.url(&wanted)]);
    let down = Client::new(&mirror);
    append(&up, &wanted, "text/plain", "two;").await;
    wait_until_mirrored(&up, &down, &["wanted"]).await;
    let other = down.head(&stream("other")).await;
    assert_eq!(other.status(), 404, "only the named stream is mirrored");
}

#[tokio::test]
async fn stream_names_travel_percent_encoded_so_a_bucket_mirror_keeps_every_name_apart() {
    let upstream = Server::start(&["--memory"]);
    let up = with_bucket(&upstream).await;
    // `a%20b` and `a b` are two streams; so is the S2 name `dir/x`.
    let (percent, space) = ("a%2520b", "a%20b");
    for (name, body) in [(percent, "percent;"), (space, "space;")] {
        let created = up.create(&stream(name), "text/plain", body).await;
        assert_eq!(created.status(), 201);
    }
    let created = up.create_s2_stream(BUCKET, "dir/x").await;
    assert_eq!(created.status(), 201);
    let s2_append = |body: &'static str| {
        let input = json!({"records": [{"body": body}]});
        let up = up.clone();
        async move { up.s2_append(BUCKET, "dir%2Fx", &input).await }
    };
    assert_eq!(s2_append("one").await.status(), 200);

    let mirror = bucket_mirror(&upstream);
    let down = Client::new(&mirror);
    wait_until_mirrored(&up, &down, &[percent, space]).await;
    // Live appends land on the right copies too.
    for (name, body) in [(percent, "percent-2;"), (space, "space-2;")] {
        append(&up, &stream(name), "text/plain", body).await;
    }
    assert_eq!(s2_append("two").await.status(), 200);
    wait_until_mirrored(&up, &down, &[percent, space]).await;
    let (_, _, body) = view(&down, &stream(percent)).await;
    assert_eq!(body, b"percent;percent-2;");

    let upstream_records = s2_records(&up, "dir/x").await;
    assert_eq!(upstream_records.0, 200);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while s2_records(&down, "dir/x").await != upstream_records {
        assert!(
            tokio::time::Instant::now() < deadline,
            "dir/x was not mirrored: {:?}",
            s2_records(&down, "dir/x").await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn an_encrypted_s2_stream_is_mirrored_sealed_and_reads_back_with_its_key() {
    let upstream = Server::start(&["--memory"]);
    let up = Client::new(&upstream);
    let basin = up
        .send_json(
            Method::POST,
            "/v1/basins",
            &json!({"basin": BUCKET, "config": {"stream_cipher": "aes-256-gcm"}}),
        )
        .await;
    assert_eq!(basin.status(), 201);
    let key = "a2tra2tra2tra2tra2tra2tra2tra2tra2tra2tra2s=";
    let s2 = |http: &Client, method: Method, path: &str| {
        http.s2(method, BUCKET, path)
            .header("content-type", "application/json")
            .header("s2-encryption-key", key)
    };
    let created = s2(&up, Method::POST, "/v1/streams")
        .body(json!({"stream": "sec"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let appended = s2(&up, Method::POST, "/v1/streams/sec/records")
        .body(json!({"records": [{"body": "top secret"}]}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(appended.status(), 200);

    let mirror = bucket_mirror(&upstream);
    let down = Client::new(&mirror);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let read = loop {
        let read = s2(&down, Method::GET, "/v1/streams/sec/records?seq_num=0")
            .send()
            .await
            .unwrap();
        if read.status() == 200 {
            let body = json_of(read).await;
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
    let plain = down.read(&stream("sec"), "-1").await;
    assert_eq!(plain.status(), 409);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_deleted_upstream_while_a_fork_holds_it_is_removed_from_a_live_mirror() {
    let upstream = Server::start(&["--memory"]);
    let up = with_bucket(&upstream).await;
    let source = stream("src");
    assert_eq!(up.create(&source, "text/plain", "abc").await.status(), 201);
    let fork = up
        .request(Method::PUT, &stream("fork"))
        .header("content-type", "text/plain")
        .header("stream-forked-from", &source)
        .send()
        .await
        .unwrap();
    assert_eq!(fork.status(), 201);
    let mirror = bucket_mirror(&upstream);
    let down = Client::new(&mirror);
    wait_until_mirrored(&up, &down, &["src"]).await;

    // Soft: the fork still reads through it, but for everyone else it is gone (410 upstream).
    assert_eq!(up.delete(&source).await.status(), 204);
    assert_eq!(up.head(&source).await.status(), 410);
    wait_for_status(&down, &source, 404).await;
}
