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
mod tests {
    use super::*;

    /// A text on file line 1 starting at column 1.
    fn text(s: &str) -> Text {
        Text::at(s, Span::new(1, 1))
    }

    fn parse(s: &str) -> Vec<Stmt> {
        parse_stmts(&text(s), "body").unwrap_or_else(|e| panic!("{s:?}: {e:?}"))
    }

    fn err(s: &str) -> SyntaxError {
        match parse_stmts(&text(s), "body") {
            Ok(v) => panic!("{s:?} parsed: {v:?}"),
            Err(e) => e,
        }
    }

    fn expr(s: &str) -> Expr {
        match parse(s).pop().map(|s| s.kind) {
            Some(StmtKind::Expr(e)) => e,
            other => panic!("{s:?}: {other:?}"),
        }
    }

    fn sp(line: u32, col: u32) -> Span {
        Span::new(line, col)
    }

    fn name(n: &str, line: u32, col: u32) -> Expr {
        Expr::new(ExprKind::Name(n.into()), sp(line, col))
    }

    fn int(v: i64, line: u32, col: u32) -> Expr {
        Expr::new(ExprKind::Int(v), sp(line, col))
    }

    /// `x[...] = value`: an element assignment; other targets stay refused.
    #[test]
    fn element_assignment() {
        let s = parse("kc[:, :, t:t + 1] = k\n");
        assert!(matches!(&s[0].kind, StmtKind::SetItem { target, value }
            if target.to_string() == "kc[:, :, t:t + 1]" && value.to_string() == "k"));
        assert!(err("a.b = 1").message.contains("or one indexed tensor"));
        assert!(err("a[0], b = 1, 2")
            .message
            .contains("cannot assign to 'a[0]'"));
    }

    /// `for i in range(N) {`: a block with its variable and count.
    #[test]
    fn for_loops() {
        let s = parse("for i in range(n + 1) {\n  x = i\n}\n");
        let StmtKind::Block { kind, body } = &s[0].kind else {
            panic!("{s:?}")
        };
        assert_eq!(kind.to_string(), "for i in range(n + 1)");
        assert!(matches!(kind, BlockKind::For { var, .. } if var == "i"));
        assert_eq!(body.len(), 1);
        check_err(
            "for i in range(3, 4) {\n}",
            1,
            17,
            "expected ')' closing range(N): range takes one count, found ','",
        );
        check_err(
            "for i of range(3) {\n}",
            1,
            7,
            "expected 'in' after the loop variable (for i in range(N) {), found 'of'",
        );
    }

    /// `**` binds tighter than a unary minus on its left and than `*`, and to the right.
    #[test]
    fn power_binds_right_and_tight() {
        let e = expr("-x ** 2 * y");
        let ExprKind::Binary { op, lhs, .. } = &e.kind else {
            panic!("{e:?}")
        };
        assert_eq!(*op, BinOp::Mul);
        assert!(
            matches!(&lhs.kind, ExprKind::Neg(p) if matches!(p.kind, ExprKind::Binary { op: BinOp::Pow, .. }))
        );
        let e = expr("a ** b ** c");
        let ExprKind::Binary { op, lhs, rhs } = &e.kind else {
            panic!("{e:?}")
        };
        assert_eq!((*op, lhs.to_string()), (BinOp::Pow, "a".to_string()));
        assert_eq!(rhs.to_string(), "b ** c");
        for s in [
            "(a ** b) ** c",
            "x ** -1",
            "-x ** 2",
            "(a + b) ** 2",
            "x.sum() ** 0.5",
        ] {
            assert_eq!(expr(s).to_string(), s);
        }
        assert!(err("x ** ").message.contains("expected an expression"));
    }

    #[test]
    fn precedence_and_associativity() {
        let e = expr("a - b - c * d @ e");
        assert_eq!(e.to_string(), "a - b - c * d @ e");
        let ExprKind::Binary { op, lhs, rhs } = &e.kind else {
            panic!("{e:?}")
        };
        assert_eq!(*op, BinOp::Sub);
        assert_eq!(lhs.to_string(), "a - b");
        assert!(
            matches!(&rhs.kind, ExprKind::Binary { op: BinOp::MatMul, lhs, .. } if lhs.to_string() == "c * d")
        );
        assert_eq!(expr("-x.T").to_string(), "-x.T");
        assert!(matches!(expr("-x.T").kind, ExprKind::Neg(_)));
        assert_eq!(expr("a - (b - c)").to_string(), "a - (b - c)");
        assert_eq!(expr("(a + b) * -c").to_string(), "(a + b) * -c");
        assert_eq!(expr("(-x).sum()").to_string(), "(-x).sum()");
        assert_eq!(expr("((x))").to_string(), "x");
    }

