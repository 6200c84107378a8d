//! torchvision's ResNets: `[model] torchvision = "resnet50"` with `[train]` builds the model
//! `torchvision.models.resnet50()` builds and runs the loop of ../shared/tools/hf_models.py
//! over it (a batch of `randn(B, 3, S, S)` images and class labels; `out = model(x)`,
//! `F.cross_entropy(out, y)`, backward, the optimizer's step, `zero_grad(set_to_none=True)`),
//! expanded into script statements, each op tagged with its module path (`layer3.4.conv2`).
//!
//! What it models, op for op as the H200 traces show PyTorch running it:
//! - every convolution through cuDNN, with the workspace cuDNN's heuristics take for its
//!   shape ([`crate::engine::op::cudnn_conv`]) in forward and in each gradient;
//! - `BatchNorm2d` in training mode: cuDNN's kernel keeps a float32 mean and inverse std per
//!   channel, the running statistics and `num_batches_tracked` are updated in place;
//! - `ReLU(inplace=True)` and the residual `out += identity` in place: no allocation, the
//!   tensor's history rebased (ReLU's backward keeps its result, the same storage);
//! - the max pool's int64 indices, the adaptive average pool, `flatten`, the classifier's
//!   `addmm` (with the cuBLAS and cuBLASLt workspaces of the first product);
//! - a block's locals going at its return (the downsample's output with them).
//!
//! `mode = "inference"` runs the forward under `no_grad` in eval mode (batch norm from the
//! running statistics), as a user serving the model would; `mode = "train"` is hf_models.py's.
//! `precision = "bf16-autocast"` runs the forward and the loss under `torch.autocast` (bf16
//! convolutions, batch norm on bf16 inputs, the loss's float32 `nll_loss`).

use std::fmt::Write as _;

use toml::Value;

use super::ast::Span;
use super::error::{PResult, SyntaxError};
use super::preset::{at, optimizer_line, Expanded, PresetInfo, Reader, Table};

/// The keys of `[model]` for a torchvision model.
pub const MODEL_KEYS: &[&str] = &["torchvision", "num_classes", "image_size"];

/// The keys of `[train]` for a torchvision model.
pub const TRAIN_KEYS: &[&str] = &["batch", "iterations", "optimizer", "mode", "precision"];

/// Is this `[model]` table a torchvision one?
pub(crate) fn is_vision(model: &Table) -> bool {
    model.contains_key("torchvision")
}

/// A ResNet's shape: the block kind, blocks per stage, and the bottleneck's groups and width
/// per group (torchvision's `_resnet` arguments).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Arch {
    bottleneck: bool,
    layers: [u64; 4],
    groups: u64,
    width_per_group: u64,
}

/// The models of `torchvision.models` gpumem builds.
const MODELS: &[(&str, Arch)] = &[
    ("resnet18", basic([2, 2, 2, 2])),
    ("resnet34", basic([3, 4, 6, 3])),
    ("resnet50", bottleneck([3, 4, 6, 3], 1, 64)),
    ("resnet101", bottleneck([3, 4, 23, 3], 1, 64)),
    ("resnet152", bottleneck([3, 8, 36, 3], 1, 64)),
    ("wide_resnet50_2", bottleneck([3, 4, 6, 3], 1, 128)),
    ("wide_resnet101_2", bottleneck([3, 4, 23, 3], 1, 128)),
    ("resnext50_32x4d", bottleneck([3, 4, 6, 3], 32, 4)),
    ("resnext101_32x8d", bottleneck([3, 4, 23, 3], 32, 8)),
    ("resnext101_64x4d", bottleneck([3, 4, 23, 3], 64, 4)),
];

const fn basic(layers: [u64; 4]) -> Arch {
    Arch {
        bottleneck: false,
        layers,
        groups: 1,
        width_per_group: 64,
    }
}

const fn bottleneck(layers: [u64; 4], groups: u64, width_per_group: u64) -> Arch {
    Arch {
        bottleneck: true,
        layers,
        groups,
        width_per_group,
    }
}

/// What the workload asks.
#[derive(Debug, Clone)]
struct Run {
    batch: u64,
    image: u64,
    classes: u64,
    iterations: u32,
    optimizer: &'static str,
    train: bool,
    /// `precision = "bf16-autocast"`: the forward and the loss under
    /// `torch.autocast("cuda", dtype=torch.bfloat16)`.
    bf16: bool,
}

