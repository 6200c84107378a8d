//! A run's record: plain data any device produces (iterations, marks, the peak by category and
//! tag, the out-of-memory, the allocator's final state over its address record, the device's
//! name, captured gradients) and what a remedy's re-run gave. Reports format these without
//! knowing the runner; a distributed run can be a list of them.

use crate::alloc::{DeviceStats, OutOfMemory, SimAllocator};
use crate::trace::Category;

/// Memory at the measured points of one iteration (bytes; PyTorch's `memory_allocated()`).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct IterationStats {
    pub iteration: u32,
    pub start: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after_forward: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after_backward: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after_step: Option<u64>,
    /// After a `phase "generate"` (a Hugging Face `generate` call).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after_generate: Option<u64>,
    pub end: u64,
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    pub reserved_end: u64,
    /// The sum of the `.item()` values taken in the iteration (a preset's loss; with gradient
    /// accumulation, the micro-batches' losses, each divided by the count, summed). Null on the
    /// simulated device, which has no values.
    pub loss: Option<f64>,
}

/// A `mark("label")` in the script: memory at that point.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Mark {
    pub label: String,
    /// `None` in setup.
    pub iteration: Option<u32>,
    pub line: u32,
    pub allocated: u64,
    pub reserved: u64,
}

/// Allocated bytes by category at the run's peak.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct PeakBreakdown {
    pub peak_allocated: u64,
    /// The highest reserved memory of the run (not necessarily at the same moment).
    pub peak_reserved: u64,
    pub by_category: Vec<(Category, u64)>,
    /// The tag stacks holding the most memory at the peak, largest first.
    pub top_tags: Vec<(String, u64)>,
}

/// Where and why a run stopped on out-of-memory.
#[derive(Debug, Clone)]
pub struct RunOom {
    pub error: OutOfMemory,
    pub line: u32,
    pub column: u32,
    pub iteration: Option<u32>,
    /// Tokens the iteration's generation had finished when it ran out (`None` outside a
    /// generation): a generation of that many tokens runs the same steps and stops before
    /// the one that failed.
    pub tokens: Option<u64>,
}

/// A generation's progress at its last finished token (`token_done()`), which is all a
/// shorter generation of the same model runs before it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Generated {
    /// Tokens finished.
    pub tokens: u64,
    /// The run's highest allocated and reserved memory up to then (setup included).
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    /// Allocations from then to the iteration's end (`None` if it did not end): none means
    /// what follows the last step only frees, so it cannot run out.
    pub tail_allocations: Option<u64>,
    /// The allocator's allocations so far, then.
    pub(crate) allocations: u64,
}

#[derive(Debug, Clone)]
pub struct RunOutcome {
    pub name: String,
    /// The workload's statements are its author's (a script), so a line number means
    /// something; not where gpumem generated them (a bare config, a `[model]` preset or
    /// `hf_config`).
    pub script_lines: bool,
    pub capacity: u64,
    /// The allocator settings as written (PYTORCH_CUDA_ALLOC_CONF syntax, "" for the defaults)
    /// and where they came from (see `Workload::alloc_conf_from`).
    pub alloc_conf: (String, String),
    pub iterations: Vec<IterationStats>,
    /// (iteration, index in the event trace of its last event) per finished iteration.
    pub iteration_ends: Vec<(u32, u64)>,
    pub marks: Vec<Mark>,
    /// The last iteration's generation as `token_done()` counted it (`None` where the script
    /// counts no tokens).
    pub generated: Option<Generated>,
    /// Stopped at the run options' deadline: the figures are up to there.
    pub cut_short: bool,
    /// A generation's steady decode steps were fast-forwarded on the allocator alone
    /// (`RunOptions::fast_forward`): blocks, segments, peaks and the out-of-memory are exact;
    /// the event trace, the allocation counts and the engine's categories miss the calls
    /// it skipped.
    pub fast_forwarded: Option<FastForwarded>,
    pub oom: Option<RunOom>,
    pub peak: PeakBreakdown,
    pub stats: DeviceStats,
    /// The allocator's final state (its segment source now the plain address record).
    pub allocator: SimAllocator,
    /// The device it ran on (`sim`, `cpu`, `cuda`).
    pub device: &'static str,
    /// On the cuda device: its launches by kernel and where each ran (the GPU, or the host
    /// twin for what no GPU kernel takes yet).
    pub launches: Vec<crate::backend::Launches>,
    /// With `Target::capture_grads` (`crate::runner::Target`) on a data device: each named parameter's gradient
    /// before the first optimizer step, in the order the parameters were made.
    pub grads: Vec<NamedValues>,
    /// What the driver's view (nvidia-smi, NVML) of the process was at the end of the run.
    pub driver: Option<DriverView>,
    /// Device memory outside the caching allocator that the run's setup adds (NCCL's, for a
    /// distributed run), each figure with its source; included in `driver`'s `process_used`.
    pub outside: Vec<Outside>,
    /// A distributed run's ranks: (strategy, world size); every rank holds what rank 0 does.
    pub ranks: Option<(&'static str, u64)>,
    /// The most host memory the run's tensors held (FSDP2's CPU offload: the shards and
    /// their gradients pinned, the optimizer's state), in bytes.
    pub host_memory_peak: u64,
    /// Unified (managed) memory at most, outside the caching allocator (bitsandbytes' paged
    /// optimizer state).
    pub unified_memory_peak: u64,
}

/// What a run's fast-forwards did (summed over its iterations): decode steps driven on the
/// allocator alone, and how many of them played the small pool's calls too.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FastForwarded {
    pub steps: u64,
    pub full_steps: u64,
    /// Layers within the full steps whose small-pool calls were skipped.
    pub skipped_blocks: u64,
    /// An iteration allocated after a generation it drove to its end: the engine's tensors
    /// then had the last observed step's shapes, so what followed is not to be trusted (run
    /// again without the fast-forward).
    pub allocated_after: bool,
}

