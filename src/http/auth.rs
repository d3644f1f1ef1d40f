//! Bearer-token authentication and authorization for every face (`--auth`). Each request's
//! route says which of S2's operations on which resource (a basin, a stream, a token, the
//! account) it is ([`Route::access`]), and that is checked against the caller's scope before
//! any handler runs, so the answer never depends on whether the resource exists: a token
//! without access to a bucket learns nothing about it.
//!
//! Operations whose resource is named in the body (creating a basin or stream through S2,
//! issuing a token) and listings are narrowed further by their handlers with the `Principal`
//! this layer leaves in the request's extensions.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;

use super::AppState;
use super::route::{Access, Face, Route};
use crate::model::access::{self, Operation, Resource};
use crate::model::names;
use crate::service::{Principal, TokenError};

/// Authentication settings.
#[derive(Debug)]
pub struct AuthConfig {
    /// SHA-256 (hex) of the operator token, which may do everything.
    pub operator_digest: String,
    /// Requests per second one token may make (with a burst of as many); `None`: no limit.
    pub rate_limit: Option<u32>,
    pub limiter: RateLimiter,
}

impl AuthConfig {
    pub fn new(operator_token: &str, rate_limit: Option<u32>) -> AuthConfig {
        AuthConfig {
            operator_digest: access::digest(operator_token),
            rate_limit,
            limiter: RateLimiter::default(),
        }
    }
}

/// One token bucket per principal.
#[derive(Debug, Default)]
pub struct RateLimiter {
    buckets: Mutex<Buckets>,
}

#[derive(Debug, Default)]
struct Buckets {
    /// Requests left and when they were counted, by budget.
    by_key: HashMap<String, (f64, Instant)>,
    /// The count of buckets at which full ones are next dropped.
    prune_at: usize,
}

/// Buckets kept before the full ones are first dropped.
const BUCKETS_BEFORE_PRUNING: usize = 1024;

impl Buckets {
    /// Drops the buckets that have refilled: a full bucket is what a new one starts as, so only
    /// the memory goes. Without this every token ever used would keep one (tokens issued per
    /// end-user session come and go). Each pruning doubles the count it waits for, so its cost
    /// spreads over the requests in between.
    fn prune(&mut self, rate: f64, now: Instant) {
        self.by_key.retain(|_, (tokens, last)| {
            *tokens + now.duration_since(*last).as_secs_f64() * rate < rate
        });
        self.prune_at = (self.by_key.len() * 2).max(BUCKETS_BEFORE_PRUNING);
    }
}

impl RateLimiter {
    /// Takes one request from `key`'s bucket; `Err` with the wait until the next one if empty.
    fn take(&self, key: &str, per_second: u32) -> Result<(), Duration> {
        self.take_at(key, per_second, Instant::now())
    }

    fn take_at(&self, key: &str, per_second: u32, now: Instant) -> Result<(), Duration> {
        let rate = f64::from(per_second.max(1));
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(bucket) = buckets.by_key.get_mut(key) {
            return spend(bucket, rate, now);
        }
        if buckets.by_key.len() >= buckets.prune_at {
            buckets.prune(rate, now);
        }
        let bucket = buckets.by_key.entry(key.to_string()).or_insert((rate, now));
        spend(bucket, rate, now)
    }
}

/// Refills `bucket` for the time since it was last counted and takes one request from it.
fn spend((tokens, last): &mut (f64, Instant), rate: f64, now: Instant) -> Result<(), Duration> {
    *tokens = (*tokens + now.duration_since(*last).as_secs_f64() * rate).min(rate);
    *last = now;
    if *tokens >= 1.0 {
        *tokens -= 1.0;
        Ok(())
    } else {
        Err(Duration::from_secs_f64((1.0 - *tokens) / rate))
    }
}

/// Whose requests one `--rate-limit` budget counts.
enum Budget<'a> {
    Operator,
    /// A token issued by the operator, with every token issued under it.
    Token(&'a str),
    /// Every request without a valid token: none, one the server does not know, or an expired
    /// one. Such requests cost the server a refusal each, and share one budget so that they
    /// cannot be sent at any rate.
    NoValidToken,
}

impl Budget<'_> {
    /// The limiter's key. Token ids are 1 to 96 printable ASCII characters, so the other two
    /// keys are never one.
    fn key(&self) -> &str {
        match self {
            Budget::Operator => "",
            Budget::Token(id) => id,
            Budget::NoValidToken => "\0no-valid-token",
        }
    }

    fn whose(&self) -> &'static str {
        match self {
            Budget::Operator => "for the operator token",
            Budget::Token(_) => "for this token and the tokens issued under it",
            Budget::NoValidToken => "for requests without a valid token",
        }
    }
}

/// Takes a request from `budget` under `--rate-limit`; `Err` is the 429 to send when it is
/// spent.
fn within_rate(auth: &AuthConfig, budget: Budget, face: Face) -> Result<(), Box<Response>> {
    let Some(rate) = auth.rate_limit else {
        return Ok(());
    };
    let Err(wait) = auth.limiter.take(budget.key(), rate) else {
        return Ok(());
    };
    let whose = budget.whose();
    let mut response = refusal(
        face,
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limited",
        &format!("over {rate} requests per second {whose}"),
    );
    let seconds = wait.as_secs().max(1).to_string();
    if let Ok(value) = HeaderValue::from_str(&seconds) {
        response.headers_mut().insert(header::RETRY_AFTER, value);
    }
    Err(Box::new(response))
}

