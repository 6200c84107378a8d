//! `gpumem run WORKLOAD.toml`: run a workload on the simulated device and report its memory.

use std::io::Write;

use crate::cli::RunArgs;
use crate::commands::Outcome;
use crate::error::{Error, Result};
use crate::report;
use crate::runner::{run as run_workload, RunOptions};
use crate::units::parse_size;
use crate::workload;

pub fn run(args: &RunArgs, out: &mut dyn Write) -> Result<Outcome> {
    let capacity = match &args.capacity {
        Some(s) => Some(parse_size(s).map_err(|m| Error::usage("--capacity", m))?),
        None => None,
    };
    if args.iterations == Some(0) {
        return Err(Error::usage("--iterations", "must be at least 1"));
    }
    let w = workload::load(&args.workload)?;
    let r = run_workload(
        &w,
        &args.workload,
        &RunOptions {
            capacity,
            iterations: args.iterations,
        },
    )?;
    let path = args.workload.display().to_string();
    if args.json {
        let v = report::run::to_json(&path, &r);
        serde_json::to_writer_pretty(&mut *out, &v).map_err(std::io::Error::from)?;
        writeln!(out)?;
    } else {
        report::run::write_text(out, &path, &r, args.torch_style)?;
    }
    Ok(if r.oom.is_some() {
        Outcome::Finding
    } else {
        Outcome::Ok
    })
}
