//! Where a read that starts at a timestamp begins. The engine's timestamp index names records on
//! either side of the timestamp, at most one index step apart, so the search needs one lookup
//! and, mostly, one read of the records between, however long the stream is.

use std::sync::Arc;

use super::{Stream, StreamResult, StreamService};

/// The most records between two index entries that one read takes in; a wider stretch (data
/// written before the index, a fork's source records) is bisected.
const SCAN_RECORDS: u64 = 4096;

/// The most bytes that read holds.
const SCAN_BYTES: usize = 1 << 20;

impl StreamService {
    /// Narrows `low..high` (retained sequence numbers) around the first record with a timestamp
    /// at or after `timestamp`; returns `(seq, seq)` when it found that record (or that none in
    /// the range is, `(high, high)`), or the narrower range to bisect.
    pub(super) async fn narrow_to_timestamp(
        &self,
        stream: &Arc<Stream>,
        timestamp: u64,
        mut low: u64,
        mut high: u64,
    ) -> StreamResult<(u64, u64)> {
        let bounds = self.engine.time_bounds(stream.id, timestamp).await?;
        if let Some(earlier) = bounds.earlier {
            low = low.max(earlier.saturating_add(1)).min(high);
        }
        if let Some(at_most) = bounds.at_most {
            high = high.min(at_most).max(low);
        }
        if low == high || high - low > SCAN_RECORDS {
            return Ok((low, high));
        }
        let records = self.collect(stream, low, high, SCAN_BYTES).await?;
        if let Some(found) = records.iter().find(|r| ms(r.timestamp_ms) >= timestamp) {
            return Ok((found.seq, found.seq));
        }
        match records.last() {
            // All of it read, none at or after: the answer is `high`.
            Some(last) if last.seq + 1 >= high => Ok((high, high)),
            Some(last) => Ok((last.seq + 1, high)),
            // Trimmed while this looked: let the bisection find what is left.
            None => Ok((low, high)),
        }
    }
}

fn ms(timestamp: i64) -> u64 {
    u64::try_from(timestamp).unwrap_or(0)
}

#[cfg(test)]
mod tests;
