//! Whole-file tests: the TOML keys, positions in the file, error messages, the fixtures, and
//! property tests that no input panics.

use std::path::Path;

use proptest::prelude::*;

use super::*;
use crate::alloc::AllocConf;
use crate::units::GIB;

const PATH: &str = "fixtures/x.toml";

fn ok(text: &str) -> Workload {
    parse(text, Path::new(PATH)).unwrap_or_else(|e| panic!("{e}\n---\n{text}"))
}

/// The error's full text: `fixtures/x.toml: line L column C: message`.
fn err(text: &str) -> String {
    match parse(text, Path::new(PATH)) {
        Ok(w) => panic!("parsed: {w:?}\n---\n{text}"),
        Err(e) => {
            assert!(matches!(e, Error::Input { .. }), "{e:?}");
            e.to_string()
        }
    }
}

fn sp(line: u32, col: u32) -> Span {
    Span::new(line, col)
}

fn ex(kind: ExprKind, line: u32, col: u32) -> Expr {
    Expr::new(kind, sp(line, col))
}

fn name(n: &str, line: u32, col: u32) -> Expr {
    ex(ExprKind::Name(n.into()), line, col)
}

fn int(v: i64, line: u32, col: u32) -> Expr {
    ex(ExprKind::Int(v), line, col)
}

fn bx(e: Expr) -> Box<Expr> {
    Box::new(e)
}

const FULL: &str = r#"# every construct of the format
[workload]
name = "every construct"
iterations = 2
capacity = "24GiB"
alloc_conf = "expandable_segments:True"
device = "cpu"
description = "parser test"
setup = """
w = randn(1_024, 1024, dtype=bf16)   # weights
opt = adam([w], lr=1e-3)
mark("setup done")
"""
body = """
x = randn(8, 1024)
no_grad {
    h = (x @ w.T) * 0.5 - -1
}
autocast(bf16) {
    scope "encoder.layer3" {
        phase "forward" {
            y = f(x,
                  w[:, 1:3],   # continued call
                  k=[1, 2.5, "s", none, false])
        }
    }
}
autocast(dtype=f16) {
    checkpoint {
        a, b = y.chunk(2, dim=-1)
    }
}
autocast {
}

loss = (a.sum() + b[..., none, ::2].mean()) / 2
loss.backward()
keep(loss)
del a, b
del x
opt.step()
opt.zero_grad(set_to_none=true)
empty_cache()
reset_peak_memory_stats()
n = y.shape[0]
"""
"#;

#[test]
fn full_example_settings() {
    let w = ok(FULL);
    assert_eq!(w.name, "every construct");
    assert_eq!(w.iterations, 2);
    assert_eq!(w.capacity, Some(24 * GIB));
    assert!(w.alloc_conf.expandable_segments);
    assert_eq!(w.alloc_conf.raw, "expandable_segments:True");
    assert_eq!(w.device, Device::Cpu);
    assert_eq!(w.description.as_deref(), Some("parser test"));
    assert_eq!(w.setup.len(), 3);
    assert_eq!(w.body.len(), 15);
}

#[test]
fn full_example_setup_ast_and_spans() {
    let w = ok(FULL);
    // Line 10: the first line of `setup`, TOML trimmed the newline after `"""`.
    assert_eq!(
        w.setup[0],
        Stmt {
            kind: StmtKind::Assign {
                targets: vec!["w".into()],
                value: ex(
                    ExprKind::Call {
                        func: "randn".into(),
                        args: vec![int(1024, 10, 11), int(1024, 10, 18)],
                        kwargs: vec![("dtype".into(), name("bf16", 10, 30))],
                    },
                    10,
                    5
                ),
            },
            span: sp(10, 1),
        }
    );
    assert_eq!(
        w.setup[1].kind,
        StmtKind::Assign {
            targets: vec!["opt".into()],
            value: ex(
                ExprKind::Call {
                    func: "adam".into(),
                    args: vec![ex(ExprKind::List(vec![name("w", 11, 13)]), 11, 12)],
                    kwargs: vec![("lr".into(), ex(ExprKind::Float(1e-3), 11, 20))],
                },
                11,
                7
            ),
        }
    );
    // A statement on TOML line 12, column 1, and the string inside it at column 6.
    assert_eq!(
        w.setup[2],
        Stmt {
            kind: StmtKind::Expr(ex(
                ExprKind::Call {
                    func: "mark".into(),
                    args: vec![ex(ExprKind::Str("setup done".into()), 12, 6)],
                    kwargs: vec![],
                },
                12,
                1
            )),
            span: sp(12, 1),
        }
    );
}

