//! Snapshots from anywhere, in one model: a gpumem snapshot (the JSON `gpumem run --snapshot`
//! writes), a PyTorch snapshot pickle (`torch.cuda.memory._dump_snapshot`, any protocol), or a
//! PyTorch snapshot saved as JSON. The format is found from the content, not the name.
//!
//! The model is the allocator's segments and blocks (as [`SegmentInfo`]) and one device's trace
//! as gpumem [`Event`]s, with call stacks interned as tag stacks: for a PyTorch snapshot each
//! frame is a tag, outermost first, Python frames as `file.py:LINE:function` and C++ frames as
//! `[C++] function` (reports fold those unless asked), and an `iter:N` tag in front when the
//! iterations are known (`iterations.rs`: annotations, repetition, or a marker function).

mod doc;
mod frames;
mod history;
mod iterations;
mod raw;
mod torch;

pub use raw::{too_many_json_values, Raw, MAX_JSON_VALUES};

use std::io::Read;
use std::path::Path;

use crate::alloc::{AllocConf, SegmentInfo};
use crate::error::Error;
use crate::trace::{Event, Tags};

pub use iterations::{iterations_from_marker, iterations_from_repetition, NoRepetition};
pub use torch::{convert_gpumem, Doc, Which, TRACE};

/// Where a snapshot came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// `gpumem run --snapshot`.
    Gpumem,
    /// `torch.cuda.memory._dump_snapshot` (pickle).
    TorchPickle,
    /// A PyTorch snapshot dict saved as JSON.
    TorchJson,
}

impl Format {
    pub fn describe(self) -> &'static str {
        match self {
            Format::Gpumem => "gpumem snapshot",
            Format::TorchPickle => "PyTorch snapshot (pickle)",
            Format::TorchJson => "PyTorch snapshot (JSON)",
        }
    }
}

/// An annotation PyTorch records around `record_function` ranges (`Optimizer.step#Adam.step`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Annotation {
    pub stage: String,
    pub name: String,
    pub time_us: u64,
}

/// A trace entry's `user_metadata` (`torch.cuda.memory._set_memory_metadata`) and
/// `compile_context` (the `torch.compile` region it was made in, with `_record_memory_history(
/// compile_context=True)`), for the entries where either is set: ids into
/// [`Snapshot::meta_strings`], 0 where unset (PyTorch writes "" and "N/A").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EntryMeta {
    /// The event's index in [`Snapshot::events`].
    pub event: u32,
    pub user_metadata: u32,
    pub compile_context: u32,
}

/// Interns the strings of [`EntryMeta`]: "" is id 0.
#[derive(Debug, Clone, Default)]
pub struct MetaStrings {
    pub strings: Vec<String>,
    by_text: rustc_hash::FxHashMap<String, u32>,
}

impl MetaStrings {
    /// The id of `text`; 0 for "" (and for "N/A", PyTorch's compile_context outside any
    /// compiled region).
    pub fn id(&mut self, text: &str) -> u32 {
        if text.is_empty() || text == "N/A" {
            return 0;
        }
        if self.strings.is_empty() {
            self.strings.push(String::new());
        }
        if let Some(&i) = self.by_text.get(text) {
            return i;
        }
        let i = self.strings.len() as u32;
        self.strings.push(text.to_string());
        self.by_text.insert(text.to_string(), i);
        i
    }

    pub fn text(&self, id: u32) -> &str {
        self.strings.get(id as usize).map_or("", |s| s.as_str())
    }
}

/// How the iterations of a trace were found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IterationSource {
    /// gpumem's own `iter:N` tags.
    Tags,
    /// The ends of `Optimizer.step` / `Optimizer.zero_grad` annotations.
    Annotations,
    /// The trace's allocation sizes repeating with a period.
    Repetition,
    /// Calls of a function the user named (`--iteration-marker`).
    Marker,
    None,
}

