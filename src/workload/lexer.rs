//! Tokens of the line language inside `setup` and `body`.
//!
//! Newlines end statements, except inside open `(` or `[` (the statement continues on the next
//! line); `#` starts a comment to the end of the line. Every token keeps the file position of
//! its first character.

use std::fmt;

use super::ast::Span;
use super::error::{PResult, SyntaxError};
use super::source::Text;

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Tok {
    /// A name: `[A-Za-z_][A-Za-z0-9_]*` (keywords too; the parser tells them apart).
    Ident(String),
    Int(i64),
    Float(f64),
    Str(String),
    LParen,
    RParen,
    LBracket,
    RBracket,
    LBrace,
    RBrace,
    Comma,
    Colon,
    Dot,
    Ellipsis,
    Eq,
    Plus,
    Minus,
    Star,
    /// `**`
    StarStar,
    Slash,
    At,
    /// The end of a logical line.
    Newline,
    /// The end of the `setup` or `body` text.
    Eof,
}

impl fmt::Display for Tok {
    /// How error messages name a token: `'x'`, `'('`, `end of line`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Ident(s) => write!(f, "'{s}'"),
            Tok::Int(i) => write!(f, "'{i}'"),
            Tok::Float(x) => write!(f, "'{x:?}'"),
            Tok::Str(_) => f.write_str("a string"),
            Tok::Newline => f.write_str("end of line"),
            Tok::Eof => f.write_str("end of text"),
            other => write!(f, "'{}'", other.symbol()),
        }
    }
}

impl Tok {
    fn symbol(&self) -> &'static str {
        match self {
            Tok::LParen => "(",
            Tok::RParen => ")",
            Tok::LBracket => "[",
            Tok::RBracket => "]",
            Tok::LBrace => "{",
            Tok::RBrace => "}",
            Tok::Comma => ",",
            Tok::Colon => ":",
            Tok::Dot => ".",
            Tok::Ellipsis => "...",
            Tok::Eq => "=",
            Tok::Plus => "+",
            Tok::Minus => "-",
            Tok::Star => "*",
            Tok::StarStar => "**",
            Tok::Slash => "/",
            Tok::At => "@",
            _ => "",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Token {
    pub tok: Tok,
    pub span: Span,
}

fn is_ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_'
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Whether `s` is a name of the line language (a keyword is not).
pub(crate) fn is_identifier(s: &str) -> bool {
    let mut cs = s.chars();
    cs.next().is_some_and(is_ident_start)
        && cs.all(is_ident_char)
        && !matches!(s, "del" | "true" | "false" | "none")
}

struct Lexer<'a> {
    chars: &'a [(char, Span)],
    end: Span,
    i: usize,
    /// Open `(` and `[`: while above zero, newlines do not end the statement.
    depth: usize,
    out: Vec<Token>,
}

impl Lexer<'_> {
    fn peek(&self, ahead: usize) -> Option<char> {
        self.chars.get(self.i + ahead).map(|p| p.0)
    }

    fn here(&self) -> Span {
        self.chars.get(self.i).map_or(self.end, |p| p.1)
    }

    fn push(&mut self, tok: Tok, span: Span) {
        self.out.push(Token { tok, span });
    }

    fn run(mut self) -> PResult<Vec<Token>> {
        while let Some(c) = self.peek(0) {
            let span = self.here();
            match c {
                '\n' => {
                    self.i += 1;
                    if self.depth == 0 {
                        self.push(Tok::Newline, span);
                    }
                }
                ' ' | '\t' | '\r' | '\u{c}' => self.i += 1,
                '#' => {
                    while self.peek(0).is_some_and(|c| c != '\n') {
                        self.i += 1;
                    }
                }
                '"' => self.string(span)?,
                c if c.is_ascii_digit() => self.number(span)?,
                c if is_ident_start(c) => {
                    let mut name = String::new();
                    while let Some(c) = self.peek(0).filter(|&c| is_ident_char(c)) {
                        name.push(c);
                        self.i += 1;
                    }
                    self.push(Tok::Ident(name), span);
                }
                '.' if self.peek(1) == Some('.') && self.peek(2) == Some('.') => {
                    self.i += 3;
                    self.push(Tok::Ellipsis, span);
                }
                '*' if self.peek(1) == Some('*') => {
                    self.i += 2;
                    self.push(Tok::StarStar, span);
                }
                _ => {
                    let tok = match c {
                        '(' => Tok::LParen,
                        ')' => Tok::RParen,
                        '[' => Tok::LBracket,
                        ']' => Tok::RBracket,
                        '{' => Tok::LBrace,
                        '}' => Tok::RBrace,
                        ',' => Tok::Comma,
                        ':' => Tok::Colon,
                        '.' => Tok::Dot,
                        '=' => Tok::Eq,
                        '+' => Tok::Plus,
                        '-' => Tok::Minus,
                        '*' => Tok::Star,
                        '/' => Tok::Slash,
                        '@' => Tok::At,
                        other => return Err(unexpected_char(other, span)),
                    };
                    match tok {
                        Tok::LParen | Tok::LBracket => self.depth += 1,
                        Tok::RParen | Tok::RBracket => self.depth = self.depth.saturating_sub(1),
                        _ => {}
                    }
                    self.i += 1;
                    self.push(tok, span);
                }
            }
        }
        let end = self.end;
        self.push(Tok::Newline, end);
        self.push(Tok::Eof, end);
        Ok(self.out)
    }

