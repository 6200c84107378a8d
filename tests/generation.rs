//! Issue 37: generation's answers. `fit --param new_tokens` answers from one fast-forwarded
//! run, exactly and within its budget, and says the KV cache's bytes per token (sliding
//! windows capping only their layers; GPT-2's cache); a fast-forwarded generation ends as the
//! engine's own to the byte; a generation's remedies speak of prompts.

mod common;
use common::{config, gpumem, run_json, Scratch};

#[test]
fn fit_on_generation_length_prints_the_cache_per_token_and_stops_at_the_trained_context() {
    let q = config("qwen2.5-7b");
    let (code, v) = run_json(&[
        "fit",
        &q,
        "--batch",
        "1",
        "--seq",
        "2048",
        "--mode",
        "generate",
        "--new-tokens",
        "1",
        "--dtype",
        "bf16",
        "--param",
        "new_tokens",
        "--capacity",
        "24GiB",
        "--no-remedies",
    ]);
    assert_eq!(code, Some(0), "{v}");
    // max_position_embeddings 131,072 less the 2,048-token prompt
    assert_eq!(v["max"], 129024);
    let notes = v["notes"].to_string();
    assert!(notes.contains("56.00 KiB per token"), "{notes}");
    let row = &v["results"][0];
    // 24 GiB less 15 GiB of weights holds far more than 129,024 tokens of 56 KiB
    assert_eq!(row["max_fitting"], 129024, "{row}");
    // a run past the trained context is warned about
    let out = common::at_root(&[
        "run",
        &q,
        "--batch",
        "1",
        "--seq",
        "131000",
        "--mode",
        "generate",
        "--new-tokens",
        "100",
        "--dtype",
        "bf16",
        "-q",
        "--no-remedies",
    ]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("max_position_embeddings of 131,072"));
    // a run in generate mode says its cache per token
    let (_, r) = run_json(&[
        "run",
        &q,
        "--batch",
        "1",
        "--seq",
        "2048",
        "--mode",
        "generate",
        "--new-tokens",
        "16",
        "--dtype",
        "bf16",
    ]);
    // 28 layers x (k, v) x 4 key/value heads x head_dim 128 x 2 bytes
    assert_eq!(r["kv_cache"]["bytes_per_token"], 28 * 2 * 4 * 128 * 2);
    assert_eq!(r["kv_cache"]["context_tokens"], 2064);
}

/// A generation whose boundary is too far to simulate in `fit`'s few seconds is still
/// simulated for them: the answer is then a proven lower bound ("at least", the run had not
/// run out when it stopped), with the KV cache's estimate beside it in a note; that many
/// tokens fit when run. (On a machine fast enough to reach the boundary, the answer is exact.)
#[test]
fn fit_past_its_budget_answers_at_least_what_it_simulated() {
    let q = config("qwen2.5-7b");
    let base = [
        "--batch",
        "1",
        "--seq",
        "512",
        "--dtype",
        "bf16",
        "--capacity",
        "17GiB",
        "--iterations",
        "1",
    ];
    let mut a = vec!["fit", q.as_str(), "--param", "new_tokens", "--no-remedies"];
    a.extend_from_slice(&base);
    let (_, v) = run_json(&a);
    let row = &v["results"][0];
    let max = row["max_fitting"].as_u64().expect("some length fits");
    match row["found"].as_str() {
        Some("at_least") => {
            assert!(max > 64, "{v}");
            let notes = v["notes"].to_string();
            assert!(
                notes.contains("at least") && notes.contains("estimated"),
                "{notes}"
            );
        }
        Some("exact") => {}
        other => panic!("found {other:?}: {v}"),
    }
    assert!(row["peak_reserved"].as_u64().is_some(), "{v}");
    let n = max.to_string();
    let mut r = vec![
        "run",
        q.as_str(),
        "--mode",
        "generate",
        "--new-tokens",
        n.as_str(),
        "--no-remedies",
    ];
    r.extend_from_slice(&base);
    let (_, out) = run_json(&r);
    assert!(out["oom"].is_null(), "{n} new tokens: {}", out["oom"]);
}

/// On a bare config `--new-tokens N` alone asks for a generation (`--mode generate` implied),
/// as `fit --param new_tokens` does.
#[test]
fn new_tokens_alone_generate_from_a_config() {
    let l = config("llama-3.2-1b");
    let (code, v) = run_json(&[
        "run",
        l.as_str(),
        "--batch",
        "1",
        "--seq",
        "16",
        "--new-tokens",
        "4",
        "--dtype",
        "bf16",
    ]);
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(v["kv_cache"]["context_tokens"], 20, "{}", v["kv_cache"]);
}