#[derive(Debug, Clone)]
pub struct Snapshot {
    pub format: Format,
    /// The workload or file it describes.
    pub name: String,
    /// The device whose segments and trace these are.
    pub device: u32,
    /// Devices with a trace or segments in the file.
    pub devices: Vec<u32>,
    pub segments: Vec<SegmentInfo>,
    pub events: Vec<Event>,
    /// `time_us` of each event (0 where the file has none).
    pub times: Vec<u64>,
    pub tags: Tags,
    /// Frames (tags) in PyTorch's own files or Python's standard library: a PyTorch
    /// snapshot's, from the frames' paths (tags keep only the file's name).
    pub library_frames: rustc_hash::FxHashSet<crate::trace::TagId>,
    pub conf: AllocConf,
    /// The device's memory, when the file says (gpumem snapshots do; PyTorch's do not).
    pub total_memory: Option<u64>,
    /// The CUDA context's share of it, when known.
    pub context_overhead: Option<u64>,
    pub annotations: Vec<Annotation>,
    pub iterations: IterationSource,
    /// Why the trace's repetition gave no iterations, where it was searched and gave none.
    pub iterations_why: Option<NoRepetition>,
    /// Events the recording lost (a gpumem ring's bound; PyTorch's `max_entries` is not
    /// recorded in the file).
    pub dropped: u64,
    /// Trace entries of kinds gpumem does not model (skipped), by action.
    pub skipped: Vec<(String, u64)>,
    /// The trace index of each skipped entry, ascending (see [`Snapshot::entry`]).
    pub skipped_at: Vec<u64>,
    /// Each skipped entry's action: its index in `skipped`.
    pub skipped_kind: Vec<u32>,
    /// The entries whose `user_metadata` or `compile_context` is set, in event order.
    pub entry_meta: Vec<EntryMeta>,
    pub meta_strings: MetaStrings,
    /// Segments outside the default pool: (address, PyTorch's `segment_pool_id`): (N, 0) is
    /// a CUDA graph's private pool, (0, N) a pool made with `torch.cuda.MemPool()`.
    pub segment_pools: Vec<(u64, [i64; 2])>,
}

