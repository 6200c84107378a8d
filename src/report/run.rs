//! The report of `gpumem run`: iterations, marks, the peak by category and tag, the final state.

use std::io::Write;

use serde_json::json;

use crate::analysis::record::RunOutcome;
use crate::report::{stats_table, torch_summary};
use crate::units::format_bytes;

fn opt(v: Option<u64>) -> String {
    v.map(format_bytes).unwrap_or_else(|| "-".into())
}

/// The run: its device, iterations, what was live at the peak, where it ran out
/// (`oom_place`), the driver's view. The allocator's final state follows the findings
/// ([`write_final_state`]).
pub fn write_text(
    out: &mut dyn Write,
    path: &str,
    r: &RunOutcome,
    oom_place: Option<&str>,
    assumptions: Option<&str>,
) -> std::io::Result<()> {
    let device = match r.device {
        "sim" => "the simulated device",
        "cpu" => "the cpu device (real numbers in host memory)",
        "cuda" => "the NVIDIA GPU (segments from its driver, kernels on it)",
        "cuda-memory" => "the NVIDIA GPU's memory (segments from its driver, no kernels)",
        other => other,
    };
    writeln!(
        out,
        "{}",
        super::style::wrap(&format!(
            "{path}: \"{}\" on {device} ({} capacity)",
            r.name,
            format_bytes(r.capacity)
        ))
    )?;
    if let Some(a) = assumptions {
        writeln!(out, "{}", super::style::wrap(&format!("as run: {a}")))?;
    }
    if !r.launches.is_empty() {
        writeln!(out, "{}", super::style::wrap(&launches_line(&r.launches)))?;
    }
    let (conf, from) = &r.alloc_conf;
    if !conf.is_empty() || from != "default" {
        let from = match from.as_str() {
            "alloc_conf" => "the workload's alloc_conf".to_string(),
            "--alloc-conf" => "--alloc-conf".to_string(),
            var => format!("{var} in the environment"),
        };
        writeln!(
            out,
            "allocator settings: {} (from {from})",
            if conf.is_empty() {
                "PyTorch's defaults"
            } else {
                conf
            }
        )?;
    }
    let losses: Vec<String> = r
        .iterations
        .iter()
        .filter_map(|i| i.loss.map(|l| format!("{}: {l:.6}", i.iteration)))
        .collect();
    if !losses.is_empty() {
        writeln!(
            out,
            "loss per iteration (the .item() values): {}",
            losses.join(", ")
        )?;
    }
    if !r.iterations.is_empty() {
        // the marks a run has (training's forward, backward and step; a generation's call)
        type Get = fn(&crate::runner::IterationStats) -> Option<u64>;
        let marks: [(&str, Get); 4] = [
            ("after forward", |i| i.after_forward),
            ("after backward", |i| i.after_backward),
            ("after step", |i| i.after_step),
            ("after generate", |i| i.after_generate),
        ];
        // (a generation has no training marks; a training run no generation one)
        let generating = r.iterations.iter().any(|i| i.after_generate.is_some());
        let shown: Vec<&(&str, Get)> = marks
            .iter()
            .filter(|(h, get)| {
                let any = r.iterations.iter().any(|i| get(i).is_some());
                if *h == "after generate" {
                    any
                } else {
                    any || !generating
                }
            })
            .collect();
        let mut header = vec!["iteration", "start"];
        header.extend(shown.iter().map(|(h, _)| *h));
        header.extend(["end", "peak allocated", "peak reserved", "reserved at end"]);
        let mut t = super::style::table();
        t.set_header(header);
        for i in &r.iterations {
            let mut row = vec![i.iteration.to_string(), format_bytes(i.start)];
            row.extend(shown.iter().map(|(_, get)| opt(get(i))));
            row.extend([
                format_bytes(i.end),
                format_bytes(i.peak_allocated),
                format_bytes(i.peak_reserved),
                format_bytes(i.reserved_end),
            ]);
            t.add_row(row);
        }
        super::align_right(&mut t, 1);
        writeln!(out, "{t}")?;
    }
    if !r.marks.is_empty() {
        let mut t = super::style::table();
        t.set_header(vec!["mark", "line", "iteration", "allocated", "reserved"]);
        for m in &r.marks {
            t.add_row(vec![
                m.label.clone(),
                m.line.to_string(),
                m.iteration
                    .map(|i| i.to_string())
                    .unwrap_or_else(|| "setup".into()),
                format_bytes(m.allocated),
                format_bytes(m.reserved),
            ]);
        }
        super::align_right(&mut t, 3);
        writeln!(out, "{t}")?;
    }
    let text = format!(
        "{} {} ({} bytes) allocated (peak reserved {}, {} bytes):",
        super::style::heading("at the peak,"),
        format_bytes(r.peak.peak_allocated),
        crate::units::group_digits(r.peak.peak_allocated),
        format_bytes(r.peak.peak_reserved),
        crate::units::group_digits(r.peak.peak_reserved)
    );
    writeln!(out, "{}", super::style::wrap(&text))?;
    let mut t = super::style::table();
    t.set_header(vec!["category", "allocated"]);
    for (c, b) in &r.peak.by_category {
        t.add_row(vec![c.name().to_string(), format_bytes(*b)]);
    }
    super::align_right(&mut t, 1);
    writeln!(out, "{t}")?;
    let mut t = super::style::table();
    t.set_header(vec!["tags (outermost first)", "allocated"]);
    for (tags, b) in &r.peak.top_tags {
        t.add_row(vec![tags.clone(), format_bytes(*b)]);
    }
    super::align_right(&mut t, 1);
    writeln!(out, "{t}")?;
    if let Some(o) = &r.oom {
        writeln!(
            out,
            "{} at {}:\n  {}",
            super::style::bad("out of memory"),
            oom_place.unwrap_or("?"),
            o.error
        )?;
    }
    if let Some(d) = &r.driver {
        let outside = d.outside();
        let line = if d.measured {
            format!(
                "the driver's view at the end (NVML, as nvidia-smi shows it): this process uses {}: \
                 {} reserved by the caching allocator + {} outside it (the CUDA context, loaded \
                 kernels, libraries' handles)",
                format_bytes(d.process_used),
                format_bytes(d.reserved),
                format_bytes(outside)
            )
        } else {
            let others: u64 = r.outside.iter().map(|o| o.bytes).sum();
            let mut line = format!(
                "expected in nvidia-smi for this process at the end: {} = {} reserved + {} for \
                 PyTorch's CUDA context and libraries (measured with PyTorch 2.11 on an H200)",
                format_bytes(d.process_used),
                format_bytes(d.reserved),
                format_bytes(outside.saturating_sub(others))
            );
            for o in &r.outside {
                line.push_str(&format!(" + {} for {}", format_bytes(o.bytes), o.what));
            }
            line
        };
        writeln!(out, "{}", super::style::wrap(&line))?;
    }
    for o in &r.outside {
        let line = format!("  {}: {}", o.what, o.source);
        writeln!(out, "{}", super::style::wrap(&line))?;
    }
    if let Some((_, world)) = r.ranks.filter(|(s, _)| *s == "zero3") {
        let line = if r.host_memory_peak > 0 {
            format!(
                "ranks: {world}; ZeRO stage 3 with offload_optimizer as DeepSpeed 0.19.6's \
                 DeepSpeedZeroOptimizer_Stage3 allocates for a model partitioned by \
                 deepspeed.initialize (DeepSpeedCPUAdam): the device keeps the parameters in \
                 one buffer and the reduction bucket (reduce_bucket_size elements); the \
                 float32 master, every gradient's partition (pinned) and Adam's state are on \
                 the host (the host line below). In backward each reduced gradient comes back \
                 to the device for its norm, kept to the step. F.linear is DeepSpeed's \
                 memory-efficient linear. Written from DeepSpeed's source (world size 1); \
                 above one rank each submodule's parameters are all-gathered before use, \
                 which is not modelled yet"
            )
        } else {
            format!(
                "ranks: {world}; ZeRO stage 3 as DeepSpeed 0.19.6's DeepSpeedZeroOptimizer_Stage3 \
                 allocates for a model partitioned by deepspeed.initialize (FusedAdam): the \
                 parameters in one buffer, a float32 master copy, every gradient's partition and \
                 the reduction bucket (reduce_bucket_size elements) kept for the run, Adam's state \
                 from the first step; F.linear is DeepSpeed's memory-efficient linear. Matched to \
                 the byte on DeepSpeed's own runs at world size 1 (float32 and bf16); above one \
                 rank each submodule's parameters are all-gathered before use, which is not \
                 modelled yet"
            )
        };
        writeln!(out, "{}", super::style::wrap(&line))?;
    } else if let Some((strategy, world)) = r.ranks.filter(|(s, _)| s.starts_with("zero")) {
        let stage = if strategy == "zero1" { 1 } else { 2 };
        let line = format!(
            "ranks: {world}; rank 0 is shown: ZeRO stage {stage} gives each rank a 1/{world} \
             partition of the float32 master weights and Adam's state{}, and a rank's \
             gradients in partition hold the parameters its partition touches in full, so \
             ranks differ by where the boundaries fall. This follows DeepSpeed 0.19.6's code \
             (stage_1_and_2.py with FusedAdam: the flat parameters, the reduction bucket of \
             reduce_bucket_size elements, the partition's gradients, the step's copies), read \
             from its source and matched to the byte on DeepSpeed's own runs at world size 1 \
             (stages 1 and 2, float32 and bf16, offloaded or not; larger world sizes are not \
             recorded yet); DeepSpeed's documented \
             estimate (estimate_zero2_model_states_mem_needs) counts model states only and \
             leaves out the bucket, the gradients and the step's copies{}",
            if stage == 2 {
                " (and, in backward, of the gradients)"
            } else {
                ""
            },
            if r.host_memory_peak > 0 {
                ". With offload_optimizer the master, its gradient and Adam's state are on \
                 the host (DeepSpeedCPUAdam steps there; the host line below): the device \
                 keeps the flat parameters, the bucket, a staging buffer of the largest \
                 parameter and each partition gradient's norm to the step"
            } else {
                ""
            }
        );
        writeln!(out, "{}", super::style::wrap(&line))?;
    } else if let Some((strategy, world)) = r.ranks {
        let why = if strategy == "ddp" {
            "DDP's replicas hold the same model, buckets and activations"
        } else {
            "FSDP2 pads every rank's shard to the same size"
        };
        let line = format!(
            "ranks: {world}, each alike ({why}): every figure above is every rank's, NCCL's \
             included (measured at world size 1); under --capacity they run out together"
        );
        writeln!(out, "{}", super::style::wrap(&line))?;
    }
    if r.unified_memory_peak > 0 {
        let line = format!(
            "unified memory: {} at most (cudaMallocManaged: bitsandbytes' paged optimizer \
             state), outside the caching allocator and not in reserved: the driver pages it \
             between host and device, so nvidia-smi counts what is resident at the moment",
            format_bytes(r.unified_memory_peak)
        );
        writeln!(out, "{}", super::style::wrap(&line))?;
    }
    if r.host_memory_peak > 0 {
        let line = format!(
            "host memory: {} at most (not device memory: what is offloaded, pinned \
             buffers (FSDP2's shards and their gradients; ZeRO's master, its gradient and \
             staging buffers) and the optimizer's state and step)",
            format_bytes(r.host_memory_peak)
        );
        writeln!(out, "{}", super::style::wrap(&line))?;
    }
    Ok(())
}

