//! The one module with `unsafe` code: executable pages, calls into generated kernels, and
//! the few system calls the runtime makes of its own (page size, heap trimming, CPU affinity).
//!
//! Code is published once: mapped read+write, filled, then flipped to read+execute, never
//! writable and executable at once (W^X). The mapping lives exactly as long as its
//! [`ExecutableCode`] and is unmapped on drop (memmap2's `Mmap`).
//!
//! Kernels are called with pointers to buffers whose lengths the caller has checked against
//! the key; code generation guarantees that a kernel touches nothing outside them.
//! A call's buffers ([`ExecArgs`]) are defined here, beside the kernel signature that takes
//! them, so that primitives depend on this module and not the other way round.

use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
use std::io;
use std::ops::Range;

use memmap2::Mmap;
/// The writable mapping a [`PageSource`] returns, re-exported so that a page source can be
/// written without depending on memmap2 directly.
pub use memmap2::MmapMut;
use primjit_codegen::key::{EXTENT_ARGS, SCRATCH_ROLE};
use primjit_codegen::{BufferSpec, CallExtents, CompiledKernel, PrimitiveKey};

use crate::error::ExecError;

/// The signature of every generated kernel; see `primjit_codegen` (`backend/cranelift`).
type KernelFn = unsafe extern "C" fn(
    buffers: *const *mut f32,
    begin: i64,
    end: i64,
    extents: *const i64,
    prefetch: PrefetchFn,
);

/// The function a kernel calls to prefetch a range of one of its buffers.
type PrefetchFn = extern "C" fn(start: *const u8, bytes: i64);

/// Asks the caches for the `bytes` bytes at `start`, a 64-byte line at a time (a no-op for
/// `bytes <= 0`). Generated code calls it where Cranelift offers no prefetch instruction
/// (`Emit::prefetch` in `primjit_codegen`).
extern "C" fn prefetch_lines(start: *const u8, bytes: i64) {
    const LINE: usize = 64;
    let Ok(bytes) = usize::try_from(bytes) else {
        return;
    };
    for offset in (0..bytes).step_by(LINE) {
        let line = start.wrapping_add(offset).cast::<i8>();
        // SAFETY: a prefetch is a hint to the caches: it dereferences nothing, never faults,
        // whatever the address, and changes no memory or register that the program sees.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(line) };
    }
}

/// Where page mappings come from; a seam for fault injection in tests.
pub trait PageSource: Send + Sync {
    /// Maps `len` bytes of fresh, private, zeroed read+write memory.
    fn map(&self, len: usize) -> io::Result<MmapMut>;
}

/// Anonymous private mappings from the operating system.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemPages;

impl PageSource for SystemPages {
    fn map(&self, len: usize) -> io::Result<MmapMut> {
        MmapMut::map_anon(len)
    }
}

/// The host's page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions and only reads configuration.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size)
        .ok()
        .filter(|&s| s > 0)
        .unwrap_or(4096)
}

/// The CPU the calling thread runs on, where the system tells (Linux's `sched_getcpu`).
pub(crate) fn current_cpu() -> Option<usize> {
    #[cfg(target_os = "linux")]
    // SAFETY: sched_getcpu has no preconditions and only reads the calling thread's state.
    let cpu = unsafe { libc::sched_getcpu() };
    #[cfg(not(target_os = "linux"))]
    let cpu = -1;
    usize::try_from(cpu).ok()
}

/// The CPUs the calling thread may run on (its affinity mask), in ascending order.
#[cfg(target_os = "linux")]
pub(crate) fn allowed_cpus() -> io::Result<Vec<usize>> {
    let mask = affinity()?;
    // SAFETY: CPU_ISSET reads one bit of a mask the system filled, at an index below its size.
    Ok((0..libc::CPU_SETSIZE as usize)
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &mask) })
        .collect())
}

/// Moves the calling thread to `cpu`, one of its allowed CPUs, now, and leaves it free to run
/// on all of them again: the scheduler migrates a thread whose mask leaves out the CPU it is
/// on before the call returns, and widening the mask again moves nothing.
#[cfg(target_os = "linux")]
pub(crate) fn move_current_thread(cpu: usize) -> io::Result<()> {
    let allowed = affinity()?;
    // SAFETY: CPU_ISSET reads one bit of a mask the system filled, at an index checked below
    // its size.
    if cpu >= libc::CPU_SETSIZE as usize || !unsafe { libc::CPU_ISSET(cpu, &allowed) } {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("cpu {cpu} is not one the thread may run on"),
        ));
    }
    // SAFETY: an all-zero cpu_set_t is the empty mask (what CPU_ZERO writes); CPU_SET sets a
    // bit at an index checked above.
    let only = unsafe {
        let mut only: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut only);
        only
    };
    set_affinity(&only)?;
    set_affinity(&allowed)
}

/// The calling thread's affinity mask.
#[cfg(target_os = "linux")]
fn affinity() -> io::Result<libc::cpu_set_t> {
    // SAFETY: an all-zero cpu_set_t is a valid (empty) mask; sched_getaffinity writes at most
    // the size passed, the mask's own, for the calling thread (pid 0).
    unsafe {
        let mut mask: libc::cpu_set_t = std::mem::zeroed();
        match libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut mask) {
            0 => Ok(mask),
            _ => Err(io::Error::last_os_error()),
        }
    }
}

