//! `gpumem completions SHELL`: a completion script generated from the one clap definition.

use std::io::Write;

use crate::cli::CompletionsArgs;
use crate::error::Result;

use super::Outcome;

pub fn run(a: &CompletionsArgs, out: &mut dyn Write) -> Result<Outcome> {
    let mut cmd = crate::cli::command();
    clap_complete::generate(a.shell, &mut cmd, "gpumem", out);
    Ok(Outcome::Ok)
}
