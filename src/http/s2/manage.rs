//! S2 basin and stream management: `/v1/basins…` and `/v1/streams…`.

use std::sync::Arc;

use super::*;
use crate::model::wire::s2_resources::{
    self, CreateBasin, CreateStream, Provision, Reconfigure, basin_info,
};

/// The response to a create or an ensure: `201` for something made, `200` for something found,
/// with `s2-provision-result` saying which.
fn provisioned(provision: Provision, body: Value) -> Response {
    let status = match provision {
        Provision::Created | Provision::Repeated => StatusCode::CREATED,
        Provision::Updated | Provision::Unchanged => StatusCode::OK,
    };
    let mut response = json_response(status, body);
    response.headers_mut().insert(
        "s2-provision-result",
        HeaderValue::from_static(provision.result()),
    );
    response
}

fn of_creation(creation: Creation) -> Provision {
    match creation {
        Creation::New => Provision::Created,
        Creation::Repeated => Provision::Repeated,
    }
}

/// The create request's identity across retries, when the client sent an `s2-request-token`
/// (S2's SDKs send one with every create and keep it when they retry). The configuration counts
/// as parsed, so a retry that spells the same one differently (field order, `{}` for none,
/// unknown fields) is the same request.
fn creation_of<T: serde::Serialize + Default + serde::de::DeserializeOwned>(
    headers: &HeaderMap,
    config: Option<&Value>,
) -> Result<Option<String>, S2Error> {
    let Some(token) = headers.get("s2-request-token") else {
        return Ok(None);
    };
    let token = token
        .to_str()
        .map_err(|_| bad("bad_header", "s2-request-token is not text"))?;
    if token.len() > s2::MAX_REQUEST_TOKEN {
        return Err(bad(
            "bad_header",
            format!(
                "s2-request-token is {} bytes; at most {} are allowed",
                token.len(),
                s2::MAX_REQUEST_TOKEN
            ),
        ));
    }
    Ok(Some(s2::creation_key(
        token,
        Some(&s2_resources::config::<T>(config)),
    )))
}

pub(in crate::http) fn list_basins(
    app: AppState,
    principal: Arc<Principal>,
    request: Request,
) -> Response {
    let result = (|| {
        let query = Query::parse(request.uri().query());
        let prefix = query.get("prefix")?.unwrap_or_default();
        let (page, has_more) = app.service.list_buckets(
            prefix,
            query.get("start_after")?,
            limit_of(&query)?,
            // S2 clients refuse a listing holding a name S2 would not accept as a basin's.
            |basin| s2::is_valid_basin_name(basin) && principal.scope.covers_basin(basin),
        );
        let basins: Vec<Value> = page
            .iter()
            .map(|(name, meta)| basin_info(name, meta.created_ms))
            .collect();
        Ok::<_, S2Error>(json_response(
            StatusCode::OK,
            json!({ "basins": basins, "has_more": has_more }),
        ))
    })();
    result.unwrap_or_else(IntoResponse::into_response)
}

pub(in crate::http) async fn create_basin(
    app: AppState,
    principal: Arc<Principal>,
    request: Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let headers = parts.headers;
    let result = async {
        let request: CreateBasin = required_json_body(&app, &headers, body).await?;
        permit(
            &principal,
            Operation::CreateBasin,
            Resource::Basin(&request.basin),
        )?;
        if !s2::is_valid_basin_name(&request.basin) {
            return Err(bad("invalid", s2::BASIN_NAME_RULE));
        }
        let config = validated_basin(&app, request.config)?;
        let creation = creation_of::<BasinConfig>(&headers, config.as_ref())?;
        let creation = app
            .service
            .create_bucket(&request.basin, config, creation)
            .await?;
        let info = app.service.bucket_info(&request.basin)?;
        Ok::<_, S2Error>(provisioned(
            of_creation(creation),
            basin_info(&request.basin, info.created_ms),
        ))
    };
    result.await.unwrap_or_else(IntoResponse::into_response)
}

/// A configuration object that parses as `T` (unknown fields refused).
fn validated<T: serde::de::DeserializeOwned + s2::CheckedConfig>(
    config: Option<Value>,
) -> Result<Option<Value>, S2Error> {
    match config {
        None | Some(Value::Null) => Ok(None),
        Some(value) => {
            crate::service::parse_s2_config::<T>(&value)?;
            Ok(Some(value))
        }
    }
}

fn validated_basin(app: &AppState, config: Option<Value>) -> Result<Option<Value>, S2Error> {
    match config {
        None | Some(Value::Null) => Ok(None),
        Some(value) => {
            app.service.check_basin_config(&value)?;
            Ok(Some(value))
        }
    }
}

