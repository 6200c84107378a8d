//! The house rules that the compiler does not check: which module may use which.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The sibling modules each file of `dir` refers to (`super::x`, `crate::<root>::x`), doc
/// comments and line comments left out.
fn uses(dir: &Path, root: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut names = BTreeSet::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "rs") {
            names.insert(p.file_stem().unwrap().to_string_lossy().to_string());
        } else if p.is_dir() {
            names.insert(p.file_name().unwrap().to_string_lossy().to_string());
        }
    }
    names.remove("mod");
    let mut out = BTreeMap::new();
    for n in &names {
        let file = dir.join(format!("{n}.rs"));
        let file = if file.exists() {
            file
        } else {
            dir.join(n).join("mod.rs")
        };
        let text = std::fs::read_to_string(&file).unwrap();
        let mut used = BTreeSet::new();
        for line in text.lines() {
            let code = line.split("//").next().unwrap_or("");
            for m in &names {
                if m != n
                    && (code.contains(&format!("super::{m}::"))
                        || code.contains(&format!("super::{m};"))
                        || code.contains(&format!("super::{m}::{{"))
                        || code.contains(&format!("crate::{root}::{m}::")))
                {
                    used.insert(m.clone());
                }
            }
        }
        out.insert(n.clone(), used);
    }
    out
}

/// A cycle in the graph, if there is one.
fn cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == n) {
            let mut c = path[i..].to_vec();
            c.push(n.to_string());
            return Some(c);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_string());
        for m in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, g, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for n in g.keys() {
        if let Some(c) = visit(n, g, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

#[test]
fn the_engine_modules_form_no_import_cycle() {
    let g = uses(Path::new("src/engine"), "engine");
    assert!(g.contains_key("tensor") && g.contains_key("graph"), "{g:?}");
    if let Some(c) = cycle(&g) {
        panic!("src/engine has an import cycle: {}", c.join(" -> "));
    }
    // (the checker itself sees a cycle when there is one)
    let mut bad = g.clone();
    bad.get_mut("graph").unwrap().insert("tensor".into());
    assert!(cycle(&bad).is_some());
}

#[test]
fn the_workload_module_takes_nothing_from_the_engine() {
    let mut files = Vec::new();
    let mut dirs = vec![std::path::PathBuf::from("src/workload")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else {
                files.push(p);
            }
        }
    }
    assert!(
        files.iter().any(|p| p.ends_with("hf/llama.rs")),
        "{files:?}"
    );
    for p in files {
        let text = std::fs::read_to_string(&p).unwrap();
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            assert!(
                !code.contains("crate::engine") && !code.contains("crate::runner"),
                "{}:{}: {line}",
                p.display(),
                i + 1
            );
        }
    }
}
