//! `gpumem run WORKLOAD.toml`: run a workload on the simulated device and report its memory.

use std::io::{IsTerminal, Write};

use crate::cli::RunArgs;
use crate::commands::{write_atomic, Outcome};
use crate::error::{Error, Result};
use crate::report;
use crate::runner::{run_with_progress, RunOptions};
use crate::units::parse_size;
use crate::workload;

pub fn run(args: &RunArgs, out: &mut dyn Write) -> Result<Outcome> {
    let capacity = match &args.capacity {
        Some(s) => Some(parse_size(s).map_err(|m| Error::usage("--capacity", m))?),
        None => None,
    };
    if capacity == Some(0) {
        return Err(Error::usage("--capacity", "must be more than 0 bytes"));
    }
    if args.iterations == Some(0) {
        return Err(Error::usage("--iterations", "must be at least 1"));
    }
    match args.device.as_str() {
        "sim" => {}
        "cpu" | "cuda" => {
            return Err(Error::usage(
                "--device",
                format!(
                    "the {} backend is not built yet in this version of gpumem; use --device sim",
                    args.device
                ),
            ))
        }
        other => {
            return Err(Error::usage(
                "--device",
                format!("unknown device '{other}'; use sim"),
            ))
        }
    }
    let w = workload::load(&args.workload)?;
    if w.device != workload::Device::Sim && args.device == "sim" {
        // the workload asks for a real device this build does not have: say so, run simulated
        eprintln!(
            "gpumem: note: {} asks for device \"{}\"; running it on the simulated device",
            args.workload.display(),
            w.device
        );
    }
    // a progress bar on stderr, only for a person watching
    let bar = std::io::stderr().is_terminal().then(|| {
        let b = indicatif::ProgressBar::new(args.iterations.unwrap_or(w.iterations) as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} iterations")
                .expect("valid template")
                .progress_chars("=> "),
        );
        b.set_message(w.name.clone());
        b
    });
    let opts = RunOptions {
        capacity,
        iterations: args.iterations,
    };
    let r = run_with_progress(&w, &args.workload, &opts, &mut |done, _| {
        if let Some(b) = &bar {
            b.set_position(done as u64);
        }
    });
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let r = r?;
    let path = args.workload.display().to_string();
    if let Some(snap) = &args.snapshot {
        let v = report::snapshot::to_json(&r.allocator, &path, &r.name);
        let bytes = serde_json::to_vec(&v).map_err(std::io::Error::from)?;
        write_atomic(snap, &bytes)?;
    }
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
