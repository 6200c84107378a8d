//! The arguments that say what runs: the workload (a file, a config, a built-in) and the
//! flags that size it or set a bare Hugging Face config's model, loop and sharding, shared by
//! `run`, `fit`, `check` and `diff`.

use std::path::PathBuf;

use clap::Args;

/// The flags that set a workload's size or a bare Hugging Face config's model and loop: the
/// same for `run`, `fit`, `check` and `diff`, so each answers the same question.
#[derive(Debug, Args, Clone, Default)]
pub struct ModelArgs {
    /// The batch size (a preset's or config's `batch`, a script's `batch` parameter): the same
    /// as `--param batch=N`.
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pub batch: Option<u64>,

    /// Tokens per sample (a config's or GPT preset's `seq`): the same as `--param seq=N`.
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pub seq: Option<u64>,

    /// With a bare config: the optimizer (`[train] optimizer`).
    #[arg(long, value_name = "NAME", value_parser = clap::builder::PossibleValuesParser::new(crate::workload::OPTIMIZER_NAMES))]
    pub optimizer: Option<String>,

    /// With a bare config: `fp32` or `bf16-autocast` (`[train] precision`).
    #[arg(long, value_name = "PRECISION", value_parser = ["fp32", "bf16-autocast"])]
    pub precision: Option<String>,

    /// With a bare config: `train`, `inference` for a no-grad forward, or `generate` for
    /// `model.generate` of --new-tokens tokens after a --seq prompt (`[train] mode`).
    #[arg(long, value_name = "MODE", value_parser = ["train", "inference", "generate"])]
    pub mode: Option<String>,

    /// Tokens `model.generate` makes after the prompt (a config's `[generate] new_tokens`): the
    /// same as `--param new_tokens=N`.
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pub new_tokens: Option<u64>,

    /// With a bare config: the weights' dtype, `fp32` or `bf16` (`[model] dtype`).
    #[arg(long, value_name = "DTYPE", value_parser = ["fp32", "bf16"])]
    pub dtype: Option<String>,

    /// With a bare config: `sdpa` or `eager` (`[model] attention`).
    #[arg(long, value_name = "KIND", value_parser = ["sdpa", "eager"])]
    pub attention: Option<String>,

    /// With a bare config: checkpoint every decoder layer (`[model] gradient_checkpointing`).
    #[arg(long)]
    pub gradient_checkpointing: bool,

    /// With a bare config: peft's LoRA of rank R (`[model.lora] r`); --lora-alpha,
    /// --lora-dropout and --lora-targets set the rest (peft's defaults: alpha 8, dropout 0,
    /// q_proj,v_proj).
    #[arg(long, value_name = "R")]
    pub lora_r: Option<u64>,

    /// With --lora-r: `[model.lora] alpha`.
    #[arg(long, value_name = "ALPHA", requires = "lora_r")]
    pub lora_alpha: Option<f64>,

    /// With --lora-r: `[model.lora] dropout`.
    #[arg(long, value_name = "P", requires = "lora_r")]
    pub lora_dropout: Option<f64>,

    /// With --lora-r: the targeted linears, comma-separated (`[model.lora] target_modules`),
    /// or `all-linear` (peft's: every linear of the layers) or `attention` (the attention's
    /// projections: q_proj,k_proj,v_proj,o_proj, or Phi-3's qkv_proj,o_proj). Default: peft's
    /// for the model type (q_proj,v_proj; Phi-3's qkv_proj).
    #[arg(long, value_name = "NAMES", requires = "lora_r")]
    pub lora_targets: Option<String>,

    /// With a bare config: train inside DistributedDataParallel (`[distributed] strategy =
    /// "ddp"`, world size 1): its broadcast at construction and its gradient buckets.
    #[arg(long)]
    pub ddp: bool,

    /// With --ddp: `[distributed] bucket_cap_mb` (PyTorch's default 25).
    #[arg(long, value_name = "MB", requires = "ddp")]
    pub bucket_cap_mb: Option<u64>,

