//! Acknowledged means durable: appends, offsets, producer state, TTL, expiry and the closed flag
//! all survive the server being killed with SIGKILL in the middle of a write load.

use std::collections::HashMap;

use reqwest::Method;

use crate::common::{Client, Server, header};

const WRITERS: usize = 8;

/// One acknowledged append: its body and the offset the server returned after it.
#[derive(Clone, Debug)]
struct Ack {
    body: String,
    next_offset: String,
    seq: u64,
}

async fn create(http: &Client, path: &str, headers: &[(&str, &str)], body: &str) {
    let mut request = http.request(Method::PUT, path).body(body.to_string());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    assert_eq!(response.status(), 201, "create {path}");
}

/// An append to `path` as writer `writer`'s producer, with sequence number `seq`.
fn as_producer(
    http: &Client,
    path: &str,
    writer: usize,
    seq: u64,
    json: bool,
) -> reqwest::RequestBuilder {
    let content_type = if json {
        "application/json"
    } else {
        "text/plain"
    };
    http.request(Method::POST, path)
        .header("content-type", content_type)
        .header("producer-id", format!("writer-{writer}"))
        .header("producer-epoch", "0")
        .header("producer-seq", seq.to_string())
}

/// Appends with producer headers until the server disappears; returns what was acknowledged.
async fn write_until_killed(http: Client, path: &str, json: bool, writer: usize) -> Vec<Ack> {
    let mut acks = Vec::new();
    for seq in 0u64.. {
        let body = if json {
            format!("{{\"w\":{writer},\"n\":{seq}}}")
        } else {
            format!("w{writer}-n{seq};")
        };
        let sent = as_producer(&http, path, writer, seq, json)
            .body(body.clone())
            .send()
            .await;
        match sent {
            Ok(response) if response.status() == 200 => acks.push(Ack {
                body,
                next_offset: header(&response, "stream-next-offset").unwrap().to_string(),
                seq,
            }),
            Ok(response) => panic!("unexpected status {} before the kill", response.status()),
            Err(_) => break, // the server is gone
        }
    }
    acks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_acknowledged_write_survives_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::on_disk(dir.path());
    let http = Client::new(&server);

    create(
        &http,
        "/v1/stream/bytes",
        &[("content-type", "text/plain"), ("stream-ttl", "3600")],
        "",
    )
    .await;
    create(
        &http,
        "/v1/stream/events",
        &[
            ("content-type", "application/json"),
            ("stream-expires-at", "2099-01-01T00:00:00Z"),
        ],
        "",
    )
    .await;
    create(
        &http,
        "/v1/stream/sealed",
        &[("content-type", "text/plain"), ("stream-closed", "true")],
        "final",
    )
    .await;

    let mut tasks = Vec::new();
    for writer in 0..WRITERS {
        let (path, json) = if writer % 2 == 0 {
            ("/v1/stream/bytes", false)
        } else {
            ("/v1/stream/events", true)
        };
        tasks.push((
            writer,
            path,
            tokio::spawn(write_until_killed(http.clone(), path, json, writer)),
        ));
    }
    // Kill once every writer has had some appends acknowledged, while all of them are mid-flight.
    wait_for_appends(&http, 40 * WRITERS as u64).await;
    server.kill();

    let mut acked: HashMap<&str, Vec<(usize, Vec<Ack>)>> = HashMap::new();
    for (writer, path, task) in tasks {
        acked
            .entry(path)
            .or_default()
            .push((writer, task.await.unwrap()));
    }

    let server = Server::on_disk(dir.path());
    let http = Client::new(&server);
    for (path, writers) in &acked {
        let json = path.ends_with("events");
        let content = read_all(&http, path).await;
        let messages = split_messages(&content, json);
        for (writer, acks) in writers {
            assert!(!acks.is_empty(), "writer {writer} got nothing acknowledged");
            // In order, exactly once, every acknowledged body of this writer.
            let mine: Vec<&String> = messages
                .iter()
                .filter(|m| belongs_to(m, *writer, json))
                .collect();
            assert!(
                mine.len() >= acks.len(),
                "writer {writer}: {} stored < {} acked",
                mine.len(),
                acks.len()
            );
            for (stored, ack) in mine.iter().zip(acks) {
                assert_eq!(**stored, ack.body, "writer {writer} in order");
            }
            // At its original offset: reading from the offset before an ack starts with its body.
            for pair in acks.windows(2) {
                let response = http.read(path, &pair[0].next_offset).await;
                let rest = response.text().await.unwrap();
                assert!(!rest.is_empty());
                let first = split_messages(&rest, json)
                    .into_iter()
                    .find(|m| belongs_to(m, *writer, json));
                assert_eq!(
                    first.as_deref(),
                    Some(pair[1].body.as_str()),
                    "offset {} of writer {writer}",
                    pair[0].next_offset
                );
            }
            // Producer state survived: the last acknowledged seq is a duplicate, the one after a gap
            // would be refused, and continuing from wherever the writer really got to is accepted.
            let last = acks.last().unwrap();
            let retry = append_as(&http, path, *writer, last.seq, json, "retry").await;
            assert_eq!(
                retry.status(),
                204,
                "retry of acknowledged seq {} is a duplicate",
                last.seq
            );
            let stored_last = (mine.len() - 1) as u64;
            let gap = append_as(&http, path, *writer, stored_last + 2, json, "gap").await;
            assert_eq!(gap.status(), 409);
            assert_eq!(
                header(&gap, "producer-expected-seq"),
                Some((stored_last + 1).to_string().as_str())
            );
        }
        // Nothing half-written: every stored message is one whole message some writer sent.
        for message in &messages {
            assert!(
                (0..WRITERS).any(|w| belongs_to(message, w, json)),
                "unexpected content {message:?}"
            );
        }
    }

    let bytes = http.head("/v1/stream/bytes").await;
    assert_eq!(header(&bytes, "stream-ttl"), Some("3600"));
    let events = http.head("/v1/stream/events").await;
    assert_eq!(
        header(&events, "stream-expires-at"),
        Some("2099-01-01T00:00:00Z")
    );
    let sealed = http.read("/v1/stream/sealed", "-1").await;
    assert_eq!(header(&sealed, "stream-closed"), Some("true"));
    assert_eq!(sealed.text().await.unwrap(), "final");
}

