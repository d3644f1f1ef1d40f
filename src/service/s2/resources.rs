//! S2 basins and streams as resources: creating and ensuring them, their configuration, and a
//! basin's deletion with every stream in it.

use std::sync::Arc;

use futures::StreamExt as _;
use serde_json::{Value, json};

use crate::model::cipher;
use crate::model::ledger::create::repeat_of_s2_create;
use crate::model::ledger::settings::Reconfigure;
use crate::model::names;
use crate::model::s2::{self, BasinConfig, StreamConfig};
use crate::service::{
    CreateRequest, Creation, Stream, StreamError, StreamResult, StreamService, now_ms,
};
use crate::storage::Change;

/// Streams a basin delete removes at once (see `delete_basin`).
const BASIN_DELETES_AT_ONCE: usize = 64;

/// What an S2 ensure (`PUT`) did: made the resource, or found it and applied the configuration
/// over it (its stored configuration before and after).
#[derive(Clone, Debug, PartialEq)]
pub enum Ensured {
    Created,
    Existing {
        before: Option<serde_json::Value>,
        after: Option<serde_json::Value>,
    },
}

/// A stream configuration as stored.
fn config_value(config: &StreamConfig) -> Value {
    serde_json::to_value(config).unwrap_or_else(|_| json!({}))
}

/// A basin configuration as stored and reported.
pub fn basin_config_value(config: &BasinConfig) -> Value {
    serde_json::to_value(config).unwrap_or_else(|_| json!({}))
}

/// Parses an S2 configuration object: a malformed one is a bad request, an impossible one
/// invalid.
pub fn parse_config<T: serde::de::DeserializeOwned + s2::CheckedConfig>(
    value: &Value,
) -> StreamResult<T> {
    let config = T::deserialize(value)
        .map_err(|e| StreamError::BadRequest(format!("invalid config: {e}")))?;
    config
        .check()
        .map_err(|e| StreamError::Invalid(format!("invalid config: {e}")))?;
    Ok(config)
}

/// The stream configuration a create or an ensure asks for; none asks for nothing in particular.
fn asked_stream_config(config: Option<&Value>) -> StreamResult<StreamConfig> {
    Ok(config.map(parse_config).transpose()?.unwrap_or_default())
}

impl StreamService {
    /// The basin's S2 configuration. Every records request asks for it, so it looks up the one
    /// bucket and nothing else (no count of its streams, no copy of its stored JSON).
    pub fn basin_config(&self, basin: &str) -> StreamResult<BasinConfig> {
        self.with_bucket(basin, |meta| Ok(meta.s2_config.clone().unwrap_or_default()))
    }

    /// The S2 configuration a stream created through another face than S2 gets: its basin's
    /// default stream configuration, when the basin has one.
    pub(in crate::service) fn default_s2_config_for(
        &self,
        name: &str,
    ) -> StreamResult<Option<StreamConfig>> {
        let Some(bucket) = names::bucket_of(name) else {
            return Ok(None);
        };
        let basin = match self.basin_config(bucket) {
            Err(StreamError::BucketNotFound) => return Ok(None), // reported by the create
            other => other?,
        };
        Ok(basin
            .default_stream_config
            .is_some()
            .then(|| StreamConfig::default().resolved_in(&basin)))
    }

    /// Finds an S2 stream, creating it first when the basin says so for this operation.
    pub async fn stream_in_bucket(
        &self,
        basin: &str,
        name: &str,
        auto_create: Option<&Value>,
    ) -> StreamResult<Arc<Stream>> {
        let key = names::stream_key_in(basin, name)
            .map_err(|e| StreamError::BadRequest(e.to_string()))?;
        // Renewed once a read or an append is accepted, as on the other faces.
        match self.find(&key, false).await {
            Err(StreamError::NotFound) => {
                // A missing basin is reported before a missing stream.
                self.basin_config(basin)?;
                let Some(requested) = auto_create else {
                    return Err(StreamError::NotFound);
                };
                // `null`: the basin's default, which a stream created without one gets.
                let stream_config = Some(requested.clone()).filter(|c| !c.is_null());
                // Boxed: creation's state would otherwise ride in every append's future.
                match Box::pin(self.create_in_bucket(basin, name, stream_config, None)).await {
                    Ok(_) | Err(StreamError::AlreadyExists(_)) => self.find(&key, false).await,
                    Err(e) => Err(e),
                }
            }
            other => other,
        }
    }