    /// `"..."` on one line, with `\"` and `\\` escapes.
    fn string(&mut self, open: Span) -> PResult<()> {
        self.i += 1;
        let mut s = String::new();
        loop {
            let at = self.here();
            match self.peek(0) {
                None | Some('\n') => {
                    return Err(SyntaxError::new(
                        open,
                        "unterminated string: expected '\"' to close it before the end of the line",
                    ))
                }
                Some('"') => {
                    self.i += 1;
                    break;
                }
                Some('\\') => match self.peek(1) {
                    Some(c @ ('"' | '\\')) => {
                        s.push(c);
                        self.i += 2;
                    }
                    other => {
                        let shown = match other {
                            None | Some('\n') => "\\ at the end of the line".to_string(),
                            Some(c) => format!("escape '\\{c}'"),
                        };
                        return Err(SyntaxError::new(
                            at,
                            format!(
                                "unknown {shown} in a string: only \\\" and \\\\ are escapes \
                                 (inside a TOML \"\"\" string write them as \\\\\" and \\\\\\\\, \
                                 or use a ''' string)"
                            ),
                        ));
                    }
                },
                Some(c) => {
                    s.push(c);
                    self.i += 1;
                }
            }
        }
        self.push(Tok::Str(s), open);
        Ok(())
    }

    /// `1024`, `1_024`, `0.5`, `1e-3`, `2.5E+4`. Underscores only between digits.
    fn number(&mut self, start: Span) -> PResult<()> {
        let mut text = String::new();
        let mut float = false;
        self.digits(&mut text, start)?;
        if self.peek(0) == Some('.') && self.peek(1).is_some_and(|c| c.is_ascii_digit()) {
            float = true;
            text.push('.');
            self.i += 1;
            self.digits(&mut text, start)?;
        }
        if matches!(self.peek(0), Some('e' | 'E')) {
            let sign = usize::from(matches!(self.peek(1), Some('+' | '-')));
            if self.peek(1 + sign).is_some_and(|c| c.is_ascii_digit()) {
                float = true;
                text.push('e');
                if sign == 1 {
                    text.extend(self.peek(1));
                }
                self.i += 1 + sign;
                self.digits(&mut text, start)?;
            }
        }
        if let Some(c) = self.peek(0).filter(|&c| is_ident_char(c)) {
            return Err(SyntaxError::new(
                self.here(),
                format!(
                    "unexpected '{c}' after the number '{text}': expected an operator, ',' or ')'"
                ),
            ));
        }
        let tok = if float {
            match text.parse::<f64>() {
                Ok(x) if x.is_finite() => Tok::Float(x),
                _ => {
                    return Err(SyntaxError::new(
                        start,
                        format!("number '{text}' is out of range for a float"),
                    ))
                }
            }
        } else {
            match text.parse::<i64>() {
                Ok(v) => Tok::Int(v),
                Err(_) => {
                    return Err(SyntaxError::new(
                        start,
                        format!("integer '{text}' is out of range (at most {})", i64::MAX),
                    ))
                }
            }
        };
        self.push(tok, start);
        Ok(())
    }

    /// Digits with single underscores between them, appended to `text` without underscores.
    fn digits(&mut self, text: &mut String, start: Span) -> PResult<()> {
        let mut last_digit = false;
        while let Some(c) = self.peek(0) {
            if c.is_ascii_digit() {
                text.push(c);
                last_digit = true;
            } else if c == '_' {
                if !last_digit || !self.peek(1).is_some_and(|c| c.is_ascii_digit()) {
                    return Err(SyntaxError::new(
                        self.here(),
                        format!(
                            "misplaced '_' in the number starting at {start}: \
                             '_' may only stand between two digits (1_024)"
                        ),
                    ));
                }
                last_digit = false;
            } else {
                break;
            }
            self.i += 1;
        }
        Ok(())
    }
}