/// Sets the calling thread's affinity mask.
#[cfg(target_os = "linux")]
fn set_affinity(mask: &libc::cpu_set_t) -> io::Result<()> {
    // SAFETY: sched_setaffinity reads the mask's own size from a valid mask, for the calling
    // thread (pid 0).
    match unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), mask) } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// Elsewhere no mask is known.
#[cfg(not(target_os = "linux"))]
pub(crate) fn allowed_cpus() -> io::Result<Vec<usize>> {
    Err(io::ErrorKind::Unsupported.into())
}

/// Elsewhere a thread is not moved.
#[cfg(not(target_os = "linux"))]
pub(crate) fn move_current_thread(_cpu: usize) -> io::Result<()> {
    Err(io::ErrorKind::Unsupported.into())
}

/// Returns the free pages of the C heap (every malloc arena) to the operating system, where
/// the allocator is glibc's: compiling kernels allocates and frees megabytes, which glibc
/// otherwise keeps mapped, and resident, in the compiling thread's arena. Elsewhere a no-op.
pub(crate) fn return_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases memory the allocator holds free; it has no
    // preconditions and touches no live allocation.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Shrinks `map` in place to its first `len` bytes (a positive multiple of the page size, at
/// most its length) and returns the rest of its pages to the operating system; the first
/// `len` bytes keep their contents and their address.
pub fn shrink_mapping(map: &mut MmapMut, len: usize) -> io::Result<()> {
    if len == 0 || len > map.len() || !len.is_multiple_of(page_size()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("cannot shrink a mapping of {} bytes to {len}", map.len()),
        ));
    }
    // SAFETY: `remap`'s hazard is growing a file-backed mapping past its file's end; this only
    // shrinks (checked above), in place (no `may_move`), so every byte the mapping still covers
    // was mapped before, and the `&mut` borrow means no slice into the dropped tail is alive.
    unsafe { map.remap(len, memmap2::RemapOptions::new()) }
}

/// Grows `map`, an anonymous mapping (the workspace's buffers), to `len` bytes (a multiple
/// of the page size, at least its length), in place where the address space allows and
/// elsewhere by moving it: its pages keep their contents and stay resident, and the new ones
/// read as zero until written. Crate-private: a file-backed mapping grown past its file's
/// end would fault where it is read.
pub(crate) fn grow_mapping(map: &mut MmapMut, len: usize) -> io::Result<()> {
    if len < map.len() || !len.is_multiple_of(page_size()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("cannot grow a mapping of {} bytes to {len}", map.len()),
        ));
    }
    // SAFETY: `remap`'s hazard is growing a file-backed mapping past its file's end; every
    // caller (the workspace's `Buffer::grow_to`, this module's test) passes an anonymous
    // private mapping made by `MmapMut::map_anon`, whose new pages are zero-filled memory of
    // its own. Moving it is sound because the `&mut` borrow means no slice into the old
    // address is alive.
    unsafe { map.remap(len, memmap2::RemapOptions::new().may_move(true)) }
}

/// Machine code in pages this value alone owns, mapped read+execute.
#[derive(Debug)]
pub struct ExecutableCode {
    map: Mmap,
    code_len: usize,
}

impl ExecutableCode {
    /// Copies `code` into fresh pages from `pages` and makes them read+execute.
    ///
    /// `code` must be a complete, relocation-free kernel with the `KernelFn` signature,
    /// as `primjit_codegen::compile` produces; it is placed at the start of a page, which
    /// satisfies any alignment Cranelift asks for.
    pub fn publish(code: &[u8], pages: &dyn PageSource) -> io::Result<Self> {
        if code.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "no code to publish",
            ));
        }
        let len = code.len().div_ceil(page_size()) * page_size();
        let mut map = pages.map(len)?;
        map[..code.len()].copy_from_slice(code);
        // mprotect to read+execute: from here on the pages are never writable again.
        let map = map.make_exec()?;
        Ok(ExecutableCode {
            map,
            code_len: code.len(),
        })
    }

    pub fn code_len(&self) -> usize {
        self.code_len
    }

    pub fn mapped_len(&self) -> usize {
        self.map.len()
    }

    /// The address range of the mapping, to match against `/proc/self/maps`.
    pub fn address_range(&self) -> Range<usize> {
        let start = self.map.as_ptr() as usize;
        start..start + self.map.len()
    }

    /// Calls the kernel for work items `rows` with the given buffers and extents
    /// `[ih, iw, oh, ow, ph, pw]`.
    ///
    /// # Safety
    ///
    /// `extents` must be those of a valid fixed-shape key that the kernel implements (its own
    /// key, or a runtime key at these extents); `buffers` must hold, in that key's order,
    /// pointers to live, non-overlapping (except read-only ones among themselves, and a
    /// residual that is the destination itself when the key allows that:
    /// `primjit_codegen::residual_in_place`) f32 buffers of exactly the lengths it requires (a scratch: at least one band, of which the kernel
    /// uses the first), valid for the whole call, with no other thread writing to them; the
    /// rows of concurrent calls on the same destination must be disjoint, and their scratch
    /// bands too.
    unsafe fn call(&self, buffers: &[*mut f32], rows: Range<usize>, extents: &[i64; EXTENT_ARGS]) {
        // SAFETY: the caller's contract is this function's.
        unsafe { self.call_prefetching(buffers, rows, extents, prefetch_lines) }
    }

    /// [`ExecutableCode::call`], with the kernel's prefetches going to `prefetch`.
    ///
    /// # Safety
    ///
    /// As [`ExecutableCode::call`].
    unsafe fn call_prefetching(
        &self,
        buffers: &[*mut f32],
        rows: Range<usize>,
        extents: &[i64; EXTENT_ARGS],
        prefetch: PrefetchFn,
    ) {
        // SAFETY: the mapping holds a complete kernel with the `KernelFn` ABI, published
        // read+execute by `publish` and alive as long as `self`.
        let entry: KernelFn =
            unsafe { std::mem::transmute::<*const u8, KernelFn>(self.map.as_ptr()) };
        // SAFETY: the caller guarantees the buffers match the key; the kernel reads and writes
        // only inside them, for rows in `rows`; `prefetch` is a plain `extern "C"` function of
        // the kernel's prefetch signature, which it may call with any arguments.
        unsafe {
            entry(
                buffers.as_ptr(),
                rows.start as i64,
                rows.end as i64,
                extents.as_ptr(),
                prefetch,
            )
        }
    }
}

