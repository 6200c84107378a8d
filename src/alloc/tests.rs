//! The worked examples of the allocator spec (section 9, each reproduced on PyTorch 2.11 on an
//! H200) and property tests of the allocator's invariants.

use proptest::prelude::*;

use super::*;
use crate::trace::EventKind;
use crate::units::{GIB, MIB};

const H200: u64 = 150_109_880_320;

fn alloc(conf: &str) -> SimAllocator {
    SimAllocator::new(
        AllocConf::parse(conf).unwrap(),
        SimSource::new(H200, DEFAULT_CONTEXT_OVERHEAD),
    )
}

fn cur(a: &SimAllocator) -> (i64, i64, i64, i64) {
    let s = a.stats();
    (
        s.allocated_bytes.all().current,
        s.reserved_bytes.all().current,
        s.segment.all().current,
        s.inactive_split_bytes.all().current,
    )
}

#[test]
fn single_requests_table() {
    // (request, rounded, pool, segment, inactive_split_bytes while live)
    let rows: &[(u64, u64, PoolKind, u64, i64)] = &[
        (1, 512, PoolKind::Small, 2 * MIB, 2_096_640),
        (511, 512, PoolKind::Small, 2 * MIB, 2_096_640),
        (512, 512, PoolKind::Small, 2 * MIB, 2_096_640),
        (513, 1024, PoolKind::Small, 2 * MIB, 2_096_128),
        (1000, 1024, PoolKind::Small, 2 * MIB, 2_096_128),
        (1_048_575, MIB, PoolKind::Small, 2 * MIB, MIB as i64),
        (1_048_576, MIB, PoolKind::Small, 2 * MIB, MIB as i64),
        (1_048_577, 1_049_088, PoolKind::Large, 20 * MIB, 19_922_432),
        (3 * MIB, 3 * MIB, PoolKind::Large, 20 * MIB, 17 * MIB as i64),
        (10_485_759, 10 * MIB, PoolKind::Large, 10 * MIB, 0),
        (10_485_760, 10 * MIB, PoolKind::Large, 10 * MIB, 0),
        (10_485_761, 10_486_272, PoolKind::Large, 12 * MIB, 2_096_640),
        (21 * MIB, 22 * MIB, PoolKind::Large, 22 * MIB, 0), // rem 1 MiB: not split, 22 MiB allocated
        (25 * MIB + 3, 26 * MIB, PoolKind::Large, 26 * MIB, 0),
    ];
    let mut a = alloc("");
    for &(n, allocated, pool, seg, isb) in rows {
        let syncs = a.stats().num_sync_all_streams;
        let p = a.malloc(n, 0).unwrap();
        let s = a.stats();
        assert_eq!(
            s.allocated_bytes.all().current as u64,
            allocated,
            "request {n}"
        );
        assert_eq!(
            s.allocated_bytes.pool(pool).current as u64,
            allocated,
            "pool of {n}"
        );
        assert_eq!(s.reserved_bytes.all().current as u64, seg, "segment of {n}");
        assert_eq!(
            s.inactive_split_bytes.all().current,
            isb,
            "inactive_split_bytes of {n}"
        );
        assert_eq!(s.requested_bytes.all().current as u64, n);
        a.free(p).unwrap();
        assert_eq!(a.stats().inactive_split_bytes.all().current, 0);
        assert_eq!(
            a.stats().reserved_bytes.all().current as u64,
            seg,
            "reserved stays until empty_cache"
        );
        a.empty_cache();
        assert_eq!(cur(&a), (0, 0, 0, 0));
        assert_eq!(a.stats().num_sync_all_streams, syncs + 1);
    }
}

