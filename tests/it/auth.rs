//! Access control with `--auth`: bearer tokens on every face, scoped tokens issued, listed and
//! revoked through S2's `/v1/access-tokens`, 401 / 403 / 429, sessions that end when their token
//! expires, tokens that survive restarts, and a mirror that authenticates to its upstream.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::common::{Client, Server, header, json_of};

const OPERATOR: &str = "operator-token-for-tests-0123456789";

fn auth_server(extra: &[&str]) -> Server {
    let mut args = vec!["--memory", "--auth", "--auth-token", OPERATOR];
    args.extend_from_slice(extra);
    Server::start(&args)
}

/// The server's operator: every permission.
fn operator(server: &Server) -> Client {
    Client::new(server).bearer(OPERATOR)
}

/// Two buckets with a stream each, made by the operator.
async fn setup(server: &Server) {
    let operator = operator(server);
    for bucket in ["team-alpha", "team-bravo"] {
        let r = operator.create_bucket(bucket).await;
        assert_eq!(r.status(), 201);
        let r = operator
            .create(&format!("/{bucket}/events"), "text/plain", "hello")
            .await;
        assert_eq!(r.status(), 201);
    }
}

fn reader_of(bucket: &str) -> Value {
    json!({
        "basins": {"exact": bucket},
        "streams": {"prefix": ""},
        "op_groups": {"stream": {"read": true}, "basin": {"read": true}}
    })
}

#[tokio::test]
async fn every_face_wants_a_token_but_health_checks_do_not() {
    let server = auth_server(&[]);
    setup(&server).await;
    let anonymous = Client::new(&server);
    let wrong = anonymous.bearer("not-a-token");
    for (method, path) in [
        (Method::GET, "/team-alpha/events?offset=-1"),
        (Method::GET, "/v1/stream/x?offset=-1"),
        (Method::POST, "/team-alpha/events"),
        (Method::GET, "/v1/basins"),
        (Method::GET, "/metrics"),
        (Method::GET, "/v1/streamld/replication"),
    ] {
        let r = anonymous.send(method.clone(), path).await;
        assert_eq!(r.status(), 401, "{method} {path}");
        assert!(header(&r, "www-authenticate").is_some_and(|v| v.starts_with("Bearer")));
        let r = wrong.send(method.clone(), path).await;
        assert_eq!(r.status(), 401, "{method} {path} with a wrong token");
    }
    let s2 = anonymous.get("/v1/basins").await;
    assert_eq!(json_of(s2).await["code"], "unauthenticated");
    for path in ["/healthz", "/readyz"] {
        assert_eq!(anonymous.get(path).await.status(), 200);
    }
    let r = operator(&server).get("/team-alpha/events?offset=-1").await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "hello");

    // Two tokens in one request: neither is picked.
    let two = anonymous
        .request(Method::GET, "/team-alpha/events?offset=-1")
        .header("authorization", "Bearer not-a-token")
        .header("authorization", format!("Bearer {OPERATOR}"))
        .send()
        .await
        .unwrap();
    assert_eq!(two.status(), 400);
    assert!(
        two.text()
            .await
            .unwrap()
            .contains("one Authorization header")
    );
}

