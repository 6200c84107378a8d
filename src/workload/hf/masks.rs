//! The causal masks of the decoder families' forwards, as transformers' `masking_utils` makes
//! them for sdpa and eager attention: the full one (eager only: sdpa takes `is_causal`), the
//! sliding window's (in training, and in a decode step past the window), and the
//! packed-sequence check a forward without a cache makes first.

use super::{LlamaConfig, Run};
use crate::workload::preset::at;

/// Whether the forward makes a full causal mask: for eager attention, unless the family
/// makes only its sliding one (Mistral and Phi-3 with a window); Gemma-2 and Gemma-3 make
/// both whatever their layers use.
pub(super) fn full_mask(c: &LlamaConfig, r: &Run) -> bool {
    r.eager && (c.sandwich || c.sliding_window.is_none())
}

/// The window of the sliding mask the forward makes for a call of `t` tokens (as many keys),
/// if it makes one: sdpa skips it for fewer keys than the window
/// (`_ignore_causal_mask_sdpa`); eager attention always needs it.
pub(super) fn sliding_mask_window(c: &LlamaConfig, t: u64, eager: bool) -> Option<u64> {
    if !c.sliding_layers.iter().any(|&x| x) && !c.sandwich {
        return None;
    }
    c.sliding_window.filter(|&w| eager || t >= w)
}

/// Whether layer `l` attends through the sliding mask in a call of `t` tokens.
pub(super) fn window(c: &LlamaConfig, l: u64, t: u64, eager: bool) -> Option<u64> {
    if !c.sliding_layers.get(l as usize).copied().unwrap_or(false) {
        return None;
    }
    sliding_mask_window(c, t, eager)
}

/// `eager_mask`'s `torch.tensor(0.0, dtype=dtype)` and `finfo(dtype).min` (a scalar the
/// device gets as a 0-dim tensor), `dtype` the embeddings': bf16 with bf16 weights.
fn eager_fill(r: &Run) -> [&'static str; 2] {
    if r.bf16_weights {
        [
            "mz = zeros([], dtype=bf16)",
            "mn = full([], fill_value=-3.3895313892515355e+38, dtype=bf16)",
        ]
    } else {
        [
            "mz = zeros([])",
            "mn = full([], fill_value=-3.4028234663852886e+38)",
        ]
    }
}

/// `sdpa_mask`'s index tensors over `t` queries from `qoff` and `l` keys from `off`: the batch
/// and head aranges, then the query and key positions (`arange(n) + offset`), as `ba`, `ha`,
/// `qa`, `ka`.
fn aranges(
    b: u64,
    (t, qoff): (&dyn std::fmt::Display, &str),
    (l, off): (&dyn std::fmt::Display, &str),
) -> [String; 8] {
    [
        format!("ba = arange({b})"),
        "ha = arange(1)".to_string(),
        format!("qa0 = arange({t})"),
        format!("qa = qa0 + {qoff}"),
        "del qa0".to_string(),
        format!("ka0 = arange({l})"),
        format!("ka = ka0 + {off}"),
        "del ka0".to_string(),
    ]
}

/// The padding mask's gather `padding_mask[batch, kv]` over `l` keys: both index tensors
/// broadcast to [B, 1, 1, l] int64, the [B, 1, 1, l] bool gather `p0` (all true), the index
/// tensors gone last first.
fn padding_gather(b: u64, l: &dyn std::fmt::Display) -> [String; 4] {
    [
        format!("i0 = ba.view(-1, 1, 1, 1).expand({b}, 1, 1, {l}).contiguous()"),
        format!("i1 = ka.view(1, 1, 1, -1).expand({b}, 1, 1, {l}).contiguous()"),
        format!("p0 = full({b}, 1, 1, {l}, fill_value=1, dtype=bool)"),
        "del i1, i0".to_string(),
    ]
}