#[test]
fn full_example_body_ast_and_spans() {
    let w = ok(FULL);
    let b = &w.body;
    assert_eq!(b[0].span, sp(15, 1));

    // no_grad { h = (x @ w.T) * 0.5 - -1 }
    let StmtKind::Block { kind, body } = &b[1].kind else {
        panic!("{:?}", b[1])
    };
    assert_eq!((kind, b[1].span), (&BlockKind::NoGrad, sp(16, 1)));
    let matmul = ex(
        ExprKind::Binary {
            op: BinOp::MatMul,
            lhs: bx(name("x", 17, 10)),
            rhs: bx(ex(
                ExprKind::Attr {
                    recv: bx(name("w", 17, 14)),
                    name: "T".into(),
                },
                17,
                14,
            )),
        },
        17,
        9, // the '('
    );
    let product = ex(
        ExprKind::Binary {
            op: BinOp::Mul,
            lhs: bx(matmul),
            rhs: bx(ex(ExprKind::Float(0.5), 17, 21)),
        },
        17,
        9,
    );
    assert_eq!(
        body,
        &vec![Stmt {
            kind: StmtKind::Assign {
                targets: vec!["h".into()],
                value: ex(
                    ExprKind::Binary {
                        op: BinOp::Sub,
                        lhs: bx(product),
                        rhs: bx(ex(ExprKind::Neg(bx(int(1, 17, 28))), 17, 27)),
                    },
                    17,
                    9
                ),
            },
            span: sp(17, 5),
        }]
    );

    // autocast(bf16) { scope "encoder.layer3" { phase "forward" { y = f(x, ...) } } }
    let StmtKind::Block { kind, body } = &b[2].kind else {
        panic!()
    };
    assert_eq!(
        kind,
        &BlockKind::Autocast {
            dtype: Some("bf16".into())
        }
    );
    let StmtKind::Block { kind, body } = &body[0].kind else {
        panic!()
    };
    assert_eq!(kind, &BlockKind::Scope("encoder.layer3".into()));
    let StmtKind::Block { kind, body } = &body[0].kind else {
        panic!()
    };
    assert_eq!(kind, &BlockKind::Phase("forward".into()));
    let call = ex(
        ExprKind::Call {
            func: "f".into(),
            args: vec![
                name("x", 22, 19),
                ex(
                    ExprKind::Index {
                        recv: bx(name("w", 23, 19)),
                        items: vec![
                            IndexItem::Slice {
                                start: None,
                                stop: None,
                                step: None,
                            },
                            IndexItem::Slice {
                                start: Some(int(1, 23, 24)),
                                stop: Some(int(3, 23, 26)),
                                step: None,
                            },
                        ],
                    },
                    23,
                    19,
                ),
            ],
            kwargs: vec![(
                "k".into(),
                ex(
                    ExprKind::List(vec![
                        int(1, 24, 22),
                        ex(ExprKind::Float(2.5), 24, 25),
                        ex(ExprKind::Str("s".into()), 24, 30),
                        ex(ExprKind::None, 24, 35),
                        ex(ExprKind::Bool(false), 24, 41),
                    ]),
                    24,
                    21,
                ),
            )],
        },
        22,
        17,
    );
    assert_eq!(
        body,
        &vec![Stmt {
            kind: StmtKind::Assign {
                targets: vec!["y".into()],
                value: call,
            },
            span: sp(22, 13),
        }]
    );

    // autocast(dtype=f16) { checkpoint { a, b = y.chunk(2, dim=-1) } }
    let StmtKind::Block { kind, body } = &b[3].kind else {
        panic!()
    };
    assert_eq!(
        kind,
        &BlockKind::Autocast {
            dtype: Some("f16".into())
        }
    );
    let StmtKind::Block { kind, body } = &body[0].kind else {
        panic!()
    };
    assert_eq!(
        (kind, body.len()),
        (&BlockKind::Checkpoint { hold: Vec::new() }, 1)
    );
    assert_eq!(
        body[0],
        Stmt {
            kind: StmtKind::Assign {
                targets: vec!["a".into(), "b".into()],
                value: ex(
                    ExprKind::Method {
                        recv: bx(name("y", 30, 16)),
                        name: "chunk".into(),
                        args: vec![int(2, 30, 24)],
                        kwargs: vec![("dim".into(), ex(ExprKind::Neg(bx(int(1, 30, 32))), 30, 31))],
                    },
                    30,
                    16
                ),
            },
            span: sp(30, 9),
        }
    );
    assert!(matches!(
        &b[4].kind,
        StmtKind::Block { kind: BlockKind::Autocast { dtype: None }, body } if body.is_empty()
    ));

    // The rest, in source form, each with its line.
    let rest: Vec<(u32, String)> = b[5..]
        .iter()
        .map(|s| {
            let text = match &s.kind {
                StmtKind::Assign { targets, value } => format!(
                    "{} = {value}",
                    targets
                        .iter()
                        .map(|t| t.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                StmtKind::SetItem { target, value } => format!("{target} = {value}"),
                StmtKind::Del(names) => format!(
                    "del {}",
                    names
                        .iter()
                        .map(|t| t.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                StmtKind::Expr(e) => e.to_string(),
                StmtKind::Block { .. } => panic!("{s:?}"),
            };
            assert_eq!(s.span.col, 1);
            (s.span.line, text)
        })
        .collect();
    let want: Vec<(u32, String)> = [
        (36, "loss = (a.sum() + b[..., none, ::2].mean()) / 2"),
        (37, "loss.backward()"),
        (38, "keep(loss)"),
        (39, "del a, b"),
        (40, "del x"),
        (41, "opt.step()"),
        (42, "opt.zero_grad(set_to_none=true)"),
        (43, "empty_cache()"),
        (44, "reset_peak_memory_stats()"),
        (45, "n = y.shape[0]"),
    ]
    .into_iter()
    .map(|(l, s)| (l, s.to_string()))
    .collect();
    assert_eq!(rest, want);
    let StmtKind::Assign { value, .. } = &b[5].kind else {
        panic!()
    };
    // `(a.sum() + ...) / 2` starts at its '(' on column 8; the `b` inside is at column 19.
    assert_eq!(value.span, sp(36, 8));
    let ExprKind::Binary { lhs, .. } = &value.kind else {
        panic!()
    };
    let ExprKind::Binary { rhs, .. } = &lhs.kind else {
        panic!()
    };
    assert_eq!(rhs.span, sp(36, 19));
}

#[test]
fn check_table_tolerances_and_budgets() {
    let w = ok(
        "[workload]\nname = \"n\"\nbody = \"f()\"\n[check]\ntolerance = \"2%\"\n\
                peak_reserved_tolerance = \"0.5%\"\nmax_peak_reserved = \"20GiB\"\n\
                max_peak_allocated = 1073741824\n",
    );
    assert_eq!(w.check.tolerance, Some(20_000));
    assert_eq!(w.check.tolerance_for("peak_reserved"), Some(5_000));
    assert_eq!(w.check.budgets["peak_reserved"], 20 * GIB);
    assert_eq!(w.check.budgets["peak_allocated"], GIB);
    // a preset takes [check] too
    let w = ok(
        "[model]\nkind = \"mlp\"\nd_in = 8\nhidden = 8\nlayers = 1\nd_out = 8\n[train]\nbatch = 8\n[check]\nmax_activation_at_peak = \"1MiB\"\n",
    );
    assert_eq!(w.check.budgets["activation_at_peak"], 1 << 20);
    let e = err("[workload]\nname = \"n\"\nbody = \"f()\"\n[check]\nmax_peak = \"1GiB\"\n");
    assert!(
        e.starts_with("fixtures/x.toml: line 5 column 12: [check]: unknown key 'max_peak'"),
        "{e}"
    );
    let e =
        err("[workload]\nname = \"n\"\nbody = \"f()\"\n[check]\nmax_peak_reserved = \"2 GiBs\"\n");
    assert!(
        e.starts_with(
            "fixtures/x.toml: line 5 column 21: [check]: 'max_peak_reserved': unknown unit"
        ),
        "{e}"
    );
    let e = err("[workload]\nname = \"n\"\nbody = \"f()\"\n[check]\ntolerance = 0.02\n");
    assert!(e.contains("'tolerance' must be a percentage"), "{e}");
}

#[test]
fn defaults() {
    let w = ok("[workload]\nname = \"n\"\nbody = \"f()\"\n");
    assert_eq!(w.iterations, 1);
    assert_eq!(w.capacity, None);
    assert_eq!(w.alloc_conf, AllocConf::default());
    assert_eq!(w.device, Device::Sim);
    assert_eq!(w.description, None);
    assert!(w.setup.is_empty());
    assert_eq!(w.body.len(), 1);
    // Only setup is fine too; integer capacity is bytes.
    let w = ok("[workload]\nname = \"n\"\ncapacity = 1_048_576\nsetup = \"x = 1\"\n");
    assert_eq!(w.capacity, Some(1 << 20));
    assert!(w.body.is_empty());
}

#[test]
fn positions_through_toml_string_forms() {
    // A one-line basic string with \n escapes: statements share the TOML line.
    let w = ok("[workload]\nname = \"n\"\nbody = \"x = 1\\ny = \\\"s\\\"\"\n");
    assert_eq!(w.body[0].span, sp(3, 9));
    assert_eq!(w.body[1].span, sp(3, 16));
    let StmtKind::Assign { value, .. } = &w.body[1].kind else {
        panic!()
    };
    assert_eq!(value, &ex(ExprKind::Str("s".into()), 3, 20));
    // A ''' literal string with the opening quotes on the key's line, and CRLF line ends.
    let w = ok("[workload]\r\nname = \"n\"\r\nbody = '''x = \"a\\\\b\"\r\n  y = x'''\r\n");
    assert_eq!(w.body[0].span, sp(3, 11));
    assert_eq!(
        w.body[0].kind,
        StmtKind::Assign {
            targets: vec!["x".into()],
            value: ex(ExprKind::Str("a\\b".into()), 3, 15),
        }
    );
    assert_eq!(w.body[1].span, sp(4, 3));
    // A line-ending backslash in a """ string joins lines; positions stay in the file.
    let w = ok("[workload]\nname = \"n\"\nbody = \"\"\"\nf(a, \\\n     b)\n\"\"\"\n");
    let StmtKind::Expr(e) = &w.body[0].kind else {
        panic!()
    };
    let ExprKind::Call { args, .. } = &e.kind else {
        panic!()
    };
    assert_eq!(args[1].span, sp(5, 6));
    // Multi-byte characters count as one column.
    let w = ok("[workload]\nname = \"n\"\nbody = \"\"\"\nmark(\"é\", x)\n\"\"\"\n");
    let StmtKind::Expr(e) = &w.body[0].kind else {
        panic!()
    };
    let ExprKind::Call { args, .. } = &e.kind else {
        panic!()
    };
    assert_eq!(args[1].span, sp(4, 11));
}

/// `(file text, expected full error)`.
const ERRORS: &[(&str, &str)] = &[
    (
        "[workload]\nname = \"x\"\niteration = 3\nbody = \"f()\"\n",
        "fixtures/x.toml: line 3 column 1: unknown key 'iteration' in [workload] (known: name, \
         iterations, capacity, alloc_conf, device, description, setup, body)",
    ),
    (
        "title = \"x\"\n[workload]\nname = \"x\"\n",
        "fixtures/x.toml: line 1 column 1: unknown table or key 'title' at the top level: a \
         workload file has [workload] (setup and body, with integer [params]), or [model] and \
         [train] (a preset), an optional [distributed] (data-parallel training of a Hugging \
         Face config) and an optional [check] (tolerances and budgets for gpumem check); every \
         key goes in one of them",
    ),
    (
        "[workload]\nname = \"x\"\nbody = \"f()\"\n[workload.extra]\nk = 1\n",
        "fixtures/x.toml: line 4 column 11: unknown key 'extra' in [workload] (known: name, \
         iterations, capacity, alloc_conf, device, description, setup, body)",
    ),
    (
        "[workload]\nname = \"x\"\nbody = \"\"\"\nx = 1\n}\n\"\"\"\n",
        "fixtures/x.toml: line 5 column 1: '}' without an open block",
    ),
    (
        "[workload]\nname = \"x\"\nbody = \"\"\"\nno_grad {\n  x = 1\n\"\"\"\n",
        "fixtures/x.toml: line 4 column 9: the '{' of 'no_grad' is never closed: expected a line \
         '}' before the end of 'body'",
    ),
    (
        "[workload]\nname = \"x\"\nsetup = \"\"\"\n  y = f(a b)\n\"\"\"\n",
        "fixtures/x.toml: line 4 column 11: expected ')' to close the call opened at 4:8, found 'b'",
    ),
    (
        "[workload]\nname = \"x\"\nbody = \"\"\"\ny = f(a,\n      b\n\"\"\"\n",
        "fixtures/x.toml: line 6 column 1: expected ')' to close the call opened at 4:6, found \
         the end of 'body'",
    ),
    (
        "[workload]\nname = \"x\"\nbody = \"\"\"\nf(k=1, k=2)\n\"\"\"\n",
        "fixtures/x.toml: line 4 column 8: keyword argument 'k' given twice (first at 4:3)",
    ),
    (
        "[workload]\nbody = \"f()\"\n",
        "fixtures/x.toml: line 1 column 1: missing required key 'name' in [workload] \
         (name = \"what this workload shows\")",
    ),
    (
        "[workload]\nname = \"  \"\nbody = \"f()\"\n",
        "fixtures/x.toml: line 2 column 8: 'name' must not be empty",
    ),
    (
        "[workload]\nname = 3\n",
        "fixtures/x.toml: line 2 column 8: 'name' must be a string, found an integer",
    ),
    (
        "[workload]\nname = \"x\"\niterations = 0\nbody = \"f()\"\n",
        "fixtures/x.toml: line 3 column 14: 'iterations' must be at least 1, found 0",
    ),
    (
        "[workload]\nname = \"x\"\niterations = 5_000_000_000\nbody = \"f()\"\n",
        "fixtures/x.toml: line 3 column 14: 'iterations' must be at most 4294967295, found \
         5000000000",
    ),
    (
        "[workload]\nname = \"x\"\niterations = \"3\"\nbody = \"f()\"\n",
        "fixtures/x.toml: line 3 column 14: 'iterations' must be an integer of at least 1, found \
         a string",
    ),
    (
        "[workload]\nname = \"x\"\ncapacity = \"24 GB!\"\nbody = \"f()\"\n",
        "fixtures/x.toml: line 3 column 12: 'capacity': unknown unit 'gb!' in size '24 GB!'; use \
         B, KiB, MiB, GiB or TiB",
    ),
    (
        "[workload]\nname = \"x\"\ncapacity = 1.5\nbody = \"f()\"\n",
        "fixtures/x.toml: line 3 column 12: 'capacity' must be a size: a string such as \"24GiB\" \
         or an integer number of bytes, found a float",
    ),
    (
        "[workload]\nname = \"x\"\ncapacity = -1\nbody = \"f()\"\n",
        "fixtures/x.toml: line 3 column 12: 'capacity' must be more than 0 bytes (e.g. 24GiB)",
    ),
    (
        "[workload]\nname = \"x\"\ndevice = \"gpu\"\nbody = \"f()\"\n",
        "fixtures/x.toml: line 3 column 10: unknown device 'gpu': expected \"sim\", \"cpu\" or \
         \"cuda\"",
    ),
    (
        "[workload]\nname = \"x\"\nbody = [\"f()\"]\n",
        "fixtures/x.toml: line 3 column 8: 'body' must be a string, found an array",
    ),
    (
        "[workload]\nname = \"x\"\nsetup = \"\"\"\n# only a comment\n\"\"\"\nbody = \"\"\n",
        "fixtures/x.toml: line 1 column 1: the workload has no statements: give 'setup' or 'body' \
         (or both) at least one statement",
    ),
    (
        "# nothing\n",
        "fixtures/x.toml: line 1 column 1: missing the [workload] table: a workload file starts \
         with [workload], then name = \"...\" and a body = \"\"\"...\"\"\" (or describes a \
         standard model with [model] and [train])",
    ),
    (
        "[workload]\nname = \"x\"\nname = \"y\"\n",
        "fixtures/x.toml: line 3 column 1: invalid TOML: duplicate key",
    ),
    (
        "workload = 3\n",
        "fixtures/x.toml: line 1 column 12: 'workload' must be a table: write [workload] on a \
         line of its own and its keys below it (invalid type: integer `3`, expected a table)",
    ),
];

#[test]
fn errors_name_file_line_column_and_expectation() {
    for (text, want) in ERRORS {
        assert_eq!(&err(text), want, "\n---\n{text}");
    }
}

#[test]
fn toml_syntax_errors_have_positions() {
    let e = err("[workload]\nname = \"x\nbody = \"f()\"\n");
    assert!(
        e.starts_with("fixtures/x.toml: line 2 column 10: invalid TOML: "),
        "{e}"
    );
    let e = err("[workload]\nname = \"x\"\n\niterations = = 3\n");
    assert!(e.starts_with("fixtures/x.toml: line 4 column "), "{e}");
    let e = err("[workload\n");
    assert!(e.starts_with("fixtures/x.toml: line 1 column "), "{e}");
}

#[test]
fn alloc_conf_errors_name_the_key() {
    let e = err("[workload]\nname = \"x\"\nalloc_conf = \"max_split_size_mb:1\"\nbody = \"f()\"\n");
    assert!(
        e.starts_with(
            "fixtures/x.toml: line 3 column 14: bad 'alloc_conf': max_split_size_mb too small"
        ),
        "{e}"
    );
    let e = err("[workload]\nname = \"x\"\nalloc_conf = \"expandable:True\"\nbody = \"f()\"\n");
    assert!(e.contains("unrecognized key 'expandable'"), "{e}");
    let w = ok("[workload]\nname = \"x\"\nalloc_conf = \"max_split_size_mb:128,garbage_collection_threshold:0.6\"\nbody = \"f()\"\n");
    assert_eq!(w.alloc_conf.max_split_size, 128 << 20);
    assert_eq!(
        w.alloc_conf.raw,
        "max_split_size_mb:128,garbage_collection_threshold:0.6"
    );
}

#[test]
fn load_reports_unreadable_files_and_bad_utf8() {
    let missing = Path::new("fixtures/workloads/parse/does-not-exist.toml");
    let e = load(missing).unwrap_err();
    assert!(matches!(e, Error::Read { .. }), "{e:?}");
    assert!(e
        .to_string()
        .starts_with("cannot read fixtures/workloads/parse/does-not-exist.toml"));

    let e = parse_bytes(
        b"[workload]\nname = \"a\xffb\"\n",
        Path::new(PATH),
        &Default::default(),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "fixtures/x.toml: line 2 column 10: the file is not valid UTF-8 (byte 0xff); TOML files \
         are UTF-8"
    );
}

#[test]
fn fixtures_all_parse() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/workloads/parse");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    assert!(files.len() >= 2, "{files:?}");
    for f in &files {
        let w = load(f).unwrap_or_else(|e| panic!("{e}"));
        assert!(!w.body.is_empty() || !w.setup.is_empty(), "{}", f.display());
    }
}

/// Builds a file whose `body` is `body`, written as a TOML basic string by `toml` itself.
fn file_with_body(body: &str) -> String {
    format!(
        "[workload]\nname = \"p\"\nbody = {}\n",
        toml::Value::String(body.to_string())
    )
}

/// Pieces of the line language, to make random programs that get past the lexer.
fn piece() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "x",
        "y",
        "f",
        "del",
        "none",
        "true",
        "no_grad",
        "autocast",
        "scope",
        "phase",
        "checkpoint",
        "dtype",
        "1",
        "2.5",
        "1e-3",
        "\"s\"",
        "(",
        ")",
        "[",
        "]",
        "{",
        "}",
        ",",
        ":",
        ".",
        "...",
        "=",
        "+",
        "-",
        "*",
        "/",
        "@",
        "\n",
        " ",
        "#c\n",
        "\"",
        "'",
        "\\",
    ])
}

