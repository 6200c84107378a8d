//! `BertForSequenceClassification` and `BertForMaskedLM` (transformers 5.17) as line-language
//! statements, op for op as the H200 traces show transformers running them:
//!
//! - `BertEmbeddings`: `position_ids` a slice of the model's buffer; `token_type_ids` gathered
//!   from the zero buffer ([1, T]) and expanded to [B, T], so its embedding copies the indices
//!   (`reshape(-1)` of an expanded tensor) and its backward copies them again
//!   (`contiguous()`); the three embeddings summed (the position one broadcast from [1, T, E]),
//!   `LayerNorm`, dropout. The three lookups go when the module returns.
//! - Each `BertLayer`: q, k and v from their linears, viewed as [B, H, T, D]; SDPA without a
//!   mask and not causal, `attention_probs_dropout_prob` inside the kernel; the output dense,
//!   dropout, `LayerNorm(x + input)`; the intermediate dense and GELU; the output dense,
//!   dropout, `LayerNorm(x + input)`. Each output module's dropped tensor goes at its return.
//! - Classification: the pooler (`tanh` of a dense over the first token, a strided view), the
//!   classifier's dropout and linear, and `CrossEntropyLoss` over [B, num_labels] against class
//!   labels. The output (`SequenceClassifierOutput`) holds the loss and the logits only: the
//!   last hidden state lives as long as the pooler's saved input.
//! - Masked LM (no pooler): `cls.predictions`' transform (dense, GELU, LayerNorm), the decoder
//!   to the vocabulary (the word embeddings' weight when tied, the head's own `bias`), and
//!   `CrossEntropyLoss` over [B * T, vocab] against the inputs' clone. Its parameters move to
//!   the device children first (the transform, the decoder's bias), but the optimizer takes
//!   them in `parameters()` order (the head's `bias` first).

use std::fmt::Write as _;

use super::config_gpt2_bert::{BertConfig, BertHead};
use super::train::{dropout, param, TRAINABLE};
use super::Run;
use crate::workload::preset::{at, optimizer_line};

/// `(variable, module path, parameter name, shape)` of every parameter, in `model.to()` order.
fn params(c: &BertConfig) -> Vec<(String, String, &'static str, Vec<u64>)> {
    let (e, i) = (c.hidden, c.intermediate);
    let emb = |s: &str| format!("bert.embeddings.{s}");
    let mut p = vec![
        (
            "word".to_string(),
            emb("word_embeddings"),
            "weight",
            vec![c.vocab, e],
        ),
        (
            "pos".to_string(),
            emb("position_embeddings"),
            "weight",
            vec![c.positions, e],
        ),
        (
            "tok".to_string(),
            emb("token_type_embeddings"),
            "weight",
            vec![c.type_vocab, e],
        ),
        ("eln_w".to_string(), emb("LayerNorm"), "weight", vec![e]),
        ("eln_b".to_string(), emb("LayerNorm"), "bias", vec![e]),
    ];
    for l in 0..c.layers {
        let m = |s: &str| format!("bert.encoder.layer.{l}.{s}");
        let mut two = |var: &str, path: &str, w: Vec<u64>, b: u64| {
            p.push((format!("l{l}_{var}_w"), m(path), "weight", w));
            p.push((format!("l{l}_{var}_b"), m(path), "bias", vec![b]));
        };
        two("q", "attention.self.query", vec![e, e], e);
        two("k", "attention.self.key", vec![e, e], e);
        two("v", "attention.self.value", vec![e, e], e);
        two("ao", "attention.output.dense", vec![e, e], e);
        two("aln", "attention.output.LayerNorm", vec![e], e);
        two("i", "intermediate.dense", vec![i, e], i);
        two("o", "output.dense", vec![e, i], e);
        two("oln", "output.LayerNorm", vec![e], e);
    }
    if c.head == BertHead::MaskedLm {
        // `model.to()` moves children before a module's own parameters: the transform, the
        // decoder's weight (the word embeddings', already moved, when tied), its bias (the
        // head's `bias`, the same parameter)
        let h = |s: &str| format!("cls.predictions.{s}");
        p.extend([
            ("mlm_w".into(), h("transform.dense"), "weight", vec![e, e]),
            ("mlm_b".into(), h("transform.dense"), "bias", vec![e]),
            (
                "mlm_ln_w".into(),
                h("transform.LayerNorm"),
                "weight",
                vec![e],
            ),
            ("mlm_ln_b".into(), h("transform.LayerNorm"), "bias", vec![e]),
        ]);
        if !c.tie_embeddings {
            p.push(("dec_w".into(), h("decoder"), "weight", vec![c.vocab, e]));
        }
        p.push(("dec_b".into(), h("decoder"), "bias", vec![c.vocab]));
        return p;
    }
    p.push((
        "pool_w".into(),
        "bert.pooler.dense".into(),
        "weight",
        vec![e, e],
    ));
    p.push(("pool_b".into(), "bert.pooler.dense".into(), "bias", vec![e]));
    p.push((
        "cls_w".into(),
        "classifier".into(),
        "weight",
        vec![c.labels, e],
    ));
    p.push(("cls_b".into(), "classifier".into(), "bias", vec![c.labels]));
    p
}

