use super::*;

fn file(text: &str) -> tempfile::NamedTempFile {
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), text).unwrap();
    f
}

#[test]
fn defaults_listen_on_4437_with_fsynced_data_in_runnel_data() {
    let settings = ServeArgs::default().resolve().unwrap();
    assert_eq!(settings.listen.to_string(), DEFAULT_LISTEN);
    assert_eq!(
        settings.storage,
        StorageSettings::Disk {
            dir: PathBuf::from(DEFAULT_DATA_DIR),
            sync: SyncArg::Fsync
        }
    );
    assert_eq!(settings.long_poll_timeout, Duration::from_secs(30));
}

#[test]
fn max_body_bytes_is_1_byte_to_1_gib() {
    let with = |bytes: usize| {
        ServeArgs {
            max_body_bytes: Some(bytes),
            ..Default::default()
        }
        .resolve()
    };
    assert!(with(0).is_err());
    assert!(with(MAX_BODY_BYTES_LIMIT + 1).is_err());
    assert_eq!(
        with(MAX_BODY_BYTES_LIMIT).unwrap().max_body_bytes,
        MAX_BODY_BYTES_LIMIT
    );
}

#[test]
fn flags_win_over_the_file_and_the_file_over_defaults() {
    let f = file("listen = \"127.0.0.1:9000\"\nlong_poll_timeout_ms = 500\nsync = \"none\"\n");
    let args = ServeArgs {
        config: Some(f.path().into()),
        long_poll_timeout_ms: Some(700),
        ..Default::default()
    };
    let settings = args.resolve().unwrap();
    assert_eq!(settings.listen.to_string(), "127.0.0.1:9000");
    assert_eq!(settings.long_poll_timeout, Duration::from_millis(700));
    assert!(matches!(
        settings.storage,
        StorageSettings::Disk {
            sync: SyncArg::None,
            ..
        }
    ));
}

#[test]
fn huge_durations_are_bounded_so_deadlines_cannot_overflow() {
    let f = file(
        "sse_max_duration_secs = 18446744073709551615\nheader_read_timeout_secs = 18446744073709551615\nbody_idle_timeout_secs = 18446744073709551615\nsend_timeout_secs = 18446744073709551615\n",
    );
    let settings = ServeArgs {
        config: Some(f.path().to_owned()),
        ..Default::default()
    }
    .resolve()
    .unwrap();
    let now = tokio::time::Instant::now();
    assert!(now.checked_add(settings.sse_max_duration).is_some());
    assert!(now.checked_add(settings.header_read_timeout).is_some());
    assert!(now.checked_add(settings.body_idle_timeout).is_some());
    assert!(now.checked_add(settings.send_timeout).is_some());
}

#[test]
fn a_header_limit_below_what_http1_can_hold_is_refused() {
    let with = |bytes| ServeArgs {
        max_header_bytes: Some(bytes),
        ..Default::default()
    };
    assert!(matches!(
        with(MIN_MAX_HEADER_BYTES - 1).resolve(),
        Err(ConfigError::Invalid(_))
    ));
    assert_eq!(
        with(MIN_MAX_HEADER_BYTES)
            .resolve()
            .unwrap()
            .max_header_bytes,
        MIN_MAX_HEADER_BYTES
    );
}

#[test]
fn unknown_or_malformed_file_keys_are_errors() {
    let f = file("listne = \"x\"\n");
    assert!(matches!(
        ServeArgs {
            config: Some(f.path().into()),
            ..Default::default()
        }
        .resolve(),
        Err(ConfigError::Parse { .. })
    ));
    let missing = ServeArgs {
        config: Some("/nonexistent/runnel.toml".into()),
        ..Default::default()
    };
    assert!(matches!(missing.resolve(), Err(ConfigError::Read { .. })));
}

#[test]
fn listen_takes_a_host_name_and_binds_its_first_address() {
    let settings = ServeArgs {
        listen: Some("localhost:4437".into()),
        ..Default::default()
    }
    .resolve()
    .unwrap();
    assert!(settings.listen.ip().is_loopback());
    assert_eq!(settings.listen.port(), 4437);
    let nowhere = ServeArgs {
        listen: Some("no-such-host.invalid:4437".into()),
        ..Default::default()
    };
    assert!(matches!(nowhere.resolve(), Err(ConfigError::Invalid(_))));
}

