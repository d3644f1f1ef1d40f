//! Configuration of `runnel serve`: command-line flags, their `RUNNEL_*` environment twins, and
//! an optional TOML file. A flag (or its variable) wins over the file; the file wins over the
//! defaults. The data tools' arguments are in `tools.rs`.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::builder::BoolishValueParser;
use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::Deserialize;

pub const DEFAULT_LISTEN: &str = "127.0.0.1:4437";
pub const DEFAULT_DATA_DIR: &str = "./runnel-data";
pub const DEFAULT_LONG_POLL_TIMEOUT_MS: u64 = 30_000;
pub const DEFAULT_MAX_BODY_BYTES: usize = 64 << 20;
/// The highest `--max-body-bytes`: what a mirror takes from any upstream is sized from it.
pub const MAX_BODY_BYTES_LIMIT: usize = 1 << 30;
pub const DEFAULT_SSE_MAX_DURATION_SECS: u64 = 60;
pub const DEFAULT_HEADER_READ_TIMEOUT_SECS: u64 = 10;
pub const DEFAULT_BODY_IDLE_TIMEOUT_SECS: u64 = 30;
pub const DEFAULT_SEND_TIMEOUT_SECS: u64 = 30;
pub const DEFAULT_MAX_HEADER_BYTES: usize = 64 << 10;
/// The smallest `--max-header-bytes`: hyper's HTTP/1.1 read buffer has this floor.
pub const MIN_MAX_HEADER_BYTES: usize = 8192;
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
pub const DEFAULT_SHUTDOWN_TIMEOUT_SECS: u64 = 10;
pub const DEFAULT_MAX_LIVE_READERS: usize = 10_000;
pub const DEFAULT_MIN_FREE_BYTES: u64 = 64 << 20;

#[derive(Debug, Parser)]
#[command(
    name = "runnel",
    version,
    about = "A durable stream server",
    after_help = "Logging: RUST_LOG filters what is logged, in tracing's syntax (for example \
                  `RUST_LOG=debug`, or `RUST_LOG=warn,runnel=debug`); without it, Runnel logs at \
                  info and its dependencies at warn, without the access log (a line per request, \
                  target runnel::access: `RUST_LOG=info`, or \
                  `RUST_LOG=warn,runnel=info,runnel::access=info`)."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    #[command(flatten)]
    pub log: LogArgs,
}

