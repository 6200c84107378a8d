//! The answer a user came for, in one line: does it fit on this card, with how much to spare,
//! or how much is missing and where it ran out. Computed from a run (or a snapshot) and the
//! re-runs that settled its out-of-memory; `report::verdict` writes it as the first line of
//! `run`, `fit`, `summary` and `check`, and as `verdict` in their JSON.

use super::oom::Verdict as OomKind;

/// One answer.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct FitVerdict {
    pub fits: bool,
    /// The card's memory (the workload's capacity or `--capacity`).
    pub capacity: u64,
    /// What the caching allocator may hold: the card less the CUDA context (or the memory
    /// fraction's limit).
    pub usable: u64,
    /// The peak reserved of the run as it went (up to the out-of-memory, when it ran out).
    pub peak_reserved: u64,
    /// When it fits: what nvidia-smi would show at the peak (reserved plus the context).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nvidia_smi: Option<u64>,
    /// When it fits: the card less `nvidia_smi`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub headroom: Option<u64>,
    /// When it does not fit: the peak reserved on an unbounded device, if it was re-run so.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub needs_reserved: Option<u64>,
    /// `needs_reserved` less `usable`, when more and the cause is capacity: an out-of-memory
    /// from fragmentation fits under another allocator setting, and an unbounded device never
    /// frees the segments it strands, so its peak is no shortfall.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub short_by: Option<u64>,
    /// Capacity or fragmentation, when it ran out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cause: Option<OomKind>,
    /// Where it first ran out: "model.layers.17.mlp.up_proj/linear, iteration 0".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oom_at: Option<String>,
    /// The smallest remedy that fits, if remedies were tried.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub smallest_fix: Option<String>,
    /// The line itself.
    pub line: String,
}

/// What a verdict is made of.
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    pub capacity: u64,
    pub usable: u64,
    pub peak_reserved: u64,
    /// The CUDA context and libraries outside the allocator (nvidia-smi less reserved).
    pub context: u64,
    /// Whether it ran out.
    pub oom: bool,
    pub needs_reserved: Option<u64>,
    /// What the model alone holds before its first step, when the run ran out building it
    /// and that alone is more than `usable`: no change to the loop can make it fit.
    pub model_alone: Option<u64>,
    pub cause: Option<OomKind>,
    pub oom_at: Option<String>,
    pub smallest_fix: Option<String>,
    /// Whether remedies were tried (`smallest_fix` of `None` then means none fits).
    pub remedies_tried: bool,
    /// A distributed run's world size when above 1: `context` holds NCCL's buffers as
    /// measured at world size 1, and more ranks take more, so nvidia-smi's figure is a floor.
    pub world_above_one: Option<u64>,
}