/// Expands `[model] torchvision = "..."` and `[train]`.
pub(crate) fn expand(
    model: &Table,
    model_at: Span,
    train: Option<&Table>,
    train_at: Span,
    span: &dyn Fn(usize) -> Span,
) -> PResult<Expanded> {
    let m = Reader {
        table: model,
        name: "model",
        at: model_at,
        absent: false,
        span,
    };
    m.check_keys(MODEL_KEYS, " for a torchvision model (torchvision)")?;
    let name_v = model.get("torchvision").expect("is_vision");
    let names = MODELS
        .iter()
        .map(|(n, _)| *n)
        .collect::<Vec<_>>()
        .join(", ");
    let (name, arch) = match name_v.get_ref() {
        Value::String(s) => match MODELS.iter().find(|(n, _)| n == s) {
            Some(&(n, a)) => (n, a),
            None => {
                return Err(SyntaxError::new(
                    m.pos(name_v),
                    format!("torchvision model \"{s}\" is not modelled (modelled: {names})"),
                ))
            }
        },
        _ => {
            return Err(SyntaxError::new(
                m.pos(name_v),
                format!("'torchvision' in [model] must be a model's name, one of {names}"),
            ))
        }
    };
    let empty = Table::new();
    let t = Reader {
        table: train.unwrap_or(&empty),
        name: "train",
        // with no [train] table, a missing key is reported at [model]
        at: if train.is_some() { train_at } else { model_at },
        absent: train.is_none(),
        span,
    };
    t.check_keys(TRAIN_KEYS, " for a torchvision model")?;
    let iterations = t.iterations()?;
    let image = m.int("image_size", Some(224), "")?;
    // the smallest image the stem's strides and the stages' leave a pixel of
    if !(32..=65_536).contains(&image) {
        return Err(SyntaxError::new(
            model.get("image_size").map_or(model_at, |v| m.pos(v)),
            format!("'image_size' in [model] must be between 32 and 65536 pixels, found {image}"),
        ));
    }
    let run = Run {
        batch: t.int("batch", None, "the batch size, e.g. batch = 64")?,
        image,
        classes: m.int("num_classes", Some(1000), "")?,
        iterations,
        optimizer: t.choice(
            "optimizer",
            "sgd_momentum",
            crate::workload::OPTIMIZER_NAMES,
        )?,
        train: t.choice("mode", "train", &["train", "inference"])? == "train",
        bf16: t.choice("precision", "fp32", &["fp32", "bf16-autocast"])? == "bf16-autocast",
    };
    let (setup, body) = resnet(&arch, &run);
    Ok(Expanded {
        kind: "torchvision",
        iterations: run.iterations,
        setup,
        body,
        info: PresetInfo {
            kind: name,
            ints: vec![
                ("batch".into(), run.batch),
                ("iterations".into(), run.iterations as u64),
            ],
            optimizer: run.optimizer,
            bf16: run.bf16,
            checkpointing: false,
            mode: if run.train { "train" } else { "inference" },
            keep_tensor: false,
            full_finetune: false,
            bf16_weights: false,
            kv_cache: None,
            max_positions: None,
            assumptions: None,
            distributed: None,
            can_autocast: true,
            unrecorded: Vec::new(),
        },
        weights: None,
    })
}

/// A module path as a script variable prefix: `layer1.0.conv1` → `layer1_0_conv1`.
fn var(path: &str) -> String {
    path.replace('.', "_")
}

/// One convolution or batch norm of the model, for its parameters and its forward.
enum Module {
    Conv {
        path: String,
        cin: u64,
        cout: u64,
        k: u64,
        stride: u64,
        groups: u64,
    },
    Bn {
        path: String,
        c: u64,
    },
}

/// A block: its modules' paths, for the forward.
struct Block {
    path: String,
    convs: Vec<(String, String)>,
    downsample: Option<(String, String)>,
}