#[derive(Debug, Default, Args)]
pub struct LogArgs {
    /// How log lines are written to stderr: text (coloured only on a terminal) or json, one
    /// object per line [default: text].
    #[arg(long, global = true, env = "RUNNEL_LOG_FORMAT", value_enum)]
    pub log_format: Option<LogFormat>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the server.
    Serve(Box<ServeArgs>),
    /// Write a consistent backup of a data directory to a file, while a server runs on it or
    /// not.
    Backup(BackupArgs),
    /// Put a backup back into a new or empty data directory.
    Restore(RestoreArgs),
    /// Check a data directory, or a backup file, and report damage; nothing is changed. Exits
    /// with 1 when it finds any.
    Verify(VerifyArgs),
    /// Write one stream's content, read from a running server, as raw bytes or JSON lines.
    Export(ExportArgs),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SyncArg {
    /// fsync before acknowledging an append (the default): nothing acknowledged is lost.
    Fsync,
    /// Acknowledge once written to the OS: survives a crash of the process, not of the machine.
    None,
}

#[derive(Debug, Default, Args)]
pub struct ServeArgs {
    /// Address to listen on, as ip:port or host:port (the host's first address) [default:
    /// 127.0.0.1:4437].
    #[arg(long, env = "RUNNEL_LISTEN")]
    pub listen: Option<String>,
    /// Directory for stream data [default: ./runnel-data].
    #[arg(long, env = "RUNNEL_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Keep everything in memory, nothing on disk (for tests and benchmarks).
    #[arg(long, env = "RUNNEL_MEMORY", value_parser = BoolishValueParser::new())]
    pub memory: bool,
    /// Durability of acknowledged appends [default: fsync].
    #[arg(long, env = "RUNNEL_SYNC", value_enum)]
    pub sync: Option<SyncArg>,
    /// How long a long-poll read waits for new data before answering 204 [default: 30000].
    #[arg(long, env = "RUNNEL_LONG_POLL_TIMEOUT_MS")]
    pub long_poll_timeout_ms: Option<u64>,
    /// Largest accepted request body in bytes; larger ones get 413 [default: 67108864].
    #[arg(long, env = "RUNNEL_MAX_BODY_BYTES")]
    pub max_body_bytes: Option<usize>,
    /// How long one SSE connection stays open before the server ends it [default: 60].
    #[arg(long, env = "RUNNEL_SSE_MAX_DURATION_SECS")]
    pub sse_max_duration_secs: Option<u64>,
    /// Mirror an upstream Runnel bucket (http://host:port/bucket, or https://) or stream
    /// (http://host:port/bucket/stream), read-only, over StreamLD replication. Repeatable; the
    /// environment variable takes a comma-separated list.
    #[arg(
        long = "mirror-from",
        env = "RUNNEL_MIRROR_FROM",
        value_delimiter = ','
    )]
    pub mirror_from: Vec<String>,
    /// PEM certificate chain: serve HTTPS (HTTP/2 by ALPN, and HTTP/1.1) instead of plain HTTP.
    /// Needs --tls-key.
    #[arg(long, env = "RUNNEL_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for --tls-cert.
    #[arg(long, env = "RUNNEL_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// How long a client may take to send a request's headers; also how long an idle connection
    /// is kept open (HTTP/2: one with no request open) [default: 10].
    #[arg(long, env = "RUNNEL_HEADER_READ_TIMEOUT_SECS")]
    pub header_read_timeout_secs: Option<u64>,
    /// How long a request body may send nothing before the request is refused with 408 (S2
    /// append sessions excepted) [default: 30].
    #[arg(long, env = "RUNNEL_BODY_IDLE_TIMEOUT_SECS")]
    pub body_idle_timeout_secs: Option<u64>,
    /// How long a response may wait on a client that reads nothing before its connection is
    /// closed (stalled SSE, long-poll and catch-up readers) [default: 30].
    #[arg(long, env = "RUNNEL_SEND_TIMEOUT_SECS")]
    pub send_timeout_secs: Option<u64>,
    /// Largest request head in bytes, at least 8192; larger ones get 431 [default: 65536].
    #[arg(long, env = "RUNNEL_MAX_HEADER_BYTES")]
    pub max_header_bytes: Option<usize>,
    /// Connections open at once; more are closed on arrival [default: 10000].
    #[arg(long, env = "RUNNEL_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// Free disk space to keep: below it, writes get 507 until space returns [default:
    /// 67108864; 0 turns the check off].
    #[arg(long, env = "RUNNEL_MIN_FREE_BYTES")]
    pub min_free_bytes: Option<u64>,
    /// Live readers (long-polls, SSE, S2S read sessions) served at once; more get 503 with
    /// Retry-After [default: 10000].
    #[arg(long, env = "RUNNEL_MAX_LIVE_READERS")]
    pub max_live_readers: Option<usize>,
    /// Streams one bucket (S2 basin) may hold; creating more gets 409 [default: no limit].
    #[arg(long, env = "RUNNEL_MAX_STREAMS_PER_BUCKET")]
    pub max_streams_per_bucket: Option<usize>,
    /// On SIGTERM or Ctrl-C, how long to wait for in-flight requests [default: 10].
    #[arg(long, env = "RUNNEL_SHUTDOWN_TIMEOUT_SECS")]
    pub shutdown_timeout_secs: Option<u64>,
    /// Require a bearer token on every request (except /healthz, /readyz and CORS preflights).
    /// Needs --auth-token.
    #[arg(long, env = "RUNNEL_AUTH", value_parser = BoolishValueParser::new())]
    pub auth: bool,
    /// The operator token, which may do everything, including issuing scoped tokens through
    /// /v1/access-tokens. Prefer the environment variable to keep it out of process listings.
    #[arg(long, env = "RUNNEL_AUTH_TOKEN", hide_env_values = true)]
    pub auth_token: Option<String>,
    /// With --auth: requests per second one token may make, with a burst of as many; beyond it
    /// 429 [default: no limit].
    #[arg(long, env = "RUNNEL_RATE_LIMIT")]
    pub rate_limit: Option<u32>,
    /// Token a mirror presents to its upstream (--mirror-from).
    #[arg(long, env = "RUNNEL_MIRROR_TOKEN", hide_env_values = true)]
    pub mirror_token: Option<String>,
    /// PEM certificates a mirror trusts for an https upstream, besides the system's roots (for an
    /// upstream whose certificate a private authority signed).
    #[arg(long, env = "RUNNEL_MIRROR_CA_CERT")]
    pub mirror_ca_cert: Option<PathBuf>,
    /// JSON file of S2 basins and streams to create, or to bring to the configuration it gives,
    /// at every start (the resource spec of s2-lite's --init-file); the server does not start if
    /// any of it fails.
    #[arg(long, env = "RUNNEL_INIT_FILE")]
    pub init_file: Option<PathBuf>,
    /// TOML file with any of the settings above (keys as the flags, with underscores).
    #[arg(long, env = "RUNNEL_CONFIG")]
    pub config: Option<PathBuf>,
}

