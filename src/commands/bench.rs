//! `gpumem bench`: ns per alloc+free pair of the allocator, on PyTorch's benchmark patterns.

use std::hint::black_box;
use std::io::Write;
use std::time::Instant;

use serde::Deserialize;

use crate::alloc::{AllocConf, SimAllocator, SimSource, DEFAULT_CONTEXT_OVERHEAD};
use crate::analysis::groundtruth::H200_TOTAL_MEMORY;
use crate::cli::BenchArgs;
use crate::commands::Outcome;
use crate::error::{Error, Result};
use crate::report::bench::{write_text, BenchRow};
use crate::trace::Recorder;

/// PyTorch's results on the H200 machine, with the size lists it used.
const RECORDED: &str = include_str!("../../fixtures/groundtruth/alloc_bench.json");

#[derive(Deserialize)]
struct TorchTimes {
    pairs_ns: Vec<f64>,
    batch_ns: Vec<f64>,
}

#[derive(Deserialize)]
struct TorchBench {
    sizes_pairs: Vec<u64>,
    sizes_batch: Vec<u64>,
    plain: Option<TorchTimes>,
    recording: Option<TorchTimes>,
}

/// The ring PyTorch's benchmark records into (`max_entries=100_000`).
const RING: usize = 100_000;

fn allocator(recording: bool) -> SimAllocator {
    let mut a = SimAllocator::new(
        AllocConf::default(),
        SimSource::new(H200_TOTAL_MEMORY, DEFAULT_CONTEXT_OVERHEAD),
    );
    let mut r = Recorder::new(RING);
    r.enabled = recording;
    a.set_recorder(r);
    a
}

/// Alloc then free at once, cycling over `sizes`; ns per pair.
pub fn bench_pairs(a: &mut SimAllocator, sizes: &[u64], reps: usize) -> f64 {
    for &s in sizes {
        let p = a.malloc(s, 0).expect("fits");
        a.free(p).expect("live");
    }
    let t0 = Instant::now();
    for _ in 0..reps {
        for &s in sizes {
            let p = a.malloc(black_box(s), 0).expect("fits");
            a.free(black_box(p)).expect("live");
        }
    }
    t0.elapsed().as_nanos() as f64 / (reps * sizes.len()) as f64
}

/// Allocate all of `sizes`, then free them in the order i*7919 mod n; ns per pair.
///
/// The order is computed before the clock starts: a 64-bit division per free costs tens of
/// cycles, which is noise beside PyTorch's microseconds but not beside gpumem's nanoseconds,
/// and it measures the harness, not the allocator.
pub fn bench_batch(a: &mut SimAllocator, sizes: &[u64], reps: usize) -> f64 {
    let n = sizes.len();
    let order: Vec<usize> = (0..n).map(|i| (i * 7919) % n).collect();
    let mut p = vec![0u64; n];
    for (i, &s) in sizes.iter().enumerate() {
        p[i] = a.malloc(s, 0).expect("fits");
    }
    for &x in &p {
        a.free(x).expect("live");
    }
    let t0 = Instant::now();
    for _ in 0..reps {
        for (i, &s) in sizes.iter().enumerate() {
            p[i] = a.malloc(black_box(s), 0).expect("fits");
        }
        for &i in &order {
            a.free(black_box(p[i])).expect("live");
        }
    }
    t0.elapsed().as_nanos() as f64 / (reps * n) as f64
}

/// `gpumem bench --workload FILE`: how long simulating the workload takes.
fn bench_workload(
    path: &std::path::Path,
    args: &BenchArgs,
    out: &mut dyn Write,
) -> Result<Outcome> {
    use crate::runner::{run as run_workload, RunOptions};
    let w = crate::workload::load_with(path, &super::parse_overrides(&[], None)?)?;
    let iters = w.iterations.max(1);
    let opts = |n: u32| RunOptions {
        deadline: None,
        fast_forward: false,
        capacity: None,
        iterations: Some(n),
        device: args.device.clone(),
    };
    let mut per_iter_ms = Vec::new();
    let mut events = 0u64;
    for _ in 0..args.repeat {
        // a run of iters + 1 iterations minus a run of 1 is iters iterations, without setup
        let t0 = Instant::now();
        let full = run_workload(&w, path, &opts(iters + 1))?;
        let full_ms = t0.elapsed().as_secs_f64() * 1e3;
        let t1 = Instant::now();
        let one = run_workload(&w, path, &opts(1))?;
        let one_ms = t1.elapsed().as_secs_f64() * 1e3;
        per_iter_ms.push(((full_ms - one_ms) / iters as f64).max(0.0));
        events = (full.allocator.recorder().ring.total() - one.allocator.recorder().ring.total())
            / iters as u64;
    }
    let med = crate::report::bench::median(&per_iter_ms);
    if args.json {
        let v = serde_json::json!({"workload": path.display().to_string(), "ms_per_iteration": per_iter_ms,
            "median_ms_per_iteration": med, "allocator_events_per_iteration": events});
        serde_json::to_writer_pretty(&mut *out, &v).map_err(std::io::Error::from)?;
        writeln!(out)?;
    } else {
        writeln!(
            out,
            "{}: {:.2} ms per iteration (median of {}), {} allocator events per iteration ({:.0} ns per event)",
            path.display(),
            med,
            per_iter_ms.len(),
            events,
            med * 1e6 / events.max(1) as f64
        )?;
    }
    Ok(Outcome::Ok)
}

