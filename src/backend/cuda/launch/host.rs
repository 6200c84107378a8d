//! The host twin: a launch without a GPU kernel of its own, run by the cpu device's kernel on a
//! host copy of the bytes its buffers span.
//!
//! Every buffer's span (inputs, outputs, saved tensors) is copied from the GPU into host
//! memory at the same addresses (overlapping spans as one copy, so a view and its base see the
//! same bytes), the cpu device runs the launch on those copies ([`CpuDevice::mirror`]), and the
//! copies that hold an output go back. The numbers are the cpu device's exactly; only the time
//! differs.

use super::mem;
use crate::backend::cpu::CpuDevice;
use crate::backend::{Device, Launch};

/// Device memory as the host twin reads and writes it.
pub(crate) trait Bytes {
    fn get(&self, addr: u64, out: &mut [u8]) -> Result<(), String>;
    fn put(&mut self, addr: u64, bytes: &[u8]) -> Result<(), String>;
}

/// The GPU's memory, through the driver's copies.
struct OnGpu;

impl Bytes for OnGpu {
    fn get(&self, addr: u64, out: &mut [u8]) -> Result<(), String> {
        mem::get(addr, out)
    }
    fn put(&mut self, addr: u64, bytes: &[u8]) -> Result<(), String> {
        mem::put(addr, bytes)
    }
}

/// Runs `l` on the host; `limit`: host bytes the kernel's working copies may take.
pub(crate) fn run(limit: u64, l: &Launch) -> Result<(), String> {
    run_on(&mut OnGpu, limit, l)
}

/// [`run`] on the device memory `m`.
pub(crate) fn run_on(m: &mut dyn Bytes, limit: u64, l: &Launch) -> Result<(), String> {
    let mut outs: Vec<(u64, u64)> = l.outputs.iter().map(mem::span).collect();
    // and the inputs the kernel writes in place (batch norm's running statistics)
    if l.pass == crate::backend::Pass::Forward {
        let w = l.op.written_inputs();
        outs.extend(l.inputs.get(w).into_iter().flatten().map(mem::span));
    }
    let all: Vec<(u64, u64)> = l
        .inputs
        .iter()
        .chain(l.outputs)
        .chain(l.saved.iter().map(|(_, b)| b))
        .map(mem::span)
        .collect();
    let mut chunks = Vec::new();
    for (a, n) in mem::merge(all) {
        let mut v = vec![0u8; n as usize];
        m.get(a, &mut v)?;
        chunks.push((a, v));
    }
    let mut cpu = CpuDevice::mirror(chunks, limit);
    cpu.launch(l)?;
    for (a, v) in cpu.into_chunks() {
        let end = a + v.len() as u64;
        if outs.iter().any(|&(o, n)| n > 0 && o < end && a < o + n) {
            m.put(a, &v)?;
        }
    }
    Ok(())
}

/// A device for tests without a GPU: the cpu device's memory, with every launch run through
/// the host twin's copies (so a run on it computes exactly what `--device cpu` does only if
/// the twin copies what each kernel reads and writes back what it writes).
#[cfg(test)]
pub(crate) mod twin {
    use super::*;
    use crate::backend::sim::forward_segments;
    use crate::backend::Buffer;

    #[derive(Debug)]
    pub struct TwinDevice {
        cpu: CpuDevice,
    }

    impl TwinDevice {
        pub fn new(src: crate::alloc::SimSource) -> Self {
            TwinDevice {
                cpu: CpuDevice::new(src),
            }
        }

        pub fn into_source(self) -> crate::alloc::SimSource {
            self.cpu.into_source()
        }
    }

    forward_segments!(TwinDevice, cpu);

    struct CpuBytes<'a>(&'a mut CpuDevice);

    impl Bytes for CpuBytes<'_> {
        fn get(&self, addr: u64, out: &mut [u8]) -> Result<(), String> {
            self.0.get_bytes(addr, out)
        }
        fn put(&mut self, addr: u64, bytes: &[u8]) -> Result<(), String> {
            self.0.put_bytes(addr, bytes)
        }
    }

    impl Device for TwinDevice {
        fn name(&self) -> &'static str {
            "cpu-twin"
        }
        fn computes(&self) -> bool {
            true
        }
        fn launch(&mut self, l: &Launch) -> Result<(), String> {
            run_on(&mut CpuBytes(&mut self.cpu), CpuDevice::host_limit(), l)
        }
        fn read(&self, b: &Buffer) -> Result<Option<Vec<f64>>, String> {
            self.cpu.read(b)
        }
        fn write(&mut self, b: &Buffer, values: &[f64]) -> Result<(), String> {
            self.cpu.write(b, values)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::runner::{run_on, RunOptions, Target};

    fn run(w: &str, device: &str) -> crate::analysis::record::RunOutcome {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(w);
        let workload = crate::workload::load(&path).expect("a fixture workload");
        let target = Target {
            device: Some(device.into()),
            capture_grads: true,
        };
        run_on(
            &workload,
            &path,
            &RunOptions::default(),
            &target,
            &mut |_, _| {},
        )
        .expect("the run")
    }

    /// Every launch through the host twin's copies computes what the cpu device computes, to
    /// the bit: losses, every parameter's gradient, the allocator's statistics. Workloads with
    /// views (attention's heads, transposed weights), checkpoint recompute, gradient
    /// accumulation and both optimizer families.
    #[test]
    fn the_host_twin_computes_what_the_cpu_device_does() {
        for w in [
            "fixtures/cpu/gpt_tiny_sdpa_adamw.toml",
            "fixtures/cpu/gpt_tiny_math_adamw.toml",
            "fixtures/cpu/gpt_tiny_sdpa_adamw_ckpt.toml",
            "fixtures/cpu/mlp_wide_adam_accum2.toml",
            "fixtures/cpu/gpt_tiny_sdpa_sgd_momentum.toml",
            "fixtures/hf/workloads/gpt2_t_sdpa_adamw_fp32.toml",
        ] {
            let (cpu, twin) = (run(w, "cpu"), run(w, "cpu-twin"));
            assert_eq!(twin.device, "cpu-twin");
            let losses = |r: &crate::analysis::record::RunOutcome| -> Vec<Option<f64>> {
                r.iterations.iter().map(|i| i.loss).collect()
            };
            assert!(losses(&cpu).iter().all(|l| l.is_some()), "{w}: no losses");
            assert_eq!(losses(&cpu), losses(&twin), "{w}: losses");
            assert!(!cpu.grads.is_empty(), "{w}: no gradients");
            assert_eq!(cpu.grads.len(), twin.grads.len(), "{w}");
            for (a, b) in cpu.grads.iter().zip(&twin.grads) {
                assert_eq!((&a.0, &a.1), (&b.0, &b.1), "{w}");
                assert_eq!(a.2, b.2, "{w}: the gradient of {}", a.0);
            }
            assert_eq!(
                cpu.stats.to_flat(),
                twin.stats.to_flat(),
                "{w}: memory_stats"
            );
        }
    }
}
