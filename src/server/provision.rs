//! `--init-file`: the S2 basins and streams a file declares, created or brought to their
//! declared configuration at start, as S2's ensure (`PUT`) does. Applying the same file again
//! changes nothing.

use std::path::Path;

use anyhow::{Context, anyhow};

use crate::model::provision::{self, Resources};
use crate::service::{Ensured, StreamService};

/// Reads the file and applies it; the first thing that fails stops it, with what and why.
pub async fn apply_file(service: &StreamService, path: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the init file {}", path.display()))?;
    let resources = provision::parse(&text)
        .map_err(|e| anyhow!("the init file {} is malformed: {e}", path.display()))?;
    apply(service, &resources).await
}

async fn apply(service: &StreamService, resources: &Resources) -> anyhow::Result<()> {
    for basin in &resources.basins {
        let name = &basin.name;
        let config = basin
            .config
            .as_ref()
            .map(|c| c.to_api())
            .transpose()
            .map_err(|e| anyhow!("basin {name:?}: {e}"))?;
        let ensured = service
            .ensure_basin(name, config)
            .await
            .map_err(|e| anyhow!("basin {name:?}: {e}"))?;
        tracing::info!(basin = %name, outcome = outcome(&ensured), "init file: basin applied");
        for stream in &basin.streams {
            let what = || format!("stream {:?} in basin {name:?}", stream.name);
            let config = stream
                .config
                .as_ref()
                .map(|c| c.to_api())
                .transpose()
                .map_err(|e| anyhow!("{}: {e}", what()))?;
            let ensured = service
                .ensure_in_bucket(name, &stream.name, config)
                .await
                .map_err(|e| anyhow!("{}: {e}", what()))?;
            tracing::info!(basin = %name, stream = %stream.name, outcome = outcome(&ensured), "init file: stream applied");
        }
    }
    Ok(())
}

fn outcome(ensured: &Ensured) -> &'static str {
    match ensured {
        Ensured::Created => "created",
        Ensured::Existing { before, after } if before == after => "unchanged",
        Ensured::Existing { .. } => "reconfigured",
    }
}
