//! The `quiver` command line: parses the arguments and dispatches to the command's
//! module in `cli/`, which does its work through `quiver::ops`.
//!
//! Exit codes, from the error's kind ([`exit_code`]): 0 success; 1 an error (bad input,
//! an unknown name, a refused change, a failure); 2 a usage error; 3 a store, broker or
//! server that could not be reached (retrying may help). The error is one line.
//! `quiver monitor` keeps 1 for a threshold crossed, so its other errors exit 2
//! ([`monitor_exit_code`]).

mod cli;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Quiver: a feature store. Define features once, build point-in-time correct training
/// sets from Delta Lake, serve the same values online, stream fresh events into both.
#[derive(Debug, Parser)]
#[command(name = "quiver", version, propagate_version = true, max_term_width = 100)]
struct Cli {
    /// The feature repository (the folder holding quiver.yaml).
    #[arg(long, global = true, env = "QUIVER_REPO", default_value = ".")]
    repo: PathBuf,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    Init(cli::init::Init),
    Plan(cli::registry::Plan),
    Apply(cli::registry::Apply),
    List(cli::registry::List),
    Describe(cli::registry::Describe),
    Versions(cli::registry::Versions),
    Retire(cli::registry::Retire),
    Backfill(cli::ingest::Backfill),
    Ingest(cli::ingest::Ingest),
    Historical(cli::historical::Historical),
    Export(cli::export::Export),
    Materialize(cli::materialize::Materialize),
    MaterializeIncremental(cli::materialize::MaterializeIncremental),
    Online(cli::online::Online),
    Serve(cli::serve::Serve),
    Stream(cli::stream::Stream),
    Push(cli::ingest::Push),
    Verify(cli::verify::Verify),
    Monitor(cli::monitor::Monitor),
    Doctor(cli::doctor::Doctor),
    Cluster(cli::cluster::Cluster),
    Lineage(cli::lineage::Lineage),
}

/// The joins allocate and free column-sized buffers phase after phase; glibc returns
/// each large block to the system and the next one faults its pages in again (a fifth
/// of an aggregation join's time went to page faults). mimalloc keeps freed memory for
/// reuse — batch commands for as long as they run ([`keep_freed_memory`]).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `mi_option_purge_delay` (its position in `mi_option_e`; the Rust binding
/// names no constant for it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// A batch command never hands freed memory back to the system while it runs (purge
/// delay -1): its peak is what it needs anyway, and it exits soon. The long-running
/// `serve` and `stream` keep mimalloc's default (freed memory purged after a delay).
fn keep_freed_memory() {
    // SAFETY: sets one of mimalloc's options, a plain integer it reads on purging.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) }
}

/// No transparent huge pages for this process. mimalloc asks for them on its arenas,
/// and where the kernel compacts memory to make one on a fault (`defrag` set to
/// `madvise`, Debian's default) and memory is fragmented — after another job ran, say —
/// a fault can stall for milliseconds: an aggregation join that took 1.7 s took 3.0 s
/// right after DuckDB had run, 2.2 s of it in the kernel. Without huge pages it takes
/// 1.7 s either way (bench/RESULTS.md). Set before the work starts, it covers the memory
/// mimalloc already reserved too.
fn no_transparent_huge_pages() {
    // SAFETY: prctl with integer arguments only; it changes a flag of this process.
    let _ = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
}

fn main() -> ExitCode {
    no_transparent_huge_pages();
    let args = Cli::parse();
    if !matches!(args.command, Command::Serve(_) | Command::Stream(_) | Command::Cluster(_)) {
        keep_freed_memory();
    }
    tracing_subscriber::fmt()
        // deltalake warns when a commit loses a race to another writer; Quiver's commit
        // loop starts over on the new snapshot then, so that is not the user's concern.
        // Delta's kernel logs every failed read (an unreachable object store, a missing
        // checkpoint hint) that it also returns: Quiver reports it on its one error line.
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("QUIVER_LOG")
                .unwrap_or_else(|_| "warn,deltalake_core::kernel::transaction=error,buoyant_kernel=off".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let ctx = cli::Ctx { repo: args.repo };
    let monitor = matches!(args.command, Command::Monitor(_));
    let result = match args.command {
        Command::Init(c) => c.run(&ctx),
        Command::Plan(c) => c.run(&ctx),
        Command::Apply(c) => c.run(&ctx),
        Command::List(c) => c.run(&ctx),
        Command::Describe(c) => c.run(&ctx),
        Command::Versions(c) => c.run(&ctx),
        Command::Retire(c) => c.run(&ctx),
        Command::Backfill(c) => c.run(&ctx),
        Command::Ingest(c) => c.run(&ctx),
        Command::Historical(c) => c.run(&ctx),
        Command::Export(c) => c.run(&ctx),
        Command::Materialize(c) => c.run(&ctx),
        Command::MaterializeIncremental(c) => c.run(&ctx),
        Command::Online(c) => c.run(&ctx),
        Command::Serve(c) => c.run(&ctx),
        Command::Stream(c) => c.run(&ctx),
        Command::Push(c) => c.run(&ctx),
        Command::Verify(c) => c.run(&ctx),
        Command::Monitor(c) => c.run(&ctx),
        Command::Doctor(c) => c.run(&ctx),
        Command::Cluster(c) => c.run(&ctx),
        Command::Lineage(c) => c.run(&ctx),
    };
    quiver::lineage::flush();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // One line: the whole chain, outermost first.
            eprintln!("error: {err:#}");
            let code = exit_code(err.chain().find_map(quiver::Error::kind_of));
            ExitCode::from(if monitor { monitor_exit_code(&err, code) } else { code })
        }
    }
}

/// `quiver monitor`'s exit code for `err`, whose kind's code is `code`: 1 for a
/// comparison that found a threshold crossed ([`cli::monitor::Breach`]); an error that
/// stopped the comparison keeps its kind's code, except that 1 becomes 2, so a breach
/// is never mistaken for an error (nor an error for a breach) — `diff`'s convention.
fn monitor_exit_code(err: &anyhow::Error, code: u8) -> u8 {
    if err.downcast_ref::<cli::monitor::Breach>().is_some() {
        1
    } else if code == 1 {
        2
    } else {
        code
    }
}

/// The exit code of an error of `kind` (none: an error of the CLI itself, 1).
fn exit_code(kind: Option<quiver::sdk::ErrorKind>) -> u8 {
    use quiver::sdk::ErrorKind as K;
    match kind {
        Some(K::Unavailable) => 3,
        Some(K::Invalid | K::NotFound | K::Conflict | K::Internal) | None => 1,
    }
}
