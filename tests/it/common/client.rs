//! A typed client for one server: the requests the tests make again and again, named for what
//! they do. Each sends its request and hands back the response, so that the status and headers
//! a test checks stay written in the test; `request` builds any other request.

use std::time::Duration;

use bytes::Bytes;
use reqwest::{Body, Method, RequestBuilder, Response, StatusCode};
use serde_json::{Value, json};

use super::{Server, header};

/// Requests to one server as one caller: anonymous, or with the bearer token `bearer` gave it.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl Client {
    /// HTTP/1.1, following redirects, with a 20 s timeout on each request.
    pub fn new(server: &Server) -> Client {
        Client::over(super::client(), &server.base)
    }

    /// HTTP/2 with prior knowledge (h2c), as S2's CLI and SDKs speak it.
    pub fn h2(server: &Server) -> Client {
        let http = reqwest::Client::builder()
            .http2_prior_knowledge()
            .timeout(Duration::from_secs(20))
            .build()
            .expect("client");
        Client::over(http, &server.base)
    }

    /// A client that reports redirects instead of following them, to see where a mirror sends
    /// a write.
    pub fn no_redirects(server: &Server) -> Client {
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(20))
            .build()
            .expect("client");
        Client::over(http, &server.base)
    }

    /// Requests to `base` through `http`: for a TLS server, whose clients trust its certificate.
    pub fn over(http: reqwest::Client, base: &str) -> Client {
        Client {
            http,
            base: base.to_string(),
            token: None,
        }
    }

    /// The same client, sending `Authorization: Bearer {token}` with every request.
    pub fn bearer(&self, token: &str) -> Client {
        Client {
            token: Some(token.to_string()),
            ..self.clone()
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Any request to `path`, with this client's token if it has one.
    pub fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let request = self.http.request(method, self.url(path));
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    /// A request to `path` with nothing more in it.
    pub async fn send(&self, method: Method, path: &str) -> Response {
        sent(self.request(method, path)).await
    }

    /// A request to `path` with a JSON body.
    pub async fn send_json(&self, method: Method, path: &str, body: &Value) -> Response {
        sent(with_json(self.request(method, path), body)).await
    }

    pub async fn get(&self, path: &str) -> Response {
        self.send(Method::GET, path).await
    }

    pub async fn head(&self, path: &str) -> Response {
        self.send(Method::HEAD, path).await
    }

    pub async fn delete(&self, path: &str) -> Response {
        self.send(Method::DELETE, path).await
    }

    /// `PUT /{bucket}`: creates a bucket (an S2 basin).
    pub async fn create_bucket(&self, bucket: &str) -> Response {
        self.send(Method::PUT, &format!("/{bucket}")).await
    }

    /// `PUT path`: creates a Durable Streams stream of `content_type` holding `body`.
    pub async fn create(&self, path: &str, content_type: &str, body: impl Into<Body>) -> Response {
        let request = self.request(Method::PUT, path);
        sent(request.header("content-type", content_type).body(body)).await
    }

    /// `POST path`: appends `body` to a Durable Streams stream.
    pub async fn append(&self, path: &str, content_type: &str, body: impl Into<Body>) -> Response {
        let request = self.request(Method::POST, path);
        sent(request.header("content-type", content_type).body(body)).await
    }

    /// `GET path?offset={offset}`: a catch-up read.
    pub async fn read(&self, path: &str, offset: &str) -> Response {
        self.get(&format!("{path}?offset={offset}")).await
    }

    /// The stream's tail, from `HEAD`'s `Stream-Next-Offset`.
    pub async fn next_offset(&self, path: &str) -> String {
        let head = self.head(path).await;
        header(&head, "stream-next-offset")
            .unwrap_or_else(|| panic!("HEAD {path} answered {} with no tail", head.status()))
            .to_string()
    }

    /// The bodies of the catch-up reads that take `path` from its start to its tail, or the
    /// status of the first read that was not a 200.
    pub async fn read_chunks(&self, path: &str) -> Result<Vec<Bytes>, StatusCode> {
        let mut chunks = Vec::new();
        let mut offset = "-1".to_string();
        loop {
            let response = self.read(path, &offset).await;
            if response.status() != 200 {
                return Err(response.status());
            }
            let done = header(&response, "stream-up-to-date") == Some("true");
            offset = header(&response, "stream-next-offset")
                .expect("a read says where it ends")
                .to_string();
            chunks.push(response.bytes().await.expect("the body"));
            if done {
                return Ok(chunks);
            }
        }
    }

    /// A request to S2's `path` in `basin` (the `S2-Basin` header).
    pub fn s2(&self, method: Method, basin: &str, path: &str) -> RequestBuilder {
        self.request(method, path).header("s2-basin", basin)
    }

    /// `POST /v1/basins`.
    pub async fn create_basin(&self, basin: &str) -> Response {
        self.send_json(Method::POST, "/v1/basins", &json!({ "basin": basin }))
            .await
    }

    /// `POST /v1/streams` in `basin`.
    pub async fn create_s2_stream(&self, basin: &str, stream: &str) -> Response {
        let request = self.s2(Method::POST, basin, "/v1/streams");
        sent(with_json(request, &json!({ "stream": stream }))).await
    }

    /// `POST /v1/streams/{stream}/records` in `basin`, with a JSON `AppendInput`.
    pub async fn s2_append(&self, basin: &str, stream: &str, input: &Value) -> Response {
        let path = format!("/v1/streams/{stream}/records");
        sent(with_json(self.s2(Method::POST, basin, &path), input)).await
    }

    /// `GET /v1/streams/{stream}/records?{query}` in `basin`, as JSON.
    pub async fn s2_read(&self, basin: &str, stream: &str, query: &str) -> Response {
        let path = format!("/v1/streams/{stream}/records?{query}");
        sent(self.s2(Method::GET, basin, &path)).await
    }

    /// `POST /v1/access-tokens`: a token `id` for `scope`, issued by this client's token.
    pub async fn issue_token(&self, id: &str, scope: Value, expires_at: Option<&str>) -> Response {
        let mut body = json!({ "id": id, "scope": scope });
        if let Some(at) = expires_at {
            body["expires_at"] = json!(at);
        }
        self.send_json(Method::POST, "/v1/access-tokens", &body)
            .await
    }

    /// The secret of a token `id` for `scope`, which this client's token must be able to issue.
    pub async fn issued_token(&self, id: &str, scope: Value) -> String {
        let response = self.issue_token(id, scope, None).await;
        assert_eq!(response.status(), 201, "issue {id}");
        json_of(response).await["access_token"]
            .as_str()
            .expect("an access_token")
            .to_string()
    }

    /// `DELETE /v1/access-tokens/{id}`.
    pub async fn revoke_token(&self, id: &str) -> Response {
        self.delete(&format!("/v1/access-tokens/{id}")).await
    }

    /// The server's `/metrics` text.
    pub async fn metrics(&self) -> String {
        self.get("/metrics").await.text().await.expect("metrics")
    }

    /// The value of the unlabelled metric `name` (a gauge), if the server reports it yet.
    pub async fn gauge(&self, name: &str) -> Option<f64> {
        let text = self.metrics().await;
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
    }
}

async fn sent(request: RequestBuilder) -> Response {
    request.send().await.expect("the server answers")
}

fn with_json(request: RequestBuilder, body: &Value) -> RequestBuilder {
    request
        .header("content-type", "application/json")
        .body(body.to_string())
}

/// A response's body, parsed as JSON.
pub async fn json_of(response: Response) -> Value {
    serde_json::from_slice(&response.bytes().await.expect("the body")).expect("a JSON body")
}
