//! The causal masks of the decoder families' forwards, as transformers' `masking_utils` makes
//! them for sdpa and eager attention: the full one (eager only: sdpa takes `is_causal`), the
//! sliding window's, and the packed-sequence check a forward without a cache makes first.

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

/// `create_sliding_window_causal_mask` for sdpa (masking_utils' `sdpa_mask` with
/// `and_masks(sliding_window_overlay(w), causal_mask_function)`): the batch, head, key and
/// query indices, `new_ones(())`, then `& (kv_idx > q_idx - w)` and `& (kv_idx <= q_idx)`, a
/// bool [T, T] seen as [B, 1, T, T]: `causal_mask`.
pub(super) fn sliding_mask(s: &mut String, r: &Run, w: u64, ind: &str) {
    let (b, t) = (r.batch, r.seq);
    // eager attention takes it as a float [B, 1, T, T] (`where(mask, 0.0, min)`), sdpa as
    // the bool one
    let tail: Vec<String> = if r.eager {
        vec![
            "mz = zeros([])".to_string(),
            "mn = full([], fill_value=-3.4028234663852886e+38)".to_string(),
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
pub(super) fn eager_mask(s: &mut String, r: &Run, ind: &str) {
    let (b, t) = (r.batch, r.seq);
    for st in mask_indices(r).into_iter().chain([
        "mm = le(kv_idx.view(1, -1), q_idx.view(-1, 1))".to_string(),
        "del mb, mh, kv_idx, q_idx".to_string(),
        "mz = zeros([])".to_string(),
        "mn = full([], fill_value=-3.4028234663852886e+38)".to_string(),
        format!("causal_mask = where(mm.view(1, 1, {t}, {t}).expand({b}, 1, {t}, {t}), mz, mn)"),
        "del mn, mz, mm".to_string(),
    ]) {
        at(s, ind, "model.create_causal_mask", &st);
    }
}