/// Device memory the process holds outside the caching allocator, by what holds it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Outside {
    pub what: &'static str,
    pub bytes: u64,
    /// Where the figure comes from.
    pub source: &'static str,
}

/// The process's device memory as nvidia-smi shows it, against what the allocator reserved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct DriverView {
    /// NVML's figure for this process (`cuda`), or the simulated device's model of it:
    /// reserved plus PyTorch's context on an H200 (`sim`, `cpu`).
    pub process_used: u64,
    /// `memory_reserved()` at the same moment.
    pub reserved: u64,
    /// Whether `process_used` was measured (NVML) rather than modelled.
    pub measured: bool,
}

impl DriverView {
    /// What the process holds outside the caching allocator (the CUDA context, kernels,
    /// libraries' handles): nvidia-smi's figure less `memory_reserved()`.
    pub fn outside(&self) -> u64 {
        self.process_used.saturating_sub(self.reserved)
    }
}

impl RunOutcome {
    /// Memory the process holds outside the allocator (0 without a driver's view).
    pub fn context(&self) -> u64 {
        self.driver.map_or(0, |d| d.outside())
    }

    /// Whether it ran out in setup, before its first iteration (for a preset or config: while
    /// its model was built and wrapped).
    pub fn ran_out_in_setup(&self) -> bool {
        self.oom.as_ref().is_some_and(|o| o.iteration.is_none())
    }

    /// Where the run ran out, as a user reads it ([`super::oom::oom_place`]), with the line
    /// where the workload's statements are its author's ([`RunOutcome::script_lines`]).
    pub fn oom_place(&self) -> Option<String> {
        let o = self.oom.as_ref()?;
        let rec = self.allocator.recorder();
        let site = super::oom::oom_site(rec.ring.iter(), &rec.tags);
        Some(super::oom::oom_place(
            &site,
            o.iteration,
            o.tokens,
            o.line,
            self.script_lines,
        ))
    }
}

/// A named tensor's values: (name, shape, values).
pub type NamedValues = (String, Vec<usize>, Vec<f64>);

/// A kind of remedy, in the order they are ranked: by how little they change (see
/// [`RemedyKind::tier`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RemedyKind {
    ExpandableSegments,
    MaxSplitSize,
    KeepItem,
    NoGrad,
    Checkpointing,
    /// A smaller batch with gradient accumulation to the same samples per optimizer step.
    GradAccum,
    /// Sharding the model differently: DDP to FSDP2, resharding after forward, CPU offload,
    /// more ranks.
    Sharding,
    Bf16Autocast,
    /// The weights in bf16.
    Bf16Weights,
    /// bitsandbytes' 8-bit AdamW (or Adam) instead of PyTorch's (every weight still trained).
    Optim8bit,
    /// LoRA adapters instead of training every weight.
    Lora,
    Sgd,
    ShorterSeq,
    SmallerBatch,
}

/// How much a remedy changes, least first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RemedyTier {
    /// `PYTORCH_CUDA_ALLOC_CONF` only: the program is unchanged.
    AllocatorSetting,
    /// The program changes, its results do not (a bug in the loop fixed, recomputation,
    /// accumulation to the same batch).
    MemoryOnly,
    /// The numerics, the optimization or the data change.
    Training,
}

impl RemedyKind {
    /// Whether the remedy can change what a preset or config allocates before its first step
    /// (the model as built and wrapped), not only its training or generation loop.
    pub fn can_change_the_build(self) -> bool {
        matches!(
            self,
            RemedyKind::ExpandableSegments
                | RemedyKind::MaxSplitSize
                | RemedyKind::Sharding
                | RemedyKind::Bf16Weights
                | RemedyKind::Lora
        )
    }

    pub fn tier(self) -> RemedyTier {
        match self {
            RemedyKind::ExpandableSegments | RemedyKind::MaxSplitSize => {
                RemedyTier::AllocatorSetting
            }
            RemedyKind::KeepItem
            | RemedyKind::NoGrad
            | RemedyKind::Checkpointing
            | RemedyKind::GradAccum
            | RemedyKind::Sharding => RemedyTier::MemoryOnly,
            RemedyKind::Bf16Autocast
            | RemedyKind::Bf16Weights
            | RemedyKind::Lora
            | RemedyKind::Optim8bit
            | RemedyKind::Sgd
            | RemedyKind::ShorterSeq
            | RemedyKind::SmallerBatch => RemedyTier::Training,
        }
    }
}

impl RemedyTier {
    pub fn name(self) -> &'static str {
        match self {
            RemedyTier::AllocatorSetting => "allocator setting",
            RemedyTier::MemoryOnly => "memory only",
            RemedyTier::Training => "changes results",
        }
    }
}

/// What running a remedy gave.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Tried {
    pub name: String,
    pub change: String,
    pub kind: RemedyKind,
    /// How much the remedy changes (`kind`'s tier).
    pub tier: RemedyTier,
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    pub fits: bool,
    /// Where the remedy's run ran out of memory, when it did ("iteration 0, line 412").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oom_at: Option<String>,
    /// Why the remedy could not run (the changed workload has an error), if so.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}
