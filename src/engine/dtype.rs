//! Element types, with their real sizes: what a tensor's bytes are.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    F64,
    I64,
    I32,
    I8,
    U8,
    Bool,
}

impl DType {
    pub const ALL: [DType; 9] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F64,
        DType::I64,
        DType::I32,
        DType::I8,
        DType::U8,
        DType::Bool,
    ];

    /// Bytes per element (`torch.tensor([], dtype=d).element_size()`).
    pub fn size(self) -> u64 {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I8 | DType::U8 | DType::Bool => 1,
        }
    }

    pub fn is_floating(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16 | DType::F64)
    }

    /// PyTorch's name (`float32`, `bfloat16`, `int64`, `bool`...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F64 => "float64",
            DType::I64 => "int64",
            DType::I32 => "int32",
            DType::I8 => "int8",
            DType::U8 => "uint8",
            DType::Bool => "bool",
        }
    }

    /// Accepts PyTorch's names and aliases, with or without `torch.` (`float32`, `float`,
    /// `f32`, `torch.half`, `bf16`, `long`, `int`...).
    pub fn parse(s: &str) -> Option<DType> {
        let s = s.strip_prefix("torch.").unwrap_or(s);
        Some(match s {
            "float32" | "float" | "f32" | "fp32" => DType::F32,
            "float16" | "half" | "f16" | "fp16" => DType::F16,
            "bfloat16" | "bf16" => DType::BF16,
            "float64" | "double" | "f64" | "fp64" => DType::F64,
            "int64" | "long" | "i64" => DType::I64,
            "int32" | "int" | "i32" => DType::I32,
            "int8" | "i8" => DType::I8,
            "uint8" | "u8" => DType::U8,
            "bool" => DType::Bool,
            _ => return None,
        })
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "torch.{}", self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::parse(d.name()), Some(d));
            assert_eq!(DType::parse(&d.to_string()), Some(d));
        }
        assert_eq!(DType::F32.size(), 4);
        assert_eq!(DType::BF16.size(), 2);
        assert_eq!(DType::I64.size(), 8);
        assert_eq!(DType::Bool.size(), 1);
        assert_eq!(DType::parse("half"), Some(DType::F16));
        assert_eq!(DType::parse("complex64"), None);
    }
}
