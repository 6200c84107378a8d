//! The command line, as clap definitions only. The man pages are generated from these
//! (`man/`, checked by a test), so `--help` and the man pages never disagree.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

mod docs;
mod model;
mod snapshots;
mod values;

pub use docs::{command, completion_scripts, man_pages};
pub use model::{ModelArgs, WorkloadArg};
pub use snapshots::{ExportArgs, ExportFormat, PlotArgs, ReplayArgs, SummaryArgs};
pub use values::{FailOn, ProfileBy, ProfileSort, ReportKind};

const EXIT_CODES: &str = "\
Exit codes:
  0  done
  2  usage, input or I/O error (a bad flag, an unreadable or malformed file)
  130 interrupted (Ctrl-C or SIGTERM): a file being written is left as it was";

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
Start with:\n  gpumem run --preset gpt2-small\n\
Then: gpumem summary SNAPSHOT.pickle (a snapshot PyTorch wrote); gpumem help COMMAND\n\n\
Environment: PYTORCH_CUDA_ALLOC_CONF (or PYTORCH_ALLOC_CONF) sets the allocator of every \
workload run, as in PyTorch (--alloc-conf and a workload's alloc_conf beat it); RUST_LOG \
(e.g. gpumem=debug) sets the log lines on stderr; NO_COLOR turns colour off; COLUMNS sets \
the width of tables when the output is not a terminal; GPUMEM_THREADS the cores that read \
a snapshot.",
    after_long_help = "\
Exit codes:
  0  everything asked for holds
  1  a finding you asked to fail on (--fail-on, a check that regressed, a replay mismatch)
  2  usage, input or I/O error (a bad flag, an unreadable or malformed file)
  130 interrupted (Ctrl-C or SIGTERM): a file being written is left as it was"
)]
pub struct Cli {
    /// Log what the reader, the runner and the allocator do on stderr: -v for each file,
    /// iteration and segment (debug), -vv also every op (trace). RUST_LOG overrides it.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,

    /// Colour in the output: `auto` (on a terminal, unless NO_COLOR is set), `always`, `never`.
    #[arg(long, value_enum, default_value_t = ColorWhen::Auto, global = true, value_name = "WHEN")]
    pub color: ColorWhen,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ColorWhen {
    Auto,
    Always,
    Never,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    Run(Box<RunArgs>),
    Summary(SummaryArgs),
    #[command(
        about = "Fail CI when peak memory regresses: workloads run on the simulated device (no GPU needed) against a committed baseline."
    )]
    Check(CheckArgs),
    Export(ExportArgs),
    Diff(DiffArgs),
    Fit(FitArgs),
    Plot(PlotArgs),
    #[command(
        about = "Replay a PyTorch allocator trace step by step, or a snapshot's allocations under other allocator settings (\"would this have saved my run?\")."
    )]
    Replay(ReplayArgs),
    Bench(BenchArgs),
    #[command(
        about = "Check gpumem's model presets against PyTorch: every recorded case, each iteration's figures."
    )]
    CompareTorch(CompareTorchArgs),
    #[command(
        about = "List this machine's NVIDIA GPUs: memory total, used and free, driver and CUDA versions, and the processes holding memory."
    )]
    Devices(DevicesArgs),
    #[command(
        about = "Check `--device cuda` against `--device cpu`, op by op, forward and backward, in float32 and bf16."
    )]
    Selftest(SelftestArgs),
    Completions(CompletionsArgs),
    Mcp(McpArgs),
}

