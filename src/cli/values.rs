//! The value sets of the analysis flags (`--report`, `--by`, `--sort`, `--fail-on`) and
//! what each maps to in the analysis.

use clap::ValueEnum;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReportKind {
    Fragmentation,
    Leaks,
    All,
}

/// What the rows of the profiler's table are (`--by`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProfileBy {
    /// The op that allocated (a snapshot: its innermost aten op, else Python function).
    Op,
    /// The module (gpumem's scope; a snapshot: the chain of lines that called nn.Modules).
    Module,
    /// A snapshot's innermost Python line outside PyTorch and Python's standard library.
    Line,
    /// A snapshot's innermost record_function range open at the time (gpumem's runs: the
    /// phase).
    Annotation,
}

/// The profiler's table's order (`--sort`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProfileSort {
    Peak,
    Allocated,
    Freed,
    Net,
    Largest,
    Allocs,
}

impl ProfileBy {
    pub fn analysis(self) -> crate::analysis::profile::GroupBy {
        use crate::analysis::profile::GroupBy as G;
        match self {
            ProfileBy::Op => G::Op,
            ProfileBy::Module => G::Module,
            ProfileBy::Line => G::Line,
            ProfileBy::Annotation => G::Annotation,
        }
    }
}

impl ProfileSort {
    pub fn analysis(s: Option<Self>) -> crate::analysis::profile::SortBy {
        use crate::analysis::profile::SortBy as S;
        match s.unwrap_or(ProfileSort::Peak) {
            ProfileSort::Peak => S::Peak,
            ProfileSort::Allocated => S::Allocated,
            ProfileSort::Freed => S::Freed,
            ProfileSort::Net => S::Net,
            ProfileSort::Largest => S::Largest,
            ProfileSort::Allocs => S::Allocs,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FailOn {
    Oom,
    Leak,
}

/// `--preset`: the built-in workloads, each with what it is (shell completion offers them).
pub fn preset_names() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(
        crate::workload::builtin::PRESETS
            .iter()
            .map(|(name, what, _)| clap::builder::PossibleValue::new(*name).help(*what)),
    )
}

/// `--device`: the devices this build has (shell completion offers them).
pub fn device_names() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(
        crate::backend::DEVICES
            .iter()
            .filter(|(_, built)| *built)
            .map(|(name, _)| clap::builder::PossibleValue::new(*name)),
    )
}
