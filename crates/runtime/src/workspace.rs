//! Activation buffers kept between graph runs, bounded in bytes like the primitive cache.
//!
//! A [`Workspace`] hands the graph runner its activation buffers and takes them back after
//! their value's last use, so that a server's steady state allocates nothing. After each run
//! it keeps at most its byte budget of free buffers and returns the rest to the operating
//! system. Large buffers are anonymous mappings of their own (memmap2): dropping one unmaps
//! it at once, whatever the allocator's heuristics (glibc's, for one, raises its mmap
//! threshold to the size of freed chunks and then keeps later ones of that size on its heap).

use std::io;
use std::ops::{Deref, DerefMut};

use memmap2::MmapMut;

use crate::cache::Budget;
use crate::error::ConfigError;

/// Buffers of at least this many bytes are anonymous mappings; smaller ones live on the heap,
/// where they cost less than a page each and never hold much.
pub const MAP_THRESHOLD_BYTES: usize = 64 << 10;

/// A free buffer serves a band, halo or copy of a streamed segment only if it is at most
/// `REUSE_SLACK` times larger. The segment takes buffers of many sizes (bands of each layer,
/// their halos, copies of input columns): served by whichever free buffer was large enough,
/// small requests held large buffers, and the workspace held 79 MB at once for the trunk's
/// 34 MB of activations at W=7680 (VmHWM 259 MB); with 4, 56 MB (VmHWM 237 MB). Whole
/// tensors take any free buffer that is large enough, so that narrow calls after wide ones
/// map nothing.
pub const REUSE_SLACK: usize = 4;

/// How a workspace is bounded (`EngineConfig::workspace`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkspaceConfig {
    /// The most bytes of free buffers a workspace keeps after a run (`PRIMJIT_WORKSPACE_BUDGET`).
    pub budget: Budget,
}

impl WorkspaceConfig {
    /// 8 MiB: the smallest budget whose latency on the benchmark workload stayed within 2% of
    /// an unlimited workspace (README.md, "Activation memory"). After a wide call, `trim`
    /// shrinks its buffers to what a call about 600 columns wide needs (the workload's median
    /// width is 232), which the narrower calls then reuse.
    pub const DEFAULT_BUDGET: Budget = Budget::Bytes(8 << 20);

    /// Reads `PRIMJIT_WORKSPACE_BUDGET` (`64MiB`, `512KiB`, a number of bytes, `0`, `unlimited`),
    /// defaulting what is unset; a malformed value is an error.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let mut config = WorkspaceConfig::default();
        if let Some(v) = var("PRIMJIT_WORKSPACE_BUDGET") {
            config.budget = Budget::parse(&v).map_err(|reason| ConfigError::Invalid {
                name: "PRIMJIT_WORKSPACE_BUDGET",
                value: v,
                reason,
            })?;
        }
        Ok(config)
    }
}

impl Default for WorkspaceConfig {
    fn default() -> Self {
        WorkspaceConfig {
            budget: Self::DEFAULT_BUDGET,
        }
    }
}

/// What a workspace holds and has given back, in bytes (mappings by their mapped length, heap
/// buffers by capacity).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkspaceStats {
    /// Bytes of buffers the workspace holds now, free or lent to a run.
    pub bytes: usize,
    /// The most bytes it ever held at once.
    pub peak_bytes: usize,
    /// Bytes returned to the operating system so far: buffers beyond the budget after a run,
    /// and buffers replaced by a larger one.
    pub returned_bytes: u64,
    /// Buffers mapped or allocated so far.
    pub allocations: u64,
}

/// One activation buffer: `len` floats, in a mapping of its own or on the heap.
#[derive(Debug)]
pub(crate) enum Buffer {
    Heap(Vec<f32>),
    Mapped { map: MmapMut, len: usize },
}

impl Buffer {
    /// Bytes this buffer holds (its capacity).
    fn bytes(&self) -> usize {
        match self {
            Buffer::Heap(v) => v.capacity() * 4,
            Buffer::Mapped { map, .. } => map.len(),
        }
    }

    /// Floats this buffer can hold.
    fn capacity(&self) -> usize {
        self.bytes() / 4
    }

    /// A zeroed buffer of `len` floats.
    fn new(len: usize) -> io::Result<Buffer> {
        let bytes = len * 4;
        if bytes < MAP_THRESHOLD_BYTES {
            return Ok(Buffer::Heap(vec![0.0; len]));
        }
        let page = crate::exec::page_size();
        let map = MmapMut::map_anon(bytes.div_ceil(page) * page)?;
        Ok(Buffer::Mapped { map, len })
    }

