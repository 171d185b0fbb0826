//! Activation buffers kept between graph runs, bounded in bytes like the primitive cache.
//!
//! A [`Workspace`] hands the graph runner its activation buffers and takes them back after
//! their value's last use, so that a server's steady state allocates nothing. After each run
//! it keeps at most its byte budget of free buffers and returns the rest to the operating
//! system. Large buffers are anonymous mappings of their own (memmap2): dropping one unmaps
//! it at once, whatever the allocator's heuristics (glibc's, for one, raises its mmap
//! threshold to the size of freed chunks and then keeps later ones of that size on its heap).
//! Mappings of 2 MiB or more ask for transparent huge pages: a buffer beyond the budget is
//! faulted in again on every run, 512 times fewer faults.

use std::io;
use std::ops::{Deref, DerefMut};

use memmap2::MmapMut;

use crate::config::Budget;

/// Buffers of at least this many bytes are anonymous mappings; smaller ones live on the heap,
/// where they cost less than a page each and never hold much.
pub const MAP_THRESHOLD_BYTES: usize = 64 << 10;

/// Mappings of at least this many bytes ask for transparent huge pages (2 MiB on x86-64).
const HUGE_PAGE_BYTES: usize = 2 << 20;

/// A free buffer serves a band, halo or copy of a streamed segment only if it is at most
/// `REUSE_SLACK` times larger. The segment takes buffers of many sizes (bands of each layer,
/// their halos, copies of input columns): served by whichever free buffer was large enough,
/// small requests held large buffers, and the workspace held 79 MB at once for the trunk's
/// 34 MB of activations at W=7680 (VmHWM 259 MB); with 4, 56 MB (VmHWM 237 MB). Whole
/// tensors take any free buffer that is large enough, so that narrow calls after wide ones
/// map nothing.
pub const REUSE_SLACK: usize = 4;

/// What a workspace holds and has given back, in bytes (mappings by their mapped length, heap
/// buffers by capacity).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkspaceStats {
    /// Bytes of buffers the workspace holds now, free or lent to a run.
    pub bytes: usize,
    /// The most bytes it ever held at once.
    pub peak_bytes: usize,
    /// Bytes returned to the operating system so far: buffers beyond the budget after a run,
    /// and buffers replaced by a larger one (heap buffers; a mapping grows instead).
    pub returned_bytes: u64,
    /// Buffers mapped or allocated so far (a mapping grown for a larger use is not a new one).
    pub allocations: u64,
}

/// One activation buffer: `len` floats, in a mapping of its own or on the heap.
#[derive(Debug)]
pub(crate) struct Buffer {
    memory: Memory,
    len: usize,
    /// The most floats it has held since the workspace last took stock (the end of a run):
    /// what the run needed of it, whatever it held last.
    high_water: usize,
}

#[derive(Debug)]
enum Memory {
    /// A vector of the buffer's capacity.
    Heap(Vec<f32>),
    Mapped(MmapMut),
}

/// Asks for transparent huge pages for a mapping of [`HUGE_PAGE_BYTES`] or more. Advice only:
/// where the system declines, 4 KiB pages serve as before.
fn advise_huge_pages(map: &MmapMut) {
    if map.len() >= HUGE_PAGE_BYTES {
        let _ = map.advise(memmap2::Advice::HugePage);
    }
}

/// Bytes of the whole pages that a mapping of `floats` floats takes.
fn mapped_bytes(floats: usize) -> usize {
    let page = crate::exec::page_size();
    (floats * 4).div_ceil(page) * page
}

impl Buffer {
    /// Bytes this buffer holds (its capacity).
    fn bytes(&self) -> usize {
        match &self.memory {
            Memory::Heap(v) => v.len() * 4,
            Memory::Mapped(map) => map.len(),
        }
    }

    /// Floats this buffer can hold.
    fn capacity(&self) -> usize {
        self.bytes() / 4
    }

    /// Bytes of the most it held since the last stock-taking, in the units it can shrink by:
    /// whole pages for a mapping, its capacity for a heap vector.
    fn high_water_bytes(&self) -> usize {
        match &self.memory {
            Memory::Heap(_) => self.bytes(),
            Memory::Mapped(_) => mapped_bytes(self.high_water).max(crate::exec::page_size()),
        }
    }

