//! `runnel export`: one stream's retained content, read from a running server the way any
//! client reads it (catch-up reads from its start until it is up to date), written as its raw
//! bytes or, for a JSON stream, as JSON lines (one message a line).

use std::io::Write as _;

use anyhow::{Context as _, bail};
use reqwest::StatusCode;

use crate::config::{ExportArgs, ExportFormat};

/// Writes the stream `args.stream` names to `args.out` (or standard output).
pub async fn export(args: &ExportArgs) -> anyhow::Result<()> {
    let url = stream_url(&args.server, &args.stream)?;
    let tls = crate::replication::tls::client_config(args.ca_cert.as_deref())?;
    let http = reqwest::Client::builder()
        .use_preconfigured_tls((*tls).clone())
        .build()
        .context("cannot build the HTTP client")?;
    let mut out: Box<dyn std::io::Write> = match &args.out {
        Some(path) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(path)
                .with_context(|| format!("cannot create {}", path.display()))?,
        )),
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    let mut offset = "-1".to_owned();
    let mut messages = 0u64;
    let mut bytes = 0u64;
    loop {
        let mut request = http.get(&url).query(&[("offset", offset.as_str())]);
        if let Some(token) = &args.token {
            request = request.bearer_auth(token);
        }
        let response = request
            .send()
            .await
            .with_context(|| format!("cannot reach {url}"))?;
        let status = response.status();
        if status != StatusCode::OK {
            let reason = response.text().await.unwrap_or_default();
            bail!("{url} answered {status}: {}", reason.trim());
        }
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let json = header("content-type").is_some_and(|t| t.starts_with("application/json"));
        let done = header("stream-up-to-date").as_deref() == Some("true");
        let next = header("stream-next-offset").context("a read without Stream-Next-Offset")?;
        let body = response.bytes().await.context("reading the stream")?;
        match args.format {
            ExportFormat::Raw => out.write_all(&body)?,
            ExportFormat::Jsonl if !json => {
                bail!("{url} is not a JSON stream: export it with --format raw")
            }
            ExportFormat::Jsonl => {
                let read: Vec<serde_json::Value> =
                    serde_json::from_slice(&body).context("a JSON read that is not an array")?;
                for message in read {
                    serde_json::to_writer(&mut out, &message)?;
                    out.write_all(b"\n")?;
                    messages += 1;
                }
            }
        }
        bytes += body.len() as u64;
        if done || next == offset {
            break;
        }
        offset = next;
    }
    out.flush()?;
    match args.format {
        ExportFormat::Raw => eprintln!("exported {bytes} bytes of {url}"),
        ExportFormat::Jsonl => eprintln!("exported {messages} messages of {url}"),
    }
    Ok(())
}

/// The URL of `stream` on `server`: `BUCKET/STREAM` on the bucketed surface, or a base-surface
/// stream by its path, `/v1/stream/NAME`.
fn stream_url(server: &str, stream: &str) -> anyhow::Result<String> {
    let server = server.trim_end_matches('/');
    if !(server.starts_with("http://") || server.starts_with("https://")) {
        bail!("--server must be an http:// or https:// URL, not {server:?}");
    }
    let path = stream.trim_start_matches('/');
    if path.starts_with("v1/stream/") {
        return Ok(format!("{server}/{path}"));
    }
    match path.split_once('/') {
        Some((bucket, name)) if !bucket.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok(format!("{server}/{bucket}/{name}"))
        }
        _ => bail!("name a stream as BUCKET/STREAM, or a base-surface one as /v1/stream/NAME"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_is_named_by_bucket_and_stream_or_by_its_base_path() {
        let server = "http://127.0.0.1:4437/";
        assert_eq!(
            stream_url(server, "b/s").unwrap(),
            "http://127.0.0.1:4437/b/s"
        );
        assert_eq!(
            stream_url(server, "/v1/stream/a/b").unwrap(),
            "http://127.0.0.1:4437/v1/stream/a/b"
        );
        for bad in ["", "b", "b/", "/s", "b/s/t"] {
            assert!(stream_url(server, bad).is_err(), "{bad:?}");
        }
        assert!(stream_url("127.0.0.1:4437", "b/s").is_err());
    }
}