/// Buffers for one execution. Which of them a key needs is given by
/// [`PrimitiveKey::buffers`]: a conv takes packed `weights` (see
/// `primjit_codegen::ConvPlan::pack_weights`) and one `extra` residual per `add` post-op, and
/// a conv with a fused pool its `scratch`; an element-wise add takes its second source as
/// `extra[0]`.
#[derive(Debug)]
pub struct ExecArgs<'a> {
    pub src: &'a [f32],
    pub weights: Option<&'a [f32]>,
    pub dst: &'a mut [f32],
    pub extra: &'a [&'a [f32]],
    /// Working memory of a conv with a fused pool or Winograd's tiles (the `scratch` buffer of
    /// its key), `None` for every other primitive: a band of `ConvDesc::scratch_len` floats
    /// (of the call's key, at its extents) per thread; a call runs on at most as many threads
    /// as it holds whole bands, and floats past the last band are unused. Its contents before
    /// and after a call mean nothing.
    pub scratch: Option<&'a mut [f32]>,
}

/// A published kernel bound to the key it implements: the only way to run generated code.
///
/// It is made from a [`CompiledKernel`], which only `primjit_codegen::compile` produces and
/// which carries its key, so the code and the buffer checks always agree.
#[derive(Debug)]
pub struct Kernel {
    code: ExecutableCode,
    key: PrimitiveKey,
    buffers: Vec<BufferSpec>,
    /// The code may write its destination over its residual (`residual_in_place`).
    residual_in_place: bool,
    /// The work items of a call at the key's own extents, computed once: a Winograd key's,
    /// or a 1x1 conv's on one joined row, come from its plan.
    work_items: usize,
}

impl Kernel {
    /// Places the compiled code in fresh read+execute pages from `pages`.
    pub fn publish(compiled: &CompiledKernel, pages: &dyn PageSource) -> io::Result<Self> {
        let code = ExecutableCode::publish(compiled.code(), pages)?;
        let key = compiled.key().clone();
        let buffers = key.buffers();
        let residual_in_place = primjit_codegen::residual_in_place(&key);
        let work_items = key.work_items();
        Ok(Kernel {
            code,
            key,
            buffers,
            residual_in_place,
            work_items,
        })
    }

    /// Whether the kernel may write its output over its residual: [`Kernel::run`] then accepts
    /// [`Residual::InDestination`].
    pub fn residual_in_place(&self) -> bool {
        self.residual_in_place
    }

    pub fn key(&self) -> &PrimitiveKey {
        &self.key
    }

    pub fn code(&self) -> &ExecutableCode {
        &self.code
    }

    /// The buffers the kernel takes, in order: src, weights (convolutions only), dst, extras.
    pub fn buffers(&self) -> &[BufferSpec] {
        &self.buffers
    }

    /// Bytes of the heap this kernel owns (its vectors, by capacity), not counting itself.
    pub fn heap_bytes(&self) -> usize {
        let key = match &self.key {
            PrimitiveKey::Conv(d) => {
                d.post_ops.capacity() * std::mem::size_of::<primjit_codegen::PostOpDesc>()
            }
            _ => 0,
        };
        let buffers = self.buffers.capacity() * std::mem::size_of::<BufferSpec>()
            + self
                .buffers
                .iter()
                .map(|b| b.shape.capacity() * std::mem::size_of::<usize>())
                .sum::<usize>();
        key + buffers
    }

