use clap::Parser;
use runnel::config::{Cli, Command};
use tracing_subscriber::EnvFilter;

/// glibc malloc cost about a quarter of the server's CPU under append load (arena locking and
/// chunk coalescing on every request's small allocations); mimalloc's per-thread free lists do not.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
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