/// Serve gpumem's answers to coding agents over the Model Context Protocol (stdio).
///
/// An MCP client (Claude Code, Cursor, VS Code, Codex...) starts `gpumem mcp` and speaks
/// JSON-RPC on its stdin and stdout. The tools: `summary` (a snapshot: the peak and what held
/// it, leaks, fragmentation, iterations, out-of-memory errors), `explain_oom` (why a snapshot
/// or a workload ran out of memory, with the remedies re-run), `run` and `fit` (a workload or a
/// Hugging Face config.json on the simulated GPU, with the model flags), `diff` and `check`.
/// Each returns the command's `--json` document, versioned by its `schema` key
/// ("gpumem.summary/1"), with its JSON Schema in the tool list. Paths are relative to the
/// directory the client starts the server in.
///
/// Examples:
///   claude mcp add gpumem -- gpumem mcp
///   gpumem mcp    # then, on stdin: {"jsonrpc":"2.0","id":1,"method":"initialize",...}
#[derive(Debug, Args)]
#[command(
    verbatim_doc_comment,
    after_long_help = "\
Exit codes:
  0  the client closed the connection
  2  stdin or stdout failed"
)]
pub struct McpArgs {}

/// Check `--device cuda` against `--device cpu`, op by op: every op the workloads use, run
/// through gpumem's engine on both devices from the same random non-zero inputs (strided
/// views and broadcast operands among them), in float32 and bf16, forward and then every
/// input's gradient, with the largest relative difference of each and how many of its
/// launches ran on the GPU's kernels (kernels/*.cu, compiled by NVRTC at first use and
/// cached; cuBLAS) and how many on the host twin.
///
/// The cases: fill; the pointwise unary ops; add, sub, mul and div (tensors, broadcast rows,
/// numbers); pow; copies and casts; masked_fill, where, comparisons and cat; sum and mean;
/// softmax and log_softmax; layer_norm and rms_norm; embedding; cross_entropy; linear, addmm
/// and batched matmul; scaled_dot_product_attention (causal or not); SGD, momentum, Adam and
/// AdamW steps. The tolerance is 2e-5 in float32 and two bf16 roundings (2^-7) in bf16.
///
/// Examples:
///   gpumem selftest --device cuda
///   gpumem selftest --device cuda --json
#[derive(Debug, Args)]
#[command(
    verbatim_doc_comment,
    after_long_help = "\
Exit codes:
  0  every check within its tolerance
  1  a check off its tolerance
  2  usage error, or no NVIDIA driver, GPU or NVRTC here
  130 interrupted (Ctrl-C or SIGTERM)"
)]
pub struct SelftestArgs {
    /// The device whose kernels to check: `cuda`.
    #[arg(long, value_name = "DEVICE", default_value = "cuda")]
    pub device: String,

    /// Print JSON (the GPU, and each check's op, case, dtype, values, elements,
    /// max_rel_error, worst, tolerance, ok, gpu_launches, host_launches and host_kernels).
    #[arg(long)]
    pub json: bool,
}

/// List the NVIDIA GPUs of this machine: name, memory total, used and free, the driver and
/// CUDA versions, and the processes holding memory on each (pid and bytes).
///
/// The figures are NVML's, the driver's management library (what nvidia-smi shows): "used"
/// counts every process's memory, its CUDA context and libraries included, not only what
/// PyTorch's allocator reserved. `--device cuda` runs a workload on the first of these (the
/// first of CUDA_VISIBLE_DEVICES).
///
/// Examples:
///   gpumem devices
///   gpumem devices --json
///
/// Without an NVIDIA driver it says so and exits 2; gpumem's simulated device (the default of
/// every other command) needs no GPU.
#[derive(Debug, Args)]
#[command(verbatim_doc_comment, after_long_help = EXIT_CODES)]
pub struct DevicesArgs {
    /// Print JSON (driver_version, cuda_version, gpus with memory and processes).
    #[arg(long)]
    pub json: bool,
}