/// The settings file: every key optional, unknown keys refused.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    listen: Option<String>,
    data_dir: Option<PathBuf>,
    memory: Option<bool>,
    sync: Option<SyncArg>,
    long_poll_timeout_ms: Option<u64>,
    max_body_bytes: Option<usize>,
    sse_max_duration_secs: Option<u64>,
    #[serde(default)]
    mirror_from: Vec<String>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    header_read_timeout_secs: Option<u64>,
    body_idle_timeout_secs: Option<u64>,
    send_timeout_secs: Option<u64>,
    max_header_bytes: Option<usize>,
    max_connections: Option<usize>,
    shutdown_timeout_secs: Option<u64>,
    max_live_readers: Option<usize>,
    max_streams_per_bucket: Option<usize>,
    min_free_bytes: Option<u64>,
    auth: Option<bool>,
    auth_token: Option<String>,
    rate_limit: Option<u32>,
    mirror_token: Option<String>,
    mirror_ca_cert: Option<PathBuf>,
    init_file: Option<PathBuf>,
}

/// Where streams are kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StorageSettings {
    Memory,
    Disk { dir: PathBuf, sync: SyncArg },
}

/// Fully resolved settings of a server.
#[derive(Clone, Debug)]
pub struct Settings {
    pub listen: SocketAddr,
    pub storage: StorageSettings,
    pub long_poll_timeout: Duration,
    pub max_body_bytes: usize,
    pub sse_max_duration: Duration,
    /// Upstream buckets or streams to mirror.
    pub mirror_from: Vec<String>,
    /// Certificate chain and key files, when serving TLS.
    pub tls: Option<TlsFiles>,
    pub header_read_timeout: Duration,
    pub body_idle_timeout: Duration,
    pub send_timeout: Duration,
    pub max_header_bytes: usize,
    pub max_connections: usize,
    pub shutdown_timeout: Duration,
    pub max_live_readers: usize,
    pub max_streams_per_bucket: Option<usize>,
    /// Free disk space below which writes are refused (0: no check).
    pub min_free_bytes: u64,
    /// Bearer-token authentication, when on.
    pub auth: Option<AuthSettings>,
    /// What a mirror presents to its upstream.
    pub mirror_token: Option<String>,
    /// Certificates a mirror trusts for its upstream besides the system's.
    pub mirror_ca_cert: Option<PathBuf>,
    /// S2 basins and streams to provision at start.
    pub init_file: Option<PathBuf>,
}

#[derive(Clone, PartialEq, Eq)]
pub struct AuthSettings {
    pub operator_token: String,
    pub rate_limit: Option<u32>,
}

impl std::fmt::Debug for AuthSettings {
    // Never print the token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthSettings")
            .field("rate_limit", &self.rate_limit)
            .finish_non_exhaustive()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    // The cause is the error's source, which the caller prints after this.
    #[error("cannot read config file {path}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config file {path}")]
    Parse {
        path: PathBuf,
        source: Box<toml::de::Error>,
    },
    #[error("{0}")]
    Invalid(String),
}

