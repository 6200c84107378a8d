//! `gpumem diff A B`: two snapshots or runs compared.

use std::io::Write;
use std::path::Path;

use crate::analysis::{diff, summary};
use crate::cli::DiffArgs;
use crate::commands::Outcome;
use crate::error::{Error, Result};
use crate::snapshot::Snapshot;

/// A snapshot file, or a workload (`.toml`) run now on the simulated device.
fn load(path: &Path) -> Result<Snapshot> {
    if path.extension().is_some_and(|e| e == "toml") {
        let w = crate::workload::load(path)?;
        let r = crate::runner::run(&w, path, &Default::default())?;
        let v =
            crate::report::snapshot::to_json(&r.allocator, &path.display().to_string(), &r.name);
        return crate::snapshot::convert_gpumem(&v).map_err(|m| Error::input(path, "run", m));
    }
    crate::snapshot::load(path)
}

pub fn run(args: &DiffArgs, out: &mut dyn Write) -> Result<Outcome> {
    if args.top == 0 {
        return Err(Error::usage("--top", "must be at least 1"));
    }
    let (a, b) = (load(&args.a)?, load(&args.b)?);
    let sum = |s: &Snapshot| {
        summary::summarize(&s.segments, &s.events, &s.tags, &s.conf, usize::MAX, false)
    };
    let d = diff::diff(&sum(&a), &sum(&b), args.top);
    let (an, bn) = (args.a.display().to_string(), args.b.display().to_string());
    if args.json {
        let v = serde_json::json!({"a": an, "b": bn, "diff": d});
        serde_json::to_writer_pretty(&mut *out, &v).map_err(std::io::Error::from)?;
        writeln!(out)?;
    } else if args.markdown {
        crate::report::diff::write_markdown(out, &an, &bn, &d)?;
    } else {
        crate::report::diff::write_text(out, &an, &bn, &d)?;
    }
    Ok(Outcome::Ok)
}
