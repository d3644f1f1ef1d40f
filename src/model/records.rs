//! JSON record coordinates (seed 000 §6): the read parameters that select records by ordinal,
//! and the record-aligned representations.

use super::headers::parse_canonical_u64;

/// The `Stream-Extensions` token of this extension; advertised on JSON streams only.
pub const EXTENSION_TOKEN: &str = "json-record-coordinates-v1";
pub const NDJSON: &str = "application/x-ndjson";
pub const ENVELOPE_NDJSON: &str = "application/vnd.durable-stream-records+ndjson";
pub const ENVELOPE_EVENT: &str = "application/vnd.durable-stream-record+json";

/// Where a record-aware read starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordStart {
    /// `record=N`
    At(u64),
    /// `record=now` (or `tail_records=0`)
    Now,
    /// `tail_records=N`: the last N retained records.
    Last(u64),
}

/// How a read shows its records: the base protocol's canonical bytes, or record-aligned lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReadView {
    Canonical,
    Records(RecordView),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RecordView {
    /// One normalised JSON value per line.
    Values,
    /// One `{"record":N,"value":…}` object per line.
    Envelope,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordRead {
    pub start: RecordStart,
    pub max_records: Option<u64>,
    pub view: RecordView,
}

/// The read query parameters that concern record coordinates, as sent.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReadParams<'a> {
    pub offset: Option<&'a str>,
    pub record: Option<&'a str>,
    pub tail_records: Option<&'a str>,
    pub max_records: Option<&'a str>,
    pub max_bytes: Option<&'a str>,
    pub record_view: Option<&'a str>,
}

/// Decides whether a read is record-aware, enforcing §6.6's combination rules.
pub fn parse_record_read(params: &ReadParams<'_>) -> Result<Option<RecordRead>, String> {
    let start = match (params.record, params.tail_records) {
        (Some(_), Some(_)) => return Err("record and tail_records are mutually exclusive".into()),
        (Some("now"), None) => Some(RecordStart::Now),
        (Some(record), None) => Some(RecordStart::At(
            parse_canonical_u64(record).ok_or("record must be a non-negative integer or now")?,
        )),
        (None, Some(count)) => {
            match parse_canonical_u64(count).ok_or("tail_records must be a non-negative integer")? {
                0 => Some(RecordStart::Now),
                n => Some(RecordStart::Last(n)),
            }
        }
        (None, None) => None,
    };
    let max_records = params
        .max_records
        .map(|n| {
            parse_canonical_u64(n)
                .filter(|n| *n > 0)
                .ok_or("max_records must be a positive integer")
        })
        .transpose()?;
    let view = match params.record_view {
        None => RecordView::Values,
        Some("envelope") => RecordView::Envelope,
        Some(_) => return Err("record_view must be envelope".into()),
    };
    let Some(start) = start else {
        if max_records.is_some() {
            return Err("max_records needs record or tail_records".into());
        }
        if params.record_view.is_some() {
            return Err("record_view needs record or tail_records".into());
        }
        return Ok(None);
    };
    if params.offset.is_some() {
        return Err("record and tail_records cannot be combined with offset".into());
    }
    if params.max_bytes.is_some() {
        return Err("max_bytes cannot be combined with record-aware reads; use max_records".into());
    }
    Ok(Some(RecordRead {
        start,
        max_records,
        view,
    }))
}

/// One line of the envelope view: `{"record":N,"value":<value>}`.
pub fn envelope(record: u64, value: &[u8]) -> Vec<u8> {
    let mut line = format!("{{\"record\":{record},\"value\":").into_bytes();
    line.extend_from_slice(value);
    line.push(b'}');
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Result<Option<RecordRead>, String> {
        let get = |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
        parse_record_read(&ReadParams {
            offset: get("offset"),
            record: get("record"),
            tail_records: get("tail_records"),
            max_records: get("max_records"),
            max_bytes: get("max_bytes"),
            record_view: get("record_view"),
        })
    }

    #[test]
    fn start_parameters_select_a_record() {
        assert_eq!(
            parse(&[("record", "42")]).unwrap().unwrap().start,
            RecordStart::At(42)
        );
        assert_eq!(
            parse(&[("record", "now")]).unwrap().unwrap().start,
            RecordStart::Now
        );
        assert_eq!(
            parse(&[("tail_records", "0")]).unwrap().unwrap().start,
            RecordStart::Now
        );
        assert_eq!(
            parse(&[("tail_records", "5")]).unwrap().unwrap().start,
            RecordStart::Last(5)
        );
        assert_eq!(parse(&[("offset", "-1")]).unwrap(), None);
    }

    #[test]
    fn the_section_6_6_combinations_are_refused() {
        for bad in [
            &[("record", "1"), ("tail_records", "1")][..],
            &[("record", "1"), ("offset", "-1")],
            &[("tail_records", "1"), ("offset", "now")],
            &[("tail_records", "-1")],
            &[("record", "x")],
            &[("max_records", "3")],
            &[("record", "1"), ("max_records", "0")],
            &[("record", "1"), ("max_bytes", "10")],
            &[("record_view", "envelope")],
            &[("record", "1"), ("record_view", "other")],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn envelope_lines_wrap_the_value() {
        assert_eq!(
            envelope(7, b"{\"a\":1}"),
            br#"{"record":7,"value":{"a":1}}"#
        );
    }
}
