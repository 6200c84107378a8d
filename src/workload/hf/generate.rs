//! `mode = "generate"`: hf_models.py's `model.generate(x, attention_mask=torch.ones_like(x),
//! max_new_tokens=N, min_new_tokens=M, do_sample=False, pad_token_id=P)` under `no_grad`, as
//! transformers 5.17 runs greedy search with the default `DynamicCache`, op for op as the H200
//! traces show it:
//!
//! - `_prepare_special_tokens`: the bos, eos and pad ids as int64 tensors (eos made 1-D; without
//!   a pad id, pad is a view of eos), and two checks of them (`isin(eos, pad).any()`,
//!   `(eos < 0).any()`); with a batch, whether any row ends in padding.
//! - The position ids from the mask (`cumsum(-1) - 1`, `masked_fill(mask == 0, 1)`) and the
//!   unfinished-rows flags (`ones(B)`).
//! - Each step: the model inputs (the prompt cloned for the prefill; the last token and its
//!   position, each cloned, for a decode step), the forward (`create_causal_mask` with the 2-D
//!   mask: a bool copy, then `sum() == numel`, so no 4-D mask is made; the rotary pair for
//!   the batch's positions; each layer's cache `torch.cat` onto empty buffers, then grown by
//!   one position per step, the old one freed; `lm_head` on the last position only), then
//!   `_update_model_kwargs_for_generation` (the next position and the mask, each `cat` one
//!   column wider), the last logits copied to float32, the minimum-length processors
//!   (`arange(vocab)`, `isin` of the eos ids, a clone, `where(.., -inf, ..)`), `argmax`, the
//!   finished rows padded, the token appended (`cat`), and the stopping criteria (max length,
//!   eos) folded into the unfinished flags.
//!
//! Every `new_tokens` is generated (gpumem has no data to stop at an eos token): `min_new_tokens`
//! defaults to `new_tokens`, as hf_models.py passes it.
//!
//! Python's references are kept as it keeps them: a variable rebound frees its old tensor
//! after the new one exists, unless another name (the caller's prompt and mask, generate's own
//! position ids, the model inputs' mask) still holds it.

use std::fmt::Write as _;

use super::config_gpt2_bert::Gpt2Config;
use super::llama::{decoder, rope_kinds, rotary_named, Cache, Call};
use super::masks::WindowPhase;
use super::{LlamaConfig, Run};
use crate::workload::preset::at;

/// `[generate]`: what `model.generate` is asked.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Generate {
    pub new_tokens: u64,
    /// `min_new_tokens` (the minimum-length processors run while fewer are generated).
    pub min_new_tokens: u64,
    /// `pad_token_id` passed to `generate` (else the config's, else eos's first).
    pub pad: Option<u64>,
}

/// The tag of generate's own ops.
const GEN: &str = "generate";

/// The model `generate` drives: a decoder family of [`super::llama`] or GPT-2.
#[derive(Clone, Copy)]
pub(super) enum Model<'a> {
    Llama(&'a LlamaConfig),
    Gpt2(&'a Gpt2Config),
}

impl Model<'_> {
    fn tokens(&self) -> &super::config::Tokens {
        match self {
            Model::Llama(c) => &c.tokens,
            Model::Gpt2(c) => &c.tokens,
        }
    }

    fn vocab(&self) -> u64 {
        match self {
            Model::Llama(c) => c.vocab,
            Model::Gpt2(c) => c.vocab,
        }
    }

    /// The cache's tensors of layer `l`, as the layer object drops them.
    fn cache_of(&self, l: u64) -> Vec<String> {
        let mut v = vec![format!("kc{l}"), format!("vc{l}")];
        if let Model::Llama(c) = self {
            if super::llama::sliding_layer(c, l) {
                // DynamicSlidingWindowLayer's int64 length
                v.push(format!("cl{l}"));
            }
        }
        v
    }

    fn layers(&self) -> u64 {
        match self {
            Model::Llama(c) => c.layers,
            Model::Gpt2(c) => c.layers,
        }
    }

    /// Where step `k` stands against a sliding window (within it for GPT-2).
    fn window_phase(&self, r: &Run, k: u64) -> WindowPhase {
        match self {
            Model::Llama(c) => window_phase(c, r, k),
            Model::Gpt2(_) => WindowPhase::Within,
        }
    }
}