    /// With a bare config: train under FSDP2 (`[distributed] strategy = "fsdp2"`, world size
    /// 1): `fully_shard` on each decoder layer, then the root; each group unsharded for its
    /// forward and backward, its gradients reduce-scattered into the shards.
    #[arg(long, conflicts_with = "ddp")]
    pub fsdp2: bool,

    /// With a bare config: train under DeepSpeed ZeRO stage 1, 2 or 3 (`[distributed] strategy =
    /// "zero1"`, `"zero2"` or `"zero3"`): the flat parameters, a float32 master partition and
    /// Adam's state per rank, the reduction bucket (`reduce_bucket_size`, 5e8 elements) and the
    /// partition's gradients, as DeepSpeed 0.19.6 allocates them. Rank 0 is shown. Stage 3 is
    /// modelled at world size 1 only.
    #[arg(long, value_name = "STAGE", value_parser = clap::value_parser!(u8).range(1..=3), conflicts_with_all = ["ddp", "fsdp2"])]
    pub zero: Option<u8>,

    /// With --zero: DeepSpeed's `reduce_bucket_size` in elements (default 500000000).
    #[arg(long, value_name = "ELEMENTS", requires = "zero")]
    pub reduce_bucket_size: Option<u64>,

    /// With --ddp, --fsdp2 or --zero: the number of ranks (`[distributed] world_size`, default 1).
    /// Every rank holds what rank 0 holds; under FSDP2 each a 1/N shard, the model built on
    /// the meta device when N > 1.
    #[arg(long, value_name = "N")]
    pub world_size: Option<u64>,

    /// With --fsdp2: `MixedPrecisionPolicy(param_dtype=...)`: fp32 (none, the default) or
    /// bf16 (then give --reduce-dtype fp32).
    #[arg(long, value_name = "DTYPE", requires = "fsdp2", value_parser = ["fp32", "bf16"])]
    pub param_dtype: Option<String>,

    /// With --fsdp2: `MixedPrecisionPolicy(reduce_dtype=...)`: fp32 or bf16 (the default:
    /// param_dtype).
    #[arg(long, value_name = "DTYPE", requires = "fsdp2", value_parser = ["fp32", "bf16"])]
    pub reduce_dtype: Option<String>,

    /// With --fsdp2: keep each layer's parameters unsharded from its forward to its backward
    /// (`reshard_after_forward=False`).
    #[arg(long, requires = "fsdp2")]
    pub no_reshard_after_forward: bool,

    /// With --fsdp2: `CPUOffloadPolicy(pin_memory=True)`: the shards, their gradients and the
    /// optimizer's step on the host. With --zero: DeepSpeed's `offload_optimizer` to the CPU
    /// (pinned): the float32 master, its gradient and Adam's state on the host,
    /// DeepSpeedCPUAdam stepping there.
    #[arg(long)]
    pub cpu_offload: bool,
}

/// What `run` and `fit` run: a file, or a built-in workload.
#[derive(Debug, Args, Clone, Default)]
pub struct WorkloadArg {
    /// The workload file (TOML), or a Hugging Face config.json (or a folder holding one) to
    /// train as it is: `config.json --batch 4 --seq 1024`.
    #[arg(required_unless_present = "preset")]
    pub workload: Option<PathBuf>,

    /// A workload built into gpumem instead of a file (they are listed below);
    /// `preset:NAME` works as a workload path too.
    #[arg(long, value_name = "NAME", conflicts_with = "workload",
          value_parser = super::values::preset_names())]
    pub preset: Option<String>,
}

impl WorkloadArg {
    /// The workload as a path (`preset:NAME` for a built-in one).
    pub fn path(&self) -> PathBuf {
        match (&self.workload, &self.preset) {
            (Some(p), _) => p.clone(),
            (None, Some(n)) => PathBuf::from(format!("{}{n}", crate::workload::builtin::PREFIX)),
            // clap requires one of them
            (None, None) => PathBuf::new(),
        }
    }
}
