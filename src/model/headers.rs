//! The syntax of the protocol's header values. Pure parsing: each function takes the raw value
//! (or `None` when the header is absent) and returns the typed value or a reason for a 400.

use super::producer::ProducerClaim;

/// The largest producer epoch or sequence number: 2^53 − 1, so JavaScript clients keep precision.
pub const MAX_PRODUCER_NUMBER: u64 = (1 << 53) - 1;
/// The longest `Producer-Id` in bytes: every producer's state, id included, is kept for the
/// life of its stream.
pub const MAX_PRODUCER_ID_BYTES: usize = 256;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct HeaderError(pub String);

fn invalid(message: impl Into<String>) -> HeaderError {
    HeaderError(message.into())
}

/// A canonical non-negative decimal: `0` or digits without a leading zero or sign.
pub fn parse_canonical_u64(value: &str) -> Option<u64> {
    let canonical = value == "0"
        || (!value.is_empty()
            && !value.starts_with('0')
            && value.bytes().all(|b| b.is_ascii_digit()));
    if canonical { value.parse().ok() } else { None }
}

/// `Stream-TTL`: seconds as a canonical decimal.
pub fn parse_ttl(value: &str) -> Result<u64, HeaderError> {
    parse_canonical_u64(value).ok_or_else(|| {
        let digits = !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit());
        if digits && !value.starts_with('0') {
            invalid("Stream-TTL is too large: at most 18446744073709551615 seconds")
        } else {
            invalid("Stream-TTL must be a non-negative integer number of seconds")
        }
    })
}

/// `Stream-Expires-At`: an RFC 3339 timestamp, returned as milliseconds since the epoch.
pub fn parse_expires_at(value: &str) -> Result<i64, HeaderError> {
    let instant =
        time::OffsetDateTime::parse(value, &time::format_description::well_known::Rfc3339)
            .map_err(|_| invalid("Stream-Expires-At must be an RFC 3339 timestamp"))?;
    i64::try_from(instant.unix_timestamp_nanos() / 1_000_000)
        .map_err(|_| invalid("Stream-Expires-At is out of range"))
}

