//! How text output looks where it goes: colour on or off and the width tables must fit, both
//! decided once by `main.rs` (`--color`, `NO_COLOR`, a terminal or not, `COLUMNS`) before any
//! report is written. Reports ask [`table`] for a table and wrap emphasis in [`heading`],
//! [`bad`], [`good`] or [`warn`]; with colour off these return the text unchanged.

use std::sync::OnceLock;

use comfy_table::{presets::UTF8_FULL_CONDENSED, ContentArrangement, Table};

/// Where the output goes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Output {
    /// ANSI colour and bold.
    pub color: bool,
    /// The width tables must fit, in columns (none: as wide as their content).
    pub width: Option<u16>,
}

static OUTPUT: OnceLock<Output> = OnceLock::new();

/// Sets where the output goes (the first call wins; without one: no colour, no width limit,
/// as the library's callers and tests expect).
pub fn init(o: Output) {
    let _ = OUTPUT.set(o);
}

fn output() -> Output {
    OUTPUT.get().copied().unwrap_or_default()
}

/// The width tables must fit, if any.
pub fn width() -> Option<u16> {
    output().width
}

/// Whether colour is on.
pub fn color() -> bool {
    output().color
}

/// Colour from the user's choice and the environment, as most command-line tools decide it:
/// `always` and `never` win; `auto` colours a terminal unless `NO_COLOR` is set and non-empty
/// or `TERM` is `dumb`; `CLICOLOR_FORCE` (non-empty, not `0`) colours any output in `auto`.
pub fn decide_color(
    choice: crate::cli::ColorWhen,
    is_terminal: bool,
    env: &dyn Fn(&str) -> Option<String>,
) -> bool {
    use crate::cli::ColorWhen;
    let set = |k: &str| env(k).is_some_and(|v| !v.is_empty());
    match choice {
        ColorWhen::Always => true,
        ColorWhen::Never => false,
        ColorWhen::Auto => {
            if set("NO_COLOR") {
                false
            } else if env("CLICOLOR_FORCE").is_some_and(|v| !v.is_empty() && v != "0") {
                true
            } else {
                is_terminal && env("TERM").as_deref() != Some("dumb")
            }
        }
    }
}

/// The width tables must fit: `COLUMNS` when set (at least 40), else the terminal's width when
/// the output is one, else none.
pub fn decide_width(
    terminal_width: Option<u16>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Option<u16> {
    env("COLUMNS")
        .and_then(|v| v.trim().parse::<u16>().ok())
        .filter(|w| *w >= 40)
        .or(terminal_width)
}

/// A table in gpumem's style, fitted to the output's width: when the content is wider, the
/// text columns wrap and the figure columns (see [`super::align_right`]) keep their width.
pub fn table() -> Table {
    let o = output();
    let mut t = Table::new();
    t.load_style(UTF8_FULL_CONDENSED);
    if o.color {
        t.enforce_styling();
    } else {
        t.force_no_tty();
    }
    if let Some(w) = o.width {
        t.set_width(w)
            .set_content_arrangement(ContentArrangement::Dynamic);
    }
    t
}

/// `text` as lines that fit the output's width (unchanged without one), words kept whole,
/// continuation lines indented by two spaces.
pub fn wrap(text: &str) -> String {
    match output().width {
        Some(w) if text.chars().count() > w as usize => {
            let opts = textwrap::Options::new(w as usize).subsequent_indent("  ");
            textwrap::fill(text, opts)
        }
        _ => text.to_string(),
    }
}

/// How many characters a fill map may take when a line holds `fixed` other characters: 64,
/// or the largest power of two that fits the output's width (at least 8).
pub fn map_chars(fixed: usize) -> usize {
    match output().width {
        Some(w) => {
            let room = (w as usize).saturating_sub(fixed);
            let mut n = 64;
            while n > 8 && n > room {
                n /= 2;
            }
            n
        }
        None => 64,
    }
}

fn paint(text: &str, style: anstyle::Style) -> String {
    if color() {
        format!("{}{text}{}", style.render(), style.render_reset())
    } else {
        text.to_string()
    }
}

/// A section's heading: bold.
pub fn heading(text: &str) -> String {
    paint(text, anstyle::Style::new().bold())
}

/// Something that failed or ran out: bold red.
pub fn bad(text: &str) -> String {
    paint(
        text,
        anstyle::Style::new()
            .bold()
            .fg_color(Some(anstyle::AnsiColor::Red.into())),
    )
}

/// Something that holds: green.
pub fn good(text: &str) -> String {
    paint(
        text,
        anstyle::Style::new().fg_color(Some(anstyle::AnsiColor::Green.into())),
    )
}

/// Something to look at: yellow.
pub fn warn(text: &str) -> String {
    paint(
        text,
        anstyle::Style::new().fg_color(Some(anstyle::AnsiColor::Yellow.into())),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::ColorWhen;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn colour_follows_the_flag_no_color_and_the_terminal() {
        assert!(decide_color(ColorWhen::Auto, true, &env(&[])));
        assert!(!decide_color(ColorWhen::Auto, false, &env(&[])));
        assert!(!decide_color(
            ColorWhen::Auto,
            true,
            &env(&[("NO_COLOR", "1")])
        ));
        // an empty NO_COLOR does not count (no-color.org)
        assert!(decide_color(
            ColorWhen::Auto,
            true,
            &env(&[("NO_COLOR", "")])
        ));
        assert!(!decide_color(
            ColorWhen::Auto,
            true,
            &env(&[("TERM", "dumb")])
        ));
        assert!(decide_color(
            ColorWhen::Auto,
            false,
            &env(&[("CLICOLOR_FORCE", "1")])
        ));
        assert!(decide_color(
            ColorWhen::Always,
            false,
            &env(&[("NO_COLOR", "1")])
        ));
        assert!(!decide_color(ColorWhen::Never, true, &env(&[])));
    }

    #[test]
    fn width_from_columns_then_the_terminal() {
        assert_eq!(
            decide_width(Some(120), &env(&[("COLUMNS", "80")])),
            Some(80)
        );
        assert_eq!(decide_width(Some(120), &env(&[])), Some(120));
        assert_eq!(decide_width(None, &env(&[("COLUMNS", "x")])), None);
        assert_eq!(decide_width(None, &env(&[("COLUMNS", "10")])), None);
    }
}