    /// Creates an S2 stream: a byte stream in the basin, with its S2 configuration.
    pub async fn create_in_bucket(
        &self,
        basin: &str,
        name: &str,
        config: Option<Value>,
        s2_creation: Option<String>,
    ) -> StreamResult<Creation> {
        let key = names::stream_key_in(basin, name)
            .map_err(|e| StreamError::BadRequest(e.to_string()))?;
        let asked = asked_stream_config(config.as_ref())?;
        let basin_config = self.basin_config(basin)?;
        let outcome = self
            .create(CreateRequest {
                name: key.clone(),
                content_type: Some(crate::model::content_type::DEFAULT_CONTENT_TYPE.to_string()),
                cipher: basin_config.stream_cipher.clone(),
                s2_config: Some(asked.resolved_in(&basin_config)),
                s2_creation: s2_creation.clone(),
                ..Default::default()
            })
            .await
            .map_err(|e| match e {
                // A stream made through Durable Streams with other settings (content type, TTL,
                // closed) still exists under this name, which is all S2 says.
                StreamError::Conflict(_) => StreamError::AlreadyExists("stream"),
                other => other,
            })?;
        if !outcome.created {
            let stream = self.find(&key, false).await?;
            let made_by = stream.lock().meta.extra().s2_creation.clone();
            return Ok(repeat_of_s2_create(
                "stream",
                made_by.as_deref(),
                s2_creation.as_deref(),
            )?);
        }
        Ok(Creation::New)
    }

    /// Creates an S2 stream, or makes the existing one's configuration what a stream created
    /// now would get (S2's ensure: "updated to the specified configuration, if different").
    pub async fn ensure_in_bucket(
        &self,
        basin: &str,
        name: &str,
        config: Option<Value>,
    ) -> StreamResult<Ensured> {
        match self
            .create_in_bucket(basin, name, config.clone(), None)
            .await
        {
            Ok(_) => Ok(Ensured::Created),
            Err(StreamError::AlreadyExists(_)) => {
                let key = names::stream_key_in(basin, name)
                    .map_err(|e| StreamError::BadRequest(e.to_string()))?;
                let stream = self.find(&key, false).await?;
                let before = self.stream_config_of(&stream);
                let asked = asked_stream_config(config.as_ref())?;
                let desired = asked.resolved_in(&self.basin_config(basin)?);
                let after = self.update_stream_config(&key, |_| Ok(desired)).await?;
                Ok(Ensured::Existing {
                    before: Some(before),
                    after: Some(after),
                })
            }
            Err(e) => Err(e),
        }
    }

    /// Creates a basin, or makes the existing one's configuration `config` (S2's ensure). A new
    /// basin's name must follow S2's rule; any existing bucket is a basin.
    pub async fn ensure_basin(&self, basin: &str, config: Option<Value>) -> StreamResult<Ensured> {
        self.bucket_writable(basin)?;
        if let Some(config) = &config {
            self.check_basin_config(config)?;
        }
        if self.bucket_info(basin).is_err() && !s2::is_valid_basin_name(basin) {
            return Err(StreamError::Invalid(s2::BASIN_NAME_RULE.into()));
        }
        match self.create_bucket(basin, config.clone(), None).await {
            Ok(_) => Ok(Ensured::Created),
            Err(StreamError::AlreadyExists(_)) => {
                let before = self.bucket_info(basin)?.s2_config;
                let desired = config.unwrap_or_else(|| Value::Object(Default::default()));
                let after = self
                    .update_basin_config(basin, |stored| *stored = desired)
                    .await?;
                Ok(Ensured::Existing {
                    before,
                    after: Some(after),
                })
            }
            Err(e) => Err(e),
        }
    }

