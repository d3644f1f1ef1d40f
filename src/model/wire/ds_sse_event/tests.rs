use bytes::Bytes;

use super::*;

fn record(seq: u64, pos: u64, body: &'static [u8]) -> Record {
    Record {
        seq,
        pos,
        timestamp_ms: 0,
        arrival_ms: 0,
        starts_unit: true,
        headers: Vec::new(),
        body: Bytes::from_static(body),
        command: false,
    }
}

fn text(bytes: &[u8]) -> &str {
    std::str::from_utf8(bytes).unwrap()
}

const BYTES: Spelling = Spelling {
    json: false,
    envelope: false,
    base64: false,
};

const AT_CURSOR_7: Standing = Standing {
    cursor: 7,
    first_record: None,
};

#[test]
fn a_control_event_names_the_cursor_until_the_stream_closes() {
    let reached = Reached {
        next: Offset::new(2, 10),
        up_to_date: true,
        closed: false,
    };
    let open = control(reached, AT_CURSOR_7);
    let next = Offset::new(2, 10).token();
    assert_eq!(
        text(&open),
        format!(
            "event: control\ndata:{{\"streamNextOffset\":\"{}\",\"streamCursor\":\"7\",\"upToDate\":true}}\n\n",
            next.as_str()
        )
    );
    let closed = Reached {
        closed: true,
        up_to_date: false,
        ..reached
    };
    let records = Standing {
        first_record: Some(1),
        ..AT_CURSOR_7
    };
    assert_eq!(
        text(&control(closed, records)),
        format!(
            "event: control\ndata:{{\"streamNextOffset\":\"{}\",\"streamFirstRecord\":1,\"streamNextRecord\":2,\"streamClosed\":true}}\n\n",
            next.as_str()
        )
    );
}

#[test]
fn a_chunk_is_one_data_event_then_its_control_event_and_says_where_the_data_ends() {
    let records = [record(0, 0, b"ab"), record(1, 2, b"c")];
    let reached = Reached {
        next: Offset::new(2, 3),
        up_to_date: false,
        closed: false,
    };
    let (events, records_len) = chunk(&records, reached, BYTES, AT_CURSOR_7);
    let records_len = records_len.expect("shareable");
    assert_eq!(text(&events[..records_len]), "event: data\ndata:abc\n\n");
    assert_eq!(&events[records_len..], control(reached, AT_CURSOR_7));
}

#[test]
fn an_envelope_chunk_is_an_event_pair_per_record_and_only_the_last_is_up_to_date() {
    let records = [record(0, 0, b"1"), record(1, 1, b"2")];
    let reached = Reached {
        next: Offset::new(2, 2),
        up_to_date: true,
        closed: false,
    };
    let envelope = Spelling {
        envelope: true,
        ..BYTES
    };
    let (events, records_len) = chunk(&records, reached, envelope, AT_CURSOR_7);
    assert!(records_len.is_none(), "not shared");
    let events = text(&events);
    assert_eq!(events.matches("event: data\n").count(), 2);
    assert_eq!(events.matches("event: control\n").count(), 2);
    assert_eq!(events.matches("upToDate").count(), 1);
    assert!(events.ends_with("\"upToDate\":true}\n\n"));
}

#[test]
fn a_shared_frame_goes_out_as_it_is_for_its_cursor_and_with_this_readers_control_event_for_another()
{
    let records = [record(0, 0, b"ab")];
    let reached = Reached {
        next: Offset::new(1, 2),
        up_to_date: true,
        closed: false,
    };
    let (events, records_len) = chunk(&records, reached, BYTES, AT_CURSOR_7);
    let frame = Bytes::from(events);
    let records_len = records_len.unwrap();
    let (same, rest) = for_this_reader(frame.clone(), records_len, 7, reached, AT_CURSOR_7);
    assert!(rest.is_none());
    assert_eq!(
        same.as_ptr(),
        frame.as_ptr(),
        "rendered for this cursor: sent as it is, not copied"
    );
    let other = Standing {
        cursor: 9,
        ..AT_CURSOR_7
    };
    let (joined, rest) = for_this_reader(frame.clone(), records_len, 7, reached, other);
    assert!(
        rest.is_none(),
        "a small frame is joined with the control event"
    );
    assert_eq!(&joined[..records_len], &frame[..records_len]);
    assert_eq!(&joined[records_len..], control(reached, other));
}
