//! The tensor store's tests: views, copies, storage sharing and what each allocates.

use super::*;
use crate::engine::tensor::testing::*;

#[test]
fn views_share_storage_and_copies_allocate() {
    let mut d = dev();
    let x = d.empty(&[1024, 1024], DType::F32, Category::Input).unwrap();
    assert_eq!(allocated(&d), 4 << 20);
    let row = {
        let l = d.info(x).layout.slice(0, Some(0), Some(512), 1).unwrap();
        d.view_with(x, l)
    };
    assert_eq!(allocated(&d), 4 << 20, "a slice shares storage");
    let t = {
        let l = d.info(x).layout.t().unwrap();
        d.view_with(x, l)
    };
    let c = d.contiguous(t, Category::Temporary).unwrap();
    assert_eq!(
        allocated(&d),
        8 << 20,
        "a transposed tensor's contiguous() copies"
    );
    let same = d.contiguous(row, Category::Temporary).unwrap();
    assert_eq!(same, row, "a contiguous tensor's contiguous() is itself");
    d.release(same);
    // the storage stays while any view of it lives
    d.release(x);
    assert_eq!(allocated(&d), 8 << 20);
    d.release(row);
    d.release(t);
    assert_eq!(allocated(&d), 4 << 20);
    d.release(c);
    assert_eq!(allocated(&d), 0);
    assert!(
        d.alloc.stats().reserved_bytes.all().current > 0,
        "freed memory stays reserved"
    );
    assert_eq!(d.live_tensors(), 0);
}

#[test]
fn allocations_carry_their_category() {
    let mut d = dev();
    d.alloc.recorder_mut().push_tag("encoder");
    let _w = d
        .empty(&[16, 16], DType::BF16, Category::Parameter)
        .unwrap();
    let r = d.alloc.recorder();
    let ev = r
        .ring
        .iter()
        .find(|e| e.kind() == crate::trace::EventKind::Alloc)
        .unwrap();
    assert_eq!(
        r.tags.resolve(ev.stack),
        vec!["encoder", "category:parameter"]
    );
    assert_eq!(ev.size(), 16 * 16 * 2);
}

#[test]
fn reshape_copies_only_when_pytorch_does() {
    let mut d = dev();
    let a = d.empty(&[2, 3], DType::I64, Category::Input).unwrap();
    let v = d.reshape(a, &[3, 2], Category::Temporary).unwrap();
    assert_eq!(allocated(&d), 512, "a view");
    let t = {
        let l = d.info(a).layout.t().unwrap();
        d.view_with(a, l)
    };
    let _flat = d.reshape(t, &[-1], Category::Temporary).unwrap();
    assert_eq!(allocated(&d), 1024, "a copy");
    d.release(v);
}

#[test]
fn out_of_memory_is_an_error_not_a_panic() {
    let mut d = dev();
    let e = d
        .empty(&[1 << 20, 1 << 20], DType::F32, Category::Input)
        .unwrap_err();
    assert!(matches!(e, EngineError::OutOfMemory(_)), "{e}");
    assert_eq!(d.alloc.stats().num_ooms, 1);
}