/// The iteration's body: the prompt, its mask, and the `generate` call.
pub(super) fn body(c: Model, r: &Run, g: &Generate) -> String {
    let mut s = String::new();
    let (b, t) = (r.batch, r.seq);
    let _ = writeln!(
        s,
        "input_ids = zeros({b}, {t}, dtype=int64, from=\"data:input_ids\")"
    );
    // `attention_mask=torch.ones_like(x)`: a temporary of the caller's, freed once generate
    // returns
    let _ = writeln!(s, "gen_mask = ones({b}, {t}, dtype=int64)");
    let _ = writeln!(s, "phase \"generate\" {{");
    let _ = writeln!(s, "  no_grad {{");
    let ind = "    ";
    let tokens = Tokens::of(c, g);
    prologue(&mut s, r, &tokens, ind);
    let n = g.new_tokens;
    // step k generates token k + 1; the processors force no eos while k < min_new_tokens
    let active = |k: u64| k < g.min_new_tokens;
    step(&mut s, c, r, g, &tokens, Step::Prefill, ind, None);
    if n >= 2 {
        step(&mut s, c, r, g, &tokens, Step::FirstDecode, ind, None);
    }
    // the later steps, in runs of the same shape (processors forcing, then not; within the
    // sliding window, reaching it, past it)
    let phase = |k: u64| c.window_phase(r, k);
    let mut k = 2;
    while k < n {
        let a = (active(k), phase(k));
        let mut end = k;
        while end < n && (active(end), phase(end)) == a {
            end += 1;
        }
        let _ = writeln!(s, "{ind}for step in range({}) {{", end - k);
        step(
            &mut s,
            c,
            r,
            g,
            &tokens,
            Step::Decode(k),
            &format!("{ind}  "),
            (end == n).then_some(n),
        );
        let _ = writeln!(s, "{ind}}}");
        k = end;
    }
    epilogue(&mut s, c, &tokens, n, ind);
    let _ = writeln!(s, "{ind}del gen_mask");
    let _ = writeln!(s, "  }}");
    let _ = writeln!(s, "}}");
    // `del out, x`
    let _ = writeln!(s, "del ids, input_ids");
    s
}

/// The special tokens as generate holds them.
struct Tokens {
    bos: Option<u64>,
    eos: Option<Vec<u64>>,
    eos_list: bool,
    /// The pad id passed or configured (None: a view of eos's first).
    pad: Option<u64>,
}

impl Tokens {
    fn of(c: Model, g: &Generate) -> Tokens {
        let t = c.tokens();
        Tokens {
            bos: t.bos,
            eos: t.eos.clone(),
            eos_list: t.eos_list,
            pad: g.pad.or(t.pad),
        }
    }

    /// Is there a pad tensor (its own, or eos's first)?
    fn has_pad(&self) -> bool {
        self.pad.is_some() || self.eos.is_some()
    }
}

fn gen_line(s: &mut String, ind: &str, stmt: &str) {
    at(s, ind, GEN, stmt);
}

