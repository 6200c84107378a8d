//! Memory categories: what an allocation is for. The engine knows each tensor's role and tags
//! its allocations with it (`category:<name>`, the innermost tag); the trace, the analyses, the
//! reports and `[check]` budgets read it back by name.

/// What a tensor's memory is for. The engine knows each tensor's role, so this is exact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    Parameter,
    Gradient,
    OptimizerState,
    /// Saved for backward.
    Activation,
    Temporary,
    Input,
    Workspace,
}

impl Category {
    pub const ALL: [Category; 7] = [
        Category::Parameter,
        Category::Gradient,
        Category::OptimizerState,
        Category::Activation,
        Category::Temporary,
        Category::Input,
        Category::Workspace,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Category::Parameter => "parameter",
            Category::Gradient => "gradient",
            Category::OptimizerState => "optimizer_state",
            Category::Activation => "activation",
            Category::Temporary => "temporary",
            Category::Input => "input",
            Category::Workspace => "workspace",
        }
    }

    /// The tag that marks an allocation's category in the event trace.
    pub fn tag(self) -> String {
        format!("category:{}", self.name())
    }
}
