//! Creating a stream: what a create asks for once defaults and a fork's inheritance are filled
//! in, whether its bucket takes one more stream, what an existing stream of the same name makes
//! of it (a repeat is confirmed, a difference refused), and the new stream's metadata and first
//! records.
//!
//! A new stream has no ledger yet, so its birth is a function of what it is made from
//! ([`Ledger::create`]); a create that finds the name taken is a command on the stream there
//! ([`Recreate`]).

use bytes::Bytes;

use super::lifecycle::Removal;
use super::{Command, Conflict, Ledger, Mismatch, Refusal};
use crate::model::attrs::Attrs;
use crate::model::content_type;
use crate::model::offset::Offset;
use crate::model::record::{Record, lay_out_arrived};
use crate::model::s2::StreamConfig;
use crate::model::stream::{BucketMeta, ForkOrigin, MetaExtra, SnapshotInfo, StreamMeta};

/// What a create request asks for, as the face gave it (header syntax checked).
#[derive(Clone, Copy, Debug)]
pub struct Ask<'a> {
    pub content_type: Option<&'a str>,
    pub ttl_secs: Option<u64>,
    pub expires_at_ms: Option<i64>,
    pub closed: bool,
    pub attrs: &'a Attrs,
    pub cipher: Option<&'a str>,
    /// The upstream, when the create makes a read-only mirror.
    pub mirror_of: Option<&'a str>,
    pub s2_creation: Option<&'a str>,
    pub s2_config: Option<&'a StreamConfig>,
    pub fork: Option<&'a RequestedFork>,
}

/// What a fork takes from its source where the request leaves it out.
#[derive(Clone, Copy, Debug)]
pub struct Inherited<'a> {
    pub content_type: &'a str,
    pub ttl_secs: Option<u64>,
    pub expires_at_ms: Option<i64>,
}

/// The configuration a create request asks for, after defaults and fork inheritance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestedConfig {
    pub content_type: String,
    pub ttl_secs: Option<u64>,
    pub expires_at_ms: Option<i64>,
    pub closed: bool,
    pub fork: Option<RequestedFork>,
    pub attrs: Attrs,
    /// The cipher for record bodies; fixed at creation and not compared on repeats.
    pub cipher: Option<String>,
    /// The upstream of a mirrored stream; fixed at creation and not compared on repeats.
    pub mirror_of: Option<String>,
    /// The S2 create request making the stream; stored, not compared on repeats.
    pub s2_creation: Option<String>,
    /// The S2 configuration; stored, not compared on repeats (S2 answers a repeat by its request
    /// token).
    pub s2_config: Option<StreamConfig>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestedFork {
    pub source_name: String,
    /// Compared only when the request names it.
    pub offset: Option<Offset>,
    pub sub_offset: u64,
}

impl RequestedFork {
    /// Whether `origin` is the fork this asks for: same source and sub-offset, and the same
    /// offset when the request names one.
    pub fn matches(&self, origin: &ForkOrigin) -> bool {
        origin.source_name == self.source_name
            && self.offset.is_none_or(|at| at == origin.offset)
            && origin.sub_offset == self.sub_offset
    }
}

impl RequestedConfig {
    /// What `ask` comes to, at `now_ms`: a fork takes its source's content type and expiry
    /// where the request gives neither, and may not ask for another media type; a stream that
    /// would expire as it is made is refused (a mirror copies its upstream's expiry as it is).
    pub fn resolve(
        ask: Ask<'_>,
        inherited: Option<Inherited<'_>>,
        now_ms: i64,
    ) -> Result<RequestedConfig, Refusal> {
        let content_type = match (ask.content_type, inherited) {
            (Some(given), Some(source))
                if !content_type::same_media_type(given, source.content_type) =>
            {
                return Err(Refusal::Conflict(Conflict::ForkContentType));
            }
            (Some(given), _) if content_type::is_well_formed(given) => given.to_string(),
            (_, Some(source)) => source.content_type.to_string(),
            _ => content_type::DEFAULT_CONTENT_TYPE.to_string(),
        };
        if ask.mirror_of.is_none() && ask.expires_at_ms.is_some_and(|at| at <= now_ms) {
            return Err(Refusal::ExpiresInThePast);
        }
        let (ttl_secs, expires_at_ms) = match (inherited, ask.ttl_secs, ask.expires_at_ms) {
            (Some(source), None, None) => (source.ttl_secs, source.expires_at_ms),
            (_, ttl, expires) => (ttl, expires),
        };
        Ok(RequestedConfig {
            content_type,
            ttl_secs,
            expires_at_ms,
            closed: ask.closed,
            attrs: ask.attrs.clone(),
            cipher: ask.cipher.map(str::to_string),
            mirror_of: ask.mirror_of.map(str::to_string),
            s2_creation: ask.s2_creation.map(str::to_string),
            s2_config: ask.s2_config.cloned(),
            fork: ask.fork.cloned(),
        })
    }

