//! `gpumem summary FILE`: what a snapshot says, for gpumem's snapshots and PyTorch's.

use std::io::Write;

use crate::analysis::summary;
use crate::cli::SummaryArgs;
use crate::commands::Outcome;
use crate::error::{Error, Result};
use crate::report;

pub fn run(args: &SummaryArgs, out: &mut dyn Write) -> Result<Outcome> {
    if args.top == 0 {
        return Err(Error::usage("--top", "must be at least 1"));
    }
    let s = crate::snapshot::load(&args.snapshot)?;
    let m = summary::summarize(
        &s.segments,
        &s.events,
        &s.tags,
        &s.conf,
        args.top,
        args.stacks,
    );
    let path = args.snapshot.display().to_string();
    if args.json {
        let v = report::summary::to_json(&path, &s, &m);
        serde_json::to_writer_pretty(&mut *out, &v).map_err(std::io::Error::from)?;
        writeln!(out)?;
    } else {
        report::summary::write_text(out, &path, &s, &m, args.stacks)?;
    }
    let fail = args.fail_on.contains(&crate::cli::FailOn::Oom) && !m.ooms.is_empty()
        || args.fail_on.contains(&crate::cli::FailOn::Leak) && !m.leaks.leaks.is_empty();
    Ok(if fail { Outcome::Finding } else { Outcome::Ok })
}
