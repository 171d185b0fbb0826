//! Primitives: one compiled kernel for one key, owning its executable pages and knowing its cost.

use std::ops::Range;
use std::time::Duration;

use primjit_codegen::{BufferSpec, CompiledKernel, PrimitiveKey};

use crate::error::ExecError;
use crate::exec::{ExecutableCode, PageSource};

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

/// Buffers for one execution. Which of them a key needs is given by
/// [`PrimitiveKey::buffers`]: a conv takes packed `weights` (see
/// `primjit_codegen::ConvPlan::pack_weights`) and one `extra` residual per `add` post-op; an
/// element-wise add takes its second source as `extra[0]`.
#[derive(Debug)]
pub struct ExecArgs<'a> {
    pub src: &'a [f32],
    pub weights: Option<&'a [f32]>,
    pub dst: &'a mut [f32],
    pub extra: &'a [&'a [f32]],
}

/// One compiled kernel.
#[derive(Debug)]
pub struct Primitive {
    key: PrimitiveKey,
    code: ExecutableCode,
    buffers: Vec<BufferSpec>,
    compile_time: Duration,
    memory: PrimitiveMemory,
}

impl Primitive {
    /// Places a compiled kernel in executable pages.
    pub(crate) fn new(
        key: PrimitiveKey,
        kernel: &CompiledKernel,
        pages: &dyn PageSource,
    ) -> std::io::Result<Self> {
        let code = ExecutableCode::publish(&kernel.code, pages)?;
        let buffers = key.buffers();
        let mut primitive = Primitive {
            key,
            code,
            buffers,
            compile_time: kernel.compile_time,
            memory: PrimitiveMemory::default(),
        };
        primitive.memory = PrimitiveMemory {
            code: primitive.code.code_len(),
            mapped: primitive.code.mapped_len(),
            heap: primitive.heap_bytes(),
        };
        Ok(primitive)
    }

    fn heap_bytes(&self) -> usize {
        // The struct lives inside an `Arc` next to its two reference counts.
        let arc = std::mem::size_of::<Self>() + 2 * std::mem::size_of::<usize>();
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
        arc + key + buffers
    }

    pub fn key(&self) -> &PrimitiveKey {
        &self.key
    }

    pub fn memory(&self) -> PrimitiveMemory {
        self.memory
    }

    pub fn compile_time(&self) -> Duration {
        self.compile_time
    }

    /// The address range of the primitive's executable pages.
    pub fn code_range(&self) -> Range<usize> {
        self.code.address_range()
    }

    /// The buffers `execute` expects, in order: src, weights (conv only), dst, extras.
    pub fn buffers(&self) -> &[BufferSpec] {
        &self.buffers
    }

    /// Runs the kernel on one thread.
    pub fn execute(&self, args: ExecArgs<'_>) -> Result<(), ExecError> {
        self.execute_on(args, None)
    }

    /// Runs the kernel with its output rows split across the threads of `pool`.
    pub fn execute_parallel(
        &self,
        args: ExecArgs<'_>,
        pool: &rayon::ThreadPool,
    ) -> Result<(), ExecError> {
        self.execute_on(args, Some(pool))
    }

    /// Runs the kernel on one thread for the work items (output rows) in `items` only; the
    /// FMA peak kernel takes any number of loop trips this way.
    pub fn execute_range(&self, args: ExecArgs<'_>, items: Range<usize>) -> Result<(), ExecError> {
        let limit = match self.key {
            PrimitiveKey::FmaPeak => usize::MAX >> 1,
            _ => self.key.work_items(),
        };
        if items.start > items.end || items.end > limit {
            return Err(ExecError::WorkItems {
                key: self.key.to_string(),
                start: items.start,
                end: items.end,
                limit,
            });
        }
        let pointers = self.check(args)?;
        // SAFETY: `check` matched every buffer's length to the key and the borrows keep them
        // alive and unaliased for the call; the range is within the kernel's work items.
        unsafe { self.code.call(&pointers, items) };
        Ok(())
    }

    fn execute_on(
        &self,
        args: ExecArgs<'_>,
        pool: Option<&rayon::ThreadPool>,
    ) -> Result<(), ExecError> {
        let pointers = self.check(args)?;
        let rows = 0..self.key.work_items();
        match pool {
            // SAFETY: `check` matched every buffer's length to the key, the borrows keep them
            // alive and unaliased (only `dst` is mutable) for the call, and the chunks of rows
            // are disjoint.
            Some(pool) => unsafe {
                crate::exec::call_parallel(
                    &self.code,
                    &pointers,
                    rows,
                    pool,
                    pool.current_num_threads(),
                )
            },
            // SAFETY: as above, on one thread.
            None => unsafe { self.code.call(&pointers, rows) },
        }
        Ok(())
    }

    /// Checks the buffers against the key and lists their pointers in kernel order.
    fn check(&self, args: ExecArgs<'_>) -> Result<Vec<*mut f32>, ExecError> {
        let key = self.key.to_string();
        let mismatch = |spec: &BufferSpec, found: usize| ExecError::BufferLength {
            key: key.clone(),
            role: spec.role,
            expected: spec.len,
            found,
            shape: spec.shape.clone(),
        };
        let mut specs = self.buffers.iter();
        let mut pointers = Vec::with_capacity(self.buffers.len());
        let src = specs.next().expect("every key has a source");
        if args.src.len() != src.len {
            return Err(mismatch(src, args.src.len()));
        }
        pointers.push(args.src.as_ptr().cast_mut());
        if let PrimitiveKey::Conv(_) = self.key {
            let spec = specs.next().expect("convs take weights");
            let Some(w) = args.weights else {
                return Err(ExecError::MissingBuffer {
                    key,
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
                    key,
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
        let extras: Vec<&BufferSpec> = specs.collect();
        if args.extra.len() != extras.len() {
            return Err(ExecError::ExtraCount {
                key,
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
        Ok(pointers)
    }
}
