//! The verdict line that opens `run`, `fit`, `summary` and `check`: "fits on 24.00 GiB: ..." in
//! green or "does not fit on ..." in red (on a colour terminal), wrapped to the terminal.

use crate::analysis::verdict::FitVerdict;

/// The line, wrapped to the output's width, its head coloured where colour is on.
pub fn line(v: &FitVerdict) -> String {
    let wrapped = super::style::wrap(&v.line);
    let head = v.line.split(':').next().unwrap_or("");
    match wrapped.strip_prefix(head) {
        // (a head wrapped over two lines stays plain)
        Some(rest) if !head.is_empty() => {
            let head = if v.fits {
                super::style::good(head)
            } else {
                super::style::bad(head)
            };
            format!("{head}{rest}")
        }
        _ => wrapped,
    }
}