/// `_prepare_special_tokens`, the padding check, the position ids and the unfinished flags.
fn prologue(s: &mut String, r: &Run, tk: &Tokens, ind: &str) {
    let b = r.batch;
    let mut st: Vec<String> = Vec::new();
    if let Some(bos) = tk.bos {
        st.push(format!("bos_t = full([], fill_value={bos}, dtype=int64)"));
    }
    if let Some(eos) = &tk.eos {
        if tk.eos_list {
            st.push(format!("eos_t = zeros({}, dtype=int64)", eos.len()));
            for (i, e) in eos.iter().enumerate() {
                st.push(format!("eos_t[{i}] = {e}"));
            }
        } else {
            // a 0-dim tensor, unsqueezed: eos is always 1-D
            st.push(format!(
                "eos_t = full([], fill_value={}, dtype=int64)",
                eos[0]
            ));
            st.push("eos_t = eos_t.unsqueeze(0)".into());
        }
    }
    match (tk.pad, &tk.eos) {
        (Some(p), _) => st.push(format!("pad_t = full([], fill_value={p}, dtype=int64)")),
        (None, Some(_)) => st.push("pad_t = eos_t[0]".into()),
        (None, None) => {}
    }
    if tk.eos.is_some() {
        st.extend([
            "st0 = isin(eos_t, pad_t)".to_string(),
            "st1 = st0.any()".into(),
            "del st0, st1".into(),
            "st2 = eos_t.lt(0)".into(),
            "st3 = st2.any()".into(),
            "del st2, st3".into(),
        ]);
    }
    // decoder-only models want left padding: does any row end in padding?
    if tk.has_pad() && b > 1 {
        st.extend([
            "pc0 = eq(input_ids[:, -1], pad_t)".to_string(),
            "pc1 = pc0.any()".into(),
            "del pc0, pc1".into(),
        ]);
    }
    st.extend([
        // _prepare_position_ids_for_generation
        "pp0 = gen_mask.cumsum(-1)".to_string(),
        "pp1 = pp0 - 1".into(),
        "del pp0".into(),
        "pp2 = gen_mask.eq(0)".into(),
        "gen_pos0 = pp1.masked_fill(pp2, 1)".into(),
        "del pp2, pp1".into(),
        // _sample
        format!("unfinished = ones({b}, dtype=int64)"),
        "ids = input_ids".into(),
        "gen_pos = gen_pos0".into(),
        "attention_mask = gen_mask".into(),
    ]);
    for x in st {
        gen_line(s, ind, &x);
    }
}

/// Which step of the loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// The prompt through the model (`_prefill`, whose model inputs go at its return).
    Prefill,
    /// The first decode step (no earlier model inputs to drop).
    FirstDecode,
    /// A later decode step, of a run of steps from step `k` that force alike.
    Decode(u64),
}

