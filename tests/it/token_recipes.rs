//! The token recipes of `docs/tokens.md`, as the page gives them: each JSON body is read from the
//! page, issued against a real `--auth` server, and checked to do what the page says it does and
//! nothing more. A recipe edited into something wider, or narrower, fails here.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::common::{Client, Server};

const OPERATOR: &str = "operator-token-for-recipes-0123456789";

/// The `json` code blocks of `docs/tokens.md`, each an issue request, by their `id`.
fn recipe(id: &str) -> Value {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/tokens.md"))
        .expect("docs/tokens.md");
    page.split("```json\n")
        .skip(1)
        .filter_map(|block| block.split("```").next())
        .map(|block| serde_json::from_str::<Value>(block).expect("a recipe is JSON"))
        .find(|body| body["id"] == id)
        .unwrap_or_else(|| panic!("docs/tokens.md has no recipe {id}"))
}

/// An `--auth` server with the buckets `logs` and `other`, each holding the text stream `app`,
/// and a client holding the token `id`'s recipe issued.
async fn server_with_token(id: &str) -> (Server, Client) {
    let server = Server::start(&["--memory", "--auth", "--auth-token", OPERATOR]);
    let operator = Client::new(&server).bearer(OPERATOR);
    for bucket in ["logs", "other"] {
        assert_eq!(operator.create_bucket(bucket).await.status(), 201);
        let path = format!("/{bucket}/app");
        let r = operator.create(&path, "text/plain", "hello").await;
        assert_eq!(r.status(), 201);
    }
    let r = operator.create("/v1/stream/base", "text/plain", "x").await;
    assert_eq!(r.status(), 201);
    let issued = operator
        .send_json(Method::POST, "/v1/access-tokens", &recipe(id))
        .await;
    assert_eq!(issued.status(), 201, "issue {id}");
    let secret = crate::common::json_of(issued).await["access_token"]
        .as_str()
        .expect("an access_token")
        .to_string();
    let token = operator.bearer(&secret);
    (server, token)
}

/// `POST path` closing the stream, with `Stream-Closed: true`.
async fn close(client: &Client, path: &str) -> StatusCode {
    let request = client
        .request(Method::POST, path)
        .header("stream-closed", "true");
    request.send().await.expect("the server answers").status()
}

/// `PUT path` with a small JSON body.
async fn put_json(client: &Client, path: &str, body: &str) -> StatusCode {
    let request = client
        .request(Method::PUT, path)
        .header("content-type", "application/json");
    request
        .body(body.to_string())
        .send()
        .await
        .unwrap()
        .status()
}

/// The requests no recipe's token may make: other buckets, the base surface, creating buckets,
/// issuing tokens.
async fn assert_refused_outside_any_recipe(token: &Client) {
    for path in [
        "/other/app?offset=-1",
        "/other/missing?offset=-1",
        "/v1/stream/base?offset=-1",
        "/v1/basins",
        "/v1/access-tokens",
    ] {
        assert_eq!(token.get(path).await.status(), 403, "GET {path}");
    }
    assert_eq!(token.create_bucket("newbucket").await.status(), 403);
    let r = token.append("/other/app", "text/plain", "intruder").await;
    assert_eq!(r.status(), 403);
    let wider = json!({"id": "escalated", "scope": {"ops": ["account-metrics"]}});
    let r = token
        .send_json(Method::POST, "/v1/access-tokens", &wider)
        .await;
    assert_eq!(r.status(), 403, "issuing tokens");
}

