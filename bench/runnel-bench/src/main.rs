//! `runnel-bench`: a load generator for Runnel and its peers (the Durable Streams reference
//! server and s2-lite). Every scenario prints a table and can write the same numbers as JSON.

mod api;
mod client;
mod noop;
mod scenarios;
mod stats;

use anyhow::{Result, bail};
use api::{Api, Ctx};
use clap::{Parser, Subcommand};
use scenarios::{Opts, ReplayOpts};
use stats::Report;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[derive(Parser)]
#[command(
    name = "runnel-bench",
    version,
    about = "Load generator for durable stream servers"
)]
struct Cli {
    /// Base URL of the server (a path prefix is kept).
    #[arg(long, global = true, default_value = "http://127.0.0.1:4437")]
    target: String,
    /// Which face to drive.
    #[arg(long, global = true, value_enum, default_value = "ds")]
    api: Api,
    /// Streams (append, batch, s2) or clients (fanout, replay).
    #[arg(long, short = 'n', visible_alias = "clients", global = true)]
    streams: Option<usize>,
    /// Measured time, after the warm-up: `10`, `10s`, `500ms`, `2m`.
    #[arg(long, global = true, default_value = "10s", value_parser = parse_duration)]
    duration: Duration,
    /// Warm-up before measuring (connections open, caches fill); not counted.
    #[arg(long, global = true, default_value = "2s", value_parser = parse_duration)]
    warmup: Duration,
    /// Payload bytes per message.
    #[arg(long, global = true, default_value_t = 256)]
    payload: usize,
    /// Client runtime threads (default: the CPUs this process may run on).
    #[arg(long, global = true)]
    threads: Option<usize>,
    /// Write the report as JSON here.
    #[arg(long, global = true)]
    out: Option<std::path::PathBuf>,
    /// A free-form label stored in the report (server name, round).
    #[arg(long, global = true, default_value = "")]
    label: String,
    /// Bucket (bucket face) or basin (S2 face) to use; created if missing.
    #[arg(long, global = true, default_value = "runnel-bench")]
    bucket: String,
    /// Speak HTTP/2 with prior knowledge (h2c) instead of HTTP/1.1, still one connection and
    /// one request in flight per writer or reader.
    #[arg(long, global = true)]
    http2: bool,
    /// Stream-name prefix (default: unique per run).
    #[arg(long, global = true)]
    run_id: Option<String>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// N streams, one closed-loop writer each, idempotent-producer headers on every append.
    Append,
    /// One stream, N SSE subscribers from the tail, one writer at --rate events/s.
    Fanout {
        #[arg(long, default_value_t = 50.0)]
        rate: f64,
    },
    /// N clients each reading a whole stream (default 200 x 1 KiB) from the start, repeatedly.
    Replay {
        #[arg(long, default_value_t = 200)]
        messages: usize,
        #[arg(long, default_value_t = 1024)]
        message_bytes: usize,
        /// How many streams the clients share (client i reads stream i mod K).
        #[arg(long, default_value_t = 1)]
        replay_streams: usize,
        /// Read through the bucket face's /bootstrap instead of catch-up GETs.
        #[arg(long)]
        bootstrap: bool,
    },
    /// Batched appends: append-batch frames (bucket), a JSON array (ds), N records (s2).
    Batch {
        #[arg(long, default_value_t = 512)]
        frames: usize,
    },
    /// N streams, each with a closed-loop writer and one SSE reader (S2-style write + tail).
    S2,
    /// Create N idle streams as fast as --conns connections allow (memory per idle stream).
    Idle {
        #[arg(long, default_value_t = 64)]
        conns: usize,
    },
    /// Fill one stream with --size-mb MiB, then read it from the start --reads times (MB/s).
    Catchup {
        #[arg(long, default_value_t = 1024)]
        size_mb: usize,
        /// Bytes per append while filling: 1 MiB appends are staged in files of their own,
        /// smaller ones are stored in the engine's records.
        #[arg(long, default_value_t = 1 << 20)]
        append_bytes: usize,
        #[arg(long, default_value_t = 3)]
        reads: usize,
    },
    /// Read one TCP connection to its end and print the bytes and seconds (the reader of the
    /// catch-up floor: a file sent with sendfile over loopback).
    Drain {
        #[arg(long)]
        connect: String,
    },
    /// A no-op HTTP server that answers 204 to everything (the client's ceiling); it sends
    /// each POST body to `?live=sse` subscribers (the fan-out floor).
    Noop {
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: String,
        /// Make it durable: append each POST body to a file here, group commit with fsync,
        /// before answering (the floor of a durable append).
        #[arg(long)]
        sync_dir: Option<std::path::PathBuf>,
    },
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, mult) = if let Some(n) = s.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else {
        (s, 1.0)
    };
    let v: f64 = num.parse().map_err(|_| format!("bad duration {s:?}"))?;
    Ok(Duration::from_secs_f64(v * mult))
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    if let Cmd::Drain { connect } = &cli.cmd {
        // Blocking, on this thread: no runtime to start.
        let (bytes, took) = noop::drain(connect)?;
        println!("{bytes} {}", took.as_secs_f64());
        return Ok(());
    }
    let threads = cli.threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    let rt = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()?
    };
    rt.block_on(run(cli, threads))
}

