//! `gpumem selftest`: each kernel check with its largest relative error.

use std::io::{self, Write};

use crate::backend::cuda::selftest::Report;

use super::style;

pub fn write_text(r: &Report, out: &mut dyn Write) -> io::Result<()> {
    writeln!(
        out,
        "CUDA kernels on {} ({}), against the cpu device's on the same random float32 inputs:",
        r.gpu,
        if r.compiled {
            "compiled by NVRTC now"
        } else {
            "from the kernel cache"
        }
    )?;
    let mut t = style::table();
    t.set_header(vec![
        "kernel",
        "case",
        "elements",
        "max relative error",
        "tolerance",
        "verdict",
    ]);
    for c in &r.checks {
        t.add_row(vec![
            c.kernel.to_string(),
            c.case.clone(),
            c.elements.to_string(),
            format!("{:.2e}", c.max_rel_error),
            format!("{:.1e}", c.tolerance),
            if c.ok {
                "ok".to_string()
            } else {
                style::bad("OFF")
            },
        ]);
    }
    super::align_right(&mut t, 2);
    writeln!(out, "{t}")?;
    let off = r.checks.iter().filter(|c| !c.ok).count();
    writeln!(
        out,
        "{} of {} checks within tolerance",
        r.checks.len() - off,
        r.checks.len()
    )
}
