//! The remedies for an out-of-memory, each tried by running the workload again with the
//! change made (the search for the largest parameter value that fits, `gpumem fit`'s, is
//! [`super::search`]'s).
//!
//! A remedy is a set of [`Overrides`]: the same workload file loaded with one change, so a
//! remedy's figures are exactly those of `gpumem run` on the file with that change made by
//! hand. Remedies are listed smallest change first: allocator settings (an environment
//! variable), then fixes of a bug in the loop (`loss.item()`, `no_grad`), then changes to the
//! model's numerics or memory plan (autocast, checkpointing, the optimizer), then a smaller
//! batch, which changes the training itself.

use std::path::Path;

pub use crate::analysis::record::{RemedyKind, Tried};

use super::{RunOptions, RunOutcome};
use crate::engine::op::optim::OptimKind;
use crate::error::Error;
use crate::workload::{self, transform, BlockKind, Overrides, Workload};

/// One change to try.
#[derive(Debug, Clone, PartialEq)]
pub struct Remedy {
    /// Short name, e.g. `expandable_segments:True` or `batch 4`.
    pub name: String,
    /// What to change in a PyTorch program.
    pub change: String,
    /// The workload's overrides with this change added.
    pub overrides: Overrides,
    /// Which kind of remedy (for `fit`, which tries each kind once).
    pub kind: RemedyKind,
}

fn with_conf(w: &Workload, base: &Overrides, add: &str) -> Overrides {
    let current = base
        .alloc_conf
        .clone()
        .unwrap_or_else(|| w.alloc_conf.raw.clone());
    let key = add.split(':').next().unwrap_or(add);
    let mut parts: Vec<String> = current
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty() && p.split(':').next().map(str::trim) != Some(key))
        .map(String::from)
        .collect();
    parts.push(add.to_string());
    Overrides {
        alloc_conf: Some(parts.join(",")),
        ..base.clone()
    }
}

/// The Hugging Face families (a preset's `kind` for a config).
const HF_FAMILIES: &[&str] = &["llama", "gpt2", "bert"];