    /// A zeroed buffer of `len` floats.
    fn new(len: usize) -> io::Result<Buffer> {
        let bytes = len * 4;
        let memory = if bytes < MAP_THRESHOLD_BYTES {
            Memory::Heap(vec![0.0; len])
        } else {
            let map = MmapMut::map_anon(mapped_bytes(len))?;
            advise_huge_pages(&map);
            Memory::Mapped(map)
        };
        Ok(Buffer {
            memory,
            len,
            high_water: len,
        })
    }

    /// Sets the length (at most the capacity); contents are unspecified.
    fn set_len(&mut self, new_len: usize) {
        debug_assert!(new_len <= self.capacity());
        self.len = new_len;
        self.high_water = self.high_water.max(new_len);
    }

    /// Grows a mapped buffer to hold `len` floats (at least its capacity), keeping its pages
    /// and their contents; false if it is on the heap or the system refused.
    fn grow_to(&mut self, len: usize) -> bool {
        let Memory::Mapped(map) = &mut self.memory else {
            return false;
        };
        let grown = crate::exec::grow_mapping(map, mapped_bytes(len)).is_ok();
        if grown {
            advise_huge_pages(map);
        }
        grown
    }

    /// Shrinks a mapped buffer to its first `bytes` (a positive multiple of the page size, at
    /// most its length), returning the rest of its pages; false if it is on the heap or the
    /// system refused. The first floats keep their contents and their pages.
    fn shrink_to(&mut self, bytes: usize) -> bool {
        let Memory::Mapped(map) = &mut self.memory else {
            return false;
        };
        if crate::exec::shrink_mapping(map, bytes).is_err() {
            return false;
        }
        self.len = self.len.min(bytes / 4);
        true
    }
}

impl Deref for Buffer {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        match &self.memory {
            Memory::Heap(v) => &v[..self.len],
            // A mapping starts at a page boundary and spans whole pages, so its bytes are
            // f32-aligned and a multiple of 4 long: the cast cannot fail.
            Memory::Mapped(map) => &bytemuck::cast_slice::<u8, f32>(map)[..self.len],
        }
    }
}

