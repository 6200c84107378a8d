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
    /// Each node's first [`KIDS`] children as (tag, child), empty slots with the tag
    /// `u32::MAX`: most nodes have few (an op's stack has a child per memory category it
    /// allocates in), and a scan of one slot array is cheaper than a hash lookup.
    kids: Vec<[(TagId, StackId); KIDS]>,
    /// The children beyond a node's first [`KIDS`].
    by_node: FxHashMap<(StackId, TagId), StackId>,
}

/// Children kept inline per stack node.
const KIDS: usize = 3;
const NO_KIDS: [(TagId, StackId); KIDS] = [(TagId(u32::MAX), StackId::ROOT); KIDS];

impl Default for Tags {
    fn default() -> Self {
        Tags {
            names: Vec::new(),
            by_name: FxHashMap::default(),
            nodes: vec![(StackId::ROOT, TagId(u32::MAX))],
            kids: vec![NO_KIDS],
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

    /// The outermost tags of the stacks made so far (the root's children).
    pub fn outermost(&self) -> impl Iterator<Item = &str> + '_ {
        self.nodes
            .iter()
            .skip(1)
            .filter(|(parent, _)| *parent == StackId::ROOT)
            .map(|(_, t)| self.name(*t))
    }

    #[inline]
    pub fn child(&mut self, parent: StackId, tag: TagId) -> StackId {
        let kids = &self.kids[parent.0 as usize];
        for &(t, s) in kids {
            if t == tag {
                return s;
            }
        }
        if kids[KIDS - 1].0 .0 != u32::MAX {
            if let Some(&s) = self.by_node.get(&(parent, tag)) {
                return s;
            }
        }
        self.new_child(parent, tag)
    }

    #[cold]
    fn new_child(&mut self, parent: StackId, tag: TagId) -> StackId {
        let s = StackId(self.nodes.len() as u32);
        self.nodes.push((parent, tag));
        self.kids.push(NO_KIDS);
        match self.kids[parent.0 as usize]
            .iter_mut()
            .find(|(t, _)| t.0 == u32::MAX)
        {
            Some(slot) => *slot = (tag, s),
            None => {
                self.by_node.insert((parent, tag), s);
            }
        }
        s
    }

    pub fn parent(&self, s: StackId) -> StackId {
        if s == StackId::ROOT {
            StackId::ROOT
        } else {
            self.nodes[s.0 as usize].0
        }
    }

    /// The stack's tags with their ids, outermost first.
    pub fn resolve_ids(&self, mut s: StackId) -> Vec<(TagId, &str)> {
        let mut out = Vec::new();
        while s != StackId::ROOT {
            let (p, t) = self.nodes[s.0 as usize];
            out.push((t, self.name(t)));
            s = p;
        }
        out.reverse();
        out
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

    /// A node's first children are kept inline, the rest in the map: both give the same
    /// stack for the same (parent, tag), and distinct ones for distinct tags.
    #[test]
    fn many_children_of_one_stack() {
        let mut t = Tags::default();
        let p = t.intern("layer");
        let parent = t.child(StackId::ROOT, p);
        let tags: Vec<TagId> = (0..10).map(|i| t.intern(&format!("op{i}"))).collect();
        let first: Vec<StackId> = tags.iter().map(|&g| t.child(parent, g)).collect();
        for (i, &g) in tags.iter().enumerate().rev() {
            assert_eq!(t.child(parent, g), first[i]);
            assert_eq!(t.resolve(first[i]), vec!["layer", &format!("op{i}")]);
        }
        let mut distinct = first.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 10);
        // the same tags under another parent are other stacks
        let other = t.child(StackId::ROOT, tags[0]);
        assert_ne!(t.child(other, tags[1]), first[1]);
    }
}
