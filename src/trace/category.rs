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
    /// A generation's (or a forward's) `past_key_values`: keys and values kept per layer.
    KvCache,
}

impl Category {
    pub const ALL: [Category; 8] = [
        Category::Parameter,
        Category::Gradient,
        Category::OptimizerState,
        Category::Activation,
        Category::Temporary,
        Category::Input,
        Category::Workspace,
        Category::KvCache,
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
            Category::KvCache => "kv_cache",
        }
    }

    /// The tag that marks an allocation's category in the event trace: `category:<name>`.
    pub fn tag(self) -> &'static str {
        match self {
            Category::Parameter => "category:parameter",
            Category::Gradient => "category:gradient",
            Category::OptimizerState => "category:optimizer_state",
            Category::Activation => "category:activation",
            Category::Temporary => "category:temporary",
            Category::Input => "category:input",
            Category::Workspace => "category:workspace",
            Category::KvCache => "category:kv_cache",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Category;

    #[test]
    fn each_tag_is_its_name_under_the_category_prefix() {
        for c in Category::ALL {
            assert_eq!(c.tag(), format!("category:{}", c.name()));
        }
    }
}
