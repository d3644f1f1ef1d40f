//! What a mirror follows: the bucket or stream a `--mirror-from` URL names, and the checks on
//! those URLs made at server start.

use super::error::MirrorError;
use crate::model::names;

/// What a mirror follows.
#[derive(Clone, Debug)]
pub(super) struct Upstream {
    /// `scheme://host:port`
    pub(super) base: String,
    pub(super) bucket: String,
    /// One stream of the bucket, or all of them.
    pub(super) stream: Option<String>,
}

impl Upstream {
    pub(super) fn parse(url: &str) -> Result<Upstream, MirrorError> {
        let bad = || MirrorError::BadUrl(url.to_string());
        let (scheme, rest) = url
            .split_once("://")
            .filter(|(scheme, _)| matches!(*scheme, "http" | "https"))
            .ok_or_else(bad)?;
        let (host, path) = rest.split_once('/').ok_or_else(bad)?;
        let path = percent_encoding::percent_decode_str(path.trim_end_matches('/'))
            .decode_utf8()
            .map_err(|_| bad())?;
        let mut segments = path.splitn(2, '/');
        let bucket = segments
            .next()
            .filter(|b| names::validate_bucket_id(b).is_ok())
            .ok_or_else(bad)?;
        let stream = segments.next().map(str::to_string);
        if let Some(stream) = &stream {
            names::stream_key_in(bucket, stream).map_err(|_| bad())?;
        }
        Ok(Upstream {
            base: format!("{scheme}://{host}"),
            bucket: bucket.to_string(),
            stream,
        })
    }

    pub(super) fn url(&self) -> String {
        match &self.stream {
            Some(stream) => format!("{}/{}/{}", self.base, self.bucket, encode(stream)),
            None => format!("{}/{}", self.base, self.bucket),
        }
    }
}

/// The bucket a `--mirror-from` URL mirrors whole, and its upstream (`scheme://host:port`);
/// `None` for the URL of one stream, or one that does not parse (`follow` reports that).
pub fn mirrored_bucket(url: &str) -> Option<(String, String)> {
    Upstream::parse(url)
        .ok()
        .filter(|upstream| upstream.stream.is_none())
        .map(|upstream| (upstream.bucket, upstream.base))
}

/// The stream a `--mirror-from` URL mirrors alone (its key), and its upstream
/// (`scheme://host:port`); `None` for the URL of a bucket, or one that does not parse.
pub fn mirrored_stream(url: &str) -> Option<(String, String)> {
    let upstream = Upstream::parse(url).ok()?;
    let key = stream_key(&upstream.bucket, upstream.stream.as_deref()?).ok()?;
    Some((key, upstream.base))
}

/// Checks that every `--mirror-from` URL names a bucket or a stream of one, and that no two
/// targets overlap: the same bucket or stream twice, or a
/// stream of a bucket mirrored whole. Two sessions would then apply the same records, each
/// taking the other's for a divergence and rebuilding the copy over and over.
pub fn check_targets(urls: &[String]) -> Result<(), String> {
    let parsed: Vec<(&String, Upstream)> = urls
        .iter()
        .map(|url| Upstream::parse(url).map(|u| (url, u)))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("--mirror-from: {e}"))?;
    for (i, (url, target)) in parsed.iter().enumerate() {
        for (other_url, other) in &parsed[..i] {
            let overlap = target.bucket == other.bucket
                && (target.stream.is_none()
                    || other.stream.is_none()
                    || target.stream == other.stream);
            if overlap {
                return Err(format!(
                    "--mirror-from {other_url} and {url} overlap: each bucket or stream may be \
                     mirrored once (a bucket mirrored whole includes its streams)"
                ));
            }
        }
    }
    Ok(())
}

/// Checks that `--mirror-token` can be sent as a bearer token (a header value).
pub fn check_token(token: &str) -> Result<(), String> {
    reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
        .map(drop)
        .map_err(|_| "--mirror-token: not a valid HTTP header value (control characters?)".into())
}

fn encode(segment: &str) -> String {
    percent_encoding::utf8_percent_encode(segment, percent_encoding::NON_ALPHANUMERIC).to_string()
}

pub(super) fn stream_key(bucket: &str, stream: &str) -> Result<String, MirrorError> {
    names::stream_key_in(bucket, stream).map_err(|e| MirrorError::BadMessage(e.to_string()))
}

#[cfg(test)]
mod tests;