/// Print a shell completion script for gpumem: every command, flag and value.
///
/// Examples:
///   gpumem completions bash > ~/.local/share/bash-completion/completions/gpumem
///   gpumem completions zsh > ~/.zfunc/_gpumem      # with fpath+=(~/.zfunc) in .zshrc
///   gpumem completions fish > ~/.config/fish/completions/gpumem.fish
///
/// The same scripts are in the repository's man/completions/, beside the man pages.
#[derive(Debug, Args)]
#[command(verbatim_doc_comment, after_long_help = EXIT_CODES)]
pub struct CompletionsArgs {
    /// The shell: bash, zsh, fish, elvish or powershell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
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
/// retain_graph) build PyTorch's reference model and loop; `[model] hf_config = "config.json"`
/// a Hugging Face model from its config (model_type llama, mistral, mixtral, qwen2, qwen3,
/// qwen3_moe, gemma, gemma2, gemma3_text, phi3, gpt2 or bert), and
/// `[model] torchvision = "resnet50"` a torchvision ResNet (image_size, num_classes).
/// Script workloads may declare integer `[params]` (e.g. `batch = 32`) and use them as names.
///
/// Prints, per iteration, allocated memory at its start, after forward and backward, at its end,
/// and the peaks; then what was live at the run's peak by category and by tag, leaks across
/// iterations, and the allocator's final state.
///
/// An out-of-memory stops the run where PyTorch would raise it. gpumem then prints PyTorch's
/// message, says whether it was capacity (the live tensors and the request do not fit) or
/// fragmentation (they would, but free memory is in pieces), shows what was live, and runs the
/// workload again under each remedy that applies (expandable_segments:True, max_split_size_mb,
/// loss.item(), no_grad, bf16 autocast, checkpointing, SGD, the batch halved down to 1), with a
/// table of their peaks and the smallest change that fits.
///
/// The allocator's settings come from --alloc-conf, else the workload's `alloc_conf`, else
/// PYTORCH_CUDA_ALLOC_CONF (or PYTORCH_ALLOC_CONF) in the environment, as PyTorch reads it;
/// the report says which.
#[derive(Debug, Args)]
#[command(after_long_help = run_after_help())]
pub struct RunArgs {
    #[command(flatten)]
    pub target: WorkloadArg,

    #[command(flatten)]
    pub model: ModelArgs,

    /// Print only the verdict line (fits, or does not and by how much) and errors.
    #[arg(short, long, conflicts_with = "json")]
    pub quiet: bool,

    /// Where to run, instead of the workload's `device`: `sim`, the simulated device (the
    /// default; sizes and addresses only, no GPU needed), `cpu` (real numbers in host memory
    /// at the same addresses: the same allocator figures, plus each iteration's loss), `cuda`
    /// (the first GPU: segments from its NVIDIA driver at its addresses, with NVML's view of
    /// the process, and the ops computed there: on the GPU where a kernel of gpumem's takes
    /// them, else on the host with the cpu device's kernels; the run lists which), or
    /// `cuda-memory` (the GPU's segments only, nothing computed: as fast as `sim`).
    #[arg(long, value_name = "DEVICE", value_parser = values::device_names())]
    pub device: Option<String>,

    /// Device memory of the simulated GPU instead of the workload's (e.g. 24GiB, 80GiB; GB is
    /// read as GiB, as a card's "24GB" means, and a bare number is refused).
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true)]
    pub capacity: Option<String>,

    /// Iterations of the body instead of the workload's.
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
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

    /// On a data device (`--device cpu`): write every named parameter's gradient, as it is
    /// just before the first optimizer step, to FILE (safetensors, float32, by state_dict
    /// name), to compare with PyTorch's.
    #[arg(long, value_name = "FILE")]
    pub save_grads: Option<PathBuf>,

    /// Set an integer parameter: a script's `[params]` entry or a preset's integer key
    /// (batch, layers, seq, d_model, ...). Repeatable.
    #[arg(long = "param", value_name = "NAME=VALUE")]
    pub params: Vec<String>,

    /// Allocator settings in PYTORCH_CUDA_ALLOC_CONF syntax instead of the workload's
    /// (e.g. "expandable_segments:True").
    #[arg(long, value_name = "CONF")]
    pub alloc_conf: Option<String>,

    /// Extra reports: `fragmentation` (per pool and segment, with fill maps, at the peak, at an
    /// out-of-memory and at the end, and over the run), `leaks` (also say why none were
    /// looked for), `all`. Comma-separated or repeated.
    #[arg(long, value_enum, value_delimiter = ',', value_name = "REPORT")]
    pub report: Vec<ReportKind>,

    /// Print a table like PyTorch profiler's `key_averages().table()`: per op (`op`), per
    /// module scope (`module`) or per phase (`annotation`), the allocations made and freed under
    /// it, the net, the largest single allocation and the bytes it held at the peak; after the
    /// verdict, instead of the report. With --json: a `profile` key with every row.
    #[arg(long, value_enum, value_name = "KEY")]
    pub by: Option<ProfileBy>,

    /// The --by table's order, largest first: `peak` (bytes held at the peak, the default),
    /// `allocated`, `freed`, `net` (the profiler's "Self CUDA Mem"), `largest`, `allocs`.
    #[arg(long, value_enum, value_name = "COLUMN", requires = "by")]
    pub sort: Option<ProfileSort>,

    /// Rows of the --by table to print (--json gives them all).
    #[arg(long, default_value_t = 20, value_name = "N", requires = "by")]
    pub top: usize,

    /// Write the memory timeline (allocated by category, stacked; reserved; iterations; the
    /// peak) as an SVG picture to FILE.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,

    /// Exit 1 when the run finds one of these: `oom`, `leak` (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',', value_name = "FINDINGS")]
    pub fail_on: Vec<FailOn>,

    /// On an out-of-memory, diagnose it but do not run the remedies.
    #[arg(long)]
    pub no_remedies: bool,
}

