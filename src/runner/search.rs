//! The search for the largest value of a workload's parameter that fits (`gpumem fit`): by
//! doubling and bisecting over re-runs ([`max_fitting`]), outward from a guess
//! ([`max_fitting_near`]), and for a generation's `new_tokens` from one long run whose
//! out-of-memory says where the answer lies ([`max_new_tokens`]). Each run is the remedies'
//! re-run ([`super::remedies::rerun`], [`super::remedies::run_with`]): the workload file
//! loaded with the value set.

use std::path::Path;

use super::remedies::{rerun, run_with};
use super::RunOptions;
use crate::error::Error;
use crate::workload::Overrides;

/// The largest value of parameter `param` in `1..=limit` for which the workload (with
/// `overrides`) runs without out-of-memory, by doubling from `start` and bisecting; `None`
/// when not even 1 fits. `runs` counts the runs made.
pub fn max_fitting(
    path: &Path,
    overrides: &Overrides,
    param: &str,
    start: i64,
    limit: i64,
    opts: &RunOptions,
    runs: &mut u32,
) -> Result<Option<i64>, Error> {
    let mut refused = None;
    max_fitting_modelled(
        path,
        overrides,
        param,
        start,
        limit,
        opts,
        runs,
        &mut refused,
    )
}

/// [`max_fitting`] where a value the workload refuses (a combination gpumem does not model
/// there, such as a sliding window's mask from its length on) counts as not fitting:
/// `refused` keeps the smallest such value and why, so the caller can say the answer is the
/// largest *modelled* value that fits.
#[allow(clippy::too_many_arguments)]
pub fn max_fitting_modelled(
    path: &Path,
    overrides: &Overrides,
    param: &str,
    start: i64,
    limit: i64,
    opts: &RunOptions,
    runs: &mut u32,
    refused: &mut Option<(i64, String)>,
) -> Result<Option<i64>, Error> {
    let mut fits = |v: i64| fits_at(path, overrides, param, v, opts, runs, refused);
    let start = start.clamp(1, limit);
    // lo fits (or is 0: nothing known to fit), hi does not (or is limit + 1)
    let (lo, hi) = if fits(start)? {
        let mut lo = start;
        let mut hi = limit + 1;
        let mut v = start;
        while v < limit {
            let next = v.saturating_mul(2).min(limit);
            if fits(next)? {
                lo = next;
                v = next;
            } else {
                hi = next;
                break;
            }
        }
        (lo, hi)
    } else {
        (0, start)
    };
    let lo = bisect(&mut fits, lo, hi)?;
    Ok((lo >= 1).then_some(lo))
}

/// The largest value in `lo..hi` that fits, where `lo` fits (or is 0) and `hi` does not (or
/// is past the limit), by bisection.
fn bisect(
    fits: &mut dyn FnMut(i64) -> Result<bool, Error>,
    mut lo: i64,
    mut hi: i64,
) -> Result<i64, Error> {
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid)? {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(lo)
}

/// Whether the workload with `param = v` runs without out-of-memory; a value the workload
/// refuses does not fit, and `refused` keeps the smallest such value and why.
fn fits_at(
    path: &Path,
    overrides: &Overrides,
    param: &str,
    v: i64,
    opts: &RunOptions,
    runs: &mut u32,
    refused: &mut Option<(i64, String)>,
) -> Result<bool, Error> {
    *runs += 1;
    match rerun(path, &overrides.with_param(param, v), opts) {
        Ok(out) => Ok(out.oom.is_none()),
        Err(Error::Input { message, .. } | Error::Usage { message, .. }) => {
            if refused.as_ref().is_none_or(|(r, _)| v < *r) {
                *refused = Some((v, message));
            }
            Ok(false)
        }
        Err(e) => Err(e),
    }
}

