//! Idempotent producers: per-(stream, producer id) epoch and sequence validation.
//!
//! The rules are the base protocol's §5.2.1: a new producer starts at sequence 0, a higher epoch
//! fences older ones and must restart at 0, a repeated sequence is a duplicate that writes nothing,
//! and a gap is refused so the client can resend what is missing.

use serde::{Deserialize, Serialize};

/// The producer headers of one append, already validated for syntax.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProducerClaim {
    pub id: String,
    pub epoch: u64,
    pub seq: u64,
}

/// How many recent appends of a producer keep their record ranges for deduplicated retries.
pub const REMEMBERED_APPENDS: usize = 16;

/// What the server remembers about a producer after its last accepted append.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerState {
    pub epoch: u64,
    pub last_seq: u64,
    /// The record range `[start, next)` the last accepted append created, so that a
    /// deduplicated retry can acknowledge exactly what the original did.
    #[serde(default)]
    pub records: (u64, u64),
    /// `(seq, start, next)` of the appends before the last one in this epoch, newest last, at
    /// most [`REMEMBERED_APPENDS`].
    #[serde(default)]
    pub earlier: Vec<(u64, u64, u64)>,
}

impl ProducerState {
    /// A producer's state after its first accepted append, `seq` in `epoch`, which created
    /// `records`.
    pub fn first(epoch: u64, seq: u64, records: (u64, u64)) -> Self {
        ProducerState {
            epoch,
            last_seq: seq,
            records,
            earlier: Vec::new(),
        }
    }

    /// Accepts `seq` in `epoch`, which created `records`. In place: it runs on every producer
    /// append, and the remembered appends then need no new allocation.
    pub fn advance(&mut self, epoch: u64, seq: u64, records: (u64, u64)) {
        if self.epoch == epoch {
            let excess = (self.earlier.len() + 1).saturating_sub(REMEMBERED_APPENDS - 1);
            self.earlier.drain(..excess);
            self.earlier
                .push((self.last_seq, self.records.0, self.records.1));
        } else {
            self.earlier.clear();
        }
        self.epoch = epoch;
        self.last_seq = seq;
        self.records = records;
    }

    /// The record range append `seq` created, if it is still remembered.
    pub fn records_of(&self, seq: u64) -> Option<(u64, u64)> {
        if seq == self.last_seq {
            return Some(self.records);
        }
        self.earlier
            .iter()
            .find(|(s, _, _)| *s == seq)
            .map(|(_, start, next)| (*start, *next))
    }
}

/// The verdict on an append carrying producer headers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProducerDecision {
    /// Write it; afterwards the producer is at (epoch, seq).
    Accept,
    /// Already written: acknowledge without writing.
    Duplicate { epoch: u64, last_seq: u64 },
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProducerError {
    #[error("producer epoch {received} is older than the current epoch {current}")]
    StaleEpoch { current: u64, received: u64 },
    #[error("a new producer epoch must start at sequence 0")]
    EpochBumpNotAtZero,
    #[error("producer sequence gap: expected {expected}, received {received}")]
    SequenceGap { expected: u64, received: u64 },
}

