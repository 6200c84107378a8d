//! `memory_stats()` as a readable table (comfy-table): one row per metric and pool, with
//! current, peak, total allocated and total freed in binary units.

use std::io::Write;

use comfy_table::CellAlignment;

use crate::alloc::{DeviceStats, Stat};
use crate::units::format_bytes;

fn bytes(v: i64) -> String {
    if v < 0 {
        format!("-{}", format_bytes(v.unsigned_abs()))
    } else {
        format_bytes(v as u64)
    }
}

pub fn render(stats: &DeviceStats) -> String {
    let mut t = super::style::table();
    t.set_header(vec![
        "metric",
        "pool",
        "current",
        "peak",
        "total allocated",
        "total freed",
    ]);
    let metrics: [(&str, &str, bool); 9] = [
        ("allocated_bytes", "allocated", true),
        ("active_bytes", "active", true),
        ("requested_bytes", "requested", true),
        ("reserved_bytes", "reserved", true),
        (
            "inactive_split_bytes",
            "inactive_split (non-releasable)",
            true,
        ),
        ("allocation", "allocations", false),
        ("active", "active allocs", false),
        ("segment", "segments", false),
        ("inactive_split", "inactive_split blocks", false),
    ];
    let cells = |s: &Stat, is_bytes: bool| -> Vec<String> {
        let f = |v: i64| if is_bytes { bytes(v) } else { v.to_string() };
        vec![f(s.current), f(s.peak), f(s.allocated), f(s.freed)]
    };
    for (key, label, is_bytes) in metrics {
        let a = stats.array(key).expect("listed metric");
        for (pool, s) in [
            ("all", &a.all()),
            ("large", &a.large_pool()),
            ("small", &a.small_pool()),
        ] {
            let mut r = vec![
                if pool == "all" {
                    label.to_string()
                } else {
                    String::new()
                },
                pool.to_string(),
            ];
            r.extend(cells(s, is_bytes));
            t.add_row(r);
        }
    }
    for (label, s) in [
        ("oversize allocations", &stats.oversize_allocations),
        ("oversize segments", &stats.oversize_segments),
    ] {
        let mut r = vec![label.to_string(), "all".to_string()];
        r.extend(cells(s, false));
        t.add_row(r);
    }
    for i in 2..6 {
        if let Some(c) = t.column_mut(i) {
            c.set_cell_alignment(CellAlignment::Right);
        }
    }
    let mut s = t.to_string();
    s.push('\n');
    s.push_str(&super::style::wrap(&format!(
        "OOMs: {}   cudaMalloc retries: {}   device allocs/frees: {}/{}   cache flushes: {}   max_split_size: {}",
        stats.num_ooms,
        stats.num_alloc_retries,
        stats.num_device_alloc,
        stats.num_device_free,
        stats.num_sync_all_streams,
        if stats.max_split_size < 0 { "unlimited".to_string() } else { bytes(stats.max_split_size) }
    )));
    s.push('\n');
    s
}

pub fn write(out: &mut dyn Write, stats: &DeviceStats) -> std::io::Result<()> {
    out.write_all(render(stats).as_bytes())
}
