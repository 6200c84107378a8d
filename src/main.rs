//! The gpumem executable: parses the command line, sets up logging and the output's colour and
//! width, runs the command, and is the only place that picks exit codes (0 ok, 1 a finding the
//! user asked to fail on, 2 usage/input/I/O, 130 stopped by Ctrl-C or SIGTERM).

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use clap::Parser;
use gpumem::cli::Cli;
use gpumem::commands::{self, Outcome};
use gpumem::report::style;

#[global_allocator]
static GLOBAL: gpumem::hostalloc::HostAlloc = gpumem::hostalloc::HostAlloc;

/// mimalloc's options are set before the first allocation (a constructor, run before the
/// Rust runtime allocates): the arena that first allocation reserves is committed as the
/// options say ([`gpumem::hostalloc::tune`]).
#[cfg(target_os = "linux")]
#[used]
#[link_section = ".init_array"]
static TUNE_HOST_ALLOCATOR: extern "C" fn() = {
    extern "C" fn tune() {
        gpumem::hostalloc::tune();
    }
    tune
};

/// Log lines go to stderr: `RUST_LOG` when set (`gpumem=debug`, `debug`, `gpumem::alloc=trace`,
/// ...), else warnings, debug with -v, trace with -vv.
fn init_logging(verbose: u8, color: bool) -> anyhow::Result<()> {
    use anyhow::Context;
    use tracing_subscriber::filter::{LevelFilter, Targets};
    let filter = match std::env::var("RUST_LOG") {
        Ok(spec) if !spec.trim().is_empty() => spec
            .parse::<Targets>()
            .with_context(|| format!("RUST_LOG={spec:?} is not a list of TARGET=LEVEL or LEVEL"))?,
        _ => Targets::new().with_default(match verbose {
            0 => LevelFilter::WARN,
            1 => LevelFilter::DEBUG,
            _ => LevelFilter::TRACE,
        }),
    };
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(color && std::io::stderr().is_terminal())
                .with_target(true)
                .without_time(),
        )
        .with(filter)
        .try_init()
        .context("cannot start logging")?;
    Ok(())
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = e.exit_code();
            let _ = e.print();
            return ExitCode::from(code.clamp(0, 255) as u8);
        }
    };
    let env = |k: &str| std::env::var(k).ok();
    let stdout = std::io::stdout();
    let terminal = stdout.is_terminal();
    let color = style::decide_color(cli.color, terminal, &env);
    let terminal_width = if terminal {
        comfy_table::Table::new().width()
    } else {
        None
    };
    style::init(style::Output {
        color,
        width: style::decide_width(terminal_width, &env),
    });
    if let Err(e) = init_logging(cli.verbose, color) {
        eprintln!("gpumem: error: {e:#}");
        return ExitCode::from(2);
    }
    gpumem::interrupt::install();
    // the MCP server writes the protocol on stdout itself: it must not be locked here
    let mut out: Box<dyn Write> = if matches!(cli.command, gpumem::cli::Command::Mcp(_)) {
        Box::new(std::io::sink())
    } else {
        Box::new(std::io::BufWriter::new(stdout.lock()))
    };
    let result = commands::run(&cli.command, &mut out);
    let flushed = out.flush();
    match result {
        Ok(_) if flushed.is_err() => {
            if flushed
                .as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
            {
                return ExitCode::SUCCESS;
            }
            eprintln!("gpumem: cannot write output: {}", flushed.unwrap_err());
            ExitCode::from(2)
        }
        Ok(Outcome::Ok) => ExitCode::SUCCESS,
        Ok(Outcome::Finding) => ExitCode::from(1),
        Err(gpumem::error::Error::Output(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            ExitCode::SUCCESS
        }
        Err(gpumem::error::Error::Interrupted) => {
            gpumem::interrupt::say_interrupted();
            ExitCode::from(130)
        }
        Err(e) => {
            // the error with its causes, outermost first ("cannot read X: permission denied")
            let e = anyhow::Error::new(e);
            eprintln!("gpumem: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
