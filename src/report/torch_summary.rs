//! `torch.cuda.memory_summary()`, reproduced exactly (allocator spec, section 6): 75-column
//! lines between bars, PyTorch's integer-floor unit scaling, and the unit of each pool row
//! chosen by the `all` row of the same column.

use std::io::Write;

use crate::alloc::{DeviceStats, Stat, StatArray};

const BYTE_METRICS: [(&str, &str); 5] = [
    ("allocated_bytes", "Allocated memory"),
    ("active_bytes", "Active memory"),
    ("requested_bytes", "Requested memory"),
    ("reserved_bytes", "GPU reserved memory"),
    ("inactive_split_bytes", "Non-releasable memory"),
];
const COUNT_METRICS: [(&str, &str); 4] = [
    ("allocation", "Allocations"),
    ("active", "Active allocs"),
    ("segment", "GPU reserved segments"),
    ("inactive_split", "Non-releasable allocs"),
];

/// PyTorch's unit stepping: while the reference (the `all` row's value in this column) is at
/// least `threshold` (a float, as in Python), step up one unit, floor-divide the value by `step`
/// and divide the reference by it.
fn scale<'a>(
    v: i64,
    reference: i64,
    units: &[&'a str],
    step: i64,
    threshold: f64,
) -> (i64, &'a str) {
    let (mut v, mut r, mut unit) = (v, reference as f64, units[0]);
    for u in &units[1..] {
        if r < threshold {
            break;
        }
        unit = u;
        v = v.div_euclid(step);
        r /= step as f64;
    }
    (v, unit)
}

/// `_format_size(v, ref)`: 10 characters.
fn format_size(v: i64, reference: i64) -> String {
    let (v, unit) = scale(
        v,
        reference,
        &["B  ", "KiB", "MiB", "GiB", "TiB", "PiB"],
        1024,
        768.0 * 1024.0,
    );
    format!("{v:6} {unit}")
}

/// `_format_count(v, ref)`: 10 characters.
fn format_count(v: i64, reference: i64) -> String {
    let (v, unit) = scale(v, reference, &[" ", "K", "M"], 1000, 750.0 * 1000.0);
    format!("{v:7} {unit} ")
}

fn row(label: &str, s: &Stat, reference: &Stat, f: fn(i64, i64) -> String) -> String {
    format!(
        " {:<21} | {} | {} | {} | {} ",
        label,
        f(s.current, reference.current),
        f(s.peak, reference.peak),
        f(s.allocated, reference.allocated),
        f(s.freed, reference.freed)
    )
}

fn metric_rows(
    lines: &mut Vec<String>,
    name: &str,
    a: &StatArray,
    f: fn(i64, i64) -> String,
    abbreviated: bool,
) {
    lines.push("-".repeat(75));
    lines.push(row(name, &a.all(), &a.all(), f));
    if !abbreviated {
        lines.push(row("      from large pool", &a.large_pool(), &a.all(), f));
        lines.push(row("      from small pool", &a.small_pool(), &a.all(), f));
    }
}

/// The summary text, ending with a newline, as PyTorch returns it.
pub fn render(stats: &DeviceStats, device: u32, abbreviated: bool) -> String {
    let mut lines = vec![
        "=".repeat(75),
        format!(
            " {:16} PyTorch CUDA memory summary, device ID {:<17} ",
            "", device
        ),
        "-".repeat(75),
        format!(
            "  {:9} CUDA OOMs: {:<12} | {:6} cudaMalloc retries: {:<8}  ",
            "", stats.num_ooms, "", stats.num_alloc_retries
        ),
        "=".repeat(75),
        "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  ".to_string(),
    ];
    for (key, name) in BYTE_METRICS {
        metric_rows(
            &mut lines,
            name,
            stats.array(key).expect("byte metric"),
            format_size,
            abbreviated,
        );
    }
    for (key, name) in COUNT_METRICS {
        metric_rows(
            &mut lines,
            name,
            stats.array(key).expect("count metric"),
            format_count,
            abbreviated,
        );
    }
    for (name, s) in [
        ("Oversize allocations", &stats.oversize_allocations),
        ("Oversize GPU segments", &stats.oversize_segments),
    ] {
        lines.push("-".repeat(75));
        lines.push(row(name, s, s, format_count));
    }
    lines.push("=".repeat(75));
    format!("|{}|\n", lines.join("|\n|"))
}

pub fn write(out: &mut dyn Write, stats: &DeviceStats, device: u32) -> std::io::Result<()> {
    out.write_all(render(stats, device, false).as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_examples_from_the_spec() {
        assert_eq!(format_size(1 << 20, 1 << 20), "  1024 KiB");
        assert_eq!(format_size(20 << 20, 20 << 20), " 20480 KiB");
        assert_eq!(format_size(768 << 20, 768 << 20), "   768 MiB");
        assert_eq!(format_size(512, 512), "   512 B  ");
        assert_eq!(format_count(240, 240), "    240   ");
        assert_eq!(format_count(750_000, 750_000), "    750 K ");
    }
}