/// `run --help`'s end: the script language's functions (generated from the op table) and the
/// exit codes.
fn run_after_help() -> String {
    format!(
        "Examples:
  gpumem run --preset gpt2-small --capacity 8GiB
  gpumem run --preset mlp-adam --param batch=16 --plot timeline.svg
  gpumem run --preset mlp-leak --fail-on oom,leak   # exit 1, for CI
  gpumem run config.json --batch 1 --seq 2048 --dtype bf16 --lora-r 16 --capacity 24GiB

Script functions and methods (from the engine's op table; -inf, inf and nan are numbers):\n{}\n{RUN_EXIT_CODES}",
        crate::runner::script_reference()
    )
}

const RUN_EXIT_CODES: &str = "\
Exit codes:
  0  the run finished, or stopped on an out-of-memory or leaked without --fail-on asking to fail
  1  a finding named in --fail-on: an out-of-memory (oom) or a leak across iterations (leak)
  2  usage, input or I/O error (a bad flag, an unreadable or malformed workload)
  130 interrupted (Ctrl-C or SIGTERM): a file being written is left as it was";

/// Fail CI when peak memory regresses: run workloads on the simulated device (no GPU needed)
/// and compare their memory with a committed baseline.
///
/// Each INPUT is a workload (`.toml`, run now on the simulated device, deterministically) or a
/// snapshot (gpumem's JSON, or PyTorch's pickle or JSON, e.g. recorded on a GPU runner). Its
/// metrics are compared with the baseline entry of the same name (a workload's `name`, a
/// snapshot's file name without extension):
///
///   peak_allocated, peak_reserved   the run's highest allocated and reserved bytes
///   CATEGORY_at_peak                what each category (parameter, gradient, optimizer_state,
///                                   activation, temporary, input, workspace; `other` in
///                                   snapshots without categories) held at the allocated peak
///   leak_per_iteration              bytes left behind per iteration (a new leak regresses)
///   oom                             whether it ran out of memory (peaks are then up to the
///                                   failure; an out-of-memory the baseline did not have
///                                   regresses)
///
/// A metric regresses when now > baseline + floor(baseline * tolerance): exactly at the limit
/// passes, one byte over fails. Tolerances are exact percentages (`2%`, `0.5%`, `0`); the
/// default is 0 for the totals (peak_allocated, peak_reserved, ...), since the simulator is
/// deterministic, and 1% with at least 1 MiB for each CATEGORY_at_peak (categories move
/// between each other when an op is renamed or reordered). Budgets are absolute limits
/// (`max_peak_reserved = "20GiB"`), checked whatever the baseline says, also at the byte.
/// Sizes are strings with binary units ("20GiB", "512MiB") or integers in bytes.
///
/// Where tolerances and budgets come from, the first that sets one for a metric wins:
///   1. the command line: --tolerance 2% (all metrics) or --tolerance peak_reserved=1%,
///      --budget peak_reserved=20GiB
///   2. the workload's [check] table: tolerance = "2%", peak_reserved_tolerance = "1%",
///      max_peak_reserved = "20GiB", max_peak_allocated = 1073741824
///   3. the baseline entry's "check" object, with the same keys (kept by --update)
///   4. tolerance 0 (CATEGORY_at_peak: 1%, at least 1 MiB), no budget
///
/// Within one source a metric's own key beats the source's `tolerance`.
///
/// The baseline is JSON: {"gpumem_baseline": 1, "entries": {NAME: {...}}}, each entry with
/// its metrics in bytes, the categories and tag stacks at the peak (so a later regression can
/// say what grew), and the gpumem version that recorded it. `--update` writes it (atomically,
/// keys sorted, one value per line, so a change reads well in review), keeping the entries of
/// inputs not given and every entry's "check" settings. An input the baseline has no entry
/// for fails ("not in the baseline") unless --allow-new; entries no input names are ignored.
/// An entry may hold only a "check" object: then only its budgets are checked (a snapshot
/// checked against a budget, for instance).
///
/// The table lists failing rows first, each failure followed by the categories and tag
/// stacks that grew most since the baseline. --markdown prints the report for a pull-request
/// comment; --junit writes JUnit XML (one test case per input and metric); when the
/// environment has GITHUB_ACTIONS=true, GitHub Actions annotations (::error, ::notice,
/// ::warning) follow the report on stdout (not with --json).
///
/// Examples:
///   gpumem check preset:mlp-adam preset:gpt2-small --baseline gpumem-baseline.json --update
///   gpumem check workloads/*.toml --baseline gpumem-baseline.json --junit report.xml
///   gpumem check train.toml --baseline b.json --tolerance 2% --tolerance peak_reserved=0
///   gpumem check snapshot.pickle --budget peak_reserved=20GiB
///   gpumem check config.json --batch 4 --seq 1024 --budget peak_reserved=20GiB
#[derive(Debug, Args)]
#[command(
    verbatim_doc_comment,
    after_long_help = "\
Exit codes:
  0  every metric of every input holds (or --update wrote the baseline)
  1  a metric regressed, a budget is exceeded, or an input is not in the baseline
  2  usage, input or I/O error (a bad flag, tolerance or size; a missing or malformed
     baseline; an unreadable workload or snapshot)
  130 interrupted (Ctrl-C or SIGTERM): a file being written is left as it was"
)]
pub struct CheckArgs {
    /// Workloads (.toml) and snapshots (gpumem JSON, PyTorch pickle or JSON) to check.
    #[arg(required = true, value_name = "INPUT")]
    pub inputs: Vec<PathBuf>,

