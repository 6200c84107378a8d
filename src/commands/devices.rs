//! `gpumem devices`: the NVIDIA GPUs of this machine, their memory and the processes using it.

use std::io::Write;

use crate::cli::DevicesArgs;
use crate::error::{Error, Result};

use super::Outcome;

pub fn run(a: &DevicesArgs, out: &mut dyn Write) -> Result<Outcome> {
    let m = crate::backend::cuda::nvml::machine().map_err(|m| Error::usage("devices", m))?;
    if a.json {
        serde_json::to_writer_pretty(&mut *out, &m).map_err(std::io::Error::from)?;
        writeln!(out)?;
    } else {
        crate::report::devices::write_text(&m, out)?;
    }
    Ok(Outcome::Ok)
}