#[test]
fn large_pool_sequence() {
    let mut a = alloc("");
    let pa = a.malloc(3 * MIB, 0).unwrap();
    let pb = a.malloc(3 * MIB, 0).unwrap();
    assert_eq!(
        cur(&a),
        (6 * MIB as i64, 20 * MIB as i64, 1, 14 * MIB as i64)
    );
    assert_eq!(a.stats().inactive_split.all().current, 1);
    a.free(pa).unwrap();
    assert_eq!(a.stats().inactive_split.all().current, 2);
    assert_eq!(
        a.stats().inactive_split_bytes.all().current,
        17 * MIB as i64
    );
    let pc = a.malloc(3 * MIB / 2, 0).unwrap();
    assert_eq!(pc, pa, "best fit is a's 3 MiB hole");
    assert_eq!(a.stats().inactive_split.all().current, 2);
    assert_eq!(
        a.stats().inactive_split_bytes.all().current,
        31 * MIB as i64 / 2
    );
    let pd = a.malloc(12 * MIB, 0).unwrap();
    assert_eq!(
        a.stats().inactive_split_bytes.all().current,
        7 * MIB as i64 / 2
    );
    let pe = a.malloc(13 * MIB, 0).unwrap();
    assert_eq!(a.stats().segment.all().current, 2);
    let pf = a.malloc(1000, 0).unwrap();
    let pg = a.malloc(300_000, 0).unwrap();
    let s = a.stats();
    assert_eq!(s.allocated_bytes.all().current, 32_282_624);
    assert_eq!(s.reserved_bytes.all().current, 37_748_736);
    assert_eq!(s.segment.all().current, 3);
    assert_eq!(s.inactive_split.all().current, 3);
    assert_eq!(s.inactive_split_bytes.all().current, 5_466_112);
    assert_eq!(s.requested_bytes.all().current, 31_233_992);
    for p in [pb, pc, pd, pe, pf, pg] {
        a.free(p).unwrap();
    }
    let before = a.recorder().ring.len();
    a.empty_cache();
    let freed: Vec<u64> = a
        .recorder()
        .ring
        .iter()
        .skip(before)
        .filter(|e| e.kind() == EventKind::SegmentFree)
        .map(|e| e.size())
        .collect();
    assert_eq!(
        freed,
        vec![14 * MIB, 20 * MIB, 2 * MIB],
        "large pool by size, then small"
    );
}

#[test]
fn oom_without_fraction_flushes_the_cache_then_raises() {
    let mut a = alloc("");
    let p = a.malloc(100 * MIB, 0).unwrap();
    a.free(p).unwrap();
    let e = a.malloc(1 << 40, 0).unwrap_err();
    let s = a.stats();
    assert_eq!(
        (s.num_alloc_retries, s.num_ooms, s.num_sync_all_streams),
        (1, 1, 1)
    );
    assert_eq!(s.reserved_bytes.all().current, 0);
    assert_eq!(
        e.to_string(),
        "CUDA out of memory. Tried to allocate 1024.00 GiB. GPU 0 has a total capacity of 139.80 GiB of which \
         139.29 GiB is free. Including non-PyTorch memory, this process has 518.00 MiB memory in use. Of the \
         allocated memory 0 bytes is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. If \
         reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to \
         avoid fragmentation.  See documentation for Memory Management  \
         (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"
    );
    let last = a.recorder().ring.iter().last().copied().unwrap();
    assert_eq!((last.kind(), last.size()), (EventKind::Oom, 1 << 40));
}

#[test]
fn oom_with_fraction() {
    let mut a = alloc("");
    a.set_memory_fraction(0.02);
    let p1 = a.malloc(GIB, 0).unwrap();
    let _p2 = a.malloc(GIB, 0).unwrap();
    let e = a.malloc(GIB, 0).unwrap_err();
    let m = e.to_string();
    assert!(
        m.contains("2.80 GiB allowed; Of the allocated memory 2.00 GiB is allocated by PyTorch"),
        "{m}"
    );
    a.free(p1).unwrap();
    let _p3 = a.malloc(900 * MIB, 0).unwrap();
    assert_eq!(
        a.stats().inactive_split_bytes.all().current,
        124 * MIB as i64
    );
    let e = a.malloc(2000 * MIB, 0).unwrap_err();
    let m = e.to_string();
    assert!(
        m.starts_with("CUDA out of memory. Tried to allocate 1.95 GiB."),
        "{m}"
    );
    assert!(
        m.contains("and 124.00 MiB is reserved by PyTorch but unallocated"),
        "{m}"
    );
    assert_eq!((a.stats().num_alloc_retries, a.stats().num_ooms), (2, 2));
}

