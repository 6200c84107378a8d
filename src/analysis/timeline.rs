//! Memory over time by category: the series behind `gpumem plot` and `gpumem run --plot`.
//!
//! The x axis is the allocator's event count (every alloc, free and segment event is one step),
//! which is what a trace has; wall-clock time is not recorded. Samples are taken after events
//! that change allocated or reserved memory, then thinned to at most `max_samples` points by
//! keeping, in each bucket, the sample with the most memory allocated, so the peak survives.

/// One point of the series: memory right after event `event`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Sample {
    /// Index of the event in the trace (0 = first recorded event).
    pub event: u64,
    /// Allocated bytes (block sizes, as `memory_stats()["allocated_bytes.all.current"]`) per
    /// category, in the order of [`Timeline::categories`].
    pub by_category: Vec<u64>,
    /// Reserved bytes (segments), as `reserved_bytes.all.current`.
    pub reserved: u64,
}

impl Sample {
    pub fn allocated(&self) -> u64 {
        self.by_category.iter().sum()
    }
}

/// Where an iteration starts.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct IterationMark {
    /// "iter 0", "iter 1", ...
    pub label: String,
    pub event: u64,
}

/// The highest allocated memory of the series.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PeakMark {
    pub event: u64,
    pub allocated: u64,
}

/// An allocation that failed with out-of-memory.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct OomMark {
    pub event: u64,
    /// Bytes asked for.
    pub requested: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Timeline {
    /// What the series shows, e.g. the workload's name.
    pub title: String,
    /// Category names in stacking order, bottom first (parameter, gradient, optimizer_state,
    /// activation, temporary, input, workspace, and "other" for allocations without one).
    pub categories: Vec<String>,
    /// In event order; empty when the trace holds no allocation.
    pub samples: Vec<Sample>,
    pub iterations: Vec<IterationMark>,
    pub peak: Option<PeakMark>,
    pub ooms: Vec<OomMark>,
    /// The device's memory, when known (drawn as a limit line).
    pub capacity: Option<u64>,
}
