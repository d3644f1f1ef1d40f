use clap::Parser;
use runnel::config::{Cli, Command};
use tracing_subscriber::EnvFilter;

/// glibc malloc cost about a quarter of the server's CPU under append load (arena locking and
/// chunk coalescing on every request's small allocations); mimalloc's per-thread free lists do not.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc hands an emptied page's memory back to the OS after a purge delay (1 s by default),
/// and the next allocation there faults in a fresh, zeroed huge page. Under append load that was
/// about 500 page faults a second and 6% of the server's CPU in the kernel's `clear_page`. Ten
/// seconds keeps memory that a steady load reuses, and still returns it after a burst.
fn keep_freed_memory_longer() {
    /// `mi_option_purge_delay` in mimalloc's `mi_option_e` (the Rust bindings do not name it).
    const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
    const PURGE_DELAY_MS: std::ffi::c_long = 10_000;
    // SAFETY: setting an option only stores it; mimalloc reads it at its next purge.
    unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY, PURGE_DELAY_MS) };
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    keep_freed_memory_longer();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    let Cli { command } = Cli::parse();
    let result = match command {
        Command::Serve(args) => match args.resolve() {
            Ok(settings) => runnel::server::serve(settings).await,
            Err(e) => Err(e.into()),
        },
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("runnel: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