    /// What `ask` comes to as a repeat of the fork `existing`, whose source can no longer be
    /// planned from: what the request gives must match, as for any repeated create; what a fork
    /// inherits and the request leaves out is the fork's own.
    pub fn repeating_fork(
        ask: Ask<'_>,
        existing: &StreamMeta,
        now_ms: i64,
    ) -> Result<RequestedConfig, Refusal> {
        let mut requested = RequestedConfig::resolve(ask, None, now_ms)?;
        if ask.content_type.is_none() {
            requested.content_type = existing.content_type.to_string();
        }
        if ask.ttl_secs.is_none() && ask.expires_at_ms.is_none() {
            requested.ttl_secs = existing.ttl_secs;
            requested.expires_at_ms = existing.expires_at_ms;
        }
        Ok(requested)
    }

    /// How `existing` differs from this request, in the order the differences are reported, or
    /// `None` when the request repeats its creation.
    pub fn mismatch(&self, existing: &StreamMeta) -> Option<Mismatch> {
        if !content_type::same_media_type(&existing.content_type, &self.content_type) {
            return Some(Mismatch::ContentType);
        }
        if existing.ttl_secs != self.ttl_secs {
            return Some(Mismatch::Ttl);
        }
        if existing.expires_at_ms != self.expires_at_ms {
            return Some(Mismatch::ExpiresAt);
        }
        if existing.closed != self.closed {
            return Some(Mismatch::Closed);
        }
        if existing.extra().attrs != self.attrs {
            return Some(Mismatch::Attrs);
        }
        match (&existing.extra().fork, &self.fork) {
            (None, None) => None,
            (Some(have), Some(want)) => (!want.matches(have)).then_some(Mismatch::OtherFork),
            _ => Some(Mismatch::ForkConfiguration),
        }
    }
}

/// Whether `bucket` (`None`: there is no such bucket) takes a new stream as `requested`: it
/// exists, is not being deleted, seals its streams only if this one is sealed too (an S2 create
/// gives the key, a mirror copies sealed records; a Durable Streams create would hold its
/// records in the clear), and holds fewer than `limit` streams, counted by `held` up to the
/// limit (only when every other check passed: it walks the bucket).
pub fn admit(
    bucket: Option<(&str, &BucketMeta)>,
    requested: &RequestedConfig,
    limit: Option<usize>,
    held: impl FnOnce(usize) -> usize,
) -> Result<(), Refusal> {
    let Some((name, meta)) = bucket else {
        return Err(Refusal::BucketNotFound);
    };
    if meta.deleting {
        return Err(Refusal::BucketDeleting);
    }
    let sealed_here = requested.cipher.is_some() || requested.mirror_of.is_some();
    if meta.seals_streams() && !sealed_here {
        return Err(Refusal::Conflict(Conflict::SealedBucket));
    }
    if let Some(limit) = limit
        && held(limit) >= limit
    {
        return Err(Refusal::BucketFull {
            bucket: name.to_string(),
            limit,
        });
    }
    Ok(())
}

/// Whether a create made something new, or was a retry of the S2 create request that made it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Creation {
    New,
    Repeated,
}

/// An S2 create of `what` (a basin, a stream) that found it there: a retry of the request that
/// made it (`made_by`, its [`crate::model::s2::creation_key`]) is answered as that one was;
/// anything else finds it already there.
pub fn repeat_of_s2_create(
    what: &'static str,
    made_by: Option<&str>,
    request: Option<&str>,
) -> Result<Creation, Refusal> {
    match request {
        Some(request) if made_by == Some(request) => Ok(Creation::Repeated),
        _ => Err(Refusal::AlreadyExists(what)),
    }
}

/// A create of a name the stream of this ledger holds.
pub struct Recreate<'r> {
    pub requested: &'r RequestedConfig,
    /// The stream's expiry has passed (and no live reader holds it).
    pub expired: bool,
}

/// What an existing stream makes of a create of its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recreated {
    /// The create repeats the stream's: confirmed, nothing written.
    Repeat,
    /// The stream has expired: it is removed, and the create answered by how
    /// ([`Removal::refusing_recreate`]).
    Expired,
}

impl Command for Recreate<'_> {
    type Outcome = Result<Recreated, Refusal>;

    /// A stream gone for good is not found (the create then makes a new one); one kept for its
    /// forks is a conflict, whatever the request; an expired one goes first; only then is the
    /// request compared with it.
    fn apply(self, ledger: &mut Ledger<'_>, _now_ms: i64) -> Self::Outcome {
        if *ledger.removed {
            return Err(Refusal::NotFound);
        }
        if ledger.meta.soft_deleted {
            return Err(Refusal::Conflict(Conflict::DeletedForForks));
        }
        if self.expired {
            return Ok(Recreated::Expired);
        }
        match self.requested.mismatch(ledger.meta) {
            Some(mismatch) => Err(Refusal::Conflict(Conflict::Exists(mismatch))),
            None => Ok(Recreated::Repeat),
        }
    }
}