/// The allocator's state at the end: `memory_stats()` as a table, or PyTorch's
/// `memory_summary()` text with `torch_style`.
pub fn write_final_state(
    out: &mut dyn Write,
    r: &RunOutcome,
    torch_style: bool,
) -> std::io::Result<()> {
    if torch_style {
        torch_summary::write(out, &r.stats, 0)
    } else {
        writeln!(
            out,
            "{}",
            super::style::heading("the caching allocator at the end (torch.cuda.memory_stats()):")
        )?;
        stats_table::write(out, &r.stats)
    }
}

/// Where the cuda device ran its launches: how many on the GPU, and which kernels ran on the
/// host twin (no GPU kernel takes them yet), most launches first.
fn launches_line(l: &[crate::backend::Launches]) -> String {
    use crate::backend::Ran;
    let count = |ran: Ran| -> u64 { l.iter().filter(|x| x.ran == ran).map(|x| x.count).sum() };
    let (gpu, host) = (count(Ran::Gpu), count(Ran::Host));
    let mut on_host: Vec<&crate::backend::Launches> =
        l.iter().filter(|x| x.ran == Ran::Host).collect();
    on_host.sort_by(|a, b| b.count.cmp(&a.count).then(a.kernel.cmp(b.kernel)));
    let mut s = format!(
        "kernels: {} launches on the GPU, {} on the host twin (the cpu device's kernels on host \
         copies: slow, the same numbers)",
        crate::units::group_digits(gpu),
        crate::units::group_digits(host)
    );
    if !on_host.is_empty() {
        let names: Vec<String> = on_host
            .iter()
            .map(|x| format!("{} {}", x.kernel, crate::units::group_digits(x.count)))
            .collect();
        s.push_str(&format!("; on the host: {}", names.join(", ")));
    }
    s
}