/// Renders milliseconds since the epoch as RFC 3339 in UTC.
pub fn format_timestamp(ms: i64) -> String {
    let nanos = i128::from(ms) * 1_000_000;
    time::OffsetDateTime::from_unix_timestamp_nanos(nanos)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

/// `Stream-Closed`: only `true` (any case) counts; every other value is ignored.
pub fn is_closed_flag(value: Option<&str>) -> bool {
    value.is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
}

/// `Stream-Fork-Sub-Offset`: a canonical decimal.
pub fn parse_sub_offset(value: &str) -> Result<u64, HeaderError> {
    parse_canonical_u64(value)
        .ok_or_else(|| invalid("Stream-Fork-Sub-Offset must be a non-negative integer"))
}

/// `Producer-Id`, `Producer-Epoch`, `Producer-Seq`: all three or none.
pub fn parse_producer(
    id: Option<&str>,
    epoch: Option<&str>,
    seq: Option<&str>,
) -> Result<Option<ProducerClaim>, HeaderError> {
    match (id, epoch, seq) {
        (None, None, None) => Ok(None),
        (Some(id), Some(epoch), Some(seq)) => {
            if id.is_empty() {
                return Err(invalid("Producer-Id must not be empty"));
            }
            if id.len() > MAX_PRODUCER_ID_BYTES {
                return Err(invalid(format!(
                    "Producer-Id is at most {MAX_PRODUCER_ID_BYTES} bytes"
                )));
            }
            Ok(Some(ProducerClaim {
                id: id.to_owned(),
                epoch: parse_producer_number("Producer-Epoch", epoch)?,
                seq: parse_producer_number("Producer-Seq", seq)?,
            }))
        }
        _ => Err(invalid(
            "Producer-Id, Producer-Epoch and Producer-Seq must be sent together",
        )),
    }
}

fn parse_producer_number(name: &str, value: &str) -> Result<u64, HeaderError> {
    let number = (!value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()))
        .then(|| value.parse::<u64>().ok())
        .flatten()
        .filter(|n| *n <= MAX_PRODUCER_NUMBER);
    number.ok_or_else(|| invalid(format!("{name} must be an integer from 0 to 2^53-1")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ttl_accepts_only_canonical_integers() {
        assert_eq!(parse_ttl("0"), Ok(0));
        assert_eq!(parse_ttl("3600"), Ok(3600));
        for bad in ["abc", "-1", "00060", "+60", "60.5", "1e3", "", " 60"] {
            assert!(parse_ttl(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_ttl_beyond_the_largest_is_told_it_is_too_large() {
        assert_eq!(parse_ttl("18446744073709551615"), Ok(u64::MAX));
        let too_large = parse_ttl("18446744073709551616").unwrap_err();
        assert!(too_large.0.contains("too large"), "{}", too_large.0);
        let malformed = parse_ttl("-1").unwrap_err();
        assert!(
            malformed.0.contains("non-negative integer"),
            "{}",
            malformed.0
        );
    }

    #[test]
    fn expires_at_accepts_z_and_numeric_offsets_alike() {
        let z = parse_expires_at("2030-01-01T00:00:00Z").unwrap();
        let plus = parse_expires_at("2030-01-01T00:00:00+00:00").unwrap();
        assert_eq!(z, plus);
        assert!(parse_expires_at("not-a-timestamp").is_err());
        assert_eq!(format_timestamp(z), "2030-01-01T00:00:00Z");
    }

    #[test]
    fn a_producer_id_is_at_most_256_bytes() {
        let claim = |id: &str| parse_producer(Some(id), Some("0"), Some("0"));
        assert!(claim(&"p".repeat(MAX_PRODUCER_ID_BYTES)).is_ok());
        assert!(claim(&"p".repeat(MAX_PRODUCER_ID_BYTES + 1)).is_err());
    }

    #[test]
    fn closed_flag_counts_only_true() {
        assert!(is_closed_flag(Some("true")));
        assert!(is_closed_flag(Some("TRUE")));
        for ignored in [None, Some("false"), Some("yes"), Some("1"), Some("")] {
            assert!(!is_closed_flag(ignored));
        }
    }

    #[test]
    fn sub_offset_rejects_non_canonical_values() {
        assert_eq!(parse_sub_offset("0"), Ok(0));
        assert_eq!(parse_sub_offset("12"), Ok(12));
        for bad in ["-1", "abc", "1.5", "05", "+1", ""] {
            assert!(parse_sub_offset(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn producer_headers_come_all_together_or_not_at_all() {
        assert_eq!(parse_producer(None, None, None), Ok(None));
        assert!(parse_producer(Some("p"), None, None).is_err());
        assert!(parse_producer(None, Some("0"), None).is_err());
        assert!(parse_producer(Some("p"), Some("0"), None).is_err());
        assert!(parse_producer(Some(""), Some("0"), Some("0")).is_err());
        let claim = parse_producer(Some("p"), Some("1"), Some("2"))
            .unwrap()
            .unwrap();
        assert_eq!((claim.epoch, claim.seq), (1, 2));
    }

    #[test]
    fn producer_numbers_are_plain_digits_up_to_2_pow_53_minus_1() {
        for bad in ["1abc", "0xyz", "1e3", "-1", "", "9007199254740992"] {
            assert!(
                parse_producer(Some("p"), Some(bad), Some("0")).is_err(),
                "{bad:?}"
            );
            assert!(
                parse_producer(Some("p"), Some("0"), Some(bad)).is_err(),
                "{bad:?}"
            );
        }
        assert!(parse_producer(Some("p"), Some("9007199254740991"), Some("00")).is_ok());
    }

    proptest! {
        #[test]
        fn header_parsers_never_panic(s in "\\PC*") {
            let _ = parse_ttl(&s);
            let _ = parse_expires_at(&s);
            let _ = parse_sub_offset(&s);
            let _ = parse_producer(Some(&s), Some(&s), Some(&s));
        }
    }
}