impl DerefMut for Buffer {
    fn deref_mut(&mut self) -> &mut [f32] {
        match &mut self.memory {
            Memory::Heap(v) => &mut v[..self.len],
            Memory::Mapped(map) => &mut bytemuck::cast_slice_mut::<u8, f32>(map)[..self.len],
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
    /// The bytes of buffers that runs within the budget needed, largest first: the largest
    /// of each rank over the runs whose sizes fit in the budget together, the narrower where
    /// two do not ([`Workspace::finish_run`]). After a run beyond the budget, the buffers kept
    /// take these sizes ([`Workspace::fit`]).
    resident: Vec<usize>,
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
                // None fits: grow the largest free buffer that is too small rather than keep
                // it and add another, so that the workspace holds at most as many buffers as
                // a run has live at once, each as large as its largest use. (A buffer too
                // large for this request stays for the larger ones it serves.) Growing keeps
                // its pages: the buffers a budget kept after narrow runs are resident, and a
                // wide run that replaced them with new mappings faulted all of them in again
                // (the trunk at W=3000: 37.6 MB of mappings a call instead of 30.0).
                let smaller = (0..self.free.len())
                    .filter(|&i| self.free[i].buf.capacity() < len)
                    .max_by_key(|&i| self.free[i].buf.capacity());
                let grown = smaller.and_then(|i| {
                    let mut buf = self.free.swap_remove(i).buf;
                    let before = buf.bytes();
                    if buf.grow_to(len) {
                        self.stats.bytes += buf.bytes() - before;
                        Some(buf)
                    } else {
                        self.release(buf);
                        None
                    }
                });
                let buf = match grown {
                    Some(buf) => buf,
                    None => {
                        let buf = Buffer::new(len)?;
                        self.stats.bytes += buf.bytes();
                        self.stats.allocations += 1;
                        buf
                    }
                };
                self.stats.peak_bytes = self.stats.peak_bytes.max(self.stats.bytes);
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

    /// Shrinks a mapped `buf` to its first `bytes` ([`Buffer::shrink_to`]), counting the pages
    /// given back in `stats`; false if it could not.
    fn cut(stats: &mut WorkspaceStats, buf: &mut Buffer, bytes: usize) -> bool {
        let before = buf.bytes();
        if !buf.shrink_to(bytes) {
            return false;
        }
        stats.bytes -= before - bytes;
        stats.returned_bytes += (before - bytes) as u64;
        true
    }

    /// [`Self::fit`] to the workspace's own budget, else to `engine_budget`.
    pub(crate) fn trim_to_budget(&mut self, engine_budget: Budget) {
        if let Budget::Bytes(limit) = self.budget.unwrap_or(engine_budget) {
            self.fit(limit);
        }
    }

    /// Ends a run: if the buffers it used fit in the budget, the sizes the workspace keeps
    /// grow to cover theirs (rank by rank, largest first); where the two together would pass
    /// the budget, the smaller in all stay. Then [`Self::fit`] keeps at most the budget.
    ///
    /// Why: the runs of a server's workload differ in width, and a run beyond the budget (a
    /// wide one, or a streamed one with its many band buffers) leaves buffers of the wrong
    /// sizes for the narrow runs that make up most of the calls. Shrunk all alike, they left
    /// a narrow run one or more buffers short, which it mapped again and faulted in page by
    /// page: the workload's W=200 calls faulted 2-4 MB in after each wide call, 2-3% of their
    /// time. Shaped after the latest run that fit, from pages the wide run had touched, they
    /// served the next narrow run as they were, but not always the one after: a run's buffers
    /// hold different values at different widths (the trunk at W=297 needed 2.8, 2.8 and 1.5
    /// MB in one run, at W=200 2.2, 1.9 and 1.9), so a W=200 run after a wider one that fit
    /// grew a buffer: 11 of the workload's first 100 calls of at most 299 columns faulted
    /// 18-175 pages in, in every pass (4, 18-68 pages, with the sizes below). The largest of
    /// each rank over the runs that fit serves them all. Where that would pass the budget,
    /// the narrower sizes are kept rather than the latest, as the narrow calls are the many:
    /// a W=506 call that just fit (4.4, 2.6 and 1.3 MB) replaced W=200's sizes, and the next
    /// W=200 call grew a buffer again (154 pages).
    pub(crate) fn finish_run(&mut self, engine_budget: Budget) {
        if let Budget::Bytes(limit) = self.budget.unwrap_or(engine_budget) {
            let runs = self.runs;
            let mut used: Vec<usize> = self
                .free
                .iter()
                .filter(|f| f.run == runs)
                .map(|f| f.buf.high_water_bytes())
                .collect();
            let used_bytes: usize = used.iter().sum();
            // Sizes that sum to 0 (empty heap buffers only) would give `fit` nothing to scale.
            if used_bytes > 0 && used_bytes <= limit {
                used.sort_unstable_by(|a, b| b.cmp(a));
                let covering = largest_by_rank(&self.resident, &used);
                if covering.iter().sum::<usize>() <= limit {
                    self.resident = covering;
                } else if used_bytes < self.resident.iter().sum() {
                    self.resident = used;
                }
            }
            self.fit(limit);
        }
        for f in &mut self.free {
            f.buf.high_water = 0;
        }
        self.runs += 1;
    }

    /// Keeps at most `limit` bytes of free buffers: buffers of the sizes the runs within the
    /// budget needed ([`Self::finish_run`]), each scaled alike to fill the budget so that
    /// slightly wider runs fit too, cut from the free buffers that are at least as large (the
    /// smallest for the largest size first; cutting keeps a buffer's first pages, which the run
    /// that used it last has faulted in) or, where none is, the largest smaller one. The rest
    /// goes back to the system. Before any run fits, or if the sizes kept still pass the
    /// budget, [`Self::trim`] shrinks every buffer alike.
    fn fit(&mut self, limit: usize) {
        let total: usize = self.free.iter().map(|f| f.buf.bytes()).sum();
        if total <= limit {
            return;
        }
        if !self.resident.is_empty() {
            let page = crate::exec::page_size();
            let resident_total: usize = self.resident.iter().sum();
            let mut candidates = std::mem::take(&mut self.free);
            candidates.sort_by_key(|f| f.buf.bytes());
            let mut kept = Vec::with_capacity(self.resident.len());
            for &size in &self.resident {
                if candidates.is_empty() {
                    break;
                }
                let scaled = (size as u128 * limit as u128 / resident_total as u128) as usize;
                let target = (scaled / page * page).max(size);
                let at_least = candidates.partition_point(|f| f.buf.bytes() < target);
                let mut f = candidates.remove(at_least.min(candidates.len() - 1));
                let cut = target.div_ceil(page) * page;
                if f.buf.bytes() > cut {
                    Self::cut(&mut self.stats, &mut f.buf, cut);
                }
                kept.push(f);
            }
            for f in candidates {
                self.release(f.buf);
            }
            self.free = kept;
        }
        self.trim(Budget::Bytes(limit));
    }

    /// Keeps at most `budget` bytes of free buffers and returns the rest, with no run to shape
    /// them after ([`Self::fit`]'s fallback): every mapped buffer is shrunk by the same factor
    /// (page-rounded down; its first pages stay as they are), heap buffers (below the mapping
    /// threshold) are dropped. A network's activations scale together with its input's width,
    /// so this keeps roughly what a narrower run needs.
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
            let share =
                (buf.bytes() as u128 * limit as u128 / total as u128) as usize / page * page;
            if share > 0 && Self::cut(&mut self.stats, &mut buf, share) {
                keep.push(FreeBuffer { buf, run });
            } else {
                self.release(buf);
            }
        }
        self.free = keep;
    }
}