async fn wait_for_appends(http: &Client, at_least: u64) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let mut total = 0;
        for path in ["/v1/stream/bytes", "/v1/stream/events"] {
            let offset = http.next_offset(path).await;
            total += offset[..16].parse::<u64>().unwrap();
        }
        if total >= at_least {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "writers made no progress"
        );
        tokio::task::yield_now().await;
    }
}

async fn append_as(
    http: &Client,
    path: &str,
    writer: usize,
    seq: u64,
    json: bool,
    body: &str,
) -> reqwest::Response {
    let body = if json {
        format!("{{\"probe\":\"{body}\"}}")
    } else {
        body.to_string()
    };
    as_producer(http, path, writer, seq, json)
        .body(body)
        .send()
        .await
        .unwrap()
}

/// The bodies of the reads that take a stream from its start to its tail.
async fn read_chunks(http: &Client, path: &str) -> Vec<bytes::Bytes> {
    let chunks = http.read_chunks(path).await;
    chunks.unwrap_or_else(|status| panic!("a read of {path} answered {status}"))
}

async fn read_all(http: &Client, path: &str) -> String {
    let chunks = read_chunks(http, path).await;
    let texts = chunks.iter().map(|c| std::str::from_utf8(c).unwrap());
    if !path.ends_with("events") {
        return texts.collect();
    }
    // Join the arrays of successive chunks into one.
    let inner: Vec<&str> = texts
        .map(|text| text.trim_start_matches('[').trim_end_matches(']'))
        .filter(|inner| !inner.is_empty())
        .collect();
    format!("[{}]", inner.join(","))
}

fn split_messages(content: &str, json: bool) -> Vec<String> {
    if json {
        let values: Vec<serde_json::Value> = serde_json::from_str(content).unwrap();
        values.iter().map(|v| v.to_string()).collect()
    } else {
        content.split_inclusive(';').map(str::to_string).collect()
    }
}

fn belongs_to(message: &str, writer: usize, json: bool) -> bool {
    if json {
        message.starts_with(&format!("{{\"w\":{writer},"))
    } else {
        message.starts_with(&format!("w{writer}-")) && message.ends_with(';')
    }
}

