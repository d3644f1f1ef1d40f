//! The storage encoding: keys, runs of records, filed runs, trims and producer states, each
//! decoded back as encoded, and older versions still read.

use super::*;
use proptest::prelude::*;

fn held(stored: Stored) -> Vec<Record> {
    match stored {
        Stored::Held(records) => records,
        Stored::Filed(_) => panic!("records held in the value decoded as filed"),
    }
}

proptest! {
    #[test]
    fn records_round_trip(
        seq in any::<u64>(), pos in any::<u64>(), ts in any::<i64>(), arrival in any::<i64>(),
        starts in any::<bool>(),
        command in any::<bool>(),
        headers in proptest::collection::vec((any::<Vec<u8>>(), any::<Vec<u8>>()), 0..4),
        body in any::<Vec<u8>>(),
    ) {
        let record = Record {
            seq, pos, timestamp_ms: ts, arrival_ms: arrival, starts_unit: starts,
            headers: headers.into_iter().map(|(n, v)| (Bytes::from(n), Bytes::from(v))).collect(),
            body: Bytes::from(body),
            command,
        };
        prop_assert_eq!(decode_record(seq, Bytes::from(encode_record(&record))).unwrap(), record);
    }

    #[test]
    fn runs_round_trip_whatever_their_split(
        first in 0u64..u64::MAX / 2,
        bodies in proptest::collection::vec(0usize..40_000, 1..12),
    ) {
        let bodies = bodies.into_iter().map(|len| Bytes::from(vec![7; len])).collect();
        let records = crate::model::record::lay_out(
            crate::model::Offset::new(first, first), 0, bodies);
        let mut decoded = Vec::new();
        for run in runs(&records) {
            let kept = run.records();
            prop_assert!(kept.len() == 1 || kept.iter().map(encoded_len).sum::<usize>() <= RUN_BYTES);
            let key_seq = record_seq(&run.key(9)).unwrap();
            decoded.extend(held(decode_stored(key_seq, Bytes::from(run.encode())).unwrap()));
        }
        prop_assert_eq!(decoded, records);
    }

    #[test]
    fn filed_runs_round_trip_their_fields_and_places(
        first in 0u64..u64::MAX / 2,
        bodies in proptest::collection::vec(0usize..100, 1..4000),
        file in any::<u64>(),
    ) {
        let bodies = bodies.into_iter().map(|len| Bytes::from(vec![7; len])).collect();
        let records = crate::model::record::lay_out(
            crate::model::Offset::new(first, first), 0, bodies);
        let places: Vec<u64> = records.iter().map(|r| r.pos * 3).collect();
        let mut at = 0;
        let mut decoded = Vec::new();
        for run in filed_runs(&records) {
            let kept = run.records().len();
            let value = run.encode_filed(file, &places[at..at + kept]);
            prop_assert!(kept == 1 || value.len() <= RUN_BYTES + 21);
            at += kept;
            let key_seq = record_seq(&run.key(9)).unwrap();
            let Stored::Filed(run) = decode_stored(key_seq, Bytes::from(value)).unwrap() else {
                panic!("a filed run decoded as held records");
            };
            prop_assert_eq!(run.file, file);
            decoded.extend(run.records);
        }
        prop_assert_eq!(decoded.len(), records.len());
        for (filed, record) in decoded.iter().zip(&records) {
            prop_assert_eq!(filed.place, record.pos * 3);
            prop_assert_eq!(filed.len, record.body.len() as u64);
            prop_assert_eq!(filed.next_offset(), record.next_offset());
            prop_assert_eq!(&filed.record, &Record { body: Bytes::new(), ..record.clone() });
        }
    }

    #[test]
    fn garbage_never_panics(value in any::<Vec<u8>>()) {
        let mut run = vec![RUN_VERSION];
        run.extend_from_slice(&value);
        let _ = decode_stored(u64::MAX - 1, Bytes::from(run));
        let mut filed = vec![FILED_RUN_VERSION];
        filed.extend_from_slice(&value);
        let _ = decode_stored(u64::MAX - 1, Bytes::from(filed));
        let _ = decode_stored(0, Bytes::from(value.clone()));
        let _ = decode_producer(&value);
    }

    #[test]
    fn producer_states_round_trip(
        epoch in any::<u64>(), last_seq in any::<u64>(), records in any::<(u64, u64)>(),
        earlier in proptest::collection::vec(any::<(u64, u64, u64)>(), 0..=16),
    ) {
        let state = ProducerState { epoch, last_seq, records, earlier };
        prop_assert_eq!(decode_producer(&encode_producer(&state)).unwrap(), state);
    }
}

#[test]
fn a_record_at_the_last_seq_is_corrupt() {
    let record = Record {
        seq: u64::MAX,
        pos: 0,
        timestamp_ms: 0,
        arrival_ms: 0,
        starts_unit: true,
        headers: Vec::new(),
        body: Bytes::from_static(b"x"),
        command: false,
    };
    let value = Bytes::from(encode_record(&record));
    assert!(decode_stored(u64::MAX, value.clone()).is_err());
    assert!(decode_stored(u64::MAX - 1, value).is_ok());
}

