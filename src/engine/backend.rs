//! Backends: where an op's data lives and its kernel runs.
//!
//! The engine decides what is allocated, saved and freed; a backend only moves data. Every op
//! the engine runs is handed to [`Backend::launch`] with its inputs and outputs as device
//! buffers (the allocator's addresses plus layouts), so a backend with data (`cpu`: host
//! buffers keyed by address; `cuda`: kernels from `kernels/` on the caching allocator's memory)
//! plugs in without changing the engine. The simulated device computes nothing.

use std::fmt::Debug;

use super::dtype::DType;
use super::layout::Layout;

/// One tensor argument of a kernel: where its storage is and how it is laid out.
#[derive(Debug, Clone, Copy)]
pub struct Buffer<'a> {
    /// Device address of the storage (0 for an empty one).
    pub addr: u64,
    pub layout: &'a Layout,
    pub dtype: DType,
}

pub trait Backend: Debug + Send + Sync {
    /// `sim`, `cpu` or `cuda`.
    fn name(&self) -> &'static str;

    /// Runs `op` reading `inputs` and writing `outputs` (already allocated).
    fn launch(&self, op: &str, inputs: &[Buffer], outputs: &[Buffer]) -> Result<(), String>;
}

/// The simulated device: shapes, sizes and addresses only.
#[derive(Debug, Clone, Copy, Default)]
pub struct SimBackend;

impl Backend for SimBackend {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn launch(&self, _op: &str, _inputs: &[Buffer], _outputs: &[Buffer]) -> Result<(), String> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::alloc::{AllocConf, SimAllocator, SimSource};
    use crate::engine::ops::Unary;
    use crate::engine::{Category, Tensors};
    use crate::units::GIB;

    /// A backend that notes each kernel: what a data-carrying backend would be asked to run.
    /// (op, inputs, outputs, output addresses)
    type Call = (String, usize, usize, Vec<u64>);

    #[derive(Debug, Default)]
    struct Log(Mutex<Vec<Call>>);

    impl Backend for Log {
        fn name(&self) -> &'static str {
            "log"
        }
        fn launch(&self, op: &str, inputs: &[Buffer], outputs: &[Buffer]) -> Result<(), String> {
            let addrs = outputs.iter().map(|b| b.addr).collect();
            self.0
                .lock()
                .unwrap()
                .push((op.to_string(), inputs.len(), outputs.len(), addrs));
            Ok(())
        }
    }

    #[test]
    fn every_op_reaches_the_backend_with_its_buffers() {
        let log = Arc::new(Log::default());
        let mut d = Tensors::new(SimAllocator::new(
            AllocConf::default(),
            SimSource::new(24 * GIB, 0),
        ));
        d.backend = log.clone();
        let w = d
            .factory(&[64, 64], DType::F32, true, Category::Parameter)
            .unwrap();
        let x = d
            .factory(&[8, 64], DType::F32, false, Category::Input)
            .unwrap();
        let h = d.matmul(x, w).unwrap();
        let y = d.unary(Unary::Relu, h).unwrap();
        let v = d.view_op("view", y, d.info(y).layout.view(&[-1]).unwrap());
        let calls = log.0.lock().unwrap().clone();
        let names: Vec<&str> = calls.iter().map(|c| c.0.as_str()).collect();
        assert_eq!(
            names,
            vec!["fill", "fill", "matmul", "relu"],
            "views run no kernel"
        );
        assert_eq!((calls[2].1, calls[2].2), (2, 1));
        assert_eq!(
            calls[3].3,
            vec![d.storage_of(y).0],
            "the output buffer is the allocator's block"
        );
        d.release(v);
    }
}
