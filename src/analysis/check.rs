//! `gpumem check`'s judgement, pure: a run's (or snapshot's) metrics against a baseline entry,
//! tolerances and budgets, with a verdict per metric and, for each regression, what grew most.
//!
//! # The metrics
//!
//! - `peak_allocated`, `peak_reserved`: the highest allocated and reserved bytes of the run (for
//!   a run that ran out of memory: up to the failure).
//! - `CATEGORY_at_peak` (`activation_at_peak`, `optimizer_state_at_peak`, ...): the bytes each
//!   category held at the moment allocated memory peaked. Not each category's own highest
//!   point: at the peak is what decides whether a run fits, and it adds up to `peak_allocated`.
//! - `leak_per_iteration`: bytes left behind per iteration, summed over the leaks found. A leak
//!   where the baseline had none is a regression (its limit is 0 plus 0%). A run too short to
//!   compare iterations (or a snapshot without its trace) did not look for leaks: the metric is
//!   then absent, neither recorded nor judged.
//! - `oom`: whether the run ran out of memory (no tolerance, no budget): a regression when it
//!   does and the baseline's did not.
//!
//! # Limits, exact to the byte (Note [Check limits])
//!
//! A tolerance is kept in integer parts per million (2% = 20000 ppm), and a metric's limit is
//! `baseline + floor(baseline * ppm / 1_000_000)`, computed in 128-bit integers. A budget is a
//! limit of its own. A value passes when it is at most every limit that applies: exactly at the
//! limit passes, one byte over fails. Below the baseline is an improvement (it passes; the
//! report suggests `--update` to lock it in).
//!
//! # Why it grew
//!
//! The baseline entry keeps the categories and the tag stacks at its peak, so a regression can
//! say what grew against the baseline without running the old code again.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::diff;

/// The baseline file's schema version (`"gpumem_baseline": 1`).
pub const BASELINE_VERSION: u64 = 1;

/// The metric names that are not per category; categories give `CATEGORY_at_peak`.
pub const PEAK_ALLOCATED: &str = "peak_allocated";
pub const PEAK_RESERVED: &str = "peak_reserved";
pub const LEAK: &str = "leak_per_iteration";
pub const OOM: &str = "oom";

/// What one run or snapshot measured.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Measurement {
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    /// `None`: leaks were not looked for (too few iterations to compare, or a snapshot without
    /// its trace); the metric is then neither recorded nor judged.
    pub leak_per_iteration: Option<u64>,
    pub oom: bool,
    /// Bytes by category at the peak.
    pub categories_at_peak: BTreeMap<String, u64>,
    /// Bytes by tag stack (or allocation site) at the peak: the largest few.
    pub top_tags_at_peak: BTreeMap<String, u64>,
    /// The leaking sites, bytes per iteration.
    pub leak_sites: BTreeMap<String, u64>,
}

/// One entry of the baseline file: what a run measured when it was recorded, and the
/// tolerances and budgets set for it (kept by `--update`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    /// Tolerances and budgets, with the keys of a workload's `[check]` table (read by the
    /// command, which knows them).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub check: BTreeMap<String, serde_json::Value>,
    /// The file it was recorded from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The gpumem that recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpumem_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_allocated: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_reserved: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leak_per_iteration: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom: Option<bool>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub categories_at_peak: BTreeMap<String, u64>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub top_tags_at_peak: BTreeMap<String, u64>,
}

impl Entry {
    /// An entry recording `m`, with `check` settings kept from an older entry.
    pub fn record(
        m: &Measurement,
        source: &str,
        version: &str,
        check: BTreeMap<String, serde_json::Value>,
    ) -> Entry {
        Entry {
            check,
            source: Some(source.to_string()),
            gpumem_version: Some(version.to_string()),
            peak_allocated: Some(m.peak_allocated),
            peak_reserved: Some(m.peak_reserved),
            leak_per_iteration: m.leak_per_iteration,
            oom: Some(m.oom),
            categories_at_peak: m.categories_at_peak.clone(),
            top_tags_at_peak: m.top_tags_at_peak.clone(),
        }
    }

    /// Whether it holds recorded values (an entry may hold only budgets).
    pub fn is_recorded(&self) -> bool {
        self.peak_allocated.is_some() || self.peak_reserved.is_some()
    }
}

/// The baseline file: a schema version and the entries by name, in a stable order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Baseline {
    pub gpumem_baseline: u64,
    pub entries: BTreeMap<String, Entry>,
}

