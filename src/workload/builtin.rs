//! Workloads built into the binary, so that the examples of `--help` run wherever gpumem is
//! installed: `gpumem run --preset gpt2-small`, or `preset:gpt2-small` wherever a workload
//! file is taken. Each is one of the repository's fixtures, word for word.

/// (name, what it is, the workload's TOML).
pub const PRESETS: &[(&str, &str, &str)] = &[
    (
        "gpt2-small",
        "GPT-2 small (124M) trained with AdamW, batch 8 x 1024 tokens (PyTorch's figures to the byte)",
        include_str!("../../fixtures/workloads/presets/gpt2_small_sdpa_adamw.toml"),
    ),
    (
        "mlp-adam",
        "an MLP trained with Adam",
        include_str!("../../fixtures/workloads/presets/mlp_adam.toml"),
    ),
    (
        "mlp-leak",
        "an MLP whose loop keeps every loss with its graph: a leak",
        include_str!("../../fixtures/workloads/presets/mlp_leak.toml"),
    ),
    (
        "fragmentation-oom",
        "an out-of-memory from fragmentation that expandable segments fix",
        include_str!("../../fixtures/workloads/fragmentation_oom.toml"),
    ),
    (
        "capacity-oom",
        "an out-of-memory from capacity: Adam's state does not fit a 2 GiB card",
        include_str!("../../fixtures/workloads/capacity_oom.toml"),
    ),
];

/// The prefix that names a built-in workload where a path is expected.
pub const PREFIX: &str = "preset:";

/// The built-in workload `path` names (`preset:NAME`), if it names one: `Ok(None)` for an
/// ordinary path, an error listing the names for an unknown one.
pub fn lookup(path: &std::path::Path) -> Result<Option<&'static str>, String> {
    let Some(name) = path.to_str().and_then(|p| p.strip_prefix(PREFIX)) else {
        return Ok(None);
    };
    match PRESETS.iter().find(|(n, _, _)| *n == name) {
        Some((_, _, text)) => Ok(Some(text)),
        None => Err(format!(
            "no built-in workload '{name}' (built in: {})",
            names().join(", ")
        )),
    }
}

/// The built-in names.
pub fn names() -> Vec<&'static str> {
    PRESETS.iter().map(|(n, _, _)| *n).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_builtin_parses_and_an_unknown_name_lists_them() {
        for (name, _, text) in super::PRESETS {
            let p = std::path::PathBuf::from(format!("preset:{name}"));
            crate::workload::parse(text, &p).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(super::lookup(&p), Ok(Some(*text)));
        }
        let e = super::lookup(std::path::Path::new("preset:nope")).unwrap_err();
        assert!(e.contains("gpt2-small"), "{e}");
    }
}
