//! `gpumem selftest --device cuda`: the CUDA kernels against their CPU twins.

use std::io::Write;

use crate::cli::SelftestArgs;
use crate::error::{Error, Result};

use super::Outcome;

pub fn run(a: &SelftestArgs, out: &mut dyn Write) -> Result<Outcome> {
    if a.device != "cuda" {
        return Err(Error::usage(
            "--device",
            format!(
                "selftest checks the cuda device's kernels against the cpu device's; '{}' has \
                 none of its own",
                a.device
            ),
        ));
    }
    let r = crate::backend::cuda::selftest::run().map_err(|m| Error::usage("--device", m))?;
    if a.json {
        serde_json::to_writer_pretty(&mut *out, &r).map_err(std::io::Error::from)?;
        writeln!(out)?;
    } else {
        crate::report::selftest::write_text(&r, out)?;
    }
    Ok(if r.checks.iter().all(|c| c.ok) {
        Outcome::Ok
    } else {
        Outcome::Finding
    })
}