#[test]
fn a_flag_that_does_nothing_in_this_mode_is_refused_with_the_reason() {
    let refusal = |args: ServeArgs| match args.resolve() {
        Err(ConfigError::Invalid(reason)) => reason,
        other => panic!("expected a refusal, got {other:?}"),
    };
    let memory = || ServeArgs {
        memory: true,
        ..Default::default()
    };
    assert!(
        refusal(ServeArgs {
            data_dir: Some("d".into()),
            ..memory()
        })
        .starts_with("--data-dir")
    );
    assert!(
        refusal(ServeArgs {
            sync: Some(SyncArg::None),
            ..memory()
        })
        .starts_with("--sync")
    );
    let reason = refusal(ServeArgs {
        rate_limit: Some(5),
        ..Default::default()
    });
    assert!(
        reason.starts_with("--rate-limit") && reason.contains("--auth"),
        "{reason}"
    );
    assert!(
        refusal(ServeArgs {
            auth_token: Some("t".repeat(16)),
            ..Default::default()
        })
        .starts_with("--auth-token")
    );
    assert!(
        refusal(ServeArgs {
            mirror_token: Some("t".into()),
            ..Default::default()
        })
        .starts_with("--mirror-token")
    );
    assert!(
        refusal(ServeArgs {
            mirror_ca_cert: Some("c".into()),
            ..Default::default()
        })
        .starts_with("--mirror-ca-cert")
    );
    let with_auth = ServeArgs {
        auth: true,
        auth_token: Some("t".repeat(16)),
        rate_limit: Some(5),
        ..Default::default()
    };
    assert!(with_auth.resolve().is_ok());
}

#[test]
fn a_setting_from_the_file_that_does_nothing_is_refused_too() {
    let f = file("memory = true\nsync = \"none\"\n");
    let args = ServeArgs {
        config: Some(f.path().into()),
        ..Default::default()
    };
    assert!(matches!(args.resolve(), Err(ConfigError::Invalid(r)) if r.starts_with("--sync")));
}

/// The sample config shipped in `packaging/`.
const SAMPLE: &str = include_str!("../../packaging/runnel.toml");

/// The keys `FileConfig` takes, as its `Deserialize` impl names them.
fn file_config_keys() -> &'static [&'static str] {
    struct KeysOf(Option<&'static [&'static str]>);
    impl<'de> serde::Deserializer<'de> for &mut KeysOf {
        type Error = serde::de::value::Error;
        fn deserialize_any<V: serde::de::Visitor<'de>>(
            self,
            _: V,
        ) -> Result<V::Value, Self::Error> {
            Err(serde::de::Error::custom("not a struct"))
        }
        fn deserialize_struct<V: serde::de::Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            self.0 = Some(fields);
            Err(serde::de::Error::custom("only the keys were wanted"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
            identifier ignored_any
        }
    }
    let mut keys = KeysOf(None);
    let _ = FileConfig::deserialize(&mut keys);
    keys.0.expect("FileConfig deserializes as a struct")
}

#[test]
fn the_sample_config_is_valid_and_its_set_keys_are_the_defaults() {
    parse_file(SAMPLE).expect("the sample parses");
    let f = file(SAMPLE);
    let sample = ServeArgs {
        config: Some(f.path().into()),
        ..Default::default()
    }
    .resolve()
    .expect("the sample resolves");
    let defaults = ServeArgs::default().resolve().unwrap();
    assert_eq!(format!("{sample:?}"), format!("{defaults:?}"));
}

/// The setting a line of the sample makes, set or commented out (`# key = value`): its key
/// and the line as it would be set.
fn sample_setting(line: &str) -> Option<(&str, &str)> {
    let setting = line.strip_prefix("# ").unwrap_or(line);
    let (key, _) = setting.split_once('=')?;
    let key = key.trim();
    file_config_keys().contains(&key).then_some((key, setting))
}

#[test]
fn the_sample_config_names_every_key_and_its_commented_examples_parse() {
    for key in file_config_keys() {
        assert!(
            SAMPLE
                .lines()
                .any(|line| sample_setting(line).is_some_and(|(k, _)| k == *key)),
            "packaging/runnel.toml lacks {key}"
        );
    }
    let every_example_set: String = SAMPLE
        .lines()
        .map(|line| sample_setting(line).map_or(line, |(_, setting)| setting))
        .flat_map(|line| [line, "\n"])
        .collect();
    parse_file(&every_example_set).expect("every example in the sample parses");
}
