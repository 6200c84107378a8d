//! The decoder families' RMSNorms as transformers writes them: `LlamaRMSNorm` (Qwen's,
//! Mistral's and Phi-3's are the same) and `GemmaRMSNorm`, in float32 and with bf16 weights.

use std::fmt::Write as _;

use super::{LlamaConfig, Run};

/// `LlamaRMSNorm` from `x` into `out` (the input stays held by the caller). With bf16 weights
/// it normalizes a float32 copy and casts the result back before the weight's product.
#[allow(clippy::too_many_arguments)]
pub(super) fn rms_norm(
    s: &mut String,
    c: &LlamaConfig,
    r: &Run,
    path: &str,
    w: &str,
    x: &str,
    out: &str,
    ind: &str,
) {
    let stmts = if c.gemma {
        gemma_norm(r, w, x, out)
    } else if r.bf16_weights {
        vec![
            format!("h32 = {x}.float()"),
            "variance = h32.pow(2).mean(-1, keepdim=true)".to_string(),
            "n0 = variance + 0.000001".to_string(),
            "n1 = n0.rsqrt()".to_string(),
            "del n0".to_string(),
            // `hidden_states` rebound: the float32 copy goes unless autograd keeps it
            "n2 = h32 * n1".to_string(),
            "del n1, h32".to_string(),
            "n3 = n2.bfloat16()".to_string(),
            format!("{out} = {w} * n3"),
            "del n3".to_string(),
            "del n2, variance".to_string(),
        ]
    } else {
        vec![
            format!("variance = {x}.pow(2).mean(-1, keepdim=true)"),
            "n0 = variance + 0.000001".to_string(),
            "n1 = n0.rsqrt()".to_string(),
            "del n0".to_string(),
            format!("n2 = {x} * n1"),
            "del n1".to_string(),
            format!("{out} = {w} * n2"),
            "del n2, variance".to_string(),
        ]
    };
    let _ = writeln!(s, "{ind}scope \"{path}\" {{");
    for st in stmts {
        let _ = writeln!(s, "{ind}  {st}");
    }
    let _ = writeln!(s, "{ind}}}");
}

/// `GemmaRMSNorm`: `_norm(x.float())` as one expression (its temporaries go at once), then
/// `output * (1.0 + self.weight.float())` and `.type_as(x)`.
fn gemma_norm(r: &Run, w: &str, x: &str, out: &str) -> Vec<String> {
    let mut v = Vec::new();
    let xf = if r.bf16_weights {
        v.push(format!("h32 = {x}.float()"));
        "h32"
    } else {
        x
    };
    v.extend([
        format!("gp0 = {xf}.pow(2)"),
        "gv0 = gp0.mean(-1, keepdim=true)".to_string(),
        "del gp0".to_string(),
        "n0 = gv0 + 0.000001".to_string(),
        "del gv0".to_string(),
        "n1 = n0.rsqrt()".to_string(),
        "del n0".to_string(),
        format!("n2 = {xf} * n1"),
        "del n1".to_string(),
    ]);
    if r.bf16_weights {
        v.extend([
            "del h32".to_string(),
            format!("wf = {w}.float()"),
            "w1 = wf + 1.0".to_string(),
            "del wf".to_string(),
            "n3 = n2 * w1".to_string(),
            // (the weight's temporary goes as the product returns, before `output` is rebound)
            "del w1, n2".to_string(),
            format!("{out} = n3.bfloat16()"),
            "del n3".to_string(),
        ]);
    } else {
        v.extend([
            format!("w1 = {w} + 1.0"),
            format!("{out} = n2 * w1"),
            "del w1, n2".to_string(),
        ]);
    }
    v
}
