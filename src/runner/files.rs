//! Real weights and batches for data devices: a PyTorch `state_dict` saved as safetensors
//! (`[model] weights`) and a batch file (`[data] file`), read with the `safetensors` crate.
//!
//! Parameters are matched by the names `model.state_dict()` gives them; shapes and dtypes
//! must be the model's, and every tensor of the file must be used (a tied head stored once,
//! as Hugging Face files do, or twice, as `save_file(model.state_dict())` refuses to, is both
//! fine). A batch tensor is either one micro-batch (used every iteration) or a stack of them
//! along a new first dimension, taken in order, one per micro-batch.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};

use crate::engine::layout::Dims;
use crate::engine::DType;

/// The largest file read (a safeguard against a device or a pipe given as a file).
const MAX_FILE: u64 = 64 << 30;

/// One tensor of a file: shape, dtype, values.
struct Entry {
    shape: Vec<usize>,
    dtype: DType,
    values: Vec<f64>,
}

/// The tensors of one safetensors file, decoded.
pub struct TensorFile {
    path: PathBuf,
    entries: BTreeMap<String, Entry>,
    used: BTreeSet<String>,
    /// Per batch name, the micro-batches taken so far.
    taken: BTreeMap<String, usize>,
}

fn dtype_of(d: Dtype) -> Option<DType> {
    Some(match d {
        Dtype::F32 => DType::F32,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::F64 => DType::F64,
        Dtype::I64 => DType::I64,
        Dtype::I32 => DType::I32,
        Dtype::I8 => DType::I8,
        Dtype::U8 => DType::U8,
        Dtype::BOOL => DType::Bool,
        _ => return None,
    })
}

fn decode(dtype: DType, bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks_exact(dtype.size() as usize)
        .map(|b| crate::backend::cpu::decode(dtype, b))
        .collect()
}

impl TensorFile {
    /// Reads `path` (relative paths are taken from the workload's folder by the caller).
    pub fn open(path: &Path) -> Result<TensorFile, String> {
        let shown = path.display();
        let meta = std::fs::metadata(path).map_err(|e| format!("{shown}: {e}"))?;
        if !meta.is_file() {
            return Err(format!("{shown}: not a regular file"));
        }
        if meta.len() > MAX_FILE {
            return Err(format!("{shown}: larger than {} GiB", MAX_FILE >> 30));
        }
        let bytes = crate::input::read(path, crate::input::Kind::Data)
            .map_err(|e| format!("{shown}: {e}"))?;
        let st = SafeTensors::deserialize(&bytes)
            .map_err(|e| format!("{shown}: not a safetensors file: {e}"))?;
        let mut entries = BTreeMap::new();
        for (name, view) in st.tensors() {
            let dtype = dtype_of(view.dtype()).ok_or_else(|| {
                format!(
                    "{shown}: tensor '{name}' has dtype {:?}, which gpumem does not have",
                    view.dtype()
                )
            })?;
            entries.insert(
                name.clone(),
                Entry {
                    shape: view.shape().to_vec(),
                    dtype,
                    values: decode(dtype, view.data()),
                },
            );
        }
        Ok(TensorFile {
            path: path.to_path_buf(),
            entries,
            used: BTreeSet::new(),
            taken: BTreeMap::new(),
        })
    }

    /// The values of parameter `name`, which must have `shape` and `dtype`.
    pub fn tensor(
        &mut self,
        name: &str,
        shape: &[usize],
        dtype: DType,
    ) -> Result<Vec<f64>, String> {
        let shown = self.path.display();
        let e = self.entries.get(name).ok_or_else(|| {
            format!(
                "weights file {shown} has no tensor '{name}' (the model's state_dict names it; the file has {})",
                self.entries.keys().take(6).cloned().collect::<Vec<_>>().join(", ")
            )
        })?;
        if e.shape != shape {
            return Err(format!(
                "weights file {shown}: tensor '{name}' has shape {} but the model's parameter is {}",
                Dims(&e.shape),
                Dims(shape)
            ));
        }
        if e.dtype != dtype {
            return Err(format!(
                "weights file {shown}: tensor '{name}' is {} but the model's parameter is {}",
                e.dtype, dtype
            ));
        }
        self.used.insert(name.to_string());
        Ok(e.values.clone())
    }

    /// The next micro-batch of `name`, of `shape`.
    pub fn batch(&mut self, name: &str, shape: &[usize]) -> Result<Vec<f64>, String> {
        let shown = self.path.display();
        let e = self
            .entries
            .get(name)
            .ok_or_else(|| format!("batch file {shown} has no tensor '{name}'"))?;
        self.used.insert(name.to_string());
        let k = self.taken.entry(name.to_string()).or_insert(0);
        if e.shape == shape {
            *k += 1;
            return Ok(e.values.clone());
        }
        if e.shape.len() == shape.len() + 1 && e.shape[1..] == *shape {
            let n = e.shape[0];
            if *k >= n {
                return Err(format!(
                    "batch file {shown}: '{name}' holds {n} micro-batches and the run needs more; \
                     give --iterations {n} or more batches"
                ));
            }
            let per: usize = shape.iter().product();
            let v = e.values[*k * per..(*k + 1) * per].to_vec();
            *k += 1;
            return Ok(v);
        }
        Err(format!(
            "batch file {shown}: '{name}' has shape {} but a micro-batch is {} (or a stack [N, ...] of them)",
            Dims(&e.shape),
            Dims(shape)
        ))
    }

    /// Tensors of the file nothing asked for (`tied`: names that may be left, such as a tied
    /// head stored beside its embedding).
    pub fn unused(&self, tied: &[&str]) -> Vec<String> {
        self.entries
            .keys()
            .filter(|k| !self.used.contains(*k) && !tied.contains(&k.as_str()))
            .cloned()
            .collect()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}