    /// Sets the length (at most the capacity); contents are unspecified.
    fn set_len(&mut self, new_len: usize) {
        debug_assert!(new_len <= self.capacity());
        match self {
            Buffer::Heap(v) => v.resize(new_len, 0.0),
            Buffer::Mapped { len, .. } => *len = new_len,
        }
    }
}

impl Deref for Buffer {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        match self {
            Buffer::Heap(v) => v,
            // A mapping starts at a page boundary and spans whole pages, so its bytes are
            // f32-aligned and a multiple of 4 long: the cast cannot fail.
            Buffer::Mapped { map, len } => &bytemuck::cast_slice::<u8, f32>(map)[..*len],
        }
    }
}

impl DerefMut for Buffer {
    fn deref_mut(&mut self) -> &mut [f32] {
        match self {
            Buffer::Heap(v) => v,
            Buffer::Mapped { map, len } => &mut bytemuck::cast_slice_mut::<u8, f32>(map)[..*len],
        }
    }
}

/// Activation buffers kept between runs, within a byte budget.
///
/// A workspace made with [`Workspace::new`] follows its engine's budget
/// (`EngineConfig::workspace`, `PRIMJIT_WORKSPACE_BUDGET`); [`Workspace::with_budget`] sets
/// its own. One workspace serves one run at a time: give each thread of a server its own.
#[derive(Debug, Default)]
pub struct Workspace {
    free: Vec<FreeBuffer>,
    budget: Option<Budget>,
    stats: WorkspaceStats,
    /// Runs ended so far ([`Workspace::finish_run`]): the number of the current one.
    runs: u64,
}

/// A free buffer and the run that last gave it back.
#[derive(Debug)]
struct FreeBuffer {
    buf: Buffer,
    run: u64,
}

impl Workspace {
    /// A workspace that keeps what its engine's budget allows.
    pub fn new() -> Self {
        Self::default()
    }

    /// A workspace that keeps at most `budget` bytes of buffers after each run, whatever the
    /// engine's budget.
    pub fn with_budget(budget: Budget) -> Self {
        Workspace {
            budget: Some(budget),
            ..Self::default()
        }
    }

    /// Its own budget, if it has one (else the engine's applies).
    pub fn budget(&self) -> Option<Budget> {
        self.budget
    }

    pub fn stats(&self) -> WorkspaceStats {
        self.stats
    }

    /// A buffer of exactly `len` floats, reusing the smallest free one that is large enough;
    /// its contents are unspecified.
    pub(crate) fn take(&mut self, len: usize) -> io::Result<Buffer> {
        self.take_within(len, usize::MAX)
    }

    /// [`Self::take`], reusing only a free buffer at most `slack` times larger than `len`
    /// (the streamed segment's small buffers, [`REUSE_SLACK`]).
    pub(crate) fn take_within(&mut self, len: usize, slack: usize) -> io::Result<Buffer> {
        let best = (0..self.free.len())
            .filter(|&i| {
                let capacity = self.free[i].buf.capacity();
                capacity >= len && capacity <= len.saturating_mul(slack)
            })
            .min_by_key(|&i| self.free[i].buf.capacity());
        let mut buf = match best {
            Some(i) => self.free.swap_remove(i).buf,
            None => {
                // None fits: replace the largest free buffer that is too small rather than
                // keep it and add another, so that the workspace holds at most as many buffers
                // as a run has live at once, each as large as its largest use. (A buffer too
                // large for this request stays for the larger ones it serves.)
                if let Some(i) = (0..self.free.len())
                    .filter(|&i| self.free[i].buf.capacity() < len)
                    .max_by_key(|&i| self.free[i].buf.capacity())
                {
                    let old = self.free.swap_remove(i);
                    self.release(old.buf);
                }
                let buf = Buffer::new(len)?;
                self.stats.bytes += buf.bytes();
                self.stats.peak_bytes = self.stats.peak_bytes.max(self.stats.bytes);
                self.stats.allocations += 1;
                buf
            }
        };
        // Kernels write every element of their destination (padding lanes included), so a
        // reused buffer keeps its stale contents instead of being cleared.
        buf.set_len(len);
        Ok(buf)
    }

    pub(crate) fn give(&mut self, buf: Buffer) {
        self.free.push(FreeBuffer {
            buf,
            run: self.runs,
        });
    }

    /// Drops `buf`, returning its memory.
    fn release(&mut self, buf: Buffer) {
        self.stats.bytes -= buf.bytes();
        self.stats.returned_bytes += buf.bytes() as u64;
    }

    /// [`Self::trim`] to the workspace's own budget, else to `engine_budget`.
    pub(crate) fn trim_to_budget(&mut self, engine_budget: Budget) {
        self.trim(self.budget.unwrap_or(engine_budget));
    }