pub fn to_json(path: &str, r: &RunOutcome) -> serde_json::Value {
    json!({
        "workload": path,
        "name": r.name,
        "device": r.device,
        "launches": r.launches,
        "capacity": r.capacity,
        "alloc_conf": {"value": r.alloc_conf.0, "from": r.alloc_conf.1},
        "iterations": r.iterations,
        "marks": r.marks,
        "peak": {
            "peak_allocated": r.peak.peak_allocated,
            "peak_reserved": r.peak.peak_reserved,
            "by_category": r.peak.by_category.iter().map(|(c, b)| (c.name().to_string(), json!(b))).collect::<serde_json::Map<_, _>>(),
            "top_tags": r.peak.top_tags.iter().map(|(t, b)| json!({"tags": t, "bytes": b})).collect::<Vec<_>>(),
        },
        "oom": r.oom.as_ref().map(|o| json!({
            "message": o.error.to_string(),
            "line": o.line,
            "column": o.column,
            "iteration": o.iteration,
            "requested": o.error.requested,
            "allocated": o.error.allocated,
            "reserved": o.error.reserved,
        })),
        "memory_stats": r.stats.to_flat(),
        "driver": r.driver,
        "outside_allocator": r.outside,
        "host_memory_peak": r.host_memory_peak,
        "unified_memory_peak": r.unified_memory_peak,
        "ranks": r.ranks.map(|(strategy, world)| json!({
            "strategy": strategy,
            "world_size": world,
            "alike": !strategy.starts_with("zero") || world == 1,
            "shown_rank": 0,
            "peak_allocated": r.peak.peak_allocated,
            "peak_reserved": r.peak.peak_reserved,
            "outside_allocator": r.outside.iter().map(|o| o.bytes).sum::<u64>(),
        })),
    })
}

