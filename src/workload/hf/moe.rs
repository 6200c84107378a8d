//! A sparse mixture-of-experts block (Mixtral's, Qwen3-MoE's) as line-language statements:
//! the router and transformers 5.17's default `grouped_mm` experts, op for op as the H200
//! traces of fixtures/hf2 show them.

use std::fmt::Write as _;

use super::LlamaConfig;
use crate::workload::preset::at;

/// A sparse MoE block of layer `l` over the normed `x` of `rows` tokens, into `d0`: the router
/// (`linear`, `softmax`, `topk`, Mixtral's `/= sum`), then transformers 5.17's
/// `grouped_mm_experts_forward`: the (token, expert) pairs sorted by expert, the tokens
/// gathered in that order, the per-expert counts (`histc` of their int32 ids) and offsets
/// (`cumsum`), the sentinel mask (ids past the last expert, for expert parallelism) filled
/// in, the fused gate/up product, `silu(gate) * up`, the down product, each masked, the
/// routing weights, the pairs put back in token order and summed over the top k. Locals die
/// at each function's return, in the order Python named them.
pub(super) fn sparse_moe(
    s: &mut String,
    c: &LlamaConfig,
    moe: &super::config::Moe,
    (b, t): (u64, u64),
    l: u64,
    (bf16, decode): (bool, bool),
    ind: &str,
) {
    let rows = b * t;
    let m = |x: &str| format!("model.layers.{l}.{x}");
    let p = |x: &str| format!("l{l}_{x}");
    let line = |s: &mut String, stmt: &str| {
        let _ = writeln!(s, "{ind}{stmt}");
    };
    let (h, e, k) = (c.hidden, moe.experts, moe.top_k);
    let pairs = rows * k;
    let router = m("mlp.gate");
    let ex = m("mlp.experts");
    at(s, ind, &m("mlp"), &format!("xf = x.view(-1, {h})"));
    at(
        s,
        ind,
        &router,
        &format!("rl = linear(xf, {})", p("router_w")),
    );
    // (`softmax(router_logits.float())`: a copy in float32 from bf16, gone once used)
    at(s, ind, &router, "rp = rl.float().softmax(-1)");
    at(s, ind, &router, &format!("tv, ti = topk(rp, {k}, -1)"));
    if moe.norm_topk {
        at(s, ind, &router, "ts = tv.sum(-1, keepdim=true)");
        at(s, ind, &router, "tv.div_(ts)");
        line(s, "del ts");
    }
    if bf16 && moe.weights_in_logits_dtype {
        // (the float32 weights go as the name is taken: autograd keeps nothing of them)
        at(s, ind, &router, "tv = tv.to(dtype=bf16)");
    }
    line(s, "del rp");
    if moe.aux_loss {
        // (`OutputRecorder` keeps the gate's logits for the auxiliary loss)
        line(s, &format!("rlog{l} = rl"));
    }
    if decode {
        batched_experts(s, (&p, &ex), (rows, h, e, k), bf16, ind);
        at(s, ind, &m("mlp"), &format!("d0 = fo.view({b}, {t}, {h})"));
        line(s, "del fo, xf, rl, tv, ti, x");
        return;
    }
    at(s, ind, &ex, "sw = tv.reshape(-1)");
    at(s, ind, &ex, "ei = ti.reshape(-1)");
    at(s, ind, &ex, "eg, perm = sort(ei)");
    at(s, ind, &ex, &format!("pk = floor_divide(perm, {k})"));
    at(s, ind, &ex, "hs = index(xf, pk)");
    line(s, "del pk");
    at(s, ind, &ex, "swg = index(sw, perm)");
    at(s, ind, &ex, "hi = eg.to(dtype=int32)");
    at(s, ind, &ex, &format!("cnt = histc(hi, {e}, 0, {})", e - 1));
    at(s, ind, &ex, "offs = cumsum(cnt, 0, dtype=int32)");
    at(s, ind, &ex, &format!("sm = ge(eg, {e}).unsqueeze(-1)"));
    // (`expert_ids_g.clamp_(max=E - 1)`: in place on an integer tensor, nothing allocated)
    at(s, ind, &ex, "hs.masked_fill_(sm, 0.0)");
    // `_grouped_linear` of `x` by a parameter's `transpose(-2, -1)`, masked out of place
    // (5.17 reuses one name along the chain: without autograd's references, the gate/up
    // output goes once gated, the gated rows once the down product has them)
    let grouped = |s: &mut String, w: &str, x: &str, y: &str, drop_input: bool| {
        at(s, ind, &ex, &format!("wt = {}.transpose(-2, -1)", p(w)));
        at(s, ind, &ex, &format!("g0 = grouped_mm({x}, wt, offs)"));
        line(s, "del wt");
        if drop_input {
            line(s, &format!("del {x}"));
        }
        at(s, ind, &ex, &format!("{y} = g0.masked_fill(sm, 0.0)"));
        line(s, "del g0");
    };
    grouped(s, "gu_w", "hs", "gu", false);
    at(s, ind, &ex, "ga, up = gu.chunk(2, dim=-1)");
    at(s, ind, &m("mlp.experts.act_fn"), "gs = ga.silu()");
    at(s, ind, &ex, "gp = gs * up");
    line(s, "del gs, ga, up, gu");
    grouped(s, "dn_w", "gp", "dm", true);
    at(s, ind, &ex, "wo = dm * swg.unsqueeze(-1)");
    at(s, ind, &ex, &format!("inv = empty({pairs}, dtype=int64)"));
    at(s, ind, &ex, &format!("ar = arange({pairs})"));
    at(s, ind, &ex, "inv.index_put_(perm, ar)");
    line(s, "del ar");
    at(s, ind, &ex, "wi = index(wo, inv)");
    line(s, "del wo");
    at(
        s,
        ind,
        &ex,
        &format!("fo = wi.view({rows}, {k}, {h}).sum(dim=1)"),
    );
    // Mixtral's routing weights are float32: in bf16 so are its weighted rows and their sum, cast
    // back to the hidden states' dtype on return (`.to(hidden_states.dtype)`), the float32
    // sum going with the function's other locals
    let out = if bf16 {
        at(s, ind, &ex, "fb = fo.to(dtype=bf16)");
        line(
            s,
            "del sw, ei, eg, perm, hs, swg, hi, cnt, offs, sm, dm, wi, inv, fo",
        );
        "fb"
    } else {
        line(
            s,
            "del sw, ei, eg, perm, hs, swg, hi, cnt, offs, sm, dm, wi, inv",
        );
        "fo"
    };
    at(
        s,
        ind,
        &m("mlp"),
        &format!("d0 = {out}.view({b}, {t}, {h})"),
    );
    line(s, &format!("del {out}, xf, rl, tv, ti, x"));
}

