//! Forks: a new stream that shares its source's history up to a fork offset.
//!
//! The fork reads its source below the fork offset and its own records above it. A sub-offset
//! takes part of the append unit that follows the fork offset: bytes of it on a byte stream,
//! messages of it on a JSON stream. That part is copied into the fork as its first records.

use std::sync::Arc;

use bytes::Bytes;

use super::{StreamError, StreamResult, StreamService};
use crate::model::ledger::create::RequestedFork;
use crate::model::ledger::fork::{self, Source};
use crate::model::stream::SnapshotInfo;
use crate::model::{Offset, Record};
use crate::service::Stream;

/// How much of a source one step of reading a unit for a sub-offset fork reads (its first record
/// is read whole, however large).
const UNIT_STEP_BYTES: usize = 1 << 20;

#[derive(Clone, Debug)]
pub struct ForkRequest {
    pub source: String,
    pub offset: Option<Offset>,
    pub sub_offset: u64,
}

/// A fork request resolved against its source.
pub(super) struct ForkPlan {
    pub source: Arc<Stream>,
    pub anchor: Offset,
    pub sub_offset: u64,
    /// Records of the unit after `anchor` that the fork inherits by copy.
    pub prefix: Vec<Record>,
    pub ttl_secs: Option<u64>,
    pub expires_at_ms: Option<i64>,
    /// The source's snapshot, when the fork's history starts trimmed (see
    /// [`StreamService::inherited_snapshot`]).
    pub snapshot: Option<(SnapshotInfo, Bytes)>,
}

impl ForkRequest {
    /// The fork as a repeated create compares it.
    pub fn requested(&self) -> RequestedFork {
        RequestedFork {
            source_name: self.source.clone(),
            offset: self.offset,
            sub_offset: self.sub_offset,
        }
    }
}

impl ForkPlan {
    /// Where the fork's own appends continue.
    pub fn tail(&self) -> Offset {
        self.prefix.last().map_or(self.anchor, Record::next_offset)
    }
}

impl StreamService {
    pub(super) async fn plan_fork(&self, request: &ForkRequest) -> StreamResult<ForkPlan> {
        let source = self
            .find(&request.source, false)
            .await
            .map_err(|e| match e {
                StreamError::NotFound => StreamError::ForkSourceNotFound,
                StreamError::Gone => StreamError::ForkSourceGone,
                other => other,
            })?;
        Source {
            mirrored: source.mirror_of.is_some(),
            encrypted: source.encrypted,
            chain: std::iter::successors(Some(&source), |s| s.source.as_ref()).count(),
        }
        .forkable()?;
        let anchor = match request.offset {
            Some(offset) => self.boundary(&source, offset).await.map_err(|e| match e {
                StreamError::BadOffset(reason) => {
                    StreamError::BadRequest(format!("Stream-Fork-Offset: {reason}"))
                }
                other => other,
            })?,
            None => source.durable().tail,
        };
        let prefix = if request.sub_offset == 0 {
            Vec::new()
        } else {
            self.sub_offset_prefix(&source, anchor, request.sub_offset)
                .await?
        };
        let snapshot = self.inherited_snapshot(&source, anchor).await?;
        let (ttl_secs, expires_at_ms) = {
            let state = source.lock();
            (state.meta.ttl_secs, state.meta.expires_at_ms)
        };
        Ok(ForkPlan {
            source,
            anchor,
            sub_offset: request.sub_offset,
            prefix,
            ttl_secs,
            expires_at_ms,
            snapshot,
        })
    }

    /// What a fork at `anchor` inherits of `source`'s snapshot (see [`fork::inherits_snapshot`]).
    async fn inherited_snapshot(
        &self,
        source: &Stream,
        anchor: Offset,
    ) -> StreamResult<Option<(SnapshotInfo, Bytes)>> {
        if !fork::inherits_snapshot(source.durable().first, anchor) {
            return Ok(None);
        }
        // None: trimmed by an S2 trim, which needs no snapshot; there is nothing to inherit.
        let inherited = self.visible_snapshot(source).await?;
        if let Some((info, _)) = &inherited {
            fork::covers(info, anchor)?;
        }
        Ok(inherited)
    }

    /// The first `sub_offset` messages (JSON) or bytes (otherwise) of the unit at `anchor`.
    async fn sub_offset_prefix(
        &self,
        source: &Arc<Stream>,
        anchor: Offset,
        sub_offset: u64,
    ) -> StreamResult<Vec<Record>> {
        let too_far = || {
            StreamError::BadRequest("Stream-Fork-Sub-Offset is past the next append unit".into())
        };
        let unit = self.unit_up_to(source, anchor, sub_offset).await?;
        let mut unit = if source.json {
            let wanted = usize::try_from(sub_offset).map_err(|_| too_far())?;
            if unit.len() < wanted {
                return Err(too_far());
            }
            unit
        } else {
            let mut remaining = sub_offset;
            let mut kept = Vec::with_capacity(unit.len());
            for mut record in unit {
                if remaining == 0 {
                    break;
                }
                let len = record.byte_len();
                if len > remaining {
                    record.body = record
                        .body
                        .slice(..usize::try_from(remaining).map_err(|_| too_far())?);
                }
                remaining -= record.byte_len();
                kept.push(record);
            }
            if remaining > 0 {
                return Err(too_far());
            }
            kept
        };
        if let Some(first) = unit.first_mut() {
            first.starts_unit = true;
        }
        // The fork may keep these in its tail cache for as long as they are its newest records:
        // copied, so that they do not keep all of what they were read with (a buffer, or a
        // mapped file) for that long.
        for record in &mut unit {
            record.body = Bytes::copy_from_slice(&record.body);
        }
        Ok(unit)
    }

    /// The records of the unit at `anchor`, from its first on, until the unit ends or they hold
    /// `enough` messages (JSON) or bytes (otherwise), whichever comes first. Read a step at a
    /// time: a sub-offset far past its unit reads no further than the unit.
    async fn unit_up_to(
        &self,
        source: &Arc<Stream>,
        anchor: Offset,
        enough: u64,
    ) -> StreamResult<Vec<Record>> {
        let tail = source.durable().tail.seq;
        let mut unit: Vec<Record> = Vec::new();
        let mut held = 0u64;
        let mut next = anchor.seq;
        while next < tail && held < enough {
            let wanted = enough - held;
            let (until, max_bytes) = if source.json {
                (tail.min(next.saturating_add(wanted)), UNIT_STEP_BYTES)
            } else {
                let wanted = usize::try_from(wanted).unwrap_or(usize::MAX);
                (tail, UNIT_STEP_BYTES.min(wanted))
            };
            let step = self.collect(source, next, until, max_bytes).await?;
            // Empty, or trimmed under the read: the unit held is all there is.
            let (Some(first), Some(last)) = (step.first(), step.last()) else {
                break;
            };
            if first.seq != next {
                break;
            }
            next = last.seq + 1;
            for record in step {
                if !unit.is_empty() && record.starts_unit {
                    return Ok(unit);
                }
                held += if source.json { 1 } else { record.byte_len() };
                unit.push(record);
                if held >= enough {
                    break;
                }
            }
        }
        Ok(unit)
    }
}

#[cfg(test)]
mod tests;