/// The parameters in `model.parameters()` order, which the optimizer takes: the masked-LM
/// head's own `bias` (the decoder's) comes before its transform.
fn optimizer_order(c: &BertConfig, vars: Vec<String>) -> Vec<String> {
    if c.head != BertHead::MaskedLm {
        return vars;
    }
    let (bias, mut rest): (Vec<String>, Vec<String>) = vars.into_iter().partition(|v| v == "dec_b");
    let at = rest.iter().position(|v| v == "mlm_w").unwrap_or(rest.len());
    for (k, b) in bias.into_iter().enumerate() {
        rest.insert(at + k, b);
    }
    rest
}

/// The linears `[model.lora] target_modules` may name: the self-attention's (peft matches a
/// module path's last part; the `dense` layers are not taken yet).
pub(crate) const LORA_TARGETS: &[&str] = &["query", "key", "value"];

/// The setup and body scripts.
pub(super) fn expand(c: &BertConfig, r: &Run) -> (String, String) {
    let mut s = String::new();
    let ps = params(c);
    // `model.to(torch.bfloat16)`: every parameter in bf16; peft freezes the base model, its
    // classifier too (no modules_to_save)
    let dt = if r.bf16_weights { ", dtype=bf16" } else { "" };
    let opts = if r.lora.is_some() {
        format!("{dt}, requires_grad=false")
    } else {
        format!("{dt}{TRAINABLE}")
    };
    let opts = opts.as_str();
    for (k, (var, path, name, shape)) in ps.iter().enumerate() {
        param(&mut s, var, path, name, shape, "randn", opts);
        if k == 4 {
            // BertEmbeddings' buffers, moved after its submodules' parameters
            let _ = writeln!(s, "scope \"bert.embeddings\" {{");
            let _ = writeln!(s, "  position_buf = arange({}).unsqueeze(0)", c.positions);
            let _ = writeln!(
                s,
                "  token_type_buf = zeros(1, {}, dtype=int64)",
                c.positions
            );
            let _ = writeln!(s, "}}");
        }
    }
    let mut list: Vec<String> = optimizer_order(c, ps.iter().map(|(v, ..)| v.clone()).collect());
    if let Some(lora) = &r.lora {
        // get_peft_model: each targeted linear's lora_A ([r, in]) and lora_B ([out, r], zeros)
        list.clear();
        let mut adapters = Vec::new();
        let e = c.hidden;
        for l in 0..c.layers {
            for (name, path) in [
                ("q", "attention.self.query"),
                ("k", "attention.self.key"),
                ("v", "attention.self.value"),
            ] {
                if super::train::lora_for(r, path).is_none() {
                    continue;
                }
                let m = format!("bert.encoder.layer.{l}.{path}");
                for (suffix, shape, fill, ab) in [
                    ("la", [lora.r, e], "randn", "A"),
                    ("lb", [e, lora.r], "zeros", "B"),
                ] {
                    let var = format!("l{l}_{name}_{suffix}");
                    let module = format!("{m}.lora_{ab}.default");
                    if r.bf16_weights {
                        // in the base weight's dtype, then cast to float32 (peft's
                        // autocast_adapter_dtype), the bf16 one freed
                        let v16 = format!("{var}_bf16");
                        param(&mut s, &v16, &module, "weight", &shape, fill, dt);
                        adapters.push((var.clone(), module, shape, fill));
                    } else {
                        param(&mut s, &var, &module, "weight", &shape, fill, TRAINABLE);
                    }
                    list.push(var);
                }
            }
        }
        for (var, module, shape, fill) in &adapters {
            param(&mut s, var, module, "weight", shape, fill, TRAINABLE);
            let _ = writeln!(s, "del {var}_bf16");
        }
    }
    let list: Vec<&str> = list.iter().map(String::as_str).collect();
    optimizer_line(&mut s, r.optimizer, &list.join(", "));
    let fwd = |s: &mut String, ind: &str| forward(s, c, r, ind);
    let labels = match c.head {
        // `torch.randint(0, 2, (B,))`: one class label per sample
        BertHead::Classification => format!(
            "labels = zeros({}, dtype=int64, from=\"data:labels\")",
            r.batch
        ),
        // a token per position: the inputs' clone, as a causal LM's
        BertHead::MaskedLm => super::train::CLONED_LABELS.to_string(),
    };
    (s, super::train::body(0, &[], r, &labels, &fwd, &[]))
}