    /// With a Hugging Face config.json among the inputs: its model and loop, as `gpumem run`
    /// takes them.
    #[command(flatten)]
    pub model: ModelArgs,

    /// Print only the verdict line (passed, or what failed) and errors.
    #[arg(short, long, conflicts_with_all = ["json", "markdown"])]
    pub quiet: bool,

    /// Run workloads on this device instead of the workload's: `sim` (the default), `cpu`,
    /// `cuda` (the GPU's segments, the ops computed there) or `cuda-memory` (the GPU's segments
    /// only); see `gpumem run --help`.
    #[arg(long, value_name = "DEVICE", value_parser = values::device_names())]
    pub device: Option<String>,

    /// The baseline file (JSON). Without --update (or --allow-new) it must exist. Without
    /// --baseline only budgets are checked (--budget, or the workload's [check] table).
    #[arg(long, value_name = "FILE")]
    pub baseline: Option<PathBuf>,

    /// Write the baseline instead of checking: record every input's metrics (creating the
    /// file if needed), keep other entries and every entry's "check" settings; exit 0.
    /// (Tolerances and budgets are set in the workload's [check] table or the entry's
    /// "check" object, not recorded from the command line.)
    #[arg(long, conflicts_with_all = ["allow_new", "tolerance", "budget", "junit", "markdown"])]
    pub update: bool,