/// How many cores read a large pickle: `GPUMEM_THREADS` when set (1: one core), else all the
/// machine has.
pub(crate) fn threads() -> usize {
    std::env::var("GPUMEM_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .min(256)
}

/// The size of the pieces a large pickle is cut into: a few per core, so that cores that
/// finish early take more.
fn chunk_bytes(len: u64, threads: usize) -> u64 {
    (len / (threads as u64 * 4)).clamp(1 << 20, 32 << 20)
}

/// Which of a file's devices is its primary one, given each device's trace length in device
/// order: the longest trace, the lowest index on a tie; `None` where no device has a trace.
/// The one rule of every command that shows or replays a single device by default.
pub fn primary_index(trace_lens: impl IntoIterator<Item = usize>) -> Option<usize> {
    trace_lens
        .into_iter()
        .enumerate()
        .filter(|&(_, n)| n > 0)
        .max_by_key(|&(i, n)| (n, std::cmp::Reverse(i)))
        .map(|(i, _)| i)
}

/// Reads any snapshot file (a large pickle on all cores: `GPUMEM_THREADS` sets how many): its
/// primary device, the one with the longest trace.
pub fn load(path: &Path) -> Result<Snapshot, Error> {
    let mut v = load_devices(path, Which::Primary)?;
    Ok(v.remove(0))
}

/// Reads the devices of a snapshot file that `which` asks for, in device order (none when
/// `Which::Device` names one the file has nothing on).
pub fn load_devices(path: &Path, which: Which) -> Result<Vec<Snapshot>, Error> {
    // below 32 MiB one core reads fast enough, in less memory
    let big = std::fs::metadata(path).is_ok_and(|m| m.len() >= 32 << 20);
    load_from(path, if big { threads() } else { 1 }, None, which)
}

/// [`load_devices`] with a large pickle read on at most `threads` cores.
pub fn load_devices_with(
    path: &Path,
    which: Which,
    threads: usize,
) -> Result<Vec<Snapshot>, Error> {
    let big = std::fs::metadata(path).is_ok_and(|m| m.len() >= 32 << 20);
    load_from(path, if big { threads.max(1) } else { 1 }, None, which)
}

/// A pickle the reader gave up on: stopped by Ctrl-C, or not readable.
fn unreadable(e: crate::trace::pickle::PickleError, bad: impl Fn(String) -> Error) -> Error {
    if crate::interrupt::requested() {
        Error::Interrupted
    } else {
        bad(format!("not a readable pickle: {e}"))
    }
}

/// A PyTorch snapshot file's document as written (a pickle read whole, or its JSON), for
/// exports that keep everything; `None` for a gpumem snapshot.
pub fn load_raw(path: &Path) -> Result<Option<Raw>, Error> {
    let read_err = |source| Error::Read {
        path: path.to_path_buf(),
        source,
    };
    let bad = |m: String| Error::input(path, "snapshot", m);
    let f = std::fs::File::open(path).map_err(read_err)?;
    let mut head = [0u8; 1];
    let n = (&f).read(&mut head).map_err(read_err)?;
    if n == 1 && pickle_start(head[0]) {
        let p = crate::trace::pickle::read_file(&f, 1, 1 << 20, None, None)
            .map_err(|e| unreadable(e, bad))?;
        return Ok(Some(Raw::Pickle(p)));
    }
    let mut f = f;
    let v = read_json(&mut f, &head[..n], read_err, bad)?;
    if v.get("format").and_then(|f| f.as_str()) == Some("gpumem-snapshot") {
        return Ok(None);
    }
    let inner = v
        .get("otherData")
        .and_then(|o| o.get("gpumem_snapshot"))
        .cloned();
    Ok(Some(Raw::Json(inner.unwrap_or(v))))
}

/// Reads a snapshot file's primary device, a pickle on `threads` cores in pieces of `chunk`
/// bytes (by default a few per core).
pub fn load_with(path: &Path, threads: usize, chunk: Option<u64>) -> Result<Snapshot, Error> {
    let mut v = load_from(path, threads, chunk, Which::Primary)?;
    Ok(v.remove(0))
}

/// The devices of a file in the pieces a device command shows: one when `device` names it
/// (a `--device` flag: an error naming the flag when the file has nothing on it), else all.
pub fn load_for_flag(path: &Path, device: Option<u32>) -> Result<Vec<Snapshot>, Error> {
    let v = load_devices(path, device.map_or(Which::All, Which::Device))?;
    if let (Some(n), true) = (device, v.is_empty()) {
        let all = load_devices(path, Which::All)?;
        let list: Vec<String> = all.iter().map(|s| format!("cuda:{}", s.device)).collect();
        return Err(Error::usage(
            "--device",
            format!(
                "{} has nothing on device {n}: it holds {}",
                path.display(),
                list.join(", ")
            ),
        ));
    }
    Ok(v)
}

/// One device of a file for a command that shows one: the `--device` flag's, else the primary.
pub fn load_one(path: &Path, device: Option<u32>) -> Result<Snapshot, Error> {
    match device {
        Some(_) => Ok(load_for_flag(path, device)?.remove(0)),
        None => load(path),
    }
}

/// [`Snapshot::entry`] from the ascending trace indexes of the skipped entries.
fn entry_of(skipped_at: &[u64], event: u64) -> u64 {
    let mut e = event;
    for &s in skipped_at {
        if s <= e {
            e += 1;
        } else {
            break;
        }
    }
    e
}

impl Snapshot {
    /// The index in the file's trace (`device_traces[device]`, as PyTorch's viewer numbers it)
    /// of event `event`: events leave out the entries gpumem does not model (`snapshot`
    /// markers, ...), so later events sit that many entries further on.
    pub fn entry(&self, event: u64) -> u64 {
        entry_of(&self.skipped_at, event)
    }

    /// For a file of several devices, which one is shown: "cuda:1 of cuda:0, cuda:1 (--device N
    /// picks which)"; `None` for a file of one.
    pub fn device_note(&self) -> Option<String> {
        (self.devices.len() > 1).then(|| {
            let all: Vec<String> = self.devices.iter().map(|d| format!("cuda:{d}")).collect();
            format!(
                "showing cuda:{} of {} (--device N picks which)",
                self.device,
                all.join(", ")
            )
        })
    }
}

/// Whether a file starting with this byte is a pickle: protocol 2+ starts with PROTO (0x80),
/// 0 and 1 with a container opcode.
fn pickle_start(b: u8) -> bool {
    matches!(b, 0x80 | b'(' | b']' | b'}')
}

/// The first bytes of a gzip stream (RFC 1952): `gpumem export -o FILE.json.gz` writes one.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// The most a gzip-compressed snapshot may expand to: far beyond any real snapshot, but a
/// bound, so a crafted stream cannot fill memory.
pub const GUNZIP_LIMIT: u64 = 16 << 30;

/// A gzip stream (every member of it) decompressed, within [`GUNZIP_LIMIT`].
fn gunzip(packed: &[u8]) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let mut out = Vec::with_capacity(packed.len().saturating_mul(8));
    flate2::read::MultiGzDecoder::new(packed)
        .take(GUNZIP_LIMIT + 1)
        .read_to_end(&mut out)?;
    if out.len() as u64 > GUNZIP_LIMIT {
        return Err(std::io::Error::other(format!(
            "it expands past {}, the most gpumem decompresses",
            crate::units::format_bytes(GUNZIP_LIMIT)
        )));
    }
    Ok(out)
}