/// `create_sliding_window_causal_mask` for sdpa (masking_utils' `sdpa_mask` with
/// `and_masks(sliding_window_overlay(w), causal_mask_function)`): the batch, head, key and
/// query indices, `new_ones(())`, then `& (kv_idx > q_idx - w)` and `& (kv_idx <= q_idx)`, a
/// bool [T, T] seen as [B, 1, T, T]: `causal_mask`.
pub(super) fn sliding_mask(s: &mut String, r: &Run, w: u64, ind: &str) {
    let (b, t) = (r.batch, r.seq);
    // eager attention takes it as a float [B, 1, T, T] (`where(mask, 0.0, min)`), sdpa as
    // the bool one
    let tail: Vec<String> = if r.eager {
        let [zero, min] = eager_fill(r);
        vec![
            zero.to_string(),
            min.to_string(),
            format!(
                "sliding_mask = where(mr2.view(1, 1, {t}, {t}).expand({b}, 1, {t}, {t}), mz, mn)"
            ),
            "del mn, mz, mr2".to_string(),
        ]
    } else {
        vec![
            format!("sliding_mask = mr2.view(1, 1, {t}, {t}).expand({b}, 1, {t}, {t})"),
            "del mr2".to_string(),
        ]
    };
    for st in mask_indices(r)
        .into_iter()
        .chain([
            "mr0 = full([], fill_value=1, dtype=bool)".to_string(),
            format!("ms0 = q_idx.view(-1, 1) - {w}"),
            "ms1 = gt(kv_idx.view(1, -1), ms0)".to_string(),
            "del ms0".to_string(),
            "mr1 = bitwise_and(mr0, ms1)".to_string(),
            "del ms1, mr0".to_string(),
            "mc = le(kv_idx.view(1, -1), q_idx.view(-1, 1))".to_string(),
            "mr2 = bitwise_and(mr1, mc)".to_string(),
            "del mc, mr1".to_string(),
            "del mb, mh, kv_idx, q_idx".to_string(),
        ])
        .chain(tail)
    {
        at(s, ind, "model.create_sliding_window_causal_mask", &st);
    }
}

/// `sdpa_mask`'s index tensors: the batch and head aranges, and the key and query positions
/// (`arange(T) + offset`), as `mb`, `mh`, `kv_idx`, `q_idx`.
fn mask_indices(r: &Run) -> Vec<String> {
    let (b, t) = (r.batch, r.seq);
    vec![
        format!("mb = arange({b})"),
        "mh = arange(1)".to_string(),
        format!("mk0 = arange({t})"),
        "kv_idx = mk0 + 0".to_string(),
        "del mk0".to_string(),
        format!("mq0 = arange({t})"),
        "q_idx = mq0 + 0".to_string(),
        "del mq0".to_string(),
    ]
}

/// `create_causal_mask` for eager attention in a generation's forward, from generate's 2-D
/// mask `mi_mask` (all ones): the bool copy, `sdpa_mask` over `t` queries from `qoff` and `l`
/// keys from 0 (the aranges; `and_masks` of the causal `kv <= q` and the padding mask's
/// gather `padding_mask[batch, kv]`, as [`decode_window_mask`] makes them without the
/// window), then `eager_mask`'s `where(mask, 0.0, finfo(dtype).min)` in the embeddings' dtype,
/// leaving `causal_mask`, [B, 1, t, l]. `l` and `qoff` are script expressions (a loop's `step`
/// in them).
pub(super) fn eager_generate_mask(s: &mut String, r: &Run, t: u64, l: &str, qoff: &str, ind: &str) {
    let b = r.batch;
    let [zero, min] = eager_fill(r);
    let mut st = vec!["mk0 = mi_mask.to(dtype=bool)".to_string()];
    st.extend(aranges(b, (&t, qoff), (&l, "0")));
    st.extend([
        "r0 = full([], fill_value=1, dtype=bool)".to_string(),
        "c0 = le(ka.view(1, 1, 1, -1), qa.view(1, 1, -1, 1))".to_string(),
        "r1 = bitwise_and(r0, c0)".to_string(),
        "del c0, r0".to_string(),
    ]);
    st.extend(padding_gather(b, &l));
    st.extend([
        "r2 = bitwise_and(r1, p0)".to_string(),
        "del p0, r1".to_string(),
        format!("mbool = r2.expand({b}, 1, {t}, {l})"),
        "del r2".to_string(),
        "del ba, ha, qa, ka".to_string(),
        zero.to_string(),
        min.to_string(),
        "causal_mask = where(mbool, mz, mn)".to_string(),
        "del mn, mz, mbool".to_string(),
        "del mk0".to_string(),
    ]);
    for x in st {
        at(s, ind, "model.create_causal_mask", &x);
    }
}