/// One step: the model inputs, the forward, and the token's choice. The minimum-length
/// processors exist with an eos token and `min_new_tokens` > 0; `force`: they mask eos this
/// step (fewer than `min_new_tokens` generated).
/// One step of the generation; `until`: this step and every one after it to token `until`
/// (the generation's last) have its shape, which `token_done(until=...)` tells the runner
/// (a fast-forward may replay them on the allocator: [`crate::alloc::fastforward`]).
#[allow(clippy::too_many_arguments)]
fn step(
    s: &mut String,
    c: Model,
    r: &Run,
    g: &Generate,
    tk: &Tokens,
    kind: Step,
    ind: &str,
    until: Option<u64>,
) {
    let b = r.batch;
    let procs = tk.eos.is_some() && g.min_new_tokens > 0;
    let force = |k: u64| k < g.min_new_tokens;
    let force = force(match kind {
        Step::Prefill => 0,
        Step::FirstDecode => 1,
        Step::Decode(k) => k,
    });
    let mut st: Vec<String> = Vec::new();
    // prepare_inputs_for_generation
    if kind == Step::Prefill {
        st.extend([
            "mi_ids = ids.clone()".to_string(),
            "mi_pos = gen_pos".into(),
            "mi_mask = attention_mask".into(),
        ]);
    } else {
        st.extend([
            "n_ids = ids[:, -1:].clone()".to_string(),
            "n_pos = gen_pos[:, -1:].clone()".into(),
        ]);
        if matches!(kind, Step::Decode(_)) {
            // the previous step's model inputs, a dict dropped once the new one exists
            st.push("del mi_ids, mi_pos, mi_mask".into());
        }
        st.extend([
            "mi_ids = n_ids".to_string(),
            "mi_pos = n_pos".into(),
            "mi_mask = attention_mask".into(),
            "del n_ids, n_pos".into(),
        ]);
    }
    for x in &st {
        gen_line(s, ind, x);
    }
    match c {
        Model::Llama(c) => forward(s, c, r, kind, ind),
        Model::Gpt2(c) => super::gpt2::generate_forward(s, c, r, kind != Step::Prefill, ind),
    }
    let mut st: Vec<String> = Vec::new();
    if kind == Step::Prefill {
        st.push("del mi_ids".into());
    }
    // _update_model_kwargs_for_generation: the next position and the mask, a column wider
    st.extend([
        "pn0 = arange(1)".to_string(),
        "pn1 = gen_pos[:, -1:] + pn0".into(),
        "del pn0".into(),
        "pn2 = pn1 + 1".into(),
        "del pn1".into(),
        "pnew = cat([gen_pos, pn2], -1)".into(),
        "del pn2".into(),
        format!("mo = ones({b}, 1, dtype=int64)"),
        "mnew = cat([attention_mask, mo], -1)".into(),
        "del mo".into(),
        "gen_pos = pnew".into(),
        "attention_mask = mnew".into(),
        "del pnew, mnew".into(),
        // the last position's logits, copied to float32
        if r.bf16_weights {
            "next_token_logits = logits[:, -1, :].float()".to_string()
        } else {
            "next_token_logits = logits[:, -1, :].clone()".to_string()
        },
    ]);
    for x in &st {
        gen_line(s, ind, x);
    }
    if procs {
        processors(s, c, force, ind);
    } else {
        gen_line(s, ind, "next_token_scores = next_token_logits");
    }
    let mut st: Vec<String> = vec!["next_tokens = argmax(next_token_scores, -1)".to_string()];
    if tk.eos.is_some() {
        // finished rows take the pad token
        st.extend([
            "nt0 = next_tokens * unfinished".to_string(),
            "nt1 = 1 - unfinished".into(),
            "nt2 = pad_t * nt1".into(),
            "del nt1".into(),
            "nt3 = nt0 + nt2".into(),
            "del nt0, nt2".into(),
            "next_tokens = nt3".into(),
            "del nt3".into(),
        ]);
    }
    st.push("ids = cat([ids, next_tokens[:, none]], -1)".into());
    for x in &st {
        gen_line(s, ind, x);
    }
    stopping(s, r, tk, ind);
    for x in [
        "nd = bitwise_not(sc_done)",
        "del sc_done",
        "un = bitwise_and(unfinished, nd)",
        "del nd",
        "unfinished = un",
        "del un",
        // this_peer_finished = unfinished_sequences.max() == 0
        "mx = unfinished.max()",
        "mx0 = mx.eq(0)",
        "del mx, mx0",
        // del outputs
        "del logits",
    ] {
        gen_line(s, ind, x);
    }
    // the step's token is done: a longer generation runs exactly these steps first
    match until {
        Some(n) => gen_line(s, ind, &format!("token_done(until={n})")),
        None => gen_line(s, ind, "token_done()"),
    }
}

/// `MinLengthLogitsProcessor` then `MinNewTokensLengthLogitsProcessor` on `next_token_logits`
/// into `next_token_scores`; `force`: both mask the eos ids (`where(isin, -inf, scores)`).
fn processors(s: &mut String, c: Model, force: bool, ind: &str) {
    let v = c.vocab();
    let path = "generate.logits_processor";
    let mut st: Vec<String> = vec![
        // MinLength: the vocabulary's eos mask, then a copy of the scores
        format!("lp_vocab = arange({v})"),
        "lp_eos = isin(lp_vocab, eos_t)".into(),
        "lp_s = next_token_logits.clone()".into(),
    ];
    if force {
        st.extend([
            "lp_inf = full([], fill_value=-inf)".to_string(),
            "lp_w = where(lp_eos, lp_inf, next_token_logits)".into(),
            "del lp_inf".into(),
            "lp_s = lp_w".into(),
            "del lp_w".into(),
        ]);
    }
    st.extend([
        "del lp_vocab, lp_eos".to_string(),
        // MinNewTokens: a copy first, then the mask
        "mn_s = lp_s.clone()".into(),
        format!("mn_vocab = arange({v})"),
        "mn_eos = isin(mn_vocab, eos_t)".into(),
    ]);
    if force {
        st.extend([
            "mn_inf = full([], fill_value=-inf)".to_string(),
            "mn_w = where(mn_eos, mn_inf, lp_s)".into(),
            "del mn_inf".into(),
            "mn_s = mn_w".into(),
            "del mn_w".into(),
        ]);
    }
    st.extend([
        "del mn_vocab, mn_eos".to_string(),
        // the list's `scores = processor(input_ids, scores)`
        "del lp_s".into(),
        "next_token_scores = mn_s".into(),
        "del mn_s".into(),
    ]);
    for x in st {
        at(s, ind, path, &x);
    }
}

