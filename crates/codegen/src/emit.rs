//! A thin layer over Cranelift's `FunctionBuilder`: addressing, vector helpers and loops.
//!
//! Every kernel has the signature `fn(buffers: *const *mut f32, begin: i64, end: i64)` in the
//! System V convention: `buffers` lists the source, weights, destination and extra buffers in
//! the order of [`crate::PrimitiveKey::buffers`]; `[begin, end)` is the range of work items
//! (output rows) this call computes, so that threads can split one execution.

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{
    AbiParam, BlockArg, Function, InstBuilder, MemFlagsData, Signature, UserFuncName, Value, types,
};
use cranelift_codegen::isa::{CallConv, TargetFrontendConfig};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};

/// Bytes per f32.
pub const F32_BYTES: i64 = 4;

pub fn kernel_signature() -> Signature {
    let mut sig = Signature::new(CallConv::SystemV);
    sig.params.extend([
        AbiParam::new(types::I64),
        AbiParam::new(types::I64),
        AbiParam::new(types::I64),
    ]);
    sig
}

/// The emitter: a function builder plus the kernel's entry values.
pub struct Emit<'a> {
    pub b: FunctionBuilder<'a>,
    pub use_fma: bool,
    flags: MemFlagsData,
    pub buffers: Value,
    pub begin: Value,
    pub end: Value,
}

impl<'a> Emit<'a> {
    pub fn new(func: &'a mut Function, ctx: &'a mut FunctionBuilderContext, use_fma: bool) -> Self {
        func.signature = kernel_signature();
        func.name = UserFuncName::user(0, 0);
        let mut b = FunctionBuilder::new(func, ctx);
        let entry = b.create_block();
        b.append_block_params_for_function_params(entry);
        b.switch_to_block(entry);
        let params = b.block_params(entry).to_vec();
        // Buffers are only as aligned as an f32, and every access is proven in bounds before
        // code generation, so loads and stores cannot trap.
        let flags = MemFlagsData::new().with_notrap();
        Emit {
            b,
            use_fma,
            flags,
            buffers: params[0],
            begin: params[1],
            end: params[2],
        }
    }

    pub fn finish(mut self, config: TargetFrontendConfig) {
        self.b.ins().return_(&[]);
        self.b.seal_all_blocks();
        self.b.finalize(config);
    }

    /// The pointer of buffer `index` in the argument list.
    pub fn buffer(&mut self, index: usize) -> Value {
        let off = i32::try_from(index * 8).expect("few buffers");
        self.b.ins().load(types::I64, self.flags, self.buffers, off)
    }

    pub fn iconst(&mut self, v: i64) -> Value {
        self.b.ins().iconst(types::I64, v)
    }

    /// `base + offset` bytes, folding a zero offset.
    pub fn offset(&mut self, base: Value, offset: i64) -> Value {
        if offset == 0 {
            base
        } else {
            self.b.ins().iadd_imm_s(base, offset)
        }
    }

    /// `base + index * scale + offset` bytes.
    pub fn scaled(&mut self, base: Value, index: Value, scale: i64, offset: i64) -> Value {
        let scaled = self.b.ins().imul_imm_s(index, scale);
        let sum = self.b.ins().iadd(base, scaled);
        self.offset(sum, offset)
    }

    /// Splits a byte offset into a base adjustment and a 32-bit immediate.
    fn address(&mut self, base: Value, offset: i64) -> (Value, i32) {
        match i32::try_from(offset) {
            Ok(imm) => (base, imm),
            Err(_) => (self.b.ins().iadd_imm_s(base, offset), 0),
        }
    }

    pub fn load_vec(&mut self, base: Value, offset: i64) -> Value {
        let (base, imm) = self.address(base, offset);
        self.b.ins().load(types::F32X4, self.flags, base, imm)
    }

    pub fn load_f32(&mut self, base: Value, offset: i64) -> Value {
        let (base, imm) = self.address(base, offset);
        self.b.ins().load(types::F32, self.flags, base, imm)
    }

    /// One scalar load broadcast to all lanes; x64 folds the pair into `vbroadcastss m32`.
    pub fn splat_load(&mut self, base: Value, offset: i64) -> Value {
        let x = self.load_f32(base, offset);
        self.b.ins().splat(types::F32X4, x)
    }

    pub fn store_vec(&mut self, v: Value, base: Value, offset: i64) {
        let (base, imm) = self.address(base, offset);
        self.b.ins().store(self.flags, v, base, imm);
    }

    pub fn store_f32(&mut self, x: Value, base: Value, offset: i64) {
        let (base, imm) = self.address(base, offset);
        self.b.ins().store(self.flags, x, base, imm);
    }

    /// Loads `lanes` scalars `lane_stride` bytes apart into the low lanes of a vector whose
    /// other lanes are `fill`.
    pub fn gather(
        &mut self,
        base: Value,
        offset: i64,
        lane_stride: i64,
        lanes: usize,
        fill: Value,
    ) -> Value {
        let mut v = fill;
        for l in 0..lanes {
            let x = self.load_f32(base, offset + l as i64 * lane_stride);
            v = self.b.ins().insertlane(v, x, l as u8);
        }
        v
    }

