//! Primitives: one compiled kernel for one key, owning its executable pages and knowing its cost.

use std::ops::Range;
use std::time::Duration;

use primjit_codegen::{BufferSpec, CallExtents, CompiledKernel, PrimitiveKey};

use crate::error::ExecError;
use crate::exec::{ExecArgs, Kernel, PageSource, Residual};

/// The memory a primitive holds, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PrimitiveMemory {
    /// Machine code.
    pub code: usize,
    /// Executable pages mapped for the code (the code rounded up to whole pages).
    pub mapped: usize,
    /// The primitive's own heap allocations: its struct (inside its `Arc`) and the vectors it
    /// owns, counted by capacity. Allocator overhead is not counted.
    pub heap: usize,
}

impl PrimitiveMemory {
    /// What a primitive costs the process: mapped pages plus heap.
    pub fn total(&self) -> usize {
        self.mapped + self.heap
    }
}

/// One compiled kernel, its cost and its compile time.
#[derive(Debug)]
pub struct Primitive {
    kernel: Kernel,
    compile_time: Duration,
    memory: PrimitiveMemory,
}

impl Primitive {
    /// Places a compiled kernel in executable pages.
    pub(crate) fn new(compiled: &CompiledKernel, pages: &dyn PageSource) -> std::io::Result<Self> {
        let kernel = Kernel::publish(compiled, pages)?;
        let mut primitive = Primitive {
            kernel,
            compile_time: compiled.compile_time(),
            memory: PrimitiveMemory::default(),
        };
        primitive.memory = PrimitiveMemory {
            code: primitive.kernel.code().code_len(),
            mapped: primitive.kernel.code().mapped_len(),
            heap: primitive.heap_bytes(),
        };
        Ok(primitive)
    }

    fn heap_bytes(&self) -> usize {
        // The struct lives inside an `Arc` next to its two reference counts.
        std::mem::size_of::<Self>() + 2 * std::mem::size_of::<usize>() + self.kernel.heap_bytes()
    }

    pub fn key(&self) -> &PrimitiveKey {
        self.kernel.key()
    }

    pub fn memory(&self) -> PrimitiveMemory {
        self.memory
    }

    pub fn compile_time(&self) -> Duration {
        self.compile_time
    }

    /// The address range of the primitive's executable pages.
    pub fn code_range(&self) -> Range<usize> {
        self.kernel.code().address_range()
    }

    /// The buffers `execute` expects, in order: src, weights (conv only), dst, extras.
    pub fn buffers(&self) -> &[BufferSpec] {
        self.kernel.buffers()
    }

    /// Runs the kernel on one thread.
    pub fn execute(&self, args: ExecArgs<'_>) -> Result<(), ExecError> {
        self.kernel.run(args, None, None, None, Residual::Extra)
    }

    /// Runs a kernel with runtime extents (see `primjit_codegen::key::RuntimeDims`) on one
    /// thread, for input extents `[ih, iw]` (or a `CallExtents`, which a resize to runtime
    /// sizes needs); buffers are checked against the key at those extents.
    pub fn execute_at(
        &self,
        args: ExecArgs<'_>,
        extents: impl Into<CallExtents>,
    ) -> Result<(), ExecError> {
        self.kernel
            .run(args, Some(extents.into()), None, None, Residual::Extra)
    }

    /// Runs the kernel with its output rows split across the threads of `pool`; `extents`
    /// as in [`Self::execute_at`] (`Some([ih, iw].into())`), `None` for a fixed key.
    pub fn execute_parallel(
        &self,
        args: ExecArgs<'_>,
        extents: Option<CallExtents>,
        pool: &rayon::ThreadPool,
    ) -> Result<(), ExecError> {
        self.kernel
            .run(args, extents, None, Some(pool), Residual::Extra)
    }

    /// Runs the kernel on one thread for the work items in `items` only
    /// (`PrimitiveKey::work_items`: output rows for most kernels; a direct conv's items may
    /// span several rows, or be parts of its output channels, as `ConvPlan::item_outputs`
    /// says); the FMA peak kernel takes any number of loop trips this way.
    pub fn execute_range(
        &self,
        args: ExecArgs<'_>,
        extents: Option<[usize; 2]>,
        items: Range<usize>,
    ) -> Result<(), ExecError> {
        self.kernel.run(
            args,
            extents.map(CallExtents::from),
            Some(items),
            None,
            Residual::Extra,
        )
    }

    /// Whether the kernel may write its output over its residual
    /// ([`Primitive::execute_over_residual`]; `primjit_codegen::residual_in_place`).
    pub fn residual_in_place(&self) -> bool {
        self.kernel.residual_in_place()
    }

    /// Runs a conv whose destination holds its residual on entry, writing the output over it
    /// (`args.extra` empty); split across the threads of `pool` when one is given, `extents`
    /// as in [`Self::execute_parallel`]. A primitive that cannot do so
    /// ([`Self::residual_in_place`]) returns `ExecError::InPlace`.
    pub fn execute_over_residual(
        &self,
        args: ExecArgs<'_>,
        extents: Option<[usize; 2]>,
        pool: Option<&rayon::ThreadPool>,
    ) -> Result<(), ExecError> {
        self.kernel.run(
            args,
            extents.map(CallExtents::from),
            None,
            pool,
            Residual::InDestination,
        )
    }
}