/// `StoppingCriteriaList`: max length, then eos, or-ed into `sc_done`.
fn stopping(s: &mut String, r: &Run, tk: &Tokens, ind: &str) {
    let b = r.batch;
    let path = "generate.stopping_criteria";
    let mut st: Vec<String> = vec![
        format!("sc0 = full({b}, fill_value=0, dtype=bool)"),
        // MaxLengthCriteria (its value is data: gpumem runs every step)
        format!("sc1 = full({b}, fill_value=0, dtype=bool)"),
        "sc_done = bitwise_or(sc0, sc1)".into(),
        "del sc1, sc0".into(),
    ];
    if tk.eos.is_some() {
        st.extend([
            "se0 = isin(ids[:, -1:], eos_t)".to_string(),
            "se1 = se0.any(-1)".into(),
            "del se0".into(),
            "sc2 = bitwise_or(sc_done, se1)".into(),
            "del se1".into(),
            "sc_done = sc2".into(),
            "del sc2".into(),
        ]);
    }
    for x in st {
        at(s, ind, path, &x);
    }
}

/// `LlamaForCausalLM.forward` on the model inputs, leaving `logits` of the last position.
fn forward(s: &mut String, c: &LlamaConfig, r: &Run, kind: Step, ind: &str) {
    let line = |s: &mut String, stmt: &str| {
        let _ = writeln!(s, "{ind}{stmt}");
    };
    super::llama::embed(s, c, "mi_ids", ind);
    line(s, "h = inputs_embeds");
    line(s, "position_ids = mi_pos");
    // create_causal_mask with a 2-D mask under sdpa: all ones, so no 4-D mask; the families
    // with sliding layers build the sliding window's the same way within the window (Gemma-2
    // and Gemma-3 both), and make it once a step reaches the window
    let k = match kind {
        Step::Prefill => 0,
        Step::FirstDecode => 1,
        Step::Decode(k) => k,
    };
    let phase = window_phase(c, r, k);
    let window = phase != WindowPhase::Within;
    let w = c.sliding_window.unwrap_or(0);
    // the 2-D mask's length L = seq + k, the keys' offset L - w, the query's L - 1; in a loop
    // of steps from k, `step` counts from 0
    let (off, qoff) = match kind {
        Step::Decode(_) if window => (
            format!("(step + {})", r.seq + k - w),
            format!("(step + {})", r.seq + k - 1),
        ),
        _ if window => ((r.seq + k - w).to_string(), (r.seq + k - 1).to_string()),
        _ => (String::new(), String::new()),
    };
    // with no full-attention layer (Gemma-3 all sliding) the causal mask is sized by a
    // sliding one: past the window its ignore check looks at the 2-D mask's last w columns
    let all_sliding = (0..c.layers).all(|l| super::llama::sliding_layer(c, l));
    for path in mask_builders(c) {
        if window && path == SLIDING_BUILDER {
            if kind == Step::Prefill {
                super::masks::prefill_window_mask(s, r, w, ind);
            } else {
                super::masks::decode_window_mask(s, r, w, phase, &off, &qoff, ind);
            }
            continue;
        }
        if phase == WindowPhase::Past && all_sliding {
            super::masks::all_ones_check_past_window(s, w, &off, path, ind);
            continue;
        }
        if r.eager {
            // eager attention never skips its mask: [B, 1, t, L] over the L positions so far
            let (t, l, qoff) = match kind {
                Step::Prefill => (r.seq, r.seq.to_string(), "0".to_string()),
                Step::FirstDecode => (1, (r.seq + 1).to_string(), r.seq.to_string()),
                Step::Decode(k) => (
                    1,
                    format!("(step + {})", r.seq + k),
                    format!("(step + {})", r.seq + k - 1),
                ),
            };
            super::masks::eager_generate_mask(s, r, t, &l, &qoff, ind);
            continue;
        }
        super::masks::all_ones_check(s, path, ind);
    }
    let kinds = rope_kinds(c);
    for k in &kinds {
        rotary_named(s, c, r.bf16_weights, r.batch, ind, k);
    }
    let call = Call {
        t: if kind == Step::Prefill { r.seq } else { 1 },
        cache: if kind == Step::Prefill {
            Cache::Fill
        } else {
            Cache::Append
        },
        window,
    };
    decoder(s, c, r, call, ind);
    let pairs: Vec<String> = kinds.iter().map(|k| format!("sin{k}, cos{k}")).collect();
    // the model's locals at its return: Gemma-2's and Gemma-3's mask mapping before the
    // embeddings, the others' embeddings first, then the rotary pairs
    let dropped = match (window, c.sandwich) {
        (false, _) if r.eager => "inputs_embeds, causal_mask".to_string(),
        (false, _) => "inputs_embeds".to_string(),
        (true, true) => "sliding_mask, inputs_embeds".to_string(),
        (true, false) => "inputs_embeds, sliding_mask".to_string(),
    };
    line(s, &format!("del {dropped}, {}", pairs.join(", ")));
    // logits_to_keep=1: the last position only
    at(s, ind, "lm_head", "logits = linear(h[:, -1:, :], lm_head)");
    super::llama::final_softcap(s, c, ind);
    line(s, "del h, position_ids");
}

