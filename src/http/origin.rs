//! Where clients reach this server, as a request addressed it: the origin of the URLs the server
//! hands out (`Location`, the StreamLD `Link` endpoints, stream IRIs).

use std::convert::Infallible;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::uri::Authority;
use axum::http::{Extensions, HeaderMap, Uri, header};

/// Marks a request that arrived over TLS; the connection layer sets it.
#[derive(Clone, Copy, Debug)]
pub struct OverTls;

/// The scheme and authority of a request: the `Host` header (HTTP/1.1), else the request URI's
/// authority (HTTP/2's `:authority`), else `localhost`; secure when the connection is TLS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    secure: bool,
    authority: String,
}

impl Origin {
    pub fn of(headers: &HeaderMap, uri: &Uri, extensions: &Extensions) -> Origin {
        // Only a well-formed authority is echoed: it goes into headers and message IRIs.
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .and_then(|h| h.parse::<Authority>().ok());
        let authority = host
            .or_else(|| uri.authority().cloned())
            .map_or_else(|| "localhost".to_string(), |a| a.as_str().to_string());
        Origin {
            secure: extensions.get::<OverTls>().is_some(),
            authority,
        }
    }

    /// `http://authority`, or `https://` over TLS.
    pub fn http(&self) -> String {
        let scheme = if self.secure { "https" } else { "http" };
        format!("{scheme}://{}", self.authority)
    }

    /// Whether `url` (absolute) points at this server as the request addressed it: the same
    /// host (case aside), and the same port when both name one. Neither the scheme nor a
    /// default port is compared: a proxy in front may end TLS.
    pub fn addresses(&self, url: &str) -> bool {
        let Ok(url) = url.parse::<Uri>() else {
            return false;
        };
        let (Some(theirs), Ok(ours)) = (url.authority(), self.authority.parse::<Authority>())
        else {
            return false;
        };
        let same_port = match (theirs.port_u16(), ours.port_u16()) {
            (Some(theirs), Some(ours)) => theirs == ours,
            _ => true,
        };
        theirs.host().eq_ignore_ascii_case(ours.host()) && same_port
    }

    /// `ws://authority`, or `wss://` over TLS.
    pub fn websocket(&self) -> String {
        let scheme = if self.secure { "wss" } else { "ws" };
        format!("{scheme}://{}", self.authority)
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Origin {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Origin, Infallible> {
        Ok(Origin::of(&parts.headers, &parts.uri, &parts.extensions))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(host: Option<&str>, uri: &str, tls: bool) -> Origin {
        let mut headers = HeaderMap::new();
        if let Some(host) = host {
            headers.insert(header::HOST, host.parse().unwrap());
        }
        let mut extensions = Extensions::new();
        if tls {
            extensions.insert(OverTls);
        }
        Origin::of(&headers, &uri.parse().unwrap(), &extensions)
    }

    #[test]
    fn the_host_header_wins_then_the_uri_authority_then_localhost() {
        let o = origin(Some("a.example:8443"), "http://b.example/x", false);
        assert_eq!(o.http(), "http://a.example:8443");
        assert_eq!(o.websocket(), "ws://a.example:8443");
        let o = origin(None, "http://b.example:9/x", false);
        assert_eq!(o.http(), "http://b.example:9");
        assert_eq!(origin(None, "/x", false).http(), "http://localhost");
        let o = origin(Some("bad host>"), "/x", false);
        assert_eq!(
            o.http(),
            "http://localhost",
            "a malformed Host is not echoed"
        );
    }

    #[test]
    fn a_url_addresses_this_server_by_host_and_port_whatever_its_scheme() {
        let o = origin(Some("Streams.example:8080"), "/x", false);
        assert!(o.addresses("http://streams.example:8080/v1/stream/a"));
        assert!(o.addresses("https://STREAMS.example:8080/a"));
        assert!(!o.addresses("http://streams.example:9090/a"));
        assert!(!o.addresses("http://other.example:8080/a"));
        assert!(!o.addresses("not a url"));
        // Behind a proxy that ends TLS: the request came as plain HTTP to the public host.
        let o = origin(Some("streams.example"), "/x", false);
        assert!(o.addresses("https://streams.example/a"));
        assert!(o.addresses("https://streams.example:443/a"));
    }

    #[test]
    fn tls_connections_get_secure_schemes() {
        let o = origin(Some("h:1"), "/x", true);
        assert_eq!(
            (o.http(), o.websocket()),
            ("https://h:1".into(), "wss://h:1".into())
        );
    }
}
