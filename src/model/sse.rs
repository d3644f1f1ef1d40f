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
        for line in split_lines(payload) {
            out.extend_from_slice(b"data:");
            out.extend_from_slice(line);
            out.push(b'\n');
        }
    }
    out.push(b'\n');
}

/// Splits on CRLF, CR and LF.
pub fn split_lines(payload: &[u8]) -> Vec<&[u8]> {
    let mut lines = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < payload.len() {
        match payload[i] {
            b'\n' => {
                lines.push(&payload[start..i]);
                start = i + 1;
            }
            b'\r' => {
                lines.push(&payload[start..i]);
                if payload.get(i + 1) == Some(&b'\n') {
                    i += 1;
                }
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    lines.push(&payload[start..]);
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_lines_split_on_every_line_break() {
        let lines: Vec<&[u8]> = split_lines(b"a\r\nb\rc\nd");
        assert_eq!(lines, vec![&b"a"[..], b"b", b"c", b"d"]);
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
