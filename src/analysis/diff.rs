//! Two snapshots (or runs) side by side: peaks, categories at the peak, allocation sites,
//! segments. Rows are sorted by the size of their change, largest first.

use std::collections::BTreeMap;

use super::summary::Summary;

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Row {
    pub name: String,
    pub a: u64,
    pub b: u64,
}

impl Row {
    pub fn change(&self) -> i64 {
        self.b as i64 - self.a as i64
    }
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Diff {
    pub totals: Vec<Row>,
    pub categories_at_peak: Vec<Row>,
    pub sites_at_peak: Vec<Row>,
    pub sites_live: Vec<Row>,
    /// Segments by size: how many of each size in A and in B (only sizes that differ).
    pub segment_sizes: Vec<Row>,
}

/// Rows for the names of `a` and `b`, largest change first, at most `top`.
pub(crate) fn rows(a: &[(String, u64)], b: &[(String, u64)], top: usize) -> Vec<Row> {
    let mut m: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for (k, v) in a {
        m.entry(k.clone()).or_default().0 += v;
    }
    for (k, v) in b {
        m.entry(k.clone()).or_default().1 += v;
    }
    let mut out: Vec<Row> = m
        .into_iter()
        .map(|(name, (a, b))| Row { name, a, b })
        .filter(|r| r.a != r.b || r.a > 0)
        .collect();
    out.sort_by(|x, y| {
        y.change()
            .unsigned_abs()
            .cmp(&x.change().unsigned_abs())
            .then(y.b.max(y.a).cmp(&x.b.max(x.a)))
            .then(x.name.cmp(&y.name))
    });
    out.truncate(top);
    out
}

fn segment_sizes(s: &Summary) -> Vec<(String, u64)> {
    let mut m: BTreeMap<(&str, u64), u64> = BTreeMap::new();
    for g in &s.fragmentation.segments {
        *m.entry((g.pool, g.size)).or_default() += 1;
    }
    m.into_iter()
        .map(|((p, size), n)| (format!("{p} {}", crate::units::format_bytes(size)), n))
        .collect()
}

pub fn diff(a: &Summary, b: &Summary, top: usize) -> Diff {
    let peak = |s: &Summary| {
        s.trace
            .as_ref()
            .map_or(s.all.allocated_bytes, |t| t.peak_allocated_bytes)
    };
    let peak_res = |s: &Summary| {
        s.trace
            .as_ref()
            .map_or(s.all.reserved_bytes, |t| t.peak_reserved_bytes)
    };
    let totals = vec![
        Row {
            name: "peak allocated".into(),
            a: peak(a),
            b: peak(b),
        },
        Row {
            name: "peak reserved".into(),
            a: peak_res(a),
            b: peak_res(b),
        },
        Row {
            name: "allocated at the end".into(),
            a: a.all.allocated_bytes,
            b: b.all.allocated_bytes,
        },
        Row {
            name: "reserved at the end".into(),
            a: a.all.reserved_bytes,
            b: b.all.reserved_bytes,
        },
        Row {
            name: "free in segments at the end".into(),
            a: a.fragmentation.external,
            b: b.fragmentation.external,
        },
        Row {
            name: "segments".into(),
            a: a.all.segments,
            b: b.all.segments,
        },
    ];
    let cats = |s: &Summary| {
        s.trace
            .as_ref()
            .map(|t| t.peak_by_category.clone())
            .unwrap_or_default()
    };
    let sites_peak = |s: &Summary| {
        s.trace
            .as_ref()
            .map(|t| {
                t.top_sites_at_peak
                    .iter()
                    .map(|x| (x.site.clone(), x.bytes))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
    };
    let live = |s: &Summary| {
        s.live_by_site
            .iter()
            .map(|x| (x.site.clone(), x.bytes))
            .collect::<Vec<_>>()
    };
    let mut seg = rows(&segment_sizes(a), &segment_sizes(b), usize::MAX);
    seg.retain(|r| r.a != r.b);
    seg.truncate(top);
    Diff {
        totals,
        categories_at_peak: rows(&cats(a), &cats(b), usize::MAX),
        sites_at_peak: rows(&sites_peak(a), &sites_peak(b), top),
        sites_live: rows(&live(a), &live(b), top),
        segment_sizes: seg,
    }
}