#[test]
fn fit_on_a_short_generation_is_exact() {
    // a small model on a small card, the boundary simulated (--exact: whatever the time)
    let l = config("llama-3.2-1b");
    let base = [
        "--batch",
        "16",
        "--seq",
        "256",
        "--mode",
        "generate",
        "--dtype",
        "bf16",
        "--capacity",
        "3.2GiB",
        "--iterations",
        "1",
    ];
    let mut a = vec![
        "fit",
        l.as_str(),
        "--param",
        "new_tokens",
        "--new-tokens",
        "1",
        "--no-remedies",
        "--exact",
    ];
    a.extend_from_slice(&base);
    let (_, v) = run_json(&a);
    let row = &v["results"][0];
    assert_eq!(row["found"], "exact", "{v}");
    // no search: two short runs bracket it, one run to the limit finds where it stops
    // fitting (a shorter generation is its first steps)
    assert_eq!(row["runs"], 3, "{v}");
    let max = row["max_fitting"].as_u64().expect("some length fits");
    for (n, fits) in [(max, true), (max + 1, false)] {
        let n = n.to_string();
        let mut r = vec![
            "run",
            l.as_str(),
            "--new-tokens",
            n.as_str(),
            "--no-remedies",
        ];
        r.extend_from_slice(&base);
        let (_, out) = run_json(&r);
        assert_eq!(out["oom"].is_null(), fits, "new_tokens {n}");
    }
}