pub(in crate::http) async fn basin(
    app: AppState,
    principal: Arc<Principal>,
    basin: String,
    request: Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let (method, headers, uri) = (parts.method, parts.headers, parts.uri);
    let result = async {
        if method == Method::PUT
            && !s2::is_valid_basin_name(&basin)
            && names::validate_bucket_id(&basin).is_err()
        {
            return Err(bad("invalid", s2::BASIN_NAME_RULE));
        }
        names::validate_bucket_id(&basin).map_err(|e| bad("bad_path", e))?;
        match method {
            Method::GET => {
                let info = app.service.bucket_info(&basin)?;
                Ok(json_response(
                    StatusCode::OK,
                    s2_resources::config::<BasinConfig>(info.s2_config.as_ref()),
                ))
            }
            Method::PUT => {
                // Ensuring an existing basin reconfigures it.
                if app.service.bucket_info(&basin).is_ok() {
                    permit(
                        &principal,
                        Operation::ReconfigureBasin,
                        Resource::Basin(&basin),
                    )?;
                }
                let request: Reconfigure =
                    json_body(&app, &headers, body).await?.unwrap_or_default();
                let config = validated_basin(&app, request.config)?;
                let provision = match app.service.ensure_basin(&basin, config).await? {
                    Ensured::Created => Provision::Created,
                    Ensured::Existing { before, after } => Provision::of_reconfiguration(
                        s2_resources::config::<BasinConfig>(before.as_ref()),
                        s2_resources::config::<BasinConfig>(after.as_ref()),
                    ),
                };
                let info = app.service.bucket_info(&basin)?;
                Ok(provisioned(provision, basin_info(&basin, info.created_ms)))
            }
            Method::PATCH => {
                let patch: Value = json_body(&app, &headers, body)
                    .await?
                    .unwrap_or(Value::Object(Default::default()));
                let config = app.service.reconfigure_basin(&basin, &patch).await?;
                Ok(json_response(
                    StatusCode::OK,
                    s2_resources::config::<BasinConfig>(Some(&config)),
                ))
            }
            Method::DELETE => {
                app.service.delete_basin(&basin).await?;
                Ok(StatusCode::ACCEPTED.into_response())
            }
            _ => Err(method_not_allowed()),
        }
    };
    result.await.unwrap_or_else(|e| e.at(&uri))
}

fn stream_info(summary: &StreamSummary) -> Value {
    s2_resources::stream_info(
        &summary.stream_id,
        summary.created_ms,
        summary.cipher.as_deref(),
    )
}

/// The `StreamInfo` of a stream just created or confirmed.
async fn stream_info_of(app: &AppState, key: &str) -> Result<Value, S2Error> {
    let stream = app.service.find(key, false).await?;
    Ok(stream_info(&app.service.stream_summary(&stream)))
}

pub(in crate::http) fn list_streams(
    app: AppState,
    principal: Arc<Principal>,
    request: Request,
) -> Response {
    let result = (|| {
        let basin = basin_of(request.headers())?;
        let query = Query::parse(request.uri().query());
        let prefix = query.get("prefix")?.unwrap_or_default();
        let listing = app.service.list_streams(
            &basin,
            prefix,
            query.get("start_after")?,
            limit_of(&query)?,
            |stream| principal.scope.covers_stream(&basin, stream),
        )?;
        let streams: Vec<Value> = listing.streams.iter().map(stream_info).collect();
        Ok::<_, S2Error>(json_response(
            StatusCode::OK,
            json!({ "streams": streams, "has_more": listing.has_more }),
        ))
    })();
    result.unwrap_or_else(IntoResponse::into_response)
}

pub(in crate::http) async fn create_stream(
    app: AppState,
    principal: Arc<Principal>,
    request: Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let (headers, uri) = (parts.headers, parts.uri);
    let result = async {
        let basin = basin_of(&headers)?;
        let request: CreateStream = required_json_body(&app, &headers, body).await?;
        permit(
            &principal,
            Operation::CreateStream,
            Resource::Stream {
                basin: &basin,
                stream: &request.stream,
            },
        )?;
        valid_stream(&basin, &request.stream)?;
        let config = validated::<StreamConfig>(request.config)?;
        let creation = creation_of::<StreamConfig>(&headers, config.as_ref())?;
        let creation = app
            .service
            .create_in_bucket(&basin, &request.stream, config, creation)
            .await?;
        let key = stream_key(&basin, &request.stream)?;
        Ok::<_, S2Error>(provisioned(
            of_creation(creation),
            stream_info_of(&app, &key).await?,
        ))
    };
    result.await.unwrap_or_else(|e| e.at(&uri))
}

pub(in crate::http) async fn stream(
    app: AppState,
    principal: Arc<Principal>,
    name: String,
    request: Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let (method, headers, uri) = (parts.method, parts.headers, parts.uri);
    let result = async {
        let basin = basin_of(&headers)?;
        let key = stream_key(&basin, &name)?;
        match method {
            Method::GET => {
                app.service.bucket_info(&basin)?;
                let stream = app.service.find(&key, false).await?;
                Ok(json_response(
                    StatusCode::OK,
                    s2_resources::stream_config(Some(&app.service.stream_config_of(&stream))),
                ))
            }
            Method::PUT => {
                // Ensuring an existing stream reconfigures it.
                if app.service.find(&key, false).await.is_ok() {
                    permit(
                        &principal,
                        Operation::ReconfigureStream,
                        Resource::Stream {
                            basin: &basin,
                            stream: &name,
                        },
                    )?;
                }
                // The body is the configuration itself (basins wrap theirs in `config`).
                let config = validated::<StreamConfig>(json_body(&app, &headers, body).await?)?;
                let provision = match app.service.ensure_in_bucket(&basin, &name, config).await? {
                    Ensured::Created => Provision::Created,
                    Ensured::Existing { before, after } => Provision::of_reconfiguration(
                        s2_resources::stream_config(before.as_ref()),
                        s2_resources::stream_config(after.as_ref()),
                    ),
                };
                Ok(provisioned(provision, stream_info_of(&app, &key).await?))
            }
            Method::PATCH => {
                app.service.bucket_info(&basin)?;
                let patch: Value = json_body(&app, &headers, body)
                    .await?
                    .unwrap_or(Value::Object(Default::default()));
                let config = app
                    .service
                    .reconfigure_stream(&basin, &name, &patch)
                    .await?;
                Ok(json_response(
                    StatusCode::OK,
                    s2_resources::stream_config(Some(&config)),
                ))
            }
            Method::DELETE => {
                app.service.bucket_info(&basin)?;
                app.service.delete(&key).await?;
                Ok(StatusCode::ACCEPTED.into_response())
            }
            _ => Err(method_not_allowed()),
        }
    };
    result.await.unwrap_or_else(|e| e.at(&uri))
}