impl Default for Baseline {
    fn default() -> Self {
        Baseline {
            gpumem_baseline: BASELINE_VERSION,
            entries: BTreeMap::new(),
        }
    }
}

/// Where a tolerance or budget came from, for the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    CommandLine,
    Workload,
    Baseline,
    /// No source set one: the default tolerance, 0.
    Default,
}

impl Source {
    pub fn describe(self) -> &'static str {
        match self {
            Source::CommandLine => "command line",
            Source::Workload => "workload [check]",
            Source::Baseline => "baseline",
            Source::Default => "default",
        }
    }
}

/// The tolerance and budget that hold for one metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub tolerance_ppm: u64,
    pub tolerance_from: Source,
    /// Bytes a metric may grow whatever its tolerance (the default category tolerance's
    /// floor, so a small category's few KiB do not fail a check).
    pub slack: u64,
    pub budget: Option<(u64, Source)>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            tolerance_ppm: 0,
            tolerance_from: Source::Default,
            slack: 0,
            budget: None,
        }
    }
}

/// The default tolerance of a `CATEGORY_at_peak` metric, where nothing sets one: 1%, and at
/// least [`CATEGORY_DEFAULT_SLACK`] bytes. Categories move between each other when a change
/// renames or reorders an op (a temporary saved becomes an activation); the totals
/// (`peak_allocated`, `peak_reserved`) keep a default of 0.
pub const CATEGORY_DEFAULT_TOLERANCE_PPM: u64 = 10_000;
/// See [`CATEGORY_DEFAULT_TOLERANCE_PPM`]: 1 MiB.
pub const CATEGORY_DEFAULT_SLACK: u64 = 1 << 20;

/// The defaults of `metric` where no source sets a tolerance.
pub fn default_limits(metric: &str) -> Limits {
    if metric.ends_with("_at_peak") {
        Limits {
            tolerance_ppm: CATEGORY_DEFAULT_TOLERANCE_PPM,
            slack: CATEGORY_DEFAULT_SLACK,
            ..Limits::default()
        }
    } else {
        Limits::default()
    }
}

/// The highest value that passes against `baseline` with a tolerance of `ppm` parts per
/// million: `baseline + floor(baseline * ppm / 1_000_000)` (Note [Check limits]).
pub fn tolerance_limit(baseline: u64, ppm: u64) -> u64 {
    let extra = (baseline as u128 * ppm as u128) / 1_000_000;
    (baseline as u128 + extra).min(u64::MAX as u128) as u64
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Within the limits, and not below the baseline.
    Ok,
    /// Below the baseline.
    Improved,
    /// Above the baseline plus its tolerance.
    Regressed,
    /// Above a budget.
    OverBudget,
    /// No baseline entry, and `--allow-new`.
    New,
    /// No baseline entry: fails.
    NotInBaseline,
}

impl Verdict {
    pub fn fails(self) -> bool {
        matches!(
            self,
            Verdict::Regressed | Verdict::OverBudget | Verdict::NotInBaseline
        )
    }

    pub fn label(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Improved => "improved",
            Verdict::Regressed => "REGRESSED",
            Verdict::OverBudget => "OVER BUDGET",
            Verdict::New => "new",
            Verdict::NotInBaseline => "NOT IN BASELINE",
        }
    }
}

/// Something that grew between the baseline and now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Growth {
    /// "category", "tags" or "leak".
    pub kind: &'static str,
    pub name: String,
    pub baseline: u64,
    pub now: u64,
}

/// One metric of one input, judged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Row {
    pub name: String,
    pub metric: String,
    /// None where the baseline has no value for it.
    pub baseline: Option<u64>,
    /// Bytes; for `oom`, 1 for an out-of-memory and 0 for none.
    pub now: u64,
    /// The lowest limit that applies, where one does.
    pub limit: Option<u64>,
    pub tolerance_ppm: u64,
    pub tolerance_from: Source,
    pub budget: Option<u64>,
    pub budget_from: Option<Source>,
    pub verdict: Verdict,
    /// For a failing row: what grew most, largest first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub grew: Vec<Growth>,
}

impl Row {
    /// now - baseline, where there is a baseline.
    pub fn change(&self) -> Option<i128> {
        self.baseline.map(|b| self.now as i128 - b as i128)
    }
}

/// Everything `check` found for one input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Judged {
    pub name: String,
    /// Whether the baseline had an entry for it.
    pub in_baseline: bool,
    pub rows: Vec<Row>,
}