    /// Pass inputs that have no baseline entry (reported as new) instead of failing them.
    #[arg(long)]
    pub allow_new: bool,

    /// A tolerance: `2%` for every metric, or METRIC=PERCENT for one (e.g. peak_reserved=1%).
    /// Repeatable; beats the workload's [check] table and the baseline's settings.
    #[arg(long, value_name = "[METRIC=]PERCENT", allow_hyphen_values = true)]
    pub tolerance: Vec<String>,

    /// A budget: METRIC=SIZE (e.g. peak_reserved=20GiB or peak_allocated=1073741824). At the
    /// budget passes, one byte over fails. Repeatable.
    #[arg(long, value_name = "METRIC=SIZE")]
    pub budget: Vec<String>,

    /// Set a workload's integer parameter for this check (e.g. batch=64), as `gpumem run
    /// --param` does; applies to every workload given, each of which must have it. Repeatable.
    #[arg(long = "param", value_name = "NAME=VALUE")]
    pub params: Vec<String>,

    /// Also write JUnit XML to FILE (atomically): a <testcase classname="INPUT" name="METRIC">
    /// per input and metric, with a <failure> in each that fails.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,

    /// Print the report as markdown (for a pull-request comment) instead of the table.
    #[arg(long, conflicts_with = "json")]
    pub markdown: bool,

    /// Print JSON (every row with its verdict, limit and what grew) instead of the table.
    #[arg(long)]
    pub json: bool,

    /// How many categories and tag stacks to list under each regression.
    #[arg(
        long,
        default_value_t = 3,
        value_name = "N",
        allow_hyphen_values = true
    )]
    pub top: usize,
}

/// Compare two snapshots or runs: peaks, categories, allocation sites, segments.
///
/// A and B are snapshots (gpumem's or PyTorch's) or workload files (run on the simulated
/// device). The table gives each figure for A and B and the change, largest changes first;
/// `--markdown` prints GitHub-flavoured markdown for a pull-request comment.
///
/// Example:
///   gpumem diff before.pickle after.pickle --markdown
#[derive(Debug, Args)]
#[command(verbatim_doc_comment, after_long_help = EXIT_CODES)]
pub struct DiffArgs {
    /// The first snapshot or workload (before).
    pub a: PathBuf,
    /// The second snapshot or workload (after).
    pub b: PathBuf,

    /// With a Hugging Face config.json as A or B: its model and loop, as `gpumem run` takes
    /// them (both sides alike).
    #[command(flatten)]
    pub model: ModelArgs,

    /// How many sites to list.
    #[arg(
        long,
        default_value_t = 10,
        value_name = "N",
        allow_hyphen_values = true
    )]
    pub top: usize,

    /// Print markdown tables (for a pull-request comment).
    #[arg(long, conflicts_with = "json")]
    pub markdown: bool,

    /// Print JSON.
    #[arg(long)]
    pub json: bool,

    /// For a snapshot of several GPUs: the device to show (the N of cuda:N; default: the one
    /// with the longest trace).
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pub device: Option<u32>,
}

