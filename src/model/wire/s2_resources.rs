//! S2's JSON bodies for basins, streams and access tokens: the requests that create or
//! reconfigure them, and the `BasinInfo`, `StreamInfo`, `AccessTokenInfo` and configurations
//! reported back.

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::model::access::{Scope, TokenRecord};
use crate::model::headers::format_timestamp;
use crate::model::s2::StreamConfig;

/// A create-basin request.
#[derive(Deserialize)]
pub struct CreateBasin {
    pub basin: String,
    #[serde(default)]
    pub config: Option<Value>,
}

/// A create-stream request.
#[derive(Deserialize)]
pub struct CreateStream {
    pub stream: String,
    #[serde(default)]
    pub config: Option<Value>,
}

/// An ensure (`PUT`) of a basin: its configuration, if any.
#[derive(Deserialize, Default)]
pub struct Reconfigure {
    #[serde(default)]
    pub config: Option<Value>,
}

/// An issue-token request.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IssueTokenRequest {
    pub id: String,
    #[serde(default)]
    pub expires_at: Option<String>,
    #[serde(default)]
    pub auto_prefix_streams: Option<bool>,
    pub scope: Scope,
}

/// A `BasinInfo`: `location` for S2's current API, `scope` for its earlier one (both null: a
/// Runnel server is one location).
pub fn basin_info(name: &str, created_ms: i64) -> Value {
    json!({ "name": name, "location": null, "scope": null, "created_at": format_timestamp(created_ms), "deleted_at": null, "state": "active" })
}

/// A `StreamInfo`.
pub fn stream_info(name: &str, created_ms: i64, cipher: Option<&str>) -> Value {
    json!({
        "name": name,
        "created_at": format_timestamp(created_ms),
        "deleted_at": null,
        "cipher": cipher,
    })
}

/// An `AccessTokenInfo`. The secret is never in it: it is shown once, at issue.
pub fn token_info(token: &TokenRecord) -> Value {
    json!({
        "id": token.id,
        "expires_at": token.expires_ms.map(format_timestamp),
        "auto_prefix_streams": false,
        "scope": token.scope,
    })
}

/// A stored configuration as S2 reports it: every field of `T`, unset ones at their defaults.
pub fn config<T: serde::Serialize + Default + DeserializeOwned>(stored: Option<&Value>) -> Value {
    let typed: T = stored
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .unwrap_or_default();
    serde_json::to_value(typed).unwrap_or(Value::Null)
}

/// A stream's configuration as S2 reports it: every field, defaults filled in.
pub fn stream_config(stored: Option<&Value>) -> Value {
    let config: StreamConfig = stored
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .unwrap_or_default();
    serde_json::to_value(config.effective()).unwrap_or(Value::Null)
}

/// What a create (`POST`) or an ensure (`PUT`) did, as the `s2-provision-result` header S2
/// clients read names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provision {
    Created,
    /// A create retried with the request token of the one that made the resource.
    Repeated,
    Updated,
    Unchanged,
}

impl Provision {
    /// Configurations are compared as reported, so that setting a default explicitly changes
    /// nothing.
    pub fn of_reconfiguration(before: Value, after: Value) -> Provision {
        if before == after {
            Provision::Unchanged
        } else {
            Provision::Updated
        }
    }

    /// The `s2-provision-result` value.
    pub fn result(self) -> &'static str {
        match self {
            Provision::Created => "created",
            Provision::Repeated | Provision::Unchanged => "noop",
            Provision::Updated => "updated",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configuration_is_reported_with_its_defaults_filled_in() {
        let sparse = json!({ "storage_class": "standard" });
        let reported = stream_config(Some(&sparse));
        assert_eq!(reported["storage_class"], "standard");
        assert_eq!(
            reported,
            stream_config(Some(&reported)),
            "stable once filled"
        );
        assert_eq!(stream_config(None), stream_config(Some(&json!({}))));
    }

    #[test]
    fn setting_a_default_explicitly_reconfigures_nothing() {
        let explicit = stream_config(Some(&stream_config(None)));
        assert_eq!(
            Provision::of_reconfiguration(stream_config(None), explicit),
            Provision::Unchanged
        );
        let changed = stream_config(Some(&json!({ "retention_policy": { "age": 3600 } })));
        assert_eq!(
            Provision::of_reconfiguration(stream_config(None), changed).result(),
            "updated"
        );
    }
}