/// The remedies that apply to `w` (loaded with `base` from `path`), except those that shrink
/// the batch or the sequence ([`shrinking`]). A config's remedies that gpumem cannot model
/// for its family are left out (checked by loading the changed workload from `path`).
pub fn applicable(path: Option<&Path>, w: &Workload, base: &Overrides) -> Vec<Remedy> {
    let mut out = Vec::new();
    let p = w.preset.as_ref();
    if !w.alloc_conf.expandable_segments {
        out.push(Remedy {
            name: "expandable_segments:True".into(),
            change: "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True".into(),
            overrides: with_conf(w, base, "expandable_segments:True"),
            kind: RemedyKind::ExpandableSegments,
        });
    }
    for mb in [128u64, 512] {
        out.push(Remedy {
            name: format!("max_split_size_mb:{mb}"),
            change: format!("set PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:{mb}"),
            overrides: with_conf(w, base, &format!("max_split_size_mb:{mb}")),
            kind: RemedyKind::MaxSplitSize,
        });
    }
    let keeps = match p {
        Some(p) => p.keep_tensor,
        None => transform::calls(&w.body, "keep"),
    };
    if keeps {
        out.push(Remedy {
            name: "loss.item()".into(),
            change: "keep loss.item() (a number), not the loss tensor".into(),
            overrides: Overrides {
                keep_item: true,
                ..base.clone()
            },
            kind: RemedyKind::KeepItem,
        });
    }
    let eval_with_graph = match p {
        Some(p) => p.mode == "eval-with-graph",
        None => {
            !transform::calls_method(&w.body, "backward")
                && !transform::has_block(&w.body, &|k| *k == BlockKind::NoGrad)
                && (transform::requires_grad(&w.setup) || transform::requires_grad(&w.body))
        }
    };
    if eval_with_graph {
        out.push(Remedy {
            name: "no_grad".into(),
            change: "evaluate under `with torch.no_grad():`".into(),
            overrides: Overrides {
                no_grad_eval: true,
                ..base.clone()
            },
            kind: RemedyKind::NoGrad,
        });
    }
    // under ZeRO only Adam and AdamW (FusedAdam) in float32 or bf16 weights are modelled:
    // autocast and other optimizers would only be refused
    let zero = under_zero(w);
    let autocast = match p {
        // a model not modelled under autocast is not offered it
        Some(p) => p.bf16 || !p.can_autocast || zero,
        None => {
            transform::has_block(&w.body, &|k| matches!(k, BlockKind::Autocast { .. }))
                || !transform::multiplies_matrices(&w.body)
        }
    };
    if !autocast {
        out.push(Remedy {
            name: "bf16 autocast".into(),
            change: "forward under torch.autocast(\"cuda\", dtype=torch.bfloat16)".into(),
            overrides: Overrides {
                bf16_autocast: true,
                ..base.clone()
            },
            kind: RemedyKind::Bf16Autocast,
        });
    }
    if p.is_some_and(|p| p.kind == "gpt" && !p.checkpointing) {
        out.push(Remedy {
            name: "checkpointing".into(),
            change: "checkpoint(block, x, use_reentrant=False) per block".into(),
            overrides: Overrides {
                checkpointing: true,
                ..base.clone()
            },
            kind: RemedyKind::Checkpointing,
        });
    }
    // a Hugging Face config's remedies, each offered where gpumem models the changed model
    // (the changed workload loads)
    let hf = p.is_some_and(|p| HF_FAMILIES.contains(&p.kind));
    let mut hf_remedies = Vec::new();
    if let Some(p) = p.filter(|p| hf && p.mode == "train") {
        if !p.checkpointing {
            hf_remedies.push(Remedy {
                name: "gradient checkpointing".into(),
                change: "model.gradient_checkpointing_enable() (every decoder layer recomputed \
                         in backward)"
                    .into(),
                overrides: Overrides {
                    checkpointing: true,
                    ..base.clone()
                },
                kind: RemedyKind::Checkpointing,
            });
        }
        if !p.bf16_weights && !p.bf16 {
            hf_remedies.push(Remedy {
                name: "bf16 weights".into(),
                change: "from_pretrained(..., dtype=torch.bfloat16)".into(),
                overrides: Overrides {
                    bf16_weights: true,
                    ..base.clone()
                },
                kind: RemedyKind::Bf16Weights,
            });
        }
        if p.full_finetune {
            hf_remedies.push(Remedy {
                name: "LoRA r 16 (attention)".into(),
                change: "peft LoRA (r 16, alpha 32 on the attention's projections: --lora-r 16 \
                         --lora-alpha 32 --lora-targets attention) instead of training every \
                         weight"
                    .into(),
                overrides: Overrides {
                    lora_attention: true,
                    ..base.clone()
                },
                kind: RemedyKind::Lora,
            });
            if !p.bf16_weights && !p.bf16 {
                // the usual way to fine-tune a model whose float32 weights alone do not fit
                hf_remedies.push(Remedy {
                    name: "LoRA r 16 (attention), bf16 weights".into(),
                    change: "from_pretrained(..., dtype=torch.bfloat16), then peft LoRA (r 16, \
                             alpha 32 on the attention's projections: --dtype bf16 --lora-r 16 \
                             --lora-alpha 32 --lora-targets attention)"
                        .into(),
                    overrides: Overrides {
                        lora_attention: true,
                        bf16_weights: true,
                        ..base.clone()
                    },
                    kind: RemedyKind::Lora,
                });
            }
        }
    }
    // a wrapped model's sharding remedies, each re-run like the others
    if let Some(d) = p.and_then(|p| p.distributed.as_ref()) {
        let set = |pairs: &[(&str, &str)], name: &str, change: &str, kind| Remedy {
            name: name.into(),
            change: change.into(),
            overrides: Overrides {
                distributed_set: base
                    .distributed_set
                    .iter()
                    .cloned()
                    .chain(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))
                    .collect(),
                ..base.clone()
            },
            kind,
        };
        if d.strategy == "ddp" {
            hf_remedies.push(set(
                &[
                    ("strategy", "\"fsdp2\""),
                    ("bucket_cap_mb", ""),
                    ("gradient_as_bucket_view", ""),
                ],
                "FSDP2",
                "fully_shard each decoder layer and the model instead of DistributedDataParallel",
                RemedyKind::Sharding,
            ));
        } else if d.is_zero() {
            if d.strategy == "zero1" {
                hf_remedies.push(set(
                    &[("strategy", "\"zero2\"")],
                    "ZeRO stage 2",
                    "zero_optimization.stage 2: the gradients partitioned too",
                    RemedyKind::Sharding,
                ));
            }
            // the bucket lives through every backward, reduce_bucket_size elements whatever
            // the model's size (2 GB in float32 at DeepSpeed's 5e8): a tenth of it
            if let Some(n) = d.reduce_bucket_size.filter(|n| *n >= 10_000_000) {
                let smaller = (n / 10).to_string();
                hf_remedies.push(set(
                    &[("reduce_bucket_size", smaller.as_str())],
                    &format!("reduce_bucket_size {smaller}"),
                    &format!(
                        "zero_optimization.reduce_bucket_size {smaller} instead of {n} \
                         elements: a smaller reduction bucket through backward"
                    ),
                    RemedyKind::Sharding,
                ));
            }
            // (stage 3 is modelled at world size 1 only)
            let stage3 = d.strategy == "zero3";
            if !d.cpu_offload {
                hf_remedies.push(set(
                    &[("cpu_offload", "true")],
                    "optimizer offload",
                    "zero_optimization.offload_optimizer.device \"cpu\": the float32 master \
                     weights, their gradient and Adam's state on the host (DeepSpeedCPUAdam)",
                    RemedyKind::Sharding,
                ));
            }
            let more = (d.world_size * 2).to_string();
            if !stage3 {
                hf_remedies.push(Remedy {
                    name: format!("world size {more}"),
                    change: format!(
                        "{more} ranks instead of {}: smaller partitions",
                        d.world_size
                    ),
                    ..set(
                        &[("world_size", more.as_str())],
                        "",
                        "",
                        RemedyKind::Sharding,
                    )
                });
            }
        } else {
            if !d.reshard_after_forward {
                hf_remedies.push(set(
                    &[("reshard_after_forward", "true")],
                    "reshard after forward",
                    "fully_shard(..., reshard_after_forward=True): each layer regathered in backward",
                    RemedyKind::Sharding,
                ));
            }
            if !d.cpu_offload {
                hf_remedies.push(set(
                    &[("cpu_offload", "true")],
                    "CPU offload",
                    "fully_shard(..., offload_policy=CPUOffloadPolicy()): shards, gradients and the step on the host",
                    RemedyKind::Sharding,
                ));
            }
            let more = (d.world_size * 2).to_string();
            hf_remedies.push(Remedy {
                name: format!("world size {more}"),
                change: format!("{more} ranks instead of {}: smaller shards", d.world_size),
                ..set(
                    &[("world_size", more.as_str())],
                    "",
                    "",
                    RemedyKind::Sharding,
                )
            });
            if !d.param_bf16 {
                hf_remedies.push(set(
                    &[("param_dtype", "\"bf16\""), ("reduce_dtype", "\"fp32\"")],
                    "FSDP2 bf16 parameters",
                    "MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)",
                    RemedyKind::Bf16Weights,
                ));
            }
        }
    }
    out.extend(
        hf_remedies
            .into_iter()
            .filter(|r| path.is_none_or(|path| workload::load_with(path, &r.overrides).is_ok())),
    );
    let adam = match p {
        // (generation and inference have no optimizer step; under LoRA the optimizer holds
        // state for the adapters only, a fraction of a percent of the model: another
        // optimizer cannot make room)
        Some(p) => {
            let lora = HF_FAMILIES.contains(&p.kind) && !p.full_finetune;
            matches!(
                OptimKind::parse(p.optimizer),
                Some(OptimKind::Adam | OptimKind::AdamW)
            ) && p.mode == "train"
                && !lora
        }
        None => transform::calls(&w.setup, "adam") || transform::calls(&w.setup, "adamw"),
    };
    if adam && !zero {
        let plain_adam = match p {
            Some(p) => OptimKind::parse(p.optimizer) == Some(OptimKind::Adam),
            None => !transform::calls(&w.setup, "adamw"),
        };
        let (name, class) = if plain_adam {
            ("8-bit Adam", "Adam8bit")
        } else {
            ("8-bit AdamW", "AdamW8bit")
        };
        out.push(Remedy {
            name: name.into(),
            change: format!(
                "bitsandbytes' {class} instead of PyTorch's: uint8 optimizer state with float32 block maxima"
            ),
            overrides: Overrides {
                optim8bit: true,
                ..base.clone()
            },
            kind: RemedyKind::Optim8bit,
        });
        out.push(Remedy {
            name: "SGD".into(),
            change: "torch.optim.SGD instead of Adam (no optimizer state)".into(),
            overrides: Overrides {
                sgd: true,
                ..base.clone()
            },
            kind: RemedyKind::Sgd,
        });
    }
    // ranked by how little each changes (stable: the order above within a kind)
    out.sort_by_key(|r| r.kind);
    out
}