    /// Checks `args` against the key, then runs work items `items` (all of them when `None`),
    /// split across the threads of `pool` when one is given.
    ///
    /// A key with runtime extents needs the call's input extents `[ih, iw]`; the key at those
    /// extents is validated like any key before the kernel runs. A fixed key accepts only its
    /// own extents.
    ///
    /// With [`Residual::InDestination`], the destination holds the residual on entry (and
    /// `args.extra` is empty), and the kernel writes its output over it; only a kernel whose
    /// key allows it accepts that ([`Kernel::residual_in_place`]).
    pub fn run(
        &self,
        args: ExecArgs<'_>,
        extents: Option<CallExtents>,
        items: Option<Range<usize>>,
        pool: Option<&rayon::ThreadPool>,
        residual: Residual,
    ) -> Result<(), ExecError> {
        if residual == Residual::InDestination && !self.residual_in_place {
            return Err(ExecError::InPlace {
                key: self.key.to_string(),
            });
        }
        let call_key = self.key_at(extents)?;
        let key = call_key.as_ref().unwrap_or(&self.key);
        // The bounds the code relies on were proven when the key was validated before codegen
        // (or in `key_at`, for runtime extents); debug builds prove them again before each
        // call.
        debug_assert!(
            key.validate().is_ok(),
            "{key}: running a kernel whose key does not validate"
        );
        let all = match call_key {
            None => self.work_items,
            Some(_) => self.key.work_items_at(extents),
        };
        let items = Self::work_items(key, all, items)?;
        let (pointers, scratch) = match &call_key {
            Some(k) => pointers(k, &k.buffers(), args, residual)?,
            None => pointers(&self.key, &self.buffers, args, residual)?,
        };
        let extent_args = key.extent_args();
        let call = CallArgs {
            code: &self.code,
            buffers: &pointers,
            scratch,
            extents: &extent_args,
        };
        match pool {
            // SAFETY: `pointers` matched every buffer's length to `key`, which this code
            // implements (the kernel's own key, or its runtime key at validated extents that
            // `extent_args` passes); the borrows in `args` keep the buffers alive, and unaliased
            // except for the shared read-only ones, for the call (a residual in the
            // destination is its one `&mut` borrow, passed twice only to a kernel whose key
            // allows it, checked above); the chunks of rows are
            // disjoint and within the key's work items (the FMA peak kernel, whose trips
            // share the destination, is one chunk), and each has a band of the scratch of its
            // own (at most `scratch.bands` chunks).
            Some(pool) => unsafe {
                call_parallel(
                    call,
                    items,
                    pool,
                    // The FMA peak kernel's trips all accumulate into the one destination:
                    // they are not rows of it, and split across threads they raced on it.
                    if matches!(
                        key,
                        PrimitiveKey::FmaPeak(_) | PrimitiveKey::WidePeak { .. }
                    ) {
                        1
                    } else {
                        pool.current_num_threads()
                    },
                )
            },
            // SAFETY: as above, on one thread with the scratch's first band.
            None => unsafe { self.code.call(&pointers, items, &extent_args) },
        }
        Ok(())
    }

    /// The key of a call at `extents`: `None` where it is the kernel's own (a fixed key at
    /// its extents), the key at `extents`, validated, for a key with runtime extents, and an
    /// error for any other pairing.
    fn key_at(&self, extents: Option<CallExtents>) -> Result<Option<PrimitiveKey>, ExecError> {
        let runtime = self.key.runtime_dims().any();
        Ok(match (runtime, extents) {
            (false, None) => None,
            (false, Some(e)) if e.input == self.key.input_extents() => None,
            (_, Some(e)) if runtime => {
                let k = self.key.at(e);
                k.validate().map_err(|err| ExecError::Extents {
                    key: self.key.to_string(),
                    extents: e.input,
                    reason: err.reason,
                })?;
                Some(k)
            }
            (_, e) => {
                return Err(ExecError::Extents {
                    key: self.key.to_string(),
                    extents: e.map_or([0, 0], |e| e.input),
                    reason: if runtime {
                        "this primitive has runtime extents: pass the call's extents".into()
                    } else {
                        format!(
                            "this primitive is compiled for extents {:?}",
                            self.key.input_extents()
                        )
                    },
                });
            }
        })
    }

    /// The work items a call runs: `items`, or `all` (the call's, `work_items_at`) when
    /// `None` (one loop trip of the FMA peak kernel), checked to lie within them.
    fn work_items(
        key: &PrimitiveKey,
        all: usize,
        items: Option<Range<usize>>,
    ) -> Result<Range<usize>, ExecError> {
        let limit = match key {
            // The FMA peak kernel takes any number of loop trips.
            PrimitiveKey::FmaPeak(_) | PrimitiveKey::WidePeak { .. } => usize::MAX >> 1,
            _ => all,
        };
        // A whole execution is the call's work items (one loop trip of the FMA peak kernel).
        let items = items.unwrap_or(0..all);
        if items.start > items.end || items.end > limit {
            return Err(ExecError::WorkItems {
                key: key.to_string(),
                start: items.start,
                end: items.end,
                limit,
            });
        }
        Ok(items)
    }
}

/// Where a conv's residual is, for [`Kernel::run`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Residual {
    /// In `ExecArgs::extra`, as every other extra buffer (also: no residual at all).
    Extra,
    /// In the destination: the kernel writes its output over its one residual.
    InDestination,
}

/// Where the scratch of a conv with a fused pool sits among a call's pointers, and how it
/// divides into bands, one per thread.
#[derive(Clone, Copy, Debug)]
struct Scratch {
    index: usize,
    band_len: usize,
    bands: usize,
}

