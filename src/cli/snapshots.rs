//! The arguments of the commands that read snapshots (PyTorch's pickles and gpumem's own):
//! `summary`, `export`, `plot` and `replay`.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

use super::{FailOn, ProfileBy, ProfileSort, EXIT_CODES};

/// Summarize a memory snapshot: gpumem's, or one PyTorch wrote.
///
/// FILE is a gpumem snapshot (`gpumem run --snapshot`), a PyTorch snapshot pickle
/// (`torch.cuda.memory._record_memory_history()` then `torch.cuda.memory._dump_snapshot(F)`,
/// any pickle protocol), or a PyTorch snapshot saved as JSON; the format is read from the
/// content. Prints the allocator's state (reserved, allocated, active, requested,
/// inactive_split, by pool), what is live by allocation site (Python frames, innermost first;
/// C++ frames folded unless --stacks), fragmentation per segment, and from the trace: the peak
/// and who held memory then, leaks across iterations and each out-of-memory. The reader never
/// runs code from a pickle: anything that would import or call Python is refused.
///
/// Iterations come from --iteration-marker, else the Optimizer.step/zero_grad annotations,
/// else the trace repeating itself as a whole: a pass begins where the Python frames show the
/// loop going back to its top, and the warm-up pass joins the setup as the first iteration.
/// Repeats that free more than they make (a backward's layers), that all run inside one call
/// of a module (a forward's layers) or that each move a module onto the device (a
/// layer-by-layer loop) are not iterations; the report then says why.
///
/// A snapshot of several GPUs (one process driving cuda:0, cuda:1, ...) is reported device by
/// device, with a table of all of them first; `--device N` shows one. Out-of-memory errors and
/// leaks on any device count for --fail-on.
///
/// Several files (one per rank of a distributed job: `gpumem summary rank*.pickle`) give one
/// row per rank and device, then the largest, the smallest and the spread of each column; the
/// files are read side by side, a few at a time, so memory stays bounded however many there
/// are.
///
/// A large pickle is read, and its trace analysed, on all cores (a 1 GB snapshot in well
/// under a second on 16); set GPUMEM_THREADS=N to use N (1: one core).
///
/// Examples:
///   gpumem summary snapshot.pickle   # what torch.cuda.memory._dump_snapshot() wrote
///   gpumem summary snapshot.pickle --device 1
///   gpumem summary rank*.pickle --fail-on oom
#[derive(Debug, Args)]
#[command(
    verbatim_doc_comment,
    after_long_help = "\
Exit codes:
  0  the snapshot was read (findings are reported, not failed on, without --fail-on)
  1  a finding named in --fail-on: an out-of-memory in the trace (oom) or a leak (leak), on any device of any file
  2  usage, input or I/O error (an unreadable, malformed or unsafe file)
  130 interrupted (Ctrl-C or SIGTERM): a file being written is left as it was"
)]
pub struct SummaryArgs {
    /// The snapshot file, or several (one per rank).
    #[arg(required = true, num_args = 1.., value_name = "SNAPSHOT")]
    pub snapshots: Vec<PathBuf>,

    /// Print only the verdict line (an out-of-memory and where, or the peak) and errors.
    #[arg(short, long, conflicts_with = "json")]
    pub quiet: bool,

    /// Show only this device (the N of cuda:N) of a snapshot that holds several.
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pub device: Option<u32>,

    /// Show whole call stacks, C++ frames included; one snapshot only.
    #[arg(long)]
    pub stacks: bool,

    /// Iterations are the calls of this function (e.g. train_step, or train.py:42): one starts
    /// at each allocation made inside a call, after allocations made outside. Beats the
    /// Optimizer.step annotations and repetition; for traces that have neither.
    #[arg(long, value_name = "FUNCTION")]
    pub iteration_marker: Option<String>,

    /// How many sites (or --by rows) to list [default: 10]; one snapshot only.
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pub top: Option<usize>,

    /// With several files (one per rank): the ranks whose peak reserved memory exceeds this
    /// capacity ("80GiB"; GB is read as GiB), and the rank that runs out first as memory shrinks (the highest peak
    /// reserved). Reserved memory only: NCCL's buffers and the CUDA context come on top.
    #[arg(long, value_name = "BYTES")]
    pub capacity: Option<String>,

