//! What an out-of-memory was, from the allocator's state at the failure and the trace.
//!
//! Two verdicts. **Fragmentation**: the run fits under an allocator setting (expandable
//! segments, `max_split_size_mb`): the memory not in use was in pieces. **Capacity**: no
//! allocator setting makes it fit; the workload must need less, and [`confirm`] says how much
//! it needs (its peak reserved on an unbounded device).
//!
//! From the state at the failure alone ([`diagnose`]) the verdict is provisional: the
//! tensors alive plus the request either exceed what the allocator may use (capacity for
//! sure) or not (fragmentation at that moment, though the run may need more later). A
//! workload's re-runs ([`confirm`]) settle it; a snapshot, which cannot be re-run, keeps the
//! provisional verdict and says so.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use super::stacks::describe;
use crate::alloc::OutOfMemory;
use crate::trace::{Event, EventKind, StackId, Tags};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Capacity,
    Fragmentation,
}

impl Verdict {
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Capacity => "capacity",
            Verdict::Fragmentation => "fragmentation",
        }
    }
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct OomDiagnosis {
    /// Bytes asked for, and as the allocator rounds them.
    pub requested: u64,
    pub rounded: u64,
    /// The device's memory.
    pub capacity: u64,
    /// What the allocator may hold: the device less the CUDA context, or the fraction limit.
    pub usable: u64,
    pub allocated: u64,
    pub reserved: u64,
    pub device_free: u64,
    /// The largest free block in the pool the request comes from.
    pub largest_free_block: u64,
    pub verdict: Verdict,
    /// Whether re-runs settled the verdict ([`confirm`]); otherwise it is read from the state
    /// at the failure alone.
    pub confirmed: bool,
    /// What the run needs: its peak reserved on an unbounded device, when it was re-run so.
    pub needs_reserved: Option<u64>,
    /// When it ran out building the model (before any step) and the model alone, as the
    /// unbounded run built it, is more than `usable`: that allocated size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_alone: Option<u64>,
    /// The verdict in a sentence or two, with the figures.
    pub explanation: String,
    /// Where the failing allocation was asked for: its tags (scopes and op) without the
    /// iteration, category and phase, e.g. `model.layers.17.mlp.up_proj/linear` (empty if
    /// untagged), and its phase (`forward`).
    pub site: (String, Option<String>),
    /// Live bytes (requested) by category, largest first.
    pub live_by_category: Vec<(String, u64)>,
    /// Live bytes by site (tags without iteration and category), largest first, at most 10.
    pub top_tags: Vec<(String, u64)>,
}

/// The allocations live after the last event: (requested bytes, stack, category stack of the
/// last retag).
pub fn live_at_end(events: &[Event]) -> Vec<(u64, StackId, Option<StackId>)> {
    let mut live: FxHashMap<u64, (u64, StackId, Option<StackId>)> = FxHashMap::default();
    for e in events {
        match e.kind() {
            EventKind::Alloc => {
                live.insert(e.addr, (e.size(), e.stack, None));
            }
            EventKind::FreeRequested => {
                live.remove(&e.addr);
            }
            EventKind::Retag => {
                if let Some(l) = live.get_mut(&e.addr) {
                    l.2 = Some(e.stack);
                }
            }
            _ => {}
        }
    }
    live.into_values().collect()
}

/// Bytes by name, largest first.
pub type ByName = Vec<(String, u64)>;

/// Live bytes by category and by site, each largest first.
pub fn live_breakdown(events: &[Event], tags: &Tags) -> (ByName, ByName) {
    let mut by_cat: BTreeMap<String, u64> = BTreeMap::new();
    let mut by_site: BTreeMap<String, u64> = BTreeMap::new();
    for (size, stack, retag) in live_at_end(events) {
        let m = describe(&tags.resolve(stack));
        let cat = retag
            .and_then(|r| describe(&tags.resolve(r)).category)
            .or(m.category)
            .unwrap_or_else(|| "other".into());
        *by_cat.entry(cat).or_default() += size;
        let site = if m.site.is_empty() {
            "(untagged)".to_string()
        } else {
            m.site
        };
        *by_site.entry(site).or_default() += size;
    }
    let sorted = |m: BTreeMap<String, u64>| {
        let mut v: Vec<_> = m.into_iter().collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v
    };
    let mut sites = sorted(by_site);
    sites.truncate(10);
    (sorted(by_cat), sites)
}

/// Where the last out-of-memory of `events` was asked for: its site (scopes and op, without
/// the iteration, the category or the phase) and its phase (`forward`), if tagged.
pub fn oom_site<'a>(
    events: impl IntoIterator<Item = &'a Event>,
    tags: &Tags,
) -> (String, Option<String>) {
    let Some(e) = events
        .into_iter()
        .filter(|e| e.kind() == EventKind::Oom)
        .last()
    else {
        return (String::new(), None);
    };
    let site = describe(&tags.resolve(e.stack)).site;
    let mut phase = None;
    let parts: Vec<&str> = site
        .split('/')
        .filter(|p| match p.strip_prefix("phase:") {
            Some(ph) => {
                phase = Some(ph.to_string());
                false
            }
            None => !p.is_empty(),
        })
        .collect();
    (parts.join("/"), phase)
}

