//! The allocator-trace format recorded from PyTorch (../shared/tools/alloc_traces.py):
//! `ops` (`["a", id, size]`, `["f", id]`, `["e"]`), the six `after` columns per op, the `ooms`,
//! `stats_end` (all of `memory_stats()`), and PyTorch's own `trace` of allocator events.
//!
//! Reading validates everything a replay relies on and says where a problem is: `ops[17]`,
//! `after[3]`, or the line and column of a JSON syntax error.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use serde::Deserialize;

use crate::error::{Error, Result};

/// `totalGlobalMem` of the H200 the ground truth was recorded on; used when a trace omits it.
pub const H200_TOTAL_MEMORY: u64 = 150_109_880_320;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Alloc { id: u64, size: u64 },
    Free { id: u64 },
    EmptyCache,
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Op::Alloc { id, size } => write!(f, "alloc #{id} of {size} B"),
            Op::Free { id } => write!(f, "free #{id}"),
            Op::EmptyCache => write!(f, "empty_cache()"),
        }
    }
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct OomRecord {
    pub step: usize,
    pub id: u64,
    pub size: u64,
    #[serde(default)]
    pub message: String,
}

/// One entry of PyTorch's device trace: action, address, size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceEntry {
    pub action: String,
    pub addr: u64,
    pub size: u64,
}

#[derive(Debug, Clone)]
pub struct GroundTruth {
    pub kind: String,
    pub seed: Option<i64>,
    pub alloc_conf: String,
    pub memory_fraction: f64,
    pub device_total_memory: u64,
    pub torch_version: String,
    pub device_name: String,
    pub ops: Vec<Op>,
    pub after_columns: Vec<String>,
    /// One row per op, when recorded.
    pub after: Vec<Vec<i64>>,
    pub ooms: Vec<OomRecord>,
    pub stats_end: Option<BTreeMap<String, i64>>,
    pub trace: Vec<TraceEntry>,
}

#[derive(Deserialize)]
struct Raw {
    #[serde(default)]
    kind: String,
    #[serde(default)]
    seed: Option<i64>,
    #[serde(default)]
    alloc_conf: String,
    #[serde(default)]
    memory_fraction: f64,
    #[serde(default)]
    device_total_memory: Option<u64>,
    #[serde(default)]
    torch_version: String,
    #[serde(default)]
    device_name: String,
    ops: Vec<serde_json::Value>,
    #[serde(default)]
    after_columns: Vec<String>,
    #[serde(default)]
    after: Vec<Vec<i64>>,
    #[serde(default)]
    ooms: Vec<OomRecord>,
    #[serde(default)]
    stats_end: Option<BTreeMap<String, i64>>,
    #[serde(default)]
    trace: Vec<serde_json::Value>,
}

/// The `after` column names this reader understands, and the `memory_stats()` key of each.
pub fn column_key(name: &str) -> Option<&'static str> {
    Some(match name {
        "allocated_bytes" => "allocated_bytes.all().current",
        "reserved_bytes" => "reserved_bytes.all().current",
        "segments" => "segment.all().current",
        "inactive_split_bytes" => "inactive_split_bytes.all().current",
        "num_alloc_retries" => "num_alloc_retries",
        "requested_bytes" => "requested_bytes.all().current",
        "active_bytes" => "active_bytes.all().current",
        "num_ooms" => "num_ooms",
        _ => return None,
    })
}

impl GroundTruth {
    pub fn load(path: &Path) -> Result<GroundTruth> {
        let text = crate::input::read_text(path, crate::input::Kind::Text).map_err(|source| {
            Error::Read {
                path: path.into(),
                source,
            }
        })?;
        Self::parse(&text, path)
    }