/// `fit --param new_tokens` fast-forwards a generation's steady decode steps on the allocator
/// alone (`gpumem::alloc::fastforward`). It must change nothing but the time: on tiny models
/// whose KV cache grows into the large pool (plain, sliding-window Gemma-2, GPT-2), under each
/// allocator setting `fit` tries, on cards that run out early, late and not at all, every run
/// fast-forwarded ends exactly as the engine's run: where memory ran out (iteration, token,
/// the request, allocated and reserved then, and the op it was for), each iteration's peaks,
/// and the allocator's final memory. Some runs must have skipped the small pool's calls, some must have run out
/// inside a fast-forward.
#[test]
fn a_fast_forwarded_generation_ends_as_the_engines_to_the_byte() {
    use gpumem::alloc::DEFAULT_CONTEXT_OVERHEAD;
    use gpumem::runner::{remedies::run_with, RunOptions, RunOutcome};
    use gpumem::workload::transform::Overrides;
    // a capacity whose usable memory (after the CUDA context's share) is `usable`
    let capacity = |usable: u64| {
        let c = usable + DEFAULT_CONTEXT_OVERHEAD;
        if c / 8 >= DEFAULT_CONTEXT_OVERHEAD {
            c
        } else {
            usable * 8 / 7 + 8
        }
    };
    let ends = |r: &RunOutcome| {
        let oom = r.oom.as_ref().map(|o| {
            (
                o.iteration,
                o.tokens,
                o.error.requested,
                o.error.allocated,
                o.error.reserved,
            )
        });
        let iters: Vec<_> = r
            .iterations
            .iter()
            .map(|i| {
                (
                    i.start,
                    i.end,
                    i.peak_allocated,
                    i.peak_reserved,
                    i.reserved_end,
                )
            })
            .collect();
        let s = &r.stats;
        format!(
            "oom {oom:?} at {:?}\niterations {iters:?}\nallocated {} reserved {} segments {} \
             peak {}",
            r.oom_place(),
            s.allocated_bytes.all().current,
            s.reserved_bytes.all().current,
            s.segment.all().current,
            r.peak.peak_reserved,
        )
    };
    // and a llama with a 7B's attention (16 x 128 key/value heads: 4 KiB a token and layer)
    // at batch 1, whose ids grow out of their block every 64 tokens, and whose 8 layers are
    // enough for the full steps to skip the small pool's calls of some of them
    let dir = Scratch::new("fast-forward");
    let llama = std::fs::read_to_string("fixtures/hf/cases/llama_t.config.json")
        .unwrap()
        .replace("\"head_dim\": 64", "\"head_dim\": 128")
        .replace("\"hidden_size\": 512", "\"hidden_size\": 2048")
        .replace("\"num_attention_heads\": 8", "\"num_attention_heads\": 16")
        .replace("\"num_hidden_layers\": 4", "\"num_hidden_layers\": 8")
        .replace("\"num_key_value_heads\": 2", "\"num_key_value_heads\": 16");
    dir.write("wide.config.json", &llama);
    let wide = dir.write(
        "wide.toml",
        "[model]\nhf_config = \"wide.config.json\"\ndtype = \"bf16\"\n\
         [train]\nbatch = 1\nseq = 64\niterations = 2\nmode = \"generate\"\n\
         [generate]\nnew_tokens = 8\npad_token_id = 0\n",
    );
    let (mut skipped, mut oom_inside, mut runs, mut layers) = (0u64, 0, 0, 0);
    for (workload, batch, n) in [
        ("fixtures/hf/workloads/llama_t_generate_bf16.toml", 16, 700),
        (
            "fixtures/hf2/workloads/gemma2_t_w128_b3_generate_bf16.toml",
            12,
            700,
        ),
        ("fixtures/hf2/workloads/gpt2_t_generate_bf16.toml", 8, 700),
        (wide.to_str().unwrap(), 1, 1500),
        // mixture of experts: the routing decides which experts' products a step makes
        (
            "fixtures/hf2/workloads/mixtral_t_generate_bf16.toml",
            8,
            400,
        ),
    ] {
        let path = std::path::Path::new(workload);
        for conf in [
            None,
            Some("expandable_segments:True"),
            Some("max_split_size_mb:21"),
        ] {
            let o = Overrides {
                alloc_conf: conf.map(str::to_string),
                ..Default::default()
            }
            .with_param("batch", batch)
            .with_param("new_tokens", n);
            let opts = |capacity: Option<u64>, fast_forward| RunOptions {
                capacity,
                fast_forward,
                ..Default::default()
            };
            let free = run_with(path, &o, &opts(None, false)).unwrap();
            let start = free.iterations[0].start;
            let top = free.peak.peak_reserved;
            for f in [0.55, 0.85, 0.97, 1.5] {
                let usable = start + ((top - start) as f64 * f) as u64;
                let c = Some(capacity(usable));
                let engine = run_with(path, &o, &opts(c, false)).unwrap();
                let fast = run_with(path, &o, &opts(c, true)).unwrap();
                let what = format!("{workload} {conf:?} at {f} of the peak");
                assert!(engine.fast_forwarded.is_none(), "{what}");
                assert_eq!(ends(&fast), ends(&engine), "{what}");
                // (a card that runs out in the prompt leaves nothing to fast-forward)
                if let Some(ff) = fast.fast_forwarded {
                    runs += 1;
                    skipped += ff.steps - ff.full_steps;
                    layers += ff.skipped_blocks;
                }
                if fast
                    .oom
                    .as_ref()
                    .and_then(|o| o.tokens)
                    .is_some_and(|t| t > 20)
                {
                    oom_inside += 1;
                }
            }
        }
    }
    assert!(runs >= 20, "{runs} runs fast-forwarded");
    assert!(skipped > 0, "no step skipped the small pool in {runs} runs");
    assert!(layers > 0, "no full step skipped layers in {runs} runs");
    assert!(
        oom_inside >= 3,
        "{oom_inside} of {runs} runs ran out in a fast-forward"
    );
}

/// A generation's shorter-sequence remedy shortens its prompt and says so (it said
/// "sequences", training's word).
#[test]
fn a_generations_remedies_speak_of_prompts() {
    let (_, v) = run_json(&[
        "run",
        &config("tinyllama-1.1b"),
        "--mode",
        "generate",
        "--batch",
        "16",
        "--seq",
        "4096",
        "--new-tokens",
        "4",
        "--dtype",
        "bf16",
        "--capacity",
        "6GiB",
        "--iterations",
        "1",
    ]);
    let rows = v["oom"]["remedies"].as_array().unwrap();
    let seq = rows
        .iter()
        .find(|r| r["name"].as_str().is_some_and(|n| n.starts_with("seq ")))
        .unwrap();
    assert!(
        seq["change"].as_str().unwrap().starts_with("prompts of "),
        "{seq}"
    );
}