/// transformers 5.17's `batched_mm_experts_forward`, which generation switches the
/// `grouped_mm` experts to for its decode steps on a GPU: each (token, expert) pair's row
/// copied out, the pairs' expert ids clamped (`eid`) (for expert parallelism's sentinels), each pair's
/// expert weights gathered (`gate_up_proj[ids]`: the whole matrices, per pair) and applied by
/// `bmm`, the gathered gate/up weights going once the down ones are taken, the routing weights
/// (float32) applied and the pairs summed per token, cast back in bf16. Leaves `fo`.
fn batched_experts(
    s: &mut String,
    (p, ex): (&dyn Fn(&str) -> String, &str),
    (rows, h, e, k): (u64, u64, u64, u64),
    bf16: bool,
    ind: &str,
) {
    let line = |s: &mut String, stmt: &str| {
        let _ = writeln!(s, "{ind}{stmt}");
    };
    let pairs = rows * k;
    at(
        s,
        ind,
        ex,
        &format!("hs = xf.unsqueeze(1).expand({rows}, {k}, {h}).reshape({pairs}, {h})"),
    );
    at(s, ind, ex, "sw = tv.reshape(-1)");
    at(
        s,
        ind,
        ex,
        &format!("eid = ti.reshape(-1).clamp(0, {})", e - 1),
    );
    at(s, ind, ex, &format!("wg = index({}, eid)", p("gu_w")));
    at(s, ind, ex, "gu = matmul(wg, hs.unsqueeze(-1)).squeeze(-1)");
    at(s, ind, ex, "ga, up = gu.chunk(2, dim=-1)");
    at(s, ind, &format!("{ex}.act_fn"), "gs = ga.silu()");
    at(s, ind, ex, "gp = gs * up");
    line(s, "del gs, ga, up, gu");
    at(s, ind, ex, &format!("wd = index({}, eid)", p("dn_w")));
    line(s, "del wg");
    at(s, ind, ex, "dm = matmul(wd, gp.unsqueeze(-1)).squeeze(-1)");
    line(s, "del gp");
    at(s, ind, ex, "wo = dm * sw.unsqueeze(-1)");
    at(
        s,
        ind,
        ex,
        &format!("fs = wo.view({rows}, {k}, {h}).sum(dim=1)"),
    );
    if bf16 {
        at(s, ind, ex, "fo = fs.to(dtype=bf16)");
    } else {
        line(s, "fo = fs");
    }
    line(s, "del hs, sw, eid, wd, dm, wo, fs");
}

