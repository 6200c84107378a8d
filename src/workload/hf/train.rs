//! The loop of ../shared/tools/hf_models.py around a family's forward: the batch, the
//! forward (under `no_grad` in inference), `loss.backward()`, `del out` (the output's logits,
//! cache and loss, then the batch), and the optimizer's step; transformers' causal-LM loss; and
//! the small writers the families share. With `[train] labels = "input_ids"` the inputs are the
//! labels and the loss is read off the output (`out.loss.backward()`, `del out, x`: the loss
//! goes first); under `[distributed]`, DDP's work opens each forward (`ddp_forward()`).

use std::fmt::Write as _;

use super::Run;
use crate::workload::preset::at;

/// A causal LM's labels: its inputs.
pub(super) const CLONED_LABELS: &str = "labels = input_ids.clone()";

/// One iteration: `forward` writes the model's forward at an indentation, leaving `logits`,
/// each of `cached` layers' cache `kc{l}`, `vc{l}` (and for a `sliding` layer, its length `cl{l}`),
/// and (in training) `loss`. `labels` makes the labels (a causal LM's are its inputs, cloned).
pub(super) fn body(
    cached: u64,
    sliding: &[bool],
    r: &Run,
    labels: &str,
    forward: &dyn Fn(&mut String, &str),
    router_logits: &[String],
) -> String {
    let mut s = String::new();
    for micro in 0..r.grad_accum {
        if r.grad_accum > 1 {
            let _ = writeln!(s, "# micro-batch {micro} of {}", r.grad_accum);
        }
        micro_batch(&mut s, cached, sliding, r, labels, forward, router_logits);
    }
    if r.mode == "train" && r.optimizer != "none" {
        let _ = writeln!(s, "opt.step()");
        let _ = writeln!(s, "opt.zero_grad(set_to_none=true)");
    }
    s
}

