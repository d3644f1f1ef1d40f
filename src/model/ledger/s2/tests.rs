//! The S2 append's rules, one test per rule and per precedence between two of them.

use bytes::Bytes;

use super::*;
use crate::model::ledger::testing::Fixture;
use crate::model::offset::Offset;
use crate::model::s2::{S2Record, StreamConfig, TimestampError, TimestampingMode};

const NOW: i64 = 1_000;

fn record(body: &'static str) -> CheckedRecord {
    CheckedRecord {
        record: S2Record {
            timestamp: None,
            headers: Vec::new(),
            body: Bytes::from_static(body.as_bytes()),
        },
        command: None,
    }
}

fn timed(body: &'static str, timestamp: u64) -> CheckedRecord {
    let mut r = record(body);
    r.record.timestamp = Some(timestamp);
    r
}

fn command(command: RecordCommand) -> CheckedRecord {
    let (name, body): (&'static str, Bytes) = match &command {
        RecordCommand::Fence(token) => ("fence", Bytes::copy_from_slice(token.as_bytes())),
        RecordCommand::Trim(point) => ("trim", Bytes::copy_from_slice(&point.to_be_bytes())),
    };
    CheckedRecord {
        record: S2Record {
            timestamp: None,
            headers: vec![(Bytes::new(), Bytes::from_static(name.as_bytes()))],
            body,
        },
        command: Some(command),
    }
}

fn batch(records: Vec<CheckedRecord>) -> S2Sequence<'static> {
    S2Sequence {
        records,
        fencing_token: None,
        match_seq_num: None,
        fingerprint: None,
    }
}

fn refusal(f: &mut Fixture, batch: S2Sequence<'_>) -> Refusal {
    f.ledger().apply(batch, NOW).unwrap_err()
}

fn sequenced(f: &mut Fixture, batch: S2Sequence<'_>) -> Sequenced {
    f.ledger().apply(batch, NOW).unwrap()
}

/// A stream whose records must carry a client timestamp.
fn requiring_timestamps() -> Fixture {
    let mut f = Fixture::text();
    f.meta.extra_mut().s2_config = Some(StreamConfig {
        timestamping: Some(Timestamping {
            mode: Some(TimestampingMode::ClientRequire),
            uncapped: None,
        }),
        ..StreamConfig::default()
    });
    f
}

#[test]
fn a_soft_deleted_stream_is_gone_before_its_key_is_compared() {
    let mut f = Fixture::text();
    f.meta.soft_deleted = true;
    f.meta.extra_mut().key_fingerprint = Some("k1".into());
    let other_key = S2Sequence {
        fingerprint: Some("k2"),
        ..batch(vec![record("a")])
    };
    assert_eq!(refusal(&mut f, other_key), Refusal::Gone);
}

#[test]
fn a_key_mismatch_wins_over_a_closed_stream() {
    let mut f = Fixture::text();
    f.meta.closed = true;
    f.meta.extra_mut().key_fingerprint = Some("k1".into());
    let other_key = S2Sequence {
        fingerprint: Some("k2"),
        ..batch(vec![record("a")])
    };
    assert_eq!(refusal(&mut f, other_key), Refusal::KeyMismatch);
}

#[test]
fn a_closed_stream_wins_over_a_fencing_token_mismatch() {
    let mut f = Fixture::text();
    f.meta.closed = true;
    let fenced = S2Sequence {
        fencing_token: Some("not-it"),
        ..batch(vec![record("a")])
    };
    assert_eq!(refusal(&mut f, fenced), Refusal::ClosedToS2);
}

#[test]
fn a_fencing_token_mismatch_wins_over_a_match_seq_num_mismatch() {
    let mut f = Fixture::text().at(4);
    f.meta.extra_mut().fencing_token = "mine".into();
    let both = S2Sequence {
        fencing_token: Some("yours"),
        match_seq_num: Some(1),
        ..batch(vec![record("a")])
    };
    assert_eq!(
        refusal(&mut f, both),
        Refusal::FencingMismatch {
            current: "mine".into()
        }
    );
}

#[test]
fn a_match_seq_num_mismatch_wins_over_a_missing_required_timestamp() {
    let mut f = requiring_timestamps().at(4);
    let both = S2Sequence {
        match_seq_num: Some(1),
        ..batch(vec![record("untimed")])
    };
    assert_eq!(refusal(&mut f, both), Refusal::SeqNumMismatch { next: 4 });
}

#[test]
fn a_batch_refused_at_its_last_record_changes_nothing() {
    let mut f = requiring_timestamps().at(2);
    let before = f.meta.clone();
    let refused = batch(vec![
        command(RecordCommand::Fence("f".into())),
        command(RecordCommand::Trim(1)),
        timed("a", 5),
        record("untimed"),
    ]);
    assert_eq!(
        refusal(&mut f, refused),
        Refusal::Timestamp(TimestampError::Required)
    );
    assert_eq!(f.meta, before);
    assert_eq!(f.last_access_ms, 0, "not renewed");
}