    /// Ends a run: the buffers it did not use go back to the system first (largest first),
    /// then, if the rest still pass the budget, the pages of each beyond what the run used of
    /// it, then [`Self::trim_to_budget`] shrinks them all alike.
    ///
    /// Why: after a wide run, shrinking every buffer alike left a narrow one with buffers of
    /// sizes it did not need beside some it did; each narrow run then mapped one buffer again
    /// and the trim shrank it once more (the workload's W=200 calls mapped 2 MB a call under
    /// the 8 MiB budget while needing 6.2 MB). Dropping what a run left idle keeps the buffers
    /// of the run just done, which the next similar run takes as they are.
    pub(crate) fn finish_run(&mut self, engine_budget: Budget) {
        if let Budget::Bytes(limit) = self.budget.unwrap_or(engine_budget) {
            let mut total: usize = self.free.iter().map(|f| f.buf.bytes()).sum();
            let runs = self.runs;
            let mut idle: Vec<usize> = (0..self.free.len())
                .filter(|&i| self.free[i].run < runs)
                .collect();
            idle.sort_by_key(|&i| std::cmp::Reverse(self.free[i].buf.bytes()));
            let mut dropped = Vec::new();
            for i in idle {
                if total <= limit {
                    break;
                }
                total -= self.free[i].buf.bytes();
                dropped.push(i);
            }
            dropped.sort_unstable_by(|a, b| b.cmp(a));
            for i in dropped {
                let old = self.free.swap_remove(i);
                self.release(old.buf);
            }
            // Still over: the run's buffers give up what it did not use of them (a narrow run
            // takes the larger buffers a wide one left).
            if total > limit {
                let page = crate::exec::page_size();
                for f in &mut self.free {
                    let before = f.buf.bytes();
                    if let Buffer::Mapped { map, len } = &mut f.buf {
                        let used = (*len * 4).div_ceil(page).max(1) * page;
                        if used < before && crate::exec::shrink_mapping(map, used).is_ok() {
                            self.stats.bytes -= before - used;
                            self.stats.returned_bytes += (before - used) as u64;
                        }
                    }
                }
            }
        }
        self.trim_to_budget(engine_budget);
        self.runs += 1;
    }