/// One micro-batch: the batch, the forward, `(loss / grad_accum).backward()`, `del out`.
fn micro_batch(
    s: &mut String,
    cached: u64,
    sliding: &[bool],
    r: &Run,
    labels: &str,
    forward: &dyn Fn(&mut String, &str),
    router_logits: &[String],
) {
    let (b, t) = (r.batch, r.seq);
    let _ = writeln!(
        s,
        "input_ids = zeros({b}, {t}, dtype=int64, from=\"data:input_ids\")"
    );
    // `model(input_ids=x, labels=x)`: the labels are the inputs themselves
    let same = r.labels_are_inputs && labels == CLONED_LABELS;
    if same {
        let _ = writeln!(s, "labels = input_ids");
    } else {
        let _ = writeln!(s, "{labels}");
    }
    let _ = writeln!(s, "phase \"forward\" {{");
    if r.ddp.is_some() {
        let _ = writeln!(s, "  scope \"DistributedDataParallel\" {{");
        let _ = writeln!(s, "    ddp_forward()");
        let _ = writeln!(s, "  }}");
    }
    if r.fsdp.is_some() {
        // the root group's (the last) forward pre-hook
        let _ = writeln!(s, "  scope \"FSDP\" {{");
        let _ = writeln!(s, "    fsdp_pre_forward(-1)");
        let _ = writeln!(s, "  }}");
    }
    let train = r.mode == "train";
    if train {
        forward(s, "  ");
        if r.fsdp.is_some() {
            // the root's forward post-hook, on the model's output (the loss first)
            let _ = writeln!(s, "  scope \"FSDP\" {{");
            let _ = writeln!(s, "    fsdp_post_forward(-1, loss)");
            let _ = writeln!(s, "  }}");
        }
    } else {
        // `with torch.no_grad(): out = model(input_ids=x)`: no labels, no loss
        let _ = writeln!(s, "  no_grad {{");
        forward(s, "    ");
        let _ = writeln!(s, "  }}");
    }
    let _ = writeln!(s, "}}");
    // with accumulation, `loss = out.loss / grad_accum` is what backward runs from; the
    // output keeps its own loss until `del out`
    let scaled = train && r.grad_accum > 1 && r.zero.is_none();
    if train && r.zero.is_some() {
        // DeepSpeed's `engine.backward(loss)`: `loss / gradient_accumulation_steps` (even 1),
        // the ZeRO optimizer's loss scaler's `loss * scale` (1.0 but in fp16), backward from
        // that; on return the scaled loss goes, then the divided one the caller drops
        // (after_backward is read once it returned)
        let _ = writeln!(s, "phase \"backward\" {{");
        let _ = writeln!(s, "  ds_gas = loss / {}", r.grad_accum);
        let _ = writeln!(s, "  ds_scaled = ds_gas * 1.0");
        let _ = writeln!(s, "  ds_scaled.backward()");
        let _ = writeln!(s, "  del ds_scaled, ds_gas");
        let _ = writeln!(s, "}}");
        let _ = writeln!(s, "value = loss.item()");
    } else if scaled {
        let _ = writeln!(s, "scaled = loss / {}", r.grad_accum);
        let _ = writeln!(s, "scaled.backward()");
        let _ = writeln!(s, "value = scaled.item()");
    } else if train {
        let _ = writeln!(s, "loss.backward()");
        let _ = writeln!(s, "value = loss.item()");
    }
    // `del out`: the output's loss, logits and cache: its list of layers goes last first
    // (CPython frees a list's items from the end), each layer's keys then values
    let caches: Vec<String> = (0..cached)
        .rev()
        .map(|l| {
            if sliding.get(l as usize).copied().unwrap_or(false) {
                format!("kc{l}, vc{l}, cl{l}")
            } else {
                format!("kc{l}, vc{l}")
            }
        })
        .collect();
    // (`out.loss.backward(); del out`: the output's loss goes first, with its logits and
    // cache; a separate `loss` name keeps it to its own `del`)
    let loss_first = same && !scaled;
    if train && loss_first {
        let _ = writeln!(s, "del loss");
    }
    // (a MoE output's `aux_loss` comes before its logits, its `router_logits` after the
    // cache, a tuple dropped from the end)
    if train && !router_logits.is_empty() {
        let _ = writeln!(s, "del aux");
    }
    let _ = writeln!(s, "del logits");
    if !caches.is_empty() {
        let _ = writeln!(s, "del {}", caches.join(", "));
    }
    if !router_logits.is_empty() {
        let rev: Vec<&str> = router_logits.iter().rev().map(String::as_str).collect();
        let _ = writeln!(s, "del {}", rev.join(", "));
    }
    if train && !loss_first {
        let _ = writeln!(s, "del loss");
    }
    if scaled {
        let _ = writeln!(s, "del scaled");
    }
    let _ = writeln!(s, "del input_ids, labels");
}

/// `ForCausalLMLoss`: `loss` from `logits` and `labels`.
pub(super) fn causal_lm_loss(s: &mut String, vocab: u64, r: &Run, ind: &str) {
    let n = r.batch * r.seq;
    for st in [
        // `logits = logits.float()`: an upcast copy under autocast, the same tensor in float32
        "lf = logits.float()".to_string(),
        "lp = pad(labels, [0, 1], value=-100)".to_string(),
        "shift_labels = lp[..., 1:].contiguous()".to_string(),
        format!(
            "loss = cross_entropy(lf.view({n}, {}), shift_labels.view({n}))",
            vocab
        ),
        "del lf, lp, shift_labels".to_string(),
    ] {
        at(s, ind, "loss_function", &st);
    }
}