/// The peaks of a finished run, and whether it fit (no out-of-memory).
fn outcome(r: &RunOutcome) -> (u64, u64, bool) {
    (r.peak.peak_allocated, r.peak.peak_reserved, r.oom.is_none())
}

/// Runs the workload at `path` with `overrides` for its peaks and its out-of-memory only:
/// with [`RunOptions::fast_forward`] on (a generation's steady steps driven on the allocator
/// alone, exact in those figures), and again without it where the script allocated after a
/// generation the fast-forward drove to its end.
pub fn rerun(path: &Path, overrides: &Overrides, opts: &RunOptions) -> Result<RunOutcome, Error> {
    let ff = RunOptions {
        fast_forward: true,
        ..opts.clone()
    };
    let out = run_with(path, overrides, &ff)?;
    if out.fast_forwarded.is_some_and(|f| f.allocated_after) {
        let plain = RunOptions {
            fast_forward: false,
            ..opts.clone()
        };
        return run_with(path, overrides, &plain);
    }
    Ok(out)
}

/// Runs the workload at `path` with `overrides`.
pub fn run_with(
    path: &Path,
    overrides: &Overrides,
    opts: &RunOptions,
) -> Result<RunOutcome, Error> {
    let w = workload::load_with(path, overrides)?;
    // remedies run on the simulated device (the same allocator figures, no arithmetic), or
    // on the device `fit --device` names
    let target = super::Target {
        device: Some(opts.device.clone().unwrap_or_else(|| "sim".into())),
        capture_grads: false,
    };
    super::run_on(&w, path, opts, &target, &mut |_, _| {})
}

