//! The runner's bounds: loops, sizes and recursion that no workload may exceed.

use super::*;

/// Scripts are bounded in statements; models gpumem writes the script of are not (their
/// counts are bounded by name), so a long generation runs to the end.
#[test]
fn only_scripts_are_bounded_in_statements() {
    let p = Path::new("w.toml");
    let script =
        crate::workload::parse("[workload]\nname = \"s\"\nbody = \"x = randn(4)\"\n", p).unwrap();
    assert_eq!(statement_bound(&script), MAX_STATEMENTS);
    let preset = crate::workload::parse(
            "[workload]\nname = \"m\"\n[model]\nkind = \"mlp\"\nd_in = 8\nhidden = 8\nlayers = 1\nd_out = 2\n[train]\nbatch = 2\n",
            p,
        )
        .unwrap();
    assert_eq!(statement_bound(&preset), u64::MAX);
}

/// A scope's tag goes under whatever stack it is entered from: the runner remembers the
/// last (parent, child) pair per scope, and must not reuse it under another parent.
#[test]
fn a_scope_entered_from_two_stacks_tags_each() {
    let text = "[workload]\nname = \"s\"\niterations = 1\nbody = '''\n\
            phase \"forward\" {\n  scope \"m\" {\n    x = randn(4)\n  }\n}\n\
            phase \"backward\" {\n  scope \"m\" {\n    y = randn(4)\n  }\n}\n\
            scope \"outer\" {\n  scope \"m\" {\n    z = randn(4)\n  }\n}\n'''\n";
    let w = crate::workload::parse(text, Path::new("w.toml")).unwrap();
    let r = run(&w, Path::new("w.toml"), &RunOptions::default()).unwrap();
    let rec = r.allocator.recorder();
    let stacks: Vec<String> = rec
        .ring
        .iter()
        .filter(|e| e.kind() == crate::trace::EventKind::Alloc)
        .map(|e| rec.tags.resolve(e.stack).join("/"))
        .collect();
    let under = |parent: &str| {
        stacks
            .iter()
            .filter(|s| s.ends_with(&format!("{parent}m/randn/category:input")))
            .count()
    };
    assert_eq!(under("phase:forward/"), 1, "{stacks:?}");
    assert_eq!(under("phase:backward/"), 1, "{stacks:?}");
    assert_eq!(under("phase:forward/outer/"), 1, "{stacks:?}");
    assert_eq!(stacks.len(), 3, "{stacks:?}");
}