/// Without a cache (gradient checkpointing turns it off in training), `create_causal_mask`
/// first checks the positions for packed sequences (masking_utils'
/// `find_packed_sequence_indices`): `diff` with a prepended dummy, `!= 1`, `cumsum`, and
/// whether the last column is all 0. None are, so no mask is made.
pub(super) fn packed_sequences(s: &mut String, r: &Run, ind: &str) {
    let b = r.batch;
    for st in [
        format!("pid = position_ids.expand({b}, -1)"),
        "pfirst = pid[:, :1] - 1".to_string(),
        "pcat = cat([pfirst, pid], -1)".to_string(),
        "pdiff = pcat[:, 1:] - pcat[:, :-1]".to_string(),
        "del pcat".to_string(),
        "pne = pdiff.ne(1)".to_string(),
        "packed = pne.cumsum(-1)".to_string(),
        "del pne".to_string(),
        "plast = packed[:, -1].eq(0)".to_string(),
        "pall = plast.all()".to_string(),
        "del plast, pall".to_string(),
        "del pfirst, pdiff, packed, pid".to_string(),
    ] {
        at(s, ind, "model.create_causal_mask", &st);
    }
}

/// `create_causal_mask` for eager attention (masking_utils' `sdpa_mask`, then `eager_mask`):
/// the batch, head, key and query indices, `kv_idx <= q_idx`, then `where(mask, 0.0, min)` as
/// a float32 [B, 1, T, T].
pub(super) fn eager_mask(s: &mut String, r: &Run, path: &str, ind: &str) {
    let (b, t) = (r.batch, r.seq);
    let [zero, min] = eager_fill(r);
    for st in mask_indices(r).into_iter().chain([
        "mm = le(kv_idx.view(1, -1), q_idx.view(-1, 1))".to_string(),
        "del mb, mh, kv_idx, q_idx".to_string(),
        zero.to_string(),
        min.to_string(),
        format!("causal_mask = where(mm.view(1, 1, {t}, {t}).expand({b}, 1, {t}, {t}), mz, mn)"),
        "del mn, mz, mm".to_string(),
    ]) {
        at(s, ind, path, &st);
    }
}

/// A mask builder (`create_causal_mask`, `create_sliding_window_causal_mask`) given
/// generate's all-ones 2-D mask within the window: the bool copy and `_ignore_causal_mask_sdpa`'s
/// `sum() == numel()` check, then no 4-D mask (sdpa's `is_causal` serves), under `path`.
pub(super) fn all_ones_check(s: &mut String, path: &str, ind: &str) {
    for x in [
        "mk0 = mi_mask.to(dtype=bool)",
        "mk1 = mk0.sum()",
        "mk2 = mk1.eq(mk0.numel())",
        "del mk1, mk2",
        "del mk0",
    ] {
        at(s, ind, path, x);
    }
}

/// Where a decode step stands against the sliding window: the 2-D mask holds `L` positions
/// (the prompt and the tokens so far, this one's included) and the sliding layers attend to
/// at most `w` keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum WindowPhase {
    /// `L < w`: `_ignore_causal_mask_sdpa` lets sdpa skip the mask.
    Within,
    /// `L == w`: the mask is made; the 2-D mask is as long as the keys.
    Reached,
    /// `L > w`: the mask is made, and the ignore check first indexes the 2-D mask's last `w`
    /// columns (`padding_mask[:, arange(w) + offset]`).
    Past,
}

impl WindowPhase {
    pub(super) fn of(positions: u64, w: u64) -> WindowPhase {
        match positions.cmp(&w) {
            std::cmp::Ordering::Less => WindowPhase::Within,
            std::cmp::Ordering::Equal => WindowPhase::Reached,
            std::cmp::Ordering::Greater => WindowPhase::Past,
        }
    }
}

/// `_ignore_causal_mask_sdpa` past the window: the 2-D mask's (`mk0`, bool) last `w` columns,
/// `padding_mask[:, arange(w) + off]`, as `pm` (its index `mi1` held too).
fn last_columns(w: u64, off: &str) -> [String; 4] {
    [
        format!("mi0 = arange({w})"),
        format!("mi1 = mi0 + {off}"),
        "del mi0".to_string(),
        "pm = index(mk0.t(), mi1)".to_string(),
    ]
}