    #[test]
    fn postfix_forms() {
        let e = expr("opt.zero_grad(set_to_none=true)");
        assert_eq!(
            e,
            Expr::new(
                ExprKind::Method {
                    recv: Box::new(name("opt", 1, 1)),
                    name: "zero_grad".into(),
                    args: vec![],
                    kwargs: vec![(
                        "set_to_none".into(),
                        Expr::new(ExprKind::Bool(true), sp(1, 27))
                    )],
                },
                sp(1, 1)
            )
        );
        let e = expr("x[:, 1:3, ::2, ..., none, 0, i:]");
        let ExprKind::Index { recv, items } = e.kind else {
            panic!()
        };
        assert_eq!(*recv, name("x", 1, 1));
        assert_eq!(
            items,
            vec![
                IndexItem::Slice {
                    start: None,
                    stop: None,
                    step: None
                },
                IndexItem::Slice {
                    start: Some(int(1, 1, 6)),
                    stop: Some(int(3, 1, 8)),
                    step: None
                },
                IndexItem::Slice {
                    start: None,
                    stop: None,
                    step: Some(int(2, 1, 13))
                },
                IndexItem::Ellipsis,
                IndexItem::NewAxis,
                IndexItem::Expr(int(0, 1, 27)),
                IndexItem::Slice {
                    start: Some(name("i", 1, 30)),
                    stop: None,
                    step: None
                },
            ]
        );
        assert_eq!(
            expr("f(a, [1, 2.5, \"s\\\"\"], k=none)[0].shape").to_string(),
            "f(a, [1, 2.5, \"s\\\"\"], k=none)[0].shape"
        );
        assert_eq!(expr("x[1::-1]").to_string(), "x[1::-1]");
        assert_eq!(expr("x[none + 1]").to_string(), "x[none + 1]");
        assert_eq!(expr("[]").to_string(), "[]");
        assert_eq!(expr("f(a,)").to_string(), "f(a)");
    }

    #[test]
    fn statements() {
        let s = parse("a, b = x.chunk(2)\ndel a, b\ndel x\nkeep(loss)  # why\n\n");
        assert_eq!(s.len(), 4);
        assert!(matches!(&s[0].kind, StmtKind::Assign { targets, .. } if targets == &["a", "b"]));
        assert_eq!(s[1].kind, StmtKind::Del(vec!["a".into(), "b".into()]));
        assert_eq!(s[2].span, sp(3, 1));
        assert!(matches!(&s[3].kind, StmtKind::Expr(e) if e.to_string() == "keep(loss)"));
    }

    /// Adjacent scopes of one name are one block; others stay apart.
    #[test]
    fn adjacent_scopes_of_one_name_merge() {
        let stmts = parse(
            "scope \"a\" {\n  x = f()\n}\nscope \"a\" {\n  y = f()\n}\nscope \"b\" {\n  z = f()\n}\ndel z\nscope \"b\" {\n  w = f()\n}",
        );
        let shape: Vec<(String, usize)> = stmts
            .iter()
            .map(|s| match &s.kind {
                StmtKind::Block {
                    kind: BlockKind::Scope(n),
                    body,
                } => (n.to_string(), body.len()),
                _ => ("-".to_string(), 0),
            })
            .collect();
        let want = [("a", 2), ("b", 1), ("-", 0), ("b", 1)];
        assert_eq!(
            shape,
            want.map(|(n, k)| (n.to_string(), k)).to_vec(),
            "{stmts:?}"
        );
    }