    /// Stores the low `lanes` lanes of `v`, `lane_stride` bytes apart.
    pub fn scatter(&mut self, v: Value, base: Value, offset: i64, lane_stride: i64, lanes: usize) {
        for l in 0..lanes {
            let x = self.b.ins().extractlane(v, l as u8);
            let (base, imm) = self.address(base, offset + l as i64 * lane_stride);
            self.b.ins().store(self.flags, x, base, imm);
        }
    }

    pub fn splat_const(&mut self, x: f32) -> Value {
        let c = self.b.ins().f32const(x);
        self.b.ins().splat(types::F32X4, c)
    }

    /// `a * b + c`: one `vfmadd` where the host has FMA.
    pub fn fma(&mut self, a: Value, b: Value, c: Value) -> Value {
        if self.use_fma {
            self.b.ins().fma(a, b, c)
        } else {
            let p = self.b.ins().fmul(a, b);
            self.b.ins().fadd(p, c)
        }
    }

    /// `x` if `y < x`, else `y`: the pattern x64 lowers to one `maxps`.
    pub fn pmax(&mut self, x: Value, y: Value) -> Value {
        let m = self.b.ins().fcmp(FloatCC::LessThan, y, x);
        let m = self.b.ins().bitcast(types::F32X4, MemFlagsData::new(), m);
        self.b.ins().bitselect(m, x, y)
    }

    /// `x` if `x < y`, else `y`: one `minps`.
    pub fn pmin(&mut self, x: Value, y: Value) -> Value {
        let m = self.b.ins().fcmp(FloatCC::LessThan, x, y);
        let m = self.b.ins().bitcast(types::F32X4, MemFlagsData::new(), m);
        self.b.ins().bitselect(m, x, y)
    }

    pub fn imax(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().smax(a, b)
    }

    pub fn imin(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().smin(a, b)
    }

    /// A loop over `i` in `[start, end)`, tested at the top, carrying `carried` through block
    /// parameters; `body` returns the carried values of the next iteration. Returns the values
    /// carried out of the loop.
    pub fn for_range(
        &mut self,
        start: Value,
        end: Value,
        carried: &[Value],
        mut body: impl FnMut(&mut Self, Value, &[Value]) -> Vec<Value>,
    ) -> Vec<Value> {
        let header = self.b.create_block();
        let body_block = self.b.create_block();
        let exit = self.b.create_block();
        self.b.append_block_param(header, types::I64);
        for &c in carried {
            let ty = self.b.func.dfg.value_type(c);
            self.b.append_block_param(header, ty);
        }
        let args: Vec<BlockArg> = std::iter::once(start)
            .chain(carried.iter().copied())
            .map(BlockArg::Value)
            .collect();
        self.b.ins().jump(header, &args);

        self.b.switch_to_block(header);
        let params = self.b.block_params(header).to_vec();
        let (i, state) = (params[0], &params[1..]);
        let more = self.b.ins().icmp(IntCC::SignedLessThan, i, end);
        self.b.ins().brif(more, body_block, &[], exit, &[]);

        self.b.switch_to_block(body_block);
        let next = body(self, i, state);
        debug_assert_eq!(next.len(), state.len());
        let i_next = self.b.ins().iadd_imm_s(i, 1);
        let args: Vec<BlockArg> = std::iter::once(i_next)
            .chain(next)
            .map(BlockArg::Value)
            .collect();
        self.b.ins().jump(header, &args);

        self.b.switch_to_block(exit);
        state.to_vec()
    }

    /// A loop with a trip count known at code-generation time; one trip is emitted inline.
    pub fn for_count(
        &mut self,
        count: usize,
        carried: &[Value],
        mut body: impl FnMut(&mut Self, Value, &[Value]) -> Vec<Value>,
    ) -> Vec<Value> {
        match count {
            0 => carried.to_vec(),
            1 => {
                let zero = self.iconst(0);
                body(self, zero, carried)
            }
            n => {
                let start = self.iconst(0);
                let end = self.iconst(n as i64);
                self.for_range(start, end, carried, body)
            }
        }
    }

    /// Pointers that advance by a fixed number of bytes per iteration of a counted loop.
    pub fn for_count_ptrs(
        &mut self,
        count: usize,
        ptrs: &[Value],
        steps: &[i64],
        mut body: impl FnMut(&mut Self, &[Value]),
    ) {
        self.for_count(count, ptrs, |e, _, p| {
            body(e, p);
            p.iter().zip(steps).map(|(&p, &s)| e.offset(p, s)).collect()
        });
    }

    /// Runs `body` only when `begin < end` for the runtime range of work items clamped to
    /// `[lo, hi)`, with the clamped bounds.
    pub fn clamp_items(&mut self, lo: usize, hi: usize) -> (Value, Value) {
        let lo_c = self.iconst(lo as i64);
        let hi_c = self.iconst(hi as i64);
        let start = self.imax(self.begin, lo_c);
        let end = self.imin(self.end, hi_c);
        (start, end)
    }
}

pub fn new_context() -> FunctionBuilderContext {
    FunctionBuilderContext::new()
}
