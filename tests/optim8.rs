//! Issue 42: bitsandbytes' 8-bit AdamW against PyTorch 2.11 on an H200 (fixtures/opt8: two
//! recorded models, their figures and allocator traces).

mod common;

use gpumem::commands::compare_torch::FIELDS;

const CASES: &[&str] = &[
    "llama_s_b4_s1024_adamw8bit_fp32",
    "smollm2_135m_b4_s1024_adamw8bit_fp32",
];

#[test]
fn adamw8bit_matches_pytorch_in_every_field() {
    for name in CASES {
        let (diffs, alloc, reserved) =
            common::case_differences("fixtures/opt8", name, name, &FIELDS);
        assert!(
            diffs.is_empty(),
            "{name}: {diffs:?} (allocated {alloc}, reserved {reserved})"
        );
    }
}

#[test]
fn adamw8bit_allocates_and_frees_as_bitsandbytes_does() {
    for name in CASES {
        let p = common::root().join(format!("fixtures/opt8/traces/events_{name}.json"));
        let t: Vec<(String, i64)> =
            serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
        let g = common::allocator_events(&format!("fixtures/opt8/workloads/{name}.toml"));
        let first = g.iter().zip(&t).position(|(a, b)| a != b);
        assert_eq!(first, None, "{name}: first difference at event {first:?}");
        assert_eq!(g.len(), t.len(), "{name}: event count");
    }
}

/// The llama_s case's workload.
const LLAMA_S: &str = "fixtures/opt8/workloads/llama_s_b4_s1024_adamw8bit_fp32.toml";

/// The llama_s case run as written, and with `optimizer` in its place (a workload in a
/// scratch directory naming the case's config by its full path).
fn llama_s_with(optimizer: &str) -> (serde_json::Value, serde_json::Value) {
    let (code, as_written) = common::run_json(&["run", LLAMA_S]);
    assert_eq!(code, Some(0), "{}", as_written["verdict"]);
    let text = std::fs::read_to_string(common::root().join(LLAMA_S)).unwrap();
    let config =
        common::root().join("fixtures/opt8/cases/llama_s_b4_s1024_adamw8bit_fp32.config.json");
    let other = text
        .replace("\"adamw8bit\"", &format!("\"{optimizer}\""))
        .replace(
            "../cases/llama_s_b4_s1024_adamw8bit_fp32.config.json",
            config.to_str().unwrap(),
        );
    let s = common::Scratch::new(&format!("optim8-{optimizer}"));
    let other = s.write("workload.toml", &other);
    let (code, v) = common::run_json(&["run", other.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{optimizer}: {}", v["verdict"]);
    (as_written, v)
}

/// Iteration 1's start: the parameters and the optimizer's state.
fn state(g: &serde_json::Value) -> u64 {
    common::u(&g["iterations"][1]["start"])
}

/// The 8-bit state is a quarter of Adam's for large parameters: the same model with AdamW
/// holds 2 x 4 bytes per element after the step, AdamW8bit 2 bytes plus the block maxima.
#[test]
fn eight_bit_state_is_smaller_than_adams_and_refused_on_a_computing_device() {
    let (g8, g32) = llama_s_with("adamw");
    // parameters are 622,923,776 bytes: Adam's state twice that, the 8-bit one about a half
    let (s8, s32) = (state(&g8), state(&g32));
    assert!(s32 > s8 + 900_000_000, "8-bit {s8}, 32-bit {s32}");
    let out = common::at_root(&["run", LLAMA_S, "--device", "cpu", "--iterations", "1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("adamw8bit") && err.contains("--device sim"),
        "{err}"
    );
}

/// `PagedAdamW8bit` keeps the 8-bit states of parameters of 100,000 elements or more in
/// unified memory (`cudaMallocManaged`), outside the caching allocator: reported apart, and
/// gone from allocated memory.
#[test]
fn paged_adamw8bit_moves_the_large_states_to_unified_memory() {
    let (g8, gp) = llama_s_with("paged_adamw8bit");
    // llama_s: 155,730,944 elements, 17 norms of 1,024 below the threshold: uint8 states of
    // the rest, two each
    let unified = common::u(&gp["unified_memory_peak"]);
    assert_eq!(unified, 2 * (155_730_944 - 17 * 1024));
    assert_eq!(common::u(&g8["unified_memory_peak"]), 0);
    assert!(
        state(&g8) >= state(&gp) + unified,
        "{} {}",
        state(&g8),
        state(&gp)
    );
}

/// Every optimizer a workload may name is one the engine steps, and names itself back.
#[test]
fn every_optimizer_name_is_a_kind() {
    use gpumem::engine::op::OptimKind;
    for &n in gpumem::workload::OPTIMIZER_NAMES {
        if n == "none" {
            assert_eq!(OptimKind::parse(n), None);
            continue;
        }
        let k = OptimKind::parse(n).unwrap_or_else(|| panic!("{n} is no kind"));
        assert_eq!(k.name(), n);
    }
}