#[tokio::test]
async fn a_scoped_token_reads_its_bucket_and_nothing_else_and_learns_nothing_about_others() {
    let server = auth_server(&[]);
    setup(&server).await;
    let operator = operator(&server);
    let reader = operator.bearer(
        &operator
            .issued_token("reader", reader_of("team-alpha"))
            .await,
    );
    let r = reader.get("/team-alpha/events?offset=-1").await;
    assert_eq!(r.status(), 200);
    let r = reader.append("/team-alpha/events", "text/plain", "").await;
    assert_eq!(r.status(), 403, "read-only");
    // Another bucket: the same 403 whether the stream exists or not.
    for path in [
        "/team-bravo/events?offset=-1",
        "/team-bravo/missing?offset=-1",
        "/nobucket/x?offset=-1",
    ] {
        let r = reader.get(path).await;
        assert_eq!(r.status(), 403, "{path}");
    }
    // S2 listings show only what the token covers.
    let basins = json_of(operator.get("/v1/basins").await).await;
    assert_eq!(basins["basins"].as_array().unwrap().len(), 2);
    let lister = operator.bearer(
        &operator
            .issued_token(
                "lister",
                json!({"basins": {"prefix": "team-alpha"}, "streams": {"prefix": ""}, "op_groups": {"account": {"read": true}, "basin": {"read": true}}}),
            )
            .await,
    );
    let basins = json_of(lister.get("/v1/basins").await).await;
    let names: Vec<&str> = basins["basins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["team-alpha"]);
    let r = reader.s2_read("team-alpha", "events", "seq_num=0").await;
    assert_eq!(r.status(), 200);
    let r = reader.s2_read("team-bravo", "events", "seq_num=0").await;
    assert_eq!(r.status(), 403);
    assert_eq!(json_of(r).await["code"], "permission_denied");
}

#[tokio::test]
async fn tokens_are_listed_without_secrets_cannot_widen_and_stop_working_when_revoked() {
    let server = auth_server(&[]);
    setup(&server).await;
    let operator = operator(&server);
    let issuer = operator.bearer(
        &operator
            .issued_token(
                "team-alpha-admin",
                json!({
                    "basins": {"exact": "team-alpha"}, "streams": {"prefix": ""}, "access_tokens": {"prefix": "team-alpha-"},
                    "op_groups": {"stream": {"read": true, "write": true}}, "ops": ["issue-access-token", "list-access-tokens"]
                }),
            )
            .await,
    );
    let wider = issuer
        .issue_token("team-alpha-wide", reader_of("team-bravo"), None)
        .await;
    assert_eq!(wider.status(), 403);
    let narrower = issuer
        .issue_token("team-alpha-reader", reader_of("team-alpha"), None)
        .await;
    assert_eq!(
        narrower.status(),
        403,
        "basin reads are beyond the issuer's stream-only groups"
    );
    let ok = issuer
        .issue_token(
            "team-alpha-reader",
            json!({"basins": {"exact": "team-alpha"}, "streams": {"prefix": ""}, "op_groups": {"stream": {"read": true}}}),
            None,
        )
        .await;
    assert_eq!(ok.status(), 201);
    let secret = json_of(ok).await["access_token"]
        .as_str()
        .unwrap()
        .to_string();

    let listed = json_of(issuer.get("/v1/access-tokens").await).await;
    let ids: Vec<&str> = listed["access_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        ["team-alpha-admin", "team-alpha-reader"],
        "only ids the issuer covers"
    );
    assert!(
        !listed.to_string().contains(&secret),
        "secrets are never listed"
    );

    let reader = operator.bearer(&secret);
    let r = reader.get("/team-alpha/events?offset=-1").await;
    assert_eq!(r.status(), 200);
    let r = operator.revoke_token("team-alpha-reader").await;
    assert_eq!(r.status(), 200);
    let r = reader.get("/team-alpha/events?offset=-1").await;
    assert_eq!(r.status(), 401, "a revoked token is refused at once");
}

#[tokio::test]
async fn fencing_needs_the_fence_operation_not_just_append() {
    let server = auth_server(&[]);
    let operator = operator(&server);
    let r = operator.create_basin("fenced-basin").await;
    assert_eq!(r.status(), 201);
    let r = operator.create_s2_stream("fenced-basin", "s").await;
    assert_eq!(r.status(), 201);
    let appender = operator.bearer(
        &operator
            .issued_token(
                "appender",
                json!({"basins": {"prefix": ""}, "streams": {"prefix": ""}, "ops": ["append"]}),
            )
            .await,
    );
    let plain = json!({"records": [{"body": "x"}]});
    let r = appender.s2_append("fenced-basin", "s", &plain).await;
    assert_eq!(r.status(), 200);
    let fence = json!({"records": [{"headers": [["", "fence"]], "body": "mine"}]});
    let r = appender.s2_append("fenced-basin", "s", &fence).await;
    assert_eq!(r.status(), 403);
}

/// A token with `ops` on every stream of every bucket.
async fn token_with(operator: &Client, id: &str, ops: &[&str]) -> Client {
    let scope = json!({"basins": {"prefix": ""}, "streams": {"prefix": ""}, "ops": ops});
    operator.bearer(&operator.issued_token(id, scope).await)
}

/// `POST path` with `Stream-Closed: true`, the `body` and `extra` headers.
async fn close(client: &Client, path: &str, body: &'static str, extra: &[(&str, &str)]) -> u16 {
    let mut request = client
        .request(Method::POST, path)
        .header("content-type", "text/plain")
        .header("stream-closed", "true");
    for (name, value) in extra {
        request = request.header(*name, *value);
    }
    request.body(body).send().await.unwrap().status().as_u16()
}

#[tokio::test]
async fn closing_a_stream_needs_fence_as_well_as_append_on_every_face_that_closes() {
    let server = auth_server(&[]);
    let operator = operator(&server);
    assert_eq!(operator.create_bucket("closing").await.status(), 201);
    let streams = ["/closing/s", "/v1/stream/c"];
    for path in streams {
        assert_eq!(operator.create(path, "text/plain", "a").await.status(), 201);
    }
    let appender = token_with(&operator, "appender", &["append"]).await;
    let producer = [
        ("producer-id", "p"),
        ("producer-epoch", "0"),
        ("producer-seq", "0"),
    ];
    for path in streams {
        assert_eq!(
            close(&appender, path, "", &[]).await,
            403,
            "close-only POST {path}"
        );
        assert_eq!(
            close(&appender, path, "z", &[]).await,
            403,
            "close with a final append {path}"
        );
        assert_eq!(
            close(&appender, path, "z", &producer).await,
            403,
            "producer close {path}"
        );
        let r = appender.append(path, "text/plain", "b").await;
        assert_eq!(r.status(), 204, "{path} still takes appends");
    }
    let closer = token_with(&operator, "closer", &["append", "fence"]).await;
    assert_eq!(close(&closer, "/closing/s", "", &[]).await, 204);
    assert_eq!(close(&closer, "/v1/stream/c", "z", &producer).await, 200);
    let fence_only = token_with(&operator, "fence-only", &["fence"]).await;
    assert_eq!(
        operator
            .create("/closing/t", "text/plain", "a")
            .await
            .status(),
        201
    );
    assert_eq!(
        close(&fence_only, "/closing/t", "", &[]).await,
        403,
        "closing also appends"
    );
}

#[tokio::test]
async fn publishing_or_deleting_a_snapshot_needs_trim_not_append() {
    let server = auth_server(&[]);
    let operator = operator(&server);
    assert_eq!(operator.create_bucket("snaps").await.status(), 201);
    let r = operator
        .create("/snaps/s", "application/json", "[1,2,3]")
        .await;
    assert_eq!(r.status(), 201);
    let appender = token_with(&operator, "appender", &["append", "read"]).await;
    let trimmer = token_with(&operator, "trimmer", &["trim", "read"]).await;
    let publish = |client: &Client| {
        client
            .request(Method::PUT, "/snaps/s/snapshot?record=2")
            .header("content-type", "application/json")
            .body(r#"{"sum":3}"#)
            .send()
    };
    assert_eq!(publish(&appender).await.unwrap().status(), 403);
    let published = publish(&trimmer).await.unwrap();
    assert!(published.status().is_success(), "{}", published.status());
    let latest = Client::no_redirects(&server).bearer(OPERATOR);
    let r = latest.get("/snaps/s/snapshot").await;
    assert_eq!(r.status(), 307);
    let at = header(&r, "location").unwrap().to_string();
    assert_eq!(appender.delete(&at).await.status(), 403);
    assert_eq!(trimmer.delete(&at).await.status(), 204);
}

#[tokio::test]
async fn an_expiring_token_ends_its_live_session_and_is_then_refused() {
    let server = auth_server(&["--sse-max-duration-secs", "600"]);
    setup(&server).await;
    let expires = time::OffsetDateTime::now_utc() + time::Duration::seconds(2);
    let at = expires
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    let operator = operator(&server);
    let response = operator
        .issue_token("short", reader_of("team-alpha"), Some(&at))
        .await;
    assert_eq!(response.status(), 201);
    let short = operator.bearer(json_of(response).await["access_token"].as_str().unwrap());
    let mut sse = short
        .request(Method::GET, "/team-alpha/events?offset=-1&live=sse")
        .timeout(Duration::from_secs(20))
        .send()
        .await
        .unwrap();
    assert_eq!(sse.status(), 200);
    let started = Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(_chunk) = sse.chunk().await.unwrap() {}
    })
    .await;
    assert!(ended.is_ok(), "the SSE session ends when its token expires");
    assert!(started.elapsed() < Duration::from_secs(8));
    let r = short.get("/team-alpha/events?offset=-1").await;
    assert_eq!(r.status(), 401);
}

