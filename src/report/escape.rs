//! Escaping for the markup gpumem writes by hand: markdown tables (pull-request comments of
//! `check` and `diff`) and XML text (the SVG pictures). JUnit XML is written by quick-junit.

/// Text for a cell or line of GitHub-flavoured markdown, shown as written: `|` cannot end the
/// cell, HTML cannot open, and emphasis, code, links and line breaks cannot start.
pub fn markdown(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '&' => o.push_str("&amp;"),
            '\n' | '\r' => o.push(' '),
            '|' | '\\' | '`' | '*' | '_' | '[' | ']' | '~' => {
                o.push('\\');
                o.push(c);
            }
            c => o.push(c),
        }
    }
    o
}

/// XML character data or an attribute value (quick-xml's escaping, which also quotes `"` and
/// `'`).
pub fn xml(s: &str) -> String {
    quick_xml::escape::escape(s).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_cells_cannot_break_the_table_or_inject_html() {
        assert_eq!(markdown("a|b"), "a\\|b");
        assert_eq!(markdown("<script>"), "&lt;script&gt;");
        assert_eq!(markdown("__init__ *x*"), "\\_\\_init\\_\\_ \\*x\\*");
        assert_eq!(markdown("two\nlines"), "two lines");
        assert_eq!(markdown("12.5 GiB"), "12.5 GiB");
    }

    #[test]
    fn xml_escapes_markup() {
        assert_eq!(xml("a<b & \"c\"'"), "a&lt;b &amp; &quot;c&quot;&apos;");
    }
}
