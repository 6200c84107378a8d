//! Upper bounds on the counts that size a workload's generated script or the records kept
//! per step, and on a model's widths. Run sizes (batch, seq) need none: their products are
//! checked arithmetic and a tensor past the device ends in PyTorch's out-of-memory. Counts
//! are different: a typo of a few extra digits in `iterations`, `layers` or `grad_accum` would
//! otherwise mean minutes of work and gigabytes of script or per-iteration rows before
//! anything is reported. A config's widths (`hidden_size`, `intermediate_size`,
//! `vocab_size`) far past any published model's are a mistake to name, not a model to run
//! out of memory with: their bounds are 64 to 80 times the largest published.

/// A count key, its largest accepted value, and why the bound is harmless.
pub struct Limit {
    pub key: &'static str,
    pub max: u64,
    pub why: &'static str,
}

/// Every bounded count, by the key that sets it (in `[train]`, `[model]`, `[workload]` or a
/// Hugging Face config).
pub const LIMITS: &[Limit] = &[
    Limit {
        key: "iterations",
        max: 10_000,
        why: "gpumem keeps a row per iteration; a leak shows within a few",
    },
    Limit {
        key: "grad_accum",
        max: 1_024,
        why: "the script holds each micro-batch",
    },
    Limit {
        key: "new_tokens",
        max: 1_000_000,
        why: "each token is a step of the generation loop",
    },
    Limit {
        key: "layers",
        max: 1_000,
        why: "the script and its records hold each layer; the largest published models have under 200",
    },
    Limit {
        key: "num_hidden_layers",
        max: 1_000,
        why: "the script and its records hold each layer; the largest published models have under 200",
    },
    Limit {
        key: "n_layer",
        max: 1_000,
        why: "the script and its records hold each layer; the largest published models have under 200",
    },
    Limit {
        key: "hidden_size",
        max: 1 << 20,
        why: "the widest published models use 16,384",
    },
    Limit {
        key: "n_embd",
        max: 1 << 20,
        why: "the widest published models use 16,384",
    },
    Limit {
        key: "intermediate_size",
        max: 1 << 22,
        why: "the widest published feed-forward layers have 53,248",
    },
    Limit {
        key: "n_inner",
        max: 1 << 22,
        why: "the widest published feed-forward layers have 53,248",
    },
    Limit {
        key: "vocab_size",
        max: 1 << 24,
        why: "the largest published vocabularies have 262,144 tokens",
    },
];

/// `None` when `value` is within `key`'s bound (or `key` has none), else the reason to put
/// after "'KEY' must be at most ...".
pub fn exceeded(key: &str, value: u64) -> Option<String> {
    let l = LIMITS.iter().find(|l| l.key == key)?;
    (value > l.max).then(|| {
        format!(
            "{} ({}), found {value}",
            crate::units::group_digits(l.max),
            l.why
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_say_the_limit_and_the_value() {
        assert_eq!(exceeded("iterations", 10_000), None);
        assert_eq!(exceeded("batch", u64::MAX), None);
        let m = exceeded("iterations", 4_294_967_295).unwrap();
        assert!(m.starts_with("10,000 ("), "{m}");
        assert!(m.ends_with("found 4294967295"), "{m}");
        assert!(exceeded("grad_accum", 1_025).is_some());
    }
}