    /// Print JSON (reserved_bytes, allocated_bytes, segments, peak_allocated_bytes, leaks, ...).
    #[arg(long)]
    pub json: bool,

    /// Print a table like PyTorch profiler's `key_averages().table()` for one snapshot:
    /// per `op` (innermost aten op, else Python function), `module` (the chain of lines that
    /// called nn.Modules), `line` (the innermost line outside PyTorch and Python's standard
    /// library: your model's or script's) or `annotation` (record_function ranges), the
    /// allocations made and freed under it, the net, the largest single allocation and the
    /// bytes it held at the peak; --top rows, after the verdict, instead of the report. With
    /// --json: a `profiles` key (one per device) with every row.
    #[arg(long, value_enum, value_name = "KEY")]
    pub by: Option<ProfileBy>,

    /// The --by table's order, largest first: `peak` (bytes held at the peak, the default),
    /// `allocated`, `freed`, `net` (the profiler's "Self CUDA Mem"), `largest`, `allocs`.
    #[arg(long, value_enum, value_name = "COLUMN", requires = "by")]
    pub sort: Option<ProfileSort>,

    /// Exit 1 when the snapshot shows one of these: `oom`, `leak`.
    #[arg(long, value_enum, value_delimiter = ',', value_name = "FINDINGS")]
    pub fail_on: Vec<FailOn>,
}

impl SummaryArgs {
    /// `--top`, 10 where not given.
    pub fn top(&self) -> usize {
        self.top.unwrap_or(10)
    }
}

/// Write a snapshot in another tool's format.
///
/// `--to memory-viz` writes PyTorch's snapshot dict as a pickle, which PyTorch's memory viewer
/// (https://pytorch.org/memory_viz) and `python -m torch.cuda._memory_viz` read; `--to
/// torch-json` the same dict as JSON; `--to perfetto` a Chrome trace with, per device, a
/// memory counter track per category and one for reserved memory, which
/// https://ui.perfetto.dev opens. gpumem reads the first two back (`gpumem summary`).
///
/// Every device of the file is exported. A PyTorch snapshot loses nothing: to memory-viz, a
/// pickle is copied as it is; otherwise its own document is converted value by value (every
/// key, frames as frames, nothing added). A gpumem snapshot becomes PyTorch's dict, its tags as
/// frames of file `gpumem`.
///
/// JSON has no way to share a value, so a frame list that the pickle keeps once is written out
/// at every entry that uses it: torch-json can be 50 times the pickle. An output named `.gz`
/// (`-o snapshot.json.gz`) is written compressed with gzip, which stores the repeats almost
/// for free; `gpumem summary` and Python's `gzip.open` read it back.
///
/// Examples:
///   gpumem run w.toml --snapshot run.json && gpumem export run.json --to memory-viz -o snap.pickle
///   gpumem export snapshot.pickle --to torch-json -o snapshot.json.gz
#[derive(Debug, Args)]
#[command(verbatim_doc_comment, after_long_help = EXIT_CODES)]
pub struct ExportArgs {
    /// The snapshot (gpumem JSON, or PyTorch pickle or JSON).
    pub snapshot: PathBuf,

    /// The format to write.
    #[arg(long, value_enum)]
    pub to: ExportFormat,

    /// Where to write it (atomically); a name ending in `.gz` is written compressed with gzip
    /// (torch-json and perfetto).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ExportFormat {
    /// PyTorch's snapshot pickle (memory_viz).
    MemoryViz,
    /// PyTorch's snapshot dict as JSON.
    TorchJson,
    /// A Chrome/Perfetto trace with memory counters.
    Perfetto,
}

/// Draw the memory timeline of a snapshot as an SVG picture.
///
/// For a gpumem snapshot (`gpumem run --snapshot FILE`): allocated memory by category
/// (parameters, gradients, optimizer state, activations, temporaries, inputs, workspaces) as
/// stacked areas over the allocator's events, reserved memory as a line, iteration starts, and
/// the peak. For a PyTorch snapshot: the same over its trace, stacked by the allocation sites
/// (innermost Python frame) that held most at the peak, with what was allocated before the
/// trace started as its own band.
///
/// Example:
///   gpumem run w.toml --snapshot snap.json && gpumem plot snap.json -o timeline.svg
#[derive(Debug, Args)]
#[command(verbatim_doc_comment, after_long_help = EXIT_CODES)]
pub struct PlotArgs {
    /// The snapshot (gpumem JSON, or PyTorch pickle or JSON).
    pub snapshot: PathBuf,