/// The verdict of `i`.
pub fn verdict(i: &Inputs) -> FitVerdict {
    use crate::units::format_bytes as b;
    let cap = b(i.capacity);
    if !i.oom {
        let smi = i.peak_reserved.saturating_add(i.context);
        let headroom = i.capacity.saturating_sub(smi);
        return FitVerdict {
            fits: true,
            capacity: i.capacity,
            usable: i.usable,
            peak_reserved: i.peak_reserved,
            nvidia_smi: Some(smi),
            headroom: Some(headroom),
            needs_reserved: None,
            short_by: None,
            cause: None,
            oom_at: None,
            smallest_fix: None,
            line: format!(
                "fits on {cap}: peak reserved {}, headroom {} (nvidia-smi about {}{})",
                b(i.peak_reserved),
                b(headroom),
                b(smi),
                match i.world_above_one {
                    Some(n) =>
                        format!("; NCCL's share as measured at world size 1, more with {n} ranks"),
                    None => String::new(),
                }
            ),
        };
    }
    let short_by = i
        .needs_reserved
        .filter(|n| *n > i.usable && i.cause != Some(OomKind::Fragmentation))
        .map(|n| n - i.usable);
    let mut line = match (i.cause, i.needs_reserved) {
        (Some(OomKind::Fragmentation), _) => format!(
            "does not fit on {cap} as the allocator is set: out of memory from fragmentation"
        ),
        (_, Some(n)) => format!(
            "does not fit on {cap}: {}needs {} reserved{}",
            match i.model_alone {
                Some(m) => format!(
                    "the model alone holds {} before its first step, more than the {} usable; \
                     the run ",
                    b(m),
                    b(i.usable)
                ),
                None => String::new(),
            },
            b(n),
            match short_by {
                Some(s) if i.model_alone.is_none() => {
                    format!(" ({} short of the {} usable)", b(s), b(i.usable))
                }
                Some(s) => format!(" ({} short)", b(s)),
                None => String::new(),
            }
        ),
        _ => format!("does not fit on {cap}: out of memory"),
    };
    if let Some(at) = &i.oom_at {
        line.push_str(&format!("; first OOM at {at}"));
    }
    match (&i.smallest_fix, i.cause) {
        (Some(f), _) => line.push_str(&format!("; smallest fix that fits: {f}")),
        (None, Some(OomKind::Fragmentation)) => {}
        (None, _) if i.remedies_tried => line.push_str("; no single remedy fits"),
        _ => {}
    }
    FitVerdict {
        fits: false,
        capacity: i.capacity,
        usable: i.usable,
        peak_reserved: i.peak_reserved,
        nvidia_smi: None,
        headroom: None,
        needs_reserved: i.needs_reserved,
        short_by,
        cause: i.cause,
        oom_at: i.oom_at.clone(),
        smallest_fix: i.smallest_fix.clone(),
        line,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn a_run_that_fits_says_its_headroom_against_the_card() {
        let v = verdict(&Inputs {
            capacity: 24 * GIB,
            usable: 24 * GIB - (518 << 20),
            peak_reserved: 20 * GIB,
            context: 518 << 20,
            ..Inputs::default()
        });
        assert!(v.fits);
        assert_eq!(v.headroom, Some(4 * GIB - (518 << 20)));
        assert!(
            v.line
                .starts_with("fits on 24.00 GiB: peak reserved 20.00 GiB"),
            "{}",
            v.line
        );
        assert!(!v.line.contains("NCCL"), "{}", v.line);
        // above one rank, NCCL's measured share is a floor, and the line says so
        let v = verdict(&Inputs {
            capacity: 24 * GIB,
            peak_reserved: 20 * GIB,
            context: 518 << 20,
            world_above_one: Some(8),
            ..Inputs::default()
        });
        assert!(v.line.ends_with("more with 8 ranks)"), "{}", v.line);
    }

    #[test]
    fn a_capacity_oom_says_how_much_is_missing_and_where() {
        let v = verdict(&Inputs {
            capacity: 24 * GIB,
            usable: 23 * GIB,
            peak_reserved: 23 * GIB,
            oom: true,
            needs_reserved: Some(27 * GIB),
            model_alone: None,
            cause: Some(OomKind::Capacity),
            oom_at: Some("lm_head/linear, iteration 0".into()),
            smallest_fix: Some("gradient checkpointing".into()),
            remedies_tried: true,
            ..Inputs::default()
        });
        assert!(!v.fits);
        assert_eq!(v.short_by, Some(4 * GIB));
        assert!(
            v.line
                .starts_with("does not fit on 24.00 GiB: needs 27.00 GiB reserved (4.00 GiB short"),
            "{}",
            v.line
        );
        assert!(v.line.contains("first OOM at lm_head/linear"), "{}", v.line);
        assert!(
            v.line
                .ends_with("smallest fix that fits: gradient checkpointing"),
            "{}",
            v.line
        );
    }

    #[test]
    fn fragmentation_is_named_with_no_shortfall() {
        let v = verdict(&Inputs {
            capacity: 2 * GIB,
            usable: 2 * GIB,
            peak_reserved: 2 * GIB,
            oom: true,
            // the unbounded run strands segments the bounded one would have freed
            needs_reserved: Some(17 * GIB),
            model_alone: None,
            cause: Some(OomKind::Fragmentation),
            smallest_fix: Some("expandable_segments:True".into()),
            ..Inputs::default()
        });
        assert_eq!(v.short_by, None);
        assert!(v.line.contains("fragmentation"), "{}", v.line);
    }
}
