//! `[distributed]` for a Hugging Face config: DDP, FSDP2 and DeepSpeed ZeRO stages 1 and 2,
//! each key read and checked against what gpumem models (naming any other key or value), into
//! the run's data-parallel or sharding settings.

use super::*;

/// The keys of `[distributed]`.
pub const DISTRIBUTED_KEYS: &[&str] = &[
    "world_size",
    "strategy",
    "gradient_as_bucket_view",
    "bucket_cap_mb",
    "param_dtype",
    "reduce_dtype",
    "reshard_after_forward",
    "init",
    "cpu_offload",
    "reduce_bucket_size",
    "overlap_comm",
];

/// `[distributed] strategy = "ddp"`: `DistributedDataParallel` around the model.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Ddp {
    /// `bucket_cap_mb` (PyTorch's default 25): the buckets rebuilt after the first backward
    /// close once they reach it (the first at 1 MiB).
    pub bucket_cap_mb: u64,
    /// Ranks: each holds what rank 0 holds (the replicas are alike).
    pub world_size: u64,
    /// `gradient_as_bucket_view`: the gradients become views of the buckets.
    pub bucket_view: bool,
}

/// `[distributed] strategy = "fsdp2"`: `fully_shard` on each decoder layer, then the root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fsdp2 {
    /// `MixedPrecisionPolicy(param_dtype=torch.bfloat16)`: the layers compute in bf16.
    pub param_bf16: bool,
    /// `reduce_dtype` as the script names it (`float32`), if given.
    pub reduce_dtype: Option<&'static str>,
    pub reshard_after_forward: bool,
    /// `CPUOffloadPolicy(pin_memory=True)`: the model built on the host, the shards kept there.
    pub cpu_offload: bool,
    /// Ranks sharding the parameters (each rank holds a 1/world_size shard, padded).
    pub world_size: u64,
    /// `init = "meta"`: the model built on the meta device and its shards materialized
    /// (`to_empty`) after `fully_shard`, as large models are; else built on the device first.
    pub meta_init: bool,
    /// The model's own weights are bf16 (`model.to(torch.bfloat16)` before `fully_shard`):
    /// the shards, the gathered parameters, the gradients and the optimizer's states are
    /// bf16 with no policy at all (set from the model's dtype, not a key of this table).
    pub weights_bf16: bool,
}

/// `[distributed] strategy = "zero1"` or `"zero2"`: DeepSpeed's ZeRO optimizer around the
/// model (0.19.6's code, read from source).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ZeroRun {
    pub stage: u8,
    pub world_size: u64,
    /// `reduce_bucket_size` in elements (DeepSpeed's default 5e8).
    pub reduce_bucket_size: u64,
    /// `overlap_comm` (DeepSpeed's default for stages 1 and 2: false): two buckets.
    pub overlap_comm: bool,
    /// `cpu_offload`: `offload_optimizer = {device = "cpu", pin_memory = true}`.
    pub offload_optimizer: bool,
}

/// What `[distributed]` asks for.
pub(super) enum Distributed {
    Ddp(Ddp),
    Fsdp2(Fsdp2),
    Zero(ZeroRun),
}

