//! The `--config` file: `config::parse_file` (TOML), and `ServeArgs::resolve` over it.
//!
//! Input: a config file's text.
//! Properties: a file that parses is valid TOML; written back out by a TOML serialiser it parses
//! to the same settings; every key is optional (an accepted file less any one key is accepted);
//! an accepted file resolves (or is refused as invalid, never as unreadable or unparsable), and
//! the resolved timeouts can be added to the current instant, as the server does.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Instant;

use libfuzzer_sys::fuzz_target;
use runnel::config::{ConfigError, ServeArgs, parse_file};

/// A scratch file for `resolve`, one per fuzzing process, removed when it exits normally.
fn scratch() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        std::env::temp_dir().join(format!("runnel-fuzz-config-{}.toml", std::process::id()))
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(config) = parse_file(text) else {
        return;
    };

    std::fs::write(scratch(), text).expect("write the scratch config");
    let resolved = ServeArgs {
        config: Some(scratch().clone()),
        ..Default::default()
    }
    .resolve();
    let _ = std::fs::remove_file(scratch());
    match resolved {
        Ok(settings) => {
            let now = Instant::now();
            for (name, timeout) in [
                ("long_poll_timeout", settings.long_poll_timeout),
                ("sse_max_duration", settings.sse_max_duration),
            ] {
                assert!(
                    now.checked_add(timeout).is_some(),
                    "{name} of {timeout:?} overflows a deadline (Instant::now() + {name} panics)"
                );
            }
        }
        Err(ConfigError::Invalid(_)) => {}
        Err(e) => panic!("an accepted config does not resolve: {e}"),
    }

    // toml::Table holds integers as i64; a larger u64 setting cannot be written back this way.
    let table: toml::Table = match toml::from_str(text) {
        Ok(table) => table,
        Err(e) if e.message().contains("too large") => return,
        Err(e) => panic!("an accepted config must be valid TOML: {e}"),
    };
    let rewritten = toml::to_string(&table).expect("a TOML table serialises");
    let again = parse_file(&rewritten)
        .unwrap_or_else(|e| panic!("rewritten config {rewritten:?} is refused: {e}"));
    assert_eq!(format!("{again:?}"), format!("{config:?}"));
    for key in table.keys() {
        let mut fewer = table.clone();
        fewer.remove(key);
        let text = toml::to_string(&fewer).expect("a TOML table serialises");
        assert!(
            parse_file(&text).is_ok(),
            "a config without {key:?} is refused: {text:?}"
        );
    }
});