fn unexpected_char(c: char, span: Span) -> SyntaxError {
    let hint = match c {
        '\'' => "; strings use double quotes: \"text\"",
        '%' | '<' | '>' | '!' | '&' | '|' | '^' | '~' => "; the operators are + - * / @",
        _ => "",
    };
    let shown = if c.is_control() {
        format!("{:?}", c)
    } else {
        format!("'{c}'")
    };
    SyntaxError::new(span, format!("unexpected character {shown}{hint}"))
}

/// Splits `text` into tokens; the last two are always `Newline` and `Eof`.
pub(crate) fn lex(text: &Text) -> PResult<Vec<Token>> {
    Lexer {
        chars: &text.chars,
        end: text.end,
        i: 0,
        depth: 0,
        out: Vec::new(),
    }
    .run()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A text on file line 1 starting at column 1.
    fn text(s: &str) -> Text {
        Text::at(s, Span::new(1, 1))
    }

    fn toks(s: &str) -> Vec<Tok> {
        lex(&text(s)).unwrap().into_iter().map(|t| t.tok).collect()
    }

    fn err(s: &str) -> SyntaxError {
        lex(&text(s)).unwrap_err()
    }

    fn id(s: &str) -> Tok {
        Tok::Ident(s.into())
    }

    #[test]
    fn tokens_and_positions() {
        let t = lex(&text("x = f(1_024, 0.5)  # c\n  y.T[...]")).unwrap();
        let got: Vec<(Tok, u32, u32)> = t
            .iter()
            .map(|t| (t.tok.clone(), t.span.line, t.span.col))
            .collect();
        assert_eq!(
            got,
            vec![
                (id("x"), 1, 1),
                (Tok::Eq, 1, 3),
                (id("f"), 1, 5),
                (Tok::LParen, 1, 6),
                (Tok::Int(1024), 1, 7),
                (Tok::Comma, 1, 12),
                (Tok::Float(0.5), 1, 14),
                (Tok::RParen, 1, 17),
                (Tok::Newline, 1, 23),
                (id("y"), 2, 3),
                (Tok::Dot, 2, 4),
                (id("T"), 2, 5),
                (Tok::LBracket, 2, 6),
                (Tok::Ellipsis, 2, 7),
                (Tok::RBracket, 2, 10),
                (Tok::Newline, 2, 11),
                (Tok::Eof, 2, 11),
            ]
        );
    }

    #[test]
    fn newlines_inside_brackets_continue_the_line() {
        assert_eq!(
            toks("f(a,\n  [b,  # note\n c])\ng"),
            vec![
                id("f"),
                Tok::LParen,
                id("a"),
                Tok::Comma,
                Tok::LBracket,
                id("b"),
                Tok::Comma,
                id("c"),
                Tok::RBracket,
                Tok::RParen,
                Tok::Newline,
                id("g"),
                Tok::Newline,
                Tok::Eof
            ]
        );
    }

    #[test]
    fn numbers() {
        assert_eq!(toks("1e-3")[0], Tok::Float(1e-3));
        assert_eq!(toks("2.5E+4")[0], Tok::Float(2.5e4));
        assert_eq!(toks("1e20")[0], Tok::Float(1e20));
        assert_eq!(toks("7")[0], Tok::Int(7));
        // `1.T` is an attribute of 1, not a float.
        assert_eq!(toks("1.T")[..3], [Tok::Int(1), Tok::Dot, id("T")]);
        assert_eq!(toks("9223372036854775807")[0], Tok::Int(i64::MAX));
        let e = err("x = 9223372036854775808");
        assert_eq!(e.span, Span::new(1, 5));
        assert!(e.message.contains("out of range"), "{}", e.message);
        assert!(err("1e999").message.contains("out of range for a float"));
        assert_eq!(err("1__0").span, Span::new(1, 2));
        assert_eq!(err("10_").span, Span::new(1, 3));
        let e = err("3abc");
        assert_eq!(e.span, Span::new(1, 2));
    }

    #[test]
    fn strings() {
        assert_eq!(
            toks(r#""a \"b\" \\ c""#)[0],
            Tok::Str(r#"a "b" \ c"#.into())
        );
        let e = err("mark(\"open)\nx");
        assert_eq!(e.span, Span::new(1, 6));
        assert!(
            e.message.starts_with("unterminated string"),
            "{}",
            e.message
        );
        let e = err(r#"x = "a\n""#);
        assert_eq!(e.span, Span::new(1, 7));
        assert!(e.message.contains("unknown escape '\\n'"), "{}", e.message);
    }

    #[test]
    fn bad_characters() {
        let e = err("x = 'a'");
        assert_eq!(e.span, Span::new(1, 5));
        assert!(e.message.contains("double quotes"));
        assert_eq!(err("x = a % b").span, Span::new(1, 7));
        assert!(err("x\u{0}").message.contains("'\\0'"));
    }
}