/// The sliding window's mask builder (its scope).
const SLIDING_BUILDER: &str = "model.create_sliding_window_causal_mask";

/// Where step `k` stands against the sliding window (step 0, the prefill, reaches it with a
/// prompt as long as the window: its mask is made over the prompt, no column indexed).
fn window_phase(c: &LlamaConfig, r: &Run, k: u64) -> WindowPhase {
    match c.sliding_window {
        Some(w) if k == 0 && super::llama::any_sliding(c) && r.seq >= w => WindowPhase::Reached,
        Some(w) if k > 0 && super::llama::any_sliding(c) => WindowPhase::of(r.seq + k, w),
        _ => WindowPhase::Within,
    }
}

/// The mask builders the model's forward calls: `create_causal_mask` unless every layer
/// slides, `create_sliding_window_causal_mask` if any does (Mistral and Phi-3 with a window:
/// only it; Gemma-2 and Gemma-3: both).
fn mask_builders(c: &LlamaConfig) -> Vec<&'static str> {
    let sliding = super::llama::any_sliding(c);
    let full = c.sandwich || !sliding;
    let mut v = Vec::new();
    if full {
        v.push("model.create_causal_mask");
    }
    if sliding {
        v.push(SLIDING_BUILDER);
    }
    v
}

/// `_sample`'s locals at its return, then generate's (its special tokens, its position ids,
/// the cache layer by layer from the last, eos last).
fn epilogue(s: &mut String, c: Model, tk: &Tokens, n: u64, ind: &str) {
    let mut names: Vec<String> = vec![
        "attention_mask".into(),
        "gen_pos".into(),
        "unfinished".into(),
    ];
    if n >= 2 {
        names.extend(["mi_ids".into(), "mi_pos".into(), "mi_mask".into()]);
    }
    names.extend([
        "next_token_logits".into(),
        "next_token_scores".into(),
        "next_tokens".into(),
    ]);
    if tk.bos.is_some() {
        names.push("bos_t".into());
    }
    if tk.has_pad() {
        names.push("pad_t".into());
    }
    names.push("gen_pos0".into());
    for l in (0..c.layers()).rev() {
        names.extend(c.cache_of(l));
    }
    if tk.eos.is_some() {
        names.push("eos_t".into());
    }
    let _ = writeln!(s, "{ind}del {}", names.join(", "));
}
