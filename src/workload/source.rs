//! Positions in the TOML file: byte offsets to line and column, and the text of a `setup` or
//! `body` string with the file position of each of its characters.
//!
//! `toml` gives the byte range of each value as written (quotes included). To place the
//! statements inside a string, the literal is decoded again here, character by character,
//! keeping where each decoded character came from: escapes (`\n`, `\"`, `\u00e9`), the first
//! newline that TOML trims after `"""`, and line-ending backslashes all keep positions exact.
//! If that decoding ever disagrees with `toml`'s value, the value is used with positions
//! counted from the start of the literal's content (exact for strings without escapes).

use super::ast::Span;

/// Maps byte offsets in a text to 1-based line and character column.
pub(crate) struct LineIndex<'a> {
    text: &'a str,
    /// Byte offset where each line starts.
    starts: Vec<usize>,
}

fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl<'a> LineIndex<'a> {
    pub fn new(text: &'a str) -> Self {
        let mut starts = vec![0];
        starts.extend(
            text.bytes()
                .enumerate()
                .filter(|&(_, b)| b == b'\n')
                .map(|(i, _)| i + 1),
        );
        LineIndex { text, starts }
    }

    /// Line and column of a byte offset (clamped to the text; a leading byte-order mark takes
    /// no column).
    pub fn span(&self, offset: usize) -> Span {
        let mut offset = offset.min(self.text.len());
        while !self.text.is_char_boundary(offset) {
            offset -= 1;
        }
        let line = self.starts.partition_point(|&s| s <= offset).max(1);
        let start = self.starts.get(line - 1).copied().unwrap_or(0);
        let prefix = self.text.get(start..offset).unwrap_or("");
        let mut col = prefix.chars().count();
        if start == 0 && prefix.starts_with('\u{feff}') {
            col -= 1;
        }
        Span::new(to_u32(line), to_u32(col + 1))
    }
}

/// The decoded text of a string value, each character with its position in the file.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Text {
    pub chars: Vec<(char, Span)>,
    /// Where the text ends (the closing quotes): the position of "end of body" errors.
    pub end: Span,
}

#[cfg(test)]
impl Text {
    /// `s` as written from `start` on (lines and columns advancing as it goes).
    pub(crate) fn at(s: &str, start: Span) -> Text {
        let mut pos = start;
        let mut chars = Vec::with_capacity(s.len());
        for c in s.chars() {
            chars.push((c, pos));
            pos = advance(pos, c);
        }
        Text { chars, end: pos }
    }

    pub fn as_string(&self) -> String {
        self.chars.iter().map(|&(c, _)| c).collect()
    }
}

/// Positions `value` inside the literal `raw`, which starts at byte `offset` of the file.
pub(crate) fn locate(index: &LineIndex<'_>, raw: &str, offset: usize, value: &str) -> Text {
    let delim = if raw.starts_with("\"\"\"") || raw.starts_with("'''") {
        3
    } else {
        1
    };
    let end = index.span(offset + raw.len().saturating_sub(delim));
    let content_offset = offset + delim.min(raw.len());
    if let Some(chars) = decode(index, raw, content_offset, delim) {
        let text = Text { chars, end };
        if text.chars.iter().map(|&(c, _)| c).eq(value.chars()) {
            return text;
        }
    }
    // Fallback: count from the start of the content, after the newline TOML trims.
    let rest = raw.get(delim.min(raw.len())..).unwrap_or("");
    let mut pos = if delim == 3 && (rest.starts_with('\n') || rest.starts_with("\r\n")) {
        let nl = rest.find('\n').unwrap_or(0);
        index.span(content_offset + nl + 1)
    } else {
        index.span(content_offset)
    };
    let mut chars = Vec::with_capacity(value.len());
    for c in value.chars() {
        chars.push((c, pos));
        pos = advance(pos, c);
    }
    Text { chars, end }
}

fn advance(pos: Span, c: char) -> Span {
    if c == '\n' {
        Span::new(pos.line.saturating_add(1), 1)
    } else {
        Span::new(pos.line, pos.col.saturating_add(1))
    }
}