/// Find the largest batch size (or another integer parameter) that fits on a device.
///
/// Runs the workload on the simulated device again and again, doubling the parameter from its
/// value in the workload until it runs out of memory, then bisecting, so the answer is exact:
/// the value fits and the value plus one does not. Then the same search under each remedy
/// that applies (expandable_segments:True, max_split_size_mb, bf16 autocast, checkpointing,
/// SGD, ...), so you see what each buys. This is "halve the batch until it fits", done in
/// milliseconds and without a GPU.
///
/// `--param new_tokens` (a generation's length; with a bare config it implies --mode
/// generate) needs no search: a shorter generation runs a longer one's first steps, so one
/// run to --max finds the first token that does not fit. Once a few decode steps agree on
/// their allocations, the rest are replayed on the allocator alone (the same mallocs and
/// frees, the small pool's skipped where it provably repeats itself): exact to the byte and
/// about 7x faster than the engine. Where that run would still take more than a few seconds
/// it is stopped then, and the answer is "at least" what it generated by then (that many
/// fit), with an estimate from the KV cache's bytes per token beside it (--exact runs it to
/// the end).
///
/// Example:
///   gpumem fit --preset gpt2-small --capacity 24GiB
///   gpumem fit config.json --seq 2048 --dtype bf16 --lora-r 16 --capacity 24GiB
///   gpumem fit config.json --param new_tokens --seq 512 --dtype bf16 --capacity 24GiB
#[derive(Debug, Args)]
#[command(
    verbatim_doc_comment,
    after_long_help = "\
Exit codes:
  0  the search finished (even when nothing fits)
  2  usage, input or I/O error
  130 interrupted (Ctrl-C or SIGTERM): a file being written is left as it was"
)]
pub struct FitArgs {
    #[command(flatten)]
    pub target: WorkloadArg,

    #[command(flatten)]
    pub model: ModelArgs,

    /// Print only the verdict line and errors.
    #[arg(short, long, conflicts_with = "json")]
    pub quiet: bool,

    /// Run every trial on this device instead of the simulated one: `sim` (the default), `cpu`,
    /// `cuda` (the GPU's segments, every trial computed there: slow) or `cuda-memory` (the
    /// GPU's segments only, the figures of `cuda`); see `gpumem run --help`.
    #[arg(long, value_name = "DEVICE", value_parser = values::device_names())]
    pub device: Option<String>,

    /// The device's memory (e.g. 24GiB; GB is read as GiB); default: the workload's capacity,
    /// or 80 GiB.
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true)]
    pub capacity: Option<String>,

    /// The integer parameter to search (default: batch, or batch_size).
    #[arg(long, value_name = "NAME")]
    pub param: Option<String>,

    /// The largest value to try (default 65536; for `--param new_tokens`, what is left of the
    /// model's max_position_embeddings after the prompt).
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pub max: Option<i64>,

    /// Iterations of each run instead of the workload's (fewer is faster; a leak needs more).
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pub iterations: Option<u32>,

    /// Only the workload as it is, no remedies.
    #[arg(long)]
    pub no_remedies: bool,

    /// With `--param new_tokens`: always simulate to the boundary, however long that takes.
    /// By default the simulation stops after a few seconds: with one generation per run
    /// (`--iterations 1`) the answer is then a lower bound, marked "at least", with the KV
    /// cache's estimate beside it; over several iterations (a later one may run out where the
    /// first fits) it is that estimate alone, marked "about", which leaves out the allocator's
    /// slack and may be a few percent off (Llama-3.1-8B on 24 GiB: about 67,671 where 66,049
    /// is exact; Qwen2.5-0.5B at batch 64 on 8 GiB: about 6,803 where 6,913 is). About 100 us per
    /// generated token for a 7B model at batch 1 on a 2-core machine: 91,649 tokens on 20 GiB
    /// in 9 s with --iterations 1 -q (each remedy's search costs as much again).
    #[arg(long)]
    pub exact: bool,

    /// Print JSON: `max_fitting` per remedy, with the peaks at that value.
    #[arg(long)]
    pub json: bool,
}

/// Measure the allocator: ns per alloc+free pair with event recording on and off.
///
/// Runs the two patterns that gpumem's developers timed on PyTorch's own allocator (an H200,
/// PyTorch 2.11, recorded in fixtures/groundtruth/alloc_bench.json and built into gpumem) with
/// the same size lists in the same order: `pairs` (alloc then free at once, cycling over 64
/// sizes) and `batch` (allocate 256 blocks, then free them in the order i*7919 mod 256); the
/// table shows PyTorch's times beside as ratios. --pytorch FILE compares with another such
/// recording: JSON with `sizes_pairs`, `sizes_batch` and, for recording off and on, `plain`
/// and `recording`, each {"pairs_ns": [...], "batch_ns": [...]}.
///
/// Examples:
///   gpumem bench
///   gpumem bench --workload preset:gpt2-small
#[derive(Debug, Args)]
#[command(verbatim_doc_comment, after_long_help = EXIT_CODES)]
pub struct BenchArgs {
    /// With --workload: run it on this device instead of the workload's: `sim` (the default),
    /// `cpu`, `cuda` (the GPU's segments, the ops computed there) or `cuda-memory` (the GPU's
    /// segments only); see `gpumem run --help`.
    #[arg(long, value_name = "DEVICE", value_parser = values::device_names())]
    pub device: Option<String>,