/// Whether the caller may read the stream stored under `key`, for a request that names it
/// beside its own target (a fork's source). Without authentication, anyone may.
pub(super) fn may_read(extensions: &axum::http::Extensions, key: &str) -> bool {
    let Some(principal) = extensions.get::<Arc<Principal>>() else {
        return true;
    };
    let (basin, stream) = match names::bucket_of(key) {
        Some(bucket) => (bucket, &key[bucket.len() + 2..]),
        None => ("", key.strip_prefix("/v1/stream/").unwrap_or(key)),
    };
    principal
        .scope
        .allows(Operation::Read, Resource::Stream { basin, stream })
}

/// The bearer token of a request.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// The error response of a refused request, in the face's own style.
fn refusal(face: Face, status: StatusCode, code: &str, message: &str) -> Response {
    let mut response = super::refusal(face, status, code, message);
    if status == StatusCode::UNAUTHORIZED {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"runnel\""),
        );
    }
    response
}

/// What a live reader still waiting when its token stopped working (`why`: revoked, so
/// unknown, or expired) is answered: the refusal a new request with that token gets.
pub(super) fn token_ended(face: Face, why: TokenError) -> Response {
    let message = why.to_string();
    refusal(face, StatusCode::UNAUTHORIZED, "unauthenticated", &message)
}

/// Authenticates, rate-limits and authorizes a request on `route`, and returns its principal
/// (the operator when authentication is off, or the route public), which it also leaves in the
/// request's extensions for the handlers. `Err` is the refusal to send instead (boxed: refusals
/// are rare, and the `Ok` path stays small).
pub fn authorize(
    app: &AppState,
    route: &Route,
    request: &mut Request,
) -> Result<Arc<Principal>, Box<Response>> {
    let principal = authenticate(app, route, request)?;
    request.extensions_mut().insert(principal.clone());
    Ok(principal)
}

fn authenticate(
    app: &AppState,
    route: &Route,
    request: &Request,
) -> Result<Arc<Principal>, Box<Response>> {
    let Some(auth) = app.config.auth.as_ref() else {
        return Ok(Principal::shared_operator());
    };
    let face = route.face();
    let access = route.access(request.method(), request.headers());
    if access == Access::Public {
        return Ok(Principal::shared_operator());
    }
    if request
        .headers()
        .get_all(header::AUTHORIZATION)
        .iter()
        .nth(1)
        .is_some()
    {
        within_rate(auth, Budget::NoValidToken, face)?;
        return Err(Box::new(refusal(
            face,
            StatusCode::BAD_REQUEST,
            "bad_header",
            "send one Authorization header, not several",
        )));
    }
    let Some(secret) = bearer(request.headers()) else {
        within_rate(auth, Budget::NoValidToken, face)?;
        return Err(Box::new(refusal(
            face,
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
            "send an access token: Authorization: Bearer <token>",
        )));
    };
    let principal = if access::same_digest(&access::digest(secret), &auth.operator_digest) {
        Principal::shared_operator()
    } else {
        match app.service.authenticate(secret) {
            Ok(principal) => Arc::new(principal),
            Err(e @ (TokenError::Unknown | TokenError::Expired)) => {
                // Guesses share one budget, so they cannot be made at any rate; an expired
                // token is told it expired (so its client renews it) within the same budget.
                within_rate(auth, Budget::NoValidToken, face)?;
                return Err(Box::new(refusal(
                    face,
                    StatusCode::UNAUTHORIZED,
                    "unauthenticated",
                    &e.to_string(),
                )));
            }
        }
    };
    within_rate(
        auth,
        principal
            .rate_budget
            .as_deref()
            .map_or(Budget::Operator, Budget::Token),
        face,
    )?;
    if let Some((ops, target)) = access.required()
        && !ops
            .iter()
            .all(|op| principal.scope.allows(*op, target.resource()))
    {
        return Err(Box::new(refusal(
            face,
            StatusCode::FORBIDDEN,
            "permission_denied",
            "the access token does not permit this operation on this resource",
        )));
    }
    Ok(principal)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_limiter_allows_a_burst_then_refuses_until_refilled() {
        let limiter = RateLimiter::default();
        for _ in 0..5 {
            assert!(limiter.take("t", 5).is_ok());
        }
        let wait = limiter.take("t", 5).unwrap_err();
        assert!(wait <= Duration::from_millis(200));
        assert!(limiter.take("other", 5).is_ok(), "buckets are per token");
    }

    #[test]
    fn the_rate_limiter_forgets_buckets_that_have_refilled() {
        let limiter = RateLimiter::default();
        let start = Instant::now();
        for n in 1..BUCKETS_BEFORE_PRUNING {
            assert!(limiter.take_at(&n.to_string(), 10, start).is_ok());
        }
        // A fifth of a second on, every bucket but the one spent again has refilled.
        let later = start + Duration::from_millis(200);
        for _ in 0..10 {
            let _ = limiter.take_at("busy", 10, start);
        }
        assert!(limiter.take_at("new", 10, later).is_ok());
        let buckets = limiter.buckets.lock().unwrap();
        let mut kept: Vec<&str> = buckets.by_key.keys().map(String::as_str).collect();
        kept.sort();
        assert_eq!(kept, ["busy", "new"]);
        drop(buckets);
        // Two requests refilled since it was spent, not a full bucket's ten.
        for _ in 0..2 {
            assert!(limiter.take_at("busy", 10, later).is_ok());
        }
        assert!(limiter.take_at("busy", 10, later).is_err());
    }
}
