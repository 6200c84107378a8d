//! The gpumem executable: parses the command line, runs the command, and is the only place
//! that picks exit codes (0 ok, 1 a finding the user asked to fail on, 2 usage/input/I/O).

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use gpumem::cli::Cli;
use gpumem::commands::{self, Outcome};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = e.exit_code();
            let _ = e.print();
            return ExitCode::from(code.clamp(0, 255) as u8);
        }
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
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
        Err(e) => {
            eprintln!("gpumem: error: {e}");
            ExitCode::from(2)
        }
    }
}