#[tokio::test]
async fn the_bucket_reader_recipe_reads_and_lists_its_bucket_and_writes_nothing() {
    let (_server, reader) = server_with_token("logs-reader").await;
    let r = reader.read("/logs/app", "-1").await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "hello");
    for path in [
        "/logs",
        "/logs/streams",
        "/logs/app/attrs",
        "/logs/app/bootstrap",
        "/logs/app?offset=-1&live=long-poll",
    ] {
        let status = reader.get(path).await.status();
        assert!(status.is_success(), "GET {path}: {status}");
    }
    assert_eq!(reader.head("/logs/app").await.status(), 200);
    let r = reader.s2_read("logs", "app", "seq_num=0").await;
    assert_eq!(r.status(), 200);
    let tail = reader.s2(Method::GET, "logs", "/v1/streams/app/records/tail");
    assert_eq!(tail.send().await.unwrap().status(), 200);

    let r = reader.append("/logs/app", "text/plain", "x").await;
    assert_eq!(r.status(), 403, "append");
    let r = reader.create("/logs/new", "text/plain", "x").await;
    assert_eq!(r.status(), 403, "create a stream");
    assert_eq!(reader.delete("/logs/app").await.status(), 403);
    assert_eq!(close(&reader, "/logs/app").await, 403);
    assert_eq!(put_json(&reader, "/logs/app/attrs", "{}").await, 403);
    let r = reader
        .s2_append("logs", "app", &json!({"records": [{"body": "x"}]}))
        .await;
    assert_eq!(r.status(), 403, "S2 append");
    assert_eq!(reader.get("/metrics").await.status(), 403);
    assert_refused_outside_any_recipe(&reader).await;
}

#[tokio::test]
async fn the_writer_recipe_appends_but_cannot_close_fence_trim_read_or_create() {
    let (_server, writer) = server_with_token("logs-writer").await;
    let r = writer.append("/logs/app", "text/plain", " world").await;
    assert_eq!(r.status(), 204);
    let batch = writer
        .request(Method::POST, "/logs/app/append-batch")
        .header("content-type", "text/plain")
        .body(b"\x00\x00\x00\x01!".to_vec());
    let status = batch.send().await.unwrap().status();
    assert!(status.is_success(), "append-batch: {status}");
    let plain = json!({"records": [{"body": "s2"}]});
    assert_eq!(writer.s2_append("logs", "app", &plain).await.status(), 200);

    assert_eq!(close(&writer, "/logs/app").await, 403, "close needs fence");
    let fence = json!({"records": [{"headers": [["", "fence"]], "body": "mine"}]});
    let r = writer.s2_append("logs", "app", &fence).await;
    assert_eq!(r.status(), 403, "S2 fence command");
    let trim = writer
        .request(Method::PUT, "/logs/app/retention?record=1")
        .send()
        .await
        .unwrap();
    assert_eq!(trim.status(), 403, "retention is a trim");
    let snapshot = writer
        .request(Method::PUT, "/logs/app/snapshot?record=1")
        .header("content-type", "text/plain")
        .body("h");
    assert_eq!(snapshot.send().await.unwrap().status(), 403, "snapshot");
    assert_eq!(writer.read("/logs/app", "-1").await.status(), 403, "read");
    let r = writer.s2_read("logs", "app", "seq_num=0").await;
    assert_eq!(r.status(), 403, "S2 read");
    let r = writer.create("/logs/new", "text/plain", "x").await;
    assert_eq!(r.status(), 403, "create a stream");
    assert_eq!(writer.delete("/logs/app").await.status(), 403);
    assert_eq!(writer.get("/metrics").await.status(), 403);
    assert_refused_outside_any_recipe(&writer).await;
}

#[tokio::test]
async fn the_scraper_recipe_reads_metrics_and_nothing_else() {
    let (_server, scraper) = server_with_token("prometheus").await;
    let r = scraper.get("/metrics").await;
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("runnel_"));

    for path in ["/logs", "/logs/streams", "/logs/app?offset=-1"] {
        assert_eq!(scraper.get(path).await.status(), 403, "GET {path}");
    }
    let r = scraper.append("/logs/app", "text/plain", "x").await;
    assert_eq!(r.status(), 403);
    let r = scraper.s2_read("logs", "app", "seq_num=0").await;
    assert_eq!(r.status(), 403);
    assert_eq!(scraper.create_basin("newbasin").await.status(), 403);
    assert_refused_outside_any_recipe(&scraper).await;
    // As the page says: S2's metrics routes, which Runnel does not serve, answer any token.
    assert_eq!(scraper.get("/v1/metrics").await.status(), 501);
}