/// `BertModel.forward`, the classifier and (in training) the loss, leaving `logits`.
fn forward(s: &mut String, c: &BertConfig, r: &Run, ind: &str) {
    let (b, t) = (r.batch, r.seq);
    let line = |s: &mut String, stmt: &str| {
        let _ = writeln!(s, "{ind}{stmt}");
    };
    let emb = "bert.embeddings";
    for st in [
        format!("position_ids = position_buf[:, :{t}]"),
        // torch.gather of the zero buffer at the positions: a [1, T] copy, expanded
        "tt0 = token_type_buf[:, :{t}].clone()".replace("{t}", &t.to_string()),
        format!("token_type_ids = tt0.expand({b}, {t})"),
    ] {
        at(s, ind, emb, &st);
    }
    at(
        s,
        ind,
        &format!("{emb}.word_embeddings"),
        "inputs_embeds = embedding(input_ids, word)",
    );
    at(
        s,
        ind,
        &format!("{emb}.token_type_embeddings"),
        "token_type_embeddings = embedding(token_type_ids, tok)",
    );
    at(s, ind, emb, "e0 = inputs_embeds + token_type_embeddings");
    at(
        s,
        ind,
        &format!("{emb}.position_embeddings"),
        "position_embeddings = embedding(position_ids, pos)",
    );
    at(s, ind, emb, "e1 = e0 + position_embeddings");
    line(s, "del e0");
    // (`embeddings` rebound by each line: the sum goes after the LayerNorm, its output after
    // the dropout, unless autograd keeps them)
    at(
        s,
        ind,
        &format!("{emb}.LayerNorm"),
        "e2 = layer_norm(e1, eln_w, eln_b)",
    );
    line(s, "del e1");
    at(
        s,
        ind,
        &format!("{emb}.dropout"),
        &format!("h = {}", dropout("e2", c.hidden_dropout)),
    );
    line(s, "del e2");
    // the module's locals at its return, in the frame's order (its arguments first, then
    // `buffered_token_type_ids`, `token_type_embeddings`, `position_embeddings`)
    line(
        s,
        "del inputs_embeds, token_type_ids, tt0, token_type_embeddings, position_embeddings, position_ids",
    );
    // (BertModel.forward's `embedding_output` lives until it returns)
    line(s, "emb_out = h");
    for l in 0..c.layers {
        if r.checkpointing {
            // GradientCheckpointingLayer: torch.utils.checkpoint(use_reentrant=False), the
            // layer's only tensor argument its input
            let _ = writeln!(s, "{ind}checkpoint {{");
            layer(s, c, r, l, &format!("{ind}  "));
            let _ = writeln!(s, "{ind}}}");
        } else {
            layer(s, c, r, l, ind);
        }
    }
    if c.head == BertHead::MaskedLm {
        line(s, "del emb_out");
        masked_lm_head(s, c, r, ind);
        return;
    }
    // the pooler: tanh(dense(h[:, 0]))
    let pool = "bert.pooler";
    for st in ["first = h[:, 0]", "p0 = linear(first, pool_w, pool_b)"] {
        at(s, ind, &format!("{pool}.dense"), st);
    }
    at(s, ind, &format!("{pool}.activation"), "pooled = p0.tanh()");
    line(s, "del p0, first, h, emb_out");
    at(
        s,
        ind,
        "dropout",
        &format!("pd = {}", dropout("pooled", c.classifier_dropout)),
    );
    at(s, ind, "classifier", "logits = linear(pd, cls_w, cls_b)");
    line(s, "del pd, pooled");
    loss(s, r, c.labels, ind);
}

/// `BertOnlyMLMHead` on the last hidden state `h`: the transform (dense, GELU, LayerNorm), the
/// decoder to the vocabulary, and (in training) `CrossEntropyLoss` over every position,
/// leaving `logits`.
fn masked_lm_head(s: &mut String, c: &BertConfig, r: &Run, ind: &str) {
    let line = |s: &mut String, stmt: &str| {
        let _ = writeln!(s, "{ind}{stmt}");
    };
    let h = "cls.predictions";
    at(
        s,
        ind,
        &format!("{h}.transform.dense"),
        "t0 = linear(h, mlm_w, mlm_b)",
    );
    at(
        s,
        ind,
        &format!("{h}.transform.transform_act_fn"),
        "t1 = t0.gelu()",
    );
    at(
        s,
        ind,
        &format!("{h}.transform.LayerNorm"),
        "t2 = layer_norm(t1, mlm_ln_w, mlm_ln_b)",
    );
    let w = if c.tie_embeddings { "word" } else { "dec_w" };
    at(
        s,
        ind,
        &format!("{h}.decoder"),
        &format!("logits = linear(t2, {w}, dec_b)"),
    );
    line(s, "del t0, t1, t2");
    loss(s, r, c.vocab, ind);
    // BertForMaskedLM's `outputs` (the last hidden state) goes at its return
    line(s, "del h");
}