/// The rest of a file that is not a pickle (JSON, or JSON compressed with gzip), whose first bytes are `head`, as JSON. JSON starts
/// with '{' or '[' after white space: anything else (a device of zeros, a binary file) is
/// refused before the rest is read.
fn read_json(
    f: &mut std::fs::File,
    head: &[u8],
    read_err: impl Fn(std::io::Error) -> Error,
    bad: impl Fn(String) -> Error,
) -> Result<serde_json::Value, Error> {
    let not = |why: String| {
        bad(format!(
            "neither a pickle nor JSON ({why}); gpumem reads gpumem snapshots (JSON), PyTorch \
             snapshot pickles (torch.cuda.memory._dump_snapshot) and PyTorch snapshots saved \
             as JSON, each JSON also compressed with gzip"
        ))
    };
    if head.first() == Some(&GZIP_MAGIC[0]) {
        let mut packed = head.to_vec();
        crate::input::read_rest(f, &mut packed, crate::input::Kind::Data).map_err(read_err)?;
        if !packed.starts_with(&GZIP_MAGIC) {
            return Err(not("line 1 column 1: it starts with byte 0x1f".into()));
        }
        let text = gunzip(&packed).map_err(|e| bad(format!("not readable as gzip: {e}")))?;
        return serde_json::from_slice(&text)
            .map_err(|e| not(format!("after gzip decompression: {e}")));
    }
    if let Some(&b) = head.first() {
        if !(b.is_ascii_whitespace() || b == b'{' || b == b'[') {
            return Err(not(format!(
                "line 1 column 1: it starts with byte {b:#04x}"
            )));
        }
    }
    let mut text = head.to_vec();
    crate::input::read_rest(f, &mut text, crate::input::Kind::Data).map_err(read_err)?;
    serde_json::from_slice(&text).map_err(|e| not(e.to_string()))
}

fn load_from(
    path: &Path,
    threads: usize,
    chunk: Option<u64>,
    which: Which,
) -> Result<Vec<Snapshot>, Error> {
    let start = std::time::Instant::now();
    let r = read_and_convert(path, threads, chunk, which);
    if let Ok(devices) = &r {
        for s in devices {
            tracing::debug!(
                path = %path.display(),
                format = s.format.describe(),
                device = s.device,
                segments = s.segments.len(),
                trace_events = s.events.len(),
                threads,
                ms = start.elapsed().as_millis() as u64,
                "snapshot read"
            );
        }
    }
    r
}

