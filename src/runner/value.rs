//! The values a workload script computes with.

use crate::engine::{DType, TensorId};

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A handle on a tensor (dropped when the value is).
    Tensor(TensorId),
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    None,
    List(Vec<Value>),
    DType(DType),
    /// An optimizer, by index in the runner.
    Optimizer(usize),
}

impl Value {
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Int(i) => Some(*i as f64),
            Value::Float(f) => Some(*f),
            Value::Bool(b) => Some(*b as u8 as f64),
            _ => None,
        }
    }

    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            Value::Bool(b) => Some(*b as i64),
            _ => None,
        }
    }

    /// What the value is, for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Tensor(_) => "a tensor",
            Value::Int(_) => "an integer",
            Value::Float(_) => "a number",
            Value::Bool(_) => "a boolean",
            Value::Str(_) => "a string",
            Value::None => "none",
            Value::List(_) => "a list",
            Value::DType(_) => "a dtype",
            Value::Optimizer(_) => "an optimizer",
        }
    }
}
