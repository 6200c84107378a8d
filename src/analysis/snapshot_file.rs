//! Reads a gpumem snapshot (the JSON `gpumem run --snapshot` writes; format in
//! `report::snapshot`) back into a trace: its events, its tag stacks, and the settings a
//! replay needs.

use serde_json::Value;

use super::state::ReplaySetup;
use crate::alloc::{AllocConf, DEFAULT_CONTEXT_OVERHEAD};
use crate::trace::{Event, EventKind, StackId, Tags};

pub struct LoadedSnapshot {
    pub name: String,
    pub events: Vec<Event>,
    pub tags: Tags,
    pub setup: ReplaySetup,
    /// Events the recording lost to its bound.
    pub dropped: u64,
}

/// Parses a snapshot's text. Errors say which key is wrong.
pub fn parse(text: &str) -> Result<LoadedSnapshot, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    if v["format"] != "gpumem-snapshot" {
        return Err(
            "not a gpumem snapshot (no \"format\": \"gpumem-snapshot\"); write one with \
             `gpumem run WORKLOAD --snapshot FILE`"
                .into(),
        );
    }
    let version = v["version"].as_u64().unwrap_or(0);
    if !(1..=2).contains(&version) {
        return Err(format!(
            "gpumem snapshot version {} is not one this gpumem reads (1 or 2); use a newer gpumem",
            v["version"]
        ));
    }
    let total = v["device"]["total_memory"]
        .as_u64()
        .ok_or("key 'device.total_memory' is missing or not a byte count")?;
    let overhead = v["device"]["context_overhead"]
        .as_u64()
        .unwrap_or(DEFAULT_CONTEXT_OVERHEAD.min(total / 8));
    let conf_text = v["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"]
        .as_str()
        .unwrap_or("");
    let conf = AllocConf::parse(conf_text).map_err(|e| {
        format!("key 'allocator_settings.PYTORCH_CUDA_ALLOC_CONF' ('{conf_text}'): {e}")
    })?;
    let mut tags = Tags::default();
    let stacks: Vec<StackId> = v["stacks"]
        .as_array()
        .ok_or("key 'stacks' is missing or not a list")?
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let list = s
                .as_array()
                .ok_or_else(|| format!("stacks[{i}] is not a list of tags"))?;
            let mut id = StackId::ROOT;
            for t in list {
                let t = t
                    .as_str()
                    .ok_or_else(|| format!("stacks[{i}] holds a tag that is not a string"))?;
                let tag = tags.intern(t);
                id = tags.child(id, tag);
            }
            Ok(id)
        })
        .collect::<Result<_, String>>()?;
    let raw = v["trace"]["events"]
        .as_array()
        .ok_or("key 'trace.events' is missing or not a list")?;
    let mut events = Vec::with_capacity(raw.len());
    for (i, e) in raw.iter().enumerate() {
        let action = e["action"].as_str().unwrap_or("");
        let kind = EventKind::from_action(action)
            .ok_or_else(|| format!("trace.events[{i}]: unknown action '{action}'"))?;
        let num = |k: &str| {
            e[k].as_u64()
                .ok_or_else(|| format!("trace.events[{i}]: '{k}' is missing or not an integer"))
        };
        let size = num("size")?;
        if size >= 1 << 60 {
            return Err(format!("trace.events[{i}]: size {size} is out of range"));
        }
        let stack = num("stack")? as usize;
        let stack = *stacks
            .get(stack)
            .ok_or_else(|| format!("trace.events[{i}]: stack {stack} is not in 'stacks'"))?;
        let stream = u32::try_from(num("stream")?)
            .map_err(|_| format!("trace.events[{i}]: stream out of range"))?;
        events.push(Event::new(kind, num("addr")?, size, stack, stream));
    }
    Ok(LoadedSnapshot {
        name: v["source"]["name"]
            .as_str()
            .unwrap_or("snapshot")
            .to_string(),
        events,
        tags,
        setup: ReplaySetup {
            conf,
            total,
            overhead,
        },
        dropped: v["trace"]["dropped"].as_u64().unwrap_or(0),
    })
}
