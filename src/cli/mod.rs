//! The command line, as clap definitions only. The man pages are generated from these
//! (`man/`, checked by a test), so `--help` and the man pages never disagree.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

const EXIT_CODES: &str = "\
Exit codes:
  0  everything asked for holds (for replay: every step matches PyTorch)
  1  a finding you asked to fail on (for replay: any mismatch with the recording)
  2  usage, input or I/O error (a bad flag, an unreadable or malformed file)";

/// GPU-memory profiler and out-of-memory diagnoser, with PyTorch's CUDA caching allocator
/// reproduced byte for byte.
#[derive(Debug, Parser)]
#[command(
    name = "gpumem",
    version,
    about = "GPU-memory profiler and out-of-memory diagnoser, with PyTorch's caching allocator byte for byte",
    long_about = "gpumem reproduces PyTorch's CUDA caching allocator (rounding, pools, best fit, \
splitting, merging, retries, expandable segments, memory_stats) on a simulated device, so you can \
see where GPU memory goes and why an allocation fails without a GPU.\n\n\
Start with:\n  gpumem replay fixtures/allocator/trace_mixed_default.json --summary",
    after_long_help = EXIT_CODES,
    disable_help_subcommand = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    Run(RunArgs),
    Replay(ReplayArgs),
    Bench(BenchArgs),
    CompareTorch(CompareTorchArgs),
}

/// Run a workload on the simulated device and show where the memory went.
///
/// A workload is a TOML file: a `[workload]` table (name, iterations, capacity such as "24GiB",
/// alloc_conf in PYTORCH_CUDA_ALLOC_CONF syntax) and `setup`/`body` scripts of tensor ops in a
/// small Python-like language (`x = randn(1024, 1024, requires_grad=true)`, `y = (x * x).sin()`,
/// `loss = y.mean()`, `loss.backward()`, `del y`, `keep(loss)`, `empty_cache()`,
/// `mark("label")`, blocks `no_grad { ... }`, `scope "encoder" { ... }`, `phase "forward" { ... }`).
/// A standard model needs no script: `[model]` (kind = "mlp": d_in, hidden, layers, d_out;
/// kind = "gpt": vocab, seq, d_model, heads, layers, attention = "math" | "sdpa") and
/// `[train]` (batch, iterations, optimizer, precision, grad_accum, mode, keep_loss,
/// retain_graph) build PyTorch's reference model and loop.
/// Prints, per iteration, allocated memory at its start, after forward and backward, at its end,
/// and the peaks; then what was live at the run's peak by category and by tag, and the
/// allocator's final state. An out-of-memory stops the run as PyTorch would (exit 1).
#[derive(Debug, Args)]
#[command(after_long_help = EXIT_CODES)]
pub struct RunArgs {
    /// The workload file (TOML).
    pub workload: PathBuf,

    /// Where to run: `sim`, the simulated device (the default; no GPU needed). The `cpu` and
    /// `cuda` backends are not built yet.
    #[arg(long, value_name = "DEVICE", default_value = "sim")]
    pub device: String,

    /// Device memory of the simulated GPU instead of the workload's (e.g. 24GiB, 80GiB).
    #[arg(long, value_name = "SIZE")]
    pub capacity: Option<String>,

    /// Iterations of the body instead of the workload's.
    #[arg(long, value_name = "N")]
    pub iterations: Option<u32>,

    /// Print one JSON object (iterations, marks, peak breakdown, memory_stats, oom).
    #[arg(long)]
    pub json: bool,

    /// With the text output: PyTorch's memory_summary() text instead of the table.
    #[arg(long)]
    pub torch_style: bool,

    /// Also write a gpumem snapshot (versioned JSON: segments, blocks, the event trace with
    /// tags and categories, settings) to FILE, atomically.
    #[arg(long, value_name = "FILE")]
    pub snapshot: Option<PathBuf>,
}

/// Replay a recorded PyTorch allocator trace and compare every step with PyTorch.
///
/// The trace is JSON as ../shared/tools/alloc_traces.py writes it: `ops` (["a", id, size],
/// ["f", id], ["e"] for empty_cache), and what PyTorch recorded after each op (`after`), the
/// ops that raised out-of-memory (`ooms`), the final `memory_stats()` (`stats_end`) and its
/// device trace (`trace`). gpumem runs the ops on a simulated device of `device_total_memory`
/// bytes with the trace's `memory_fraction` and `alloc_conf`, and compares after every op.
/// Segment addresses are taken from the trace's `segment_alloc` entries, so best-fit ties
/// between equal-size blocks fall as they did on the GPU.
#[derive(Debug, Args)]
#[command(after_long_help = EXIT_CODES)]
pub struct ReplayArgs {
    /// The trace file (JSON).
    pub trace: PathBuf,

    /// Allocator settings in PYTORCH_CUDA_ALLOC_CONF syntax, instead of the trace's
    /// (e.g. "expandable_segments:True" or "max_split_size_mb:128,roundup_power2_divisions:4").
    /// Differences from the recording are then what the setting changes.
    #[arg(long, value_name = "CONF")]
    pub alloc_conf: Option<String>,

