//! Buckets (seed 000 §1): explicit namespaces of streams, created empty and deleted only empty.

use std::sync::Arc;

use super::s2::basin_config_value;
use super::{Creation, Stream, StreamError, StreamResult, StreamService, now_ms, parse_s2_config};
use crate::model::Offset;
use crate::model::ledger::create::repeat_of_s2_create;
use crate::model::names::{self, bucket_prefix};
use crate::model::stream::BucketMeta;
use crate::storage::Change;

#[derive(Clone, Debug)]
pub struct BucketInfo {
    pub created_ms: i64,
    pub s2_config: Option<serde_json::Value>,
}

/// One stream as a bucket listing shows it.
#[derive(Clone, Debug)]
pub struct StreamSummary {
    pub stream_id: String,
    pub closed: bool,
    pub content_type: String,
    pub tail: Offset,
    pub created_ms: i64,
    pub last_write_ms: i64,
    /// The cipher of an encrypted S2 stream.
    pub cipher: Option<String>,
}

#[derive(Clone, Debug)]
pub struct Listing {
    pub streams: Vec<StreamSummary>,
    pub has_more: bool,
}

impl StreamService {
    /// Creates a bucket (an S2 basin, with its S2 configuration when created through S2).
    /// Creates a bucket. `s2_creation` identifies the S2 create request
    /// ([`crate::model::s2::creation_key`]): a retry of it finds the bucket it made.
    pub async fn create_bucket(
        &self,
        bucket: &str,
        s2_config: Option<serde_json::Value>,
        s2_creation: Option<String>,
    ) -> StreamResult<Creation> {
        names::validate_new_bucket_id(bucket)
            .map_err(|e| StreamError::BadRequest(e.to_string()))?;
        self.engine.room()?;
        let s2_config = s2_config.as_ref().map(parse_s2_config).transpose()?;
        let meta = BucketMeta {
            created_ms: now_ms(),
            s2_config,
            s2_creation,
            deleting: false,
        };
        let commit = {
            let mut registry = self.lock_registry();
            if let Some(existing) = registry.buckets.get(bucket) {
                let made_by = existing.s2_creation.as_deref();
                return Ok(repeat_of_s2_create(
                    "bucket",
                    made_by,
                    meta.s2_creation.as_deref(),
                )?);
            }
            registry.buckets.insert(bucket.to_string(), meta.clone());
            self.engine
                .commit(vec![Change::PutBucket(bucket.to_string(), meta)])
        };
        if let Err(e) = commit.await {
            self.lock_registry().buckets.remove(bucket);
            return Err(e.into());
        }
        Ok(Creation::New)
    }

    /// The bucket's own facts; `BucketNotFound` doubles as the existence check. It touches no
    /// stream: S2 requests ask it on every call.
    pub fn bucket_info(&self, bucket: &str) -> StreamResult<BucketInfo> {
        self.with_bucket(bucket, |meta| {
            Ok(BucketInfo {
                created_ms: meta.created_ms,
                s2_config: meta.s2_config.as_ref().map(basin_config_value),
            })
        })
    }

    /// Runs `f` on the bucket's metadata, under the registry lock: keep it short.
    pub(super) fn with_bucket<T>(
        &self,
        bucket: &str,
        f: impl FnOnce(&BucketMeta) -> StreamResult<T>,
    ) -> StreamResult<T> {
        let registry = self.lock_registry();
        f(registry
            .buckets
            .get(bucket)
            .ok_or(StreamError::BucketNotFound)?)
    }

    /// How many of the bucket's streams the caller can see: those whose id is `shown` (its
    /// scope), not deleted, not expired. It looks at every one of them.
    pub fn bucket_stream_count(
        &self,
        bucket: &str,
        shown: impl Fn(&str) -> bool,
    ) -> StreamResult<usize> {
        self.with_bucket(bucket, |_| Ok(()))?;
        let key_prefix = bucket_prefix(bucket);
        let now = now_ms();
        let counted = self.streams_where(
            |registry| &registry.streams,
            &key_prefix,
            |s| (shown(&s.name[key_prefix.len()..]) && visible(s, now)).then_some(()),
        );
        Ok(counted.len())
    }

