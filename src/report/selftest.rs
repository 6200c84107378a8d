//! `gpumem selftest`: each op's check with its largest relative difference, and where its
//! launches ran.

use std::io::{self, Write};

use crate::backend::cuda::selftest::Report;

use super::style;

pub fn write_text(r: &Report, out: &mut dyn Write) -> io::Result<()> {
    writeln!(
        out,
        "--device cuda on {} against --device cpu, op by op through the engine, on the same \
         random inputs (forward, then every input's gradient):",
        r.gpu
    )?;
    let mut t = style::table();
    t.set_header(vec![
        "op",
        "case",
        "dtype",
        "elements",
        "max relative error",
        "tolerance",
        "launches (GPU / host)",
        "verdict",
    ]);
    for c in &r.checks {
        let ran = if c.host_kernels.is_empty() {
            format!("{} / {}", c.gpu_launches, c.host_launches)
        } else {
            format!(
                "{} / {} ({})",
                c.gpu_launches,
                c.host_launches,
                c.host_kernels.join(", ")
            )
        };
        t.add_row(vec![
            c.op.clone(),
            c.case.clone(),
            c.dtype.to_string(),
            c.elements.to_string(),
            format!("{:.2e}", c.max_rel_error),
            format!("{:.1e}", c.tolerance),
            ran,
            if c.ok {
                "ok".to_string()
            } else {
                style::bad(&format!("OFF: {}", c.worst))
            },
        ]);
    }
    super::align_right(&mut t, 3);
    writeln!(out, "{t}")?;
    let off = r.checks.iter().filter(|c| !c.ok).count();
    let (gpu, host): (u64, u64) = r.checks.iter().fold((0, 0), |(g, h), c| {
        (g + c.gpu_launches, h + c.host_launches)
    });
    let all_gpu = r
        .checks
        .iter()
        .filter(|c| c.host_launches == 0 && c.gpu_launches > 0)
        .count();
    writeln!(
        out,
        "{} of {} checks within tolerance; {} ran wholly on the GPU; {} launches on the GPU, \
         {} on the host twin",
        r.checks.len() - off,
        r.checks.len(),
        all_gpu,
        gpu,
        host
    )
}