impl Removal {
    /// How a create answers when the stream it found had expired and was removed this way: a
    /// stream gone for good is not found (the create makes a new one); one kept for its forks
    /// still holds the name.
    pub fn refusing_recreate(self) -> Refusal {
        match self {
            Removal::Hard => Refusal::NotFound,
            Removal::Soft => Refusal::Conflict(Conflict::ExpiredForForks),
        }
    }
}

/// Where a mirror starts: its upstream's retained start, creation time and snapshot.
#[derive(Clone, Copy, Debug)]
pub struct MirrorOrigin<'a> {
    pub at: Offset,
    pub created_ms: i64,
    pub snapshot: Option<&'a SnapshotInfo>,
}

/// What a fork starts from, once its source took it (see [`super::fork::TakeFork`]).
#[derive(Clone, Copy, Debug)]
pub struct ForkBase<'a> {
    pub source_id: u64,
    pub source_name: &'a str,
    /// The fork offset.
    pub anchor: Offset,
    pub sub_offset: u64,
    /// The records of the unit after the anchor that the fork copies.
    pub prefix: &'a [Record],
    /// The source's first retained offset, where the fork's history starts too.
    pub first: Offset,
    /// The source's latest timestamp, below which the fork's do not go.
    pub last_timestamp_ms: i64,
    /// The source's snapshot the fork starts with (its history is trimmed).
    pub snapshot: Option<&'a SnapshotInfo>,
}

/// A new stream, as its create asked for it.
pub struct Birth<'a> {
    pub name: &'a str,
    pub requested: &'a RequestedConfig,
    /// The bodies of its first records.
    pub bodies: Vec<Bytes>,
    pub mirror: Option<MirrorOrigin<'a>>,
    pub fork: Option<ForkBase<'a>>,
}

/// A new stream's metadata and the records it starts with (a fork's copied prefix, then the
/// create's body).
#[derive(Debug)]
pub struct Born {
    pub meta: StreamMeta,
    pub records: Vec<Record>,
}

impl Ledger<'_> {
    /// The stream `birth` makes at `now_ms`: a fork starts after its inherited history, a mirror
    /// where its upstream's retained records start (with the upstream's snapshot), any other
    /// stream at the start.
    pub fn create(birth: Birth<'_>, now_ms: i64) -> Born {
        let Birth {
            name,
            requested,
            bodies,
            mirror,
            fork,
        } = birth;
        let retained_from = match (fork, mirror) {
            (Some(fork), _) => fork.first,
            (None, Some(mirror)) => mirror.at,
            (None, None) => Offset::START,
        };
        let (start, mut records) = match fork {
            Some(fork) => (
                fork.prefix.last().map_or(fork.anchor, Record::next_offset),
                fork.prefix.to_vec(),
            ),
            None => (retained_from, Vec::new()),
        };
        // Timestamps never go back along a stream, a fork's included: its source's may be ahead
        // of this clock (S2 client timestamps).
        let inherited_ms = records
            .last()
            .map(|r| r.timestamp_ms)
            .or(fork.map(|f| f.last_timestamp_ms))
            .unwrap_or(0);
        records.extend(lay_out_arrived(
            start,
            now_ms.max(inherited_ms),
            now_ms,
            bodies,
        ));
        let mut meta = StreamMeta {
            ttl_secs: requested.ttl_secs,
            expires_at_ms: requested.expires_at_ms,
            closed: requested.closed,
            tail: records.last().map_or(start, Record::next_offset),
            // An empty stream's latest timestamp is 0 (S2's tail of a new stream); a fork starts
            // from its inherited history.
            last_timestamp_ms: records.last().map_or(inherited_ms, |r| r.timestamp_ms),
            // A mirror is its upstream's stream: it keeps the upstream's creation time, which
            // tells it apart from a later stream of the same name.
            created_ms: mirror.map_or(now_ms, |m| m.created_ms),
            retained_from,
            ..StreamMeta::new(name, &requested.content_type)
        };
        let snapshot = mirror
            .and_then(|m| m.snapshot)
            .or(fork.and_then(|f| f.snapshot));
        meta.set_extra(MetaExtra {
            fork: fork.map(|f| ForkOrigin {
                source_id: f.source_id,
                source_name: f.source_name.to_string(),
                offset: f.anchor,
                sub_offset: f.sub_offset,
            }),
            attrs: requested.attrs.clone(),
            cipher: requested.cipher.clone(),
            mirror_of: requested.mirror_of.clone(),
            s2_creation: requested.s2_creation.clone(),
            s2_config: requested.s2_config.clone(),
            snapshot: snapshot.cloned(),
            ..MetaExtra::default()
        });
        Born { meta, records }
    }
}

#[cfg(test)]
mod tests;
