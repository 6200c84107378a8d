//! Statements and expressions of `setup` and `body`, from the lexer's tokens.
//!
//! Recursive descent; precedence from low to high: `+ -`, `* / @`, unary `-`, postfix (call,
//! method, attribute, index), atoms. Nesting is bounded so that no input can overflow the
//! stack: [`MAX_NESTING`] levels of blocks and of parentheses, brackets, calls and unary minus,
//! and expression trees at most [`MAX_DEPTH`] deep (long operator or method chains).

use std::collections::HashMap;

use super::ast::{BinOp, BlockKind, Expr, ExprKind, Ident, IndexItem, Span, Stmt, StmtKind};
use super::error::{PResult, SyntaxError};
use super::lexer::{lex, Tok, Token};
use super::source::Text;

/// Most nested blocks, and most nested parentheses, brackets, calls and unary minus.
pub const MAX_NESTING: usize = 64;
/// Deepest expression tree (each operator, call, attribute or index adds a level).
pub const MAX_DEPTH: usize = 256;

/// The block statements' keywords, at the start of a line that opens a block.
const BLOCK_KEYWORDS: &[&str] = &["no_grad", "autocast", "checkpoint", "scope", "phase", "for"];
/// Names that are not values or targets.
const KEYWORDS: &[&str] = &["true", "false", "none", "del", "for", "in"];

/// Parses the statements of `text`, the value of the `what` key (`setup` or `body`).
pub(crate) fn parse_stmts(text: &Text, what: &str) -> PResult<Vec<Stmt>> {
    let toks = lex(text)?;
    let mut p = Parser {
        toks,
        i: 0,
        what,
        nesting: 0,
    };
    p.block(None, 0)
}

/// Appends `st`, or, when it is a `scope` block of the same name as the statement before it,
/// appends its statements to that block instead: `scope "m" { a }` then `scope "m" { b }` is
/// `scope "m" { a; b }` (a scope only names the tag its statements run under), and generated
/// models, which put each statement in its module's scope, run one block per module.
fn push_merging_scopes(out: &mut Vec<Stmt>, st: Stmt) {
    if let StmtKind::Block {
        kind: BlockKind::Scope(name),
        ..
    } = &st.kind
    {
        if let Some(Stmt {
            kind:
                StmtKind::Block {
                    kind: BlockKind::Scope(prev),
                    body,
                },
            ..
        }) = out.last_mut()
        {
            if prev == name {
                let StmtKind::Block { body: more, .. } = st.kind else {
                    unreachable!("matched a block above")
                };
                body.extend(more);
                return;
            }
        }
    }
    out.push(st);
}

struct Parser<'a> {
    /// Always ends with `Newline`, `Eof`.
    toks: Vec<Token>,
    i: usize,
    what: &'a str,
    /// Current nesting of parentheses, brackets, calls and unary minus.
    nesting: usize,
}

/// An expression and the depth of its tree.
type Sized = (Expr, usize);

fn depth_error(span: Span) -> SyntaxError {
    SyntaxError::new(
        span,
        format!(
            "expression too deep: more than {MAX_DEPTH} levels of operators, calls, attributes \
             and indexing; split it over several statements"
        ),
    )
}

/// `1 + max(children)`, or an error at `span` if that is too deep.
fn deeper(span: Span, children: impl IntoIterator<Item = usize>) -> PResult<usize> {
    let d = 1 + children.into_iter().max().unwrap_or(0);
    if d > MAX_DEPTH {
        Err(depth_error(span))
    } else {
        Ok(d)
    }
}