/// The model's modules in `model.to()` order and its blocks.
fn modules(a: &Arch) -> (Vec<Module>, Vec<Block>, u64) {
    let mut ms = vec![
        Module::Conv {
            path: "conv1".into(),
            cin: 3,
            cout: 64,
            k: 7,
            stride: 2,
            groups: 1,
        },
        Module::Bn {
            path: "bn1".into(),
            c: 64,
        },
    ];
    let expansion = if a.bottleneck { 4 } else { 1 };
    let mut blocks = Vec::new();
    let mut inplanes = 64;
    for (stage, &n) in a.layers.iter().enumerate() {
        let planes = 64u64 << stage;
        for i in 0..n {
            let stride = if i == 0 && stage > 0 { 2 } else { 1 };
            let path = format!("layer{}.{i}", stage + 1);
            let p = |m: &str| format!("{path}.{m}");
            let mut convs = Vec::new();
            let mut conv = |ms: &mut Vec<Module>, k: usize, cin, cout, kk, s, g| {
                let (c, b) = (p(&format!("conv{k}")), p(&format!("bn{k}")));
                ms.push(Module::Conv {
                    path: c.clone(),
                    cin,
                    cout,
                    k: kk,
                    stride: s,
                    groups: g,
                });
                ms.push(Module::Bn {
                    path: b.clone(),
                    c: cout,
                });
                convs.push((c, b));
            };
            if a.bottleneck {
                let width = planes * a.width_per_group / 64 * a.groups;
                conv(&mut ms, 1, inplanes, width, 1, 1, 1);
                conv(&mut ms, 2, width, width, 3, stride, a.groups);
                conv(&mut ms, 3, width, planes * 4, 1, 1, 1);
            } else {
                conv(&mut ms, 1, inplanes, planes, 3, stride, 1);
                conv(&mut ms, 2, planes, planes, 3, 1, 1);
            }
            let downsample =
                (i == 0 && (stride != 1 || inplanes != planes * expansion)).then(|| {
                    let (c, b) = (p("downsample.0"), p("downsample.1"));
                    ms.push(Module::Conv {
                        path: c.clone(),
                        cin: inplanes,
                        cout: planes * expansion,
                        k: 1,
                        stride,
                        groups: 1,
                    });
                    ms.push(Module::Bn {
                        path: b.clone(),
                        c: planes * expansion,
                    });
                    (c, b)
                });
            blocks.push(Block {
                path,
                convs,
                downsample,
            });
            inplanes = planes * expansion;
        }
    }
    (ms, blocks, inplanes)
}