    /// The stream's S2 configuration, as stored.
    pub fn stream_config_of(&self, stream: &Stream) -> Value {
        let config = stream.lock().meta.extra().s2_config.clone();
        config.map_or_else(|| Value::Object(Default::default()), |c| config_value(&c))
    }

    /// Applies an S2 reconfiguration: JSON Merge Patch over the stored configuration, where a
    /// field reset with `null` takes the basin's default again.
    pub async fn reconfigure_stream(
        &self,
        basin: &str,
        name: &str,
        patch: &Value,
    ) -> StreamResult<Value> {
        let key = names::stream_key_in(basin, name)
            .map_err(|e| StreamError::BadRequest(e.to_string()))?;
        let basin_config = self.basin_config(basin)?;
        self.update_stream_config(&key, |stored| {
            let mut patched = stored.clone();
            s2::merge_patch(&mut patched, patch);
            Ok(parse_config::<StreamConfig>(&patched)?.resolved_in(&basin_config))
        })
        .await
    }

    /// Changes the stored S2 configuration of a stream to what `change` makes of it.
    async fn update_stream_config(
        &self,
        key: &str,
        change: impl FnOnce(&Value) -> StreamResult<StreamConfig>,
    ) -> StreamResult<Value> {
        let stream = self.find(key, false).await?;
        Self::writable(&stream)?;
        let (config, commit) = {
            let mut state = stream.lock_present()?;
            let stored = (state.meta.extra().s2_config.as_ref())
                .map_or_else(|| Value::Object(Default::default()), config_value);
            let config = change(&stored)?;
            (state.ledger(&stream)).apply(Reconfigure(config.clone()), now_ms())?;
            (
                config,
                self.engine.commit(vec![Change::PutStream(
                    stream.id,
                    Box::new(state.meta.clone()),
                )]),
            )
        };
        commit.await?;
        Ok(config_value(&config))
    }

    /// Applies an S2 reconfiguration to a basin.
    pub async fn reconfigure_basin(&self, basin: &str, patch: &Value) -> StreamResult<Value> {
        self.update_basin_config(basin, |config| s2::merge_patch(config, patch))
            .await
    }

    /// Changes the stored S2 configuration of a basin, and checks the result before it is
    /// stored.
    async fn update_basin_config(
        &self,
        basin: &str,
        change: impl FnOnce(&mut Value),
    ) -> StreamResult<Value> {
        self.bucket_writable(basin)?;
        let (config, commit) = {
            let mut registry = self.lock_registry();
            let meta = registry
                .buckets
                .get_mut(basin)
                .ok_or(StreamError::BucketNotFound)?;
            let mut config = (meta.s2_config.as_ref())
                .map_or_else(|| Value::Object(Default::default()), basin_config_value);
            change(&mut config);
            let typed = self.checked_basin_config(&config)?;
            let config = basin_config_value(&typed);
            meta.s2_config = Some(typed);
            (
                config,
                self.engine
                    .commit(vec![Change::PutBucket(basin.to_string(), meta.clone())]),
            )
        };
        commit.await?;
        Ok(config)
    }

    /// Deletes a basin with every stream in it (S2 semantics; the bucket API only deletes empty
    /// buckets). The work runs in its own task: a client that goes away does not cut the
    /// stream removals in flight short, which would leave their commits without the in-memory
    /// removals that follow them.
    pub async fn delete_basin(self: &Arc<Self>, basin: &str) -> StreamResult<()> {
        let (service, basin) = (Arc::clone(self), basin.to_string());
        tokio::spawn(async move { service.delete_basin_streams(&basin).await })
            .await
            .map_err(|_| StreamError::from(crate::storage::StorageError::Failed))?
    }