#[test]
fn max_split_size_rules() {
    for (conf, reuse_150_for_120_and_104) in [
        ("max_split_size_mb:100", false),
        ("max_split_size_mb:100,max_non_split_rounding_mb:60", true),
    ] {
        let mut a = alloc(conf);
        let p = a.malloc(150 * MIB, 0).unwrap();
        assert_eq!(a.stats().oversize_segments.current, 1);
        a.free(p).unwrap();
        let p50 = a.malloc(50 * MIB, 0).unwrap();
        assert_eq!(
            a.stats().segment.all().current,
            2,
            "a normal request may not take the oversize block"
        );
        a.free(p50).unwrap();
        let p135 = a.malloc(135 * MIB, 0).unwrap();
        assert_eq!(p135, p);
        assert_eq!(a.stats().allocated_bytes.all().current, 150 * MIB as i64);
        assert_eq!(a.stats().oversize_allocations.current, 1);
        a.free(p135).unwrap();
        let p120 = a.malloc(120 * MIB, 0).unwrap();
        assert_eq!(p120 == p, reuse_150_for_120_and_104, "{conf}");
        a.free(p120).unwrap();
        let p104 = a.malloc(104 * MIB, 0).unwrap();
        if reuse_150_for_120_and_104 {
            assert_eq!(p104, p);
        } else {
            assert_eq!(p104, p120, "best fit: the 120 MiB block, used whole");
            assert_eq!(a.stats().allocated_bytes.all().current, 120 * MIB as i64);
        }
        assert_eq!(a.stats().max_split_size, 100 * MIB as i64);
    }
}

#[test]
fn roundup_power2_divisions_4() {
    let a = alloc("roundup_power2_divisions:4");
    for (n, r) in [
        (1000, 1024),
        (2048, 2048),
        (2049, 2560),
        (3000, 3072),
        (5000, 5120),
        (1_331_200, 1_572_864),
        (3 * MIB + 5, 7 * MIB / 2),
        (100 * MIB + 7, 112 * MIB),
        (300 * MIB + 7, 320 * MIB),
    ] {
        assert_eq!(a.round_size(n), r, "{n}");
    }
    assert_eq!(a.allocation_size(112 * MIB), 112 * MIB);
}

#[test]
fn expandable_segments_map_pages() {
    let mut a = alloc("expandable_segments:True");
    let p1 = a.malloc(1000, 0).unwrap();
    assert_eq!(a.stats().reserved_bytes.all().current, 2 * MIB as i64);
    let p2 = a.malloc(5 * MIB, 0).unwrap();
    assert_eq!(a.stats().reserved_bytes.all().current, 22 * MIB as i64);
    let p3 = a.malloc(30 * MIB, 0).unwrap();
    assert_eq!(p3, p2 + 5 * MIB, "continues right after the 5 MiB block");
    assert_eq!(a.stats().reserved_bytes.all().current, 42 * MIB as i64);
    let p4 = a.malloc(100 * MIB, 0).unwrap();
    let s = a.stats();
    assert_eq!(s.reserved_bytes.all().current, 142 * MIB as i64);
    assert_eq!(s.segment.all().current, 0);
    assert_eq!(s.inactive_split.all().current, 0);
    let snap = a.snapshot();
    let sizes: Vec<(u64, bool)> = snap
        .iter()
        .map(|s| (s.total_size, s.is_expandable))
        .collect();
    assert_eq!(sizes.len(), 2);
    assert!(
        sizes.contains(&(2 * MIB, true)) && sizes.contains(&(140 * MIB, true)),
        "{sizes:?}"
    );
    for p in [p1, p2, p3, p4] {
        a.free(p).unwrap();
    }
    let frees = a.stats().num_device_free;
    let before = a.recorder().ring.len();
    a.empty_cache();
    let unmaps: Vec<u64> = a
        .recorder()
        .ring
        .iter()
        .skip(before)
        .filter(|e| e.kind() == EventKind::SegmentUnmap)
        .map(|e| e.size())
        .collect();
    assert_eq!(unmaps, vec![146_800_640, 2_097_152]);
    assert_eq!(a.stats().num_device_free, frees + 2);
    assert_eq!(a.stats().reserved_bytes.all().current, 0);
}

#[test]
fn garbage_collection_frees_old_blocks_without_a_retry() {
    let mut a = alloc("garbage_collection_threshold:0.5");
    a.set_memory_fraction(0.05);
    let ps: Vec<u64> = (0..20).map(|_| a.malloc(200 * MIB, 0).unwrap()).collect();
    for p in ps {
        a.free(p).unwrap();
    }
    let _ = a.malloc(300 * MIB, 0).unwrap();
    let s = a.stats();
    assert_eq!(s.reserved_bytes.all().current, 300 * MIB as i64);
    assert_eq!(s.num_device_free, 20);
    assert_eq!((s.num_alloc_retries, s.num_sync_all_streams), (0, 0));
}

