//! Access tokens issued through S2's `/v1/access-tokens`: kept by id, found by the digest of
//! their secret, stored durably (digest only) with the streams.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio_util::sync::CancellationToken;

use base64::Engine as _;
use rand::RngCore;

use super::{StreamError, StreamResult, StreamService, now_ms};
use crate::model::access::{self, Scope, TokenRecord};
use crate::storage::Change;

/// The tokens the server knows.
#[derive(Default)]
pub(super) struct TokenRegistry {
    by_id: BTreeMap<String, TokenRecord>,
    /// Digest to id.
    by_digest: HashMap<String, String>,
    /// Tokens that expire, by when, then id: what the sweep looks at.
    by_expiry: BTreeSet<(i64, String)>,
    /// Cancelled when the token is revoked, so that sessions it opened end with it. Made when
    /// the token is first used; kept in memory only.
    revoked: HashMap<String, Revocation>,
}

impl TokenRegistry {
    pub(super) fn new(tokens: Vec<TokenRecord>) -> TokenRegistry {
        let mut registry = TokenRegistry::default();
        for token in tokens {
            registry.insert(token);
        }
        registry
    }

    fn insert(&mut self, token: TokenRecord) {
        self.by_digest
            .insert(token.digest.clone(), token.id.clone());
        if let Some(at) = token.expires_ms {
            self.by_expiry.insert((at, token.id.clone()));
        }
        self.by_id.insert(token.id.clone(), token);
    }

    /// Forgets token `id`, ending the sessions it opened.
    fn remove(&mut self, id: &str) -> Option<TokenRecord> {
        let token = self.by_id.remove(id)?;
        self.by_digest.remove(&token.digest);
        if let Some(at) = token.expires_ms {
            self.by_expiry.remove(&(at, token.id.clone()));
        }
        if let Some(revoked) = self.revoked.remove(id) {
            revoked.revoke();
        }
        Some(token)
    }
}

/// How long an expired token is still known, so that a client presenting it is told it expired
/// (and renews it) rather than that it is not valid. After that it is swept away: tokens issued
/// per end-user session would otherwise pile up in memory and on disk forever.
pub const EXPIRED_TOKEN_KEPT_MS: i64 = 60 * 60 * 1000;

/// The most tokens one sweep removes, so that a backlog holds the tokens' lock briefly and
/// makes no huge commit; the next sweeps take the rest.
const SWEPT_AT_ONCE: usize = 10_000;

/// Who made a request, once authenticated.
#[derive(Clone, Debug)]
pub struct Principal {
    /// The token's id; `None` for the operator token.
    pub token_id: Option<String>,
    pub scope: Scope,
    /// When the token stops working (milliseconds since the epoch).
    pub expires_ms: Option<i64>,
    /// Set when the token is revoked (never, for the operator).
    pub revoked: Revocation,
    /// The token whose request budget this principal spends ([`TokenRecord::rate_budget`]);
    /// `None` for the operator.
    pub rate_budget: Option<String>,
}

impl Principal {
    pub fn operator() -> Principal {
        Principal {
            token_id: None,
            scope: Scope::everything(),
            expires_ms: None,
            revoked: Revocation::default(),
            rate_budget: None,
        }
    }

    /// Whether the token has stopped working at `now_ms`: revoked, or expired. Cheap enough to
    /// ask before every frame a streaming response sends.
    pub fn has_ended(&self, now_ms: i64) -> bool {
        self.revoked.is_revoked() || self.expires_ms.is_some_and(|at| at <= now_ms)
    }

    /// The operator, built once: requests without `--auth` all act as it, and building its
    /// scope allocates.
    pub fn shared_operator() -> Arc<Principal> {
        static OPERATOR: std::sync::OnceLock<Arc<Principal>> = std::sync::OnceLock::new();
        OPERATOR
            .get_or_init(|| Arc::new(Principal::operator()))
            .clone()
    }
}

/// A token's revocation, shared by every request the token authenticated: a flag that a
/// streaming response reads before each frame (an atomic load), so that nothing appended after
/// the revocation reaches it, and a signal that the tasks serving it wait on.
#[derive(Clone, Debug, Default)]
pub struct Revocation(Arc<RevocationState>);

#[derive(Debug, Default)]
struct RevocationState {
    revoked: AtomicBool,
    signal: CancellationToken,
}

impl Revocation {
    pub fn revoke(&self) {
        // The flag first: a response woken by the signal must find it set.
        self.0.revoked.store(true, Ordering::Release);
        self.0.signal.cancel();
    }

    pub fn is_revoked(&self) -> bool {
        self.0.revoked.load(Ordering::Acquire)
    }

    /// Completes once the token is revoked.
    pub async fn revoked(&self) {
        self.0.signal.cancelled().await;
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("the access token is not valid")]
    Unknown,
    #[error("the access token has expired")]
    Expired,
}