    /// Deletes an empty bucket. Streams kept only for their forks still count: their data lives on.
    pub async fn delete_bucket(&self, bucket: &str) -> StreamResult<()> {
        self.bucket_writable(bucket)?;
        // Expired streams are gone for clients; make them gone for the bucket too.
        self.sweep_expired().await;
        let commit = {
            let mut registry = self.lock_registry();
            if !registry.buckets.contains_key(bucket) {
                return Err(StreamError::BucketNotFound);
            }
            let prefix = bucket_prefix(bucket);
            let first_member = registry.streams_from(&prefix).next();
            if first_member.is_some_and(|(key, _)| key.starts_with(&prefix)) {
                return Err(StreamError::Conflict("bucket is not empty"));
            }
            registry.buckets.remove(bucket);
            self.engine
                .commit(vec![Change::RemoveBucket(bucket.to_string())])
        };
        commit.await?;
        Ok(())
    }

    /// How a bucket listing shows this stream.
    pub fn stream_summary(&self, stream: &Stream) -> StreamSummary {
        let prefix = names::bucket_of(&stream.name)
            .map(bucket_prefix)
            .unwrap_or_default();
        summary(stream, &prefix)
    }

    /// Buckets whose names start with `prefix`, after `after`, sorted by name, with whether more
    /// follow.
    /// Buckets whose names start with `prefix`, after `after`, that `shown` lets the caller see.
    pub fn list_buckets(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
        shown: impl Fn(&str) -> bool,
    ) -> (Vec<(String, BucketMeta)>, bool) {
        let registry = self.lock_registry();
        let mut page: Vec<(String, BucketMeta)> = registry
            .buckets
            .range(prefix.to_string()..)
            .take_while(|(name, _)| name.starts_with(prefix))
            .filter(|(name, _)| after.is_none_or(|a| name.as_str() > a) && shown(name))
            .take(limit + 1)
            .map(|(name, meta)| (name.clone(), meta.clone()))
            .collect();
        let has_more = page.len() > limit;
        page.truncate(limit);
        (page, has_more)
    }

    /// Streams of a bucket whose ids start with `prefix`, after `after`, sorted by id, that
    /// `shown` lets the caller see.
    pub fn list_streams(
        &self,
        bucket: &str,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
        shown: impl Fn(&str) -> bool,
    ) -> StreamResult<Listing> {
        let key_prefix = bucket_prefix(bucket);
        let start = format!("{key_prefix}{prefix}");
        let now = now_ms();
        let mut streams = Vec::new();
        // The key the page goes on after.
        let mut cursor = after.map(|after| format!("{key_prefix}{after}"));
        // A page's worth of candidates at a time, beginning at the cursor: the registry lock
        // (which every request takes) is never held over the whole bucket.
        loop {
            let candidates: Vec<Arc<Stream>> = {
                let registry = self.lock_registry();
                if !registry.buckets.contains_key(bucket) {
                    return Err(StreamError::BucketNotFound);
                }
                let begin = cursor.as_deref().map_or(start.as_str(), |c| c.max(&start));
                registry
                    .streams_from(begin)
                    .take_while(|(key, _)| key.starts_with(&start))
                    .filter(|(key, _)| {
                        cursor.as_deref().is_none_or(|c| &***key > c)
                            && shown(&key[key_prefix.len()..])
                    })
                    .take(limit + 1)
                    .map(|(_, stream)| stream.clone())
                    .collect()
            };
            // Fewer than asked for: the bucket has no more.
            let last_batch = candidates.len() <= limit;
            cursor = candidates.last().map(|stream| stream.name.to_string());
            let shown_now = candidates.iter().filter(|s| visible(s, now));
            streams.extend(shown_now.map(|s| summary(s, &key_prefix)));
            if streams.len() > limit || last_batch {
                break;
            }
        }
        let has_more = streams.len() > limit;
        streams.truncate(limit);
        Ok(Listing { streams, has_more })
    }
}

/// Whether clients can see the stream: not deleted, not expired.
fn visible(stream: &Stream, now: i64) -> bool {
    let state = stream.lock();
    !state.removed && !state.meta.soft_deleted && !stream.expired(&state, now)
}

fn summary(stream: &Stream, key_prefix: &str) -> StreamSummary {
    let durable = stream.durable();
    let state = stream.lock();
    StreamSummary {
        stream_id: stream.name[key_prefix.len()..].to_string(),
        closed: durable.closed,
        content_type: stream.content_type.to_string(),
        tail: durable.tail,
        created_ms: state.meta.created_ms,
        // An empty stream was last written when it was created.
        last_write_ms: state.meta.last_timestamp_ms.max(state.meta.created_ms),
        cipher: state.meta.extra().cipher.clone(),
    }
}

#[cfg(test)]
mod tests;
