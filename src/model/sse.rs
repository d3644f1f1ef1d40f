//! Server-Sent Events framing: how a payload becomes an SSE `data` event. Pure, so the faces
//! share it and it can be benchmarked and fuzzed.

use base64::Engine as _;

/// `event: data`, one `data:` line per line of the payload. Splitting on every line break keeps
/// payload text from ever starting a new SSE field.
pub fn data_event(payload: &[u8], base64: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 32);
    write_data_event(&mut out, payload, base64);
    out
}

/// [`data_event`], appended to `out`, so one frame can hold a data event and its control event.
pub fn write_data_event(out: &mut Vec<u8>, payload: &[u8], base64: bool) {
    out.extend_from_slice(b"event: data\n");
    if base64 {
        out.extend_from_slice(b"data:");
        // Encoded in place at the end of the frame: no intermediate String.
        let start = out.len();
        let len = base64::encoded_len(payload.len(), true).unwrap_or(0);
        out.resize(start + len, 0);
        let written = base64::engine::general_purpose::STANDARD
            .encode_slice(payload, &mut out[start..])
            .unwrap_or(0);
        out.truncate(start + written);
        out.push(b'\n');
    } else {
        // SSE is UTF-8. Bytes of a text stream that are not (nothing refuses them on append)
        // are replaced by U+FFFD, as a decoding client would, instead of breaking a strict one.
        // Valid text is borrowed, not copied.
        let text = String::from_utf8_lossy(payload);
        for line in split_lines(text.as_bytes()) {
            // An SSE parser drops one space after the colon: a line that starts with one gets
            // another in front, so that its own survives. The others are written without (the
            // conformance suite reads `data:line`).
            if line.first() == Some(&b' ') {
                out.extend_from_slice(b"data: ");
            } else {
                out.extend_from_slice(b"data:");
            }
            out.extend_from_slice(line);
            out.push(b'\n');
        }
    }
    out.push(b'\n');
}

/// Splits on CRLF, CR and LF.
pub fn split_lines(payload: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = Some(payload);
    std::iter::from_fn(move || {
        let text = rest?;
        match text.iter().position(|&b| b == b'\n' || b == b'\r') {
            None => {
                rest = None;
                Some(text)
            }
            Some(end) => {
                let crlf = text[end] == b'\r' && text.get(end + 1) == Some(&b'\n');
                rest = Some(&text[end + if crlf { 2 } else { 1 }..]);
                Some(&text[..end])
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The data of the events in `frame`, as the SSE specification has a parser read it.
    fn spec_parsed_data(frame: &[u8]) -> Vec<u8> {
        let text = std::str::from_utf8(frame).unwrap();
        let lines: Vec<&str> = text
            .lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .map(|value| value.strip_prefix(' ').unwrap_or(value))
            .collect();
        lines.join("\n").into_bytes()
    }

    #[test]
    fn lines_starting_with_spaces_keep_them_through_a_spec_parser() {
        for payload in [&b" hello"[..], b"  two\n three\nnone", b"plain", b" "] {
            let frame = data_event(payload, false);
            assert_eq!(
                spec_parsed_data(&frame),
                payload,
                "{}",
                String::from_utf8_lossy(&frame)
            );
        }
        assert_eq!(data_event(b"plain", false), b"event: data\ndata:plain\n\n");
    }

    #[test]
    fn text_that_is_not_utf8_arrives_with_replacement_characters() {
        let frame = data_event(b"ok\xff\n\xc3", false);
        let text = std::str::from_utf8(&frame).expect("an SSE frame is UTF-8");
        assert_eq!(text, "event: data\ndata:ok\u{FFFD}\ndata:\u{FFFD}\n\n");
    }

    #[test]
    fn payload_lines_split_on_every_line_break() {
        let lines: Vec<&[u8]> = split_lines(b"a\r\nb\rc\nd").collect();
        assert_eq!(lines, vec![&b"a"[..], b"b", b"c", b"d"]);
    }

    #[test]
    fn a_trailing_line_break_and_an_empty_payload_each_leave_an_empty_line() {
        assert_eq!(
            split_lines(b"a\n").collect::<Vec<_>>(),
            vec![&b"a"[..], b""]
        );
        assert_eq!(split_lines(b"").collect::<Vec<_>>(), vec![&b""[..]]);
        assert_eq!(split_lines(b"\r\n\r").count(), 3);
    }

    #[test]
    fn injected_event_text_stays_inside_data_lines() {
        let event = data_event(b"x\nevent: control\ndata:{}", false);
        assert_eq!(
            event,
            b"event: data\ndata:x\ndata:event: control\ndata:data:{}\n\n"
        );
    }

    #[test]
    fn binary_payloads_travel_as_padded_base64() {
        assert_eq!(
            data_event(&[0xff, 0x00], true),
            b"event: data\ndata:/wA=\n\n"
        );
    }
}