/// The larger of two sizes at each rank of two lists sorted largest first (a missing one
/// counting as 0): sorted largest first too.
fn largest_by_rank(a: &[usize], b: &[usize]) -> Vec<usize> {
    (0..a.len().max(b.len()))
        .map(|i| {
            let size = |sizes: &[usize]| sizes.get(i).copied().unwrap_or(0);
            size(a).max(size(b))
        })
        .collect()
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
        assert!(matches!(small.memory, Memory::Heap(_)));
        assert!(matches!(large.memory, Memory::Mapped(_)));
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

    /// Before any run fits in the budget, a wide run's buffers are shrunk alike; the first
    /// narrow run after it maps the buffer it lacks once, and from then on its own buffers are
    /// the ones kept: the narrow runs after it map and return nothing.
    #[test]
    fn narrow_runs_after_a_wide_one_map_once() {
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

    /// After a run beyond the budget, the buffers kept have the sizes of the latest run within
    /// it, scaled to fill the budget: a wide run of many small buffers (a streamed one's bands)
    /// leaves the narrow runs after it the few large buffers they need, so they map nothing.
    /// (Shrunk alike to the budget, the eight bands would leave eight buffers of 5 pages, and
    /// every narrow run would map its 20 pages again.)
    #[test]
    fn buffers_kept_after_a_wide_run_have_the_sizes_of_the_last_run_that_fit() {
        let page = crate::exec::page_size();
        let floats = |pages: usize| pages * page / 4;
        let mut ws = Workspace::with_budget(Budget::Bytes(40 * page));
        let narrow = |ws: &mut Workspace| {
            let a = ws.take(floats(20)).unwrap();
            let b = ws.take(floats(10)).unwrap();
            ws.give(a);
            ws.give(b);
            ws.finish_run(Budget::Unlimited);
        };
        narrow(&mut ws);
        let before = ws.stats();
        for _ in 0..3 {
            let bands: Vec<Buffer> = (0..8).map(|_| ws.take(floats(20)).unwrap()).collect();
            for b in bands {
                ws.give(b);
            }
            ws.finish_run(Budget::Unlimited);
            // 20 and 10 pages scaled by 40/30 are 26 and 13: no band reaches 26 pages, so the
            // largest smaller one stays whole, and another is cut to 13.
            let mut kept: Vec<usize> = ws.free.iter().map(|f| f.buf.bytes() / page).collect();
            kept.sort_unstable();
            assert_eq!(kept, [13, 20]);
            let allocations = ws.stats().allocations;
            for _ in 0..3 {
                narrow(&mut ws);
            }
            assert_eq!(
                ws.stats().allocations,
                allocations,
                "narrow runs map nothing"
            );
            assert!(ws.stats().bytes <= 40 * page);
        }
        assert!(ws.stats().allocations > before.allocations);
    }

    /// Narrow runs of two shapes (one buffer of 80 pages and one of 20; two of 48) both run
    /// without growing a buffer after a wide one: the sizes kept cover the larger of each
    /// rank (80 and 48 pages, scaled to 85 and 51), where the latest run's alone (48 and 48,
    /// scaled to 68 and 68) would leave the 80-page buffer short. Where sizes together pass
    /// the budget, the smaller in all stay.
    #[test]
    fn buffers_kept_after_a_wide_run_cover_every_narrow_shape_that_fit() {
        let page = crate::exec::page_size();
        let floats = |pages: usize| pages * page / 4;
        let mut ws = Workspace::with_budget(Budget::Bytes(136 * page));
        let run = |ws: &mut Workspace, pages: &[usize]| {
            let bufs: Vec<Buffer> = pages.iter().map(|&p| ws.take(floats(p)).unwrap()).collect();
            for b in bufs {
                ws.give(b);
            }
            ws.finish_run(Budget::Unlimited);
        };
        run(&mut ws, &[80, 20]);
        run(&mut ws, &[48, 48]);
        assert_eq!(ws.resident, [80 * page, 48 * page]);
        for _ in 0..2 {
            run(&mut ws, &[200, 200]);
            let mut kept: Vec<usize> = ws.free.iter().map(|f| f.buf.bytes() / page).collect();
            kept.sort_unstable();
            assert_eq!(kept, [51, 85]);
            let settled = ws.stats();
            for _ in 0..2 {
                run(&mut ws, &[80, 20]);
                run(&mut ws, &[48, 48]);
            }
            assert_eq!(
                ws.stats(),
                settled,
                "narrow runs grow, map and return nothing"
            );
        }
        // With the 80 and 48 pages kept, 100 and 30 would make 148, past the budget, and they
        // are more than 128: the sizes stay. 60 and 60 are fewer: they replace them.
        run(&mut ws, &[100, 30]);
        assert_eq!(ws.resident, [80 * page, 48 * page]);
        run(&mut ws, &[60, 60]);
        assert_eq!(ws.resident, [60 * page, 60 * page]);
    }

    /// A wide run after narrow ones grows the buffers the budget kept instead of mapping new
    /// ones: it maps nothing, returns nothing, and finds the narrow run's floats where they
    /// were (the same pages, already resident), with zeros after them.
    #[test]
    fn a_wide_run_grows_the_buffers_kept_instead_of_mapping_new_ones() {
        let page = crate::exec::page_size();
        let floats = |pages: usize| pages * page / 4;
        let mut ws = Workspace::with_budget(Budget::Bytes(40 * page));
        let mut narrow = ws.take(floats(20)).unwrap();
        narrow.fill(3.0);
        ws.give(narrow);
        ws.finish_run(Budget::Unlimited);
        let before = ws.stats();
        assert_eq!(before.bytes, 20 * page);
        let wide = ws.take(floats(64)).unwrap();
        let after = ws.stats();
        assert_eq!(after.allocations, before.allocations, "no new mapping");
        assert_eq!(after.returned_bytes, before.returned_bytes);
        assert_eq!((after.bytes, after.peak_bytes), (64 * page, 64 * page));
        assert!(wide[..floats(20)].iter().all(|&x| x == 3.0));
        assert!(wide[floats(20)..].iter().all(|&x| x == 0.0));
        ws.give(wide);
        ws.finish_run(Budget::Unlimited);
        assert!(ws.stats().bytes <= 40 * page);
    }

    /// A run of empty buffers sets no sizes to keep (they would scale by a division by 0):
    /// the next run beyond the budget is shrunk alike.
    #[test]
    fn a_run_of_empty_buffers_sets_no_sizes() {
        let page = crate::exec::page_size();
        let mut ws = Workspace::with_budget(Budget::Bytes(8 * page));
        let empty = ws.take(0).unwrap();
        ws.give(empty);
        ws.finish_run(Budget::Unlimited);
        assert!(ws.resident.is_empty());
        let wide = ws.take(32 * page / 4).unwrap();
        ws.give(wide);
        ws.finish_run(Budget::Unlimited);
        assert!(ws.stats().bytes <= 8 * page);
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