impl ServeArgs {
    pub fn resolve(self) -> Result<Settings, ConfigError> {
        let file = match &self.config {
            Some(path) => load_file(path)?,
            None => FileConfig::default(),
        };
        refuse_flags_that_do_nothing(&self, &file)?;
        let listen = listen_address(
            self.listen
                .or(file.listen)
                .as_deref()
                .unwrap_or(DEFAULT_LISTEN),
        )?;
        let mirror_from = if self.mirror_from.is_empty() {
            file.mirror_from
        } else {
            self.mirror_from
        };
        let storage = if self.memory || file.memory.unwrap_or(false) {
            StorageSettings::Memory
        } else {
            StorageSettings::Disk {
                dir: self
                    .data_dir
                    .or(file.data_dir)
                    .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR)),
                sync: self.sync.or(file.sync).unwrap_or(SyncArg::Fsync),
            }
        };
        let max_body_bytes = self
            .max_body_bytes
            .or(file.max_body_bytes)
            .unwrap_or(DEFAULT_MAX_BODY_BYTES);
        if !(1..=MAX_BODY_BYTES_LIMIT).contains(&max_body_bytes) {
            return Err(ConfigError::Invalid(format!(
                "max_body_bytes must be 1 to {MAX_BODY_BYTES_LIMIT} (1 GiB)"
            )));
        }
        let tls = match (
            self.tls_cert.or(file.tls_cert),
            self.tls_key.or(file.tls_key),
        ) {
            (Some(cert), Some(key)) => Some(TlsFiles { cert, key }),
            (None, None) => None,
            _ => {
                return Err(ConfigError::Invalid(
                    "tls_cert and tls_key go together".into(),
                ));
            }
        };
        let max_connections = self
            .max_connections
            .or(file.max_connections)
            .unwrap_or(DEFAULT_MAX_CONNECTIONS);
        if max_connections == 0 {
            return Err(ConfigError::Invalid(
                "max_connections must be at least 1".into(),
            ));
        }
        let max_header_bytes = self
            .max_header_bytes
            .or(file.max_header_bytes)
            .unwrap_or(DEFAULT_MAX_HEADER_BYTES);
        if max_header_bytes < MIN_MAX_HEADER_BYTES {
            // hyper's HTTP/1.1 read buffer cannot be smaller: a lower limit would not hold.
            return Err(ConfigError::Invalid(format!(
                "max_header_bytes must be at least {MIN_MAX_HEADER_BYTES}"
            )));
        }
        let auth = if self.auth || file.auth.unwrap_or(false) {
            let operator_token = self
                .auth_token
                .or(file.auth_token)
                .filter(|t| !t.trim().is_empty())
                .ok_or_else(|| {
                    ConfigError::Invalid(
                        "--auth needs an operator token: --auth-token or RUNNEL_AUTH_TOKEN".into(),
                    )
                })?;
            if operator_token.len() < 16 {
                return Err(ConfigError::Invalid(
                    "the operator token must be at least 16 characters".into(),
                ));
            }
            Some(AuthSettings {
                operator_token,
                rate_limit: self.rate_limit.or(file.rate_limit).filter(|r| *r > 0),
            })
        } else {
            None
        };
        Ok(Settings {
            listen,
            storage,
            long_poll_timeout: Duration::from_millis(
                self.long_poll_timeout_ms
                    .or(file.long_poll_timeout_ms)
                    .unwrap_or(DEFAULT_LONG_POLL_TIMEOUT_MS),
            ),
            max_body_bytes,
            sse_max_duration: Duration::from_secs(
                self.sse_max_duration_secs
                    .or(file.sse_max_duration_secs)
                    .unwrap_or(DEFAULT_SSE_MAX_DURATION_SECS)
                    // Bounded so `Instant::now() + sse_max_duration` cannot overflow.
                    .clamp(1, u64::from(u32::MAX)),
            ),
            mirror_from,
            tls,
            header_read_timeout: Duration::from_secs(
                self.header_read_timeout_secs
                    .or(file.header_read_timeout_secs)
                    .unwrap_or(DEFAULT_HEADER_READ_TIMEOUT_SECS)
                    .clamp(1, u64::from(u32::MAX)),
            ),
            body_idle_timeout: Duration::from_secs(
                self.body_idle_timeout_secs
                    .or(file.body_idle_timeout_secs)
                    .unwrap_or(DEFAULT_BODY_IDLE_TIMEOUT_SECS)
                    .clamp(1, u64::from(u32::MAX)),
            ),
            send_timeout: Duration::from_secs(
                self.send_timeout_secs
                    .or(file.send_timeout_secs)
                    .unwrap_or(DEFAULT_SEND_TIMEOUT_SECS)
                    .clamp(1, u64::from(u32::MAX)),
            ),
            max_header_bytes,
            max_connections,
            shutdown_timeout: Duration::from_secs(
                self.shutdown_timeout_secs
                    .or(file.shutdown_timeout_secs)
                    .unwrap_or(DEFAULT_SHUTDOWN_TIMEOUT_SECS)
                    .min(u64::from(u32::MAX)),
            ),
            max_live_readers: self
                .max_live_readers
                .or(file.max_live_readers)
                .unwrap_or(DEFAULT_MAX_LIVE_READERS),
            max_streams_per_bucket: self
                .max_streams_per_bucket
                .or(file.max_streams_per_bucket)
                .filter(|n| *n > 0),
            min_free_bytes: self
                .min_free_bytes
                .or(file.min_free_bytes)
                .unwrap_or(DEFAULT_MIN_FREE_BYTES),
            auth,
            mirror_token: self.mirror_token.or(file.mirror_token),
            mirror_ca_cert: self.mirror_ca_cert.or(file.mirror_ca_cert),
            init_file: self.init_file.or(file.init_file),
        })
    }
}