/// A script that allocates after a generation the fast-forward drove to its end (its tensors
/// then have the last observed step's shapes) is flagged, and the re-runs of `run`'s
/// diagnosis and `fit` (`remedies::rerun`) then run it again without the fast-forward: their
/// figures are the engine's.
#[test]
fn a_fast_forward_followed_by_allocations_is_run_again_in_full() {
    use gpumem::runner::{remedies, RunOptions};
    use gpumem::workload::transform::Overrides;
    let dir = Scratch::new("fast-forward-tail");
    let w = dir.write(
        "grow.toml",
        "[workload]\nname = \"grow\"\niterations = 1\nbody = \"\"\"\n\
         cache = zeros(1, 1024)\n\
         for step in range(300) {\n\
           x = zeros(1, 1024)\n\
           c2 = cat([cache, x], -1)\n\
           del x\n\
           cache = c2\n\
           del c2\n\
           token_done(until=300)\n\
         }\n\
         y = cat([cache, cache, cache], -1)\n\
         \"\"\"\n",
    );
    let o = Overrides::default();
    let opts = |fast_forward| RunOptions {
        fast_forward,
        ..Default::default()
    };
    let figures = |r: &gpumem::runner::RunOutcome| (r.peak.peak_allocated, r.peak.peak_reserved);
    let engine = remedies::run_with(&w, &o, &opts(false)).unwrap();
    let fast = remedies::run_with(&w, &o, &opts(true)).unwrap();
    let ff = fast.fast_forwarded.expect("the loop was fast-forwarded");
    assert!(ff.steps > 200 && ff.allocated_after, "{ff:?}");
    // (the flag matters: the fast-forwarded figures are wrong)
    assert_ne!(figures(&fast), figures(&engine));
    let again = remedies::rerun(&w, &o, &opts(false)).unwrap();
    assert_eq!(figures(&again), figures(&engine));
    assert!(again.fast_forwarded.is_none());
}

/// Gemma-3 attends through its sliding window in five layers of six and Gemma-2 in every
/// other: only those layers' caches stop at the window, the others grow with the context
/// (the line said all stopped: half Gemma-3-1B's cache at 4,096 tokens).
#[test]
fn a_sliding_window_caps_only_the_layers_that_have_it() {
    for (name, seq, want) in [
        // 22 x 512 + 4 x 4,096 tokens of 1 KiB
        (
            "gemma-3-1b",
            "2048",
            "27.00 MiB at the end of this generation (4,096 tokens)",
        ),
        // 21 x 4,096 + 21 x 6,144 tokens of 8 KiB
        (
            "gemma-2-9b",
            "4096",
            "1.64 GiB at the end of this generation (6,144 tokens)",
        ),
    ] {
        let c = config(name);
        let out = gpumem()
            .args([
                "run",
                &c,
                "--mode",
                "generate",
                "--batch",
                "1",
                "--seq",
                seq,
                "--new-tokens",
                "2048",
                "--dtype",
                "bf16",
                "--iterations",
                "1",
            ])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text
            .lines()
            .find(|l| l.starts_with("KV cache:"))
            .unwrap_or("");
        assert!(
            line.contains(want) && line.contains("layers that attend through"),
            "{line}"
        );
    }
}

/// GPT-2's generation has its KV cache's bytes per token too (every head's keys and values:
/// the hidden size per layer) and `fit --param new_tokens` stops at its `n_positions`; the
/// answer, found with the decode steps fast-forwarded, is where `run` stops fitting.
#[test]
fn gpt2_generation_has_its_cache_per_token_and_a_fast_exact_fit() {
    let g = config("gpt2");
    let base = [
        "--seq",
        "512",
        "--batch",
        "8",
        "--dtype",
        "bf16",
        "--capacity",
        "700MiB",
        "--iterations",
        "1",
        "--no-remedies",
    ];
    let mut a = vec![g.as_str(), "--param", "new_tokens", "--exact"];
    a.extend_from_slice(&base);
    let (code, v) = run_json(&[&["fit"], a.as_slice()].concat());
    assert_eq!(code, Some(0), "{v}");
    // 12 layers x (keys, values) x 768 x 2 bytes x batch 8: 288 KiB
    let notes = v["notes"].to_string();
    assert!(
        notes.contains("288.00 KiB per token") && notes.contains("1,024"),
        "{notes}"
    );
    let row = &v["results"][0];
    assert_eq!(row["found"], "exact", "{v}");
    let max = row["max_fitting"].as_u64().expect("some length fits");
    assert!(max > 100 && max < 512, "{v}");
    for (n, fits) in [(max, true), (max + 1, false)] {
        let n = n.to_string();
        let mut r = vec!["run", g.as_str(), "--new-tokens", n.as_str()];
        r.extend_from_slice(&base);
        let (_, out) = run_json(&r);
        assert_eq!(out["oom"].is_null(), fits, "new_tokens {n}");
        assert_eq!(out["kv_cache"]["bytes_per_token"], 12 * 2 * 768 * 2 * 8);
    }
}
