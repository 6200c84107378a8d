//! Interned tags and tag stacks.
//!
//! A tag is a string (`"encoder.layer3"`, `"matmul"`, `"activation"`) stored once. A stack is a
//! node in a trie: (parent stack, tag). Pushing a tag onto the same stack twice gives the same
//! id, so equal contexts compare as equal integers.

use rustc_hash::FxHashMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TagId(pub u32);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackId(pub u32);

impl StackId {
    /// The empty stack.
    pub const ROOT: StackId = StackId(0);
}

#[derive(Debug, Clone)]
pub struct Tags {
    names: Vec<String>,
    by_name: FxHashMap<String, TagId>,
    /// Stack nodes: (parent, tag); index 0 is the root (its entry is unused).
    nodes: Vec<(StackId, TagId)>,
    by_node: FxHashMap<(StackId, TagId), StackId>,
}

impl Default for Tags {
    fn default() -> Self {
        Tags {
            names: Vec::new(),
            by_name: FxHashMap::default(),
            nodes: vec![(StackId::ROOT, TagId(u32::MAX))],
            by_node: FxHashMap::default(),
        }
    }
}

impl Tags {
    pub fn intern(&mut self, name: &str) -> TagId {
        if let Some(&t) = self.by_name.get(name) {
            return t;
        }
        let t = TagId(self.names.len() as u32);
        self.names.push(name.to_string());
        self.by_name.insert(name.to_string(), t);
        t
    }

    pub fn name(&self, t: TagId) -> &str {
        &self.names[t.0 as usize]
    }

    pub fn child(&mut self, parent: StackId, tag: TagId) -> StackId {
        if let Some(&s) = self.by_node.get(&(parent, tag)) {
            return s;
        }
        let s = StackId(self.nodes.len() as u32);
        self.nodes.push((parent, tag));
        self.by_node.insert((parent, tag), s);
        s
    }

    pub fn parent(&self, s: StackId) -> StackId {
        if s == StackId::ROOT {
            StackId::ROOT
        } else {
            self.nodes[s.0 as usize].0
        }
    }

    /// The stack's tags, outermost first.
    pub fn resolve(&self, mut s: StackId) -> Vec<&str> {
        let mut out = Vec::new();
        while s != StackId::ROOT {
            let (p, t) = self.nodes[s.0 as usize];
            out.push(self.name(t));
            s = p;
        }
        out.reverse();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stacks_intern_and_resolve() {
        let mut t = Tags::default();
        let a = t.intern("encoder");
        let b = t.intern("matmul");
        let s1 = t.child(StackId::ROOT, a);
        let s2 = t.child(s1, b);
        assert_eq!(t.child(s1, b), s2);
        assert_eq!(t.resolve(s2), vec!["encoder", "matmul"]);
        assert_eq!(t.parent(s2), s1);
        assert_eq!(t.parent(StackId::ROOT), StackId::ROOT);
        assert_eq!(t.intern("encoder"), a);
    }
}