    /// Repetitions of each pattern (each is timed; the median is reported), 1 to 100.
    #[arg(
        long,
        default_value_t = 5,
        value_name = "N",
        allow_hyphen_values = true
    )]
    pub repeat: usize,

    /// Passes over the size list per `pairs` repetition (at most 100,000).
    #[arg(
        long,
        default_value_t = 2000,
        value_name = "N",
        allow_hyphen_values = true
    )]
    pub pairs_reps: usize,

    /// Passes over the size list per `batch` repetition (at most 100,000).
    #[arg(
        long,
        default_value_t = 500,
        value_name = "N",
        allow_hyphen_values = true
    )]
    pub batch_reps: usize,

    /// Milliseconds of untimed work first, so the CPU is at speed when timing starts (at most
    /// 60000).
    #[arg(
        long,
        default_value_t = 1000,
        value_name = "MS",
        allow_hyphen_values = true
    )]
    pub warmup_ms: u64,

    /// PyTorch's results (JSON, as above) to compare against; its size lists are used.
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

/// Check gpumem's model presets against PyTorch: run every recorded case and compare each
/// iteration's figures.
///
/// MODELS.json holds cases recorded from PyTorch by running each model preset's reference
/// PyTorch code on a GPU (gpumem's repository keeps them: fixtures/models/models.json, and one
/// case_NAME.json per case): per case, its config and, per iteration, allocated bytes at the
/// start, after forward, backward and the optimizer step, at the end, and the peaks. Each case runs as a `[model]`/`[train]` preset from an empty
/// device, as PyTorch's did in a fresh process. The table gives, per case, PyTorch's peak and
/// gpumem's with the error, how many fields are exact to the byte, and the worst one. A case
/// passes when every allocated field is within 0.1% and every reserved field within 1% or
/// 2 MiB; a case gpumem cannot run (or PyTorch could not) is listed as not modelled.
#[derive(Debug, Args)]
#[command(after_long_help = "\
Exit codes:
  0  every case passes
  1  a case is off or not modelled
  2  usage, input or I/O error (an unreadable or malformed file)
  130 interrupted (Ctrl-C or SIGTERM): a file being written is left as it was")]
pub struct CompareTorchArgs {
    /// Result files of reference_models.py (JSON with a "cases" list); several are compared as
    /// one list, e.g. fixtures/models/models.json fixtures/models/extra/case_*.json.
    #[arg(required = true, value_name = "MODELS.json")]
    pub models: Vec<PathBuf>,

    /// Only this case (repeatable).
    #[arg(long, value_name = "NAME")]
    pub case: Vec<String>,

    /// The simulated device's capacity (default: 80GiB).
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true)]
    pub capacity: Option<String>,

    /// Print JSON (every field of every iteration) instead of the table.
    #[arg(long)]
    pub json: bool,
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// `gpumem --help` lists each command with a one-line description: a multi-line `about`
    /// (a doc comment's first paragraph, kept verbatim) breaks the list's wrapping.
    #[test]
    fn every_command_has_a_one_line_about() {
        for c in super::Cli::command().get_subcommands() {
            let about = c.get_about().map(|a| a.to_string()).unwrap_or_default();
            assert!(!about.is_empty(), "{} has no description", c.get_name());
            assert!(
                !about.contains('\n'),
                "{}'s description spans lines: {about:?}",
                c.get_name()
            );
        }
    }
}