/// A flag that the rest of the settings make pointless is refused, saying why, rather than
/// left to look as if it did something.
fn refuse_flags_that_do_nothing(args: &ServeArgs, file: &FileConfig) -> Result<(), ConfigError> {
    let memory = args.memory || file.memory.unwrap_or(false);
    let auth = args.auth || file.auth.unwrap_or(false);
    let mirrors = !args.mirror_from.is_empty() || !file.mirror_from.is_empty();
    let pointless = [
        (
            memory && (args.data_dir.is_some() || file.data_dir.is_some()),
            "--data-dir",
            "with --memory, nothing is kept on disk",
        ),
        (
            memory && (args.sync.is_some() || file.sync.is_some()),
            "--sync",
            "with --memory, nothing is kept on disk",
        ),
        (
            !auth && (args.rate_limit.is_some() || file.rate_limit.is_some()),
            "--rate-limit",
            "it limits requests per token, and tokens need --auth",
        ),
        (
            !auth && (args.auth_token.is_some() || file.auth_token.is_some()),
            "--auth-token",
            "tokens are checked only with --auth",
        ),
        (
            !mirrors && (args.mirror_token.is_some() || file.mirror_token.is_some()),
            "--mirror-token",
            "it is presented to a --mirror-from upstream, and none is given",
        ),
        (
            !mirrors && (args.mirror_ca_cert.is_some() || file.mirror_ca_cert.is_some()),
            "--mirror-ca-cert",
            "it is trusted for a --mirror-from upstream, and none is given",
        ),
    ];
    match pointless.into_iter().find(|(set, _, _)| *set) {
        Some((_, flag, why)) => Err(ConfigError::Invalid(format!(
            "{flag} does nothing here: {why}"
        ))),
        None => Ok(()),
    }
}

/// Resolves `ip:port` or `host:port` to the address to bind: the host's first address.
fn listen_address(listen: &str) -> Result<SocketAddr, ConfigError> {
    if let Ok(addr) = listen.parse() {
        return Ok(addr);
    }
    let invalid = |why: String| ConfigError::Invalid(format!("cannot listen on {listen:?}: {why}"));
    listen
        .to_socket_addrs()
        .map_err(|e| invalid(e.to_string()))?
        .next()
        .ok_or_else(|| invalid("the host has no address".into()))
}

fn load_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse_file(&text).map_err(|source| ConfigError::Parse {
        path: path.to_owned(),
        source: Box::new(source),
    })
}

/// Parses the text of a `--config` file. Unknown keys are errors.
pub fn parse_file(text: &str) -> Result<FileConfig, toml::de::Error> {
    toml::from_str(text)
}

mod tools;
pub use tools::{BackupArgs, ExportArgs, ExportFormat, RestoreArgs, VerifyArgs};

#[cfg(test)]
mod tests;
