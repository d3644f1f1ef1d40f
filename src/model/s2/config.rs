//! S2 stream and basin configurations (seed 002): their shapes as S2's API types spell them,
//! the defaults they fill in from, the checks beyond their shape, and reconfiguration.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// S2's storage classes. Runnel stores every stream alike; the class is kept and reported.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StorageClass {
    Standard,
    #[default]
    Express,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TimestampingMode {
    #[default]
    ClientPrefer,
    ClientRequire,
    Arrival,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timestamping {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<TimestampingMode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uncapped: Option<bool>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RetentionPolicy {
    /// Seconds; at least one.
    Age(u64),
    Infinite(serde_json::Map<String, Value>),
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeleteOnEmpty {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_age_secs: Option<u64>,
}

impl DeleteOnEmpty {
    /// The wait before an emptied stream is deleted; `None` when delete-on-empty is off (0, the
    /// default).
    pub fn min_age_secs(&self) -> Option<u64> {
        self.min_age_secs.filter(|secs| *secs > 0)
    }

    /// Whether a stream that has been empty since `empty_since_ms` is due for deletion at
    /// `now_ms`. Never while delete-on-empty is off.
    pub fn due(&self, empty_since_ms: u64, now_ms: u64) -> bool {
        self.min_age_secs()
            .is_some_and(|secs| now_ms.saturating_sub(empty_since_ms) >= secs.saturating_mul(1000))
    }
}

/// A configuration's rules beyond its shape (a well-formed but impossible value is S2's 422).
pub trait CheckedConfig {
    fn check(&self) -> Result<(), String>;
}

/// An S2 stream's configuration. Unknown fields are ignored, as in S2's API types, so that a
/// client newer than the server still gets through.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class: Option<StorageClass>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_policy: Option<RetentionPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamping: Option<Timestamping>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_on_empty: Option<DeleteOnEmpty>,
}

impl StreamConfig {
    /// What Runnel does where no configuration says otherwise: records kept until trimmed,
    /// client-prefer capped timestamps, no delete-on-empty.
    pub fn system_default() -> StreamConfig {
        StreamConfig {
            storage_class: Some(StorageClass::default()),
            retention_policy: Some(RetentionPolicy::Infinite(Default::default())),
            timestamping: Some(Timestamping {
                mode: Some(TimestampingMode::default()),
                uncapped: Some(false),
            }),
            delete_on_empty: Some(DeleteOnEmpty {
                min_age_secs: Some(0),
            }),
        }
    }

    /// This configuration with every field it leaves out taken from `defaults`, nested fields
    /// one by one (S2 fills a stream's configuration from its basin's default this way).
    pub fn over(&self, defaults: &StreamConfig) -> StreamConfig {
        fn either<T: Clone>(own: &Option<T>, default: &Option<T>) -> Option<T> {
            own.as_ref().or(default.as_ref()).cloned()
        }
        let timestamping = match (&self.timestamping, &defaults.timestamping) {
            (Some(own), Some(default)) => Some(Timestamping {
                mode: own.mode.or(default.mode),
                uncapped: own.uncapped.or(default.uncapped),
            }),
            (own, default) => either(own, default),
        };
        let delete_on_empty = match (&self.delete_on_empty, &defaults.delete_on_empty) {
            (Some(own), Some(default)) => Some(DeleteOnEmpty {
                min_age_secs: own.min_age_secs.or(default.min_age_secs),
            }),
            (own, default) => either(own, default),
        };
        StreamConfig {
            storage_class: either(&self.storage_class, &defaults.storage_class),
            retention_policy: either(&self.retention_policy, &defaults.retention_policy),
            timestamping,
            delete_on_empty,
        }
    }

    /// The configuration in force, every field filled in: what is set, else Runnel's default.
    pub fn effective(&self) -> StreamConfig {
        self.over(&StreamConfig::system_default())
    }

    /// The configuration a stream gets from what was asked for in a basin with `basin`'s
    /// configuration: what is asked for, else the basin's default, else Runnel's; resolved once,
    /// so a later change to the basin's default leaves the stream as it is.
    pub fn resolved_in(&self, basin: &BasinConfig) -> StreamConfig {
        match &basin.default_stream_config {
            Some(defaults) => self.over(defaults).effective(),
            None => self.effective(),
        }
    }
}

impl CheckedConfig for StreamConfig {
    fn check(&self) -> Result<(), String> {
        if self.retention_policy == Some(RetentionPolicy::Age(0)) {
            return Err("a retention age is at least 1 second".into());
        }
        Ok(())
    }
}

impl CheckedConfig for BasinConfig {
    fn check(&self) -> Result<(), String> {
        self.default_stream_config
            .as_ref()
            .map_or(Ok(()), CheckedConfig::check)
    }
}

/// An S2 basin's configuration (unknown fields ignored, as for streams).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BasinConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_stream_config: Option<StreamConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_cipher: Option<String>,
    #[serde(default)]
    pub create_stream_on_append: bool,
    #[serde(default)]
    pub create_stream_on_read: bool,
}

/// Fields whose value is one of several shapes (`{"age": n}` or `{"infinite": {}}`): a
/// reconfiguration replaces them whole instead of merging into them.
const REPLACED_WHOLE: &[&str] = &["retention_policy"];

/// Applies a reconfiguration: absent fields stay, `null` resets, values replace (objects merge
/// field by field, except the one-of fields in `REPLACED_WHOLE`). This is JSON Merge Patch
/// (RFC 7386) with S2's one-of fields.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(serde_json::Map::new());
    }
    if let Value::Object(target) = target {
        for (key, value) in patch {
            if value.is_null() {
                target.remove(key);
            } else if REPLACED_WHOLE.contains(&key.as_str()) {
                target.insert(key.clone(), value.clone());
            } else {
                merge_patch(target.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delete_on_empty_is_due_once_empty_for_its_min_age_and_never_when_off() {
        let after = |secs| DeleteOnEmpty {
            min_age_secs: Some(secs),
        };
        assert!(!after(2).due(10_000, 11_999));
        assert!(after(2).due(10_000, 12_000));
        assert!(!after(0).due(0, u64::MAX), "0 turns it off");
        assert!(
            !DeleteOnEmpty::default().due(0, u64::MAX),
            "so does leaving it out"
        );
        assert!(
            !after(2).due(12_000, 10_000),
            "a clock going back is not a wait"
        );
    }

    #[test]
    fn merge_patch_keeps_resets_and_merges() {
        let mut config = serde_json::json!({"a": 1, "t": {"mode": "arrival", "uncapped": true}});
        merge_patch(
            &mut config,
            &serde_json::json!({"a": null, "t": {"uncapped": false}, "b": 2}),
        );
        assert_eq!(
            config,
            serde_json::json!({"t": {"mode": "arrival", "uncapped": false}, "b": 2})
        );
    }

    #[test]
    fn a_retention_policy_is_replaced_whole_by_a_reconfiguration() {
        let mut config = serde_json::json!({"retention_policy": {"age": 60}});
        merge_patch(
            &mut config,
            &serde_json::json!({"retention_policy": {"infinite": {}}}),
        );
        assert_eq!(
            config,
            serde_json::json!({"retention_policy": {"infinite": {}}})
        );
        let nested = serde_json::json!({"default_stream_config": {"retention_policy": {"age": 5}}});
        let mut basin = serde_json::json!({"default_stream_config": {"retention_policy": {"infinite": {}}, "storage_class": "express"}});
        merge_patch(&mut basin, &nested);
        assert_eq!(
            basin,
            serde_json::json!({"default_stream_config": {"retention_policy": {"age": 5}, "storage_class": "express"}})
        );
    }

    #[test]
    fn a_zero_retention_age_is_refused() {
        let zero: BasinConfig = serde_json::from_value(
            serde_json::json!({"default_stream_config": {"retention_policy": {"age": 0}}}),
        )
        .unwrap();
        assert!(zero.check().is_err());
        let one: StreamConfig =
            serde_json::from_value(serde_json::json!({"retention_policy": {"age": 1}})).unwrap();
        assert!(one.check().is_ok());
    }

    #[test]
    fn the_effective_config_fills_every_unset_field() {
        let effective = StreamConfig::default().effective();
        assert_eq!(
            serde_json::to_value(effective).unwrap(),
            serde_json::json!({
                "storage_class": "express",
                "retention_policy": {"infinite": {}},
                "timestamping": {"mode": "client-prefer", "uncapped": false},
                "delete_on_empty": {"min_age_secs": 0}
            })
        );
    }

    #[test]
    fn a_stream_config_takes_each_field_it_leaves_out_from_the_defaults_one_by_one() {
        let parse = |v: Value| serde_json::from_value::<StreamConfig>(v).unwrap();
        let own = parse(serde_json::json!({
            "timestamping": {"mode": "arrival"},
            "delete_on_empty": {}
        }));
        let defaults = parse(serde_json::json!({
            "retention_policy": {"age": 60},
            "timestamping": {"mode": "client-require", "uncapped": true},
            "delete_on_empty": {"min_age_secs": 9}
        }));
        assert_eq!(
            serde_json::to_value(own.over(&defaults)).unwrap(),
            serde_json::json!({
                "retention_policy": {"age": 60},
                "timestamping": {"mode": "arrival", "uncapped": true},
                "delete_on_empty": {"min_age_secs": 9}
            })
        );
        let basin = BasinConfig {
            default_stream_config: Some(defaults),
            ..BasinConfig::default()
        };
        assert_eq!(
            own.resolved_in(&basin).storage_class,
            Some(StorageClass::Express),
            "what neither sets is Runnel's default"
        );
        assert_eq!(own.resolved_in(&BasinConfig::default()), own.effective());
    }

    #[test]
    fn configs_parse_from_s2_json() {
        let config: StreamConfig = serde_json::from_value(serde_json::json!({
            "retention_policy": {"age": 3600},
            "timestamping": {"mode": "client-require", "uncapped": true}
        }))
        .unwrap();
        assert_eq!(config.retention_policy, Some(RetentionPolicy::Age(3600)));
        let infinite: StreamConfig =
            serde_json::from_value(serde_json::json!({"retention_policy": {"infinite": {}}}))
                .unwrap();
        assert!(matches!(
            infinite.retention_policy,
            Some(RetentionPolicy::Infinite(_))
        ));
        assert_eq!(
            serde_json::from_value::<StreamConfig>(serde_json::json!({"future_knob": 1})).unwrap(),
            StreamConfig::default(),
            "unknown fields are ignored"
        );
        for bad in [serde_json::json!(1), serde_json::json!("bogus")] {
            assert!(
                serde_json::from_value::<StreamConfig>(serde_json::json!({"storage_class": bad}))
                    .is_err(),
                "a storage class is standard or express"
            );
        }
    }
}