    async fn delete_basin_streams(&self, basin: &str) -> StreamResult<()> {
        self.bucket_writable(basin)?;
        // Marked first, so that a delete cut short by a crash is finished, not half done.
        self.set_deleting(basin, true).await?;
        loop {
            let listing = self.list_streams(basin, "", None, 1000, |_| true)?;
            if listing.streams.is_empty() {
                break;
            }
            // Many at once, so the group commit takes them together rather than one fsync each.
            let deletes = listing.streams.into_iter().map(|summary| async move {
                let key = names::stream_key_in(basin, &summary.stream_id)
                    .map_err(|e| StreamError::BadRequest(e.to_string()))?;
                match self.delete(&key).await {
                    Ok(()) | Err(StreamError::NotFound) | Err(StreamError::Gone) => Ok(()),
                    Err(e) => Err(e),
                }
            });
            let mut deletes =
                futures::stream::iter(deletes).buffer_unordered(BASIN_DELETES_AT_ONCE);
            // Each delete runs to its end (a dropped one could leave its commit without its
            // in-memory removal); the first failure is reported once all are done.
            let mut failed = None;
            while let Some(deleted) = deletes.next().await {
                if let Err(e) = deleted {
                    failed.get_or_insert(e);
                }
            }
            if let Some(e) = failed {
                return Err(e);
            }
        }
        match self.delete_bucket(basin).await {
            // Streams deleted while forks elsewhere still read them stay in the bucket: the
            // delete cannot finish, and the basin goes back to taking streams.
            Err(e @ StreamError::Conflict(_)) => {
                match self.set_deleting(basin, false).await {
                    // Deleted meanwhile by a concurrent delete: nothing left to unmark.
                    Ok(()) | Err(StreamError::BucketNotFound) => Err(e),
                    Err(other) => Err(other),
                }
            }
            other => other,
        }
    }

    /// Stores the basin's `deleting` mark, unless it already has that value.
    async fn set_deleting(&self, basin: &str, deleting: bool) -> StreamResult<()> {
        let commit = {
            let mut registry = self.lock_registry();
            let meta = (registry.buckets.get_mut(basin)).ok_or(StreamError::BucketNotFound)?;
            (meta.deleting != deleting).then(|| {
                meta.deleting = deleting;
                self.engine
                    .commit(vec![Change::PutBucket(basin.to_string(), meta.clone())])
            })
        };
        if let Some(commit) = commit {
            commit.await?;
        }
        Ok(())
    }

    /// Finishes the basin deletes the server stopped in the middle of.
    pub async fn finish_basin_deletes(self: &Arc<Self>) {
        let deleting: Vec<String> = {
            let registry = self.lock_registry();
            (registry.buckets.iter())
                .filter(|(_, meta)| meta.deleting)
                .map(|(name, _)| name.clone())
                .collect()
        };
        for basin in deleting {
            match self.delete_basin(&basin).await {
                Ok(()) => tracing::info!(basin = %basin, "finished deleting the basin"),
                Err(e) => tracing::warn!(basin = %basin, error = %e, "deleting the basin failed"),
            }
        }
    }

    /// Checks a basin configuration, including that its cipher is one Runnel offers.
    pub fn check_basin_config(&self, config: &Value) -> StreamResult<()> {
        self.checked_basin_config(config).map(|_| ())
    }

    /// [`Self::check_basin_config`], and the configuration it checked.
    fn checked_basin_config(&self, config: &Value) -> StreamResult<BasinConfig> {
        let config: BasinConfig = parse_config(config)?;
        if let Some(cipher) = &config.stream_cipher {
            cipher::check_cipher(cipher)?;
        }
        Ok(config)
    }
}