#[tokio::test]
async fn requests_over_the_rate_limit_get_429_with_retry_after() {
    let server = auth_server(&["--rate-limit", "5"]);
    let answered = answered_before_the_limit(&[operator(&server)], "/v1/basins").await;
    assert!(
        answered < 20,
        "{answered} quick requests answered at 5 per second"
    );
}

/// Requests sent round-robin by `callers` until the first 429: how many were answered 200.
async fn answered_before_the_limit(callers: &[Client], path: &str) -> usize {
    for sent in 0..200 {
        let r = callers[sent % callers.len()].get(path).await;
        if r.status() == 429 {
            assert!(header(&r, "retry-after").is_some());
            return sent;
        }
        assert!(matches!(r.status().as_u16(), 200 | 401), "{}", r.status());
    }
    panic!("no 429 within 200 requests");
}

#[tokio::test]
async fn tokens_issued_by_a_token_share_its_rate_budget_and_invalid_tokens_share_one() {
    let server = auth_server(&["--rate-limit", "20"]);
    setup(&server).await;
    let operator = operator(&server);
    let parent = operator.bearer(
        &operator
            .issued_token(
                "team-alpha-admin",
                json!({
                    "basins": {"exact": "team-alpha"}, "streams": {"prefix": ""},
                    "access_tokens": {"prefix": "team-alpha-"},
                    "op_groups": {"stream": {"read": true}}, "ops": ["issue-access-token"]
                }),
            )
            .await,
    );
    let mut callers = vec![parent.clone()];
    for child in ["team-alpha-1", "team-alpha-2", "team-alpha-3"] {
        let r = parent
            .issue_token(
                child,
                json!({"basins": {"exact": "team-alpha"}, "streams": {"prefix": ""}, "op_groups": {"stream": {"read": true}}}),
                None,
            )
            .await;
        assert_eq!(r.status(), 201);
        callers.push(operator.bearer(json_of(r).await["access_token"].as_str().unwrap()));
    }
    // One budget of 20 (3 spent issuing) for the four: separate budgets would answer about 70.
    let answered = answered_before_the_limit(&callers, "/team-alpha/events?offset=-1").await;
    assert!(
        answered < 40,
        "{answered} requests answered before the first 429"
    );

    let guesses: Vec<Client> = (0..4)
        .map(|i| operator.bearer(&format!("rnl_guess{i}")))
        .collect();
    let answered = answered_before_the_limit(&guesses, "/team-alpha/events?offset=-1").await;
    assert!(
        answered < 40,
        "{answered} guesses answered before the first 429"
    );
    // The operator's budget is its own.
    let r = operator.get("/v1/basins").await;
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn requests_without_a_valid_token_share_one_budget_whether_missing_unknown_or_expired() {
    let server = auth_server(&["--rate-limit", "20"]);
    setup(&server).await;
    let operator = operator(&server);
    let expires = time::OffsetDateTime::now_utc() + time::Duration::seconds(1);
    let at = expires
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    let r = operator
        .issue_token("brief", reader_of("team-alpha"), Some(&at))
        .await;
    assert_eq!(r.status(), 201);
    let expired = operator.bearer(json_of(r).await["access_token"].as_str().unwrap());
    let path = "/team-alpha/events?offset=-1";
    let deadline = Instant::now() + Duration::from_secs(10);
    while expired.get(path).await.status() != 401 {
        assert!(Instant::now() < deadline, "the token never expired");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let anonymous = Client::new(&server);
    let answered = answered_before_the_limit(std::slice::from_ref(&anonymous), path).await;
    assert!(
        answered < 40,
        "{answered} requests without a token answered"
    );
    // The same budget: spent by the anonymous requests just now.
    let answered = answered_before_the_limit(&[expired], path).await;
    assert!(
        answered < 10,
        "{answered} requests with an expired token answered"
    );
    let answered = answered_before_the_limit(&[operator.bearer("rnl_guess")], path).await;
    assert!(answered < 10, "{answered} guesses answered");
    // The operator's budget is its own.
    assert_eq!(operator.get("/v1/basins").await.status(), 200);
}

#[tokio::test]
async fn tokens_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let args = ["--data-dir", data, "--auth", "--auth-token", OPERATOR];
    let server = Server::start(&args);
    setup(&server).await;
    let reader = operator(&server)
        .issued_token("reader", reader_of("team-alpha"))
        .await;
    server.kill();
    let server = Server::start(&args);
    let r = Client::new(&server)
        .bearer(&reader)
        .get("/team-alpha/events?offset=-1")
        .await;
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn a_mirror_authenticates_to_its_upstream_with_a_token() {
    let upstream = auth_server(&[]);
    setup(&upstream).await;
    let token = operator(&upstream)
        .issued_token(
            "mirror",
            json!({"basins": {"exact": "team-alpha"}, "streams": {"prefix": ""}, "op_groups": {"stream": {"read": true}, "basin": {"read": true}}}),
        )
        .await;
    let source = format!("{}/team-alpha", upstream.base);
    let mirror = Server::start(&[
        "--memory",
        "--mirror-from",
        &source,
        "--mirror-token",
        &token,
    ]);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let r = Client::new(&mirror)
            .get("/team-alpha/events?offset=-1")
            .await;
        // A mirror creates the stream from its state before the records arrive: it may be
        // seen empty for a moment.
        if r.status() == 200 && r.text().await.unwrap() == "hello" {
            break;
        }
        assert!(Instant::now() < deadline, "the mirror never caught up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let unauthenticated = Server::start(&["--memory", "--mirror-from", &source]);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let r = Client::new(&unauthenticated)
        .get("/team-alpha/events?offset=-1")
        .await;
    assert_eq!(
        r.status(),
        404,
        "without a token the upstream gives the mirror nothing"
    );
}

#[tokio::test]
async fn a_fork_needs_read_on_its_source_and_escaped_names_are_authorized_as_routed() {
    let server = auth_server(&[]);
    setup(&server).await;
    let operator = operator(&server);
    // Everything on streams of team-alpha except trims and attribute changes.
    let scope = json!({
        "basins": {"exact": "team-alpha"},
        "streams": {"prefix": ""},
        "ops": ["read", "append", "create-stream"]
    });
    let writer = operator.bearer(&operator.issued_token("writer", scope).await);
    let fork = |source: &'static str| {
        writer
            .request(Method::PUT, "/team-alpha/copy")
            .header("content-type", "text/plain")
            .header("stream-forked-from", source)
    };
    let refused = fork("/team-bravo/events").send().await.unwrap();
    assert_eq!(refused.status(), 403, "a fork of a stream it may not read");
    let refused = fork("/team-bravo/missing").send().await.unwrap();
    assert_eq!(
        refused.status(),
        403,
        "and the answer says nothing of existence"
    );
    let allowed = fork("/team-alpha/events").send().await.unwrap();
    assert_eq!(allowed.status(), 201, "a fork of its own stream");

    // An escaped extension or listing name is the route it is served as.
    for path in [
        "/team-alpha/events/a%74trs",
        "/team-alpha/events/r%65tention?record=0",
    ] {
        let r = writer.send_json(Method::PUT, path, &json!({})).await;
        assert_eq!(r.status(), 403, "{path}");
    }
    let listing = writer.get("/team-alpha/stream%73").await;
    assert_eq!(listing.status(), 403, "listing needs list-streams");
}

#[tokio::test]
async fn revoking_a_token_ends_its_live_session_at_once() {
    let server = auth_server(&["--sse-max-duration-secs", "600"]);
    setup(&server).await;
    let operator = operator(&server);
    let reader = operator.bearer(
        &operator
            .issued_token("reader", reader_of("team-alpha"))
            .await,
    );
    let mut sse = reader
        .request(Method::GET, "/team-alpha/events?offset=-1&live=sse")
        .timeout(Duration::from_secs(20))
        .send()
        .await
        .unwrap();
    assert_eq!(sse.status(), 200);
    assert!(sse.chunk().await.unwrap().is_some(), "the session started");
    let revoked = operator.revoke_token("reader").await;
    assert!(revoked.status().is_success());
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(_chunk) = sse.chunk().await.unwrap() {}
    })
    .await;
    assert!(
        ended.is_ok(),
        "the SSE session ends when its token is revoked"
    );
}