    #[test]
    fn blocks_nest() {
        let s = parse(
            "no_grad {\n  autocast(dtype=bf16) {\n    scope \"enc\" {\n      y = f(x)\n    }\n  }\n  autocast {\n  }\n}\nphase \"fwd\" {\n}\ncheckpoint {\n}\nautocast(\"f16\") {\n}",
        );
        assert_eq!(s.len(), 4);
        let StmtKind::Block { kind, body } = &s[0].kind else {
            panic!()
        };
        assert_eq!(*kind, BlockKind::NoGrad);
        let StmtKind::Block { kind, body: inner } = &body[0].kind else {
            panic!()
        };
        assert_eq!(
            *kind,
            BlockKind::Autocast {
                dtype: Some("bf16".into())
            }
        );
        assert_eq!(body[0].span, sp(2, 3));
        assert!(
            matches!(&inner[0].kind, StmtKind::Block { kind: BlockKind::Scope(s), body } if s == "enc" && body.len() == 1)
        );
        assert!(
            matches!(&body[1].kind, StmtKind::Block { kind: BlockKind::Autocast { dtype: None }, body } if body.is_empty())
        );
        assert!(
            matches!(&s[1].kind, StmtKind::Block { kind: BlockKind::Phase(p), .. } if p == "fwd")
        );
        assert!(matches!(
            &s[2].kind,
            StmtKind::Block {
                kind: BlockKind::Checkpoint { .. },
                ..
            }
        ));
        assert!(
            matches!(&s[3].kind, StmtKind::Block { kind: BlockKind::Autocast { dtype: Some(d) }, .. } if d == "f16")
        );
        // Block keywords are ordinary names elsewhere.
        assert_eq!(parse("checkpoint(f, x)\nscope = 1").len(), 2);
    }

    #[test]
    fn continuation_over_lines() {
        let s = parse("y = f(a,\n      b,  # second\n      k=[1,\n         2])\nz = y");
        assert_eq!(s.len(), 2);
        let StmtKind::Assign { value, .. } = &s[0].kind else {
            panic!()
        };
        assert_eq!(value.to_string(), "f(a, b, k=[1, 2])");
        let ExprKind::Call { args, kwargs, .. } = &value.kind else {
            panic!()
        };
        assert_eq!(args[1].span, sp(2, 7));
        assert_eq!(kwargs[0].1.span, sp(3, 9));
        assert_eq!(s[1].span, sp(5, 1));
    }

    fn check_err(src: &str, line: u32, col: u32, message: &str) {
        let e = err(src);
        assert_eq!(
            (e.span, e.message.as_str()),
            (sp(line, col), message),
            "{src:?}"
        );
    }

    #[test]
    fn errors_name_position_and_expectation() {
        check_err(
            "x = 1\ny = f(a b)",
            2,
            9,
            "expected ')' to close the call opened at 2:6, found 'b'",
        );
        check_err(
            "y = x.view(1,\n 2",
            2,
            3,
            "expected ')' to close the method call opened at 1:11, found the end of 'body'",
        );
        check_err("x = 1\n}", 2, 1, "'}' without an open block");
        check_err(
            "no_grad {\n  x = 1\n  checkpoint {\n  }\n",
            1,
            9,
            "the '{' of 'no_grad' is never closed: expected a line '}' before the end of 'body'",
        );
        check_err(
            "f(k=1, k=2)",
            1,
            8,
            "keyword argument 'k' given twice (first at 1:3)",
        );
        check_err(
            "f(k=1, x)",
            1,
            8,
            "positional argument after keyword argument 'k': positional arguments come first",
        );
        check_err(
            "x.y = 1",
            1,
            1,
            "cannot assign to 'x.y': the left of '=' takes plain names (x = ... or a, b = ...) or one indexed tensor (x[0, :2] = ...)",
        );
        check_err(
            "a, b",
            1,
            5,
            "expected '=' after the assignment targets, found the end of 'body'",
        );
        check_err(
            "x = (1 + 2",
            1,
            11,
            "expected ')' to close the parenthesis opened at 1:5, found the end of 'body'",
        );
        check_err(
            "x = [1 2]",
            1,
            8,
            "expected ']' to close the list opened at 1:5, found '2'",
        );
        check_err(
            "x[1 2]",
            1,
            5,
            "expected ']' to close the index opened at 1:2, found '2'",
        );
        check_err(
            "x[]",
            1,
            3,
            "expected an index inside '[]' (x[0], x[1:3], x[:, ...])",
        );
        check_err(
            "x = ",
            1,
            5,
            "expected an expression, found the end of 'body'",
        );
        check_err(
            "x = 1 2",
            1,
            7,
            "expected end of line after the statement, found '2'",
        );
        check_err(
            "del x.y",
            1,
            6,
            "expected end of line after the del statement, found '.'",
        );
        check_err(
            "del",
            1,
            4,
            "expected a name to delete (del x or del x, y), found the end of 'body'",
        );
        check_err("no_grad { x = 1\n}", 1, 11, "expected end of line after '{' (the block's statements go on the lines below it), found 'x'");
        check_err(
            "no_grad {\n} x",
            2,
            3,
            "expected end of line after '}' (a block's '}' stands on a line of its own), found 'x'",
        );
        check_err("loop {\n}", 1, 1, "unknown block 'loop': blocks are no_grad, autocast, autocast(DTYPE), checkpoint, scope \"NAME\", phase \"NAME\" and for NAME in range(N)");
        check_err(
            "scope {\n}",
            1,
            7,
            "expected a quoted name after 'scope' (scope \"NAME\" {), found '{'",
        );
        check_err(
            "no_grad\nx = 1",
            1,
            8,
            "expected '{' after 'no_grad' to open the block, found end of line",
        );
        check_err(
            "autocast(bf16 f16) {\n}",
            1,
            15,
            "expected ')' to close the autocast opened at 1:9 (it takes one dtype), found 'f16'",
        );
        check_err(
            "x[0](1)",
            1,
            5,
            "cannot call 'x[0]': only names and methods can be called (f(x), x.f())",
        );
        check_err(
            "a, a = f()",
            1,
            4,
            "'a' is assigned twice in one statement (first at 1:1)",
        );
        check_err("x = del", 1, 5, "'del' is a statement (del x), not a value");
        check_err(
            "f(none=1)",
            1,
            3,
            "'none' is a keyword, not an argument name",
        );
        check_err("x.1", 1, 3, "expected a name after '.', found '1'");
    }