/// `[distributed]`: what gpumem models of it (DDP at world size 1, as recorded on the H200),
/// each other key or value refused naming it.
pub(super) fn distributed_run(
    table: &Table,
    at: Span,
    span: &dyn Fn(usize) -> Span,
    run: &Run,
    family: &str,
) -> PResult<Distributed> {
    let d = Reader {
        table,
        name: "distributed",
        at,
        absent: false,
        span,
    };
    d.check_keys(DISTRIBUTED_KEYS, "")?;
    let refuse = |key: &str, why: String| -> PResult<Distributed> {
        let place = table.get(key).map_or(at, |v| d.pos(v));
        Err(SyntaxError::new(place, why))
    };
    let strategy = d.choice(
        "strategy",
        "ddp",
        &["ddp", "fsdp2", "zero1", "zero2", "zero3"],
    )?;
    if table.get("strategy").is_none() {
        return refuse(
            "strategy",
            "[distributed] needs a strategy: strategy = \"ddp\", \"fsdp2\", \"zero1\" or \"zero2\""
                .into(),
        );
    }
    let zero = strategy.starts_with("zero");
    let zero_keys = ["reduce_bucket_size", "overlap_comm"];
    if !zero {
        for key in zero_keys {
            if table.contains_key(key) {
                return refuse(
                    key,
                    format!("'{key}' is a setting of zero1 and zero2; remove it"),
                );
            }
        }
    }
    let (fsdp_keys, ddp_keys) = (
        [
            "param_dtype",
            "reduce_dtype",
            "reshard_after_forward",
            "cpu_offload",
            "init",
        ],
        ["gradient_as_bucket_view", "bucket_cap_mb"],
    );
    // (cpu_offload is ZeRO's too: its optimizer offload)
    let both: Vec<&str> = fsdp_keys
        .iter()
        .chain(&ddp_keys)
        .copied()
        .filter(|k| !(zero && *k == "cpu_offload"))
        .collect();
    let (foreign, owner): (&[&str], &str) = if strategy == "ddp" {
        (&fsdp_keys, "fsdp2 (and cpu_offload of zero): DDP has none")
    } else if zero {
        (
            &both[..],
            "DDP or FSDP2 (ZeRO offloads with cpu_offload = true)",
        )
    } else {
        (&ddp_keys, "DDP: FSDP2 has no buckets")
    };
    for key in foreign {
        if table.contains_key(*key) {
            return refuse(key, format!("'{key}' is a setting of {owner}; remove it"));
        }
    }
    let world = d.int(
        "world_size",
        Some(1),
        "the number of ranks, e.g. world_size = 8",
    )?;
    if world == 0 || world > 65_536 {
        return refuse(
            "world_size",
            format!("world_size = {world}: the number of ranks is 1 to 65,536"),
        );
    }
    if family != "llama" {
        return refuse(
            "strategy",
            format!(
                "{strategy} around a {family} model is not modelled yet (the llama families are)"
            ),
        );
    }
    if run.mode != "train" {
        return refuse(
            "strategy",
            format!(
                "{strategy} in {} mode is not modelled: it wraps training",
                run.mode
            ),
        );
    }
    if zero {
        let bucket = d.int(
            "reduce_bucket_size",
            Some(500_000_000),
            "elements per reduction bucket, e.g. reduce_bucket_size = 500000000",
        )?;
        if bucket == 0 || bucket > 1 << 40 {
            return refuse(
                "reduce_bucket_size",
                format!("reduce_bucket_size = {bucket}: elements per bucket, 1 to 2^40"),
            );
        }
        if strategy == "zero3" {
            // stage 3 above one rank all-gathers each submodule's parameters before use: not
            // modelled yet
            if world > 1 {
                return refuse(
                    "world_size",
                    format!(
                        "strategy = \"zero3\" at world_size = {world} is not modelled yet (its \
                         per-submodule all-gathers); zero3 at world_size = 1, zero1 and zero2 \
                         at any size are"
                    ),
                );
            }
            if table.contains_key("overlap_comm") {
                return refuse(
                    "overlap_comm",
                    "'overlap_comm' with strategy = \"zero3\" is not modelled yet (stage 3 \
                     overlaps on its own reduce stream)"
                        .to_string(),
                );
            }
        }
        return Ok(Distributed::Zero(ZeroRun {
            stage: match strategy {
                "zero1" => 1,
                "zero2" => 2,
                _ => 3,
            },
            world_size: world,
            reduce_bucket_size: bucket,
            overlap_comm: d.flag("overlap_comm")?,
            offload_optimizer: d.flag("cpu_offload")?,
        }));
    }
    if strategy == "fsdp2" {
        let mut f = fsdp2_run(&d, table)?;
        f.world_size = world;
        // (the default: the meta device above one rank, as dist1.py builds a model too large
        // for one card, but not with CPU offload, whose model is built before it moves)
        let init = d.choice(
            "init",
            if world > 1 && !f.cpu_offload {
                "meta"
            } else {
                "cuda"
            },
            &["cuda", "meta"],
        )?;
        if init == "meta" && f.cpu_offload {
            return refuse(
                "init",
                "init = \"meta\" with cpu_offload is not modelled yet (the offloaded model is \
                 built on the host): remove init"
                    .into(),
            );
        }
        f.meta_init = init == "meta" && !f.cpu_offload;
        return Ok(Distributed::Fsdp2(f));
    }
    let bucket_view = d.flag("gradient_as_bucket_view")?;
    let cap = d.int(
        "bucket_cap_mb",
        Some(25),
        "megabytes per bucket, e.g. bucket_cap_mb = 25",
    )?;
    if cap == 0 {
        return refuse("bucket_cap_mb", "bucket_cap_mb must be at least 1".into());
    }
    Ok(Distributed::Ddp(Ddp {
        bucket_cap_mb: cap,
        world_size: world,
        bucket_view,
    }))
}

/// The FSDP2 keys of `[distributed]`: `param_dtype`, `reduce_dtype`, `reshard_after_forward`,
/// `cpu_offload` (`world_size` and `init` are read by the caller).
fn fsdp2_run(d: &Reader<'_>, table: &Table) -> PResult<Fsdp2> {
    let param = d.choice("param_dtype", "fp32", &["fp32", "bf16"])?;
    let reduce = d.choice("reduce_dtype", "fp32", &["fp32", "bf16"])?;
    let reduce_given = table.contains_key("reduce_dtype");
    let cpu_offload = d.flag("cpu_offload")?;
    let reshard = match table.get("reshard_after_forward") {
        None => true,
        Some(_) => d.flag("reshard_after_forward")?,
    };
    // (LoRA and autocast under FSDP2 are refused in `expand`, at their own keys)
    Ok(Fsdp2 {
        param_bf16: param == "bf16",
        reduce_dtype: reduce_given.then_some(if reduce == "bf16" { "bf16" } else { "float32" }),
        reshard_after_forward: reshard,
        cpu_offload,
        world_size: 1,
        meta_init: false,
        weights_bf16: false,
    })
}