fn read_and_convert(
    path: &Path,
    threads: usize,
    chunk: Option<u64>,
    which: Which,
) -> Result<Vec<Snapshot>, Error> {
    let read_err = |source| Error::Read {
        path: path.to_path_buf(),
        source,
    };
    let mut f = std::fs::File::open(path).map_err(read_err)?;
    let mut head = [0u8; 1];
    let n = f.read(&mut head).map_err(read_err)?;
    // the name without its extensions: `ft.json.gz` is `ft`
    let mut stem = path.with_extension("");
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gz"))
    {
        stem = stem.with_extension("");
    }
    let name = stem
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "snapshot".into());
    let bad = |m: String| Error::input(path, "snapshot", m);
    if n == 0 {
        return Err(bad("the file is empty".into()));
    }
    if pickle_start(head[0]) {
        // a progress bar on stderr for big files, only for a person watching
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let bar =
            (len > 64 << 20 && std::io::IsTerminal::is_terminal(&std::io::stderr())).then(|| {
                let b = indicatif::ProgressBar::new(len);
                b.set_style(
                    indicatif::ProgressStyle::with_template(
                        "reading {msg} [{bar:30}] {bytes}/{total_bytes}",
                    )
                    .expect("valid template")
                    .progress_chars("=> "),
                );
                b.set_message(name.clone());
                b
            });
        let tick = |n: u64| {
            if let Some(b) = &bar {
                b.inc(n);
            }
        };
        // the parallel parts use rayon's pool: as many threads as the reader
        // (the first call sets rayon's pool; later ones keep it)
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build_global();
        let p = crate::trace::pickle::read_file(
            &f,
            threads,
            chunk.unwrap_or_else(|| chunk_bytes(len, threads)),
            Some(&torch::TRACE),
            Some(&tick),
        );
        if let Some(b) = bar {
            b.finish_and_clear();
        }
        let p = p.map_err(|e| unreadable(e, bad))?;
        let mut p = p;
        let runs = p.take_projected();
        let doc = torch::PickleDoc::new(&p, runs);
        let r = torch::convert(&doc, p.root(), Format::TorchPickle, &name, which).map_err(bad);
        return r;
    }
    let v = read_json(&mut f, &head[..n], read_err, bad)?;
    if v.get("format").and_then(|f| f.as_str()) == Some("gpumem-snapshot") {
        let s = torch::convert_gpumem(&v).map_err(bad)?;
        return Ok(match which {
            Which::Device(n) if n != s.device => Vec::new(),
            _ => vec![s],
        });
    }
    // earlier gpumem Perfetto exports carried the snapshot as PyTorch's dict
    if let Some(inner) = v.get("otherData").and_then(|o| o.get("gpumem_snapshot")) {
        return torch::convert(&torch::JsonDoc, inner, Format::TorchJson, &name, which)
            .map_err(bad);
    }
    if v.get("traceEvents").is_some() && v.get("segments").is_none() {
        return Err(bad(
            "a Chrome/Perfetto trace (such as `gpumem export --to perfetto` writes) holds memory \
             counters, not a snapshot: give the snapshot it was exported from"
                .into(),
        ));
    }
    torch::convert(&torch::JsonDoc, &v, Format::TorchJson, &name, which).map_err(bad)
}

#[cfg(test)]
mod tests {
    use super::primary_index;

    /// The longest trace wins, the lowest device on a tie, and a file without traces has no
    /// primary by this rule (its callers then take the first device with segments).
    #[test]
    fn the_primary_device_has_the_longest_trace() {
        assert_eq!(primary_index([3, 9, 2]), Some(1));
        assert_eq!(primary_index([0, 5, 5]), Some(1));
        assert_eq!(primary_index([7]), Some(0));
        assert_eq!(primary_index([0, 0]), None);
        assert_eq!(primary_index([]), None);
    }
}