#[test]
fn frees_wait_for_other_streams() {
    let mut a = alloc("");
    let p = a.malloc(4096, 0).unwrap();
    a.record_stream(p, 7).unwrap();
    a.free(p).unwrap();
    assert_eq!(a.stats().allocation.all().current, 0);
    assert_eq!(
        a.stats().active.all().current,
        1,
        "pending until the other stream is done"
    );
    assert_eq!(
        a.snapshot()[0].blocks[0].state,
        BlockState::ActivePendingFree
    );
    let q = a.malloc(8192, 1).unwrap();
    assert_eq!(
        a.stats().active.all().current,
        1,
        "the pending free completed at the next malloc"
    );
    assert_eq!(
        a.stats().segment.all().current,
        2,
        "streams never share cached blocks"
    );
    a.free(q).unwrap();
}

#[test]
fn bad_pointers_are_refused_not_absorbed() {
    let mut a = alloc("");
    let p = a.malloc(1 << 20, 0).unwrap();
    assert_eq!(a.free(p + 512), Err(PointerError::NotAllocated(p + 512)));
    a.free(p).unwrap();
    let before = a.stats().clone();
    assert_eq!(a.free(p), Err(PointerError::NotAllocated(p)));
    assert_eq!(
        a.free(0xdead_0000),
        Err(PointerError::NotAllocated(0xdead_0000))
    );
    assert_eq!(a.stats(), &before);
    assert_eq!(a.malloc(0, 0), Ok(0));
    assert_eq!(a.free(0), Ok(()));
}

#[test]
fn events_carry_the_tag_stack() {
    let mut a = alloc("");
    a.recorder_mut().push_tag("encoder.layer3");
    a.recorder_mut().push_tag("matmul");
    let p = a.malloc(1 << 20, 0).unwrap();
    a.recorder_mut().pop_tag();
    a.recorder_mut().pop_tag();
    a.free(p).unwrap();
    let r = a.recorder();
    let evs: Vec<_> = r.ring.iter().copied().collect();
    let alloc_ev = evs.iter().find(|e| e.kind() == EventKind::Alloc).unwrap();
    assert_eq!(
        r.tags.resolve(alloc_ev.stack),
        vec!["encoder.layer3", "matmul"]
    );
    let free_ev = evs
        .iter()
        .find(|e| e.kind() == EventKind::FreeRequested)
        .unwrap();
    assert!(r.tags.resolve(free_ev.stack).is_empty());
    // as in PyTorch, a segment whose first block was split off keeps no segment stack...
    assert_eq!(a.snapshot()[0].stack, None);
    // ...while an unsplit segment keeps the stack it was allocated under
    a.recorder_mut().push_tag("lm_head");
    let q = a.malloc(21 * MIB, 0).unwrap();
    a.recorder_mut().pop_tag();
    let snap = a.snapshot();
    let seg = snap.iter().find(|s| s.address == q).unwrap();
    assert_eq!(
        seg.stack.map(|s| a.recorder().tags.resolve(s)),
        Some(vec!["lm_head"])
    );
}

/// Recounts every stat that block state determines and checks the blocks tile each segment.
fn check_invariants(a: &SimAllocator) -> Result<(), TestCaseError> {
    let snap = a.snapshot();
    let s = a.stats();
    let mut alloc_bytes = [0i64; 2];
    let mut allocs = [0i64; 2];
    let mut requested = [0i64; 2];
    let mut reserved = [0i64; 2];
    let mut segments = [0i64; 2];
    let mut isplit = [0i64; 2];
    let mut isplit_bytes = [0i64; 2];
    for seg in &snap {
        let p = seg.pool as usize;
        let mut at = seg.address;
        for b in &seg.blocks {
            prop_assert_eq!(
                b.address,
                at,
                "blocks tile the segment without gap or overlap"
            );
            prop_assert!(b.size > 0 && b.size % 512 == 0);
            at += b.size;
            if b.state == BlockState::ActiveAllocated {
                alloc_bytes[p] += b.size as i64;
                allocs[p] += 1;
                requested[p] += b.requested_size as i64;
            } else if !seg.is_expandable && seg.blocks.len() > 1 {
                isplit[p] += 1;
                isplit_bytes[p] += b.size as i64;
            }
        }
        prop_assert_eq!(at, seg.address + seg.total_size);
        reserved[p] += seg.total_size as i64;
        if !seg.is_expandable {
            segments[p] += 1;
        }
    }
    for pool in [PoolKind::Small, PoolKind::Large] {
        let p = pool as usize;
        prop_assert_eq!(s.allocated_bytes.pool(pool).current, alloc_bytes[p]);
        prop_assert_eq!(s.allocation.pool(pool).current, allocs[p]);
        prop_assert_eq!(s.active.pool(pool).current, allocs[p]);
        prop_assert_eq!(s.requested_bytes.pool(pool).current, requested[p]);
        prop_assert_eq!(s.reserved_bytes.pool(pool).current, reserved[p]);
        prop_assert_eq!(s.segment.pool(pool).current, segments[p]);
        prop_assert_eq!(s.inactive_split.pool(pool).current, isplit[p]);
        prop_assert_eq!(s.inactive_split_bytes.pool(pool).current, isplit_bytes[p]);
    }
    prop_assert_eq!(s.reserved_bytes.all().current, reserved[0] + reserved[1]);
    prop_assert_eq!(a.reserved() as i64, reserved[0] + reserved[1]);
    prop_assert_eq!(a.source().used() as i64, reserved[0] + reserved[1]);
    prop_assert_eq!(
        s.allocated_bytes.all().current,
        alloc_bytes[0] + alloc_bytes[1]
    );
    Ok(())
}