/// Where a run ran out, as a user reads it: the op's tags, the iteration and phase, and a
/// workload file's line when `with_line` (a bare config's generated lines mean nothing to
/// its user). `iteration` is `None` in setup.
pub fn oom_place(
    site: &(String, Option<String>),
    iteration: Option<u32>,
    tokens: Option<u64>,
    line: u32,
    with_line: bool,
) -> String {
    let mut when = iteration
        .map(|i| format!("iteration {i}"))
        .unwrap_or_else(|| "setup".into());
    if let Some(t) = tokens {
        when.push_str(&format!(
            ", generating token {}",
            crate::units::group_digits(t + 1)
        ));
    }
    if let Some(p) = &site.1 {
        when.push_str(&format!(", {p}"));
    }
    if with_line {
        when.push_str(&format!(", line {line}"));
    }
    if site.0.is_empty() {
        when
    } else {
        format!("{} ({when})", site.0)
    }
}

/// Diagnoses `oom` (which carries its pool's free blocks at the failure) given the trace up
/// to it.
pub fn diagnose(oom: &OutOfMemory, usable: u64, events: &[Event], tags: &Tags) -> OomDiagnosis {
    use crate::units::format_bytes as b;
    // the request's pool as the failure left it (the state at the run's end has the run's
    // last tensors freed)
    let largest = oom.largest_free;
    let unallocated = oom.reserved.saturating_sub(oom.allocated);
    let fits = oom.allocated.saturating_add(oom.rounded) <= usable;
    let verdict = if fits && !oom.over_one_exabyte {
        Verdict::Fragmentation
    } else {
        Verdict::Capacity
    };
    let explanation = match verdict {
        Verdict::Capacity => format!(
            "out of capacity: tensors alive at the failure hold {}, and with the {} asked for \
             that is {}, more than the {} the allocator may use. No allocator setting helps: \
             the workload has to need less memory.",
            b(oom.allocated),
            b(oom.rounded),
            b(oom.allocated.saturating_add(oom.rounded)),
            b(usable)
        ),
        Verdict::Fragmentation => format!(
            "fragmentation (from the state at the failure; not re-run): tensors alive hold {} \
             and the {} asked for would fit in the {} the allocator may use, but {} is \
             reserved and unallocated in {} free blocks, the largest {}, and only {} of the \
             device is free to add a segment. An allocator setting may fix this; whether the \
             rest of the run fits is not known.",
            b(oom.allocated),
            b(oom.rounded),
            b(usable),
            b(unallocated),
            oom.free_blocks,
            b(largest),
            b(oom.device_free)
        ),
    };
    let (mut live_by_category, top_tags) = live_breakdown(events, tags);
    // the trace's sizes are those asked for; `allocated` counts the blocks, rounded up (and
    // any block the trace does not show): the rest is its own row, so the rows add up
    let asked: u64 = live_by_category.iter().map(|(_, n)| n).sum();
    if oom.allocated > asked && !live_by_category.is_empty() {
        live_by_category.push((
            "(blocks larger than asked, or from before the trace)".into(),
            oom.allocated - asked,
        ));
    }
    let site = oom_site(events, tags);
    OomDiagnosis {
        site,
        requested: oom.requested,
        rounded: oom.rounded,
        capacity: oom.device_total,
        usable,
        allocated: oom.allocated,
        reserved: oom.reserved,
        device_free: oom.device_free,
        largest_free_block: largest,
        verdict,
        confirmed: false,
        needs_reserved: None,
        model_alone: None,
        explanation,
        live_by_category,
        top_tags,
    }
}

