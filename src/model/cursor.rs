//! Stream cursors (base protocol §10.1): a coarse clock that makes live responses distinct for
//! caches. Each interval is 20 s counted from 2024-10-09T00:00:00Z.

/// 2024-10-09T00:00:00Z in milliseconds since the Unix epoch.
const CURSOR_EPOCH_MS: i64 = 1_728_432_000_000;
const INTERVAL_MS: i64 = 20_000;

/// The cursor to return, given the current time and the cursor the client sent, if any.
/// When the client is already at or past the current interval, the answer moves strictly past
/// it by a random jitter, so a cache never returns the same response twice in a loop. A client
/// cursor too close to `u64::MAX` to move past (one the server never issued) gets the current
/// interval: still not the cursor it sent.
pub fn next_cursor(now_ms: i64, client: Option<u64>, jitter_intervals: u64) -> u64 {
    let current = u64::try_from((now_ms - CURSOR_EPOCH_MS).max(0) / INTERVAL_MS).unwrap_or(0);
    match client {
        Some(client) if client >= current => client
            .checked_add(jitter_intervals.max(1))
            .unwrap_or(current),
        _ => current,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_counts_twenty_second_intervals_since_the_epoch() {
        assert_eq!(next_cursor(CURSOR_EPOCH_MS, None, 5), 0);
        assert_eq!(next_cursor(CURSOR_EPOCH_MS + 41_000, None, 5), 2);
    }

    #[test]
    fn a_client_at_or_past_the_current_interval_gets_a_strictly_greater_cursor() {
        let now = CURSOR_EPOCH_MS + 41_000;
        assert_eq!(next_cursor(now, Some(2), 3), 5);
        assert_eq!(next_cursor(now, Some(9), 0), 10);
        assert_eq!(next_cursor(now, Some(1), 3), 2);
    }

    #[test]
    fn a_client_cursor_that_cannot_move_forward_gets_another_cursor_not_its_own() {
        let now = CURSOR_EPOCH_MS + 41_000;
        assert_eq!(next_cursor(now, Some(u64::MAX), 3), 2);
        assert_eq!(next_cursor(now, Some(u64::MAX - 1), 3), 2);
        assert_eq!(next_cursor(now, Some(u64::MAX - 3), 3), u64::MAX);
    }
}