/// In training, `CrossEntropyLoss` over the logits seen as [rows, classes] against the labels
/// flattened (the classifier's classes, or the vocabulary at every position).
fn loss(s: &mut String, r: &Run, classes: u64, ind: &str) {
    if r.mode == "train" {
        at(
            s,
            ind,
            "loss_function",
            &format!("loss = cross_entropy(logits.view(-1, {classes}), labels.view(-1))"),
        );
    }
}

/// One `BertLayer`: `h` to `h`.
fn layer(s: &mut String, c: &BertConfig, r: &Run, l: u64, ind: &str) {
    let (b, t) = (r.batch, r.seq);
    let (nh, e) = (c.heads, c.hidden);
    let hd = e / nh;
    let m = |x: &str| format!("bert.encoder.layer.{l}.{x}");
    let p = |x: &str| format!("l{l}_{x}");
    let line = |s: &mut String, stmt: &str| {
        let _ = writeln!(s, "{ind}{stmt}");
    };
    let lin = |s: &mut String, name: &str, path: &str, x: &str, y: &str| {
        let rhs = format!(
            "linear({x}, {}, {})",
            p(&format!("{name}_w")),
            p(&format!("{name}_b"))
        );
        match super::train::lora_for(r, path) {
            Some(l) => {
                let (la, lb) = (p(&format!("{name}_la")), p(&format!("{name}_lb")));
                super::train::lora_linear(s, ind, &m(path), &rhs, x, (&la, &lb), (l, r), y);
            }
            None => at(s, ind, &m(path), &format!("{y} = {rhs}")),
        }
    };
    // (the encoder's `hidden_states` holds the layer's input until the layer returns)
    line(s, "hin = h");
    let attn = m("attention.self");
    for (name, y) in [("q", "q"), ("k", "k"), ("v", "v")] {
        let path = match name {
            "q" => "attention.self.query",
            "k" => "attention.self.key",
            _ => "attention.self.value",
        };
        lin(s, name, path, "h", &format!("{y}0"));
        at(
            s,
            ind,
            &attn,
            &format!("{y} = {y}0.view({b}, {t}, {nh}, {hd}).transpose(1, 2)"),
        );
        line(s, &format!("del {y}0"));
    }
    let drop = if c.attention_dropout > 0.0 {
        format!(", dropout_p={:?}", c.attention_dropout)
    } else {
        String::new()
    };
    for st in [
        format!("y0 = scaled_dot_product_attention(q, k, v{drop}, is_causal=false)"),
        format!("y = y0.transpose(1, 2).reshape({b}, {t}, {e})"),
        "del y0, q, k, v".to_string(),
    ] {
        at(s, ind, &attn, &st);
    }
    // BertSelfOutput: dense, dropout, LayerNorm(x + input)
    lin(s, "ao", "attention.output.dense", "y", "a0");
    line(s, "del y");
    at(
        s,
        ind,
        &m("attention.output.dropout"),
        &format!("a1 = {}", dropout("a0", c.hidden_dropout)),
    );
    line(s, "del a0");
    at(s, ind, &m("attention.output"), "a2 = a1 + h");
    at(
        s,
        ind,
        &m("attention.output.LayerNorm"),
        &format!("x = layer_norm(a2, {}, {})", p("aln_w"), p("aln_b")),
    );
    line(s, "del a1, a2");
    // BertIntermediate, BertOutput
    lin(s, "i", "intermediate.dense", "x", "f");
    at(
        s,
        ind,
        &m("intermediate.intermediate_act_fn"),
        "g = f.gelu()",
    );
    line(s, "del f");
    lin(s, "o", "output.dense", "g", "o0");
    at(
        s,
        ind,
        &m("output.dropout"),
        &format!("o1 = {}", dropout("o0", c.hidden_dropout)),
    );
    line(s, "del o0");
    at(s, ind, &m("output"), "o2 = o1 + x");
    at(
        s,
        ind,
        &m("output.LayerNorm"),
        &format!("h = layer_norm(o2, {}, {})", p("oln_w"), p("oln_b")),
    );
    // BertOutput's rebound `hidden_states`, then `feed_forward_chunk`'s intermediate output at
    // its return, the layer's `attention_output` at its own, and its input as the encoder
    // rebinds it
    line(s, "del o1, o2");
    line(s, "del g");
    line(s, "del x");
    line(s, "del hin");
}
