//! The StreamLD wire format: messages parsed and written, records carried in envelopes, and
//! the bounds on what an upstream may send.

use super::*;
use proptest::prelude::*;
use serde_json::json;

#[test]
fn cursors_are_canonical_non_negative_integers() {
    assert_eq!(parse_cursor("0"), Some(0));
    assert_eq!(parse_cursor("42"), Some(42));
    assert_eq!(parse_cursor(" 7 "), Some(7));
    for bad in ["", "1x", "-1", "+1", "01", "1.0", "18446744073709551616"] {
        assert_eq!(parse_cursor(bad), None, "{bad:?}");
    }
}

#[test]
fn a_chunk_continues_a_reader_only_from_its_exact_next_record() {
    assert!(continues(5, Some(5)));
    assert!(
        !continues(5, Some(7)),
        "records 5 and 6 were trimmed under the reader"
    );
    assert!(!continues(5, None));
}

#[test]
fn stream_iris_name_their_key_whatever_it_holds() {
    for key in [
        "/docs/a b",
        "/docs/a%20b",
        "/docs/users/42",
        "/docs/q?x#y",
        "/docs/\u{e9}",
    ] {
        let iri = stream_iri("http://up:1", key);
        assert!(!iri.contains(' '), "{iri}");
        assert_eq!(iri_path(&iri).as_deref(), Some(key), "{iri}");
    }
    assert_eq!(iri_path("/docs/x").as_deref(), Some("/docs/x"));
    assert_eq!(iri_path("http://up:1").as_deref(), Some(""));
    assert_eq!(
        iri_path("http://up:1/docs/x?y#z").as_deref(),
        Some("/docs/x")
    );
    assert_eq!(iri_path("http://up:1/docs/%FF"), None);
}

#[test]
fn a_subscription_request_parses_with_short_names_and_context() {
    let text = r#"{"@context":{"@vocab":"https://openfaster.org/streamld#"},
        "@type":"SubscriptionRequest","stream":"http://up/b/s","after":41}"#;
    assert_eq!(
        Message::parse(text).unwrap(),
        Message::Subscribe(SubscriptionRequest {
            stream: "http://up/b/s".into(),
            after: Some(41),
            ..Default::default()
        })
    );
}

#[test]
fn a_replicas_join_parses_the_same_by_the_direct_path_and_is_bounded() {
    let cursors: std::collections::BTreeMap<String, u64> =
        [("a".to_string(), 3), ("streamld:b".to_string(), 0)].into();
    let join = Message::Subscribe(SubscriptionRequest {
        stream: "http://up/b".into(),
        cursors: Some(cursors),
        last_timestamps: Some([("a".to_string(), -5)].into()),
        ..Default::default()
    });
    let text = join.to_json();
    assert_eq!(Message::parse_from_replica(&text).unwrap(), join);
    assert_eq!(
        Message::parse(&text).unwrap(),
        join,
        "stream names travel as sent"
    );
    // Other spellings take the general path, a mixed one included.
    let mixed = r#"{"@type":"SubscriptionRequest","stream":"http://up/b/s","streamld:after":4}"#;
    let Ok(Message::Subscribe(request)) = Message::parse_from_replica(mixed) else {
        panic!()
    };
    assert_eq!(request.after, Some(4));
    let prefixed = r#"{"@type":"streamld:SubscriptionRequest","streamld:stream":"http://up/b/s"}"#;
    assert!(matches!(
        Message::parse_from_replica(prefixed),
        Ok(Message::Subscribe(_))
    ));

    let many: String = (0..=MAX_CURSORS)
        .map(|i| format!("\"{i}\":0"))
        .collect::<Vec<_>>()
        .join(",");
    let text = format!(
        r#"{{"@type":"SubscriptionRequest","stream":"http://up/b","runnel:cursors":{{{many}}}}}"#
    );
    assert_eq!(
        Message::parse_from_replica(&text),
        Err(MessageError::TooLarge)
    );
    let spelled_otherwise = text.replace("\"stream\"", "\"streamld:stream\"");
    assert_eq!(
        Message::parse_from_replica(&spelled_otherwise),
        Err(MessageError::TooLarge)
    );
}