/// Source text of a random valid expression (every form of the grammar).
fn expr_src() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        prop::sample::select(vec!["x", "loss", "_w2", "true", "false", "none"])
            .prop_map(String::from),
        (0i64..100_000).prop_map(|v| v.to_string()),
        prop::sample::select(vec!["0.5", "1e-3", "2.5E+4", "1_024"]).prop_map(String::from),
        "[a-z \"\\\\]{0,6}"
            .prop_map(|s| format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))),
    ];
    leaf.prop_recursive(6, 48, 4, |inner| {
        let args = prop::collection::vec(inner.clone(), 0..3);
        let kwargs = prop::collection::vec(("[a-z]{1,3}", inner.clone()), 0..3).prop_map(|kw| {
            // Keyword names must differ and not be keywords.
            kw.into_iter()
                .enumerate()
                .map(|(i, (k, v))| format!("k{i}{k}={v}"))
                .collect::<Vec<_>>()
        });
        let item = prop_oneof![
            inner.clone(),
            Just(":".to_string()),
            Just("...".to_string()),
            Just("none".to_string()),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("{a}:{b}")),
            inner.clone().prop_map(|s| format!("::{s}")),
        ];
        prop_oneof![
            (
                inner.clone(),
                prop::sample::select(vec!["+", "-", "*", "/", "@"]),
                inner.clone()
            )
                .prop_map(|(a, op, b)| format!("{a} {op} {b}")),
            inner.clone().prop_map(|a| format!("-{a}")),
            inner.clone().prop_map(|a| format!("({a})")),
            prop::collection::vec(inner.clone(), 0..3).prop_map(|v| format!("[{}]", v.join(", "))),
            (args.clone(), kwargs.clone()).prop_map(|(a, k)| {
                format!(
                    "f({})",
                    a.into_iter().chain(k).collect::<Vec<_>>().join(",\n  ")
                )
            }),
            (inner.clone(), args, kwargs).prop_map(|(r, a, k)| {
                format!(
                    "({r}).m({})",
                    a.into_iter().chain(k).collect::<Vec<_>>().join(", ")
                )
            }),
            inner.clone().prop_map(|r| format!("({r}).T")),
            (inner, prop::collection::vec(item, 1..4))
                .prop_map(|(r, items)| format!("({r})[{}]", items.join(", "))),
        ]
    })
}