/// `create_causal_mask` past the window in a model whose every layer slides (Gemma-3's
/// pattern without a full layer): its sizes come from a sliding layer, so the ignore check
/// looks at the 2-D mask's last `w` columns and finds them all ones: no 4-D mask.
pub(super) fn all_ones_check_past_window(s: &mut String, w: u64, off: &str, path: &str, ind: &str) {
    let mut st = vec!["mk0 = mi_mask.to(dtype=bool)".to_string()];
    st.extend(last_columns(w, off));
    st.extend([
        "mk1 = pm.sum()".to_string(),
        "mk2 = mk1.eq(pm.numel())".to_string(),
        "del mk1, mk2".to_string(),
        "del pm, mi1".to_string(),
        "del mk0".to_string(),
    ]);
    for x in st {
        at(s, ind, path, &x);
    }
}

/// `create_sliding_window_causal_mask` in a decode step that reaches the window, as
/// transformers 5.17 makes it for sdpa from the 2-D mask `mi_mask` ([B, L], all ones in
/// gpumem's generation): the bool copy; past the window the ignore check's index of its last
/// `w` columns; then `sdpa_mask`'s aranges (batch, head, the query's position `qoff`, the keys'
/// from `off`), the nested `and_masks` (a bool scalar each, the window's `kv > q - w`, the
/// causal `kv <= q`) and the padding mask's gather (`padding_mask[batch, kv]`: both index
/// tensors broadcast to [B, 1, 1, w] int64, then the [B, 1, 1, w] bool gather, all true; the
/// index tensors go last first),
/// leaving `sliding_mask`, [B, 1, 1, w] bool. `off` and `qoff` are script expressions (a loop's
/// `step` in them).
pub(super) fn decode_window_mask(
    s: &mut String,
    r: &Run,
    w: u64,
    phase: WindowPhase,
    off: &str,
    qoff: &str,
    ind: &str,
) {
    window_mask(s, r, (w, 1, w), phase, (off, qoff), ind);
}

/// `create_sliding_window_causal_mask` in a prefill whose prompt reaches the window: as
/// [`decode_window_mask`], over the prompt's `seq` queries and as many keys from 0, leaving
/// `sliding_mask`, [B, 1, seq, seq] bool.
pub(super) fn prefill_window_mask(s: &mut String, r: &Run, w: u64, ind: &str) {
    window_mask(
        s,
        r,
        (w, r.seq, r.seq),
        WindowPhase::Reached,
        ("0", "0"),
        ind,
    );
}

/// The window's mask over `t` queries from `qoff` and `l` keys from `off` (`(w, t, l)`).
fn window_mask(
    s: &mut String,
    r: &Run,
    (w, t, l): (u64, u64, u64),
    phase: WindowPhase,
    (off, qoff): (&str, &str),
    ind: &str,
) {
    let b = r.batch;
    let mut st = vec!["mk0 = mi_mask.to(dtype=bool)".to_string()];
    if phase == WindowPhase::Past {
        st.extend(last_columns(w, off));
        st.push("del pm, mi1".to_string());
    }
    st.extend(aranges(b, (&t, qoff), (&l, off)));
    st.extend([
        "r0 = full([], fill_value=1, dtype=bool)".to_string(),
        "r1 = full([], fill_value=1, dtype=bool)".to_string(),
        format!("s0 = qa.view(1, 1, -1, 1) - {w}"),
        "s1 = gt(ka.view(1, 1, 1, -1), s0)".to_string(),
        "del s0".to_string(),
        "r2 = bitwise_and(r1, s1)".to_string(),
        "del s1, r1".to_string(),
        "c0 = le(ka.view(1, 1, 1, -1), qa.view(1, 1, -1, 1))".to_string(),
        "r3 = bitwise_and(r2, c0)".to_string(),
        "del c0, r2".to_string(),
        "r4 = bitwise_and(r0, r3)".to_string(),
        "del r3, r0".to_string(),
    ]);
    st.extend(padding_gather(b, &l));
    st.extend([
        "r5 = bitwise_and(r4, p0)".to_string(),
        "del p0, r4".to_string(),
        format!("sliding_mask = r5.expand({b}, 1, {t}, {l})"),
        "del r5".to_string(),
        "del ba, ha, qa, ka".to_string(),
        "del mk0".to_string(),
    ]);
    for x in st {
        at(s, ind, "model.create_sliding_window_causal_mask", &x);
    }
}
