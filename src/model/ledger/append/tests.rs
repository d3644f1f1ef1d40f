//! The Durable Streams append's rules, one test per rule and per precedence between two of them:
//! each sets up a request that more than one check refuses, and expects the one that comes first.

use bytes::Bytes;

use super::*;
use crate::model::ledger::testing::Fixture;
use crate::model::producer::{ProducerClaim, ProducerError};

const NOW: i64 = 1_000;

fn claim(epoch: u64, seq: u64) -> ProducerClaim {
    ProducerClaim {
        id: "p".into(),
        epoch,
        seq,
    }
}

/// A one-record `text/plain` append.
fn text(body: &'static str) -> AppendRequest<'static> {
    AppendRequest {
        content_type: Some("text/plain"),
        body: Bytes::from_static(body.as_bytes()),
        ..Default::default()
    }
}

fn apply(f: &mut Fixture, request: &AppendRequest<'_>) -> Result<Appended, Refusal> {
    let bodies = Ok(if request.body.is_empty() {
        Vec::new()
    } else {
        vec![request.body.clone()]
    });
    f.ledger().apply(Append { request, bodies }, NOW)
}

fn refusal(f: &mut Fixture, request: &AppendRequest<'_>) -> Refusal {
    match apply(f, request) {
        Err(refusal) => refusal,
        Ok(appended) => panic!("accepted: {appended:?}"),
    }
}

fn repeated(f: &mut Fixture, request: &AppendRequest<'_>) -> Repeated {
    match apply(f, request) {
        Ok(Appended::Repeated(repeated)) => repeated,
        other => panic!("not a repeat: {other:?}"),
    }
}

fn written(f: &mut Fixture, request: &AppendRequest<'_>) -> AppendAck {
    match apply(f, request) {
        Ok(Appended::Write { ack, .. }) => ack,
        other => panic!("not written: {other:?}"),
    }
}

/// A stream closed by producer `p`'s append (epoch 1, seq 0), after one record.
fn closed_by_producer() -> Fixture {
    let mut f = Fixture::text();
    written(
        &mut f,
        &AppendRequest {
            close: true,
            producer: Some(claim(1, 0)),
            ..text("a")
        },
    );
    f
}

#[test]
fn a_removed_stream_is_not_found_rather_than_gone() {
    let mut f = Fixture::text();
    f.removed = true;
    f.meta.soft_deleted = true;
    assert_eq!(refusal(&mut f, &text("a")), Refusal::NotFound);
}

#[test]
fn a_soft_deleted_stream_is_gone_rather_than_encrypted() {
    let mut f = Fixture::text();
    f.meta.soft_deleted = true;
    f.meta.extra_mut().cipher = Some("aegis-256".into());
    assert_eq!(refusal(&mut f, &text("a")), Refusal::Gone);
}

#[test]
fn an_encrypted_stream_refuses_before_its_closure_is_looked_at() {
    let mut f = Fixture::text();
    f.meta.extra_mut().cipher = Some("aegis-256".into());
    f.meta.closed = true;
    assert_eq!(refusal(&mut f, &text("a")), Refusal::Encrypted);
}

#[test]
fn closed_wins_over_a_content_type_mismatch() {
    let mut f = closed_by_producer();
    let other_type = AppendRequest {
        content_type: Some("application/json"),
        ..text("{}")
    };
    assert!(matches!(
        refusal(&mut f, &other_type),
        Refusal::Closed { .. }
    ));
}

#[test]
fn closed_wins_over_a_stale_producer_epoch() {
    let mut f = closed_by_producer();
    let stale = AppendRequest {
        producer: Some(claim(0, 5)),
        ..text("b")
    };
    assert!(matches!(refusal(&mut f, &stale), Refusal::Closed { .. }));
}

#[test]
fn a_retry_of_the_closing_append_is_acknowledged_once_the_close_is_durable() {
    let mut f = closed_by_producer();
    // Its content type is not looked at again: the stream is closed, and this is its close.
    let retry = AppendRequest {
        close: true,
        producer: Some(claim(1, 0)),
        content_type: Some("application/json"),
        ..text("a")
    };
    let repeated = repeated(&mut f, &retry);
    assert!(repeated.ack.duplicate && repeated.ack.closed);
    assert_eq!(repeated.ack.records, Some((0, 1)));
    assert_eq!(
        repeated.durable_before,
        DurableBefore {
            seq: 1,
            closed: true
        }
    );
}

#[test]
fn on_a_closed_stream_only_a_plain_close_without_a_body_repeats() {
    let mut f = closed_by_producer();
    let plain_close = AppendRequest {
        close: true,
        ..text("")
    };
    assert!(repeated(&mut f, &plain_close).ack.closed);
    let close_with_body = AppendRequest {
        close: true,
        ..text("b")
    };
    assert!(matches!(
        refusal(&mut f, &close_with_body),
        Refusal::Closed { .. }
    ));
    let other_producer_seq = AppendRequest {
        close: true,
        producer: Some(claim(1, 1)),
        ..text("")
    };
    assert!(matches!(
        refusal(&mut f, &other_producer_seq),
        Refusal::Closed { .. }
    ));
}

#[test]
fn a_content_type_mismatch_wins_over_a_producer_sequence_gap() {
    let mut f = Fixture::text();
    let request = AppendRequest {
        content_type: Some("application/json"),
        producer: Some(claim(0, 7)),
        ..text("{}")
    };
    assert_eq!(refusal(&mut f, &request), Refusal::ContentTypeMismatch);
}

#[test]
fn an_empty_body_is_not_held_to_the_content_type() {
    let mut f = Fixture::text();
    let close = AppendRequest {
        content_type: Some("application/json"),
        close: true,
        ..text("")
    };
    assert!(written(&mut f, &close).closed);
}

#[test]
fn a_producer_error_wins_over_a_record_match_mismatch() {
    let mut f = Fixture::json();
    let request = AppendRequest {
        content_type: Some("application/json"),
        producer: Some(claim(0, 3)),
        record_match: Some(9),
        ..text("1")
    };
    assert_eq!(
        refusal(&mut f, &request),
        Refusal::Producer(ProducerError::SequenceGap {
            expected: 0,
            received: 3
        })
    );
}

#[test]
fn a_producer_duplicate_is_acknowledged_before_record_match_and_stream_seq_are_checked() {
    let mut f = Fixture::json();
    let first = AppendRequest {
        content_type: Some("application/json"),
        producer: Some(claim(0, 0)),
        stream_seq: Some("5"),
        ..text("1")
    };
    written(&mut f, &first);
    written(
        &mut f,
        &AppendRequest {
            producer: None,
            stream_seq: None,
            ..first.clone()
        },
    );
    // Now the record match (0) and the Stream-Seq ("5") would both be refused.
    let retry = AppendRequest {
        record_match: Some(0),
        ..first
    };
    let repeated = repeated(&mut f, &retry);
    assert_eq!(repeated.ack.records, Some((0, 1)), "the original's records");
    assert_eq!(repeated.ack.tail.seq, 2);
    assert_eq!(repeated.durable_before.seq, 1, "the original's, durable");
}

#[test]
fn a_record_match_on_a_stream_that_is_not_json_is_refused_as_not_record_aware() {
    let mut f = Fixture::text();
    let request = AppendRequest {
        record_match: Some(9),
        ..text("a")
    };
    assert_eq!(refusal(&mut f, &request), Refusal::NotRecordAware);
}

#[test]
fn a_record_mismatch_wins_over_a_stream_seq_regression() {
    let mut f = Fixture::json().at(2);
    f.meta.extra_mut().last_stream_seq = Some("5".into());
    let request = AppendRequest {
        content_type: Some("application/json"),
        record_match: Some(1),
        stream_seq: Some("4"),
        ..text("1")
    };
    assert!(matches!(
        refusal(&mut f, &request),
        Refusal::RecordMismatch {
            expected: 1,
            next: 2,
            ..
        }
    ));
}

#[test]
fn a_stream_seq_must_be_byte_wise_greater_than_the_last_one() {
    let mut f = Fixture::text();
    f.meta.extra_mut().last_stream_seq = Some("5".into());
    let with_seq = |seq| AppendRequest {
        stream_seq: Some(seq),
        ..text("a")
    };
    assert!(matches!(
        refusal(&mut f, &with_seq("5")),
        Refusal::StreamSeqRegression { .. }
    ));
    assert!(
        matches!(
            refusal(&mut f, &with_seq("10")),
            Refusal::StreamSeqRegression { .. }
        ),
        "byte-wise, not numeric"
    );
    written(&mut f, &with_seq("6"));
    assert_eq!(f.meta.extra().last_stream_seq.as_deref(), Some("6"));
}

#[test]
fn every_check_wins_over_a_body_that_does_not_split() {
    let mut f = Fixture::json();
    f.meta.extra_mut().last_stream_seq = Some("5".into());
    let request = AppendRequest {
        content_type: Some("application/json"),
        stream_seq: Some("4"),
        ..text("not json")
    };
    let malformed = || Err("not JSON".to_string());
    let refused = f.ledger().apply(
        Append {
            request: &request,
            bodies: malformed(),
        },
        NOW,
    );
    assert!(matches!(refused, Err(Refusal::StreamSeqRegression { .. })));
    let request = AppendRequest {
        stream_seq: Some("6"),
        ..request
    };
    let refused = f.ledger().apply(
        Append {
            request: &request,
            bodies: malformed(),
        },
        NOW,
    );
    assert_eq!(
        refused.unwrap_err(),
        Refusal::MalformedBody("not JSON".into())
    );
}

#[test]
fn a_refused_append_changes_nothing() {
    let mut f = Fixture::text().at(3);
    f.meta.extra_mut().last_stream_seq = Some("5".into());
    let before = (f.meta.clone(), f.producers.clone(), f.last_access_ms);
    let request = AppendRequest {
        producer: Some(claim(0, 0)),
        stream_seq: Some("4"),
        close: true,
        ..text("a")
    };
    refusal(&mut f, &request);
    assert_eq!(
        (f.meta.clone(), f.producers.clone(), f.last_access_ms),
        before
    );
}

#[test]
fn an_accepted_append_moves_the_tail_renews_the_ttl_and_never_stamps_back_in_time() {
    let mut f = Fixture::text().at(3);
    f.meta.last_timestamp_ms = NOW + 500; // a client timestamp ahead of this clock
    let ack = written(
        &mut f,
        &AppendRequest {
            producer: Some(claim(2, 0)),
            ..text("ab")
        },
    );
    assert_eq!(ack.tail, Offset::new(4, 5));
    assert_eq!(ack.records, Some((3, 4)));
    assert_eq!(ack.timestamp_ms, NOW + 500);
    assert_eq!(f.last_access_ms, NOW);
    assert_eq!(f.producers["p"].records, (3, 4));
}

#[test]
fn a_close_alone_adds_no_record_and_keeps_the_last_timestamp() {
    let mut f = Fixture::text().at(1);
    f.meta.last_timestamp_ms = 7;
    let ack = written(
        &mut f,
        &AppendRequest {
            close: true,
            ..text("")
        },
    );
    assert_eq!((ack.tail.seq, ack.timestamp_ms, ack.closed), (1, 7, true));
    assert!(f.meta.closed && f.meta.extra().closed_by.is_none());
}

#[test]
fn only_a_gap_or_an_early_new_epoch_waits_for_the_producers_earlier_appends() {
    let mut f = Fixture::text();
    f.producers
        .insert("p".into(), ProducerState::first(1, 0, (0, 1)));
    let gap = AppendRequest {
        producer: Some(claim(1, 2)),
        ..text("a")
    };
    let early_epoch = AppendRequest {
        producer: Some(claim(2, 1)),
        ..text("a")
    };
    let stale = AppendRequest {
        producer: Some(claim(0, 0)),
        ..text("a")
    };
    let check = |f: &mut Fixture, r: &AppendRequest<'_>| r.check(&f.ledger()).unwrap_err();
    assert!(check(&mut f, &gap).waits_for_its_producer());
    assert!(check(&mut f, &early_epoch).waits_for_its_producer());
    assert!(!check(&mut f, &stale).waits_for_its_producer());
    assert!(!check(&mut f, &stale).may_pass_later());
}

#[test]
fn only_a_record_match_ahead_of_the_tail_may_pass_later() {
    let mut f = Fixture::json().at(2);
    let matching = |expected| AppendRequest {
        content_type: Some("application/json"),
        record_match: Some(expected),
        ..text("1")
    };
    let ahead = matching(3).check(&f.ledger()).unwrap_err();
    assert!(ahead.may_pass_later() && !ahead.waits_for_its_producer());
    assert!(!matching(1).check(&f.ledger()).unwrap_err().may_pass_later());
}

#[test]
fn an_append_stores_the_metadata_only_when_it_closes_or_carries_a_stream_seq() {
    let mut f = Fixture::text();
    let meta_changed = |f: &mut Fixture, request: &AppendRequest<'_>| match apply(f, request) {
        Ok(Appended::Write { meta_changed, .. }) => meta_changed,
        other => panic!("{other:?}"),
    };
    assert!(!meta_changed(&mut f, &text("a")));
    let sequenced = AppendRequest {
        stream_seq: Some("1"),
        ..text("b")
    };
    assert!(meta_changed(&mut f, &sequenced));
    let close = AppendRequest {
        close: true,
        ..text("")
    };
    assert!(meta_changed(&mut f, &close));
}
