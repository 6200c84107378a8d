//! The gpumem snapshot: the allocator's state and its recorded history as one JSON document.
//!
//! Format, version 2 (`"format": "gpumem-snapshot"`, `"version": 2`). Readers must check both
//! and refuse versions they do not know; writers add fields only with a new version. Version 2
//! added `device.context_overhead` and the `retag` event; a version 1 snapshot is read with
//! the runner's default overhead.
//!
//! ```text
//! {
//!   "format": "gpumem-snapshot", "version": 2, "generator": "gpumem <semver>",
//!   "source": {"kind": "run", "workload": <path>, "name": <workload name>},
//!   "device": {"kind": "sim", "total_memory": <bytes>, "context_overhead": <bytes>},
//!   "allocator_settings": {
//!     "PYTORCH_CUDA_ALLOC_CONF": <string as given>, "max_split_size": <bytes or -1>,
//!     "max_non_split_rounding": <bytes>, "garbage_collection_threshold": <float>,
//!     "expandable_segments": <bool>, "large_segment_size": <bytes>,
//!     "roundup_power2_divisions": [16 ints], "memory_fraction": <float or null>
//!   },
//!   "memory_stats": {<PyTorch's 122 memory_stats() keys>: <int>},
//!   "stacks": [[<tag>, ...], ...],          // interned tag stacks, outermost tag first
//!   "segments": [{                          // sorted by address
//!     "address", "total_size", "allocated_size", "active_size", "requested_size": <int>,
//!     "stream": <int>, "segment_type": "small" | "large", "is_expandable": <bool>,
//!     "stack": <index into stacks, or null>,
//!     "blocks": [{"address", "size", "requested_size": <int>,
//!                 "state": "active_allocated" | "active_pending_free" | "inactive",
//!                 "stack": <index into stacks>}]
//!   }],
//!   "trace": {"dropped": <events lost to the ring's bound>,
//!             "events": [{"action": <PyTorch's action name, "empty_cache" or "retag">,
//!                         "addr": <int>, "size": <int>, "stream": <int>, "stack": <index>}]}
//! }
//! ```
//! Memory categories are tags of the form `category:<name>` (parameter, gradient,
//! optimizer_state, activation, temporary, input, workspace), the innermost tag of an allocation.

use std::collections::HashMap;

use serde_json::{json, Value};

use crate::alloc::{SegmentSource, SimAllocator};
use crate::trace::StackId;

pub const FORMAT: &str = "gpumem-snapshot";
pub const VERSION: u64 = 2;

/// Interns the stacks a snapshot mentions into a compact table.
struct StackTable<'a> {
    a: &'a SimAllocator,
    index: HashMap<StackId, usize>,
    stacks: Vec<Vec<String>>,
}

impl StackTable<'_> {
    fn id(&mut self, s: StackId) -> usize {
        if let Some(&i) = self.index.get(&s) {
            return i;
        }
        let tags = self
            .a
            .recorder()
            .tags
            .resolve(s)
            .into_iter()
            .map(String::from)
            .collect();
        self.stacks.push(tags);
        self.index.insert(s, self.stacks.len() - 1);
        self.stacks.len() - 1
    }
}

/// The snapshot of a run's allocator.
pub fn to_json(a: &SimAllocator, workload: &str, name: &str) -> Value {
    let mut st = StackTable {
        a,
        index: HashMap::new(),
        stacks: Vec::new(),
    };
    let segments: Vec<Value> = a
        .snapshot()
        .into_iter()
        .map(|s| {
            let stack = s.stack.map(|x| st.id(x));
            let blocks: Vec<Value> = s
                .blocks
                .iter()
                .map(|b| {
                    json!({
                        "address": b.address, "size": b.size, "requested_size": b.requested_size,
                        "state": b.state, "stack": st.id(b.stack),
                    })
                })
                .collect();
            json!({
                "address": s.address, "total_size": s.total_size, "allocated_size": s.allocated_size,
                "active_size": s.active_size, "requested_size": s.requested_size, "stream": s.stream,
                "segment_type": s.pool.name(), "is_expandable": s.is_expandable, "stack": stack,
                "blocks": blocks,
            })
        })
        .collect();
    let rec = a.recorder();
    let events: Vec<Value> = rec
        .ring
        .iter()
        .map(|e| {
            json!({
                "action": e.kind().action(), "addr": e.addr, "size": e.size(),
                "stream": e.stream, "stack": st.id(e.stack),
            })
        })
        .collect();
    let c = a.conf();
    json!({
        "format": FORMAT,
        "version": VERSION,
        "generator": format!("gpumem {}", env!("CARGO_PKG_VERSION")),
        "source": {"kind": "run", "workload": workload, "name": name},
        "device": {
            "kind": "sim",
            "total_memory": a.source().device_total(),
            "context_overhead": a.source().device_total() - a.source().capacity(),
        },
        "allocator_settings": {
            "PYTORCH_CUDA_ALLOC_CONF": c.raw,
            "max_split_size": c.max_split_size_stat(),
            "max_non_split_rounding": c.max_non_split_rounding,
            "garbage_collection_threshold": c.garbage_collection_threshold,
            "expandable_segments": c.expandable_segments,
            "large_segment_size": c.large_segment_size,
            "roundup_power2_divisions": c.roundup_power2_divisions,
            "memory_fraction": a.allowed_max().map(|m| m as f64 / a.source().device_total() as f64),
        },
        "memory_stats": a.stats().to_flat(),
        "stacks": st.stacks,
        "segments": segments,
        "trace": {"dropped": rec.ring.dropped(), "events": events},
    })
}