/// Settles a diagnosis with re-runs of the workload: `fitting_setting`, the allocator setting
/// whose re-run fit (if any was tried: `settings_tried`), and `needs`, the run's peak reserved
/// on an unbounded device. Fragmentation only when an allocator setting fit; otherwise
/// capacity, with what the run needs.
pub fn confirm(
    d: &mut OomDiagnosis,
    settings_tried: bool,
    fitting_setting: Option<&str>,
    needs: Option<u64>,
    built_in_setup: Option<u64>,
) {
    use crate::units::format_bytes as b;
    if !settings_tried && needs.is_none() {
        return;
    }
    d.confirmed = true;
    d.needs_reserved = needs;
    d.model_alone = built_in_setup.filter(|m| *m > d.usable);
    let needs_text = match needs {
        Some(n) if n > d.usable => format!(
            "The run needs {} reserved at its peak (run on an unbounded device), {} more than \
             the {} the allocator may use",
            b(n),
            b(n - d.usable),
            b(d.usable)
        ),
        Some(n) => format!(
            "On an unbounded device its peak reserved is {}, within the {} the allocator may \
             use",
            b(n),
            b(d.usable)
        ),
        None => String::new(),
    };
    let unallocated = d.reserved.saturating_sub(d.allocated);
    // (a leak's warning, added by the findings, stays)
    let tail = d
        .explanation
        .find(" But first:")
        .map(|i| d.explanation[i..].to_string())
        .unwrap_or_default();
    match fitting_setting {
        Some(setting) => {
            d.verdict = Verdict::Fragmentation;
            d.explanation = format!(
                "fragmentation: re-run with {setting} the workload fits. At the failure, tensors \
                 alive held {} and {} was reserved but unallocated, the largest free block {}, \
                 too small for the {} asked for.{}",
                b(d.allocated),
                b(unallocated),
                b(d.largest_free_block),
                b(d.rounded),
                match needs {
                    Some(n) => format!(
                        " (As set, the allocator reserves {} at the run's peak on an unbounded \
                         device.)",
                        b(n)
                    ),
                    None => String::new(),
                }
            );
        }
        None => {
            d.verdict = Verdict::Capacity;
            let moment = if d.allocated.saturating_add(d.rounded) <= d.usable {
                let why = if unallocated >= d.rounded && d.largest_free_block >= d.rounded {
                    // (its pool's free blocks are large enough: they were another stream's,
                    // or oversize blocks a smaller request may not split)
                    format!(
                        "the {} reserved and unallocated sat in blocks it could not use (the \
                         largest {}: another stream's, or an oversize block)",
                        b(unallocated),
                        b(d.largest_free_block)
                    )
                } else if unallocated >= d.rounded {
                    format!(
                        "the {} reserved and unallocated was in pieces (the largest {})",
                        b(unallocated),
                        b(d.largest_free_block)
                    )
                } else {
                    format!(
                        "a new segment for it did not fit beside the {} reserved",
                        b(d.reserved)
                    )
                };
                format!(
                    "At the failure the {} asked for and the {} alive were within the {} the \
                     allocator may use, but {why}, and no allocator setting makes the whole run \
                     fit (each was re-run).",
                    b(d.rounded),
                    b(d.allocated),
                    b(d.usable),
                )
            } else {
                format!(
                    "Tensors alive at the failure hold {}, and with the {} asked for that is \
                     more than the {} the allocator may use.",
                    b(d.allocated),
                    b(d.rounded),
                    b(d.usable)
                )
            };
            let fix = match d.model_alone {
                Some(m) => format!(
                    "It ran out building the model: the model alone (its parameters and what \
                     wraps them) holds {} before the first step, more than the {} the \
                     allocator may use, so no change to the loop (batch, sequence, \
                     checkpointing, optimizer) can help. The weights have to shrink or be \
                     spread: bf16 weights, sharding over GPUs (FSDP2, ZeRO-3), or a larger \
                     card (quantized weights, such as QLoRA's 4-bit, are not modelled by \
                     gpumem).",
                    b(m),
                    b(d.usable)
                ),
                None => "The workload has to need less memory: see the remedies.".into(),
            };
            d.explanation = format!(
                "out of capacity: {moment} {}{fix}",
                if needs_text.is_empty() {
                    String::new()
                } else {
                    format!("{needs_text}. ")
                }
            );
        }
    }
    d.explanation.push_str(&tail);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::MIB;

    fn at_failure(unallocated: u64, largest: u64) -> OomDiagnosis {
        OomDiagnosis {
            site: Default::default(),
            requested: 32 * MIB,
            rounded: 32 * MIB,
            capacity: 1024 * MIB,
            usable: 1000 * MIB,
            allocated: 800 * MIB,
            reserved: 800 * MIB + unallocated,
            device_free: 0,
            largest_free_block: largest,
            verdict: Verdict::Fragmentation,
            confirmed: false,
            needs_reserved: None,
            model_alone: None,
            explanation: String::new(),
            live_by_category: Vec::new(),
            top_tags: Vec::new(),
        }
    }

    /// A capacity out-of-memory whose request would have fitted beside what was alive says
    /// why it failed as the figures show it: free memory in pieces smaller than the request,
    /// free blocks large enough that the request could not use, or no room for a segment;
    /// never "in pieces" beside a largest free block that could hold it.
    #[test]
    fn a_capacity_verdict_says_why_the_request_found_no_block() {
        let said = |unallocated, largest| {
            let mut d = at_failure(unallocated, largest);
            confirm(&mut d, true, None, Some(2048 * MIB), None);
            assert_eq!(d.verdict, Verdict::Capacity);
            d.explanation
        };
        let pieces = said(100 * MIB, 8 * MIB);
        assert!(
            pieces.contains("was in pieces (the largest 8.00 MiB)"),
            "{pieces}"
        );
        let unusable = said(100 * MIB, 64 * MIB);
        assert!(
            unusable.contains("sat in blocks it could not use (the largest 64.00 MiB"),
            "{unusable}"
        );
        let segment = said(16 * MIB, 16 * MIB);
        assert!(
            segment.contains("a new segment for it did not fit beside the 816.00 MiB reserved"),
            "{segment}"
        );
    }
}