/// Judges `m` (the input called `name`) against its baseline `entry`, with `limits` giving
/// each metric's tolerance and budget. Failing rows come with the `top` things that grew most.
pub fn judge(
    name: &str,
    m: &Measurement,
    entry: Option<&Entry>,
    limits: &dyn Fn(&str) -> Limits,
    allow_new: bool,
    top: usize,
) -> Judged {
    let recorded = entry.filter(|e| e.is_recorded());
    // the metrics: the fixed ones, and each category either side has
    let mut metrics: Vec<(String, u64, Option<u64>)> = vec![
        (
            PEAK_ALLOCATED.into(),
            m.peak_allocated,
            recorded.and_then(|e| e.peak_allocated),
        ),
        (
            PEAK_RESERVED.into(),
            m.peak_reserved,
            recorded.and_then(|e| e.peak_reserved),
        ),
    ];
    // a leak is judged where this run looked for leaks: against the baseline's figure, or
    // none where the baseline's run did not look
    if let Some(leak) = m.leak_per_iteration {
        let base = recorded.map(|e| e.leak_per_iteration.unwrap_or(0));
        metrics.push((LEAK.into(), leak, base));
    }
    metrics.push((
        OOM.into(),
        m.oom as u64,
        recorded.map(|e| e.oom.unwrap_or(false) as u64),
    ));
    let mut cats: Vec<&String> = m.categories_at_peak.keys().collect();
    if let Some(e) = recorded {
        cats.extend(e.categories_at_peak.keys());
    }
    cats.sort();
    cats.dedup();
    for c in cats {
        metrics.push((
            format!("{c}_at_peak"),
            m.categories_at_peak.get(c).copied().unwrap_or(0),
            recorded.map(|e| e.categories_at_peak.get(c).copied().unwrap_or(0)),
        ));
    }
    let mut rows = Vec::new();
    for (metric, now, baseline) in metrics {
        let l = limits(&metric);
        // an entry that holds only budgets: only the budgeted metrics are checked
        if entry.is_some() && recorded.is_none() && l.budget.is_none() {
            continue;
        }
        let is_oom = metric == OOM;
        let budget = if is_oom { None } else { l.budget };
        let tol_limit = baseline.map(|b| {
            if is_oom {
                b
            } else {
                tolerance_limit(b, l.tolerance_ppm).max(b.saturating_add(l.slack))
            }
        });
        let limit = match (tol_limit, budget) {
            (Some(t), Some((b, _))) => Some(t.min(b)),
            (t, b) => t.or(b.map(|x| x.0)),
        };
        let verdict = if budget.is_some_and(|(b, _)| now > b) {
            Verdict::OverBudget
        } else if entry.is_none() {
            if allow_new {
                Verdict::New
            } else {
                Verdict::NotInBaseline
            }
        } else {
            match (baseline, tol_limit) {
                (Some(_), Some(t)) if now > t => Verdict::Regressed,
                (Some(b), _) if now < b => Verdict::Improved,
                _ => Verdict::Ok,
            }
        };
        let grew = if matches!(verdict, Verdict::Regressed | Verdict::OverBudget) {
            why(&metric, m, recorded, top)
        } else {
            Vec::new()
        };
        rows.push(Row {
            name: name.to_string(),
            metric,
            baseline,
            now,
            limit,
            tolerance_ppm: if is_oom { 0 } else { l.tolerance_ppm },
            tolerance_from: l.tolerance_from,
            budget: budget.map(|b| b.0),
            budget_from: budget.map(|b| b.1),
            verdict,
            grew,
        });
    }
    Judged {
        name: name.to_string(),
        in_baseline: entry.is_some(),
        rows,
    }
}

