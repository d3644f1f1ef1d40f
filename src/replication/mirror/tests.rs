//! The messages a mirror takes from its upstream.

use super::*;

#[test]
fn a_message_of_an_unknown_type_is_skipped_and_a_malformed_one_refused() {
    let unknown = r#"{"@type": "runnel:SomethingNewer", "stream": "http://h/b/s"}"#;
    assert!(known_message(unknown).unwrap().is_none());
    let gap = r#"{"@type": "GapSignal", "oldestAvailable": 3}"#;
    assert!(matches!(known_message(gap), Ok(Some(Message::Gap(_)))));
    assert!(known_message("not json").is_err());
    assert!(known_message(r#"{"@type": "GapSignal", "oldestAvailable": "x"}"#).is_err());
}