/// Tries one remedy. A workload error in the changed workload is reported, not returned.
pub fn try_one(path: &Path, r: &Remedy, opts: &RunOptions) -> Tried {
    let mut t = Tried {
        name: r.name.clone(),
        change: r.change.clone(),
        kind: r.kind,
        tier: r.kind.tier(),
        peak_allocated: 0,
        peak_reserved: 0,
        fits: false,
        oom_at: None,
        error: None,
    };
    match rerun(path, &r.overrides, opts) {
        Ok(out) => {
            (t.peak_allocated, t.peak_reserved, t.fits) = outcome(&out);
            t.oom_at = out.oom_place();
        }
        Err(e) => t.error = Some(e.to_string()),
    }
    t
}

/// Whether the workload trains under DeepSpeed ZeRO (any stage).
fn under_zero(w: &Workload) -> bool {
    w.preset
        .as_ref()
        .and_then(|p| p.distributed.as_ref())
        .is_some_and(|d| d.is_zero())
}

/// The remedies that make a run smaller, as a list of steps each tried until one fits: the
/// batch split into micro-batches with gradient accumulation to the same samples per step
/// (halves, quarters, ... where they divide it), the sequence halved, the batch halved.
fn shrinking(w: &Workload, base: &Overrides) -> Vec<Vec<Remedy>> {
    let ints = w.integer_params();
    let int = |n: &str| ints.iter().find(|(k, _)| k == n).map(|x| x.1);
    let train = w.preset.as_ref().is_none_or(|p| p.mode == "train");
    // (under ZeRO one backward per step is modelled: accumulation would only be refused)
    let zero = under_zero(w);
    let mut out = Vec::new();
    if let (Some((name, b)), Some(ga), true) = (w.batch_param(), int("grad_accum"), train && !zero)
    {
        let mut steps = Vec::new();
        let mut k = 2;
        while k <= b && b % k == 0 {
            steps.push(Remedy {
                name: format!("{name} {} x {} accumulated", b / k, ga * k),
                change: format!(
                    "batch size {} with {} gradient-accumulation steps (the same {} samples \
                     per optimizer step)",
                    b / k,
                    ga * k,
                    b * ga
                ),
                overrides: base
                    .with_param(&name, b / k)
                    .with_param("grad_accum", ga * k),
                kind: RemedyKind::GradAccum,
            });
            k *= 2;
        }
        out.push(steps);
    }
    if let Some(seq) = int("seq").filter(|_| w.preset.is_some()) {
        // (a generation's seq is its prompt)
        let what = match w.preset.as_ref().map(|p| p.mode) {
            Some("generate") => "prompts",
            _ => "sequences",
        };
        let mut steps = Vec::new();
        let mut t = seq;
        while t > 1 {
            t /= 2;
            steps.push(Remedy {
                name: format!("seq {t}"),
                change: format!(
                    "{what} of {t} token{} instead of {seq}",
                    if t == 1 { "" } else { "s" }
                ),
                overrides: base.with_param("seq", t),
                kind: RemedyKind::ShorterSeq,
            });
        }
        out.push(steps);
    }
    if let Some((name, b)) = w.batch_param() {
        let mut steps = Vec::new();
        let mut v = b;
        while v > 1 {
            v /= 2;
            steps.push(Remedy {
                name: format!("{name} {v}"),
                change: format!("batch size {v} instead of {b}"),
                overrides: base.with_param(&name, v),
                kind: RemedyKind::SmallerBatch,
            });
        }
        out.push(steps);
    }
    out
}