impl Parser<'_> {
    fn tok(&self) -> &Tok {
        self.tok_at(0)
    }

    fn tok_at(&self, ahead: usize) -> &Tok {
        self.toks
            .get(self.i + ahead)
            .or(self.toks.last())
            .map_or(&Tok::Eof, |t| &t.tok)
    }

    fn span(&self) -> Span {
        self.toks
            .get(self.i)
            .or(self.toks.last())
            .map_or(Span::new(1, 1), |t| t.span)
    }

    /// Moves past the current token (never past `Eof`).
    fn bump(&mut self) {
        if self.i + 1 < self.toks.len() {
            self.i += 1;
        }
    }

    /// The current token as error messages name it.
    fn found(&self) -> String {
        match self.tok() {
            Tok::Eof => format!("the end of '{}'", self.what),
            Tok::Newline if matches!(self.tok_at(1), Tok::Eof) => {
                format!("the end of '{}'", self.what)
            }
            t => t.to_string(),
        }
    }

    fn error<T>(&self, message: impl Into<String>) -> PResult<T> {
        Err(SyntaxError::new(self.span(), message))
    }

    fn expected<T>(&self, what: &str) -> PResult<T> {
        self.error(format!("expected {what}, found {}", self.found()))
    }

    /// Consumes the end of the current line.
    fn end_of_line(&mut self, after: &str) -> PResult<()> {
        match self.tok() {
            Tok::Newline => {
                self.bump();
                Ok(())
            }
            Tok::Eof => Ok(()),
            _ => self.expected(&format!("end of line after {after}")),
        }
    }

    fn enter(&mut self, span: Span) -> PResult<()> {
        self.nesting += 1;
        if self.nesting > MAX_NESTING {
            return Err(SyntaxError::new(
                span,
                format!(
                    "expression nested too deeply: more than {MAX_NESTING} levels of \
                     parentheses, brackets, calls or '-'"
                ),
            ));
        }
        Ok(())
    }

    fn leave(&mut self) {
        self.nesting = self.nesting.saturating_sub(1);
    }

    // ---- statements ----

    /// Statements up to the end of the text (`open` is `None`) or the `}` closing the block
    /// whose `{` is at `open`.
    fn block(&mut self, open: Option<(Span, &BlockKind)>, depth: usize) -> PResult<Vec<Stmt>> {
        let mut out = Vec::new();
        loop {
            match self.tok() {
                Tok::Newline => self.bump(),
                Tok::Eof => {
                    return match open {
                        None => Ok(out),
                        Some((brace, kind)) => Err(SyntaxError::new(
                            brace,
                            format!(
                                "the '{{' of '{kind}' is never closed: expected a line '}}' \
                                 before the end of '{}'",
                                self.what
                            ),
                        )),
                    };
                }
                Tok::RBrace => {
                    if open.is_none() {
                        return self.error("'}' without an open block");
                    }
                    self.bump();
                    self.end_of_line("'}' (a block's '}' stands on a line of its own)")?;
                    return Ok(out);
                }
                _ => {
                    let st = self.statement(depth)?;
                    push_merging_scopes(&mut out, st);
                }
            }
        }
    }

    fn statement(&mut self, depth: usize) -> PResult<Stmt> {
        let span = self.span();
        if self.opens_block() {
            return self.block_stmt(depth);
        }
        if matches!(self.tok(), Tok::Ident(k) if k == "del") {
            self.bump();
            let mut names: Vec<(String, Span)> = Vec::new();
            loop {
                let at = self.span();
                let name = match self.tok() {
                    Tok::Ident(n) if !KEYWORDS.contains(&n.as_str()) => n.clone(),
                    _ => return self.expected("a name to delete (del x or del x, y)"),
                };
                if let Some((_, first)) = names.iter().find(|(n, _)| *n == name) {
                    return Err(SyntaxError::new(
                        at,
                        format!("'{name}' is deleted twice in one del (first at {first})"),
                    ));
                }
                names.push((name, at));
                self.bump();
                if matches!(self.tok(), Tok::Comma) {
                    self.bump();
                } else {
                    break;
                }
            }
            self.end_of_line("the del statement")?;
            let names = names.into_iter().map(|(n, _)| n.into()).collect();
            return Ok(Stmt {
                kind: StmtKind::Del(names),
                span,
            });
        }
        let (first, _) = self.expr()?;
        let kind = if matches!(self.tok(), Tok::Comma | Tok::Eq) {
            let mut targets = vec![first];
            while matches!(self.tok(), Tok::Comma) {
                self.bump();
                targets.push(self.expr()?.0);
            }
            if !matches!(self.tok(), Tok::Eq) {
                return self.expected("'=' after the assignment targets");
            }
            self.bump();
            // `x[...] = value`: an in-place copy into the indexed view
            if let [t @ Expr {
                kind: ExprKind::Index { .. },
                ..
            }] = &targets[..]
            {
                let target = t.clone();
                let (value, _) = self.expr()?;
                self.end_of_line("the statement")?;
                return Ok(Stmt {
                    kind: StmtKind::SetItem { target, value },
                    span,
                });
            }
            let mut names: Vec<(Ident, Span)> = Vec::new();
            for t in targets {
                let ExprKind::Name(name) = t.kind else {
                    return Err(SyntaxError::new(
                        t.span,
                        format!(
                            "cannot assign to '{t}': the left of '=' takes plain names \
                             (x = ... or a, b = ...) or one indexed tensor (x[0, :2] = ...)"
                        ),
                    ));
                };
                if let Some((_, first)) = names.iter().find(|(n, _)| *n == name) {
                    return Err(SyntaxError::new(
                        t.span,
                        format!("'{name}' is assigned twice in one statement (first at {first})"),
                    ));
                }
                names.push((name, t.span));
            }
            let (value, _) = self.expr()?;
            StmtKind::Assign {
                targets: names.into_iter().map(|(n, _)| n).collect(),
                value,
            }
        } else {
            StmtKind::Expr(first)
        };
        self.end_of_line("the statement")?;
        Ok(Stmt { kind, span })
    }

    /// Whether the current line is a block header: a block keyword followed by `{`, a string,
    /// or the end of the line; or any name directly followed by `{` (an unknown block).
    fn opens_block(&self) -> bool {
        let Tok::Ident(first) = self.tok() else {
            return false;
        };
        let line_end = self.toks[self.i..]
            .iter()
            .position(|t| matches!(t.tok, Tok::Newline | Tok::Eof))
            .map_or(self.toks.len(), |n| self.i + n);
        let has_brace = self.toks[self.i..line_end]
            .iter()
            .any(|t| t.tok == Tok::LBrace);
        let next = self.tok_at(1);
        if BLOCK_KEYWORDS.contains(&first.as_str()) {
            has_brace || matches!(next, Tok::Str(_) | Tok::Newline | Tok::Eof)
        } else {
            matches!(next, Tok::LBrace)
        }
    }

    fn block_stmt(&mut self, depth: usize) -> PResult<Stmt> {
        let span = self.span();
        let Tok::Ident(keyword) = self.tok().clone() else {
            return self.expected("a block keyword");
        };
        if !BLOCK_KEYWORDS.contains(&keyword.as_str()) {
            return self.error(format!(
                "unknown block '{keyword}': blocks are no_grad, autocast, autocast(DTYPE), \
                 checkpoint, scope \"NAME\", phase \"NAME\" and for NAME in range(N)"
            ));
        }
        if depth >= MAX_NESTING {
            return self.error(format!(
                "blocks nested too deeply: more than {MAX_NESTING} levels"
            ));
        }
        self.bump();
        let kind = match keyword.as_str() {
            "no_grad" => BlockKind::NoGrad,
            "checkpoint" => BlockKind::Checkpoint {
                hold: self.held_names()?.into_iter().map(Ident::from).collect(),
            },
            "autocast" => BlockKind::Autocast {
                dtype: self.autocast_dtype()?,
            },
            "for" => self.for_header()?,
            _ => {
                let name = match self.tok() {
                    Tok::Str(s) if !s.trim().is_empty() => s.clone(),
                    Tok::Str(_) => {
                        return self.error(format!("the name of a {keyword} block is empty"))
                    }
                    _ => {
                        return self.expected(&format!(
                            "a quoted name after '{keyword}' ({keyword} \"NAME\" {{)"
                        ))
                    }
                };
                self.bump();
                if keyword == "scope" {
                    BlockKind::Scope(Ident::from(name))
                } else {
                    BlockKind::Phase(name)
                }
            }
        };
        if !matches!(self.tok(), Tok::LBrace) {
            return self.expected(&format!("'{{' after '{kind}' to open the block"));
        }
        let brace = self.span();
        self.bump();
        self.end_of_line("'{' (the block's statements go on the lines below it)")?;
        let body = self.block(Some((brace, &kind)), depth + 1)?;
        Ok(Stmt {
            kind: StmtKind::Block { kind, body },
            span,
        })
    }

    /// The optional `(a, b)` after `checkpoint`: names of tensors the region holds.
    fn held_names(&mut self) -> PResult<Vec<String>> {
        if !matches!(self.tok(), Tok::LParen) {
            return Ok(Vec::new());
        }
        self.bump();
        let mut names = Vec::new();
        loop {
            match self.tok() {
                Tok::Ident(n) if !KEYWORDS.contains(&n.as_str()) => names.push(n.clone()),
                _ => return self.expected("a name of a tensor the checkpoint holds"),
            }
            self.bump();
            match self.tok() {
                Tok::Comma => self.bump(),
                Tok::RParen => {
                    self.bump();
                    return Ok(names);
                }
                _ => return self.expected("',' or ')' in checkpoint(...)"),
            }
        }
    }

    /// `NAME in range(EXPR)` after `for`.
    fn for_header(&mut self) -> PResult<BlockKind> {
        let var = match self.tok() {
            Tok::Ident(n) if !KEYWORDS.contains(&n.as_str()) => n.clone(),
            _ => return self.expected("a loop variable after 'for' (for i in range(N) {)"),
        };
        self.bump();
        if !matches!(self.tok(), Tok::Ident(k) if k == "in") {
            return self.expected("'in' after the loop variable (for i in range(N) {)");
        }
        self.bump();
        if !matches!(self.tok(), Tok::Ident(k) if k == "range") {
            return self.expected("range(N) after 'in' (for i in range(N) {)");
        }
        self.bump();
        if !matches!(self.tok(), Tok::LParen) {
            return self.expected("'(' after range");
        }
        let open = self.span();
        self.enter(open)?;
        self.bump();
        let (count, _) = self.expr()?;
        if !matches!(self.tok(), Tok::RParen) {
            return self.expected("')' closing range(N): range takes one count");
        }
        self.leave();
        self.bump();
        Ok(BlockKind::For {
            var: var.into(),
            count,
        })
    }

    /// The optional `(bf16)` or `(dtype=bf16)` after `autocast`.
    fn autocast_dtype(&mut self) -> PResult<Option<String>> {
        if !matches!(self.tok(), Tok::LParen) {
            return Ok(None);
        }
        let open = self.span();
        self.bump();
        if matches!(self.tok(), Tok::Ident(k) if k == "dtype") && matches!(self.tok_at(1), Tok::Eq)
        {
            self.bump();
            self.bump();
        }
        let dtype = match self.tok() {
            Tok::Ident(d) if !KEYWORDS.contains(&d.as_str()) => d.clone(),
            Tok::Str(d) if !d.trim().is_empty() => d.clone(),
            _ => return self.expected("a dtype in autocast(...), e.g. autocast(bf16)"),
        };
        self.bump();
        if !matches!(self.tok(), Tok::RParen) {
            return self.expected(&format!(
                "')' to close the autocast opened at {open} (it takes one dtype)"
            ));
        }
        self.bump();
        Ok(Some(dtype))
    }

    // ---- expressions ----

    /// An expression. Its callers that nest (parentheses, lists, arguments, indexes) count
    /// the nesting with `enter` and `leave`.
    fn expr(&mut self) -> PResult<Sized> {
        self.binary(0)
    }

    /// Left-associative binary operators: level 0 is `+ -`, level 1 is `* / @`.
    fn binary(&mut self, level: u8) -> PResult<Sized> {
        let operand = |p: &mut Self| {
            if level == 0 {
                p.binary(1)
            } else {
                p.unary()
            }
        };
        let (mut lhs, mut d) = operand(self)?;
        loop {
            let op = match (level, self.tok()) {
                (0, Tok::Plus) => BinOp::Add,
                (0, Tok::Minus) => BinOp::Sub,
                (1, Tok::Star) => BinOp::Mul,
                (1, Tok::Slash) => BinOp::Div,
                (1, Tok::At) => BinOp::MatMul,
                _ => break,
            };
            self.bump();
            let (rhs, rd) = operand(self)?;
            let span = lhs.span;
            d = deeper(span, [d, rd])?;
            lhs = Expr::new(
                ExprKind::Binary {
                    op,
                    lhs: Box::new(lhs),
                    rhs: Box::new(rhs),
                },
                span,
            );
        }
        Ok((lhs, d))
    }

    fn unary(&mut self) -> PResult<Sized> {
        if !matches!(self.tok(), Tok::Minus) {
            return self.power();
        }
        let span = self.span();
        self.enter(span)?;
        self.bump();
        let (e, d) = self.unary()?;
        self.leave();
        let d = deeper(span, [d])?;
        Ok((Expr::new(ExprKind::Neg(Box::new(e)), span), d))
    }

    /// `x ** y`: right-associative, its right operand a unary (`x ** -1`, `a ** b ** c`).
    fn power(&mut self) -> PResult<Sized> {
        let (base, d) = self.postfix()?;
        if !matches!(self.tok(), Tok::StarStar) {
            return Ok((base, d));
        }
        let span = base.span;
        self.enter(span)?;
        self.bump();
        let (exp, ed) = self.unary()?;
        self.leave();
        let d = deeper(span, [d, ed])?;
        Ok((
            Expr::new(
                ExprKind::Binary {
                    op: BinOp::Pow,
                    lhs: Box::new(base),
                    rhs: Box::new(exp),
                },
                span,
            ),
            d,
        ))
    }

    fn postfix(&mut self) -> PResult<Sized> {
        let (mut e, mut d) = self.atom()?;
        loop {
            let span = e.span;
            match self.tok() {
                Tok::LParen => {
                    let ExprKind::Name(func) = &e.kind else {
                        return self.error(format!(
                            "cannot call '{e}': only names and methods can be called \
                             (f(x), x.f())"
                        ));
                    };
                    let func = func.clone();
                    let (args, kwargs, ad) = self.call_args("call")?;
                    d = deeper(span, [d, ad])?;
                    e = Expr::new(ExprKind::Call { func, args, kwargs }, span);
                }
                Tok::Dot => {
                    self.bump();
                    let name = match self.tok() {
                        Tok::Ident(n) => n.clone(),
                        _ => return self.expected("a name after '.'"),
                    };
                    self.bump();
                    let recv = Box::new(e);
                    if matches!(self.tok(), Tok::LParen) {
                        let (args, kwargs, ad) = self.call_args("method call")?;
                        d = deeper(span, [d, ad])?;
                        e = Expr::new(
                            ExprKind::Method {
                                recv,
                                name: name.into(),
                                args,
                                kwargs,
                            },
                            span,
                        );
                    } else {
                        d = deeper(span, [d])?;
                        e = Expr::new(ExprKind::Attr { recv, name }, span);
                    }
                }
                Tok::LBracket => {
                    let (items, id) = self.index_items()?;
                    d = deeper(span, [d, id])?;
                    e = Expr::new(
                        ExprKind::Index {
                            recv: Box::new(e),
                            items,
                        },
                        span,
                    );
                }
                _ => return Ok((e, d)),
            }
        }
    }

    fn atom(&mut self) -> PResult<Sized> {
        let span = self.span();
        let kind = match self.tok().clone() {
            Tok::Int(v) => ExprKind::Int(v),
            Tok::Float(v) => ExprKind::Float(v),
            Tok::Str(s) => ExprKind::Str(s),
            Tok::Ident(n) => match n.as_str() {
                "true" => ExprKind::Bool(true),
                "false" => ExprKind::Bool(false),
                "none" => ExprKind::None,
                "del" => {
                    return self.error("'del' is a statement (del x), not a value");
                }
                _ => ExprKind::Name(n.into()),
            },
            Tok::LParen => {
                self.enter(span)?;
                self.bump();
                let (mut e, d) = self.expr()?;
                if !matches!(self.tok(), Tok::RParen) {
                    return self
                        .expected(&format!("')' to close the parenthesis opened at {span}"));
                }
                self.bump();
                self.leave();
                // A parenthesised expression starts at its '('.
                e.span = span;
                return Ok((e, d));
            }
            Tok::LBracket => {
                self.enter(span)?;
                self.bump();
                let mut items = Vec::new();
                let mut d = 0;
                while !matches!(self.tok(), Tok::RBracket) {
                    let (e, ed) = self.expr()?;
                    d = d.max(ed);
                    items.push(e);
                    match self.tok() {
                        Tok::Comma => self.bump(),
                        Tok::RBracket => {}
                        _ => {
                            return self
                                .expected(&format!("']' to close the list opened at {span}"))
                        }
                    }
                }
                self.bump();
                self.leave();
                let d = deeper(span, [d])?;
                return Ok((Expr::new(ExprKind::List(items), span), d));
            }
            _ => return self.expected("an expression"),
        };
        self.bump();
        Ok((Expr::new(kind, span), 1))
    }

    /// `(args, k=v)` of a call or method call; the current token is the `(`.
    #[allow(clippy::type_complexity)]
    fn call_args(&mut self, what: &str) -> PResult<(Vec<Expr>, Vec<(String, Expr)>, usize)> {
        let open = self.span();
        self.enter(open)?;
        self.bump();
        let mut args = Vec::new();
        let mut kwargs: Vec<(String, Expr)> = Vec::new();
        let mut kw_spans: HashMap<String, Span> = HashMap::new();
        let mut d = 0;
        while !matches!(self.tok(), Tok::RParen) {
            let at = self.span();
            if let (Tok::Ident(k), Tok::Eq) = (self.tok(), self.tok_at(1)) {
                let k = k.clone();
                if KEYWORDS.contains(&k.as_str()) {
                    return self.error(format!("'{k}' is a keyword, not an argument name"));
                }
                if let Some(first) = kw_spans.get(&k) {
                    return self.error(format!(
                        "keyword argument '{k}' given twice (first at {first})"
                    ));
                }
                kw_spans.insert(k.clone(), at);
                self.bump();
                self.bump();
                let (v, vd) = self.expr()?;
                d = d.max(vd);
                kwargs.push((k, v));
            } else {
                if let Some((k, _)) = kwargs.first() {
                    return self.error(format!(
                        "positional argument after keyword argument '{k}': \
                         positional arguments come first"
                    ));
                }
                let (v, vd) = self.expr()?;
                d = d.max(vd);
                args.push(v);
            }
            match self.tok() {
                Tok::Comma => self.bump(),
                Tok::RParen => {}
                _ => return self.expected(&format!("')' to close the {what} opened at {open}")),
            }
        }
        self.bump();
        self.leave();
        Ok((args, kwargs, d))
    }

    /// `[items]` of an index; the current token is the `[`.
    fn index_items(&mut self) -> PResult<(Vec<IndexItem>, usize)> {
        let open = self.span();
        self.enter(open)?;
        self.bump();
        let mut items = Vec::new();
        let mut d = 0;
        loop {
            if matches!(self.tok(), Tok::RBracket) {
                if items.is_empty() {
                    return self.error("expected an index inside '[]' (x[0], x[1:3], x[:, ...])");
                }
                break;
            }
            let ends_item = |t: &Tok| matches!(t, Tok::Comma | Tok::RBracket);
            let item = match self.tok() {
                Tok::Ellipsis => {
                    self.bump();
                    IndexItem::Ellipsis
                }
                Tok::Ident(n) if n == "none" && ends_item(self.tok_at(1)) => {
                    self.bump();
                    IndexItem::NewAxis
                }
                _ => {
                    let start = if matches!(self.tok(), Tok::Colon) {
                        None
                    } else {
                        let (e, ed) = self.expr()?;
                        d = d.max(ed);
                        Some(e)
                    };
                    if matches!(self.tok(), Tok::Colon) {
                        self.bump();
                        let mut part = |p: &mut Self, stop_at_colon: bool| -> PResult<_> {
                            let t = p.tok();
                            if ends_item(t) || (stop_at_colon && matches!(t, Tok::Colon)) {
                                return Ok(None);
                            }
                            let (e, ed) = p.expr()?;
                            d = d.max(ed);
                            Ok(Some(e))
                        };
                        let stop = part(self, true)?;
                        let step = if matches!(self.tok(), Tok::Colon) {
                            self.bump();
                            part(self, false)?
                        } else {
                            None
                        };
                        IndexItem::Slice { start, stop, step }
                    } else {
                        match start {
                            Some(e) => IndexItem::Expr(e),
                            None => return self.expected("an index"),
                        }
                    }
                }
            };
            items.push(item);
            match self.tok() {
                Tok::Comma => self.bump(),
                Tok::RBracket => {}
                _ => return self.expected(&format!("']' to close the index opened at {open}")),
            }
        }
        self.bump();
        self.leave();
        Ok((items, d))
    }
}

#[cfg(test)]
#[path = "parser_tests.rs"]
mod tests;
