//! The route table: every URL the server answers, parsed once into a typed [`Route`].
//!
//! Dispatch (`dispatch.rs`), access classification ([`Route::access`]), the error shape of a
//! refusal ([`Route::face`]), live-read detection (`live.rs`) and the metrics label
//! ([`Route::label`]) all read this one value, so a new route is one new variant: the compiler
//! then asks for its access class, its face and its label, and a path no variant matches is
//! refused with 404 whatever the token.

use axum::http::{HeaderMap, Method};
use percent_encoding::percent_decode_str;

use super::header_names;
use crate::model::access::{Operation, Resource};
use crate::model::headers::is_closed_flag;
use crate::model::names::{self, NameError};

/// A request's route, with the names its path carries, percent-decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// `/healthz`
    Health,
    /// `/readyz`
    Ready,
    /// `/metrics`
    Metrics,
    /// `/v1/stream/{path}`: a base-protocol stream, by its key.
    BaseStream { key: String },
    /// `/v1/streamld/replication`: the StreamLD WebSocket.
    Replication,
    /// S2's routes.
    S2(S2Route),
    /// `/{bucket}`
    Bucket { bucket: String },
    /// `/{bucket}/streams`: the bucket's listing (the one stream id a bucket cannot have).
    Listing { bucket: String },
    /// `/{bucket}/{stream}`
    BucketStream { bucket: String, stream: String },
    /// `/{bucket}/{stream}/{extension}[/{offset}]`
    Extension {
        bucket: String,
        stream: String,
        extension: Extension,
    },
}

/// S2's routes (seed 002): basins, streams, records and access tokens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum S2Route {
    /// `/v1/basins`
    Basins,
    /// `/v1/basins/{basin}`
    Basin { basin: String },
    /// `/v1/streams` (the basin is in the `s2-basin` header or the host).
    Streams,
    /// `/v1/streams/{stream}`
    Stream { stream: String },
    /// `/v1/streams/{stream}/records`
    Records { stream: String },
    /// `/v1/streams/{stream}/records/tail`
    Tail { stream: String },
    /// `/v1/access-tokens`
    AccessTokens,
    /// `/v1/access-tokens/{id}`
    AccessToken { id: String },
    /// `/v1/metrics…` and `/v1/locations…`: S2's account API that Runnel does not serve.
    NotServed,
}

/// The extension endpoints of a bucketed stream (seed 000 §2–§5, and the StreamLD SSE binding).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Extension {
    /// `…/snapshot`: the latest snapshot, or a publication at `?record=N`.
    Snapshot,
    /// `…/snapshot/{offset}`, the offset as the path spells it.
    SnapshotAt(String),
    /// `…/retention?record=N`
    Retention,
    /// `…/retention/{offset}`
    RetentionAt(String),
    /// `…/bootstrap`
    Bootstrap,
    /// `…/append-batch`
    AppendBatch,
    /// `…/attrs`
    Attrs,
    /// `…/streamld`: the StreamLD SSE binding.
    StreamLd,
}

/// Whose wire conventions a route follows, for errors made in front of its handler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Face {
    /// Durable Streams, StreamLD and the server's own routes: plain-text reasons.
    DurableStreams,
    /// S2's routes: `{"code","message"}` bodies.
    S2,
}

/// Why a path is no route.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error("no such route")]
    Unknown,
    /// The path names something in a way no name can be spelled (a stray `%`, bytes that are
    /// not UTF-8, a base-surface path that is too long or holds control characters); the face
    /// is whose route it would have been, for the error's shape.
    #[error("{1}")]
    BadName(Face, NameError),
}

/// What a request needs of its caller's access token (under `--auth`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Access {
    /// No token (health checks, CORS preflights).
    Public,
    /// Any valid token: the handler checks the operation against what the request body names
    /// (creating a basin or stream through S2, issuing a token, a replication subscription).
    NarrowedByHandler,
    /// Any valid token: the route only says it is not served.
    AnyToken,
    /// This operation on this resource.
    Operation(Operation, Target),
    /// Every one of these operations on this resource.
    Operations(&'static [Operation], Target),
}

impl Access {
    /// The operations a token's scope must allow, and on what; `None` when the class names none.
    pub fn required(&self) -> Option<(&[Operation], &Target)> {
        match self {
            Access::Operation(op, target) => Some((std::slice::from_ref(op), target)),
            Access::Operations(ops, target) => Some((ops, target)),
            Access::Public | Access::NarrowedByHandler | Access::AnyToken => None,
        }
    }
}

