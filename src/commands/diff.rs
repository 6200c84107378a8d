//! `gpumem diff A B`: two snapshots or runs compared.

use std::io::Write;
use std::path::Path;

use crate::analysis::{diff, summary};
use crate::cli::DiffArgs;
use crate::commands::Outcome;
use crate::error::{Error, Result};
use crate::snapshot::Snapshot;

/// A snapshot file, or a workload (`.toml`, or a Hugging Face config with `model`'s flags) run
/// now on the simulated device.
fn load(path: &Path, device: Option<u32>, model: &crate::cli::ModelArgs) -> Result<Snapshot> {
    let is_config = crate::workload::is_config_not_snapshot(path);
    let builtin = matches!(crate::workload::builtin::lookup(path), Ok(Some(_)));
    if path.extension().is_some_and(|e| e == "toml") || is_config || builtin {
        let required: &[&str] = if is_config { &["batch", "seq"] } else { &[] };
        let o = super::model_overrides(path, model, &[], None, required)?;
        let w = super::load_workload(path, &o)?;
        let r = crate::runner::run(&w, path, &Default::default())?;
        let v =
            crate::report::snapshot::to_json(&r.allocator, &path.display().to_string(), &r.name);
        return crate::snapshot::convert_gpumem(&v).map_err(|m| Error::input(path, "run", m));
    }
    crate::snapshot::load_one(path, device)
}

pub fn run(args: &DiffArgs, out: &mut dyn Write) -> Result<Outcome> {
    if args.top == 0 {
        return Err(Error::usage("--top", "must be at least 1"));
    }
    let (a, b) = (
        load(&args.a, args.device, &args.model)?,
        load(&args.b, args.device, &args.model)?,
    );
    // a file of several devices: say which one is compared
    let name = |p: &Path, s: &Snapshot| match s.device_note() {
        Some(n) => format!("{} ({n})", p.display()),
        None => p.display().to_string(),
    };
    let sum = |s: &Snapshot| {
        summary::summarize(&s.segments, &s.events, &s.tags, &s.conf, usize::MAX, false)
    };
    let d = diff::diff(&sum(&a), &sum(&b), args.top);
    let (an, bn) = (name(&args.a, &a), name(&args.b, &b));
    if args.json {
        let v = serde_json::json!({"schema": super::mcp::schema::DIFF, "a": an, "b": bn, "device_a": a.device, "device_b": b.device, "diff": d});
        serde_json::to_writer_pretty(&mut *out, &v).map_err(std::io::Error::from)?;
        writeln!(out)?;
    } else if args.markdown {
        crate::report::diff::write_markdown(out, &an, &bn, &d)?;
    } else {
        crate::report::diff::write_text(out, &an, &bn, &d)?;
    }
    Ok(Outcome::Ok)
}
