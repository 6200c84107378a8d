//! Giving memory back: `empty_cache`, the out-of-memory path's releases (oversize segments
//! with `max_split_size`, then every whole free segment) and garbage collection under a memory
//! fraction. Each freed segment is a `segment_free` event and leaves the stats as PyTorch's do.

use super::*;

impl<S: SegmentSource> CachingAllocator<S> {
    /// `torch.cuda.empty_cache()`: returns every whole free segment (and every free expandable
    /// page) to the device.
    pub fn empty_cache(&mut self) {
        self.log_other();
        tracing::debug!("empty_cache");
        self.recorder.record(EventKind::EmptyCache, 0, 0, 0);
        self.release_cached_blocks();
    }

    pub(super) fn release_cached_blocks(&mut self) {
        // synchronize_and_free_events
        self.process_events();
        self.stats.num_sync_all_streams += 1;
        self.release_blocks(PoolKind::Large);
        self.release_blocks(PoolKind::Small);
    }

    pub(super) fn release_blocks(&mut self, pool: PoolKind) {
        let ids = self.pools[pool as usize].blocks.ids(&mut self.blocks);
        let mut to_unmap = Vec::new();
        for id in ids {
            let b = &self.blocks[id as usize];
            if b.expandable != NONE {
                to_unmap.push(id);
            } else if !b.is_split() {
                self.release_block(id);
            }
        }
        for id in to_unmap {
            self.unmap_block(id);
            let b = &self.blocks[id as usize];
            if !b.is_split() && !b.mapped {
                self.release_expandable_segment(id);
            }
        }
    }

    /// cudaFree of a whole free segment.
    pub(super) fn release_block(&mut self, id: u32) {
        let (addr, size, stream, pool) = {
            let b = &self.blocks[id as usize];
            (b.addr, b.size, b.stream, b.pool)
        };
        self.stats.num_device_free += 1;
        tracing::debug!(addr = %format_args!("{addr:#x}"), size, ?pool, "segment freed (cudaFree)");
        self.recorder
            .record(EventKind::SegmentFree, addr, size, stream);
        self.source.free(addr, size);
        self.total_reserved -= size;
        self.stats.segment.decrease(pool, 1);
        self.stats.reserved_bytes.decrease(pool, size);
        if size >= self.conf.max_split_size {
            self.stats.oversize_segments.decrease(1);
        }
        self.remove_from_blocks(id);
        self.delete_block(id);
    }

    /// With `max_split_size`: free one cached oversize segment big enough for the request, or
    /// else oversize segments from the largest down until enough is freed.
    pub(super) fn release_available_cached_blocks(
        &mut self,
        pool: PoolKind,
        stream: StreamId,
        size: u64,
    ) -> bool {
        let mss = self.conf.max_split_size;
        if mss == u64::MAX {
            return false;
        }
        let want = size.max(mss);
        let p = &mut self.pools[pool as usize];
        p.blocks.flush(&mut self.blocks);
        let hit = p.blocks.from_size(&self.blocks, stream, want).next();
        match hit {
            Some((k, id)) if k.stream == stream && self.blocks[id as usize].expandable == NONE => {
                self.release_block(id);
                true
            }
            _ => {
                // from the largest block below the wanted size, downward, while oversize
                let candidates: Vec<u32> = self.pools[pool as usize]
                    .blocks
                    .below_size_rev(&self.blocks, stream, want)
                    .into_iter()
                    .take_while(|(k, _)| k.size >= mss)
                    .map(|(_, id)| id)
                    .collect();
                let mut released = 0u64;
                for id in candidates {
                    if released >= want {
                        break;
                    }
                    if self.blocks[id as usize].expandable == NONE {
                        released += self.blocks[id as usize].size;
                        self.release_block(id);
                    }
                }
                released >= want
            }
        }
    }

    /// `garbage_collection_threshold`: before asking for a new segment while reserved memory
    /// is above threshold x allowed, free the oldest whole cached large segments.
    pub(super) fn garbage_collect_cached_blocks(&mut self) {
        let Some((_, allowed)) = self.fraction else {
            return;
        };
        let threshold = (self.conf.garbage_collection_threshold * allowed as f64) as u64;
        if self.total_reserved <= threshold {
            return;
        }
        let target = self.total_reserved - threshold;
        let large = PoolKind::Large as usize;
        let now = self.pools[large].free_calls;
        let mut total_age: u64 = 0;
        let mut count: i64 = 0;
        for (_, id) in self.pools[large].blocks.ordered(&mut self.blocks) {
            let b = &self.blocks[id as usize];
            if !b.is_split() {
                total_age += now - b.gc_base;
                count += 1;
            }
        }
        if count == 0 {
            return;
        }
        let mut reclaimed = 0u64;
        let mut freed_any = true;
        while reclaimed < target && freed_any && count > 0 {
            let age_threshold = total_age as f64 / count as f64;
            freed_any = false;
            let ids = self.pools[large].blocks.ids(&mut self.blocks);
            for id in ids {
                let b = &self.blocks[id as usize];
                let age = now - b.gc_base;
                if !b.is_split() && b.expandable == NONE && age as f64 >= age_threshold {
                    freed_any = true;
                    reclaimed += b.size;
                    total_age -= age;
                    count -= 1;
                    self.release_block(id);
                }
            }
        }
    }
}