    /// Keeps at most `budget` bytes of free buffers and returns the rest. Every mapped buffer
    /// is shrunk by the same factor (page-rounded down; its first pages stay as they are),
    /// heap buffers (below the mapping threshold) are dropped: a network's activations scale
    /// together with its input's width, so the workspace keeps what a narrower run needs,
    /// rather than the few whole buffers of a wide run that a narrow one could not use.
    pub(crate) fn trim(&mut self, budget: Budget) {
        let limit = match budget {
            Budget::Unlimited => return,
            Budget::Bytes(b) => b,
        };
        let total: usize = self.free.iter().map(|f| f.buf.bytes()).sum();
        if total <= limit {
            return;
        }
        let page = crate::exec::page_size();
        let mut keep = Vec::with_capacity(self.free.len());
        for FreeBuffer { mut buf, run } in std::mem::take(&mut self.free) {
            let before = buf.bytes();
            let share = (before as u128 * limit as u128 / total as u128) as usize / page * page;
            let shrunk = match &mut buf {
                Buffer::Mapped { map, len } if share > 0 => {
                    let ok = crate::exec::shrink_mapping(map, share).is_ok();
                    *len = 0;
                    ok
                }
                _ => false,
            };
            if shrunk {
                self.stats.bytes -= before - buf.bytes();
                self.stats.returned_bytes += (before - buf.bytes()) as u64;
                keep.push(FreeBuffer { buf, run });
            } else {
                self.release(buf);
            }
        }
        self.free = keep;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run whose buffers change size (a new width) replaces buffers it already holds instead
    /// of adding more: after one run at each size, alternating sizes allocates nothing.
    #[test]
    fn workspace_grows_buffers_instead_of_hoarding_them() {
        let mut ws = Workspace::with_budget(Budget::Unlimited);
        let run = |ws: &mut Workspace, scale: usize| {
            let a = ws.take(10 * scale).unwrap();
            let b = ws.take(20 * scale).unwrap();
            ws.give(a);
            let c = ws.take(15 * scale).unwrap();
            ws.give(b);
            ws.give(c);
        };
        run(&mut ws, 1);
        run(&mut ws, 3);
        let settled = ws.stats();
        assert_eq!(ws.free.len(), 2, "at most two buffers are live at once");
        for scale in [1, 3, 2, 3, 1] {
            run(&mut ws, scale);
        }
        assert_eq!(ws.stats(), settled);
        assert_eq!(ws.free.len(), 2);
    }

    /// Large buffers are page-aligned mappings, small ones heap vectors; both read back what
    /// was written, and a fresh buffer is zeroed.
    #[test]
    fn large_buffers_are_mappings_and_hold_their_floats() {
        let mut ws = Workspace::with_budget(Budget::Unlimited);
        let small_len = MAP_THRESHOLD_BYTES / 4 - 1;
        let large_len = MAP_THRESHOLD_BYTES / 4 + 3;
        let mut small = ws.take(small_len).unwrap();
        let mut large = ws.take(large_len).unwrap();
        assert!(matches!(small, Buffer::Heap(_)));
        assert!(matches!(large, Buffer::Mapped { .. }));
        assert_eq!((small.len(), large.len()), (small_len, large_len));
        assert!(large.iter().all(|&x| x == 0.0));
        for (i, x) in large.iter_mut().enumerate() {
            *x = i as f32;
        }
        small.fill(2.5);
        assert_eq!(large[large_len - 1], (large_len - 1) as f32);
        assert_eq!(large.as_ptr() as usize % crate::exec::page_size(), 0);
        let page = crate::exec::page_size();
        assert_eq!(
            ws.stats().bytes,
            small_len * 4 + (large_len * 4).div_ceil(page) * page
        );
        ws.give(small);
        ws.give(large);
    }

    /// A run's buffers outlast the ones it left idle: after a wide run has been shrunk to the
    /// budget, a narrow run that needs a larger buffer than the shrunk ones maps it once, and
    /// the narrow runs after it map and return nothing (shrinking every buffer alike would
    /// shrink the narrow run's buffer again after each run).
    #[test]
    fn finishing_a_run_drops_its_idle_buffers_first() {
        let page = crate::exec::page_size();
        let budget = Budget::Bytes(40 * page);
        let mut ws = Workspace::with_budget(budget);
        let wide: Vec<Buffer> = (0..3).map(|_| ws.take(64 * page / 4).unwrap()).collect();
        for b in wide {
            ws.give(b);
        }
        ws.finish_run(Budget::Unlimited);
        assert!(ws.stats().bytes <= 40 * page);
        let narrow = |ws: &mut Workspace| {
            let b = ws.take(30 * page / 4).unwrap();
            ws.give(b);
            ws.finish_run(Budget::Unlimited);
        };
        narrow(&mut ws);
        let settled = ws.stats();
        assert_eq!(
            settled.bytes,
            30 * page,
            "the wide run's buffers went first"
        );
        for _ in 0..3 {
            narrow(&mut ws);
        }
        assert_eq!(ws.stats(), settled);
    }

    /// After a trim, the free buffers fit the budget: each mapped buffer shrunk by the same
    /// factor, keeping its first floats; what was given up counts as returned, and the peak
    /// stays. Budget 0 returns everything.
    #[test]
    fn trim_shrinks_every_buffer_alike_and_counts_the_rest_returned() {
        let page = crate::exec::page_size();
        let floats = |bytes: usize| bytes / 4;
        let mut ws = Workspace::with_budget(Budget::Unlimited);
        let sizes = [64 * page, 32 * page, 16 * page];
        let mut bufs: Vec<Buffer> = sizes.iter().map(|&s| ws.take(floats(s)).unwrap()).collect();
        for (i, b) in bufs.iter_mut().enumerate() {
            b.fill(i as f32 + 1.0);
        }
        for b in bufs {
            ws.give(b);
        }
        let total: usize = sizes.iter().sum();
        assert_eq!(ws.stats().bytes, total);
        ws.trim(Budget::Unlimited);
        ws.trim(Budget::Bytes(total));
        assert_eq!(ws.stats().bytes, total);
        // 50/112 of each, page-rounded down: 28, 14 and 7 pages.
        ws.trim(Budget::Bytes(50 * page));
        let mut kept: Vec<usize> = ws.free.iter().map(|f| f.buf.bytes()).collect();
        kept.sort_unstable();
        assert_eq!(kept, [7 * page, 14 * page, 28 * page]);
        assert_eq!(ws.stats().bytes, 49 * page);
        assert_eq!(ws.stats().returned_bytes, 63 * page as u64);
        assert_eq!(ws.stats().peak_bytes, total);
        // A shrunk buffer keeps its first floats.
        let b = ws.take(floats(28 * page)).unwrap();
        assert!(b.iter().all(|&x| x == 1.0), "the first buffer's floats");
        ws.give(b);
        ws.trim(Budget::Bytes(0));
        assert_eq!(ws.stats().bytes, 0);
        assert!(ws.free.is_empty());
        assert_eq!(ws.stats().returned_bytes, total as u64);
        assert_eq!(ws.stats().allocations, 3);
    }
}