/// Decodes a TOML string literal (`"..."`, `'...'`, `"""..."""`, `'''...'''`), or `None` if
/// it is not one this decoder understands.
fn decode(
    index: &LineIndex<'_>,
    raw: &str,
    content_offset: usize,
    delim: usize,
) -> Option<Vec<(char, Span)>> {
    let quote = raw.chars().next()?;
    if (quote != '"' && quote != '\'') || raw.len() < 2 * delim {
        return None;
    }
    let content = raw.get(delim..raw.len() - delim)?;
    let mut pos = index.span(content_offset);
    let mut src: Vec<(char, Span)> = Vec::with_capacity(content.len());
    for c in content.chars() {
        src.push((c, pos));
        pos = advance(pos, c);
    }
    let mut i = 0;
    if delim == 3 {
        // TOML trims a newline right after the opening quotes.
        match (src.first().map(|p| p.0), src.get(1).map(|p| p.0)) {
            (Some('\n'), _) => i = 1,
            (Some('\r'), Some('\n')) => i = 2,
            _ => {}
        }
    }
    let mut out = Vec::with_capacity(src.len());
    let escapes = quote == '"';
    while let Some(&(c, at)) = src.get(i) {
        i += 1;
        if c != '\\' || !escapes {
            out.push((c, at));
            continue;
        }
        let (e, _) = *src.get(i)?;
        i += 1;
        let simple = match e {
            'b' => Some('\u{8}'),
            't' => Some('\t'),
            'n' => Some('\n'),
            'f' => Some('\u{c}'),
            'r' => Some('\r'),
            'e' => Some('\u{1b}'),
            '"' => Some('"'),
            '\\' => Some('\\'),
            _ => None,
        };
        if let Some(d) = simple {
            out.push((d, at));
            continue;
        }
        let digits = match e {
            'x' => 2,
            'u' => 4,
            'U' => 8,
            ' ' | '\t' | '\r' | '\n' if delim == 3 => {
                // Line-ending backslash: skip all whitespace and newlines that follow.
                i -= 1;
                while matches!(src.get(i).map(|p| p.0), Some(' ' | '\t' | '\r' | '\n')) {
                    i += 1;
                }
                continue;
            }
            _ => return None,
        };
        let hex: String = src.get(i..i + digits)?.iter().map(|p| p.0).collect();
        i += digits;
        let code = u32::from_str_radix(&hex, 16).ok()?;
        out.push((char::from_u32(code)?, at));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(file: &str, value: &str) -> Text {
        let index = LineIndex::new(file);
        let start = file.find(['"', '\'']).unwrap();
        locate(&index, &file[start..], start, value)
    }

    #[test]
    fn line_index_counts_chars_and_lines() {
        let idx = LineIndex::new("ab\né€x\n");
        assert_eq!(idx.span(0), Span::new(1, 1));
        assert_eq!(idx.span(3), Span::new(2, 1));
        // 'x' is after two 2- and 3-byte characters: column 3.
        assert_eq!(idx.span(3 + 2 + 3), Span::new(2, 3));
        // Offsets inside a character or past the end are clamped.
        assert_eq!(idx.span(4), Span::new(2, 1));
        assert_eq!(idx.span(1000), Span::new(3, 1));
        let bom = LineIndex::new("\u{feff}[x]");
        assert_eq!(bom.span(3), Span::new(1, 1));
    }

    #[test]
    fn multiline_basic_trims_first_newline() {
        let t = check("body = \"\"\"\nx = 1\n\"\"\"", "x = 1\n");
        assert_eq!(t.chars[0], ('x', Span::new(2, 1)));
        assert_eq!(t.chars[4], ('1', Span::new(2, 5)));
        assert_eq!(t.end, Span::new(3, 1));
    }

    #[test]
    fn escapes_keep_exact_positions() {
        // "a\"b\nc": c is on file line 1, column 14 although it starts the text's line 2.
        let t = check("body = \"a\\\"b\\nc\"", "a\"b\nc");
        assert_eq!(t.as_string(), "a\"b\nc");
        assert_eq!(t.chars[1], ('"', Span::new(1, 10)));
        assert_eq!(t.chars[4], ('c', Span::new(1, 15)));
        let t = check("body = \"\\u00e9x\"", "éx");
        assert_eq!(t.chars[1], ('x', Span::new(1, 15)));
    }

    #[test]
    fn line_ending_backslash_and_literals() {
        let t = check("body = \"\"\"a \\\n   b\"\"\"", "a b");
        assert_eq!(t.chars[2], ('b', Span::new(2, 4)));
        let t = check("body = '''\r\na\\n'''", "a\\n");
        assert_eq!(t.chars[0], ('a', Span::new(2, 1)));
        assert_eq!(t.chars[1], ('\\', Span::new(2, 2)));
        let t = check("body = 'x'", "x");
        assert_eq!(t.chars, vec![('x', Span::new(1, 9))]);
    }

    #[test]
    fn disagreement_falls_back_to_the_value() {
        let t = check("body = \"\"\"\nab\"\"\"", "zz\nq");
        assert_eq!(t.as_string(), "zz\nq");
        assert_eq!(t.chars[0].1, Span::new(2, 1));
        assert_eq!(t.chars[3].1, Span::new(3, 1));
    }
}