#[derive(Debug, Clone)]
enum Op {
    Alloc(u64),
    Free(usize),
    EmptyCache,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u32..28).prop_flat_map(|b| (1u64 << b)..(2u64 << b)).prop_map(Op::Alloc),
        5 => any::<usize>().prop_map(Op::Free),
        1 => Just(Op::EmptyCache),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn invariants_hold_after_every_op(
        conf in prop_oneof![
            Just(""), Just("max_split_size_mb:40"), Just("expandable_segments:True"),
            Just("roundup_power2_divisions:4"), Just("max_split_size_mb:20,max_non_split_rounding_mb:40"),
        ],
        fraction in prop_oneof![Just(0.0), Just(0.004)],
        ops in prop::collection::vec(op(), 1..200),
    ) {
        let mut a = alloc(conf);
        if fraction > 0.0 {
            a.set_memory_fraction(fraction);
        }
        let mut live: Vec<u64> = Vec::new();
        for o in ops {
            match o {
                Op::Alloc(n) => {
                    if let Ok(p) = a.malloc(n, 0) {
                        live.push(p);
                    }
                }
                Op::Free(i) if !live.is_empty() => {
                    let p = live.swap_remove(i % live.len());
                    a.free(p).unwrap();
                    prop_assert!(a.free(p).is_err(), "a double free is refused");
                }
                Op::Free(_) => {}
                Op::EmptyCache => a.empty_cache(),
            }
            check_invariants(&a)?;
        }
        for p in live {
            a.free(p).unwrap();
        }
        a.empty_cache();
        check_invariants(&a)?;
        prop_assert_eq!(a.stats().reserved_bytes.all().current, 0, "everything free is released");
    }
}

#[test]
fn peak_and_accumulated_resets_across_pools() {
    let mut a = alloc("");
    let big = a.malloc(30 * MIB, 0).unwrap();
    let small = a.malloc(1000, 0).unwrap();
    a.free(big).unwrap();
    let s = a.stats();
    assert_eq!(s.allocated_bytes.all().peak, 30 * MIB as i64 + 1024);
    assert_eq!(s.allocated_bytes.all().current, 1024);
    assert_eq!(s.allocated_bytes.all().allocated, 30 * MIB as i64 + 1024);
    assert_eq!(s.allocated_bytes.all().freed, 30 * MIB as i64);
    a.reset_peak_stats();
    let s = a.stats();
    assert_eq!(s.allocated_bytes.all().peak, 1024);
    assert_eq!(s.allocated_bytes.large_pool().peak, 0);
    assert_eq!(s.reserved_bytes.all().peak, s.reserved_bytes.all().current);
    a.reset_accumulated_stats();
    let s = a.stats();
    assert_eq!(
        (
            s.allocated_bytes.all().allocated,
            s.allocated_bytes.all().freed
        ),
        (0, 0)
    );
    assert_eq!((s.num_device_alloc, s.num_alloc_retries), (0, 0));
    assert_eq!(
        s.allocated_bytes.all().current,
        1024,
        "current survives both resets"
    );
    let flat = s.to_flat();
    assert_eq!(flat["allocated_bytes.all.peak"], 1024);
    a.free(small).unwrap();
}