/// transformers 5.17's `load_balancing_loss_func` for Mixtral over the kept router logits of
/// the sparse layers (`rlog{l}`), added to `loss` in place with `router_aux_loss_coef`, as
/// the H200 trace shows it: per layer the softmax, its top k, `bincount` of the chosen experts
/// (its minimum and maximum read back) as float added to a running count, the softmax summed
/// over the tokens added to a running sum; then both normalised, their product summed, times
/// the number of experts. The function's locals go at its return, declared ones first.
pub(super) fn aux_loss(
    s: &mut String,
    moe: &super::config::Moe,
    tokens: u64,
    coef: f64,
    ind: &str,
) {
    let (e, k) = (moe.experts, moe.top_k);
    let st = |s: &mut String, stmt: &str| at(s, ind, "load_balancing_loss_func", stmt);
    st(s, &format!("tpe = zeros({e})"));
    st(s, &format!("rps = zeros({e})"));
    let layers: Vec<usize> = (0..moe.sparse.len()).filter(|&l| moe.sparse[l]).collect();
    for (n, &l) in layers.iter().enumerate() {
        st(s, &format!("rw{n} = rlog{l}.softmax(-1)"));
        st(s, &format!("tv{n}, sel{n} = topk(rw{n}, {k}, -1)"));
        if n > 0 {
            let _ = writeln!(s, "{ind}del tv{}, sel{}, rw{}", n - 1, n - 1, n - 1);
        }
        st(s, &format!("bc = bincount(sel{n}.view(-1), {e})"));
        st(s, "bf = bc.float()");
        let _ = writeln!(s, "{ind}del bc");
        st(s, "t2 = tpe + bf");
        let _ = writeln!(s, "{ind}del bf");
        let _ = writeln!(s, "{ind}tpe = t2");
        let _ = writeln!(s, "{ind}del t2");
        st(s, &format!("rs = rw{n}.sum(0)"));
        st(s, "r2 = rps + rs");
        let _ = writeln!(s, "{ind}del rs");
        let _ = writeln!(s, "{ind}rps = r2");
        let _ = writeln!(s, "{ind}del r2");
    }
    let last = layers.len().saturating_sub(1);
    st(s, &format!("tpn = tpe / {}", tokens * k));
    st(s, &format!("rpp = rps / {tokens}"));
    st(s, "pr = tpn * rpp.unsqueeze(0)");
    st(s, "ol = pr.sum()");
    let _ = writeln!(s, "{ind}del pr");
    st(s, &format!("aux = ol * {e}"));
    let _ = writeln!(
        s,
        "{ind}del tpe, rps, rw{last}, tv{last}, sel{last}, tpn, rpp, ol"
    );
    // (the output keeps `aux` and the router logits until it goes)
    at(s, ind, "loss_function", &format!("ax = aux * {coef}"));
    at(s, ind, "loss_function", "loss.add_(ax)");
    let _ = writeln!(s, "{ind}del ax");
}
