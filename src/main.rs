use std::io::IsTerminal as _;

use clap::Parser;
use runnel::config::{Cli, Command, LogFormat};
use tracing_subscriber::EnvFilter;

/// What is logged without `RUST_LOG`: Runnel's own events at info; its dependencies (fjall,
/// hyper, rustls) only when something is wrong, or their debug lines would drown Runnel's; no
/// access log, whose line per request costs append throughput (`RUST_LOG=info` turns it on).
const DEFAULT_LOG_FILTER: &str = "warn,runnel=info,runnel::access=off";

/// glibc malloc cost about a quarter of the server's CPU under append load (arena locking and
/// chunk coalescing on every request's small allocations); mimalloc's per-thread free lists do not.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc hands an emptied page's memory back to the OS after a purge delay (1 s by default),
/// and the next allocation there faults it in again, zeroed. Under append load that was about
/// 500 page faults a second and 6% of the server's CPU in the kernel's `clear_page` (in huge
/// pages then; see `fault_memory_in_base_pages`). Ten seconds keeps memory that a steady load
/// reuses, and still returns it after a burst.
fn keep_freed_memory_longer() {
    /// `mi_option_purge_delay` in mimalloc's `mi_option_e` (the Rust bindings do not name it).
    const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
    const PURGE_DELAY_MS: std::ffi::c_long = 10_000;
    // SAFETY: setting an option only stores it; mimalloc reads it at its next purge.
    unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY, PURGE_DELAY_MS) };
}

/// mimalloc asks for transparent huge pages on its arenas, and the thread that first touches one
/// waits while the kernel finds 2 MiB of contiguous memory (compacting if it must) and zeroes it
/// all. Whenever the server's memory grows (at start, in a burst, while a cache fills) that was a
/// runtime thread stalled for milliseconds per fault: on the benchmark machine a third of the p99
/// of 100 appending writers, and 0.2 s of a 25 MiB catch-up read on a fresh server. Base pages
/// are zeroed 4 KiB at a time, as they are used.
///
/// mimalloc is built not to ask for them (its `no_thp` feature, in `Cargo.toml`), which also
/// covers what it maps before `main`; this turns them off where the system gives them to every
/// mapping unasked.
fn fault_memory_in_base_pages() {
    // The flag is the process's and applies to mappings made before it too. A kernel without it
    // (before 3.15) keeps huge pages: slower at the first touch, never wrong.
    #[cfg(target_os = "linux")]
    let _ = rustix::thread::disable_transparent_huge_pages(true);
}

fn main() -> std::process::ExitCode {
    // Both before the runtime's threads allocate anything.
    fault_memory_in_base_pages();
    keep_freed_memory_longer();
    let Cli { command, log } = Cli::parse();
    init_logging(log.log_format.unwrap_or_default());
    let result = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime.block_on(run(command)),
        Err(e) => Err(anyhow::Error::new(e).context("cannot start the async runtime")),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("runnel: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Logs to stderr, in colour only when a person is watching it (a terminal), never into a file
/// or a pipe.
fn init_logging(format: LogFormat) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_LOG_FILTER));
    let logger = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter);
    match format {
        LogFormat::Text => logger.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => logger.json().init(),
    }
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Serve(args) => runnel::server::serve(args.resolve()?).await,
        // Blocking file I/O, on a thread of its own.
        Command::Backup(args) => blocking(move || runnel::tools::backup(&args)).await,
        Command::Restore(args) => blocking(move || runnel::tools::restore(&args)).await,
        Command::Verify(args) => blocking(move || runnel::tools::verify(&args)).await,
        Command::Export(args) => runnel::tools::export(&args).await,
    }
}

async fn blocking(
    tool: impl FnOnce() -> anyhow::Result<()> + Send + 'static,
) -> anyhow::Result<()> {
    tokio::task::spawn_blocking(tool).await?
}