/// The setup (parameters and buffers in `model.to()` order, the optimizer) and the body.
fn resnet(a: &Arch, r: &Run) -> (String, String) {
    let (ms, blocks, features) = modules(a);
    let mut s = String::new();
    let mut params = Vec::new();
    let mut convs = std::collections::HashMap::new();
    for m in &ms {
        match m {
            Module::Conv {
                path,
                cin,
                cout,
                k,
                stride,
                groups,
            } => {
                let v = format!("{}_w", var(path));
                let shape = format!("{cout}, {}, {k}, {k}", cin / groups);
                let _ = writeln!(
                    s,
                    "scope \"{path}\" {{\n  {v} = randn({shape}, requires_grad=true, from=\"{path}.weight\")\n}}"
                );
                params.push(v);
                convs.insert(path.clone(), (*k, *stride, *groups));
            }
            Module::Bn { path, c } => {
                let v = var(path);
                let _ = writeln!(s, "scope \"{path}\" {{");
                let _ = writeln!(
                    s,
                    "  {v}_w = ones({c}, requires_grad=true, from=\"{path}.weight\")"
                );
                let _ = writeln!(
                    s,
                    "  {v}_b = zeros({c}, requires_grad=true, from=\"{path}.bias\")"
                );
                let _ = writeln!(s, "  {v}_rm = zeros({c}, from=\"{path}.running_mean\")");
                let _ = writeln!(s, "  {v}_rv = ones({c}, from=\"{path}.running_var\")");
                let _ = writeln!(
                    s,
                    "  {v}_nbt = zeros([], dtype=int64, from=\"{path}.num_batches_tracked\")"
                );
                let _ = writeln!(s, "}}");
                params.push(format!("{v}_w"));
                params.push(format!("{v}_b"));
            }
        }
    }
    let _ = writeln!(
        s,
        "scope \"fc\" {{\n  fc_w = randn({}, {features}, requires_grad=true, from=\"fc.weight\")\n  fc_b = zeros({}, requires_grad=true, from=\"fc.bias\")\n}}",
        r.classes, r.classes
    );
    params.push("fc_w".into());
    params.push("fc_b".into());
    if r.train {
        optimizer_line(&mut s, r.optimizer, &params.join(", "));
    }

    let mut b = String::new();
    let (n, px) = (r.batch, r.image);
    let _ = writeln!(b, "x = randn({n}, 3, {px}, {px}, from=\"data:images\")");
    let _ = writeln!(b, "labels = zeros({n}, dtype=int64, from=\"data:labels\")");
    let _ = writeln!(b, "phase \"forward\" {{");
    // `with torch.no_grad():` (inference), then `with torch.autocast(...)`: each a block
    let mut regions = Vec::new();
    if !r.train {
        regions.push("no_grad");
    }
    if r.bf16 {
        regions.push("autocast(dtype=bf16)");
    }
    let mut ind = "  ".to_string();
    for blk in &regions {
        let _ = writeln!(b, "{ind}{blk} {{");
        ind.push_str("  ");
    }
    let ind = ind.as_str();
    let conv = |b: &mut String, path: &str, x: &str, y: &str| {
        let (k, stride, groups) = convs[path];
        let mut args = format!("{x}, {}_w", var(path));
        if stride != 1 {
            let _ = write!(args, ", stride={stride}");
        }
        if k / 2 != 0 {
            let _ = write!(args, ", padding={}", k / 2);
        }
        if groups != 1 {
            let _ = write!(args, ", groups={groups}");
        }
        at(b, ind, path, &format!("{y} = conv2d({args})"));
    };
    let bn = |b: &mut String, path: &str, x: &str, y: &str| {
        let v = var(path);
        // `num_batches_tracked.add_(1)` first, in training, as BatchNorm.forward does
        let mut stmts = String::new();
        if r.train {
            let _ = write!(stmts, "{v}_nbt.add_(1)\n{ind}  ");
        }
        let _ = write!(
            stmts,
            "{y} = batch_norm({x}, {v}_rm, {v}_rv, {v}_w, {v}_b, training={})",
            r.train
        );
        at(b, ind, path, &stmts);
    };
    let line = |b: &mut String, stmt: &str| {
        let _ = writeln!(b, "{ind}{stmt}");
    };
    // the stem: each `x = module(x)` drops the previous x (kept by the next op's node)
    conv(&mut b, "conv1", "x", "h");
    bn(&mut b, "bn1", "h", "h");
    at(&mut b, ind, "relu", "h.relu_()");
    at(
        &mut b,
        ind,
        "maxpool",
        "h = max_pool2d(h, 3, stride=2, padding=1)",
    );
    for blk in &blocks {
        let relu = format!("{}.relu", blk.path);
        for (k, (c, bnp)) in blk.convs.iter().enumerate() {
            let src = if k == 0 { "h" } else { "out" };
            conv(&mut b, c, src, "out");
            bn(&mut b, bnp, "out", "out");
            if k + 1 < blk.convs.len() {
                at(&mut b, ind, &relu, "out.relu_()");
            }
        }
        let identity = match &blk.downsample {
            Some((c, bnp)) => {
                conv(&mut b, c, "h", "identity");
                bn(&mut b, bnp, "identity", "identity");
                "identity"
            }
            None => "h",
        };
        at(&mut b, ind, &blk.path, &format!("out.add_({identity})"));
        at(&mut b, ind, &relu, "out.relu_()");
        // the block returns: its locals go (a downsample's output with them), then the
        // caller's `x = block(x)` drops the block's input
        if blk.downsample.is_some() {
            line(&mut b, "del identity");
        }
        line(&mut b, "h = out");
        line(&mut b, "del out");
    }
    at(&mut b, ind, "avgpool", "p = adaptive_avg_pool2d(h, 1)");
    line(&mut b, "del h");
    line(&mut b, "flat = p.flatten(1)");
    line(&mut b, "del p");
    at(&mut b, ind, "fc", "logits = linear(flat, fc_w, fc_b)");
    line(&mut b, "del flat");
    if r.train {
        at(&mut b, ind, "loss", "loss = cross_entropy(logits, labels)");
    }
    for k in (0..regions.len()).rev() {
        let _ = writeln!(b, "{}}}", "  ".repeat(k + 1));
    }
    let _ = writeln!(b, "}}");
    if r.train {
        let _ = writeln!(b, "loss.backward()");
        let _ = writeln!(b, "value = loss.item()");
        // `del out, loss, x, y`
        let _ = writeln!(b, "del logits, loss, x, labels");
        if r.optimizer != "none" {
            let _ = writeln!(b, "opt.step()");
            let _ = writeln!(b, "opt.zero_grad(set_to_none=true)");
        }
    } else {
        let _ = writeln!(b, "del logits, x, labels");
    }
    (s, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// torchvision's parameter counts: resnet18 11,689,512; resnet50 25,557,032;
    /// resnext50_32x4d 25,028,904; wide_resnet50_2 68,883,240.
    #[test]
    fn parameter_counts_are_torchvisions() {
        for (name, want) in [
            ("resnet18", 11_689_512u64),
            ("resnet34", 21_797_672),
            ("resnet50", 25_557_032),
            ("resnet101", 44_549_160),
            ("resnext50_32x4d", 25_028_904),
            ("wide_resnet50_2", 68_883_240),
        ] {
            let a = MODELS.iter().find(|(n, _)| *n == name).unwrap().1;
            let (ms, _, features) = modules(&a);
            let mut total = features * 1000 + 1000;
            for m in &ms {
                total += match m {
                    Module::Conv {
                        cin,
                        cout,
                        k,
                        groups,
                        ..
                    } => cout * cin / groups * k * k,
                    Module::Bn { c, .. } => 2 * c,
                };
            }
            assert_eq!(total, want, "{name}");
        }
    }
}