/// What grew most for a failing `metric`: for a leak, the leaking sites; for a category,
/// nothing more (the row says it); otherwise the categories, then the tag stacks. Against the
/// baseline's record where there is one, else what holds most now.
fn why(metric: &str, m: &Measurement, base: Option<&Entry>, top: usize) -> Vec<Growth> {
    let grown = |kind: &'static str, a: &BTreeMap<String, u64>, b: &BTreeMap<String, u64>| {
        let a: Vec<(String, u64)> = a.iter().map(|(k, v)| (k.clone(), *v)).collect();
        let b: Vec<(String, u64)> = b.iter().map(|(k, v)| (k.clone(), *v)).collect();
        diff::rows(&a, &b, usize::MAX)
            .into_iter()
            .filter(|r| r.b > r.a)
            .map(|r| Growth {
                kind,
                name: r.name,
                baseline: r.a,
                now: r.b,
            })
            .collect::<Vec<_>>()
    };
    let empty = BTreeMap::new();
    let base_cats = base.map_or(&empty, |e| &e.categories_at_peak);
    let base_tags = base.map_or(&empty, |e| &e.top_tags_at_peak);
    let by_growth = |mut v: Vec<Growth>| {
        v.sort_by(|x, y| {
            (y.now - y.baseline)
                .cmp(&(x.now - x.baseline))
                .then(x.name.cmp(&y.name))
        });
        v.truncate(top);
        v
    };
    if metric == LEAK {
        return by_growth(grown("leak", &empty, &m.leak_sites));
    }
    if metric.ends_with("_at_peak") {
        // the row is the category itself; the tag stacks kept carry no category to split by
        return Vec::new();
    }
    let mut out = by_growth(grown("category", base_cats, &m.categories_at_peak));
    out.extend(by_growth(grown("tags", base_tags, &m.top_tags_at_peak)));
    out
}