/// What closing a stream needs: it appends (the final record, if the request has one), and it
/// locks every writer out for good, which is what `fence` guards against an appender doing.
const CLOSE: &[Operation] = &[Operation::Append, Operation::Fence];

/// The resource of an operation, with owned names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Account,
    Basin(String),
    Stream(String, String),
    AccessToken(String),
}

impl Target {
    pub fn resource(&self) -> Resource<'_> {
        match self {
            Target::Account => Resource::Account,
            Target::Basin(b) => Resource::Basin(b),
            Target::Stream(b, s) => Resource::Stream {
                basin: b,
                stream: s,
            },
            Target::AccessToken(id) => Resource::AccessToken(id),
        }
    }
}

const BASE_PREFIX: &str = "/v1/stream/";

impl Route {
    /// The route of `path` (already normalised: escaped unreserved characters decoded).
    pub fn parse(path: &str) -> Result<Route, RouteError> {
        match path {
            "/healthz" => return Ok(Route::Health),
            "/readyz" => return Ok(Route::Ready),
            "/metrics" => return Ok(Route::Metrics),
            _ => {}
        }
        if let Some(raw) = path.strip_prefix(BASE_PREFIX)
            && !raw.is_empty()
        {
            let bad = |e| RouteError::BadName(Face::DurableStreams, e);
            let decoded = names::decode_path(raw).map_err(bad)?;
            let key = names::base_stream_key(&decoded).map_err(bad)?;
            return Ok(Route::BaseStream { key });
        }
        let segments: Vec<&str> = path.strip_prefix('/').unwrap_or(path).split('/').collect();
        if segments.iter().any(|s| s.is_empty()) {
            return Err(RouteError::Unknown);
        }
        match segments.as_slice() {
            ["v1", rest @ ..] => Self::parse_v1(rest),
            [bucket] => Ok(Route::Bucket {
                bucket: decode(bucket, Face::DurableStreams)?,
            }),
            [bucket, names::RESERVED_STREAM_ID] => Ok(Route::Listing {
                bucket: decode(bucket, Face::DurableStreams)?,
            }),
            [bucket, stream] => Ok(Route::BucketStream {
                bucket: decode(bucket, Face::DurableStreams)?,
                stream: decode(stream, Face::DurableStreams)?,
            }),
            [bucket, stream, extension @ ..] => Ok(Route::Extension {
                bucket: decode(bucket, Face::DurableStreams)?,
                stream: decode(stream, Face::DurableStreams)?,
                extension: Extension::parse(extension)?,
            }),
            [] => Err(RouteError::Unknown),
        }
    }

    /// The routes under `/v1/` (bucket ids are at least four characters, so never `v1`).
    fn parse_v1(rest: &[&str]) -> Result<Route, RouteError> {
        let s2 = match rest {
            ["stream", ..] => return Err(RouteError::Unknown),
            ["streamld", "replication"] => return Ok(Route::Replication),
            ["basins"] => S2Route::Basins,
            ["basins", basin] => S2Route::Basin {
                basin: decode(basin, Face::S2)?,
            },
            ["streams"] => S2Route::Streams,
            ["streams", stream] => S2Route::Stream {
                stream: decode(stream, Face::S2)?,
            },
            ["streams", stream, "records"] => S2Route::Records {
                stream: decode(stream, Face::S2)?,
            },
            ["streams", stream, "records", "tail"] => S2Route::Tail {
                stream: decode(stream, Face::S2)?,
            },
            ["access-tokens"] => S2Route::AccessTokens,
            ["access-tokens", id] => S2Route::AccessToken {
                id: decode(id, Face::S2)?,
            },
            ["metrics" | "locations", ..] => S2Route::NotServed,
            _ => return Err(RouteError::Unknown),
        };
        Ok(Route::S2(s2))
    }

    /// Whose error shape the route's refusals take.
    pub fn face(&self) -> Face {
        match self {
            Route::S2(_) => Face::S2,
            Route::Health
            | Route::Ready
            | Route::Metrics
            | Route::BaseStream { .. }
            | Route::Replication
            | Route::Bucket { .. }
            | Route::Listing { .. }
            | Route::BucketStream { .. }
            | Route::Extension { .. } => Face::DurableStreams,
        }
    }

