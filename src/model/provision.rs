//! Basins and streams declared in a file and provisioned at start (`--init-file`). The file is
//! the resource spec that s2-lite's `--init-file` and the S2 CLI's `apply` read, so one file
//! serves both. Its configurations spell durations as text (`"7d"`, `"infinite"`); they are
//! turned into the S2 API's JSON configuration objects here, and checked like any other there.

use std::collections::HashSet;

use serde::Deserialize;
use serde_json::{Map, Value, json};

/// Other top-level keys (a `$schema`, say) are left alone, as s2-lite does.
#[derive(Debug, Default, Deserialize)]
pub struct Resources {
    #[serde(default)]
    pub basins: Vec<BasinSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BasinSpec {
    pub name: String,
    #[serde(default)]
    pub config: Option<BasinConfigSpec>,
    #[serde(default)]
    pub streams: Vec<StreamSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamSpec {
    pub name: String,
    #[serde(default)]
    pub config: Option<StreamConfigSpec>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BasinConfigSpec {
    #[serde(default)]
    default_stream_config: Option<StreamConfigSpec>,
    #[serde(default)]
    stream_cipher: Option<String>,
    #[serde(default)]
    create_stream_on_append: Option<bool>,
    #[serde(default)]
    create_stream_on_read: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamConfigSpec {
    #[serde(default)]
    storage_class: Option<String>,
    /// `"infinite"`, or an age such as `"7d"`.
    #[serde(default)]
    retention_policy: Option<String>,
    /// As in the API: `{"mode": …, "uncapped": …}`.
    #[serde(default)]
    timestamping: Option<Value>,
    #[serde(default)]
    delete_on_empty: Option<DeleteOnEmptySpec>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeleteOnEmptySpec {
    /// An age such as `"1h"`; `"0s"` (or none) turns delete-on-empty off.
    #[serde(default)]
    min_age: Option<String>,
}

/// Reads a resource spec: well-formed JSON of the spec's shape, no basin named twice, no stream
/// named twice in one basin.
pub fn parse(text: &str) -> Result<Resources, String> {
    let resources: Resources = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let mut basins = HashSet::new();
    for basin in &resources.basins {
        if !basins.insert(basin.name.as_str()) {
            return Err(format!("basin {:?} is declared twice", basin.name));
        }
        let mut streams = HashSet::new();
        for stream in &basin.streams {
            if !streams.insert(stream.name.as_str()) {
                return Err(format!(
                    "stream {:?} is declared twice in basin {:?}",
                    stream.name, basin.name
                ));
            }
        }
    }
    Ok(resources)
}

impl BasinConfigSpec {
    /// The basin configuration as the S2 API spells it.
    pub fn to_api(&self) -> Result<Value, String> {
        let mut out = Map::new();
        if let Some(streams) = &self.default_stream_config {
            out.insert("default_stream_config".into(), streams.to_api()?);
        }
        if let Some(cipher) = &self.stream_cipher {
            out.insert("stream_cipher".into(), json!(cipher));
        }
        if let Some(on) = self.create_stream_on_append {
            out.insert("create_stream_on_append".into(), json!(on));
        }
        if let Some(on) = self.create_stream_on_read {
            out.insert("create_stream_on_read".into(), json!(on));
        }
        Ok(Value::Object(out))
    }
}

impl StreamConfigSpec {
    /// The stream configuration as the S2 API spells it.
    pub fn to_api(&self) -> Result<Value, String> {
        let mut out = Map::new();
        if let Some(class) = &self.storage_class {
            out.insert("storage_class".into(), json!(class));
        }
        if let Some(policy) = &self.retention_policy {
            let policy = if policy.eq_ignore_ascii_case("infinite") {
                json!({ "infinite": {} })
            } else {
                json!({ "age": seconds(policy)? })
            };
            out.insert("retention_policy".into(), policy);
        }
        if let Some(timestamping) = &self.timestamping {
            out.insert("timestamping".into(), timestamping.clone());
        }
        if let Some(rule) = &self.delete_on_empty {
            let min_age = rule.min_age.as_deref().map(seconds).transpose()?;
            out.insert("delete_on_empty".into(), json!({ "min_age_secs": min_age }));
        }
        Ok(Value::Object(out))
    }
}

/// Whole seconds of a duration such as `"7d"` or `"2h 30m"`.
fn seconds(text: &str) -> Result<u64, String> {
    humantime::parse_duration(text)
        .map(|d| d.as_secs())
        .map_err(|e| format!("invalid duration {text:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_becomes_the_apis_configuration_objects() {
        let spec = parse(
            r#"{"basins": [{
                "name": "events-basin",
                "config": {
                    "create_stream_on_append": true,
                    "default_stream_config": {"retention_policy": "7d"}
                },
                "streams": [
                    {"name": "audit", "config": {
                        "retention_policy": "infinite",
                        "timestamping": {"mode": "arrival"},
                        "delete_on_empty": {"min_age": "1h 30m"},
                        "storage_class": "express"
                    }},
                    {"name": "plain"}
                ]
            }]}"#,
        )
        .unwrap();
        let basin = &spec.basins[0];
        assert_eq!(
            basin.config.as_ref().unwrap().to_api().unwrap(),
            json!({
                "default_stream_config": {"retention_policy": {"age": 604800}},
                "create_stream_on_append": true
            })
        );
        assert_eq!(
            basin.streams[0].config.as_ref().unwrap().to_api().unwrap(),
            json!({
                "storage_class": "express",
                "retention_policy": {"infinite": {}},
                "timestamping": {"mode": "arrival"},
                "delete_on_empty": {"min_age_secs": 5400}
            })
        );
        assert!(basin.streams[1].config.is_none());
    }

    #[test]
    fn malformed_specs_are_refused_with_what_is_wrong() {
        for (text, wrong) in [
            (
                r#"{"basins": [{"name": "a"}, {"name": "a"}]}"#,
                "declared twice",
            ),
            (
                r#"{"basins": [{"name": "b", "streams": [{"name": "s"}, {"name": "s"}]}]}"#,
                "declared twice in basin",
            ),
            (
                r#"{"basins": [{"name": "b", "colour": 1}]}"#,
                "unknown field",
            ),
            ("not json", "expected"),
        ] {
            let error = parse(text).unwrap_err();
            assert!(error.contains(wrong), "{text}: {error}");
        }
        let spec = parse(
            r#"{"basins": [{"name": "b", "streams": [{"name": "s",
                "config": {"retention_policy": "soon"}}]}]}"#,
        )
        .unwrap();
        let error = spec.basins[0].streams[0]
            .config
            .as_ref()
            .unwrap()
            .to_api()
            .unwrap_err();
        assert!(error.contains("invalid duration \"soon\""), "{error}");
    }
}
