//! What `gpumem check` prints and writes: the verdict table (terminal), markdown (a pull-request
//! comment), JUnit XML (one test case per input and metric) and GitHub Actions annotations.
//! Everything here formats [`crate::analysis::check`]'s rows; nothing is judged here.

use std::collections::BTreeMap;
use std::io::Write;

use crate::analysis::check::{Growth, Judged, Row, Source, Verdict, OOM};
use crate::units::{format_bytes, format_bytes_signed, format_percent};

/// A metric's value as people read it: bytes, or for `oom` whether one happened.
fn value(r: &Row, v: u64) -> String {
    if r.metric == OOM {
        if v > 0 { "out of memory" } else { "none" }.into()
    } else {
        format_bytes(v)
    }
}

fn change(r: &Row) -> String {
    match (r.baseline, r.change()) {
        (Some(b), Some(c)) if r.metric != OOM => {
            let bytes = format_bytes_signed(c.clamp(i64::MIN as i128, i64::MAX as i128) as i64);
            if c == 0 {
                "0".into()
            } else if b == 0 {
                format!("+{bytes} (new)")
            } else {
                format!(
                    "{}{bytes} ({:+.2}%)",
                    if c > 0 { "+" } else { "" },
                    c as f64 * 100.0 / b as f64
                )
            }
        }
        _ => String::new(),
    }
}

fn limit(r: &Row) -> String {
    if r.metric == OOM {
        return match r.baseline {
            Some(0) => "none".into(),
            _ => String::new(),
        };
    }
    let Some(l) = r.limit else {
        return String::new();
    };
    let how = match (r.budget, r.baseline) {
        (Some(b), _) if b == l => "budget".to_string(),
        // the tolerance's floor in bytes, where it is more than the percentage
        (_, Some(b))
            if l.saturating_sub(b)
                > crate::analysis::check::tolerance_limit(b, r.tolerance_ppm) - b =>
        {
            format!(
                "+{} floor; +{} is less",
                format_bytes(l - b),
                format_percent(r.tolerance_ppm)
            )
        }
        _ => format!("+{}", format_percent(r.tolerance_ppm)),
    };
    format!("{} ({how})", format_bytes(l))
}

fn verdict(r: &Row) -> &'static str {
    r.verdict.label()
}

/// One line that says why a row fails, with exact bytes.
pub fn failure_message(r: &Row) -> String {
    let exact = |v: u64| format!("{} ({v} bytes)", format_bytes(v));
    match r.verdict {
        Verdict::NotInBaseline => format!(
            "{} is not in the baseline: record it with --update, or pass --allow-new",
            r.name
        ),
        _ if r.metric == OOM => format!("{} now runs out of memory; the baseline did not", r.name),
        Verdict::OverBudget => format!(
            "{} {} is {}, over its budget of {} by {} byte{} (budget from the {})",
            r.name,
            r.metric,
            exact(r.now),
            exact(r.budget.unwrap_or(0)),
            r.now - r.budget.unwrap_or(0),
            if r.now - r.budget.unwrap_or(0) == 1 {
                ""
            } else {
                "s"
            },
            r.budget_from.map_or("", |s| s.describe())
        ),
        _ => {
            let l = r.limit.unwrap_or(0);
            let tolerance = match r.tolerance_from {
                Source::Default if r.tolerance_ppm == 0 => "no tolerance set".to_string(),
                Source::Default => format!(
                    "the default tolerance of a category, {} and at least 1 MiB",
                    format_percent(r.tolerance_ppm)
                ),
                from => format!(
                    "tolerance {} from the {}",
                    format_percent(r.tolerance_ppm),
                    from.describe()
                ),
            };
            format!(
                "{} {} regressed: {} now, baseline {}, limit {} ({tolerance}): {} bytes over",
                r.name,
                r.metric,
                exact(r.now),
                exact(r.baseline.unwrap_or(0)),
                exact(l),
                r.now.saturating_sub(l)
            )
        }
    }
}

/// What grew, one line each, the tag stacks shown as the summary shows sites (innermost
/// Python frames first, abridged, more frames only where two would read alike; the JSON keeps
/// them whole).
/// The heading of a failing row's [`growth_lines`]: what grew since the baseline, or (no
/// baseline value: budgets only) what held the most at the peak.
fn growth_heading(r: &Row) -> &'static str {
    if r.baseline.is_some() {
        "grew most"
    } else {
        "held most at the peak"
    }
}

/// A failing row's largest growths, each a line; with no baseline value (budgets only), what
/// held the most at the peak, with no growth claimed.
fn row_growth_lines(r: &Row) -> Vec<String> {
    growth_lines(&r.grew, r.baseline.is_none())
}

