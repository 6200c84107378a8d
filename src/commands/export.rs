//! `gpumem export SNAPSHOT --to memory-viz|torch-json|perfetto -o FILE`: a snapshot in another
//! tool's format, every device of it, written atomically; JSON compressed with gzip when FILE
//! ends in `.gz` (how JSON keeps a pickle's shared frame lists small).
//!
//! A PyTorch snapshot goes out as PyTorch wrote it: a pickle to memory-viz is the file itself
//! (checked first), anything else the file's own document converted value by value, so no key,
//! frame or device is lost and nothing is added. A gpumem snapshot is turned into PyTorch's
//! dict.

use std::io::Write;

use crate::cli::{ExportArgs, ExportFormat};
use crate::commands::{write_atomic, Outcome};
use crate::error::{Error, Result};
use crate::report::export;
use crate::snapshot::{Format, Raw, Which};

pub fn run(args: &ExportArgs, out: &mut dyn Write) -> Result<Outcome> {
    let path = &args.snapshot;
    super::refuse_output_over_input("-o", &args.output, &[path])?;
    // read as a snapshot first: what is not one is refused before anything is written
    let snaps = crate::snapshot::load_devices(path, Which::All)?;
    let first = &snaps[0];
    let bad = |m: String| Error::input(path, "snapshot", m);
    let raw = match first.format {
        Format::Gpumem => None,
        _ => crate::snapshot::load_raw(path)?,
    };
    let bytes = match (args.to, &raw) {
        (ExportFormat::MemoryViz, Some(Raw::Pickle(p)))
            if p.kind(p.root()) == crate::trace::pickle::Kind::Dict =>
        {
            crate::input::read(path, crate::input::Kind::Data).map_err(|source| Error::Read {
                path: path.clone(),
                source,
            })?
        }
        (ExportFormat::MemoryViz, Some(r)) => {
            let mut buf = Vec::new();
            crate::trace::pickle::write(&r.to_pickle_value().map_err(bad)?, &mut buf)?;
            buf
        }
        (ExportFormat::MemoryViz, None) => {
            let mut buf = Vec::new();
            crate::trace::pickle::write(&export::torch_snapshot(first), &mut buf)?;
            buf
        }
        (ExportFormat::TorchJson, Some(r)) => {
            let mut v = r.to_json().map_err(bad)?;
            if v.is_array() {
                v = serde_json::json!({"segments": v, "device_traces": []});
            }
            serde_json::to_vec(&v).map_err(std::io::Error::from)?
        }
        (ExportFormat::TorchJson, None) => {
            let w = export::torch_snapshot(first);
            let n = export::expanded_len(&w, &mut Default::default());
            if n > crate::snapshot::MAX_JSON_VALUES {
                return Err(bad(crate::snapshot::too_many_json_values(n)));
            }
            serde_json::to_vec(&export::w_to_json(&w)).map_err(std::io::Error::from)?
        }
        (ExportFormat::Perfetto, _) => {
            serde_json::to_vec(&export::perfetto(&snaps)).map_err(std::io::Error::from)?
        }
    };
    let gz = args
        .output
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gz"));
    if gz && args.to == ExportFormat::MemoryViz {
        return Err(Error::usage(
            "-o",
            format!(
                "{}: PyTorch's memory viewer reads the pickle as it is, not compressed; \
                 name it .pickle (gzip is for --to torch-json and --to perfetto)",
                args.output.display()
            ),
        ));
    }
    let plain_len = bytes.len();
    let bytes = if gz { gzip(&bytes)? } else { bytes };
    write_atomic(&args.output, &bytes)?;
    let hint = match args.to {
        ExportFormat::MemoryViz => {
            "open it at https://pytorch.org/memory_viz, or: python -m torch.cuda._memory_viz stats FILE"
        }
        ExportFormat::TorchJson => "PyTorch's snapshot dict as JSON",
        ExportFormat::Perfetto => {
            "open it at https://ui.perfetto.dev (or chrome://tracing); a process per device"
        }
    };
    let devices: Vec<String> = snaps.iter().map(|s| format!("cuda:{}", s.device)).collect();
    writeln!(
        out,
        "wrote {} ({} bytes; {}: {} segments, {} trace entries): {hint}",
        args.output.display(),
        bytes.len(),
        devices.join(", "),
        snaps.iter().map(|s| s.segments.len()).sum::<usize>(),
        // (gpumem's own retag and empty_cache events are not PyTorch entries: not written)
        snaps
            .iter()
            .flat_map(|s| &s.events)
            .filter(|e| !matches!(
                e.kind(),
                crate::trace::EventKind::Retag | crate::trace::EventKind::EmptyCache
            ))
            .count()
    )?;
    // a pickle shares a frame list among the entries that use it; JSON cannot, and writes it
    // out at every use: gzip shares the repeats again. Say so when that made the file large
    let input_len = std::fs::metadata(path).map_or(0, |m| m.len());
    if gz {
        writeln!(
            out,
            "gzip: {} bytes of JSON in {} ({:.1}%); gpumem summary and Python's gzip.open read it",
            plain_len,
            bytes.len(),
            100.0 * bytes.len() as f64 / plain_len.max(1) as f64
        )?;
    } else if args.to == ExportFormat::TorchJson
        && input_len > 0
        && bytes.len() as u64 > 10 * input_len
    {
        writeln!(
            out,
            "{}",
            crate::report::style::wrap(&format!(
                "note: {} is {:.0} times the snapshot's size: JSON writes each shared stack \
                 (frame list) out at every entry that uses it, where the pickle keeps one; \
                 name the output .json.gz to write it compressed (the repeats then cost \
                 almost nothing), or --to memory-viz keeps them shared ({} bytes)",
                args.output.display(),
                bytes.len() as f64 / input_len as f64,
                input_len
            ))
        )?;
    }
    Ok(Outcome::Ok)
}

/// `bytes` compressed with gzip (the default level: JSON's repeated frames shrink a
/// hundredfold).
fn gzip(bytes: &[u8]) -> Result<Vec<u8>> {
    let mut e = flate2::write::GzEncoder::new(
        Vec::with_capacity(bytes.len() / 16),
        flate2::Compression::default(),
    );
    e.write_all(bytes)?;
    Ok(e.finish()?)
}
