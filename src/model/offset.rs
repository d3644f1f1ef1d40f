//! Durable Streams offsets: the `{seq:016}_{pos:016}` token and the read-start sentinels.
//!
//! An offset names a record boundary: `seq` is the ordinal of the next record and `pos` the byte
//! position of that record's first byte in the stream's canonical byte sequence. Clients treat the
//! token as opaque; the server parses it back to find where a read starts.

use std::fmt;

/// Number of decimal digits in each half of an offset token.
const FIELD_DIGITS: usize = 16;
/// The largest value a 16-digit field can hold.
const FIELD_MAX: u64 = 9_999_999_999_999_999;

/// A position in a stream: the boundary before record `seq`, at byte `pos`.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct Offset {
    pub seq: u64,
    pub pos: u64,
}

impl Offset {
    pub const START: Offset = Offset { seq: 0, pos: 0 };

    pub fn new(seq: u64, pos: u64) -> Self {
        Offset { seq, pos }
    }

    /// Parses a server-minted token. Anything but exactly `\d{16}_\d{16}` is rejected.
    pub fn parse_token(token: &str) -> Result<Offset, OffsetError> {
        let bytes = token.as_bytes();
        if bytes.len() != FIELD_DIGITS * 2 + 1 || bytes[FIELD_DIGITS] != b'_' {
            return Err(OffsetError::Malformed);
        }
        let seq = parse_field(&bytes[..FIELD_DIGITS])?;
        let pos = parse_field(&bytes[FIELD_DIGITS + 1..])?;
        Ok(Offset { seq, pos })
    }

    /// Whether the token can represent this offset (both fields fit in 16 digits).
    pub fn is_representable(&self) -> bool {
        self.seq <= FIELD_MAX && self.pos <= FIELD_MAX
    }
}

fn parse_field(digits: &[u8]) -> Result<u64, OffsetError> {
    digits.iter().try_fold(0u64, |acc, &b| {
        if b.is_ascii_digit() {
            Ok(acc * 10 + u64::from(b - b'0'))
        } else {
            Err(OffsetError::Malformed)
        }
    })
}

impl Offset {
    /// The token as fixed-width text, rendered without the formatting machinery: every response
    /// and every SSE control event carries one, and `format!` took ten times as long as parsing.
    /// Only for representable offsets; `Display` handles the rest.
    pub fn token(&self) -> OffsetToken {
        let mut text = [b'_'; FIELD_DIGITS * 2 + 1];
        write_field(&mut text[..FIELD_DIGITS], self.seq);
        write_field(&mut text[FIELD_DIGITS + 1..], self.pos);
        OffsetToken(text)
    }
}

/// Writes the low `digits.len()` decimal digits of `value`, zero-padded.
fn write_field(digits: &mut [u8], mut value: u64) {
    for digit in digits.iter_mut().rev() {
        *digit = b'0' + (value % 10) as u8;
        value /= 10;
    }
}

/// A rendered offset token (`{seq:016}_{pos:016}`).
#[derive(Clone, Copy)]
pub struct OffsetToken([u8; FIELD_DIGITS * 2 + 1]);

impl OffsetToken {
    pub fn as_str(&self) -> &str {
        // Only ASCII digits and '_' are ever written.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl fmt::Display for Offset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_representable() {
            f.write_str(self.token().as_str())
        } else {
            write!(f, "{:016}_{:016}", self.seq, self.pos)
        }
    }
}

/// Where a read starts, as a client may ask for it in `offset=`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadFrom {
    /// `-1` or no offset: the first retained record.
    Start,
    /// `now`: the current tail.
    Now,
    /// A server-minted offset.
    At(Offset),
}

impl ReadFrom {
    pub fn parse(value: &str) -> Result<ReadFrom, OffsetError> {
        match value {
            "-1" => Ok(ReadFrom::Start),
            "now" => Ok(ReadFrom::Now),
            token => Offset::parse_token(token).map(ReadFrom::At),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OffsetError {
    #[error(
        "malformed offset: expected -1, now, or a token of the form 0000000000000000_0000000000000000"
    )]
    Malformed,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn the_fast_token_matches_zero_padded_formatting(seq in 0..=FIELD_MAX, pos in 0..=FIELD_MAX) {
            let token = Offset::new(seq, pos).token();
            prop_assert_eq!(token.as_str(), format!("{seq:016}_{pos:016}"));
        }
    }

    #[test]
    fn an_unrepresentable_offset_still_renders_every_digit() {
        let offset = Offset::new(FIELD_MAX + 1, 7);
        assert_eq!(offset.to_string(), "10000000000000000_0000000000000007");
    }

    #[test]
    fn start_offset_renders_as_all_zeros() {
        assert_eq!(
            Offset::START.to_string(),
            "0000000000000000_0000000000000000"
        );
    }

    #[test]
    fn sentinels_parse_to_start_and_now() {
        assert_eq!(ReadFrom::parse("-1"), Ok(ReadFrom::Start));
        assert_eq!(ReadFrom::parse("now"), Ok(ReadFrom::Now));
    }

    #[test]
    fn malformed_tokens_are_rejected() {
        for bad in [
            "",
            "0",
            "0_0",
            "-2",
            "NOW",
            "0000000000000000-0000000000000000",
            "0000000000000000_000000000000000",
            "0000000000000000_00000000000000000",
            "000000000000000a_0000000000000000",
            "0000000000000000_0000000000000000 ",
            "../0000000000000_0000000000000000",
            "0,1",
            "0 1",
            "+000000000000000_0000000000000000",
        ] {
            assert_eq!(ReadFrom::parse(bad), Err(OffsetError::Malformed), "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn every_offset_round_trips_through_its_token(seq in 0..=FIELD_MAX, pos in 0..=FIELD_MAX) {
            let offset = Offset::new(seq, pos);
            prop_assert_eq!(Offset::parse_token(&offset.to_string()), Ok(offset));
        }

        #[test]
        fn tokens_sort_like_offsets(a in 0..=FIELD_MAX, b in 0..=FIELD_MAX, c in 0..=FIELD_MAX, d in 0..=FIELD_MAX) {
            let (x, y) = (Offset::new(a, b), Offset::new(c, d));
            prop_assert_eq!(x.cmp(&y), x.to_string().cmp(&y.to_string()));
        }

        #[test]
        fn parsing_arbitrary_text_never_panics(s in "\\PC*") {
            let _ = ReadFrom::parse(&s);
        }
    }
}