fn growth_lines(grew: &[Growth], held: bool) -> Vec<String> {
    let tags: Vec<&str> = grew
        .iter()
        .filter(|g| g.kind != "category" && g.kind != "leak")
        .map(|g| g.name.as_str())
        .collect();
    let mut shown = crate::analysis::stacks::display_sites(&tags, false, 3).into_iter();
    grew.iter()
        .map(|g| {
            if g.kind == "category" || g.kind == "leak" {
                growth_line(g, held)
            } else {
                let name = shown.next().unwrap_or_else(|| g.name.clone());
                growth_line(&Growth { name, ..g.clone() }, held)
            }
        })
        .collect()
}

/// One growth as a line; `held`: what it held at the peak, no growth claimed (no baseline).
fn growth_line(g: &Growth, held: bool) -> String {
    match g.kind {
        "leak" => format!("leaks {}: {} per iteration", g.name, format_bytes(g.now)),
        kind if held => format!("{kind} {}: {}", g.name, format_bytes(g.now)),
        // the baseline keeps the largest tag stacks only
        "tags" if g.baseline == 0 => format!(
            "tags {}: {} (not among the baseline's largest at its peak)",
            g.name,
            format_bytes(g.now)
        ),
        kind => format!(
            "{} {}: +{} ({} -> {})",
            if kind == "category" {
                "category"
            } else {
                "tags"
            },
            g.name,
            format_bytes(g.now - g.baseline),
            format_bytes(g.baseline),
            format_bytes(g.now)
        ),
    }
}

/// Counts for the closing line.
struct Tally {
    checks: usize,
    failed: usize,
    regressed: usize,
    over_budget: usize,
    not_in_baseline: usize,
    improved: usize,
    new: usize,
    inputs: usize,
    failing_inputs: usize,
}

fn tally(judged: &[Judged]) -> Tally {
    let rows = || judged.iter().flat_map(|j| &j.rows);
    let count = |v: Verdict| rows().filter(|r| r.verdict == v).count();
    Tally {
        checks: rows().count(),
        failed: rows().filter(|r| r.verdict.fails()).count(),
        regressed: count(Verdict::Regressed),
        over_budget: count(Verdict::OverBudget),
        not_in_baseline: judged
            .iter()
            .filter(|j| j.rows.iter().any(|r| r.verdict == Verdict::NotInBaseline))
            .count(),
        improved: count(Verdict::Improved),
        new: judged.iter().filter(|j| !j.in_baseline).count(),
        inputs: judged.len(),
        failing_inputs: judged
            .iter()
            .filter(|j| j.rows.iter().any(|r| r.verdict.fails()))
            .count(),
    }
}

/// The one-line verdict of a check, as its report opens and closes.
pub fn verdict_line(judged: &[Judged]) -> String {
    closing(&tally(judged))
}

fn closing(t: &Tally) -> String {
    if t.failed == 0 {
        let mut s = format!(
            "gpumem check: passed: {} checks of {} input{}",
            t.checks,
            t.inputs,
            if t.inputs == 1 { "" } else { "s" }
        );
        if t.improved > 0 {
            s += &format!(
                "; {} improved (run with --update to lock the improvement in)",
                t.improved
            );
        }
        if t.new > 0 {
            s += &format!(
                "; {} new (not in the baseline; --update records them)",
                t.new
            );
        }
        s
    } else {
        let mut parts = Vec::new();
        if t.regressed > 0 {
            parts.push(format!("{} regressed", t.regressed));
        }
        if t.over_budget > 0 {
            parts.push(format!("{} over budget", t.over_budget));
        }
        if t.not_in_baseline > 0 {
            parts.push(format!(
                "{} input{} not in the baseline",
                t.not_in_baseline,
                if t.not_in_baseline == 1 { "" } else { "s" }
            ));
        }
        // the advice fits the failure: a baseline moves with --update, a budget does not
        let advice = match (t.regressed + t.not_in_baseline > 0, t.over_budget > 0) {
            (true, true) => {
                " If the growth is intended, refresh the baseline with --update and commit it; \
                 a budget is a limit: need less memory, or raise the budget (--budget, or \
                 max_METRIC in the workload's [check])."
            }
            (true, false) => {
                " If the change is intended, refresh the baseline with --update and commit it."
            }
            _ => {
                " A budget is a limit, not a record: make the workload need less memory, or \
                 raise the budget (--budget, or max_METRIC in the workload's [check])."
            }
        };
        format!(
            "gpumem check: FAILED: {} of {} checks in {} of {} inputs ({}).{advice}",
            t.failed,
            t.checks,
            t.failing_inputs,
            t.inputs,
            parts.join(", ")
        )
    }
}