/// Decides an append against the producer's stored state (`None` for a producer never seen).
pub fn decide(
    state: Option<&ProducerState>,
    claim: &ProducerClaim,
) -> Result<ProducerDecision, ProducerError> {
    let Some(state) = state else {
        return if claim.seq == 0 {
            Ok(ProducerDecision::Accept)
        } else {
            Err(ProducerError::SequenceGap {
                expected: 0,
                received: claim.seq,
            })
        };
    };
    if claim.epoch < state.epoch {
        return Err(ProducerError::StaleEpoch {
            current: state.epoch,
            received: claim.epoch,
        });
    }
    if claim.epoch > state.epoch {
        return if claim.seq == 0 {
            Ok(ProducerDecision::Accept)
        } else {
            Err(ProducerError::EpochBumpNotAtZero)
        };
    }
    if claim.seq <= state.last_seq {
        Ok(ProducerDecision::Duplicate {
            epoch: state.epoch,
            last_seq: state.last_seq,
        })
    } else if claim.seq == state.last_seq + 1 {
        Ok(ProducerDecision::Accept)
    } else {
        Err(ProducerError::SequenceGap {
            expected: state.last_seq + 1,
            received: claim.seq,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(epoch: u64, seq: u64) -> ProducerClaim {
        ProducerClaim {
            id: "p".into(),
            epoch,
            seq,
        }
    }

    fn at(epoch: u64, last_seq: u64) -> ProducerState {
        ProducerState {
            epoch,
            last_seq,
            records: (0, 0),
            earlier: Vec::new(),
        }
    }

    #[test]
    fn recent_appends_keep_their_record_ranges_within_one_epoch() {
        let mut state = ProducerState::first(1, 0, (0, 2));
        for seq in 1..40 {
            state.advance(1, seq, (seq * 10, seq * 10 + 1));
        }
        assert_eq!(state.records_of(39), Some((390, 391)));
        assert_eq!(state.records_of(30), Some((300, 301)));
        let oldest_kept = 40 - REMEMBERED_APPENDS as u64;
        assert_eq!(
            state.records_of(oldest_kept),
            Some((oldest_kept * 10, oldest_kept * 10 + 1))
        );
        assert_eq!(state.records_of(oldest_kept - 1), None);
        let mut bumped = state.clone();
        bumped.advance(2, 0, (500, 501));
        assert!(
            bumped.earlier.is_empty(),
            "a new epoch starts a new history"
        );
    }

    #[test]
    fn a_new_producer_must_start_at_sequence_zero_in_any_epoch() {
        assert_eq!(decide(None, &claim(7, 0)), Ok(ProducerDecision::Accept));
        assert_eq!(
            decide(None, &claim(0, 3)),
            Err(ProducerError::SequenceGap {
                expected: 0,
                received: 3
            })
        );
    }

    #[test]
    fn an_older_epoch_is_fenced() {
        assert_eq!(
            decide(Some(&at(2, 5)), &claim(1, 6)),
            Err(ProducerError::StaleEpoch {
                current: 2,
                received: 1
            })
        );
    }

    #[test]
    fn a_newer_epoch_restarts_at_zero() {
        assert_eq!(
            decide(Some(&at(2, 5)), &claim(3, 0)),
            Ok(ProducerDecision::Accept)
        );
        assert_eq!(
            decide(Some(&at(2, 5)), &claim(3, 1)),
            Err(ProducerError::EpochBumpNotAtZero)
        );
    }

    #[test]
    fn a_repeated_sequence_is_a_duplicate_reporting_the_highest_accepted() {
        assert_eq!(
            decide(Some(&at(1, 5)), &claim(1, 3)),
            Ok(ProducerDecision::Duplicate {
                epoch: 1,
                last_seq: 5
            })
        );
        assert_eq!(
            decide(Some(&at(1, 5)), &claim(1, 5)),
            Ok(ProducerDecision::Duplicate {
                epoch: 1,
                last_seq: 5
            })
        );
    }

    #[test]
    fn the_next_sequence_is_accepted_and_a_gap_is_refused() {
        assert_eq!(
            decide(Some(&at(1, 5)), &claim(1, 6)),
            Ok(ProducerDecision::Accept)
        );
        assert_eq!(
            decide(Some(&at(1, 5)), &claim(1, 8)),
            Err(ProducerError::SequenceGap {
                expected: 6,
                received: 8
            })
        );
    }

    #[test]
    fn a_state_read_back_with_a_full_history_still_keeps_only_the_last_appends() {
        let mut state = ProducerState::first(1, 16, (16, 17));
        state.earlier = (0..16).map(|seq| (seq, seq, seq + 1)).collect();
        state.advance(1, 17, (17, 18));
        assert_eq!(state.earlier.len(), REMEMBERED_APPENDS - 1);
        assert_eq!(state.earlier.last(), Some(&(16, 16, 17)));
        assert_eq!(state.records_of(17), Some((17, 18)));
        assert_eq!(state.records_of(2), Some((2, 3)));
        assert_eq!(state.records_of(1), None);
    }
}