/// Checks the buffers against `specs` (of `key`) and lists their pointers in kernel order,
/// with where the scratch is, if the key takes one. With `Residual::InDestination`, the
/// residual's pointer is the destination's (the caller checked that the key allows it).
fn pointers(
    key: &PrimitiveKey,
    specs: &[BufferSpec],
    args: ExecArgs<'_>,
    residual: Residual,
) -> Result<(Vec<*mut f32>, Option<Scratch>), ExecError> {
    let key_name = key.to_string();
    let mismatch = |spec: &BufferSpec, found: usize| ExecError::BufferLength {
        key: key_name.clone(),
        role: spec.role,
        expected: spec.len,
        found,
        shape: spec.shape.clone(),
    };
    let n_specs = specs.len();
    let mut specs = specs.iter();
    let mut pointers = Vec::with_capacity(n_specs + 1);
    let src = specs.next().expect("every key has a source");
    if args.src.len() != src.len {
        return Err(mismatch(src, args.src.len()));
    }
    pointers.push(args.src.as_ptr().cast_mut());
    if let PrimitiveKey::Conv(_) | PrimitiveKey::ConvTranspose(_) = key {
        let spec = specs.next().expect("convs take weights");
        let Some(w) = args.weights else {
            return Err(ExecError::MissingBuffer {
                key: key_name,
                role: "weights",
            });
        };
        if w.len() != spec.len {
            return Err(mismatch(spec, w.len()));
        }
        pointers.push(w.as_ptr().cast_mut());
    } else {
        if args.weights.is_some() {
            return Err(ExecError::UnexpectedBuffer {
                key: key_name,
                role: "weights",
            });
        }
        // The kernel ABI keeps slot 1 for weights.
        pointers.push(std::ptr::null_mut());
    }
    let dst = specs.next().expect("every key has a destination");
    if args.dst.len() != dst.len {
        return Err(mismatch(dst, args.dst.len()));
    }
    pointers.push(args.dst.as_mut_ptr());
    let (mut extras, scratch_spec): (Vec<&BufferSpec>, Vec<&BufferSpec>) =
        specs.partition(|s| s.role != SCRATCH_ROLE);
    if residual == Residual::InDestination {
        // The residual is read where the destination is written: same shape, same length.
        let spec = extras
            .pop()
            .expect("a kernel that writes over its residual has one");
        debug_assert_eq!(spec.len, dst.len);
    }
    if args.extra.len() != extras.len() {
        return Err(ExecError::ExtraCount {
            key: key_name,
            expected: extras.len(),
            found: args.extra.len(),
        });
    }
    for (spec, buf) in extras.iter().zip(args.extra) {
        if buf.len() != spec.len {
            return Err(mismatch(spec, buf.len()));
        }
        pointers.push(buf.as_ptr().cast_mut());
    }
    if residual == Residual::InDestination {
        pointers.push(pointers[2]);
    }
    let scratch = match (scratch_spec.first(), args.scratch) {
        (None, None) => None,
        (None, Some(_)) => {
            return Err(ExecError::UnexpectedBuffer {
                key: key_name,
                role: SCRATCH_ROLE,
            });
        }
        (Some(_), None) => {
            return Err(ExecError::MissingBuffer {
                key: key_name,
                role: SCRATCH_ROLE,
            });
        }
        (Some(spec), Some(buf)) => {
            // Whole bands, one per thread that runs the call; what is left past them is
            // unused (a scratch sized for a runtime key's largest call serves every call).
            if spec.len == 0 || buf.len() < spec.len {
                return Err(ExecError::ScratchLength {
                    key: key_name,
                    per_thread: spec.len,
                    found: buf.len(),
                });
            }
            pointers.push(buf.as_mut_ptr());
            Some(Scratch {
                index: pointers.len() - 1,
                band_len: spec.len,
                bands: buf.len() / spec.len,
            })
        }
    };
    Ok((pointers, scratch))
}

/// Buffer pointers that may be sent to the threads of one call.
#[derive(Clone, Copy)]
struct SharedBuffers<'a>(&'a [*mut f32]);

// SAFETY: the pointers are only dereferenced by kernels that write disjoint rows of the
// destination and read the other buffers; `ExecutableCode::call`'s contract is upheld by the
// caller of `call_parallel`.
unsafe impl Send for SharedBuffers<'_> {}
// SAFETY: as above; the slice of pointers itself is never written.
unsafe impl Sync for SharedBuffers<'_> {}

/// One call's code and its arguments, checked against its key: what [`call_parallel`] hands
/// each chunk of rows.
#[derive(Clone, Copy)]
struct CallArgs<'a> {
    code: &'a ExecutableCode,
    /// The buffers' pointers in kernel order.
    buffers: &'a [*mut f32],
    /// Where the scratch sits among `buffers`, if the key takes one.
    scratch: Option<Scratch>,
    extents: &'a [i64; EXTENT_ARGS],
}

