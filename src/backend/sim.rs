//! The simulated device: the address model of [`SimSource`] (capacity, the CUDA context's
//! share, the driver's address placement) and no data. Kernels compute nothing. Also the
//! segment forwarding that a data device wraps around the same address model.

use super::{Buffer, Device, Launch};
use crate::alloc::SimSource;

/// Forwards the segment calls of a device to the [`SimSource`] address model it holds.
macro_rules! forward_segments {
    ($t:ty, $field:ident $(, $map:expr, $unmap:expr)?) => {
        impl $crate::alloc::SegmentSource for $t {
            fn device_total(&self) -> u64 {
                self.$field.device_total()
            }
            fn device_free(&self) -> u64 {
                self.$field.device_free()
            }
            fn process_used(&self) -> Option<u64> {
                self.$field.process_used()
            }
            fn malloc(&mut self, size: u64) -> Option<u64> {
                let a = self.$field.malloc(size)?;
                $( if !($map)(self, a, size) {
                    self.$field.free(a, size);
                    return None;
                } )?
                Some(a)
            }
            fn free(&mut self, addr: u64, size: u64) {
                $( ($unmap)(self, addr); )?
                self.$field.free(addr, size)
            }
            fn reserve(&mut self, size: u64) -> Option<u64> {
                self.$field.reserve(size)
            }
            fn release(&mut self, base: u64, size: u64) {
                self.$field.release(base, size)
            }
            fn map(&mut self, addr: u64, size: u64) -> bool {
                if !self.$field.map(addr, size) {
                    return false;
                }
                $( if !($map)(self, addr, size) {
                    self.$field.unmap(addr, size);
                    return false;
                } )?
                true
            }
            fn unmap(&mut self, addr: u64, size: u64) {
                $( ($unmap)(self, addr); )?
                self.$field.unmap(addr, size)
            }
        }
    };
}
pub(crate) use forward_segments;

/// The simulated device: [`SimSource`] is one as it is.
impl Device for SimSource {
    fn name(&self) -> &'static str {
        "sim"
    }
    fn computes(&self) -> bool {
        false
    }
    fn launch(&mut self, _l: &Launch) -> Result<(), String> {
        Ok(())
    }
    fn read(&self, _b: &Buffer) -> Result<Option<Vec<f64>>, String> {
        Ok(None)
    }
    fn write(&mut self, _b: &Buffer, _values: &[f64]) -> Result<(), String> {
        Ok(())
    }
}
