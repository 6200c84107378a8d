//! The parser's tests: statements, precedence, blocks, errors with their positions, bounds.

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
    assert!(matches!(&s[1].kind, StmtKind::Block { kind: BlockKind::Phase(p), .. } if p == "fwd"));
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
