//! S2's access token API: issue (`POST /v1/access-tokens`), list (`GET`) and revoke
//! (`DELETE /v1/access-tokens/{id}`). Secrets are shown once, at issue, and stored as digests.

use std::sync::Arc;

use super::*;
use crate::model::headers::parse_expires_at;
use crate::model::wire::s2_resources::{IssueTokenRequest, token_info};
use crate::service::IssueToken;

pub(in crate::http) async fn issue_token(
    app: AppState,
    principal: Arc<Principal>,
    request: Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let headers = parts.headers;
    let result = async {
        let request: IssueTokenRequest = required_json_body(&app, &headers, body).await?;
        permit(
            &principal,
            Operation::IssueAccessToken,
            Resource::AccessToken(&request.id),
        )?;
        if request.auto_prefix_streams == Some(true) {
            return Err(bad(
                "invalid",
                "auto_prefix_streams is not supported by Runnel",
            ));
        }
        let expires_ms = request
            .expires_at
            .as_deref()
            .map(parse_expires_at)
            .transpose()
            .map_err(|_| bad("invalid", "expires_at must be an RFC 3339 timestamp"))?;
        let secret = app
            .service
            .issue_token(
                &principal,
                IssueToken {
                    id: request.id,
                    expires_ms,
                    scope: request.scope,
                },
            )
            .await?;
        Ok::<_, S2Error>(json_response(
            StatusCode::CREATED,
            json!({ "access_token": secret }),
        ))
    };
    result.await.unwrap_or_else(IntoResponse::into_response)
}

pub(in crate::http) fn list_tokens(
    app: AppState,
    principal: Arc<Principal>,
    request: Request,
) -> Response {
    let result = (|| {
        let query = Query::parse(request.uri().query());
        let prefix = query.get("prefix")?.unwrap_or_default();
        let (page, has_more) = app.service.list_tokens(
            &principal,
            prefix,
            query.get("start_after")?,
            limit_of(&query)?,
        );
        let tokens: Vec<Value> = page.iter().map(token_info).collect();
        Ok::<_, S2Error>(json_response(
            StatusCode::OK,
            json!({ "access_tokens": tokens, "has_more": has_more }),
        ))
    })();
    result.unwrap_or_else(IntoResponse::into_response)
}

pub(in crate::http) async fn revoke_token(app: AppState, id: String) -> Response {
    // The authorization layer already checked the caller may revoke this id.
    match app.service.revoke_token(&id).await {
        Ok(token) => json_response(StatusCode::OK, token_info(&token)),
        Err(e) => S2Error::from(e).into_response(),
    }
}