/// A shape as a factory's arguments: `2, 3`.
fn dims(shape: &[u64]) -> String {
    shape
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// `nn.Dropout(p)` in training: its input itself when `p` is 0 (no kernel, no mask).
pub(super) fn dropout(x: &str, p: f64) -> String {
    if p == 0.0 {
        x.to_string()
    } else {
        format!("dropout({x}, {p:?})")
    }
}

/// A trainable parameter's factory options.
pub(super) const TRAINABLE: &str = ", requires_grad=true";

/// A parameter of the model, made in its module's scope: `fill` (`randn`, `zeros`) of `shape`
/// with `opts` (`, dtype=bf16, requires_grad=true`), loadable from its `state_dict` name.
pub(super) fn param(
    s: &mut String,
    var: &str,
    module: &str,
    name: &str,
    shape: &[u64],
    fill: &str,
    opts: &str,
) {
    let _ = writeln!(s, "scope \"{module}\" {{");
    let _ = writeln!(
        s,
        "  {var} = {fill}({}{opts}, from=\"{module}.{name}\")",
        dims(shape)
    );
    let _ = writeln!(s, "}}");
}

/// The LoRA wrapping the module at `path`, if `target_modules` names it: peft matches a
/// module path's last part (GPT-2's `c_proj` is the attention's and the MLP's).
pub(super) fn lora_for<'a>(r: &'a Run, path: &str) -> Option<&'a super::Lora> {
    let module = path.rsplit('.').next().unwrap_or(path);
    r.lora
        .as_ref()
        .filter(|l| l.targets.iter().any(|t| t == module))
}

/// peft's `Linear.forward` around a base layer whose output `rhs` computes (the base product
/// of `x`): `y = base(x) + lora_B(lora_A(dropout(x))) * scaling`, each op in its module's
/// scope under `base` (the wrapped module's path), the adapters `la` and `lb`; the
/// temporaries go as peft's locals do. With `bf16` base weights the adapters are float32
/// (peft's `autocast_adapter_dtype`): the input is cast to float32 for them
/// (`_cast_input_dtype`), the sum is float32, and `result.to(torch_result_dtype)` casts it
/// back. In `generate` (`model.eval()`) the dropout module is the identity.
#[allow(clippy::too_many_arguments)]
pub(super) fn lora_linear(
    s: &mut String,
    ind: &str,
    base: &str,
    rhs: &str,
    x: &str,
    (la, lb): (&str, &str),
    (l, r): (&super::Lora, &Run),
    y: &str,
) {
    let bf16 = r.bf16_weights;
    let line = |s: &mut String, stmt: &str| {
        let _ = writeln!(s, "{ind}{stmt}");
    };
    at(s, ind, base, &format!("lora_base = {rhs}"));
    let x = if bf16 {
        at(s, ind, base, &format!("lora_xc = {x}.float()"));
        "lora_xc"
    } else {
        x
    };
    // (a dropout of 0 is nn.Identity)
    let lx = if l.dropout > 0.0 && r.mode != "generate" {
        at(
            s,
            ind,
            &format!("{base}.lora_dropout.default"),
            &format!("lora_x = dropout({x}, {:?})", l.dropout),
        );
        "lora_x"
    } else {
        x
    };
    at(
        s,
        ind,
        &format!("{base}.lora_A.default"),
        &format!("lora_a = linear({lx}, {la})"),
    );
    at(
        s,
        ind,
        &format!("{base}.lora_B.default"),
        &format!("lora_b = linear(lora_a, {lb})"),
    );
    at(
        s,
        ind,
        base,
        &format!("lora_s = lora_b * {:?}", l.alpha / l.r as f64),
    );
    line(s, "del lora_b");
    if bf16 {
        at(s, ind, base, "lora_sum = lora_base + lora_s");
        line(s, "del lora_s, lora_base");
        at(s, ind, base, &format!("{y} = lora_sum.bfloat16()"));
        line(s, "del lora_sum, lora_a");
    } else {
        at(s, ind, base, &format!("{y} = lora_base + lora_s"));
        line(s, "del lora_s, lora_base, lora_a");
    }
    if lx == "lora_x" {
        line(s, "del lora_x");
    }
    if bf16 {
        line(s, "del lora_xc");
    }
}