/// A random valid body: assignments, bare expressions, del and nested blocks, with comments.
fn body_src() -> impl Strategy<Value = String> {
    let stmt = prop_oneof![
        expr_src().prop_map(|e| format!("y = {e}")),
        expr_src().prop_map(|e| format!("a, b = {e}  # two")),
        expr_src().prop_map(|e| format!("keep({e})")),
        Just("del a, b".to_string()),
        Just("# a comment".to_string()),
        Just(String::new()),
    ];
    let line = stmt.prop_recursive(4, 24, 4, |inner| {
        (
            prop::sample::select(vec![
                "no_grad",
                "autocast",
                "autocast(bf16)",
                "autocast(dtype=f16)",
                "checkpoint",
                "scope \"enc.l0\"",
                "phase \"fwd\"",
            ]),
            prop::collection::vec(inner, 0..4),
        )
            .prop_map(|(head, body)| format!("{head} {{\n{}\n}}", body.join("\n")))
    });
    prop::collection::vec(line, 1..6).prop_map(|v| v.join("\n") + "\nx = 1")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_body_string_never_panics(body in any::<String>()) {
        let _ = parse(&file_with_body(&body), Path::new(PATH));
    }

    #[test]
    fn any_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        let _ = parse_bytes(&bytes, Path::new(PATH), &Default::default());
    }

    #[test]
    fn any_file_text_never_panics(text in "(\\[workload\\]\n)?[a-z_ =\"'\\[\\]{}\n#.0-9\\\\]{0,200}") {
        let _ = parse(&text, Path::new(PATH));
    }

    /// Random token soups never panic.
    #[test]
    fn token_soup_never_panics(pieces in prop::collection::vec(piece(), 0..60)) {
        let _ = parse(&file_with_body(&pieces.join(" ")), Path::new(PATH));
        let _ = parse(&file_with_body(&pieces.concat()), Path::new(PATH));
    }

    /// Random valid programs parse, and every expression prints back to the same tree.
    #[test]
    fn valid_programs_parse_and_print_back(body in body_src()) {
        let w = ok(&file_with_body(&body));
        let mut exprs = Vec::new();
        collect_exprs(&w.body, &mut exprs);
        for e in exprs {
            let printed = e.to_string();
            let again = ok(&file_with_body(&format!("_r = {printed}")));
            let StmtKind::Assign { value: e2, .. } = &again.body[0].kind else {
                panic!("{printed}")
            };
            prop_assert_eq!(&e2.to_string(), &printed);
            prop_assert_eq!(without_spans(e2), without_spans(&e));
        }
    }
}