/// `--sync none` skips the fsync, not the write: what it acknowledged is in the OS, so a crash
/// of Runnel alone (SIGKILL) loses none of it.
#[tokio::test]
async fn with_sync_none_acknowledged_appends_survive_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().to_str().unwrap();
    let server = Server::start(&["--data-dir", data_dir, "--sync", "none"]);
    let http = Client::new(&server);
    let path = "/v1/stream/unsynced";
    create(&http, path, &[("content-type", "text/plain")], "").await;
    for body in ["one;", "two;", "three;"] {
        let response = http.append(path, "text/plain", body).await;
        assert_eq!(response.status(), 204);
    }
    server.kill();

    let server = Server::on_disk(dir.path());
    let http = Client::new(&server);
    assert_eq!(read_all(&http, path).await, "one;two;three;");
}

/// Distinct bytes at every position, so a body read from the wrong place cannot pass for it.
fn patterned(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ (i >> 9) as u8 ^ seed)
        .collect()
}

fn staged_files(data: &std::path::Path) -> usize {
    std::fs::read_dir(data.join("bodies")).map_or(0, |files| files.count())
}

/// Bodies of a megabyte or more are written to files of their own before their commit (so they
/// hold up no other append): those appends and snapshots survive SIGKILL like any other, a
/// refused one leaves no file behind, and deleting the stream deletes its files.
#[tokio::test]
async fn large_appends_and_snapshots_kept_in_their_own_files_survive_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::on_disk(dir.path());
    let http = Client::new(&server);
    let octets = "application/octet-stream";
    let with_seq = |seq: &'static str, body: Vec<u8>| {
        http.request(Method::POST, "/bkt1/bin")
            .header("content-type", octets)
            .header("stream-seq", seq)
            .body(body)
            .send()
    };
    assert_eq!(http.create_bucket("bkt1").await.status(), 201);
    assert_eq!(http.create("/bkt1/bin", octets, "").await.status(), 201);
    let large = patterned(3 << 20, 1);
    let appended = with_seq("b", large.clone()).await.unwrap();
    assert_eq!(appended.status(), 204);
    let after_large = header(&appended, "stream-next-offset").unwrap().to_string();
    let refused = with_seq("a", patterned(2 << 20, 2)).await.unwrap();
    assert_eq!(refused.status(), 409, "a Stream-Seq going back is refused");
    let tail = http.append("/bkt1/bin", octets, b"tail".to_vec()).await;
    assert_eq!(tail.status(), 204);
    let blob = patterned(2 << 20, 3);
    let snapshot = http
        .request(Method::PUT, &format!("/bkt1/bin/snapshot/{after_large}"))
        .header("content-type", octets)
        .body(blob.clone())
        .send();
    assert_eq!(snapshot.await.unwrap().status(), 204);

    let json = "application/json";
    assert_eq!(http.create("/bkt1/events", json, "").await.status(), 201);
    let messages: Vec<String> = (0..20_000)
        .map(|n| format!("{{\"n\":{n},\"pad\":\"{}\"}}", "x".repeat(100)))
        .collect();
    let array = format!("[{}]", messages.join(","));
    let appended = http.append("/bkt1/events", json, array).await;
    assert_eq!(appended.status(), 204);
    assert_eq!(
        staged_files(dir.path()),
        3,
        "the large append, the snapshot and the JSON append each have a file; the refused one none"
    );

    server.kill();
    let server = Server::on_disk(dir.path());
    let http = Client::new(&server);
    let mut expected = large;
    expected.extend_from_slice(b"tail");
    let chunks = read_chunks(&http, "/bkt1/bin").await;
    assert!(chunks.concat() == expected);
    let response = http.get("/bkt1/bin/snapshot").await;
    assert_eq!(
        response.status(),
        200,
        "the redirect to the snapshot is followed"
    );
    assert!(response.bytes().await.unwrap() == blob);
    let events = read_all(&http, "/bkt1/events").await;
    let read: Vec<String> = split_messages(&events, true);
    assert_eq!(read.len(), messages.len());
    assert_eq!(read[19_999], messages[19_999]);
    assert_eq!(
        staged_files(dir.path()),
        3,
        "the restart kept every file in use"
    );

    let deleted = http.delete("/bkt1/bin").await;
    assert_eq!(deleted.status(), 204);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while staged_files(dir.path()) != 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the deleted stream's files are never deleted"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}
