//! What a tag stack says about an allocation: its iteration, its memory category, the op that
//! made it and its site (the stack without the iteration and category tags, so the same line
//! of a loop is the same site in every iteration).
//!
//! gpumem's runner tags every allocation `setup` or `iter:N`, then `phase:...`, the scopes, the
//! op, and innermost `category:NAME`. A trace from elsewhere may have none of these: every
//! field is then empty and the analyses fall back on what the events alone say.

use crate::trace::{StackId, Tags};

/// When an allocation was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum When {
    /// Before the first iteration (the `setup` script).
    Setup,
    /// In iteration N (from 0).
    Iteration(u32),
    /// The stack does not say.
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackMeta {
    pub when: When,
    /// The innermost `category:NAME` tag's NAME.
    pub category: Option<String>,
    /// The tags without `setup`, `iter:N` and `category:...`, joined with `/`.
    pub site: String,
    /// The innermost tag that is not a category (the op, for an allocation in an op).
    pub op: Option<String>,
}

/// Resolves stacks once each.
pub struct Annotator<'a> {
    tags: &'a Tags,
    cache: Vec<Option<std::rc::Rc<StackMeta>>>,
}

impl<'a> Annotator<'a> {
    pub fn new(tags: &'a Tags) -> Self {
        Annotator {
            tags,
            cache: Vec::new(),
        }
    }

    pub fn meta(&mut self, s: StackId) -> std::rc::Rc<StackMeta> {
        let i = s.0 as usize;
        if i >= self.cache.len() {
            self.cache.resize(i + 1, None);
        }
        if let Some(m) = &self.cache[i] {
            return m.clone();
        }
        let m = std::rc::Rc::new(describe(&self.tags.resolve(s)));
        self.cache[i] = Some(m.clone());
        m
    }
}

/// The label of a stack whose frames are all C++ (PyTorch's own, with no Python caller
/// recorded).
pub const NO_PYTHON_FRAMES: &str = "(C++ frames only)";

/// The label of an allocation recorded with no frames at all.
pub const NO_FRAMES: &str = "(no frames recorded)";

/// The meaning of a stack's tags, outermost first.
pub fn describe(tags: &[&str]) -> StackMeta {
    let mut when = When::Unknown;
    let mut category = None;
    let mut site = Vec::new();
    for t in tags {
        if *t == "setup" {
            when = When::Setup;
        } else if let Some(n) = t.strip_prefix("iter:").and_then(|n| n.parse().ok()) {
            when = When::Iteration(n);
        } else if let Some(c) = t.strip_prefix("category:") {
            category = Some(c.to_string());
        } else {
            site.push(*t);
        }
    }
    StackMeta {
        when,
        category,
        op: site.last().map(|s| s.to_string()),
        site: site.join("/"),
    }
}

/// Whether a tag is a Python frame as snapshots name them (`file.py:LINE:function`).
pub fn is_python_frame(tag: &str) -> bool {
    let mut parts = tag.splitn(3, ':');
    matches!(
        (parts.next(), parts.next(), parts.next()),
        (Some(f), Some(l), Some(_)) if f.ends_with(".py") && l.parse::<u64>().is_ok()
    )
}

/// A site as a person reads it. A site made of call-stack frames (a PyTorch snapshot's) is
/// shown innermost frame first, Python frames only, at most `depth` of them with a count of the
/// rest, unless `full` (every frame, C++ ones too). Other sites (gpumem's scopes and ops) are
/// returned as they are.
pub fn display_site(site: &str, full: bool, depth: usize) -> String {
    let shown = shown_site(site, full, depth);
    // a table wraps each cell in time that grows with the square of its length: a site of
    // thousands of tags (a hostile or broken file) is cut, not wrapped for minutes
    match shown.char_indices().nth(MAX_SITE_CHARS) {
        Some((cut, _)) => format!(
            "{} ... ({} more characters)",
            &shown[..cut],
            shown[cut..].chars().count()
        ),
        None => shown,
    }
}

