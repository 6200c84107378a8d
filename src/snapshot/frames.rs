//! A PyTorch snapshot's frames as gpumem's tags: each frame list becomes a tag stack, once per
//! shared list, without the frames PyTorch's own viewer leaves out, and with the frames of
//! PyTorch's own files and Python's standard library noted (the profiler's `line` skips them).

use rustc_hash::FxHashMap;

use super::torch::Doc;
use crate::trace::{StackId, Tags};

/// Frames PyTorch's own viewer leaves out (the unwinder, the interpreter's loop).
fn boring(name: &str, file: &str) -> bool {
    const NAMES: [&str; 8] = [
        "unwind::unwind",
        "CapturedTraceback::gather",
        "gather_with_cpp",
        "_start",
        "__libc_start_main",
        "PyEval_",
        "PyObject_",
        "PyFunction_",
    ];
    const FILES: [&str; 10] = [
        "core/boxing",
        "/Register",
        "/Redispatch",
        "pythonrun.c",
        "Modules/main.c",
        "Objects/call.c",
        "Objects/methodobject.c",
        "pycore_ceval.h",
        "ceval.c",
        "cpython/abstract.h",
    ];
    NAMES.iter().any(|n| name.contains(n)) || FILES.iter().any(|f| file.contains(f))
}

/// Turns frame lists into tag stacks, once per shared list.
#[derive(Default)]
pub(super) struct Frames {
    pub(super) tags: Tags,
    cache: FxHashMap<usize, StackId>,
    /// Each frame's tag (`None`: left out), by where its name and file are stored in the
    /// document and its line: a long snapshot's frame lists and frames are each their own,
    /// but their strings are shared.
    frame_cache: FxHashMap<(usize, usize, usize, usize, i64), Option<crate::trace::TagId>>,
    /// Tags of frames in PyTorch's own files or Python's standard library.
    pub(super) library: rustc_hash::FxHashSet<crate::trace::TagId>,
}

/// A frame's file is PyTorch's own or Python's standard library (not the user's code, nor a
/// model library's such as transformers').
fn library_file(file: &str) -> bool {
    let f = file.replace('\\', "/").to_ascii_lowercase();
    if f.starts_with('<') {
        return true;
    }
    // an installed package: the one right after the last site-packages (a virtual environment
    // may itself live under a directory named torch)
    if let Some(at) = f.rfind("-packages/") {
        return f[at + "-packages/".len()..].starts_with("torch/");
    }
    // a PyTorch checkout, or .../lib/python3.12/x.py (C:/Python312/Lib/x.py on Windows)
    f.contains("/torch/")
        || f.starts_with("torch/")
        || f.contains("/lib/python")
        || f.split("/python3")
            .nth(1)
            .is_some_and(|r| r.contains("/lib/"))
}

impl Frames {
    /// One frame's tag (`file.py:line:name`, `[C++] name`, or a gpumem tag exported as a
    /// frame), noted as a library frame where it is one; `None` for a frame left out.
    fn frame_tag(&mut self, name: &str, file: &str, line: i64) -> Option<crate::trace::TagId> {
        if boring(name, file) {
            return None;
        }
        let tag = if file == "gpumem" {
            // a gpumem tag exported as a frame (`gpumem export`): back to the tag
            name.to_string()
        } else if file.ends_with(".py") {
            // the file's name, from a POSIX or a Windows path
            let base = file.rsplit(['/', '\\']).next().unwrap_or(file);
            format!("{base}:{line}:{name}")
        } else {
            format!("[C++] {name}")
        };
        let t = self.tags.intern(&tag);
        if file.ends_with(".py") && library_file(file) {
            self.library.insert(t);
        }
        Some(t)
    }

    pub(super) fn stack<'a, D: Doc<'a>>(&mut self, d: &D, frames: Option<D::V>) -> StackId {
        let Some(frames) = frames.filter(|f| d.is_list(*f)) else {
            return StackId::ROOT;
        };
        let id = d.identity(frames);
        if let Some(s) = id.and_then(|i| self.cache.get(&i)) {
            return *s;
        }
        let list: Vec<D::V> = d.list(frames).collect();
        let mut s = StackId::ROOT;
        // innermost first in the file; tags go outermost first
        for f in list.iter().rev() {
            let name = d.get(*f, "name").and_then(|v| d.text(v)).unwrap_or("?");
            let file = d.get(*f, "filename").and_then(|v| d.text(v)).unwrap_or("");
            let line = d.get(*f, "line").and_then(|v| d.int(v)).unwrap_or(0);
            // (the strings live as long as the document, which outlives this pass)
            let key = (
                name.as_ptr() as usize,
                name.len(),
                file.as_ptr() as usize,
                file.len(),
                line,
            );
            let tag = match self.frame_cache.get(&key) {
                Some(t) => *t,
                None => {
                    let t = self.frame_tag(name, file, line);
                    self.frame_cache.insert(key, t);
                    t
                }
            };
            if let Some(t) = tag {
                s = self.tags.child(s, t);
            }
        }
        if let Some(i) = id {
            self.cache.insert(i, s);
        }
        s
    }
}

#[cfg(test)]
mod library_tests {
    #[test]
    fn library_files() {
        for f in [
            "/opt/venv/lib/python3.12/site-packages/torch/nn/modules/module.py",
            "/usr/lib/python3.12/contextlib.py",
            "C:\\Python312\\Lib\\site-packages\\torch\\nn\\functional.py",
            "C:\\Python312\\Lib\\contextlib.py",
        ] {
            assert!(super::library_file(f), "{f}");
        }
        for f in [
            "/opt/venv/lib/python3.12/site-packages/transformers/models/llama/modeling_llama.py",
            "/opt/torch/.venv/lib/python3.12/site-packages/transformers/integrations/sdpa.py",
            "/home/me/torchrun_jobs/train.py",
            "train.py",
        ] {
            assert!(!super::library_file(f), "{f}");
        }
    }
}
