//! `gpumem export SNAPSHOT --to memory-viz|perfetto -o FILE`: a snapshot in another tool's
//! format, written atomically.

use std::io::Write;

use crate::cli::{ExportArgs, ExportFormat};
use crate::commands::{write_atomic, Outcome};
use crate::error::Result;
use crate::report::export;

pub fn run(args: &ExportArgs, out: &mut dyn Write) -> Result<Outcome> {
    let s = crate::snapshot::load(&args.snapshot)?;
    let bytes = match args.to {
        ExportFormat::MemoryViz => {
            let mut buf = Vec::new();
            crate::trace::pickle::write(&export::torch_snapshot(&s), &mut buf)?;
            buf
        }
        ExportFormat::TorchJson => {
            serde_json::to_vec(&export::w_to_json(&export::torch_snapshot(&s)))
                .map_err(std::io::Error::from)?
        }
        ExportFormat::Perfetto => {
            serde_json::to_vec(&export::perfetto(&s)).map_err(std::io::Error::from)?
        }
    };
    write_atomic(&args.output, &bytes)?;
    let hint = match args.to {
        ExportFormat::MemoryViz => {
            "open it at https://pytorch.org/memory_viz, or: python -m torch.cuda._memory_viz stats FILE"
        }
        ExportFormat::TorchJson => "PyTorch's snapshot dict as JSON",
        ExportFormat::Perfetto => "open it at https://ui.perfetto.dev (or chrome://tracing)",
    };
    writeln!(
        out,
        "wrote {} ({} bytes, {} segments, {} trace entries): {hint}",
        args.output.display(),
        bytes.len(),
        s.segments.len(),
        s.events.len()
    )?;
    Ok(Outcome::Ok)
}
