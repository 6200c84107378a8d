//! `gpumem devices`: the machine's GPUs as NVML sees them.

use std::io::{self, Write};

use crate::backend::cuda::nvml::Machine;
use crate::units::format_bytes;

use super::style;

/// The driver, then a row per GPU with its memory and the processes holding some.
pub fn write_text(m: &Machine, out: &mut dyn Write) -> io::Result<()> {
    writeln!(
        out,
        "NVIDIA driver {}, CUDA {}: {}",
        m.driver_version,
        m.cuda_version,
        crate::units::count(m.gpus.len() as u64, "GPU", "GPUs")
    )?;
    if m.gpus.is_empty() {
        return Ok(());
    }
    writeln!(
        out,
        "{}",
        style::heading("GPUs (NVML; used includes every process's memory)")
    )?;
    let mut t = style::table();
    t.set_header(vec![
        "index",
        "name",
        "processes (pid: memory)",
        "total",
        "used",
        "free",
    ]);
    for g in &m.gpus {
        let procs: Vec<String> = g
            .processes
            .iter()
            .map(|p| match p.used_memory {
                Some(b) => format!("{}: {}", p.pid, format_bytes(b)),
                None => format!("{}: ?", p.pid),
            })
            .collect();
        t.add_row(vec![
            g.index.to_string(),
            g.name.clone(),
            if procs.is_empty() {
                "-".to_string()
            } else {
                procs.join(", ")
            },
            format_bytes(g.memory_total),
            format_bytes(g.memory_used),
            format_bytes(g.memory_free),
        ]);
    }
    super::align_right(&mut t, 3);
    writeln!(out, "{t}")
}