pub fn run(args: &BenchArgs, out: &mut dyn Write) -> Result<Outcome> {
    // bounded, so that a slip of the keyboard is an error rather than a run of days
    for (flag, n, max) in [
        ("--repeat", args.repeat, 100),
        ("--pairs-reps", args.pairs_reps, 100_000),
        ("--batch-reps", args.batch_reps, 100_000),
    ] {
        if !(1..=max).contains(&n) {
            return Err(Error::usage(
                flag,
                format!("must be from 1 to {max}, found {n}"),
            ));
        }
    }
    if args.warmup_ms > 60_000 {
        return Err(Error::usage(
            "--warmup-ms",
            format!("must be at most 60000 (a minute), found {}", args.warmup_ms),
        ));
    }
    if let Some(w) = &args.workload {
        return bench_workload(w, args, out);
    }
    if args.device.is_some() {
        return Err(Error::usage(
            "--device",
            "applies to --workload runs; the allocator patterns run on the simulated device",
        ));
    }
    let (torch, source): (TorchBench, String) = match &args.pytorch {
        Some(path) => {
            let text =
                crate::input::read_text(path, crate::input::Kind::Text).map_err(|source| {
                    Error::Read {
                        path: path.clone(),
                        source,
                    }
                })?;
            let t = serde_json::from_str(&text).map_err(|e| {
                Error::input(
                    path,
                    format!("line {} column {}", e.line(), e.column()),
                    format!("not alloc_bench.py output: {e}"),
                )
            })?;
            (t, path.display().to_string())
        }
        None => (
            serde_json::from_str(RECORDED).expect("embedded fixture parses"),
            "fixtures/groundtruth/alloc_bench.json (recorded on the H200 machine)".into(),
        ),
    };
    if torch.sizes_pairs.is_empty() || torch.sizes_batch.is_empty() {
        return Err(Error::usage("--pytorch", "size lists are empty"));
    }
    // warm up (CPU frequency, caches) before anything is timed, as criterion does
    let t0 = Instant::now();
    let mut a = allocator(false);
    while t0.elapsed().as_millis() < args.warmup_ms as u128 {
        bench_pairs(&mut a, &torch.sizes_pairs, 50);
    }
    let mut rows = Vec::new();
    for recording in [false, true] {
        let times = if recording {
            torch.recording.as_ref()
        } else {
            torch.plain.as_ref()
        };
        // as alloc_bench.py does: one allocator (PyTorch's is process-wide) for all repetitions
        // of both patterns, with its recording ring filling and then wrapping
        let mut a = allocator(recording);
        let pairs: Vec<f64> = (0..args.repeat)
            .map(|_| bench_pairs(&mut a, &torch.sizes_pairs, args.pairs_reps))
            .collect();
        let batch: Vec<f64> = (0..args.repeat)
            .map(|_| bench_batch(&mut a, &torch.sizes_batch, args.batch_reps))
            .collect();
        rows.push(BenchRow {
            pattern: "pairs".into(),
            recording,
            ns_per_pair: pairs,
            pytorch_ns_per_pair: times.map(|t| t.pairs_ns.clone()),
        });
        rows.push(BenchRow {
            pattern: "batch".into(),
            recording,
            ns_per_pair: batch,
            pytorch_ns_per_pair: times.map(|t| t.batch_ns.clone()),
        });
    }
    if args.json {
        let v = serde_json::json!({ "pytorch_results": source, "rows": rows });
        serde_json::to_writer_pretty(&mut *out, &v).map_err(std::io::Error::from)?;
        writeln!(out)?;
    } else {
        writeln!(out, "PyTorch figures from {source}")?;
        write_text(out, &rows)?;
    }
    Ok(Outcome::Ok)
}