/// A generation's KV cache in a sentence: bytes per token, per layer, and at the end of the
/// `tokens`-long context.
pub fn kv_cache_line(k: &crate::workload::KvCacheInfo, tokens: u64) -> String {
    kv_cache_line_at(k, tokens, "this generation")
}

/// [`kv_cache_line`] with the cache at the end of `which` generation, of `tokens` tokens.
pub fn kv_cache_line_at(k: &crate::workload::KvCacheInfo, tokens: u64, which: &str) -> String {
    format!(
        "KV cache: {} per token of context ({} layers x {} per sample, keys and values in {}, \
         batch {}){}; {} at the end of {which} ({} tokens)",
        format_bytes(k.bytes_per_token),
        k.layers,
        format_bytes(k.bytes_per_token_per_layer),
        k.dtype,
        k.batch,
        match k.sliding_window {
            Some(w) if k.sliding_layers >= k.layers => format!(
                ", at most {} tokens (the sliding window)",
                crate::units::group_digits(w)
            ),
            Some(w) => format!(
                ", at most {} tokens in the {} of {} layers that attend through the sliding \
                 window",
                crate::units::group_digits(w),
                k.sliding_layers,
                k.layers
            ),
            None => String::new(),
        },
        format_bytes(k.bytes_at(tokens)),
        crate::units::group_digits(tokens)
    )
}
