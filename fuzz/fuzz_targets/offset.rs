//! Offsets: `ReadFrom::parse` (the `offset=` query parameter) and `Offset::parse_token`.
//!
//! Input: one or two candidate offsets, separated by the first newline.
//! Properties: a token that parses renders back to exactly the same text; only `-1` and `now`
//! are sentinels; the two parsers agree; and tokens sort like the offsets they name.
#![no_main]

use libfuzzer_sys::fuzz_target;
use runnel::model::{Offset, ReadFrom};

fn check(text: &str) -> Option<Offset> {
    let token = Offset::parse_token(text);
    match ReadFrom::parse(text) {
        Ok(ReadFrom::Start) => {
            assert_eq!(text, "-1");
            assert!(token.is_err());
            None
        }
        Ok(ReadFrom::Now) => {
            assert_eq!(text, "now");
            assert!(token.is_err());
            None
        }
        Ok(ReadFrom::At(offset)) => {
            assert_eq!(token, Ok(offset), "the two parsers disagree on {text:?}");
            assert!(offset.is_representable(), "{offset:?} from {text:?}");
            assert_eq!(
                offset.to_string(),
                text,
                "a parsed token must re-render verbatim"
            );
            assert_eq!(text.len(), 33);
            Some(offset)
        }
        Err(_) => {
            assert!(
                token.is_err(),
                "parse_token accepted {text:?} but ReadFrom refused it"
            );
            None
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (a, b) = text.split_once('\n').unwrap_or((text, ""));
    let (x, y) = (check(a), check(b));
    if let (Some(x), Some(y)) = (x, y) {
        assert_eq!(x.cmp(&y), a.cmp(b), "tokens must sort like their offsets");
        assert_eq!(x == y, a == b);
    }
    // Rendering any representable offset parses back to it.
    for offset in [x, y].into_iter().flatten() {
        let swapped = Offset::new(offset.pos, offset.seq);
        assert_eq!(Offset::parse_token(&swapped.to_string()), Ok(swapped));
    }
});
