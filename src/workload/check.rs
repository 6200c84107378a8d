//! The `[check]` table of a workload, and the `check` object of a baseline entry: the
//! tolerances and budgets `gpumem check` holds a run to. One vocabulary for both files:
//!
//! ```toml
//! [check]
//! tolerance = "2%"                 # every metric may grow by 2% over the baseline
//! peak_reserved_tolerance = "1%"   # this metric by 1% (a metric's own key beats `tolerance`)
//! max_peak_reserved = "20GiB"      # a budget: never more than this, whatever the baseline
//! max_peak_allocated = 1073741824  # sizes are strings with binary units or integer bytes
//! ```
//!
//! Metrics: `peak_allocated`, `peak_reserved`, `leak_per_iteration`, and `CATEGORY_at_peak`
//! for each memory category (`activation_at_peak`, ...: what the category held at the moment
//! allocated memory peaked). Tolerances are percentages (`"0.5%"`, or `0`), kept as integer
//! parts per million so that limits are exact to the byte.

use std::collections::BTreeMap;

use crate::trace::Category;
use crate::units::{parse_percent, parse_size};

/// The metrics that are not per category, in the order reports list them.
pub const FIXED_METRICS: &[&str] = &["peak_allocated", "peak_reserved", "leak_per_iteration"];

/// The category of allocations whose tags name none (snapshots from PyTorch, mostly).
pub const OTHER_CATEGORY: &str = "other";

/// The metric that holds what `category` had at the peak.
pub fn category_metric(category: &str) -> String {
    format!("{category}_at_peak")
}

/// Whether `name` is a metric a tolerance or budget may name.
pub fn is_metric(name: &str) -> bool {
    FIXED_METRICS.contains(&name)
        || name
            .strip_suffix("_at_peak")
            .is_some_and(|c| c == OTHER_CATEGORY || Category::ALL.iter().any(|k| k.name() == c))
}

/// Every metric name, for messages.
pub fn metric_names() -> Vec<String> {
    let mut v: Vec<String> = FIXED_METRICS.iter().map(|s| s.to_string()).collect();
    v.extend(Category::ALL.iter().map(|c| category_metric(c.name())));
    v.push(category_metric(OTHER_CATEGORY));
    v
}

/// A value as a file gave it (TOML or JSON), for [`CheckTable::set`].
#[derive(Debug, Clone, Copy)]
pub enum SettingValue<'a> {
    Str(&'a str),
    Int(i64),
    /// Anything else, by its type's name ("a boolean").
    Other(&'static str),
}

/// Tolerances (parts per million) and budgets (bytes) from one source.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckTable {
    /// `tolerance`: for every metric this source names no tolerance for.
    pub tolerance: Option<u64>,
    /// `METRIC_tolerance`.
    pub tolerances: BTreeMap<String, u64>,
    /// `max_METRIC`.
    pub budgets: BTreeMap<String, u64>,
}

/// What the keys of a `[check]` table may be, for messages.
pub fn known_keys() -> String {
    format!(
        "tolerance, METRIC_tolerance and max_METRIC, where METRIC is one of {}",
        metric_names().join(", ")
    )
}

impl CheckTable {
    pub fn is_empty(&self) -> bool {
        self.tolerance.is_none() && self.tolerances.is_empty() && self.budgets.is_empty()
    }

    /// Reads one key. The message on failure names the key and says what it should be.
    pub fn set(&mut self, key: &str, value: SettingValue<'_>) -> Result<(), String> {
        let percent = |v: SettingValue<'_>| match v {
            SettingValue::Str(s) => parse_percent(s).map_err(|m| format!("'{key}': {m}")),
            SettingValue::Int(0) => Ok(0),
            SettingValue::Int(i) => Err(format!(
                "'{key}' must be a percentage string such as \"2%\" (or 0), found {i}"
            )),
            SettingValue::Other(t) => Err(format!(
                "'{key}' must be a percentage string such as \"2%\" (or 0), found {t}"
            )),
        };
        let size = |v: SettingValue<'_>| match v {
            SettingValue::Str(s) => parse_size(s).map_err(|m| format!("'{key}': {m}")),
            SettingValue::Int(i) => u64::try_from(i)
                .map_err(|_| format!("'{key}' must be a size of at least 0 bytes, found {i}")),
            SettingValue::Other(t) => Err(format!(
                "'{key}' must be a size: a string such as \"20GiB\" or an integer number of \
                 bytes, found {t}"
            )),
        };
        if key == "tolerance" {
            self.tolerance = Some(percent(value)?);
        } else if let Some(m) = key.strip_suffix("_tolerance").filter(|m| is_metric(m)) {
            self.tolerances.insert(m.to_string(), percent(value)?);
        } else if let Some(m) = key.strip_prefix("max_").filter(|m| is_metric(m)) {
            self.budgets.insert(m.to_string(), size(value)?);
        } else {
            return Err(format!("unknown key '{key}' (known: {})", known_keys()));
        }
        Ok(())
    }

    /// This source's tolerance for `metric`: its own key, else `tolerance`.
    pub fn tolerance_for(&self, metric: &str) -> Option<u64> {
        self.tolerances.get(metric).copied().or(self.tolerance)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_values() {
        let mut t = CheckTable::default();
        t.set("tolerance", SettingValue::Str("2%")).unwrap();
        t.set("peak_reserved_tolerance", SettingValue::Str("1%"))
            .unwrap();
        t.set("max_peak_reserved", SettingValue::Str("20GiB"))
            .unwrap();
        t.set("max_activation_at_peak", SettingValue::Int(1024))
            .unwrap();
        assert_eq!(t.tolerance_for("peak_reserved"), Some(10_000));
        assert_eq!(t.tolerance_for("peak_allocated"), Some(20_000));
        assert_eq!(t.budgets["peak_reserved"], 20 << 30);
        assert_eq!(t.budgets["activation_at_peak"], 1024);
        for (k, v) in [
            ("max_peak_reserve", SettingValue::Str("1GiB")),
            ("max_peak_reserved", SettingValue::Str("20 parsecs")),
            ("max_peak_reserved", SettingValue::Int(-1)),
            ("tolerance", SettingValue::Str("2")),
            ("tolerance", SettingValue::Other("a boolean")),
            ("oom_tolerance", SettingValue::Str("1%")),
        ] {
            let e = t.set(k, v).unwrap_err();
            assert!(e.contains(k), "{e}");
        }
    }
}