/// Splits `rows` into `chunks` contiguous ranges (at most one per band of the scratch) and
/// runs them on `pool`.
///
/// # Safety
///
/// As [`ExecutableCode::call`], for `call`'s buffers over the whole of `rows`; `call.scratch`
/// describes the scratch buffer among them, if there is one.
unsafe fn call_parallel(
    call: CallArgs<'_>,
    rows: Range<usize>,
    pool: &rayon::ThreadPool,
    chunks: usize,
) {
    let CallArgs {
        code,
        buffers,
        scratch,
        extents,
    } = call;
    let n = rows.len();
    let bands = scratch.map_or(usize::MAX, |s| s.bands);
    let chunks = chunks.min(bands).clamp(1, n.max(1));
    if chunks == 1 {
        // SAFETY: forwarded from the caller.
        unsafe { code.call(buffers, rows, extents) };
        return;
    }
    let shared = SharedBuffers(buffers);
    pool.scope(|s| {
        for i in 0..chunks {
            // In u128: `n` times a chunk index must not wrap for any range the kernel takes.
            let bound = |i: usize| rows.start + (n as u128 * i as u128 / chunks as u128) as usize;
            let range = bound(i)..bound(i + 1);
            s.spawn(move |_| {
                let shared = shared;
                let Some(scratch) = scratch else {
                    // SAFETY: chunks cover disjoint rows; the caller guarantees the rest.
                    unsafe { code.call(shared.0, range, extents) };
                    return;
                };
                let mut own = shared.0.to_vec();
                // Band `i` of the scratch: `i < bands`, so it lies inside the buffer.
                own[scratch.index] = own[scratch.index].wrapping_add(i * scratch.band_len);
                // SAFETY: chunks cover disjoint rows and write disjoint bands of the scratch;
                // the caller guarantees the rest.
                unsafe { code.call(&own, range, extents) };
            });
        }
    });
}

/// An f32 buffer whose last element ends exactly at an inaccessible (`PROT_NONE`) page, so
/// that any read or write past its end faults at once. Tests and fuzzers run kernels on these.
pub struct GuardedBuffer {
    map: MmapMut,
    offset: usize,
    len: usize,
}

impl GuardedBuffer {
    /// A zeroed buffer of `len` floats followed by a guard page.
    pub fn new(len: usize) -> io::Result<Self> {
        let page = page_size();
        // Checked: a wrapped size would map less than the `len` floats `as_slice` hands out.
        let too_large = || {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a guarded buffer of {len} floats does not fit the address space"),
            )
        };
        let bytes = len
            .checked_mul(std::mem::size_of::<f32>())
            .ok_or_else(too_large)?;
        let data_pages = bytes.div_ceil(page).max(1);
        let mapped = data_pages
            .checked_add(1)
            .and_then(|p| p.checked_mul(page))
            .ok_or_else(too_large)?;
        let mut map = MmapMut::map_anon(mapped)?;
        let guard = map.as_mut_ptr().wrapping_add(data_pages * page);
        // SAFETY: `guard` is the page-aligned start of the mapping's last page, which this
        // value owns; making it inaccessible affects nothing else.
        let rc = unsafe { libc::mprotect(guard.cast(), page, libc::PROT_NONE) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(GuardedBuffer {
            map,
            offset: data_pages * page - bytes,
            len,
        })
    }

    /// A guarded copy of `data`.
    pub fn from_slice(data: &[f32]) -> io::Result<Self> {
        let mut b = Self::new(data.len())?;
        b.as_mut_slice().copy_from_slice(data);
        Ok(b)
    }

    pub fn as_slice(&self) -> &[f32] {
        // SAFETY: the range lies in the readable part of the mapping, which `self` owns; the
        // offset keeps f32 alignment (page start plus a multiple of 4); zeroed bytes are
        // valid f32s.
        unsafe {
            std::slice::from_raw_parts(self.map.as_ptr().add(self.offset).cast::<f32>(), self.len)
        }
    }

    pub fn as_mut_slice(&mut self) -> &mut [f32] {
        // SAFETY: as in `as_slice`, with unique access through `&mut self`.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.map.as_mut_ptr().add(self.offset).cast::<f32>(),
                self.len,
            )
        }
    }
}

/// Packed weights in an anonymous mapping of their own, advised to use transparent huge pages
/// where the system allows (`madvise` mode).
///
/// Winograd's transformed weights of a 256-channel layer take 9.4 MB, beyond L2, and stream
/// through the GEMMs once per block of tiles; with 4 KiB pages the hardware prefetchers stop
/// at every page boundary (docs/perf/2026-12-dev-vm.md). Whole huge pages need a 2 MiB
/// aligned range, which Linux gives anonymous mappings of 2 MiB and more.
pub struct WeightBuffer {
    map: MmapMut,
    len: usize,
}

impl WeightBuffer {
    /// A copy of `data` in fresh pages.
    pub fn from_slice(data: &[f32]) -> io::Result<Self> {
        let bytes = std::mem::size_of_val(data);
        let map = MmapMut::map_anon(bytes.max(1))?;
        // Only advice: without huge pages the weights are the same, only slower to stream.
        #[cfg(target_os = "linux")]
        let _ = map.advise(memmap2::Advice::HugePage);
        let mut buf = WeightBuffer { map, len: 0 };
        buf.len = data.len();
        buf.as_mut_slice().copy_from_slice(data);
        Ok(buf)
    }