/// The most characters of a site a report shows.
pub const MAX_SITE_CHARS: usize = 16_384;

fn shown_site(site: &str, full: bool, depth: usize) -> String {
    let parts: Vec<&str> = site.split('/').collect();
    let frames = parts
        .iter()
        .filter(|p| is_python_frame(p) || p.starts_with("[C++] "))
        .count();
    if frames == 0 {
        return site.to_string();
    }
    let shown: Vec<&str> = parts
        .iter()
        .rev()
        .copied()
        .filter(|p| full || is_python_frame(p))
        .collect();
    if shown.is_empty() {
        return NO_PYTHON_FRAMES.into();
    }
    if full || shown.len() <= depth {
        return shown.join(" < ");
    }
    format!(
        "{} < ... ({} more)",
        shown[..depth].join(" < "),
        shown.len() - depth
    )
}

/// [`display_site`] for the rows of one table: rows that would read the same at `depth` frames
/// get more frames, group by group, until they differ (or show every frame), so no two rows of
/// a table look alike unless their Python stacks are the same.
pub fn display_sites(sites: &[&str], full: bool, depth: usize) -> Vec<String> {
    // what a reader compares: the frames shown, not the count of those left out
    let frames = |s: &str| s.split(" < ... (").next().unwrap_or(s).to_string();
    let mut depths = vec![depth; sites.len()];
    let mut shown: Vec<String> = sites.iter().map(|s| display_site(s, full, depth)).collect();
    loop {
        // rows that read alike but are different sites, grouped by what they show
        let mut groups: std::collections::HashMap<String, Vec<usize>> = Default::default();
        for (i, s) in shown.iter().enumerate() {
            groups.entry(frames(s)).or_default().push(i);
        }
        let mut grew = false;
        for rows in groups.values() {
            if rows.iter().all(|&i| sites[i] == sites[rows[0]]) {
                continue;
            }
            for &k in rows {
                let next = display_site(sites[k], full, depths[k] + 1);
                if next != shown[k] {
                    depths[k] += 1;
                    shown[k] = next;
                    grew = true;
                }
            }
        }
        if !grew {
            return shown;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_that_read_alike_get_more_frames() {
        let a = "m.py:1:main/t.py:9:step/conv.py:5:convert/mod.py:3:_apply/mod.py:2:_apply";
        let b = "m.py:1:main/t.py:8:load/conv.py:5:convert/mod.py:3:_apply/mod.py:2:_apply";
        let c = "m.py:1:main/x.py:1:other";
        let rows = display_sites(&[a, b, c], false, 3);
        assert_eq!(
            rows[0],
            "mod.py:2:_apply < mod.py:3:_apply < conv.py:5:convert < t.py:9:step < ... (1 more)"
        );
        assert_eq!(
            rows[1],
            "mod.py:2:_apply < mod.py:3:_apply < conv.py:5:convert < t.py:8:load < ... (1 more)"
        );
        assert_eq!(rows[2], "x.py:1:other < m.py:1:main");
        // alike at 3 frames, and not when shown one by one
        assert_eq!(display_site(a, false, 3), display_site(b, false, 3));
    }

    #[test]
    fn reads_runner_tags() {
        let m = describe(&[
            "iter:3",
            "phase:forward",
            "layers.1",
            "linear",
            "category:activation",
        ]);
        assert_eq!(m.when, When::Iteration(3));
        assert_eq!(m.category.as_deref(), Some("activation"));
        assert_eq!(m.site, "phase:forward/layers.1/linear");
        assert_eq!(m.op.as_deref(), Some("linear"));
        let s = describe(&["setup", "randn", "category:parameter"]);
        assert_eq!((s.when, s.site.as_str()), (When::Setup, "randn"));
        let none = describe(&[]);
        assert_eq!(
            (none.when, none.category, none.op),
            (When::Unknown, None, None)
        );
    }
}