#[tokio::test]
async fn ensuring_an_existing_s2_stream_needs_reconfigure_not_just_create() {
    let server = auth_server(&[]);
    setup(&server).await;
    let operator = operator(&server);
    let creator = operator.bearer(
        &operator
            .issued_token(
                "creator",
                json!({
                    "basins": {"exact": "team-alpha"},
                    "streams": {"prefix": ""},
                    "ops": ["create-stream"]
                }),
            )
            .await,
    );
    let ensure = |stream: &'static str| {
        creator
            .s2(Method::PUT, "team-alpha", stream)
            .header("content-type", "application/json")
            .body(json!({"retention_policy": {"age": 1}}).to_string())
            .send()
    };
    assert_eq!(
        ensure("/v1/streams/events").await.unwrap().status(),
        403,
        "the existing stream would be reconfigured"
    );
    assert_eq!(ensure("/v1/streams/fresh").await.unwrap().status(), 201);
}

#[tokio::test]
async fn a_bucket_description_counts_only_the_streams_the_token_covers() {
    let server = auth_server(&[]);
    setup(&server).await;
    let operator = operator(&server);
    for name in ["pub-one", "pub-two", "private"] {
        let r = operator
            .create(&format!("/team-alpha/{name}"), "text/plain", "")
            .await;
        assert_eq!(r.status(), 201);
    }
    let narrow = operator.bearer(
        &operator
            .issued_token(
                "narrow",
                json!({
                    "basins": {"exact": "team-alpha"},
                    "streams": {"prefix": "pub-"},
                    "op_groups": {"stream": {"read": true}, "basin": {"read": true}}
                }),
            )
            .await,
    );
    let count = |caller: Client| async move {
        let r = caller.get("/team-alpha").await;
        assert_eq!(r.status(), 200);
        json_of(r).await["streams"].clone()
    };
    assert_eq!(count(operator.clone()).await, 4);
    assert_eq!(
        count(narrow.clone()).await,
        2,
        "events and private are out of scope"
    );
    let listing = json_of(narrow.get("/team-alpha/streams").await).await;
    assert_eq!(listing["stream_count"], 2, "the listing agrees");
}