/// The terminal report: the table, failing rows first; then each failure with what grew most.
pub fn write_text(out: &mut dyn Write, baseline: &str, judged: &[Judged]) -> std::io::Result<()> {
    let rows = crate::analysis::check::order_rows(judged);
    let t = tally(judged);
    let first = super::style::wrap(&closing(&t));
    writeln!(
        out,
        "{}",
        if t.failed == 0 {
            super::style::good(&first)
        } else {
            super::style::bad(&first)
        }
    )?;
    writeln!(out, "baseline: {baseline}")?;
    let mut t = super::style::table();
    t.set_header(vec![
        "input", "metric", "baseline", "now", "change", "limit", "verdict",
    ]);
    for r in &rows {
        // an input missing from the baseline is one line, not one per metric
        if !matches!(r.verdict, Verdict::NotInBaseline | Verdict::New) {
            t.add_row(vec![
                r.name.clone(),
                r.metric.clone(),
                r.baseline.map(|b| value(r, b)).unwrap_or_default(),
                value(r, r.now),
                change(r),
                limit(r),
                verdict(r).to_string(),
            ]);
        }
    }
    for j in judged.iter().filter(|j| !j.in_baseline) {
        let now = |m: &str| {
            j.rows
                .iter()
                .find(|r| r.metric == m)
                .map(|r| value(r, r.now))
                .unwrap_or_default()
        };
        let v = if j.rows.iter().any(|r| r.verdict == Verdict::NotInBaseline) {
            Verdict::NotInBaseline
        } else {
            Verdict::New
        };
        t.add_row(vec![
            j.name.clone(),
            "(all)".into(),
            "not in the baseline".into(),
            format!(
                "peak allocated {}, reserved {}",
                now("peak_allocated"),
                now("peak_reserved")
            ),
            String::new(),
            String::new(),
            v.label().to_string(),
        ]);
    }
    super::align_right(&mut t, 2);
    writeln!(out, "{t}")?;
    let failing: Vec<&&Row> = rows
        .iter()
        .filter(|r| r.verdict.fails() && r.verdict != Verdict::NotInBaseline)
        .collect();
    for r in &failing {
        writeln!(out, "\n{}", failure_message(r))?;
        if !r.grew.is_empty() {
            writeln!(out, "  {}:", growth_heading(r))?;
            for g in row_growth_lines(r) {
                writeln!(out, "    {g}")?;
            }
        }
    }
    for j in judged.iter().filter(|j| !j.in_baseline) {
        if j.rows.iter().any(|r| r.verdict == Verdict::NotInBaseline) {
            writeln!(
                out,
                "\n{} is not in the baseline: record it with --update, or pass --allow-new",
                j.name
            )?;
        }
    }
    let t = tally(judged);
    let text = super::style::wrap(&closing(&t));
    let text = if t.failed == 0 {
        super::style::good(&text)
    } else {
        super::style::bad(&text)
    };
    writeln!(out, "\n{text}")
}

fn md(s: &str) -> String {
    super::escape::markdown(s)
}

/// The report as GitHub-flavoured markdown, for a pull-request comment.
pub fn write_markdown(out: &mut dyn Write, judged: &[Judged]) -> std::io::Result<()> {
    let t = tally(judged);
    writeln!(
        out,
        "### gpumem check: {}\n",
        if t.failed == 0 {
            "passed ✅"
        } else {
            "failed ❌"
        }
    )?;
    writeln!(
        out,
        "| input | metric | baseline | now | change | limit | verdict |"
    )?;
    writeln!(out, "|---|---|--:|--:|--:|--:|---|")?;
    for r in crate::analysis::check::order_rows(judged) {
        let v = if r.verdict.fails() {
            format!("**{}**", verdict(r))
        } else {
            verdict(r).to_string()
        };
        writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} |",
            md(&r.name),
            md(&r.metric),
            r.baseline
                .map(|b| value(r, b))
                .unwrap_or_else(|| "—".into()),
            value(r, r.now),
            md(&change(r)),
            md(&limit(r)),
            v
        )?;
    }
    let rows = crate::analysis::check::order_rows(judged);
    let failing: Vec<&&Row> = rows.iter().filter(|r| r.verdict.fails()).collect();
    if !failing.is_empty() {
        writeln!(out, "\n#### Why")?;
        for r in failing {
            writeln!(out, "\n- {}", md(&failure_message(r)))?;
            for g in row_growth_lines(r) {
                writeln!(out, "  - {}", md(&g))?;
            }
        }
    }
    writeln!(out, "\n{}", md(&closing(&t)))
}