    /// The route's pattern, as metrics label it: a fixed set of values, whatever the names.
    pub fn label(&self) -> &'static str {
        match self {
            Route::Health => "/healthz",
            Route::Ready => "/readyz",
            Route::Metrics => "/metrics",
            Route::BaseStream { .. } => "/v1/stream/{*path}",
            Route::Replication => "/v1/streamld/replication",
            Route::S2(s2) => s2.label(),
            Route::Bucket { .. } => "/{bucket}",
            Route::Listing { .. } => "/{bucket}/streams",
            Route::BucketStream { .. } => "/{bucket}/{stream}",
            Route::Extension { extension, .. } => extension.label(),
        }
    }

    /// What a `method` request on this route needs of its caller's token. Base-surface streams
    /// live in the basin named `""`; S2's stream routes name their basin in `headers`.
    pub fn access(&self, method: &Method, headers: &HeaderMap) -> Access {
        use Operation::*;
        if method == Method::OPTIONS {
            return Access::Public;
        }
        let read = method == Method::GET || method == Method::HEAD;
        let op = |op: Operation, target: Target| Access::Operation(op, target);
        match self {
            Route::Health | Route::Ready => Access::Public,
            Route::Metrics => op(AccountMetrics, Target::Account),
            Route::BaseStream { key } => {
                let path = key.strip_prefix(BASE_PREFIX).unwrap_or(key);
                stream_access(method, headers, Target::Stream(String::new(), path.into()))
            }
            Route::Replication => Access::NarrowedByHandler,
            Route::S2(s2) => s2.access(method, read, headers),
            Route::Bucket { bucket } => {
                let basin = Target::Basin(bucket.clone());
                match *method {
                    Method::PUT => op(CreateBasin, basin),
                    Method::DELETE => op(DeleteBasin, basin),
                    _ => op(GetBasinConfig, basin),
                }
            }
            Route::Listing { bucket } => op(ListStreams, Target::Basin(bucket.clone())),
            Route::BucketStream { bucket, stream } => stream_access(
                method,
                headers,
                Target::Stream(bucket.clone(), stream.clone()),
            ),
            Route::Extension {
                bucket,
                stream,
                extension,
            } => op(
                extension.operation(method),
                Target::Stream(bucket.clone(), stream.clone()),
            ),
        }
    }
}

impl S2Route {
    fn label(&self) -> &'static str {
        match self {
            S2Route::Basins => "/v1/basins",
            S2Route::Basin { .. } => "/v1/basins/{basin}",
            S2Route::Streams => "/v1/streams",
            S2Route::Stream { .. } => "/v1/streams/{stream}",
            S2Route::Records { .. } => "/v1/streams/{stream}/records",
            S2Route::Tail { .. } => "/v1/streams/{stream}/records/tail",
            S2Route::AccessTokens => "/v1/access-tokens",
            S2Route::AccessToken { .. } => "/v1/access-tokens/{id}",
            S2Route::NotServed => "/v1/{metrics,locations}",
        }
    }

    /// As [`Route::access`]; `read` says the method is `GET` or `HEAD`.
    fn access(&self, method: &Method, read: bool, headers: &HeaderMap) -> Access {
        use Operation::*;
        let op = |op: Operation, target: Target| Access::Operation(op, target);
        let basin = || super::s2::basin_name(headers).unwrap_or_default();
        let stream = |name: &str| Target::Stream(basin(), name.into());
        match self {
            S2Route::Basins if read => op(ListBasins, Target::Account),
            S2Route::Basins => Access::NarrowedByHandler,
            S2Route::Basin { basin } => {
                let basin = Target::Basin(basin.clone());
                match *method {
                    Method::PUT => op(CreateBasin, basin),
                    Method::PATCH => op(ReconfigureBasin, basin),
                    Method::DELETE => op(DeleteBasin, basin),
                    _ => op(GetBasinConfig, basin),
                }
            }
            S2Route::Streams if read => op(ListStreams, Target::Basin(basin())),
            S2Route::Streams => Access::NarrowedByHandler,
            S2Route::Stream { stream: name } => {
                let stream = stream(name);
                match *method {
                    Method::PUT => op(CreateStream, stream),
                    Method::PATCH => op(ReconfigureStream, stream),
                    Method::DELETE => op(DeleteStream, stream),
                    _ => op(GetStreamConfig, stream),
                }
            }
            S2Route::Records { stream: name } if method == Method::POST => op(Append, stream(name)),
            S2Route::Records { stream: name } => op(Read, stream(name)),
            S2Route::Tail { stream: name } => op(CheckTail, stream(name)),
            S2Route::AccessTokens if read => op(ListAccessTokens, Target::Account),
            S2Route::AccessTokens => Access::NarrowedByHandler,
            S2Route::AccessToken { id } => op(RevokeAccessToken, Target::AccessToken(id.clone())),
            S2Route::NotServed => Access::AnyToken,
        }
    }
}

