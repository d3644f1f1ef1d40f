//! Starting and stopping a server from resolved settings.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpSocket};

mod connections;
pub mod control;
mod file_sending;
mod provision;
mod watched;

pub use connections::{ConnectionLimits, TlsError, tls_acceptor};

use crate::config::{Settings, StorageSettings, SyncArg};
use crate::http::{AppState, AuthConfig, BodyLimits, Handler, HttpConfig};
use crate::service::{ServiceConfig, StreamService};
use crate::storage::{FjallEngine, MemoryEngine, SharedEngine, SyncMode};

/// How often expired streams are swept away (reads also check expiry on access).
const SWEEP_INTERVAL: Duration = Duration::from_millis(250);
/// How often the metrics recorder folds the latency samples it has gathered into its histograms.
/// It keeps every sample until then: with no upkeep and nobody scraping `/metrics`, a server
/// kept 8 bytes and more for every request it ever answered (issue 48's memory growth).
const METRICS_UPKEEP_INTERVAL: Duration = Duration::from_secs(5);
/// How often S2 retention ages and delete-on-empty are applied, and long-expired access tokens
/// swept away.
const RETENTION_INTERVAL: Duration = Duration::from_secs(5);

pub async fn serve(settings: Settings) -> anyhow::Result<()> {
    // Before anything is opened: overlapping targets would make two sessions fight over one copy.
    crate::replication::check_targets(&settings.mirror_from).map_err(anyhow::Error::msg)?;
    if let Some(token) = &settings.mirror_token {
        crate::replication::check_token(token).map_err(anyhow::Error::msg)?;
    }
    let mirror_tls = match settings.mirror_from.is_empty() {
        true => None,
        false => Some(crate::replication::tls::client_config(
            settings.mirror_ca_cert.as_deref(),
        )?),
    };
    // The engine the control socket reaches, with its data directory.
    let mut controlled = None;
    let engine: SharedEngine = match &settings.storage {
        StorageSettings::Memory => {
            tracing::warn!(
                "--memory: streams are kept in memory only and are lost when the server stops"
            );
            Arc::new(MemoryEngine::new())
        }
        StorageSettings::Disk { dir, sync } => {
            let mode = match sync {
                SyncArg::Fsync => SyncMode::Fsync,
                SyncArg::None => {
                    tracing::warn!(
                        "--sync none: acknowledged appends may be lost if the machine crashes"
                    );
                    SyncMode::None
                }
            };
            let engine = FjallEngine::open(dir, mode, settings.min_free_bytes).map_err(|e| {
                anyhow::anyhow!("cannot open data directory {}: {e}", dir.display())
            })?;
            let engine = Arc::new(engine);
            controlled = Some((dir.clone(), engine.clone()));
            engine
        }
    };
    let service_config = ServiceConfig {
        max_streams_per_bucket: settings.max_streams_per_bucket,
        mirrored_buckets: settings
            .mirror_from
            .iter()
            .filter_map(|url| crate::replication::mirrored_bucket(url))
            .collect(),
        mirrored_streams: settings
            .mirror_from
            .iter()
            .filter_map(|url| crate::replication::mirrored_stream(url))
            .collect(),
        ..ServiceConfig::default()
    };
    let service = StreamService::open(engine, service_config)
        .map_err(|e| anyhow::anyhow!("cannot recover streams: {e}"))?;
    // Before anything else: what a crash cut short is finished first.
    service.settle_pending_trims().await;
    service.finish_basin_deletes().await;
    if let Some(path) = &settings.init_file {
        provision::apply_file(&service, path).await?;
    }

    let sweeper = service.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(SWEEP_INTERVAL);
        loop {
            tick.tick().await;
            sweeper.sweep_expired().await;
        }
    });
    let retention = service.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(RETENTION_INTERVAL);
        loop {
            tick.tick().await;
            retention.enforce_s2_configs().await;
            retention
                .sweep_expired_tokens(crate::service::now_ms())
                .await;
        }
    });

    let metrics = crate::http::install_metrics_recorder();
    if let Some(handle) = metrics.clone() {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(METRICS_UPKEEP_INTERVAL);
            loop {
                tick.tick().await;
                handle.run_upkeep();
            }
        });
    }
    let state = AppState::new(
        service,
        HttpConfig {
            long_poll_timeout: settings.long_poll_timeout,
            body: BodyLimits {
                max_bytes: settings.max_body_bytes,
                idle: settings.body_idle_timeout,
            },
            sse_max_duration: settings.sse_max_duration,
            auth: settings
                .auth
                .as_ref()
                .map(|auth| Arc::new(AuthConfig::new(&auth.operator_token, auth.rate_limit))),
            max_live_readers: settings.max_live_readers,
            send_timeout: settings.send_timeout,
            max_header_bytes: settings.max_header_bytes,
        },
        metrics,
    );
    let mirror_health = Arc::new(crate::replication::MirrorHealth::new(
        &settings.mirror_from,
        std::time::Instant::now(),
    ));
    let readiness = mirror_health.clone();
    state.set_readiness(Box::new(move || {
        readiness.problems(std::time::Instant::now())
    }));
    if let Some(tls) = mirror_tls {
        let credentials = crate::replication::Credentials {
            token: settings.mirror_token.clone(),
            tls,
        };
        for upstream in &settings.mirror_from {
            tracing::info!(upstream = %upstream, "mirroring");
            tokio::spawn(crate::replication::follow(
                state.service.clone(),
                upstream.clone(),
                credentials.clone(),
                mirror_health.clone(),
            ));
        }
    }
    let tls = settings
        .tls
        .as_ref()
        .map(|files| tls_acceptor(&files.cert, &files.key))
        .transpose()?;
    let limits = ConnectionLimits {
        header_read_timeout: settings.header_read_timeout,
        max_header_bytes: settings.max_header_bytes,
        max_connections: settings.max_connections,
        send_timeout: settings.send_timeout,
        shutdown_timeout: settings.shutdown_timeout,
    };
    let shutdown = state.service.shutdown_signal();
    if let Some((dir, engine)) = controlled {
        control::spawn(&dir, engine, shutdown.clone());
    }
    let service = state.service.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("shutting down: finishing requests in flight, ending live reads");
        service.begin_shutdown();
    });

    let listener = listen(settings.listen)
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", settings.listen))?;
    let local = listener.local_addr()?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    tracing::info!(listen = %local, %scheme, storage = ?settings.storage, "runnel is serving");
    // The one line on stdout: scripts and tests read the bound address here (`--listen …:0`).
    println!("runnel listening on {local}");
    connections::serve(listener, tls, Handler::new(state), limits, shutdown).await;
    tracing::info!("runnel stopped");
    Ok(())
}

/// Connections a burst may queue before the accept loop takes them (the kernel caps it at
/// `net.core.somaxconn`). With tokio's default of 1,024, 10,000 clients connecting at once
/// overflowed the queue, and each dropped connection retried its SYN a second or more later.
const LISTEN_BACKLOG: u32 = 4096;

fn listen(address: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = match address {
        SocketAddr::V4(_) => TcpSocket::new_v4()?,
        SocketAddr::V6(_) => TcpSocket::new_v6()?,
    };
    // As `TcpListener::bind` does: a restarted server binds while old connections linger.
    #[cfg(unix)]
    socket.set_reuseaddr(true)?;
    socket.bind(address)?;
    socket.listen(LISTEN_BACKLOG)
}

async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(signal) => signal,
                Err(_) => return interrupt.await.unwrap_or(()),
            };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    interrupt.await.unwrap_or(());
}