#[test]
fn the_timestamping_mode_is_the_streams_configured_one() {
    let mut f = Fixture::text();
    f.meta.extra_mut().s2_config = Some(StreamConfig {
        timestamping: Some(Timestamping {
            mode: Some(TimestampingMode::Arrival),
            uncapped: None,
        }),
        ..StreamConfig::default()
    });
    let done = sequenced(&mut f, batch(vec![timed("a", 5)]));
    assert_eq!(done.records[0].timestamp_ms, NOW, "the client's is ignored");
    let mut prefer = Fixture::text();
    let done = sequenced(&mut prefer, batch(vec![timed("a", 5)]));
    assert_eq!(done.records[0].timestamp_ms, 5, "client-prefer by default");
}

#[test]
fn timestamps_never_go_back_along_the_stream() {
    let mut f = Fixture::text().at(1);
    f.meta.last_timestamp_ms = 600;
    let records = vec![timed("a", 500), timed("b", 700), timed("c", 650)];
    let done = sequenced(&mut f, batch(records));
    let stamps: Vec<_> = done.records.iter().map(|r| r.timestamp_ms).collect();
    assert_eq!(stamps, [600, 700, 700]);
    assert_eq!(done.ack.start.timestamp, 600);
    assert_eq!(
        done.ack.end,
        S2Position {
            seq_num: 4,
            timestamp: 700
        }
    );
    assert_eq!(f.meta.last_timestamp_ms, 700);
    assert_eq!(f.last_access_ms, NOW, "renewed");
}

#[test]
fn a_trim_never_reaches_past_its_own_record_and_the_furthest_trim_is_kept_pending() {
    let mut f = Fixture::text().at(3);
    f.meta.extra_mut().pending_trim = Some(2);
    let done = sequenced(
        &mut f,
        batch(vec![
            command(RecordCommand::Trim(100)),
            command(RecordCommand::Trim(1)),
        ]),
    );
    assert_eq!(
        done.trim,
        Some(4),
        "capped at the first trim record's own seq + 1"
    );
    assert!(done.meta_changed);
    assert_eq!(f.meta.extra().pending_trim, Some(4));
    assert!(done.records.iter().all(|r| r.command && r.byte_len() == 0));
    assert_eq!(f.meta.tail, Offset::new(5, 3), "commands take no bytes");
    let nearer = sequenced(&mut f, batch(vec![command(RecordCommand::Trim(2))]));
    assert_eq!(nearer.trim, Some(2));
    assert_eq!(
        f.meta.extra().pending_trim,
        Some(4),
        "the furthest stays pending"
    );
}

#[test]
fn a_fence_command_sets_the_token_that_later_appends_must_carry() {
    let mut f = Fixture::text();
    let done = sequenced(
        &mut f,
        batch(vec![command(RecordCommand::Fence("t".into()))]),
    );
    assert!(done.meta_changed);
    assert_eq!(f.meta.extra().fencing_token, "t");
    let unfenced = sequenced(&mut f, batch(vec![record("a")]));
    assert!(!unfenced.meta_changed, "no token given: no fencing");
    let fenced = S2Sequence {
        fencing_token: Some("t"),
        ..batch(vec![record("b")])
    };
    sequenced(&mut f, fenced);
}

#[test]
fn the_first_key_a_stream_is_written_with_becomes_its_key() {
    let mut f = Fixture::text();
    let keyed = S2Sequence {
        fingerprint: Some("k1"),
        ..batch(vec![record("a")])
    };
    assert!(sequenced(&mut f, keyed).meta_changed);
    assert_eq!(f.meta.extra().key_fingerprint.as_deref(), Some("k1"));
    let again = S2Sequence {
        fingerprint: Some("k1"),
        ..batch(vec![record("b")])
    };
    assert!(!sequenced(&mut f, again).meta_changed);
}

#[test]
fn a_json_stream_refuses_command_records() {
    let mut records = vec![record("1"), command(RecordCommand::Trim(0))];
    assert_eq!(
        prepare(&mut records, true, false, None),
        Err(Refusal::CommandOnJsonStream)
    );
}

#[test]
fn a_json_stream_stores_each_body_as_one_canonical_json_value() {
    let mut records = vec![record(" { \"a\" : 1 } ")];
    assert_eq!(prepare(&mut records, true, false, None), Ok(None));
    assert_eq!(&records[0].record.body[..], br#"{"a":1}"#);
    let mut two = vec![record("1 2")];
    assert!(matches!(
        prepare(&mut two, true, false, None),
        Err(Refusal::NotOneJsonValue(_))
    ));
}

#[test]
fn the_json_rules_are_checked_before_a_key_is_asked_for() {
    let mut records = vec![command(RecordCommand::Trim(0))];
    assert_eq!(
        prepare(&mut records, true, true, None),
        Err(Refusal::CommandOnJsonStream)
    );
}

#[test]
fn an_encrypted_stream_takes_records_only_with_a_key_and_seals_all_but_commands() {
    let mut records = vec![record("secret"), command(RecordCommand::Trim(0))];
    assert_eq!(
        prepare(&mut records, false, true, None),
        Err(Refusal::KeyRequired)
    );
    let key = RecordKey::from_base64(&base64_key()).unwrap();
    let fingerprint = prepare(&mut records, false, true, Some(&key)).unwrap();
    assert_eq!(fingerprint, Some(key.fingerprint()));
    assert_ne!(&records[0].record.body[..], b"secret");
    assert_eq!(&records[1].record.body[..], &0u64.to_be_bytes());
}

fn base64_key() -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode([7u8; 32])
}
