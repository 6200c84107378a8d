//! One file per subcommand. Each takes its parsed arguments and a writer, and returns whether
//! it found something the user asked to fail on; `main.rs` turns that into the exit code.

pub mod bench;
pub mod replay;
pub mod run;

use std::io::Write;

use crate::cli::Command;
use crate::error::Result;

/// What a command found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// All good: exit 0.
    Ok,
    /// A finding the user asked to fail on: exit 1.
    Finding,
}

pub fn run(cmd: &Command, out: &mut dyn Write) -> Result<Outcome> {
    match cmd {
        Command::Run(a) => run::run(a, out),
        Command::Replay(a) => replay::run(a, out),
        Command::Bench(a) => bench::run(a, out),
    }
}