    pub fn as_slice(&self) -> &[f32] {
        // SAFETY: the mapping holds at least `len` floats (it was made for them), is
        // page-aligned (so f32-aligned) and owned by `self`; zeroed or copied bytes are valid
        // f32s.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().cast::<f32>(), self.len) }
    }

    fn as_mut_slice(&mut self) -> &mut [f32] {
        // SAFETY: as in `as_slice`, with unique access through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.map.as_mut_ptr().cast::<f32>(), self.len) }
    }

    /// Bytes mapped for the weights.
    pub fn mapped_bytes(&self) -> usize {
        self.map.len()
    }
}

impl std::fmt::Debug for WeightBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WeightBuffer({} floats)", self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread moved to each of its CPUs in turn runs there (the scheduler may move it on
    /// at once, so each move gets a few tries), and keeps its whole affinity mask; a CPU
    /// outside the mask is refused, and the mask is unchanged.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_thread_moves_to_each_allowed_cpu_and_keeps_its_mask() {
        let allowed = allowed_cpus().unwrap();
        assert!(!allowed.is_empty());
        for &cpu in &allowed {
            let arrived = (0..20).any(|_| {
                move_current_thread(cpu).unwrap();
                current_cpu() == Some(cpu)
            });
            assert!(arrived, "never ran on cpu {cpu} of {allowed:?}");
            assert_eq!(allowed_cpus().unwrap(), allowed);
        }
        let outside = (0..=libc::CPU_SETSIZE as usize)
            .find(|cpu| !allowed.contains(cpu))
            .unwrap();
        for cpu in [outside, libc::CPU_SETSIZE as usize, usize::MAX] {
            let e = move_current_thread(cpu).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{cpu}");
            assert_eq!(
                e.to_string(),
                format!("cpu {cpu} is not one the thread may run on")
            );
        }
        assert_eq!(allowed_cpus().unwrap(), allowed);
    }

    #[test]
    fn weight_buffers_hold_their_floats() {
        let data: Vec<f32> = (0..1_000_000).map(|i| i as f32 * 0.5).collect();
        let buf = WeightBuffer::from_slice(&data).unwrap();
        assert_eq!(buf.as_slice(), &data[..]);
        assert!(buf.mapped_bytes() >= 4_000_000);
        assert!(WeightBuffer::from_slice(&[]).unwrap().as_slice().is_empty());
    }

    /// A length whose bytes overflow is refused: wrapped, it mapped a page and handed out a
    /// slice of `len` floats over it.
    #[test]
    fn guarded_buffers_too_large_for_the_address_space_are_refused() {
        for len in [usize::MAX / 4 + 1, usize::MAX, usize::MAX / 4 - 1] {
            let e = GuardedBuffer::new(len).err().expect("refused");
            assert!(
                matches!(
                    e.kind(),
                    io::ErrorKind::InvalidInput | io::ErrorKind::OutOfMemory
                ),
                "{len}: {e}"
            );
        }
        let b = GuardedBuffer::new(3).unwrap();
        assert_eq!(b.as_slice(), &[0.0; 3]);
    }

    /// Growing keeps a mapping's bytes (wherever it now lies) and zero-fills the new pages;
    /// a length below its own or not in whole pages is refused, and the mapping is unchanged.
    #[test]
    fn grown_mappings_keep_their_bytes_and_read_zero_beyond() {
        let page = page_size();
        let mut map = MmapMut::map_anon(2 * page).unwrap();
        for (i, b) in map.iter_mut().enumerate() {
            *b = (i % 251) as u8 + 1;
        }
        assert!(grow_mapping(&mut map, page).is_err());
        assert!(grow_mapping(&mut map, 3 * page + 1).is_err());
        assert_eq!(map.len(), 2 * page);
        grow_mapping(&mut map, 64 * page).unwrap();
        assert_eq!(map.len(), 64 * page);
        assert!(
            map[..2 * page]
                .iter()
                .enumerate()
                .all(|(i, &b)| b == (i % 251) as u8 + 1)
        );
        assert!(map[2 * page..].iter().all(|&b| b == 0));
        map[64 * page - 1] = 7;
        grow_mapping(&mut map, 64 * page).unwrap();
        assert_eq!(map[64 * page - 1], 7);
    }

    /// The FMA peak kernel's trips share their destination: asked for many trips with a
    /// pool, it runs them on one thread (split across four, the threads' stores raced and the
    /// sums differed from run to run), so every run gives the one-thread sums.
    #[test]
    fn fma_peak_trips_are_not_split_across_threads() {
        use primjit_codegen::{CodegenOptions, Dumps, FmaPattern, compile};
        let key = PrimitiveKey::FmaPeak(FmaPattern::Registers);
        let compiled = compile(&key, CodegenOptions::default(), Dumps::default()).unwrap();
        let kernel = Kernel::publish(&compiled, &SystemPages).unwrap();
        let specs = key.buffers();
        let src = vec![1.0f32; specs[0].len];
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(4)
            .build()
            .unwrap();
        let run = |pool: Option<&rayon::ThreadPool>| {
            let mut dst = vec![0.0f32; specs[1].len];
            let args = ExecArgs {
                src: &src,
                weights: None,
                dst: &mut dst,
                extra: &[],
                scratch: None,
            };
            kernel
                .run(args, None, Some(0..20_000), pool, Residual::Extra)
                .unwrap();
            dst
        };
        let alone = run(None);
        assert!(alone.iter().all(|&x| x > 0.0), "{alone:?}");
        for _ in 0..20 {
            assert_eq!(run(Some(&pool)), alone);
        }
    }

    /// A streamed Winograd kernel prefetches only bytes of its weights, each panel it reads
    /// but a work item's first, once, a slice per group of tiles, and its results do not
    /// depend on the prefetches.
    #[test]
    fn winograd_prefetches_stay_inside_the_weights() {
        use primjit_codegen::{CodegenOptions, ConvAlgo, ConvDesc, Dumps, Layout, compile};
        use primjit_ir::Pads;
        use std::sync::Mutex;

        static RANGES: Mutex<Vec<(usize, i64)>> = Mutex::new(Vec::new());
        extern "C" fn record(start: *const u8, bytes: i64) {
            RANGES.lock().unwrap().push((start as usize, bytes));
        }

        // 128 channels: 2.4 MB of transformed weights, streamed; two chunks of 16 vectors,
        // 8 pairs of 2 KB panels each (4 KB a pair) at each of the 36 points. 3 x 6 tiles
        // make one block of 4 groups, which ask for a quarter of the next pair's 4 KB each.
        let (channels, points, pair_bytes, pairs, slice) = (128, 36, 4096, 8, 1024);
        let mut d = ConvDesc::new(1, channels, [9, 23], channels, [3, 3]);
        d.pads = Pads::uniform(1);
        d.bias = true;
        d.src_layout = Layout::Nchw4c;
        d.dst_layout = Layout::Nchw4c;
        d.algo = ConvAlgo::WinogradF4x3;
        let key = PrimitiveKey::Conv(d.clone());
        let compiled = compile(&key, CodegenOptions::default(), Dumps::default()).unwrap();
        let kernel = Kernel::publish(&compiled, &SystemPages).unwrap();
        let specs = key.buffers();
        let src: Vec<f32> = (0..specs[0].len).map(|i| (i % 7) as f32 - 3.0).collect();
        let weight_count = channels * channels * 9;
        let w: Vec<f32> = (0..weight_count).map(|i| (i % 5) as f32 * 0.1).collect();
        let bias = vec![0.5; channels];
        let weights = d.pack_weights(&w, Some(&bias), None);
        let mut scratch = vec![0.0; d.scratch_len()];
        let run = |prefetch: Option<PrefetchFn>, scratch: &mut [f32]| {
            let mut dst = vec![0.0; specs[2].len];
            let args = ExecArgs {
                src: &src,
                weights: Some(&weights),
                dst: &mut dst,
                extra: &[],
                scratch: Some(scratch),
            };
            let (ptrs, _) = pointers(&key, &specs, args, Residual::Extra).unwrap();
            let items = 0..key.work_items();
            // SAFETY: `pointers` checked every buffer against the key the kernel implements;
            // they live through the call, on this thread alone, with one band of scratch.
            unsafe {
                match prefetch {
                    Some(p) => kernel
                        .code
                        .call_prefetching(&ptrs, items, &key.extent_args(), p),
                    None => kernel.code.call(&ptrs, items, &key.extent_args()),
                }
            }
            dst
        };
        RANGES.lock().unwrap().clear();
        let recorded = run(Some(record), &mut scratch);
        assert_eq!(recorded, run(None, &mut scratch));
        let ranges = RANGES.lock().unwrap().clone();

        let items = key.work_items();
        let lo = weights.as_ptr() as usize;
        let hi = lo + weights.len() * 4;
        for &(start, bytes) in &ranges {
            assert!(
                bytes > 0 && bytes <= slice && start >= lo && start + bytes as usize <= hi,
                "prefetch of {bytes} bytes at {start:#x}: not a slice of the weights \
                 {lo:#x}..{hi:#x}"
            );
        }
        // Each work item reads its chunk's 8 panels at each point and asks for all of them
        // but its first, in four slices each; its last panel asks for nothing (no next point).
        let total: i64 = ranges.iter().map(|&(_, b)| b).sum();
        let asked = items * (points * pairs - 1);
        assert_eq!(total as usize, asked * pair_bytes);
        assert_eq!(ranges.len(), asked * (pair_bytes / slice as usize));
    }

    #[test]
    fn published_pages_are_not_writable() {
        let code = [0xc3u8]; // ret
        let exec = ExecutableCode::publish(&code, &SystemPages).unwrap();
        assert_eq!(exec.code_len(), 1);
        assert_eq!(exec.mapped_len(), page_size());
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let start = format!("{:x}-", exec.address_range().start);
        let line = maps
            .lines()
            .find(|l| l.starts_with(&start))
            .expect("mapping listed");
        assert!(
            line.split_whitespace().nth(1).unwrap().starts_with("r-x"),
            "{line}"
        );
        // SAFETY: `ret` ignores its arguments.
        unsafe { exec.call(&[], 0..0, &[0; EXTENT_ARGS]) };
    }
}