    /// Print one JSON object (ops, mismatched_steps, ooms_expected, ooms_matched,
    /// stats_end_mismatched_keys, memory_stats, ...) instead of text.
    #[arg(long)]
    pub json: bool,

    /// End with the allocator's final state as a memory_summary table.
    #[arg(long)]
    pub summary: bool,

    /// With --summary: print PyTorch's memory_summary() text exactly, to diff against PyTorch.
    #[arg(long, requires = "summary")]
    pub torch_style: bool,

    /// How many mismatching steps to show in detail.
    #[arg(long, default_value_t = 5, value_name = "N")]
    pub max_mismatches: usize,

    /// Use the simulator's own segment addresses (its model of the CUDA driver's address
    /// space) instead of the trace's; the event trace is then compared without addresses.
    #[arg(long)]
    pub no_trace_addresses: bool,
}

/// Measure the allocator: ns per alloc+free pair with event recording on and off.
///
/// Runs the two patterns of PyTorch's own allocator benchmark (../shared/tools/alloc_bench.py)
/// with the same size lists in the same order: `pairs` (alloc then free at once, cycling over 64
/// sizes) and `batch` (allocate 256 blocks, then free them in the order i*7919 mod 256). With
/// --pytorch, PyTorch's results (the JSON alloc_bench.py writes) are shown beside, as ratios.
#[derive(Debug, Args)]
#[command(after_long_help = EXIT_CODES)]
pub struct BenchArgs {
    /// Repetitions of each pattern (each is timed; the median is reported).
    #[arg(long, default_value_t = 5, value_name = "N")]
    pub repeat: usize,

    /// Passes over the size list per `pairs` repetition.
    #[arg(long, default_value_t = 2000, value_name = "N")]
    pub pairs_reps: usize,

    /// Passes over the size list per `batch` repetition.
    #[arg(long, default_value_t = 500, value_name = "N")]
    pub batch_reps: usize,

    /// Milliseconds of untimed work first, so the CPU is at speed when timing starts.
    #[arg(long, default_value_t = 1000, value_name = "MS")]
    pub warmup_ms: u64,

    /// PyTorch's results from alloc_bench.py (JSON) to compare against; its size lists are used.
    #[arg(long, value_name = "FILE")]
    pub pytorch: Option<PathBuf>,

    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,

    /// Time running this workload instead (ms per iteration and allocator events per
    /// iteration, over --repeat runs of its setup and iterations).
    #[arg(long, value_name = "FILE")]
    pub workload: Option<PathBuf>,
}

/// The clap command, for man pages and completions.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

/// Renders the man pages: `gpumem.1` and one per subcommand (`gpumem-replay.1`, ...).
pub fn man_pages() -> Vec<(String, Vec<u8>)> {
    let cmd = command();
    let mut pages = Vec::new();
    let mut buf = Vec::new();
    clap_mangen::Man::new(cmd.clone())
        .render(&mut buf)
        .expect("render to memory");
    pages.push(("gpumem.1".to_string(), buf));
    for sub in cmd.get_subcommands() {
        let name = format!("gpumem-{}", sub.get_name());
        let sub = sub
            .clone()
            .name(name.clone())
            .version(env!("CARGO_PKG_VERSION"));
        let mut buf = Vec::new();
        clap_mangen::Man::new(sub)
            .render(&mut buf)
            .expect("render to memory");
        pages.push((format!("{name}.1"), buf));
    }
    pages
}

/// Check gpumem's model presets against PyTorch: run every case of reference_models.py result
/// files and compare each iteration's figures.
///
/// MODELS.json is what ../shared/tools/reference_models.py writes (the ground truth
/// ../shared/groundtruth/models/models.json, or one case_NAME.json): per case, its config and,
/// per iteration, allocated bytes at the start, after forward, backward and the optimizer step,
/// at the end, and the peaks. Each case runs as a `[model]`/`[train]` preset from an empty
/// device, as PyTorch's did in a fresh process. The table gives, per case, PyTorch's peak and
/// gpumem's with the error, how many fields are exact to the byte, and the worst one. A case
/// passes when every allocated field is within 0.1% and every reserved field within 1% or
/// 2 MiB; a case gpumem cannot run (or PyTorch could not) is listed as not modelled.
#[derive(Debug, Args)]
#[command(after_long_help = "\
Exit codes:
  0  every case passes
  1  a case is off or not modelled
  2  usage, input or I/O error (an unreadable or malformed file)")]
pub struct CompareTorchArgs {
    /// Result files of reference_models.py (JSON with a "cases" list); several are compared as
    /// one list, e.g. fixtures/models/models.json fixtures/models/extra/case_*.json.
    #[arg(required = true, value_name = "MODELS.json")]
    pub models: Vec<PathBuf>,

    /// Only this case (repeatable).
    #[arg(long, value_name = "NAME")]
    pub case: Vec<String>,

    /// The simulated device's capacity (default: 80GiB).
    #[arg(long, value_name = "SIZE")]
    pub capacity: Option<String>,

    /// Print JSON (every field of every iteration) instead of the table.
    #[arg(long)]
    pub json: bool,
}