/// A new random secret: 256 bits, URL-safe.
fn new_secret() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!(
        "rnl_{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

/// A request to issue a token.
#[derive(Clone, Debug)]
pub struct IssueToken {
    pub id: String,
    pub expires_ms: Option<i64>,
    pub scope: Scope,
}

impl StreamService {
    /// The principal a presented secret belongs to.
    pub fn authenticate(&self, secret: &str) -> Result<Principal, TokenError> {
        let digest = access::digest(secret);
        let mut tokens = self.lock_tokens();
        let tokens = &mut *tokens;
        let token = tokens
            .by_digest
            .get(&digest)
            .and_then(|id| tokens.by_id.get(id))
            .filter(|t| access::same_digest(&t.digest, &digest))
            .ok_or(TokenError::Unknown)?;
        if token.expires_ms.is_some_and(|at| at <= now_ms()) {
            return Err(TokenError::Expired);
        }
        let revoked = tokens.revoked.entry(token.id.clone()).or_default().clone();
        Ok(Principal {
            token_id: Some(token.id.clone()),
            scope: token.scope.clone(),
            expires_ms: token.expires_ms,
            revoked,
            rate_budget: Some(
                token
                    .rate_budget
                    .clone()
                    .unwrap_or_else(|| token.id.clone()),
            ),
        })
    }

    /// Issues a token for `issuer`, which must hold at least the new token's permissions.
    /// Returns the secret, the only time it is ever shown.
    pub async fn issue_token(
        &self,
        issuer: &Principal,
        request: IssueToken,
    ) -> StreamResult<String> {
        if !access::valid_token_id(&request.id) {
            return Err(StreamError::BadRequest(
                "an access token id is 1 to 96 printable ASCII characters".into(),
            ));
        }
        if request.expires_ms.is_some_and(|at| at <= now_ms()) {
            return Err(StreamError::Invalid("expires_at is in the past".into()));
        }
        let outlives = |limit: i64| request.expires_ms.is_none_or(|at| at > limit);
        if issuer.expires_ms.is_some_and(outlives) {
            return Err(StreamError::Invalid(
                "a token cannot outlive the token that issues it".into(),
            ));
        }
        if !request.scope.within(&issuer.scope) {
            return Err(StreamError::Forbidden(
                "the new token's scope goes beyond the issuer's".into(),
            ));
        }
        let secret = new_secret();
        let token = TokenRecord {
            id: request.id,
            digest: access::digest(&secret),
            expires_ms: request.expires_ms,
            scope: request.scope,
            created_ms: now_ms(),
            rate_budget: issuer.rate_budget.clone(),
        };
        let commit = {
            let mut tokens = self.lock_tokens();
            // Revocation cancels under this lock, so a request authenticated just before its
            // token was revoked cannot leave a token behind that outlives the revocation.
            if issuer.revoked.is_revoked() {
                return Err(StreamError::Forbidden(
                    "the issuing access token has been revoked".into(),
                ));
            }
            if tokens.by_id.contains_key(&token.id) {
                return Err(StreamError::AlreadyExists("access token"));
            }
            tokens.insert(token.clone());
            self.engine.commit(vec![Change::PutToken(token)])
        };
        commit.await?;
        Ok(secret)
    }

    /// Tokens `viewer` may see, by id, after `start_after` and with `prefix`.
    pub fn list_tokens(
        &self,
        viewer: &Principal,
        prefix: &str,
        start_after: Option<&str>,
        limit: usize,
    ) -> (Vec<TokenRecord>, bool) {
        let tokens = self.lock_tokens();
        let mut visible = tokens
            .by_id
            .range(start_after.unwrap_or("").to_string()..)
            .map(|(_, t)| t)
            .filter(|t| Some(t.id.as_str()) != start_after)
            .filter(|t| t.id.starts_with(prefix) && viewer.scope.covers_token(&t.id));
        let page: Vec<TokenRecord> = visible.by_ref().take(limit).cloned().collect();
        let has_more = visible.next().is_some();
        (page, has_more)
    }

    /// Revokes a token: it stops working at once.
    pub async fn revoke_token(&self, id: &str) -> StreamResult<TokenRecord> {
        let (token, commit) = {
            let mut tokens = self.lock_tokens();
            // Its sessions end now; a request already past authentication may still finish.
            let token = tokens.remove(id).ok_or(StreamError::TokenNotFound)?;
            (
                token,
                self.engine
                    .commit(vec![Change::RemoveToken(id.to_string())]),
            )
        };
        commit.await?;
        Ok(token)
    }

    /// Removes the tokens that expired more than [`EXPIRED_TOKEN_KEPT_MS`] before `now_ms`.
    /// Returns how many went.
    pub async fn sweep_expired_tokens(&self, now_ms: i64) -> usize {
        let (swept, commit) = {
            let mut tokens = self.lock_tokens();
            let cutoff = (now_ms.saturating_sub(EXPIRED_TOKEN_KEPT_MS), String::new());
            let expired: Vec<String> = tokens
                .by_expiry
                .range(..cutoff)
                .take(SWEPT_AT_ONCE)
                .map(|(_, id)| id.clone())
                .collect();
            if expired.is_empty() {
                return 0;
            }
            let mut changes = Vec::with_capacity(expired.len());
            for id in expired {
                tokens.remove(&id);
                changes.push(Change::RemoveToken(id));
            }
            // Committed in the lock's order, so a token issued again under a swept id after
            // this is stored after the removal.
            (changes.len(), self.engine.commit(changes))
        };
        match commit.await {
            Ok(()) => swept,
            Err(e) => {
                tracing::warn!(error = %e, "removing expired access tokens failed");
                0
            }
        }
    }

    fn lock_tokens(&self) -> std::sync::MutexGuard<'_, TokenRegistry> {
        self.tokens.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::service::ServiceConfig;
    use crate::storage::{Engine, MemoryEngine};

    fn reader_of(basin: &str) -> Scope {
        serde_json::from_value(serde_json::json!({
            "basins": {"exact": basin},
            "streams": {"prefix": ""},
            "op_groups": {"stream": {"read": true}}
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn issued_tokens_authenticate_survive_recovery_and_stop_working_when_revoked() {
        let engine = Arc::new(MemoryEngine::new());
        let service = StreamService::open(engine.clone(), ServiceConfig::default()).unwrap();
        let secret = service
            .issue_token(
                &Principal::operator(),
                IssueToken {
                    id: "reader".into(),
                    expires_ms: None,
                    scope: reader_of("logs"),
                },
            )
            .await
            .unwrap();
        let principal = service.authenticate(&secret).unwrap();
        assert_eq!(principal.token_id.as_deref(), Some("reader"));
        assert_eq!(
            service.authenticate("rnl_guess").err(),
            Some(TokenError::Unknown)
        );

        let recovered = engine.recover().unwrap();
        assert!(
            recovered.tokens.iter().all(|t| t.digest != secret),
            "only the digest is stored"
        );
        let reopened = StreamService::open(engine, ServiceConfig::default()).unwrap();
        assert!(reopened.authenticate(&secret).is_ok());
        reopened.revoke_token("reader").await.unwrap();
        assert_eq!(
            reopened.authenticate(&secret).err(),
            Some(TokenError::Unknown)
        );
    }

    #[tokio::test]
    async fn a_token_revoked_after_its_request_was_authenticated_issues_nothing() {
        let service =
            StreamService::open(Arc::new(MemoryEngine::new()), ServiceConfig::default()).unwrap();
        let issue = |id: &str| IssueToken {
            id: id.into(),
            expires_ms: None,
            scope: reader_of("logs"),
        };
        let secret = service
            .issue_token(&Principal::operator(), issue("parent"))
            .await
            .unwrap();
        let parent = service.authenticate(&secret).unwrap();
        service.revoke_token("parent").await.unwrap();
        assert!(matches!(
            service.issue_token(&parent, issue("child")).await,
            Err(StreamError::Forbidden(_))
        ));
        let (listed, _) = service.list_tokens(&Principal::operator(), "", None, 10);
        assert!(listed.is_empty(), "no child token was kept");
    }

    #[tokio::test]
    async fn tokens_expired_longer_than_the_grace_are_swept_from_memory_and_storage() {
        let engine = Arc::new(MemoryEngine::new());
        let service = StreamService::open(engine.clone(), ServiceConfig::default()).unwrap();
        let expires = now_ms() + 60_000;
        let issue = |id: &str, expires_ms| IssueToken {
            id: id.into(),
            expires_ms,
            scope: reader_of("logs"),
        };
        let operator = Principal::operator();
        let session = service
            .issue_token(&operator, issue("session", Some(expires)))
            .await
            .unwrap();
        for (id, expires_ms) in [("service", None), ("later", Some(expires + 1))] {
            service
                .issue_token(&operator, issue(id, expires_ms))
                .await
                .unwrap();
        }

        let kept_until = expires + EXPIRED_TOKEN_KEPT_MS;
        assert_eq!(service.sweep_expired_tokens(kept_until - 1).await, 0);
        assert!(service.authenticate(&session).is_ok());
        assert_eq!(service.sweep_expired_tokens(kept_until + 1).await, 1);
        assert_eq!(
            service.authenticate(&session).err(),
            Some(TokenError::Unknown)
        );
        let (listed, _) = service.list_tokens(&operator, "", None, 10);
        let ids: Vec<&str> = listed.iter().map(|t| t.id.as_str()).collect();
        assert_eq!(ids, ["later", "service"]);
        let mut stored: Vec<String> = engine
            .recover()
            .unwrap()
            .tokens
            .into_iter()
            .map(|t| t.id)
            .collect();
        stored.sort();
        assert_eq!(stored, ["later", "service"]);
        // The id is free again.
        service
            .issue_token(&operator, issue("session", None))
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn a_token_cannot_issue_a_wider_one() {
        let service =
            StreamService::open(Arc::new(MemoryEngine::new()), ServiceConfig::default()).unwrap();
        let narrow = Principal {
            token_id: Some("narrow".into()),
            scope: reader_of("logs"),
            expires_ms: None,
            revoked: Revocation::default(),
            rate_budget: Some("narrow".into()),
        };
        let wider = IssueToken {
            id: "wider".into(),
            expires_ms: None,
            scope: reader_of("other"),
        };
        assert!(matches!(
            service.issue_token(&narrow, wider).await,
            Err(StreamError::Forbidden(_))
        ));
    }
}