    /// Parses and validates trace text; `path` only names the file in errors.
    pub fn parse(text: &str, path: &Path) -> Result<GroundTruth> {
        let start = text.trim_start();
        if start.is_empty() {
            return Err(Error::input(
                path,
                "line 1",
                "the file is empty; expected a JSON trace object",
            ));
        }
        if !start.starts_with('{') {
            let at = text.len() - start.len();
            let line = text[..at].matches('\n').count() + 1;
            let column = at - text[..at].rfind('\n').map(|i| i + 1).unwrap_or(0) + 1;
            return Err(Error::input(
                path,
                format!("line {line} column {column}"),
                "a trace must be a JSON object with an `ops` list (as alloc_traces.py writes)",
            ));
        }
        let raw: Raw = serde_json::from_str(text).map_err(|e| {
            let what = match e.classify() {
                serde_json::error::Category::Eof => {
                    "the file ends early (truncated JSON?)".to_string()
                }
                _ => e
                    .to_string()
                    .split(" at line")
                    .next()
                    .unwrap_or("")
                    .to_string(),
            };
            Error::input(
                path,
                format!("line {} column {}", e.line(), e.column()),
                what,
            )
        })?;
        let ops = raw
            .ops
            .iter()
            .enumerate()
            .map(|(i, v)| parse_op(v).map_err(|m| Error::input(path, format!("ops[{i}]"), m)))
            .collect::<Result<Vec<_>>>()?;
        check_ids(&ops, path)?;
        for c in &raw.after_columns {
            if column_key(c).is_none() {
                return Err(Error::input(
                    path,
                    "after_columns",
                    format!("unknown column '{c}'"),
                ));
            }
        }
        if !raw.after.is_empty() {
            if raw.after.len() != ops.len() {
                return Err(Error::input(
                    path,
                    "after",
                    format!(
                        "{} rows for {} ops; there must be one row per op",
                        raw.after.len(),
                        ops.len()
                    ),
                ));
            }
            if raw.after_columns.is_empty() {
                return Err(Error::input(
                    path,
                    "after_columns",
                    "missing, but `after` rows are given",
                ));
            }
            for (i, row) in raw.after.iter().enumerate() {
                if row.len() != raw.after_columns.len() {
                    return Err(Error::input(
                        path,
                        format!("after[{i}]"),
                        format!(
                            "{} values for {} columns",
                            row.len(),
                            raw.after_columns.len()
                        ),
                    ));
                }
            }
        }
        for (i, o) in raw.ooms.iter().enumerate() {
            match ops.get(o.step) {
                Some(Op::Alloc { id, .. }) if *id == o.id => {}
                _ => {
                    return Err(Error::input(
                        path,
                        format!("ooms[{i}]"),
                        format!("step {} is not the allocation of id {}", o.step, o.id),
                    ))
                }
            }
        }
        if raw.device_total_memory == Some(0) {
            return Err(Error::input(
                path,
                "device_total_memory",
                "must be more than 0 bytes",
            ));
        }
        if !(0.0..=1.0).contains(&raw.memory_fraction) {
            return Err(Error::input(
                path,
                "memory_fraction",
                "must be between 0 and 1 (0 = no limit)",
            ));
        }
        let trace = raw
            .trace
            .iter()
            .enumerate()
            .map(|(i, v)| {
                parse_trace_entry(v).map_err(|m| Error::input(path, format!("trace[{i}]"), m))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(GroundTruth {
            kind: raw.kind,
            seed: raw.seed,
            alloc_conf: raw.alloc_conf,
            memory_fraction: raw.memory_fraction,
            device_total_memory: raw.device_total_memory.unwrap_or(H200_TOTAL_MEMORY),
            torch_version: raw.torch_version,
            device_name: raw.device_name,
            ops,
            after_columns: raw.after_columns,
            after: raw.after,
            ooms: raw.ooms,
            stats_end: raw.stats_end,
            trace,
        })
    }
}

fn parse_op(v: &serde_json::Value) -> std::result::Result<Op, String> {
    const FORMS: &str = r#"expected ["a", id, size], ["f", id] or ["e"]"#;
    let arr = v
        .as_array()
        .ok_or_else(|| format!("{v} is not a list; {FORMS}"))?;
    let int = |i: usize, what: &str| -> std::result::Result<u64, String> {
        arr.get(i)
            .and_then(|x| x.as_u64())
            .ok_or_else(|| format!("{v}: {what} must be a non-negative integer; {FORMS}"))
    };
    match arr.first().and_then(|x| x.as_str()) {
        Some("a") if arr.len() == 3 => Ok(Op::Alloc {
            id: int(1, "id")?,
            size: int(2, "size")?,
        }),
        Some("f") if arr.len() == 2 => Ok(Op::Free { id: int(1, "id")? }),
        Some("e") if arr.len() == 1 => Ok(Op::EmptyCache),
        Some(s @ ("a" | "f" | "e")) => Err(format!(
            "{v}: wrong number of fields for op \"{s}\"; {FORMS}"
        )),
        Some(s) => Err(format!("unknown op \"{s}\"; {FORMS}")),
        None => Err(format!("{v}: the op name must be a string; {FORMS}")),
    }
}

fn parse_trace_entry(v: &serde_json::Value) -> std::result::Result<TraceEntry, String> {
    let bad = || format!("{v}: expected [action, address, size]");
    let arr = v.as_array().filter(|a| a.len() == 3).ok_or_else(bad)?;
    Ok(TraceEntry {
        action: arr[0].as_str().ok_or_else(bad)?.to_string(),
        addr: arr[1].as_u64().ok_or_else(bad)?,
        size: arr[2].as_u64().ok_or_else(bad)?,
    })
}

/// Every free names a live id; no id is allocated twice while live.
fn check_ids(ops: &[Op], path: &Path) -> Result<()> {
    let mut live = HashSet::new();
    let mut seen = HashSet::new();
    for (i, op) in ops.iter().enumerate() {
        match *op {
            Op::Alloc { id, .. } => {
                if !live.insert(id) {
                    return Err(Error::input(
                        path,
                        format!("ops[{i}]"),
                        format!("id {id} is allocated again while still live"),
                    ));
                }
                seen.insert(id);
            }
            Op::Free { id } => {
                if !live.remove(&id) {
                    let why = if seen.contains(&id) {
                        "was already freed"
                    } else {
                        "was never allocated"
                    };
                    return Err(Error::input(
                        path,
                        format!("ops[{i}]"),
                        format!("free of id {id}, which {why}"),
                    ));
                }
            }
            Op::EmptyCache => {}
        }
    }
    Ok(())
}
