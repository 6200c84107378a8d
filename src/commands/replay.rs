//! `gpumem replay TRACE.json`: replay a recorded PyTorch allocator trace and compare.

use std::io::Write;

use crate::alloc::AllocConf;
use crate::analysis::groundtruth::GroundTruth;
use crate::analysis::replay::{replay, ReplayOptions};
use crate::cli::ReplayArgs;
use crate::commands::Outcome;
use crate::error::{Error, Result};
use crate::report::replay::{to_json, write_text, ReplayHeader};
use crate::report::{stats_table, torch_summary};

pub fn run(args: &ReplayArgs, out: &mut dyn Write) -> Result<Outcome> {
    let gt = GroundTruth::load(&args.trace)?;
    let (conf, overridden) = match &args.alloc_conf {
        Some(s) => (
            AllocConf::parse(s).map_err(|e| Error::usage("--alloc-conf", e.to_string()))?,
            true,
        ),
        None => (
            AllocConf::parse(&gt.alloc_conf)
                .map_err(|e| Error::input(&args.trace, "alloc_conf", e.to_string()))?,
            false,
        ),
    };
    let opts = ReplayOptions {
        alloc_conf: None,
        no_trace_addresses: args.no_trace_addresses,
        max_details: args.max_mismatches,
    };
    let conf_text = conf.raw.clone();
    let r = replay(&gt, conf, &opts);
    let path = args.trace.display().to_string();
    let header = ReplayHeader {
        path: &path,
        alloc_conf: &conf_text,
        conf_overridden: overridden,
        memory_fraction: gt.memory_fraction,
        torch_version: &gt.torch_version,
        device_name: &gt.device_name,
    };
    if args.json {
        let mut v = to_json(&header, &r);
        if args.summary {
            v["memory_summary"] =
                torch_summary::render(&r.stats, r.allocator.device(), false).into();
        }
        serde_json::to_writer_pretty(&mut *out, &v).map_err(std::io::Error::from)?;
        writeln!(out)?;
    } else {
        write_text(out, &header, &r)?;
        if args.summary {
            writeln!(out)?;
            if args.torch_style {
                torch_summary::write(out, &r.stats, r.allocator.device())?;
            } else {
                stats_table::write(out, &r.stats)?;
            }
        }
    }
    Ok(if r.all_match() {
        Outcome::Ok
    } else {
        Outcome::Finding
    })
}