async fn run(cli: Cli, threads: usize) -> Result<()> {
    if let Cmd::Noop { listen, sync_dir } = &cli.cmd {
        return noop::serve(listen, sync_dir.as_deref()).await;
    }
    let target = client::Target::parse(&cli.target, cli.http2)?;
    let unix = SystemTime::now().duration_since(UNIX_EPOCH)?;
    let run = cli
        .run_id
        .clone()
        .unwrap_or_else(|| format!("rb{}", unix.as_millis() % 100_000_000_000));
    let ctx = Arc::new(Ctx {
        target,
        api: cli.api,
        bucket: cli.bucket.clone(),
    });
    let (scenario, default_n) = match &cli.cmd {
        Cmd::Append => ("append", 100),
        Cmd::Fanout { .. } => ("fanout", 100),
        Cmd::Replay { .. } => ("replay", 100),
        Cmd::Batch { .. } => ("batch", 4),
        Cmd::S2 => ("s2", 16),
        Cmd::Idle { .. } => ("idle", 100_000),
        Cmd::Catchup { .. } => ("catchup", 1),
        Cmd::Noop { .. } | Cmd::Drain { .. } => unreachable!(),
    };
    let n = cli.streams.unwrap_or(default_n);
    if n == 0 {
        bail!("--streams must be at least 1");
    }
    let opts = Opts {
        n,
        duration: cli.duration,
        warmup: cli.warmup,
        payload: cli.payload,
        run,
    };
    let mut params = serde_json::json!({ "payload": cli.payload });
    let rows = match cli.cmd {
        Cmd::Append => scenarios::append(ctx, opts).await?,
        Cmd::Fanout { rate } => {
            params["rate"] = rate.into();
            scenarios::fanout(ctx, opts, rate).await?
        }
        Cmd::Replay {
            messages,
            message_bytes,
            replay_streams,
            bootstrap,
        } => {
            params = serde_json::json!({ "messages": messages, "message_bytes": message_bytes,
                "replay_streams": replay_streams, "bootstrap": bootstrap });
            let r = ReplayOpts {
                messages,
                message_bytes,
                streams: replay_streams,
                bootstrap,
            };
            scenarios::replay(ctx, opts, r).await?
        }
        Cmd::Batch { frames } => {
            params["frames"] = frames.into();
            scenarios::batch(ctx, opts, frames).await?
        }
        Cmd::S2 => scenarios::write_tail(ctx, opts).await?,
        Cmd::Idle { conns } => {
            params["conns"] = conns.into();
            scenarios::idle(ctx, opts, conns).await?
        }
        Cmd::Catchup {
            size_mb,
            append_bytes,
            reads,
        } => {
            params = serde_json::json!({
                "size_mb": size_mb,
                "append_bytes": append_bytes,
                "reads": reads,
            });
            scenarios::catchup(ctx, opts, size_mb, append_bytes, reads).await?
        }
        Cmd::Noop { .. } | Cmd::Drain { .. } => unreachable!(),
    };
    let report = Report {
        scenario: scenario.to_string(),
        api: cli.api.name().to_string(),
        target: cli.target.clone(),
        label: cli.label.clone(),
        streams: n,
        duration_s: cli.duration.as_secs_f64(),
        warmup_s: cli.warmup.as_secs_f64(),
        client_threads: threads,
        unix_time: unix.as_secs(),
        params,
        rows,
    };
    report.print();
    if let Some(path) = &cli.out {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).ok();
        }
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)?;
    }
    Ok(())
}