#[test]
fn a_record_whose_byte_position_would_pass_2_to_the_64_is_corrupt() {
    let record = |pos: u64, command: bool| Record {
        seq: 3,
        pos,
        timestamp_ms: 0,
        arrival_ms: 0,
        starts_unit: true,
        headers: Vec::new(),
        body: Bytes::from_static(b"xyz"),
        command,
    };
    for (pos, command, fits) in [
        (u64::MAX - 3, false, true),
        (u64::MAX - 2, false, false),
        (u64::MAX, true, true),
    ] {
        let one = record(pos, command);
        let alone = decode_stored(3, Bytes::from(encode_record(&one)));
        let run = runs(std::slice::from_ref(&one)).next().unwrap();
        let in_run = decode_stored(3, Bytes::from(run.encode()));
        let filed = filed_runs(std::slice::from_ref(&one)).next().unwrap();
        let in_file = decode_stored(3, Bytes::from(filed.encode_filed(1, &[0])));
        for decoded in [alone, in_run, in_file] {
            match decoded {
                Ok(stored) => {
                    assert!(fits, "pos {pos} was taken");
                    assert_eq!(stored.end().unwrap().0.seq, 4);
                }
                Err(e) => assert!(!fits, "pos {pos}: {e}"),
            }
        }
    }
}

#[test]
fn a_run_claiming_more_records_than_its_bytes_hold_is_corrupt() {
    let mut run = vec![RUN_VERSION];
    run.extend_from_slice(&0u64.to_be_bytes());
    run.extend_from_slice(&u32::MAX.to_be_bytes());
    let key_seq = u64::from(u32::MAX) - 1;
    assert!(decode_stored(key_seq, Bytes::from(run)).is_err());
}

#[test]
fn a_run_breaks_at_a_gap_in_seqs_and_under_its_size_bound() {
    let record = |seq: u64, len: usize| Record {
        seq,
        pos: seq,
        timestamp_ms: 0,
        arrival_ms: 0,
        starts_unit: true,
        headers: Vec::new(),
        body: Bytes::from(vec![0; len]),
        command: false,
    };
    let gap = [record(1, 1), record(2, 1), record(4, 1)];
    let lens: Vec<usize> = runs(&gap).map(|run| run.records().len()).collect();
    assert_eq!(lens, [2, 1]);
    let large = [
        record(1, 10),
        record(2, RUN_BYTES),
        record(3, 10),
        record(4, 10),
    ];
    let lens: Vec<usize> = runs(&large).map(|run| run.records().len()).collect();
    assert_eq!(lens, [1, 1, 2]);
    let run = runs(&large).last().unwrap();
    assert_eq!(record_seq(&run.key(5)).unwrap(), 4);
    assert!(
        decode_stored(5, Bytes::from(run.encode())).is_err(),
        "a run is checked against the key it is stored under"
    );
}

#[test]
fn keys_of_one_stream_sort_by_seq() {
    assert!(record_key(1, 255) < record_key(1, 256));
    assert!(record_key(1, u64::MAX) < record_key(2, 0));
    assert_eq!(split_key(&record_key(7, 9)).unwrap().0, 7);
}

#[test]
fn trim_states_round_trip_and_reject_garbage() {
    assert_eq!(
        decode_trim(&encode_trim(7, u64::MAX)).unwrap(),
        (7, u64::MAX)
    );
    assert!(decode_trim(&[]).is_err());
    assert!(decode_trim(&encode_trim(1, 2)[..16]).is_err());
    let mut future = encode_trim(1, 2);
    future[0] = 9;
    assert!(decode_trim(&future).is_err());
    assert_eq!(record_seq(&record_key(3, 258)).unwrap(), 258);
    assert!(record_seq(&[0; 12]).is_err());
}

#[test]
fn records_written_before_arrival_times_read_as_arriving_at_their_timestamp() {
    let record = Record {
        seq: 3,
        pos: 0,
        timestamp_ms: 1_700,
        arrival_ms: 9_999,
        starts_unit: true,
        headers: vec![(Bytes::from_static(b"k"), Bytes::from_static(b"v"))],
        body: Bytes::from_static(b"body"),
        command: false,
    };
    let mut v1 = encode_record(&record);
    v1[0] = RECORD_VERSION_WITHOUT_ARRIVAL;
    v1.drain(18..26);
    let decoded = decode_record(3, Bytes::from(v1)).unwrap();
    assert_eq!(decoded.arrival_ms, 1_700);
    assert_eq!(decoded.body, record.body);
    assert_eq!(decoded.headers, record.headers);
}

#[test]
fn producer_states_written_in_the_fixed_layout_still_read() {
    let state = ProducerState {
        epoch: 2,
        last_seq: 9,
        records: (40, 41),
        earlier: vec![(7, 37, 39), (8, 39, 40)],
    };
    let mut fixed = vec![PRODUCER_FIXED];
    for n in [2u64, 9, 40, 41] {
        fixed.extend_from_slice(&n.to_be_bytes());
    }
    fixed.extend_from_slice(&2u32.to_be_bytes());
    for n in [7u64, 37, 39, 8, 39, 40] {
        fixed.extend_from_slice(&n.to_be_bytes());
    }
    assert_eq!(decode_producer(&fixed).unwrap(), state);
    assert!(decode_producer(&fixed[..fixed.len() - 1]).is_err());
}

#[test]
fn a_steady_producers_state_takes_a_few_bytes_per_remembered_append() {
    let last_seq = 1_000_000;
    let earlier = (1..=15)
        .rev()
        .map(|k| (last_seq - k, 5_000_000 - k, 5_000_001 - k));
    let state = ProducerState {
        epoch: 3,
        last_seq,
        records: (5_000_000, 5_000_001),
        earlier: earlier.collect(),
    };
    let encoded = encode_producer(&state);
    assert!(encoded.len() <= 60, "{} bytes", encoded.len());
    assert_eq!(decode_producer(&encoded).unwrap(), state);
}

#[test]
fn producer_states_written_as_json_still_read() {
    let state = ProducerState {
        epoch: 2,
        last_seq: 9,
        records: (40, 41),
        earlier: vec![(8, 39, 40)],
    };
    let json = serde_json::to_vec(&state).unwrap();
    assert_eq!(decode_producer(&json).unwrap(), state);
}