impl Extension {
    fn parse(segments: &[&str]) -> Result<Extension, RouteError> {
        Ok(match segments {
            ["snapshot"] => Extension::Snapshot,
            ["snapshot", offset] => Extension::SnapshotAt(decode(offset, Face::DurableStreams)?),
            ["retention"] => Extension::Retention,
            ["retention", offset] => Extension::RetentionAt(decode(offset, Face::DurableStreams)?),
            ["bootstrap"] => Extension::Bootstrap,
            ["append-batch"] => Extension::AppendBatch,
            ["attrs"] => Extension::Attrs,
            ["streamld"] => Extension::StreamLd,
            _ => return Err(RouteError::Unknown),
        })
    }

    fn label(&self) -> &'static str {
        match self {
            Extension::Snapshot => "/{bucket}/{stream}/snapshot",
            Extension::SnapshotAt(_) => "/{bucket}/{stream}/snapshot/{offset}",
            Extension::Retention => "/{bucket}/{stream}/retention",
            Extension::RetentionAt(_) => "/{bucket}/{stream}/retention/{offset}",
            Extension::Bootstrap => "/{bucket}/{stream}/bootstrap",
            Extension::AppendBatch => "/{bucket}/{stream}/append-batch",
            Extension::Attrs => "/{bucket}/{stream}/attrs",
            Extension::StreamLd => "/{bucket}/{stream}/streamld",
        }
    }

    /// The operation a request with `method` on this endpoint is. Every endpoint names its
    /// own; a method an endpoint does not serve (405 after authorization) gets the endpoint's
    /// write operation.
    fn operation(&self, method: &Method) -> Operation {
        use Operation::*;
        let read = method == Method::GET || method == Method::HEAD;
        match self {
            Extension::Attrs if read => GetStreamConfig,
            Extension::Attrs => ReconfigureStream,
            // Moving retention drops records for good; so may replacing or deleting the
            // snapshot that stands for records already retained away (its only copy).
            Extension::Retention | Extension::RetentionAt(_) => Trim,
            Extension::Snapshot | Extension::SnapshotAt(_) if read => Read,
            Extension::Snapshot | Extension::SnapshotAt(_) => Trim,
            Extension::Bootstrap => Read,
            Extension::AppendBatch if read => Read,
            Extension::AppendBatch => Append,
            Extension::StreamLd if read => Read,
            Extension::StreamLd => Append,
        }
    }
}

/// A Durable Streams stream request's access: a `POST` that closes the stream needs more than
/// `append` (see [`CLOSE`]).
fn stream_access(method: &Method, headers: &HeaderMap, target: Target) -> Access {
    let closes = || {
        let value = headers.get(&header_names::STREAM_CLOSED);
        is_closed_flag(value.and_then(|v| v.to_str().ok()))
    };
    match *method {
        Method::PUT => Access::Operation(Operation::CreateStream, target),
        Method::POST if closes() => Access::Operations(CLOSE, target),
        Method::POST => Access::Operation(Operation::Append, target),
        Method::DELETE => Access::Operation(Operation::DeleteStream, target),
        _ => Access::Operation(Operation::Read, target),
    }
}

/// One path segment that names something on `face`'s route, percent-decoded. A stray `%`
/// names nothing (decoders elsewhere would keep it as it is, so `a%zz` and `a%25zz` would
/// name one stream), nor do bytes that are not UTF-8.
fn decode(segment: &str, face: Face) -> Result<String, RouteError> {
    let bad = || RouteError::BadName(face, NameError::BadEncoding);
    if !names::escapes_are_whole(segment) {
        return Err(bad());
    }
    percent_decode_str(segment)
        .decode_utf8()
        .map(|name| name.into_owned())
        .map_err(|_| bad())
}

#[cfg(test)]
mod tests;