/// The largest value in `lo..hi` that fits, where `lo` is known to fit and `hi` not to (or is
/// past the limit), searched outward from `guess`: the guess, then steps of 1, 2, 4, ... away
/// from it until the boundary is bracketed, then bisection. A guess off by `d` costs about
/// `2 log2(d) + 2` runs, so a good one (where a longer run ran out) settles it in two.
pub fn max_fitting_near(
    fits: &mut dyn FnMut(i64) -> Result<bool, Error>,
    guess: i64,
    mut lo: i64,
    mut hi: i64,
) -> Result<i64, Error> {
    if hi - lo > 1 {
        let g = guess.clamp(lo + 1, hi - 1);
        let mut step = 1i64;
        if fits(g)? {
            lo = g;
            while hi - lo > 1 {
                let v = lo.saturating_add(step).min(hi - 1);
                if fits(v)? {
                    lo = v;
                    step = step.saturating_mul(2);
                } else {
                    hi = v;
                    break;
                }
            }
        } else {
            hi = g;
            while hi - lo > 1 {
                let v = hi.saturating_sub(step).max(lo + 1);
                if fits(v)? {
                    lo = v;
                    break;
                }
                hi = v;
                step = step.saturating_mul(2);
            }
        }
    }
    bisect(fits, lo, hi)
}

/// How `fit` found a generation's longest length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Found {
    /// Simulated: the value fits and the value plus one does not.
    Exact,
    /// Simulated: every value up to the search's limit fits, so the answer is the limit (a
    /// floor), not where it stops fitting.
    Limit,
    /// Extrapolated from two short generations and the KV cache's bytes per token, because
    /// simulating at the boundary would take longer than `fit` allows itself.
    Estimated,
    /// Simulated for as long as `fit` allows itself: at least this many fit (the run had not
    /// run out when it was stopped); the estimate says about how many.
    AtLeast,
}

/// [`max_new_tokens`]'s answer: the longest generation that fits (`None`: not even one
/// token), how it was found, its peak allocated and reserved where the search ran it, and
/// the estimate from the KV cache's growth where one was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Longest {
    pub max: Option<i64>,
    pub found: Found,
    pub peaks: Option<(u64, u64)>,
    pub estimate: Option<i64>,
}

impl Longest {
    fn exact(max: Option<i64>, peaks: Option<(u64, u64)>) -> Longest {
        Longest {
            max,
            found: Found::Exact,
            peaks,
            estimate: None,
        }
    }
}

/// Simulation time `fit` allows itself per remedy before it estimates instead.
const SIMULATION_BUDGET: std::time::Duration = std::time::Duration::from_secs(3);

