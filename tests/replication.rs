//! StreamLD replication end to end: two real servers, an upstream and a mirror of one of its
//! buckets. Appends flow live; the mirror survives SIGKILL and resumes from its own cursor; the
//! upstream restarts and the mirror reconnects; retention moved past the mirror's cursor takes
//! the gap path and rebuilds from the snapshot. At the end both sides hold the same bytes at the
//! same offsets.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{Server, client, header};

const BUCKET: &str = "mirrored";

async fn put(
    http: &reqwest::Client,
    url: &str,
    content_type: &str,
    body: &str,
) -> reqwest::Response {
    http.put(url)
        .header("content-type", content_type)
        .body(body.to_string())
        .send()
        .await
        .unwrap()
}

async fn create_bucket(http: &reqwest::Client, server: &Server) {
    let response = http
        .put(server.url(&format!("/{BUCKET}")))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
}

async fn append(http: &reqwest::Client, url: &str, content_type: &str, body: &str) {
    let response = http
        .post(url)
        .header("content-type", content_type)
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert!(
        response.status().is_success(),
        "append to {url}: {}",
        response.status()
    );
}

/// Everything a reader sees of a stream: HEAD's tail and first record, and the content.
async fn view(http: &reqwest::Client, url: &str) -> (String, Option<String>, Vec<u8>) {
    let seen = try_view(http, url).await;
    seen.unwrap_or_else(|status| panic!("read {url}: {status}"))
}

/// [`view`], or the status of a read that failed: a mirror rebuilding a stream after a gap swaps
/// in a copy that starts later, so a read that began on the old copy may find its offset gone.
async fn try_view(
    http: &reqwest::Client,
    url: &str,
) -> Result<(String, Option<String>, Vec<u8>), reqwest::StatusCode> {
    let head = http.head(url).send().await.unwrap();
    let tail = header(&head, "stream-next-offset")
        .unwrap_or_default()
        .to_string();
    let first = header(&head, "stream-record-first").map(str::to_string);
    let mut body = Vec::new();
    let mut offset = "-1".to_string();
    loop {
        let response = http
            .get(format!("{url}?offset={offset}"))
            .send()
            .await
            .unwrap();
        if response.status() != 200 {
            return Err(response.status());
        }
        let done = header(&response, "stream-up-to-date") == Some("true");
        offset = header(&response, "stream-next-offset").unwrap().to_string();
        body.extend_from_slice(&response.bytes().await.unwrap());
        if done {
            return Ok((tail, first, body));
        }
    }
}

async fn wait_until_mirrored(
    http: &reqwest::Client,
    upstream: &Server,
    mirror: &Server,
    streams: &[&str],
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let mut same = true;
        for stream in streams {
            let up = view(http, &upstream.url(&format!("/{BUCKET}/{stream}"))).await;
            let head = http
                .head(mirror.url(&format!("/{BUCKET}/{stream}")))
                .send()
                .await
                .unwrap();
            if head.status() != 200
                || try_view(http, &mirror.url(&format!("/{BUCKET}/{stream}"))).await != Ok(up)
            {
                same = false;
            }
        }
        if same {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "mirror did not catch up within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

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
    let no_redirects = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
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
async fn the_sse_binding_sends_one_event_per_record_resumes_and_signals_gaps() {
    let server = Server::start(&["--memory"]);
    let http = client();
    assert_eq!(
        http.put(server.url("/feeds"))
            .send()
            .await
            .unwrap()
            .status(),
        201
    );
    let stream = server.url("/feeds/news");
    assert_eq!(
        put(
            &http,
            &stream,
            "application/json",
            r#"[{"n":1},{"n":2},{"n":3}]"#
        )
        .await
        .status(),
        201
    );
    let head = http.head(&stream).send().await.unwrap();
    let links = header(&head, "link").unwrap().to_string();
    let sse_url = links
        .split(',')
        .find(|l| l.contains("streamld#sse"))
        .and_then(|l| {
            l.split_once('<')?
                .1
                .split_once('>')
                .map(|(u, _)| u.to_string())
        })
        .expect("an SSE binding Link");

    // Resuming after cursor 1 delivers events 2 and 3, each with its cursor as id.
    let response = http
        .get(&sse_url)
        .header("last-event-id", "1")
        .send()
        .await
        .unwrap();
    assert_eq!(header(&response, "content-type"), Some("text/event-stream"));
    let mut body = response.bytes_stream();
    let mut seen = String::new();
    while !seen.contains("\nid: 3\n") && !seen.starts_with("id: 3\n") {
        let chunk =
            tokio::time::timeout(Duration::from_secs(5), futures::StreamExt::next(&mut body))
                .await
                .unwrap();
        seen.push_str(std::str::from_utf8(&chunk.unwrap().unwrap()).unwrap());
    }
    assert!(seen.starts_with("id: 2\n"), "{seen}");
    assert!(seen.contains(r#""payload":{"n":3}"#), "{seen}");

    // Behind retention: 409 with a GapSignal, and no event stream.
    let tail = header(&head, "stream-next-offset").unwrap().to_string();
    assert_eq!(
        http.put(format!("{stream}/snapshot/{tail}"))
            .body("s")
            .send()
            .await
            .unwrap()
            .status(),
        204
    );
    assert_eq!(
        http.put(format!("{stream}/retention/{tail}"))
            .send()
            .await
            .unwrap()
            .status(),
        204
    );
    let gap = http.get(format!("{sse_url}?after=1")).send().await.unwrap();
    assert_eq!(gap.status(), 409);
    let body: serde_json::Value = serde_json::from_slice(&gap.bytes().await.unwrap()).unwrap();
    assert_eq!(body["@type"], "GapSignal");
    assert_eq!(body["oldestAvailable"], 4);
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