    /// Where to write the SVG.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: PathBuf,

    /// Points kept along the x axis: each is the highest memory of its stretch of events, so
    /// spikes such as the peak stay visible.
    #[arg(
        long,
        default_value_t = 300,
        value_name = "N",
        allow_hyphen_values = true
    )]
    pub samples: usize,

    /// For a snapshot of several GPUs: the device to show (the N of cuda:N; default: the one
    /// with the longest trace).
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pub device: Option<u32>,

    /// For a PyTorch snapshot: iterations are the calls of this function (as in `gpumem
    /// summary --iteration-marker`), marked on the time axis.
    #[arg(long, value_name = "FUNCTION")]
    pub iteration_marker: Option<String>,
}

/// Replay a recorded PyTorch allocator trace and compare every step with PyTorch; or replay a
/// snapshot's allocations under other allocator settings ("would this have saved my run?").
///
/// With a snapshot (gpumem's, or PyTorch's pickle or JSON) and --alloc-conf, the snapshot's
/// recorded allocations and frees run through gpumem's allocator with those settings, and the
/// table compares recorded and replayed: peak reserved, peak allocated, fragmentation, and
/// out-of-memory errors avoided or caused (exit 1 when the replay still runs out):
///
///   gpumem replay snapshot.pickle --alloc-conf expandable_segments:True
///
/// A snapshot does not record its GPU's memory (except at an out-of-memory): without
/// --capacity the replay has no limit and out-of-memory errors are not judged.
///
/// An allocator trace is JSON recorded from PyTorch by running a list of raw allocations on a
/// GPU (fixtures/allocator/*.json in gpumem's repository are such recordings): `ops`
/// (["a", id, size], ["f", id], ["e"] for empty_cache), what PyTorch's memory_stats() said
/// after each op (`after_columns`, `after`), the ops that raised out-of-memory (`ooms`), the
/// final `memory_stats()` (`stats_end`) and its device trace (`trace`). gpumem runs the ops on a
/// simulated device of `device_total_memory` bytes with the trace's `memory_fraction` and
/// `alloc_conf`, and compares after every op:
///
///   gpumem replay trace.json
///
/// Segment addresses are taken from the trace's `segment_alloc` entries, so best-fit ties
/// between equal-size blocks fall as they did on the GPU. With --alloc-conf other than the
/// recording's, a trace is a what-if too: recorded peaks and out-of-memory errors against the
/// replay's.
#[derive(Debug, Args)]
#[command(after_long_help = "\
Exit codes:
  0  a trace: every step matches PyTorch's recording; a what-if: the replay does not run out
     of memory
  1  a trace: a step differs from the recording; a what-if: the replay runs out of memory
  2  usage, input or I/O error (a bad flag, an unreadable or malformed file)
  130 interrupted (Ctrl-C or SIGTERM): a file being written is left as it was")]
pub struct ReplayArgs {
    /// The allocator trace (JSON), or a snapshot (gpumem JSON, PyTorch pickle or JSON).
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
    #[arg(
        long,
        default_value_t = 5,
        value_name = "N",
        allow_hyphen_values = true
    )]
    pub max_mismatches: usize,

    /// Use the simulator's own segment addresses (its model of the CUDA driver's address
    /// space) instead of the trace's; the event trace is then compared without addresses.
    #[arg(long)]
    pub no_trace_addresses: bool,

    /// For a snapshot: what the allocator may use (e.g. 79GiB). Default: the gpumem
    /// snapshot's device, or what a PyTorch trace's out-of-memory entries show.
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true)]
    pub capacity: Option<String>,

    /// For a snapshot of several GPUs: the device to show (the N of cuda:N; default: the one
    /// with the longest trace).
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pub device: Option<u32>,
}