#[test]
fn full_iris_and_prefixed_names_are_accepted_too() {
    let text = r#"{"@type":"https://openfaster.org/streamld#SubscriptionRequest",
        "https://openfaster.org/streamld#stream":"http://up/b/s","streamld:after":0}"#;
    let Message::Subscribe(request) = Message::parse(text).unwrap() else {
        panic!()
    };
    assert_eq!(request.after, Some(0));
    let gap =
        r#"{"@type":"streamld:GapSignal","https://openfaster.org/streamld#oldestAvailable":7}"#;
    assert_eq!(
        Message::parse(gap).unwrap(),
        Message::Gap(GapSignal {
            oldest_available: Some(7),
            ..Default::default()
        })
    );
}

#[test]
fn a_frame_round_trips_with_its_envelope() {
    let frame = Message::Frame(Box::new(ReplicationFrame {
        upstream_next: Some(9),
        cursor: 3,
        event: EventEnvelope {
            sequence: 3,
            stream_id: "http://up/b/s".into(),
            is_snapshot: false,
            payload: json!({"n": 1}),
            encoding: Some(PayloadEncoding::Json),
            offset: Some("0000000000000002_0000000000000014".into()),
            timestamp: Some(5),
            headers: vec![("aw==".into(), "dg==".into())],
            command: false,
            starts_unit: true,
        },
    }));
    let text = frame.to_json();
    assert!(text.contains(r#""@type":"EventEnvelope""#) && text.contains("@context"));
    assert_eq!(Message::parse(&text).unwrap(), frame);
}

#[test]
fn an_sse_event_is_its_envelope_on_one_line_under_its_cursor() {
    let event = EventEnvelope {
        sequence: 7,
        stream_id: "http://up/b/s".into(),
        is_snapshot: false,
        payload: json!({"text": "two\nlines"}),
        encoding: Some(PayloadEncoding::Json),
        offset: Some("0000000000000006_0000000000000090".into()),
        timestamp: Some(5),
        headers: vec![],
        command: false,
        starts_unit: true,
    };
    let mut out = b"earlier".to_vec();
    write_sse_event(&mut out, &event);
    let text = std::str::from_utf8(&out).unwrap();
    let rest = text.strip_prefix("earlier").unwrap();
    let lines: Vec<&str> = rest.split('\n').collect();
    assert_eq!(lines.len(), 5, "{rest:?}");
    assert_eq!(lines[..2], ["id: 7", "event: event"]);
    assert_eq!(lines[3..], ["", ""]);
    let data: Value = serde_json::from_str(lines[2].strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(data["@type"], "EventEnvelope");
    assert_eq!(data["@context"]["@vocab"], NAMESPACE);
    assert_eq!(data["@context"]["runnel"], RUNNEL_NAMESPACE);
    let back: EventEnvelope = serde_json::from_value(data).unwrap();
    assert_eq!(back, event);
}

#[test]
fn records_that_would_not_travel_as_json_or_text_go_as_base64_and_come_back_exact() {
    // 126 levels parse on their own; inside a frame they would be 128, past serde_json's
    // limit, and no receiver could read the frame.
    let deep = format!("{}1{}", "[".repeat(126), "]".repeat(126));
    for (content_type, body, encoding) in [
        ("application/json", deep.as_str(), PayloadEncoding::Base64),
        ("application/json", "[[1]]", PayloadEncoding::Json),
        ("text/plain", "a\u{1}b", PayloadEncoding::Base64),
        ("text/plain", "tab\tand\nlines\r\n", PayloadEncoding::Text),
    ] {
        let record = crate::model::record::lay_out(
            Offset::START,
            1,
            vec![Bytes::copy_from_slice(body.as_bytes())],
        )
        .remove(0);
        let event = envelope("http://up/b/s", content_type, &record);
        assert_eq!(event.encoding, Some(encoding), "{content_type} {body:?}");
        let frame = Message::Frame(Box::new(ReplicationFrame {
            cursor: event.sequence,
            event,
            upstream_next: None,
        }));
        let Message::Frame(back) = Message::parse(&frame.to_json()).unwrap() else {
            panic!("not a frame")
        };
        assert_eq!(record_of(&back.event).unwrap().body, record.body);
    }
}

#[test]
fn an_upstream_message_is_refused_before_it_is_parsed_when_it_holds_too_many_values() {
    let values = vec!["0"; MAX_UPSTREAM_VALUES + 1].join(",");
    let text = format!(r#"{{"@type":"GapSignal","j":[{values}]}}"#);
    assert_eq!(
        Message::parse_from_upstream(&text),
        Err(MessageError::TooManyValues)
    );
    let gap = Message::Gap(GapSignal::default());
    assert_eq!(Message::parse_from_upstream(&gap.to_json()), Ok(gap));
}

#[test]
fn record_payloads_travel_exactly_even_when_they_look_like_vocabulary() {
    for payload in [
        json!({"@context": 1, "streamld:a": 1}),
        json!({"metadata": {"@type": "streamld:X"}}),
        serde_json::from_str::<serde_json::Value>("-0").unwrap(),
    ] {
        let frame = Message::Frame(Box::new(ReplicationFrame {
            upstream_next: None,
            cursor: 0,
            event: EventEnvelope {
                sequence: 0,
                stream_id: "http://up/b/s".into(),
                is_snapshot: false,
                payload: payload.clone(),
                encoding: Some(PayloadEncoding::Json),
                offset: None,
                timestamp: None,
                headers: vec![],
                command: false,
                starts_unit: true,
            },
        }));
        let Message::Frame(back) = Message::parse(&frame.to_json()).unwrap() else {
            panic!("not a frame")
        };
        assert_eq!(back.event.payload.to_string(), payload.to_string());
    }
}

#[test]
fn invalid_messages_are_rejected_with_a_reason() {
    assert!(matches!(
        Message::parse("[1]"),
        Err(MessageError::NotJson(_))
    ));
    assert!(matches!(Message::parse("{"), Err(MessageError::NotJson(_))));
    assert!(matches!(
        Message::parse(r#"{"@type":"Nope"}"#),
        Err(MessageError::UnknownType(_))
    ));
    assert!(matches!(
        Message::parse(r#"{"stream":"x"}"#),
        Err(MessageError::UnknownType(_))
    ));
    assert!(matches!(
        Message::parse(r#"{"@type":"SubscriptionRequest","after":1}"#),
        Err(MessageError::Malformed { .. })
    ));
    assert!(matches!(
        Message::parse(r#"{"@type":"ReplicationFrame","cursor":-1,"event":{}}"#),
        Err(MessageError::Malformed { .. })
    ));
}

#[test]
fn records_travel_in_envelopes_and_come_back_unchanged() {
    let record = |body: &[u8], command: bool| Record {
        seq: 4,
        pos: 10,
        timestamp_ms: 99,
        arrival_ms: 99,
        starts_unit: true,
        headers: vec![(Bytes::from("k"), Bytes::from_static(&[0, 255]))],
        body: Bytes::copy_from_slice(body),
        command,
    };
    for (content_type, body, encoding) in [
        (
            "application/json",
            &br#"{"a":[1,2.50]}"#[..],
            PayloadEncoding::Json,
        ),
        ("text/plain", b"caf\xc3\xa9", PayloadEncoding::Text),
        (
            "application/octet-stream",
            &[0u8, 1, 255][..],
            PayloadEncoding::Base64,
        ),
        ("text/plain", &[0xffu8, 0xfe][..], PayloadEncoding::Base64),
    ] {
        let original = record(body, false);
        let event = envelope("http://up/b/s", content_type, &original);
        assert_eq!(event.sequence, 5);
        assert_eq!(event.encoding, Some(encoding), "{content_type}");
        assert_eq!(record_of(&event), Some(original));
    }
    let command = record(b"tok", true);
    assert_eq!(
        record_of(&envelope("u", "application/json", &command)),
        Some(command)
    );
}

#[test]
fn sequences_count_from_one() {
    assert_eq!(sequence_of(0), 1);
}

proptest! {
    #[test]
    fn arbitrary_text_never_panics(text in "\\PC*") {
        let _ = Message::parse(&text);
    }
}