/// The largest `new_tokens` in `1..=limit` that fits, for a generation whose cache grows by
/// `kv.bytes_per_token`: two short runs give the peak's growth per token (at least the
/// cache's) and the simulation's time per token; the boundary is bracketed from them and
/// found exactly when that costs less than [`SIMULATION_BUDGET`] (or `exact` asks), else
/// returned as an estimate.
///
/// The exact answer takes one long run, not a search: a generation of `n` tokens runs the
/// same steps as a longer one's first `n` (greedy decoding, the minimum-length processors
/// forcing alike, the cache grown the same way), so one run to `limit` either fits (every
/// length does) or runs out while generating token `g + 1` (`token_done()` counts them):
/// `g + 1` and longer do not fit, and `g` does, because a run of `g` tokens then ends
/// instead of taking the failing step, and the end of the short run allocated nothing (only
/// frees). Where it did allocate, a run of `g` tokens confirms. The answer's peaks come with
/// it (`None` where not known without another run).
#[allow(clippy::too_many_arguments)]
pub fn max_new_tokens(
    path: &Path,
    overrides: &Overrides,
    start: i64,
    limit: i64,
    kv: &crate::workload::KvCacheInfo,
    opts: &RunOptions,
    exact: bool,
    runs: &mut u32,
) -> Result<Longest, Error> {
    let param = "new_tokens";
    let a = start.clamp(1, limit);
    let b = (a + 64).min(limit);
    let t0 = std::time::Instant::now();
    *runs += 1;
    let ra = run_with(path, &overrides.with_param(param, a), opts)?;
    let time_a = t0.elapsed();
    if ra.oom.is_some() || a == b {
        let m = max_fitting(path, overrides, param, a, a, opts, runs)?;
        return Ok(Longest::exact(m, None));
    }
    *runs += 1;
    let rb = run_with(path, &overrides.with_param(param, b), opts)?;
    let time_b = t0.elapsed().saturating_sub(time_a);
    if rb.oom.is_some() {
        let m = max_fitting(path, overrides, param, a, b, opts, runs)?;
        return Ok(Longest::exact(m, None));
    }
    // the runs below fast-forward steady decode steps on the allocator alone where what
    // follows the last token only frees (the short run says so)
    let only_frees = rb.generated.and_then(|g| g.tail_allocations) == Some(0);
    let ff = RunOptions {
        fast_forward: only_frees,
        ..opts.clone()
    };
    let opts = &ff;
    let context = rb.context();
    let usable = rb.capacity.saturating_sub(context);
    // the boundary from allocated memory: what the model holds (the first iteration's start),
    // the cache at the context's length with one layer's keys twice over (`torch.cat` makes
    // the grown copy before the old one goes), and the rest of a step as the short run's peak
    // shows it beyond its cache; the caching allocator's slack is not modelled (hence an
    // estimate, and the exact answer where it is affordable)
    let base = rb.iterations.first().map_or(0, |i| i.start);
    let cache = |t: u64| kv.bytes_at(t) + kv.bytes_at(t) / (2 * kv.layers.max(1));
    let step = rb
        .peak
        .peak_allocated
        .saturating_sub(base)
        .saturating_sub(cache(kv.prompt + b as u64));
    let per_token = (cache(kv.prompt + 1_000_000) / 1_000_000).max(1);
    let room = usable.saturating_sub(base).saturating_sub(step);
    let estimate = (room / per_token)
        .saturating_sub(kv.prompt)
        .clamp(b as u64, limit as u64) as i64;
    // the time of a run to the boundary: the prefill from the first run, each generated
    // token from the two runs' difference
    let per_step = time_b.saturating_sub(time_a).as_secs_f64() / (b - a).max(1) as f64;
    let one_run = time_a.as_secs_f64() + per_step * estimate as f64;
    // one generation per iteration: a shorter one is a longer one's first steps
    let single = ra.iterations.len() == 1;
    let searches = if single {
        // the long run, and a confirming one where the end allocates
        if only_frees {
            1.0
        } else {
            2.0
        }
    } else {
        ((estimate - b).max(2) as f64).log2().ceil() + 2.0
    };
    tracing::debug!(
        estimate,
        seconds_per_run = one_run,
        runs = searches,
        "generation length bracketed"
    );
    let affordable = exact || one_run * searches <= SIMULATION_BUDGET.as_secs_f64();
    let estimated = Longest {
        max: Some(estimate),
        found: Found::Estimated,
        peaks: None,
        estimate: Some(estimate),
    };
    // past the budget the long run still runs, stopped when the budget is spent: what it
    // generated by then fits (its end only frees), and it may reach the answer
    // one long run answers where each iteration runs one generation, or where its steady
    // steps are fast-forwarded (a search then costs a few such runs)
    let long_run = single || opts.fast_forward;
    if !(affordable || long_run && only_frees) {
        return Ok(estimated);
    }
    let mut affordable = affordable;
    let mut guess = None;
    if long_run {
        *runs += 1;
        let t_long = std::time::Instant::now();
        let long = RunOptions {
            deadline: (!affordable).then(|| t0 + SIMULATION_BUDGET),
            ..opts.clone()
        };
        // a length gpumem refuses to model (the search below says where) answers nothing here
        let full = match run_with(path, &overrides.with_param(param, limit), &long) {
            Ok(r) => Some(r),
            Err(Error::Input { .. } | Error::Usage { .. }) => None,
            Err(e) => return Err(e),
        };
        match full.as_ref().map(|f| (f, &f.oom, f.iterations.len())) {
            Some((f, None, _)) if f.cut_short && !single => return Ok(estimated),
            Some((f, None, _)) if f.cut_short => {
                let rb_peaks = (rb.peak.peak_allocated, rb.peak.peak_reserved);
                let (at_least, peaks) = match f.generated.filter(|g| g.tokens as i64 > b) {
                    Some(g) => (g.tokens as i64, (g.peak_allocated, g.peak_reserved)),
                    None => (b, rb_peaks),
                };
                return Ok(Longest {
                    max: Some(at_least),
                    found: Found::AtLeast,
                    peaks: Some(peaks),
                    estimate: Some(estimate.max(at_least)),
                });
            }
            Some((f, None, _)) => {
                let peaks = (f.peak.peak_allocated, f.peak.peak_reserved);
                return Ok(Longest::exact(Some(limit), Some(peaks)));
            }
            Some((f, Some(o), _)) if o.iteration == Some(0) => {
                let done = f
                    .generated
                    .filter(|g| (b..limit).contains(&(g.tokens as i64)));
                if let (Some(g), true, true) = (done, only_frees, single) {
                    let peaks = (g.peak_allocated, g.peak_reserved);
                    return Ok(Longest::exact(Some(g.tokens as i64), Some(peaks)));
                }
                if let Some(g) = done.map(|g| g.tokens as i64) {
                    // a confirming run and, where a later iteration runs out first, a search:
                    // each about as long as the long run, within the budget unless --exact
                    let each = t_long.elapsed().as_secs_f64();
                    let search = ((g - b).max(2) as f64).log2().ceil() + 1.0;
                    if !exact && each * search > SIMULATION_BUDGET.as_secs_f64() {
                        return Ok(estimated);
                    }
                    *runs += 1;
                    let confirm = run_with(path, &overrides.with_param(param, g), opts)?;
                    if confirm.oom.is_none() {
                        let peaks = (confirm.peak.peak_allocated, confirm.peak.peak_reserved);
                        return Ok(Longest::exact(Some(g), Some(peaks)));
                    }
                    // (a later iteration, or a step after the last that allocates): `g + 1`
                    // does not fit, nor `g`; the search goes out from where this run ran out
                    let near = confirm
                        .generated
                        .map(|c| c.tokens as i64)
                        .filter(|c| (b..g).contains(c))
                        .unwrap_or(g - 1);
                    let mut refused = None;
                    let m = max_fitting_near(
                        &mut |v| fits_at(path, overrides, param, v, opts, runs, &mut refused),
                        near,
                        b,
                        g,
                    )?;
                    return Ok(Longest::exact(Some(m), None));
                }
            }
            // it ran out in a later iteration (the cache of the earlier ones still held, or
            // their segments split): near where it did is where a search starts
            Some((f, Some(_), _)) => {
                guess = f
                    .generated
                    .map(|g| g.tokens as i64)
                    .filter(|g| (b..limit).contains(g));
            }
            _ => {}
        }
        if opts.fast_forward {
            // a search of fast-forwarded runs, each about as long as the long one: two or
            // three from where the long run ran out
            let each = t_long.elapsed().as_secs_f64();
            // (from a guess, a bisection of what is left in the worst case: later iterations
            // can run out well before where the long run did)
            let searches = match guess {
                Some(_) => ((limit - b).max(2) as f64).log2().ceil() + 1.0,
                None => searches,
            };
            affordable = exact || each * searches <= SIMULATION_BUDGET.as_secs_f64();
        }
        if !affordable {
            return Ok(estimated);
        }
        tracing::debug!("the long run does not say where a generation stops fitting: searching");
    }
    // `b` fits (the second short run): the search goes out from the best guess at hand
    let mut refused = None;
    let m = max_fitting_near(
        &mut |v| fits_at(path, overrides, param, v, opts, runs, &mut refused),
        guess.unwrap_or(estimate),
        b,
        limit + 1,
    )?;
    let m = (m >= 1).then_some(m);
    // the answer's peaks: one more run, fast where the steps are fast-forwarded
    let peaks = match m {
        Some(v) if opts.fast_forward => {
            *runs += 1;
            let r = run_with(path, &overrides.with_param(param, v), opts)?;
            Some((r.peak.peak_allocated, r.peak.peak_reserved))
        }
        _ => None,
    };
    Ok(Longest::exact(m, peaks))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The search from a guess finds the boundary of a monotone predicate wherever the guess
    /// falls, and a close guess costs few runs.
    #[test]
    fn the_search_near_a_guess_finds_the_boundary() {
        for boundary in [1i64, 2, 7, 100, 3958, 9999] {
            for guess in [-5i64, 1, 50, boundary - 3, boundary, boundary + 1, 20_000] {
                let mut runs = 0;
                let got = max_fitting_near(
                    &mut |v| {
                        runs += 1;
                        Ok(v <= boundary)
                    },
                    guess,
                    0,
                    10_001,
                )
                .unwrap();
                assert_eq!(got, boundary, "guess {guess}");
                if guess == boundary {
                    assert_eq!(runs, 2, "boundary {boundary}");
                }
            }
        }
        // nothing between what fits and what does not: no run
        let got = max_fitting_near(&mut |_| panic!("no run needed"), 5, 4, 5).unwrap();
        assert_eq!(got, 4);
    }
}
