//! Expandable segments (`expandable_segments:True`, PyTorch's Note [Expandable Segments]): one
//! reserved address range per stream and pool, physical pages mapped on demand and unmapped by
//! `empty_cache`, blocks merged only with neighbours in the same mapped state.

use super::*;

impl<S: SegmentSource> CachingAllocator<S> {
    pub(super) fn try_allocate_expandable_block(
        &mut self,
        pool: PoolKind,
        stream: StreamId,
        size: u64,
    ) -> Option<u32> {
        let mut cand = self.find_expandable_block(pool, stream, size)?;
        if !self.blocks[cand as usize].mapped {
            let want = self.blocks[cand as usize].size.min(size);
            if !self.map_block(cand, want) {
                return None;
            }
        }
        while self.blocks[cand as usize].size < size {
            let remaining = size - self.blocks[cand as usize].size;
            let next = self.blocks[cand as usize].next;
            let want = remaining.min(self.blocks[next as usize].size);
            if !self.map_block(next, want) {
                return None;
            }
            cand = next;
        }
        self.remove_from_blocks(cand);
        Some(cand)
    }

    pub(super) fn allocatable(&self, id: u32) -> bool {
        id != NONE && {
            let b = &self.blocks[id as usize];
            !b.allocated && b.event_count == 0 && b.n_uses == 0
        }
    }

    pub(super) fn find_expandable_block(
        &mut self,
        pool: PoolKind,
        stream: StreamId,
        size: u64,
    ) -> Option<u32> {
        let unmapped: Vec<u32> = self.pools[pool as usize]
            .unmapped
            .range((stream, 0)..)
            .take_while(|(k, _)| k.0 == stream)
            .map(|(_, &id)| id)
            .collect();
        for id in unmapped {
            let mut c = id;
            let prev = self.blocks[c as usize].prev;
            if self.allocatable(prev) {
                c = prev;
            }
            let mut bytes = 0;
            let mut b = c;
            while bytes < size && self.allocatable(b) {
                bytes += self.blocks[b as usize].size;
                b = self.blocks[b as usize].next;
            }
            if bytes >= size {
                return Some(c);
            }
        }
        let page = match pool {
            PoolKind::Small => SMALL_BUFFER,
            PoolKind::Large => self.conf.large_segment_size,
        };
        // address space for 1 1/8 of the device, so pages can be remapped at the end
        let pages = (self.source.device_total() as u128 * 9 / 8).div_ceil(page as u128) as u64;
        let vsize = pages * page;
        let base = self.source.reserve(vsize)?;
        let rid = self.reservations.len() as u32;
        self.reservations.push(Reservation {
            base,
            size: vsize,
            page,
            mapped: vec![false; pages as usize],
            live: true,
        });
        let mut b = self.blank(base, vsize, stream, pool);
        b.mapped = false;
        b.expandable = rid;
        let id = self.new_block(b);
        self.pools[pool as usize]
            .unmapped
            .insert((stream, base), id);
        Some(id)
    }

    /// Maps whole pages covering [block start, +size) of an unmapped block.
    pub(super) fn map_block(&mut self, id: u32, size: u64) -> bool {
        let (addr, bsize, rid, stream, pool) = {
            let b = &self.blocks[id as usize];
            (b.addr, b.size, b.expandable, b.stream, b.pool)
        };
        let r = &self.reservations[rid as usize];
        let (page, base) = (r.page, r.base);
        let begin = (addr - base) / page;
        let end = (addr + size - base).div_ceil(page);
        for i in begin..end {
            if !self.source.map(base + i * page, page) {
                for j in begin..i {
                    self.source.unmap(base + j * page, page);
                }
                return false;
            }
        }
        for i in begin..end {
            self.reservations[rid as usize].mapped[i as usize] = true;
        }
        let mapped = (end - begin) * page;
        self.pools[pool as usize].unmapped.remove(&(stream, addr));
        self.blocks[id as usize].mapped = true;
        if mapped < bsize {
            let mut rest = self.blank(addr + mapped, bsize - mapped, stream, pool);
            rest.mapped = false;
            rest.expandable = rid;
            let rest_id = self.new_block(rest);
            self.splice_after(id, rest_id);
            self.pools[pool as usize]
                .unmapped
                .insert((stream, addr + mapped), rest_id);
            self.blocks[id as usize].size = mapped;
        }
        let prev = self.blocks[id as usize].prev;
        self.try_merge_blocks(id, prev);
        let next = self.blocks[id as usize].next;
        self.try_merge_blocks(id, next);
        self.insert_into_blocks(id);
        self.total_reserved += mapped;
        self.stats.reserved_bytes.increase(pool, mapped);
        self.stats.num_device_alloc += 1;
        self.recorder
            .record(EventKind::SegmentMap, addr, mapped, stream);
        let current = self.recorder.current();
        let b = &mut self.blocks[id as usize];
        if b.prev == NONE && b.seg_stack == NO_STACK {
            b.seg_stack = current;
        }
        true
    }

    /// Unmaps the whole pages inside a free expandable block.
    pub(super) fn unmap_block(&mut self, id: u32) {
        let (addr, size, rid, stream, pool) = {
            let b = &self.blocks[id as usize];
            (b.addr, b.size, b.expandable, b.stream, b.pool)
        };
        let r = &self.reservations[rid as usize];
        let (page, base) = (r.page, r.base);
        let begin = (addr - base).div_ceil(page);
        let end = (addr + size - base) / page;
        if begin >= end {
            return;
        }
        for i in begin..end {
            self.source.unmap(base + i * page, page);
            self.reservations[rid as usize].mapped[i as usize] = false;
        }
        let uaddr = base + begin * page;
        let usize_ = (end - begin) * page;
        self.remove_from_blocks(id);
        let before = uaddr - addr;
        if before > 0 {
            let mut bf = self.blank(addr, before, stream, pool);
            bf.expandable = rid;
            let bid = self.new_block(bf);
            self.splice_before(id, bid);
            self.insert_into_blocks(bid);
        }
        let after = size - (before + usize_);
        if after > 0 {
            let mut af = self.blank(uaddr + usize_, after, stream, pool);
            af.expandable = rid;
            let aid = self.new_block(af);
            self.splice_after(id, aid);
            self.insert_into_blocks(aid);
        }
        {
            let b = &mut self.blocks[id as usize];
            b.addr = uaddr;
            b.size = usize_;
            b.mapped = false;
        }
        let prev = self.blocks[id as usize].prev;
        self.try_merge_blocks(id, prev);
        let next = self.blocks[id as usize].next;
        self.try_merge_blocks(id, next);
        let a = self.blocks[id as usize].addr;
        self.pools[pool as usize].unmapped.insert((stream, a), id);
        self.total_reserved -= usize_;
        self.stats.reserved_bytes.decrease(pool, usize_);
        self.stats.num_device_free += 1;
        self.recorder
            .record(EventKind::SegmentUnmap, uaddr, usize_, stream);
    }

    pub(super) fn release_expandable_segment(&mut self, id: u32) {
        let (addr, stream, pool, rid) = {
            let b = &self.blocks[id as usize];
            (b.addr, b.stream, b.pool, b.expandable)
        };
        let r = &mut self.reservations[rid as usize];
        r.live = false;
        let (base, size) = (r.base, r.size);
        self.source.release(base, size);
        self.pools[pool as usize].unmapped.remove(&(stream, addr));
        self.delete_block(id);
    }
}