    #[test]
    fn nesting_is_bounded() {
        let deep = format!(
            "x = {}1{}",
            "(".repeat(MAX_NESTING),
            ")".repeat(MAX_NESTING)
        );
        assert!(parse_stmts(&text(&deep), "body").is_ok());
        let deep = format!(
            "x = {}1{}",
            "(".repeat(MAX_NESTING + 1),
            ")".repeat(MAX_NESTING + 1)
        );
        let e = err(&deep);
        // At the 65th '('.
        assert_eq!(e.span, sp(1, 5 + MAX_NESTING as u32));
        assert_eq!(
            e.message,
            format!(
                "expression nested too deeply: more than {MAX_NESTING} levels of parentheses, \
                 brackets, calls or '-'"
            )
        );
        let deeper = format!("x = {}1{}", "(".repeat(100_000), ")".repeat(100_000));
        assert!(err(&deeper)
            .message
            .starts_with("expression nested too deeply"));
        let negs = format!("x = {}1", "-".repeat(100_000));
        assert!(err(&negs)
            .message
            .starts_with("expression nested too deeply"));
        let lists = format!("x = {}", "[".repeat(100_000));
        assert!(err(&lists)
            .message
            .starts_with("expression nested too deeply"));
        let chain = format!("x = a{}", ".b".repeat(100_000));
        assert!(err(&chain).message.starts_with("expression too deep"));
        let sum = format!("x = a{}", " + a".repeat(100_000));
        assert!(err(&sum).message.starts_with("expression too deep"));
        let calls = format!("x = {}1{}", "f(".repeat(100_000), ")".repeat(100_000));
        assert!(err(&calls)
            .message
            .starts_with("expression nested too deeply"));
        let blocks = "no_grad {\n".repeat(100_000);
        let e = err(&blocks);
        assert_eq!(e.span, sp(MAX_NESTING as u32 + 1, 1));
        assert_eq!(
            e.message,
            format!("blocks nested too deeply: more than {MAX_NESTING} levels")
        );
        let ok = "no_grad {\n".repeat(MAX_NESTING) + &"}\n".repeat(MAX_NESTING);
        assert!(parse_stmts(&text(&ok), "body").is_ok());
    }

    #[test]
    fn display_round_trips() {
        for src in [
            "a + b * c - d / e @ f",
            "-(a + b)",
            "--x",
            "x.view(-1, 4).T[0, :, none, ...]",
            "f([1, 2], \"a\\\\b\", x=1e-07, y=0.5, z=none, w=false)",
            "(a - b) - (c - d)",
            "a / (b * c)",
            "x[::2, 1:, :3, 1:2:3]",
        ] {
            let e = expr(src);
            let printed = e.to_string();
            let again = expr(&printed);
            assert_eq!(printed, again.to_string(), "{src}");
            assert_eq!(strip(&e), strip(&again), "{src}");
        }
    }

    /// Debug text of `e` with every span removed, to compare trees.
    fn strip(e: &Expr) -> String {
        let s = format!("{e:?}");
        let mut out = String::new();
        let mut rest = s.as_str();
        while let Some(i) = rest.find(", span: Span {") {
            out.push_str(&rest[..i]);
            rest = &rest[i..];
            let close = rest.find('}').unwrap();
            rest = &rest[close + 1..];
        }
        out.push_str(rest);
        out
    }
}
