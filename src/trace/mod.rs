//! The record of what the allocator did: events with interned tag stacks, in a bounded ring.
//!
//! An [`Event`] is a few machine words; tags are interned strings and a tag *stack* is interned
//! too (a node of a trie: parent stack + tag), so an event carries one `u32` for its whole
//! context. Recording is cheap enough to leave on by default.

pub mod category;
pub mod event;
pub mod pickle;
pub mod pickle_write;
pub mod ring;
pub mod tags;

pub use category::Category;
pub use event::{Event, EventKind};
pub use ring::Ring;
pub use tags::{StackId, TagId, Tags};

/// Buckets of [`Recorder::push_static`]'s memo.
const STATIC_MEMO: usize = 256;

/// The allocator's recorder: the ring of events plus the tag stack current right now.
#[derive(Debug, Clone)]
pub struct Recorder {
    pub enabled: bool,
    pub ring: Ring<Event>,
    pub tags: Tags,
    current: StackId,
    /// Tags of `&'static str` names (op names, categories) by the string's address and
    /// length: a static string never moves, so its tag is found without hashing its text.
    statics: rustc_hash::FxHashMap<(usize, usize), TagId>,
    /// The last static tag seen per address bucket ([`Recorder::push_static`]).
    statics_memo: Box<[((usize, usize), TagId); STATIC_MEMO]>,
    /// `<op>_backward` tags by the op name's address and length ([`Recorder::push_backward`]).
    backward: rustc_hash::FxHashMap<(usize, usize), TagId>,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder::new(Ring::<Event>::DEFAULT_CAPACITY)
    }
}

impl Recorder {
    /// A recorder keeping at most `capacity` events (the oldest are overwritten).
    pub fn new(capacity: usize) -> Self {
        Recorder {
            enabled: true,
            ring: Ring::new(capacity),
            tags: Tags::default(),
            current: StackId::ROOT,
            statics: rustc_hash::FxHashMap::default(),
            statics_memo: Box::new([((0, 0), TagId(0)); STATIC_MEMO]),
            backward: rustc_hash::FxHashMap::default(),
        }
    }

    /// Enters a tag (a scope, an op, a category...): events from now on carry it.
    pub fn push_tag(&mut self, tag: &str) -> StackId {
        let t = self.tags.intern(tag);
        self.current = self.tags.child(self.current, t);
        self.current
    }

    /// [`Recorder::push_tag`] for a name that lives as long as the program (an op's name, a
    /// category's tag): the same stacks, found faster.
    #[inline]
    pub fn push_static(&mut self, tag: &'static str) -> StackId {
        let key = (tag.as_ptr() as usize, tag.len());
        // a direct-mapped memo by address before the map (a program has a few hundred
        // static tags, and each op and each allocation pushes one)
        let slot = &mut self.statics_memo[(key.0 >> 3) % STATIC_MEMO];
        let t = if slot.0 == key {
            slot.1
        } else {
            let t = match self.statics.get(&key) {
                Some(&t) => t,
                None => {
                    let t = self.tags.intern(tag);
                    self.statics.insert(key, t);
                    t
                }
            };
            self.statics_memo[(key.0 >> 3) % STATIC_MEMO] = (key, t);
            t
        };
        self.current = self.tags.child(self.current, t);
        self.current
    }

    /// Enters `<op>_backward` for an op's static name (a backward node's tag): the same
    /// stacks as [`Recorder::push_tag`] of the formatted name, without formatting it per node.
    pub fn push_backward(&mut self, op: &'static str) -> StackId {
        let key = (op.as_ptr() as usize, op.len());
        let t = match self.backward.get(&key) {
            Some(&t) => t,
            None => {
                let t = self.tags.intern(&format!("{op}_backward"));
                self.backward.insert(key, t);
                t
            }
        };
        self.push_tag_id(t)
    }

    /// Enters a tag already interned in [`Recorder::tags`].
    pub fn push_tag_id(&mut self, t: TagId) -> StackId {
        self.current = self.tags.child(self.current, t);
        self.current
    }

    /// Leaves the innermost tag. Popping at the root is a no-op.
    pub fn pop_tag(&mut self) {
        self.current = self.tags.parent(self.current);
    }

    /// The current tag stack.
    pub fn current(&self) -> StackId {
        self.current
    }

    /// Sets the current stack directly (to restore a saved context).
    pub fn set_current(&mut self, s: StackId) {
        self.current = s;
    }

    #[inline]
    pub fn record(&mut self, kind: EventKind, addr: u64, size: u64, stream: u32) {
        if self.enabled {
            self.ring
                .push(Event::new(kind, addr, size, self.current, stream));
        }
    }
}