/// JUnit XML: one `<testsuite name="gpumem check">` with a `<testcase classname="INPUT"
/// name="METRIC">` per input and metric, and a `<failure>` in each failing one. `files` maps an
/// input's name to its path.
pub fn junit(judged: &[Judged], files: &BTreeMap<String, String>) -> String {
    use quick_junit::{NonSuccessKind, Report, TestCase, TestCaseStatus, TestSuite};
    let mut suite = TestSuite::new("gpumem check");
    for j in judged {
        for r in &j.rows {
            let status = if r.verdict.fails() {
                let mut body = format!(
                    "baseline: {}\nnow: {}\nlimit: {}\nverdict: {}\n",
                    r.baseline
                        .map(|b| value(r, b))
                        .unwrap_or_else(|| "none".into()),
                    value(r, r.now),
                    limit(r),
                    verdict(r)
                );
                if !r.grew.is_empty() {
                    body += &format!("{}:\n", growth_heading(r));
                    for g in row_growth_lines(r) {
                        body += &format!("  {g}\n");
                    }
                }
                let kind = match r.verdict {
                    Verdict::OverBudget => "over-budget",
                    Verdict::NotInBaseline => "not-in-baseline",
                    _ => "regression",
                };
                let mut s = TestCaseStatus::non_success(NonSuccessKind::Failure);
                s.set_message(failure_message(r))
                    .set_type(kind)
                    .set_description(body);
                s
            } else {
                TestCaseStatus::success()
            };
            let mut case = TestCase::new(r.metric.as_str(), status);
            case.set_classname(r.name.as_str());
            if let Some(f) = files.get(&r.name) {
                case.extra.insert("file".into(), f.as_str().into());
            }
            if !r.verdict.fails() {
                case.set_system_out(format!("{}: {}", verdict(r), value(r, r.now)));
            }
            suite.add_test_case(case);
        }
    }
    let mut report = Report::new("gpumem check");
    report.add_test_suite(suite);
    // serializing to memory fails only on a writer error, which a String does not have
    report
        .to_string()
        .unwrap_or_else(|e| format!("<!-- cannot write JUnit XML: {e} -->\n"))
}

/// A workflow command's message (`%`, CR and LF escaped, as GitHub's toolkit does).
fn gh_data(s: &str) -> String {
    s.replace('%', "%25")
        .replace('\r', "%0D")
        .replace('\n', "%0A")
}

/// A workflow command's property value (also `:` and `,`).
fn gh_prop(s: &str) -> String {
    gh_data(s).replace(':', "%3A").replace(',', "%2C")
}

/// GitHub Actions annotations: `::error` for each failing row, `::warning` for an input not
/// in the baseline but allowed, `::notice` for each improvement.
pub fn write_github(
    out: &mut dyn Write,
    judged: &[Judged],
    files: &BTreeMap<String, String>,
) -> std::io::Result<()> {
    for r in crate::analysis::check::order_rows(judged) {
        let level = match r.verdict {
            v if v.fails() => "error",
            Verdict::Improved => "notice",
            _ => continue,
        };
        let file = files
            .get(&r.name)
            .map(|f| format!("file={},", gh_prop(f)))
            .unwrap_or_default();
        let mut msg = if r.verdict == Verdict::Improved {
            format!(
                "{} {} improved: {} now, baseline {}; refresh the baseline with --update",
                r.name,
                r.metric,
                value(r, r.now),
                r.baseline.map(|b| value(r, b)).unwrap_or_default()
            )
        } else {
            failure_message(r)
        };
        for g in row_growth_lines(r) {
            msg += &format!("\n{}: {g}", growth_heading(r));
        }
        writeln!(
            out,
            "::{level} {file}title={}::{}",
            gh_prop(&format!("gpumem check: {} {}", r.name, r.metric)),
            gh_data(&msg)
        )?;
    }
    for j in judged.iter().filter(|j| !j.in_baseline) {
        if j.rows.iter().all(|r| !r.verdict.fails()) {
            writeln!(
                out,
                "::warning {}title={}::{}",
                files
                    .get(&j.name)
                    .map(|f| format!("file={},", gh_prop(f)))
                    .unwrap_or_default(),
                gh_prop(&format!("gpumem check: {}", j.name)),
                gh_data(&format!(
                    "{} is not in the baseline (allowed by --allow-new); record it with --update",
                    j.name
                ))
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping() {
        assert_eq!(gh_prop("a:b,c%\n"), "a%3Ab%2Cc%25%0A");
    }
}