fn collect_exprs(stmts: &[Stmt], out: &mut Vec<Expr>) {
    for s in stmts {
        match &s.kind {
            StmtKind::Assign { value, .. } => out.push(value.clone()),
            StmtKind::SetItem { target, value } => {
                out.push(target.clone());
                out.push(value.clone());
            }
            StmtKind::Expr(e) => out.push(e.clone()),
            StmtKind::Del(_) => {}
            StmtKind::Block { body, .. } => collect_exprs(body, out),
        }
    }
}

/// The tree of `e` with every span set to 1:1, to compare trees parsed from different text.
fn without_spans(e: &Expr) -> Expr {
    let z = |e: &Expr| Box::new(without_spans(e));
    let all = |v: &[Expr]| v.iter().map(without_spans).collect::<Vec<_>>();
    let kw = |v: &[(String, Expr)]| {
        v.iter()
            .map(|(k, e)| (k.clone(), without_spans(e)))
            .collect::<Vec<_>>()
    };
    let opt = |o: &Option<Expr>| o.as_ref().map(without_spans);
    let kind = match &e.kind {
        ExprKind::List(v) => ExprKind::List(all(v)),
        ExprKind::Neg(x) => ExprKind::Neg(z(x)),
        ExprKind::Binary { op, lhs, rhs } => ExprKind::Binary {
            op: *op,
            lhs: z(lhs),
            rhs: z(rhs),
        },
        ExprKind::Call { func, args, kwargs } => ExprKind::Call {
            func: func.clone(),
            args: all(args),
            kwargs: kw(kwargs),
        },
        ExprKind::Method {
            recv,
            name,
            args,
            kwargs,
        } => ExprKind::Method {
            recv: z(recv),
            name: name.clone(),
            args: all(args),
            kwargs: kw(kwargs),
        },
        ExprKind::Attr { recv, name } => ExprKind::Attr {
            recv: z(recv),
            name: name.clone(),
        },
        ExprKind::Index { recv, items } => ExprKind::Index {
            recv: z(recv),
            items: items
                .iter()
                .map(|i| match i {
                    IndexItem::Expr(e) => IndexItem::Expr(without_spans(e)),
                    IndexItem::Slice { start, stop, step } => IndexItem::Slice {
                        start: opt(start),
                        stop: opt(stop),
                        step: opt(step),
                    },
                    other => other.clone(),
                })
                .collect(),
        },
        other => other.clone(),
    };
    Expr::new(kind, Span::new(1, 1))
}