/// Failing rows first (in input order), then the rest, each group keeping its order.
pub fn order_rows(judged: &[Judged]) -> Vec<&Row> {
    let mut rows: Vec<&Row> = judged.iter().flat_map(|j| &j.rows).collect();
    rows.sort_by_key(|r| !r.verdict.fails());
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn limit_arithmetic_is_exact() {
        assert_eq!(tolerance_limit(1_000_000, 20_000), 1_020_000);
        assert_eq!(tolerance_limit(999, 20_000), 1_018); // 19.98 floors to 19
        assert_eq!(tolerance_limit(0, 20_000), 0);
        assert_eq!(tolerance_limit(u64::MAX, 1), u64::MAX);
        assert_eq!(tolerance_limit(12345, 0), 12345);
    }

    proptest! {
        #[test]
        fn limit_is_the_largest_value_within_tolerance(b in 0u64..1 << 50, ppm in 0u64..2_000_000) {
            let l = tolerance_limit(b, ppm);
            // l passes: (l - b) * 1e6 <= b * ppm; l + 1 does not
            prop_assert!(((l - b) as u128) * 1_000_000 <= b as u128 * ppm as u128);
            prop_assert!(((l + 1 - b) as u128) * 1_000_000 > b as u128 * ppm as u128);
        }
    }

    /// A run that did not look for leaks records no leak figure and is not judged on one,
    /// even against a baseline that recorded one.
    #[test]
    fn a_leak_not_looked_for_is_neither_recorded_nor_judged() {
        let tol = |_: &str| Limits {
            tolerance_ppm: 0,
            tolerance_from: Source::CommandLine,
            slack: 0,
            budget: None,
        };
        let mut short = m(1_000_000, 400_000);
        short.leak_per_iteration = None;
        let e = Entry::record(&short, "w.toml", "0", BTreeMap::new());
        assert_eq!(e.leak_per_iteration, None);
        let mut base = e.clone();
        base.leak_per_iteration = Some(0);
        let j = judge("w", &short, Some(&base), &tol, false, 3);
        assert!(j.rows.iter().all(|r| r.metric != LEAK), "{:?}", j.rows);
        let mut looked = short.clone();
        looked.leak_per_iteration = Some(0);
        let j = judge("w", &looked, Some(&e), &tol, false, 3);
        let row = j.rows.iter().find(|r| r.metric == LEAK).unwrap();
        assert_eq!((row.baseline, row.now), (Some(0), 0));
    }

    fn m(alloc: u64, act: u64) -> Measurement {
        Measurement {
            peak_allocated: alloc,
            peak_reserved: alloc * 2,
            categories_at_peak: [
                ("activation".to_string(), act),
                ("parameter".into(), alloc - act),
            ]
            .into(),
            top_tags_at_peak: [("iter:0/op:relu".to_string(), act)].into(),
            ..Default::default()
        }
    }

    fn verdict(j: &Judged, metric: &str) -> Verdict {
        j.rows.iter().find(|r| r.metric == metric).unwrap().verdict
    }

    #[test]
    fn a_category_moves_by_a_few_kib_within_its_default_tolerance_the_totals_do_not() {
        let mut before = m(1_000_000, 400_000);
        before
            .categories_at_peak
            .insert("activation".into(), 100 << 10);
        let base = Entry::record(&before, "w.toml", "0", BTreeMap::new());
        let mut now = before.clone();
        // +16 KiB of a 100 KiB category: 16%, under the 1 MiB floor
        now.categories_at_peak
            .insert("activation".into(), 116 << 10);
        let j = judge("w", &now, Some(&base), &default_limits, false, 3);
        assert_eq!(verdict(&j, "activation_at_peak"), Verdict::Ok);
        // past the floor it fails
        now.categories_at_peak
            .insert("activation".into(), (100 << 10) + (1 << 20) + 1);
        let j = judge("w", &now, Some(&base), &default_limits, false, 3);
        assert_eq!(verdict(&j, "activation_at_peak"), Verdict::Regressed);
        // the totals keep 0: one byte fails
        let j = judge(
            "w",
            &m(1_000_001, 400_000),
            Some(&base),
            &default_limits,
            false,
            3,
        );
        assert_eq!(verdict(&j, PEAK_ALLOCATED), Verdict::Regressed);
    }

    #[test]
    fn boundaries_and_budgets() {
        let base = Entry::record(&m(1_000_000, 400_000), "w.toml", "0", BTreeMap::new());
        let tol = |ppm| {
            move |_: &str| Limits {
                tolerance_ppm: ppm,
                tolerance_from: Source::CommandLine,
                slack: 0,
                budget: None,
            }
        };
        // 2%: 1_020_000 passes, 1_020_001 fails
        let j = judge(
            "w",
            &m(1_020_000, 400_000),
            Some(&base),
            &tol(20_000),
            false,
            3,
        );
        assert_eq!(verdict(&j, PEAK_ALLOCATED), Verdict::Ok);
        let j = judge(
            "w",
            &m(1_020_001, 400_000),
            Some(&base),
            &tol(20_000),
            false,
            3,
        );
        assert_eq!(verdict(&j, PEAK_ALLOCATED), Verdict::Regressed);
        let j = judge("w", &m(999_999, 400_000), Some(&base), &tol(0), false, 3);
        assert_eq!(verdict(&j, PEAK_ALLOCATED), Verdict::Improved);
        // a budget: at it passes, one byte over fails, whatever the tolerance
        let budget = |b| {
            move |metric: &str| Limits {
                tolerance_ppm: 1_000_000,
                tolerance_from: Source::CommandLine,
                slack: 0,
                budget: (metric == PEAK_ALLOCATED).then_some((b, Source::Baseline)),
            }
        };
        let j = judge(
            "w",
            &m(1_000_000, 400_000),
            Some(&base),
            &budget(1_000_000),
            false,
            3,
        );
        assert_eq!(verdict(&j, PEAK_ALLOCATED), Verdict::Ok);
        let j = judge(
            "w",
            &m(1_000_000, 400_000),
            Some(&base),
            &budget(999_999),
            false,
            3,
        );
        assert_eq!(verdict(&j, PEAK_ALLOCATED), Verdict::OverBudget);
        // why: the activations grew
        let j = judge("w", &m(1_500_000, 900_000), Some(&base), &tol(0), false, 3);
        let r = j.rows.iter().find(|r| r.metric == PEAK_ALLOCATED).unwrap();
        assert_eq!(r.grew[0].name, "activation");
        assert_eq!((r.grew[0].baseline, r.grew[0].now), (400_000, 900_000));
        assert_eq!(r.grew[1].kind, "tags");
        assert_eq!(verdict(&j, "activation_at_peak"), Verdict::Regressed);
        assert_eq!(verdict(&j, "parameter_at_peak"), Verdict::Ok);
        // a new leak and a new out-of-memory are regressions
        let mut leaky = m(1_000_000, 400_000);
        leaky.leak_per_iteration = Some(512);
        leaky.oom = true;
        let j = judge("w", &leaky, Some(&base), &tol(20_000), false, 3);
        assert_eq!(verdict(&j, LEAK), Verdict::Regressed);
        assert_eq!(verdict(&j, OOM), Verdict::Regressed);
        // no entry: fails, unless allowed
        let j = judge("w", &m(1, 0), None, &tol(0), false, 3);
        assert!(j.rows.iter().all(|r| r.verdict == Verdict::NotInBaseline));
        let j = judge("w", &m(1, 0), None, &tol(0), true, 3);
        assert!(j.rows.iter().all(|r| r.verdict == Verdict::New));
        // an entry with budgets only checks the budgeted metrics
        let j = judge("w", &m(5, 0), Some(&Entry::default()), &budget(5), false, 3);
        assert_eq!(j.rows.len(), 1);
        assert_eq!(j.rows[0].verdict, Verdict::Ok);
    }
}