/// Tries every applicable remedy, then each shrinking one step by step until a step fits.
/// Calls `progress(name)` before each run. Returns the results with the ones that fit first,
/// each group ranked by how little the remedy changes ([`RemedyKind`]'s order), so the first
/// row that fits is the smallest change that does.
///
/// `build_only`: the run ran out while a preset or config built its model, before any step
/// ([`building_ran_out`]). Only the remedies that change what that builds are tried then
/// (allocator settings, the weights' dtype, LoRA, sharding): the batch, the sequence,
/// checkpointing and the optimizer change only the loop that never ran.
pub fn try_all(
    path: &Path,
    w: &Workload,
    base: &Overrides,
    opts: &RunOptions,
    build_only: bool,
    progress: &(dyn Fn(&str) + Sync),
) -> Vec<Tried> {
    use rayon::prelude::*;
    // each remedy is a re-run of its own, and each shrinking series (smaller and smaller until
    // one fits) a sequence of them: those run side by side, one per core
    let mut jobs: Vec<Vec<Remedy>> = applicable(Some(path), w, base)
        .into_iter()
        .filter(|r| !build_only || r.kind.can_change_the_build())
        .map(|r| vec![r])
        .collect();
    if !build_only {
        jobs.extend(shrinking(w, base));
    }
    let mut out: Vec<Tried> = jobs
        .into_par_iter()
        .map(|steps| {
            let mut done = Vec::new();
            for r in steps {
                progress(&r.name);
                let t = try_one(path, &r, opts);
                let stop = t.fits || t.error.is_some();
                done.push(t);
                if stop {
                    break;
                }
            }
            done
        })
        .collect::<Vec<_>>()
        .into_iter()
        .flatten()
        .collect();
    // stable: fitting ones first, each group by rank, in the order tried within a kind
    out.sort_by_key(|t| (!t.fits, t.kind));
    out
}

/// Whether `r` of workload `w` ran out building its model: a preset's or config's setup
/// builds and wraps the model and nothing else (a script's setup may allocate anything, as
/// its batch says).
pub fn building_ran_out(w: &Workload, r: &RunOutcome) -> bool {
    w.preset.is_some() && r.ran_out_in_setup()
}

/// The device size of an "unbounded" re-run: the largest the simulated device takes (64 TiB),
/// far more than any workload gpumem runs reserves (it holds no data).
pub const UNBOUNDED: u64 = crate::units::MAX_CAPACITY;

/// Re-runs under the allocator settings only: what settles fragmentation against capacity
/// when the other remedies are not wanted (`--no-remedies`).
pub fn try_allocator_settings(
    path: &Path,
    w: &Workload,
    base: &Overrides,
    opts: &RunOptions,
) -> Vec<Tried> {
    use rayon::prelude::*;
    applicable(None, w, base)
        .into_par_iter()
        .filter(|r| r.kind.tier() == crate::analysis::record::RemedyTier::AllocatorSetting)
        .map(|r| try_one(path, &r, opts))
        .collect()
}

/// What a workload needs, run on an unbounded simulated device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Needs {
    /// Its peak reserved.
    pub peak_reserved: u64,
    /// What its setup left allocated: the model (its parameters and what its wrapping makes)
    /// before the first iteration.
    pub built: u64,
}

/// What the workload needs ([`Needs`]), or `None` when that run fails (or runs out even
/// there).
pub fn needs(path: &Path, base: &Overrides, opts: &RunOptions) -> Option<Needs> {
    let unbounded = RunOptions {
        deadline: None,
        capacity: Some(UNBOUNDED),
        device: None,
        ..opts.clone()
    };
    let r = rerun(path, base, &unbounded).ok()?;
    r.oom.is_none().then(|| Needs {
        peak_reserved: r.peak.peak_reserved,
        built: r.iterations.first().map_or(0, |i| i.start),
    })
}

/// Whether a re-run under an allocator setting fits: what makes an out-of-memory
/// fragmentation. `None` when no allocator setting was tried.
pub fn allocator_setting_fits(tried: &[Tried]) -> Option<bool> {
    let mut alloc = tried
        .iter()
        .filter(|t| t.kind.tier() == crate::analysis::record::RemedyTier::AllocatorSetting)
        .peekable();
    alloc.peek()?;
    Some(alloc.any(|t| t.fits))
}
