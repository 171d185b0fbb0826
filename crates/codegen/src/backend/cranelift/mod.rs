//! The Cranelift backend: `Emit`, the vocabulary the lowerings build loop nests with
//! (addressing, vector helpers, loops; one method per instruction in `ops`) over a private
//! `FunctionBuilder`, and `machine`, which compiles the function for the host.
//!
//! Every kernel has the signature
//! `fn(buffers: *const *mut f32, begin: i64, end: i64, extents: *const i64, prefetch: fn)` in
//! the System V convention: `buffers` lists the source, weights, destination and extra buffers
//! in the order of [`crate::PrimitiveKey::buffers`]; `[begin, end)` is the range of work items
//! (output rows) this call computes, so that threads can split one execution; `extents` points
//! to the call's spatial extents `[ih, iw, oh, ow, ph, pw]` (the last two: a fused pool's
//! output), which only kernels with runtime extents read; `prefetch` is the runtime's
//! `extern "C" fn(start: *const u8, bytes: i64)`, which asks the caches for those bytes (see
//! [`Emit::prefetch`]).

use cranelift_codegen::ir::{
    AbiParam, BlockArg, ConstantData, Endianness, ExtFuncData, ExternalName, FuncRef, Function,
    InstBuilder, MemFlagsData, SigRef, Signature, StackSlotData, StackSlotKind, UserExternalName,
    UserFuncName, types,
};

use crate::backend::x64::WideTile;

mod machine;
mod ops;

pub use machine::HostIsa;
pub(crate) use machine::{Failure, Lowered, MachineCode};

pub use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
pub use cranelift_codegen::ir::{StackSlot, Value};
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
        AbiParam::new(types::I64),
        AbiParam::new(types::I64),
    ]);
    sig
}

/// The signature of the runtime's prefetch function: `extern "C" fn(start: *const u8, bytes:
/// i64)`.
fn prefetch_signature() -> Signature {
    let mut sig = Signature::new(CallConv::SystemV);
    sig.params
        .extend([AbiParam::new(types::I64), AbiParam::new(types::I64)]);
    sig
}

/// Strides of an activation buffer in elements, each known at code generation or only at
/// run time (when its extents are runtime values).
#[derive(Clone, Copy, Debug)]
pub struct ActStrides {
    pub image: Scalar,
    /// From one channel to the next within a block of four (1 in `nChw4c`, a plane in NCHW).
    pub channel: Scalar,
    /// From one block of four channels to the next.
    pub block: Scalar,
    pub row: Scalar,
    pub pixel: i64,
}

/// The pixels from one row of a buffer to the next: its `pitch` ([`crate::Pitches`]) where it
/// has one, else its width `w`.
pub fn row_pixels(pitch: Option<usize>, w: Scalar) -> Scalar {
    pitch.map_or(w, |p| Scalar::Const(p as i64))
}

/// The emitter: a function builder plus the kernel's entry values.
pub struct Emit<'a> {
    b: FunctionBuilder<'a>,
    pub use_fma: bool,
    /// Whether kernels may prefetch streamed weights (`CodegenOptions::prefetch_weights`).
    pub prefetch_weights: bool,
    flags: MemFlagsData,
    pub buffers: Value,
    pub begin: Value,
    pub end: Value,
    extents: Value,
    prefetch: Value,
    /// The prefetch function's signature, imported at its first call.
    prefetch_sig: Option<SigRef>,
    /// The wide register tiles the kernel calls, each once, in the order of their names
    /// (`UserExternalName { namespace: TILE_NAMESPACE, index }`), with their imports.
    pub tiles: Vec<(WideTile, FuncRef)>,
}

/// The namespace of the wide tiles' names in a kernel's calls: `compile` places tile `index`
/// after the Cranelift code and resolves each call to it.
pub const TILE_NAMESPACE: u32 = 1;

/// Index of each extent in the kernel's `extents` argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExtentArg {
    InputH = 0,
    InputW = 1,
    OutputH = 2,
    OutputW = 3,
    /// A fused pool's output.
    PooledH = 4,
    PooledW = 5,
}

/// An integer known either when the code is generated or only when it runs.
#[derive(Clone, Copy, Debug)]
pub enum Scalar {
    Const(i64),
    Dyn(Value),
}

impl<'a> Emit<'a> {
    pub fn new(
        func: &'a mut Function,
        ctx: &'a mut FunctionBuilderContext,
        use_fma: bool,
        prefetch_weights: bool,
    ) -> Self {
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
            prefetch_weights,
            flags,
            buffers: params[0],
            begin: params[1],
            end: params[2],
            extents: params[3],
            prefetch: params[4],
            prefetch_sig: None,
            tiles: Vec::new(),
        }
    }

    /// Ends the function and returns the wide tiles it calls, in the order of their names.
    pub fn finish(mut self, config: TargetFrontendConfig) -> Vec<WideTile> {
        self.b.ins().return_(&[]);
        self.b.seal_all_blocks();
        self.b.finalize(config);
        self.tiles.into_iter().map(|(t, _)| t).collect()
    }

    /// Runs `body` as if the kernel had been called with the buffer list `buffers`, the work
    /// items `[begin, end)` and its extents `extents_skip` entries further on: a fused kernel
    /// emits the lowering of each of its stages this way. The call's own arguments come back
    /// afterwards.
    pub fn with_args(
        &mut self,
        buffers: &[Value],
        [begin, end]: [Value; 2],
        extents_skip: usize,
        body: impl FnOnce(&mut Self),
    ) {
        let bytes = u32::try_from(buffers.len() * 8).expect("few buffers");
        let slot = self.b.create_sized_stack_slot(StackSlotData::new(
            StackSlotKind::ExplicitSlot,
            bytes,
            3,
        ));
        for (i, &ptr) in buffers.iter().enumerate() {
            self.b
                .ins()
                .stack_store(types::I64, ptr, slot, i as i32 * 8);
        }
        let table = self.b.ins().stack_addr(types::I64, slot, 0);
        let extents = self.offset(self.extents, extents_skip as i64 * 8);
        let saved = (self.buffers, self.begin, self.end, self.extents);
        (self.buffers, self.begin, self.end, self.extents) = (table, begin, end, extents);
        body(self);
        (self.buffers, self.begin, self.end, self.extents) = saved;
    }

    /// Asks the caches for the `bytes` bytes at `start` through the runtime's prefetch
    /// function, a call whose only effect is on the caches' contents.
    ///
    /// Cranelift has no prefetch instruction (wasmtime issue 13075), and a plain load of a
    /// line that misses to memory holds up retirement until the line arrives. A call
    /// clobbers the caller-saved registers, every vector register among them, so it belongs
    /// where no vector is live: between register tiles. Every byte of the range must lie in
    /// one of the call's buffers, as if the kernel read it.
    pub fn prefetch(&mut self, start: Value, bytes: Value) {
        let sig = match self.prefetch_sig {
            Some(sig) => sig,
            None => {
                let sig = self.b.import_signature(prefetch_signature());
                self.prefetch_sig = Some(sig);
                sig
            }
        };
        self.b
            .ins()
            .call_indirect(sig, self.prefetch, &[start, bytes]);
    }

    /// Calls the wide register tile `tile` with `args` (see each [`WideTile`] for their order),
    /// importing it at its first call. A call clobbers every vector register, so no vector
    /// may be live across it, as for [`Self::prefetch`].
    pub fn call_tile(&mut self, tile: WideTile, args: &[Value]) {
        let func = match self.tiles.iter().find(|(t, _)| *t == tile) {
            Some((_, f)) => *f,
            None => {
                let mut sig = Signature::new(CallConv::SystemV);
                sig.params
                    .extend(args.iter().map(|_| AbiParam::new(types::I64)));
                let signature = self.b.import_signature(sig);
                let index = u32::try_from(self.tiles.len()).expect("few tiles");
                let name = self
                    .b
                    .func
                    .declare_imported_user_function(UserExternalName::new(TILE_NAMESPACE, index));
                let f = self.b.import_function(ExtFuncData {
                    name: ExternalName::user(name),
                    signature,
                    // In the same bytes as the kernel: a 32-bit relative call reaches it.
                    colocated: true,
                    patchable: false,
                });
                self.tiles.push((tile, f));
                f
            }
        };
        self.b.ins().call(func, args);
    }

    /// The pointer of buffer `index` in the argument list.
    pub fn buffer(&mut self, index: usize) -> Value {
        let off = i32::try_from(index * 8).expect("few buffers");
        self.b.ins().load(types::I64, self.flags, self.buffers, off)
    }

    /// An extent as a scalar: a fresh load of the call's value when it is a runtime extent,
    /// the constant `fixed` otherwise.
    pub fn extent_or(&mut self, runtime: bool, which: ExtentArg, fixed: usize) -> Scalar {
        if runtime {
            Scalar::Dyn(self.extent(which))
        } else {
            Scalar::Const(fixed as i64)
        }
    }

    /// One of the call's spatial extents, as passed by the runtime.
    pub fn extent(&mut self, which: ExtentArg) -> Value {
        self.b
            .ins()
            .load(types::I64, self.flags, self.extents, which as i32 * 8)
    }

    /// `a * b`, folded when both are constants.
    pub fn product(&mut self, a: Scalar, b: Scalar) -> Scalar {
        match (a, b) {
            (Scalar::Const(a), Scalar::Const(b)) => Scalar::Const(a * b),
            _ => {
                let (a, b) = (self.value(a), self.value(b));
                Scalar::Dyn(self.b.ins().imul(a, b))
            }
        }
    }

    /// `s * k`, folded when `s` is a constant.
    pub fn mul(&mut self, s: Scalar, k: i64) -> Scalar {
        match (s, k) {
            (Scalar::Const(c), _) => Scalar::Const(c * k),
            (_, 0) => Scalar::Const(0),
            (Scalar::Dyn(v), 1) => Scalar::Dyn(v),
            (Scalar::Dyn(v), _) => Scalar::Dyn(self.b.ins().imul_imm_s(v, k)),
        }
    }

    /// `s + k`, folded when `s` is a constant.
    pub fn add(&mut self, s: Scalar, k: i64) -> Scalar {
        match s {
            Scalar::Const(c) => Scalar::Const(c + k),
            Scalar::Dyn(v) => Scalar::Dyn(self.offset(v, k)),
        }
    }

    /// The value of `s` in a register.
    pub fn value(&mut self, s: Scalar) -> Value {
        match s {
            Scalar::Const(c) => self.iconst(c),
            Scalar::Dyn(v) => v,
        }
    }

    /// `base + s * k` bytes.
    pub fn offset_by(&mut self, base: Value, s: Scalar, k: i64) -> Value {
        if k == 0 {
            return base;
        }
        match s {
            Scalar::Const(c) => self.offset(base, c * k),
            Scalar::Dyn(v) => {
                let scaled = if k == 1 {
                    v
                } else {
                    self.b.ins().imul_imm_s(v, k)
                };
                self.b.ins().iadd(base, scaled)
            }
        }
    }

    /// `base + index * s * k + offset` bytes.
    pub fn scaled_by(
        &mut self,
        base: Value,
        index: Value,
        s: Scalar,
        k: i64,
        offset: i64,
    ) -> Value {
        match s {
            Scalar::Const(c) => self.scaled(base, index, c * k, offset),
            Scalar::Dyn(v) => {
                let scale = self.b.ins().imul_imm_s(v, k);
                let scaled = self.b.ins().imul(index, scale);
                let sum = self.b.ins().iadd(base, scaled);
                self.offset(sum, offset)
            }
        }
    }

    /// The strides of a `layout` buffer with `channels` channels and `h` x `w` pixels.
    pub fn act_strides(
        &mut self,
        layout: crate::key::Layout,
        channels: usize,
        h: Scalar,
        w: Scalar,
    ) -> ActStrides {
        use crate::key::Layout;
        let plane = self.product(h, w);
        match layout {
            Layout::Nchw => ActStrides {
                image: self.mul(plane, channels as i64),
                channel: plane,
                block: self.mul(plane, 4),
                row: w,
                pixel: 1,
            },
            Layout::Nchw4c => ActStrides {
                image: self.mul(plane, channels.div_ceil(4) as i64 * 4),
                channel: Scalar::Const(1),
                block: self.mul(plane, 4),
                row: self.mul(w, 4),
                pixel: 4,
            },
        }
    }

    /// Runs `then` when `cond` is true and `otherwise` when it is false.
    pub fn if_else(
        &mut self,
        cond: Value,
        then: impl FnOnce(&mut Self),
        otherwise: impl FnOnce(&mut Self),
    ) {
        let then = |e: &mut Self| {
            then(e);
            Vec::new()
        };
        let otherwise = |e: &mut Self| {
            otherwise(e);
            Vec::new()
        };
        self.if_else_values(cond, then, otherwise);
    }

    /// [`Self::if_else`] whose branches each produce values of the same types: returns the
    /// values of the branch taken.
    pub fn if_else_values(
        &mut self,
        cond: Value,
        then: impl FnOnce(&mut Self) -> Vec<Value>,
        otherwise: impl FnOnce(&mut Self) -> Vec<Value>,
    ) -> Vec<Value> {
        let (t, f, done) = (
            self.b.create_block(),
            self.b.create_block(),
            self.b.create_block(),
        );
        self.b.ins().brif(cond, t, &[], f, &[]);
        self.b.switch_to_block(t);
        let then_values = then(self);
        for &v in &then_values {
            let ty = self.b.func.dfg.value_type(v);
            self.b.append_block_param(done, ty);
        }
        let args: Vec<BlockArg> = then_values.into_iter().map(BlockArg::Value).collect();
        self.b.ins().jump(done, &args);
        self.b.switch_to_block(f);
        let other_values = otherwise(self);
        debug_assert_eq!(
            other_values.len(),
            args.len(),
            "both branches give the same values"
        );
        let args: Vec<BlockArg> = other_values.into_iter().map(BlockArg::Value).collect();
        self.b.ins().jump(done, &args);
        self.b.switch_to_block(done);
        self.b.block_params(done).to_vec()
    }

    /// The taps `k` in `0..kernel` of the window at runtime output coordinate `o` that land
    /// in `0..input`, as `(first, count)`: the runtime twin of [`crate::key::tap_interval`].
    pub fn runtime_taps(
        &mut self,
        o: Value,
        input: Value,
        pad_begin: usize,
        kernel: usize,
        stride: usize,
        dilation: usize,
    ) -> (Value, Value) {
        let d = dilation as i64;
        // start = o * stride - pad_begin; taps k with 0 <= start + k * d < input.
        let start = self.b.ins().imul_imm_s(o, stride as i64);
        let start = self.offset(start, -(pad_begin as i64));
        let zero = self.iconst(0);
        let neg = self.b.ins().ineg(start);
        let neg = self.imax(neg, zero);
        // first = ceil(max(-start, 0) / d)
        let first = if d == 1 {
            neg
        } else {
            let n = self.offset(neg, d - 1);
            self.udiv_const(n, d as u64)
        };
        let k = self.iconst(kernel as i64);
        let first = self.imin(first, k);
        // end = floor((input - 1 - start) / d) + 1, which is 0 when input - 1 - start = -1.
        let last = self.b.ins().isub(input, start);
        let last = self.offset(last, -1);
        let minus_one = self.iconst(-1);
        let last = self.imax(last, minus_one);
        let end = if d == 1 {
            self.offset(last, 1)
        } else {
            let n = self.offset(last, d);
            self.udiv_const(n, d as u64)
        };
        let end = self.imin(end, k);
        let count = self.b.ins().isub(end, first);
        let count = self.imax(count, zero);
        (first, count)
    }

    /// `n / d` for `0 <= n < 2^64 / d` and a constant `d > 0`, by a shift or a multiply-high.
    ///
    /// At `opt_level = "none"` Cranelift lowers a division by a constant to `div`, about 40
    /// cycles here, which a runtime-width kernel paid several times per row. With
    /// `m = floor(2^64 / d) + 1 = 2^64 / d + e` (`0 < e <= 1`), `n * m / 2^64` exceeds `n / d`
    /// by `n * e / 2^64 < 1 / d`, which never reaches the next multiple of `1 / d`: the high
    /// half of the product is the quotient. Kernels divide extents below 2^32 by strides and
    /// tiles below 2^30.
    pub fn udiv_const(&mut self, n: Value, d: u64) -> Value {
        assert!(d > 0, "division by zero");
        if d.is_power_of_two() {
            return self.b.ins().ushr_imm_s(n, i64::from(d.trailing_zeros()));
        }
        let m = self.iconst(reciprocal(d) as i64);
        self.b.ins().umulhi(n, m)
    }

    /// `n % d`, under the conditions of [`Self::udiv_const`].
    pub fn urem_const(&mut self, n: Value, d: u64) -> Value {
        let q = self.udiv_const(n, d);
        let qd = self.b.ins().imul_imm_s(q, d as i64);
        self.b.ins().isub(n, qd)
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

    /// A vector load that stays an instruction of its own: an FMA taking it as its first
    /// factor then leaves its sum in the loaded register, where a load folded into the FMA's
    /// memory operand makes x64 copy another operand into the result's register first.
    pub fn load_vec_unfolded(&mut self, base: Value, offset: i64) -> Value {
        let (base, imm) = self.address(base, offset);
        let raw = self.b.ins().load(types::I32X4, self.flags, base, imm);
        self.b.ins().bitcast(types::F32X4, MemFlagsData::new(), raw)
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

    /// Lane `lane` of `x` in every lane: one `vpshufd`, no load.
    pub fn splat_lane(&mut self, x: Value, lane: usize) -> Value {
        let little = MemFlagsData::new().with_endianness(Endianness::Little);
        let bytes = self.b.ins().bitcast(types::I8X16, little, x);
        let mask: Vec<u8> = (0..16).map(|i| (lane * 4 + i % 4) as u8).collect();
        let mask = self.b.func.dfg.immediates.push(ConstantData::from(mask));
        let spread = self.b.ins().shuffle(bytes, bytes, mask);
        self.b.ins().bitcast(types::F32X4, little, spread)
    }

    /// The vector whose lane `l` is lane `lanes[l]` of `a` (0 to 3) or of `b` (4 to 7): one
    /// `shufps`, `unpcklps` or `unpckhps` where the pattern is one, else two byte shuffles.
    pub fn shuffle_lanes(&mut self, a: Value, b: Value, lanes: [u8; 4]) -> Value {
        let little = MemFlagsData::new().with_endianness(Endianness::Little);
        let a = self.b.ins().bitcast(types::I8X16, little, a);
        let b = self.b.ins().bitcast(types::I8X16, little, b);
        let mask: Vec<u8> = (0..16).map(|i| lanes[i / 4] * 4 + (i % 4) as u8).collect();
        let mask = self.b.func.dfg.immediates.push(ConstantData::from(mask));
        let mixed = self.b.ins().shuffle(a, b, mask);
        self.b.ins().bitcast(types::F32X4, little, mixed)
    }

    /// A vector whose first `lanes` lanes are all ones and the others zero, for
    /// [`Emit::keep_lanes`].
    pub fn lane_mask(&mut self, lanes: usize) -> Value {
        let bytes: Vec<u8> = (0..16)
            .map(|i| if i / 4 < lanes { 0xff } else { 0 })
            .collect();
        let c = self.b.func.dfg.constants.insert(ConstantData::from(bytes));
        self.b.ins().vconst(types::I32X4, c)
    }

    /// A lane mask stored in memory (all ones or all zeros per lane), for [`Emit::keep_lanes`].
    pub fn load_lane_mask(&mut self, base: Value, offset: i64) -> Value {
        let (base, imm) = self.address(base, offset);
        self.b.ins().load(types::I32X4, self.flags, base, imm)
    }

    /// `x` with the lanes that `mask` ([`Emit::lane_mask`]) clears set to +0: how a last,
    /// partial `nChw4c` block's padding lanes are kept zero, whatever `x` held there.
    pub fn keep_lanes(&mut self, x: Value, mask: Value) -> Value {
        let bits = self.b.ins().bitcast(types::I32X4, MemFlagsData::new(), x);
        let bits = self.b.ins().band(bits, mask);
        self.b
            .ins()
            .bitcast(types::F32X4, MemFlagsData::new(), bits)
    }

    /// Sets the lanes past the first `real` of `pixels` vectors, `pixel_bytes` apart from
    /// `block`, to +0: the padding lanes of an `nChw4c` row's last, partial block.
    pub fn clear_padding_lanes(
        &mut self,
        block: Value,
        pixels: Scalar,
        pixel_bytes: i64,
        real: usize,
    ) {
        let mask = self.lane_mask(real);
        self.for_ptrs(pixels, &[block], &[Scalar::Const(pixel_bytes)], |e, p| {
            let x = e.load_vec(p[0], 0);
            let x = e.keep_lanes(x, mask);
            e.store_vec(x, p[0], 0);
        });
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
        lane_stride: Scalar,
        lanes: usize,
        fill: Value,
    ) -> Value {
        let mut v = fill;
        let mut lane_base = base;
        for l in 0..lanes {
            let x = match lane_stride {
                Scalar::Const(s) => self.load_f32(base, offset + l as i64 * s),
                Scalar::Dyn(_) => {
                    if l > 0 {
                        lane_base = self.offset_by(lane_base, lane_stride, 1);
                    }
                    self.load_f32(lane_base, offset)
                }
            };
            v = self.b.ins().insertlane(v, x, l as u8);
        }
        v
    }

    /// Stores the low `lanes` lanes of `v`, `lane_stride` bytes apart.
    pub fn scatter(
        &mut self,
        v: Value,
        base: Value,
        offset: i64,
        lane_stride: Scalar,
        lanes: usize,
    ) {
        let mut lane_base = base;
        for l in 0..lanes {
            let x = self.b.ins().extractlane(v, l as u8);
            match lane_stride {
                Scalar::Const(s) => self.store_f32(x, base, offset + l as i64 * s),
                Scalar::Dyn(_) => {
                    if l > 0 {
                        lane_base = self.offset_by(lane_base, lane_stride, 1);
                    }
                    self.store_f32(x, lane_base, offset);
                }
            }
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

    /// `x` if `y < x`, else `y`: the pattern x64 lowers to one `maxps x, y`. A comparison
    /// with NaN is false, so where either is NaN the result is `y` (as `maxps` returns its
    /// second operand): pass the data as `y` and the bound as `x` for NaN to go through.
    pub fn pmax(&mut self, x: Value, y: Value) -> Value {
        let m = self.b.ins().fcmp(FloatCC::LessThan, y, x);
        let m = self.b.ins().bitcast(types::F32X4, MemFlagsData::new(), m);
        self.b.ins().bitselect(m, x, y)
    }

    /// `x` if `x < y`, else `y`: one `minps x, y`; where either is NaN, `y`, as in
    /// [`Self::pmax`].
    pub fn pmin(&mut self, x: Value, y: Value) -> Value {
        let m = self.b.ins().fcmp(FloatCC::LessThan, x, y);
        let m = self.b.ins().bitcast(types::F32X4, MemFlagsData::new(), m);
        self.b.ins().bitselect(m, x, y)
    }

    /// The larger of a running maximum `acc` and `x`, NaN (all bits set) once either has been:
    /// `maxps` keeps only one operand's NaN, so a `cmpunordps` of the two (all ones where
    /// either is NaN, itself a NaN) is or-ed in. Three instructions, where max pooling took
    /// one `maxps` and dropped NaN.
    pub fn pmax_nan(&mut self, acc: Value, x: Value) -> Value {
        let max = self.pmax(acc, x);
        let nan = self.b.ins().fcmp(FloatCC::Unordered, acc, x);
        let nan = self.b.ins().bitcast(types::F32X4, MemFlagsData::new(), nan);
        self.b.ins().bor(max, nan)
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
        body: impl FnMut(&mut Self, Value, &[Value]) -> Vec<Value>,
    ) -> Vec<Value> {
        let more = |e: &mut Self, i: Value| e.b.ins().icmp(IntCC::SignedLessThan, i, end);
        self.counted_loop(start, 1, more, carried, body)
    }

    /// The loop of [`Self::for_range`] and of a runtime [`Self::for_ptrs`]: a counter from
    /// `init` moving by `step` while `more` holds, tested at the top (header `brif` -> body ->
    /// `jump` header), with `carried` in block parameters.
    fn counted_loop(
        &mut self,
        init: Value,
        step: i64,
        more: impl FnOnce(&mut Self, Value) -> Value,
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
        let args: Vec<BlockArg> = std::iter::once(init)
            .chain(carried.iter().copied())
            .map(BlockArg::Value)
            .collect();
        self.b.ins().jump(header, &args);

        self.b.switch_to_block(header);
        let params = self.b.block_params(header).to_vec();
        let (i, state) = (params[0], &params[1..]);
        let go_on = more(self, i);
        self.b.ins().brif(go_on, body_block, &[], exit, &[]);

        self.b.switch_to_block(body_block);
        let next = body(self, i, state);
        debug_assert_eq!(next.len(), state.len());
        let i_next = self.b.ins().iadd_imm_s(i, step);
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
        body: impl FnMut(&mut Self, &[Value]),
    ) -> Vec<Value> {
        let steps: Vec<Scalar> = steps.iter().map(|&s| Scalar::Const(s)).collect();
        self.for_ptrs(Scalar::Const(count as i64), ptrs, &steps, body)
    }

    /// Pointers that advance by `steps` bytes per iteration of a loop of `count` trips, where
    /// both may be known only at run time. Returns the pointers as they leave the loop, so code
    /// after it continues from them instead of keeping the start pointers live across it.
    pub fn for_ptrs(
        &mut self,
        count: Scalar,
        ptrs: &[Value],
        steps: &[Scalar],
        mut body: impl FnMut(&mut Self, &[Value]),
    ) -> Vec<Value> {
        let mut step = |e: &mut Self, p: &[Value]| -> Vec<Value> {
            body(e, p);
            p.iter()
                .zip(steps)
                .map(|(&p, &s)| e.offset_by(p, s, 1))
                .collect()
        };
        match count {
            Scalar::Const(n) => self.for_count(n as usize, ptrs, |e, _, p| step(e, p)),
            Scalar::Dyn(n) => {
                // Counting down to zero: one register for the trip count, not two.
                let more = |e: &mut Self, left: Value| {
                    e.b.ins().icmp_imm_s(IntCC::SignedGreaterThan, left, 0)
                };
                self.counted_loop(n, -1, more, ptrs, |e, _, p| step(e, p))
            }
        }
    }

    /// The runtime range of work items clamped to `[lo, hi)`; the range is empty when
    /// `begin >= end` after clamping.
    pub fn clamp_items(&mut self, lo: usize, hi: usize) -> (Value, Value) {
        self.clamp_items_to(Scalar::Const(lo as i64), Scalar::Const(hi as i64))
    }

    /// [`Self::clamp_items`] with bounds that may be known only at run time.
    pub fn clamp_items_to(&mut self, lo: Scalar, hi: Scalar) -> (Value, Value) {
        let lo_c = self.value(lo);
        let hi_c = self.value(hi);
        let start = self.imax(self.begin, lo_c);
        let end = self.imin(self.end, hi_c);
        (start, end)
    }

    /// Emits `case(e, i)` for the runtime `index` in `0..cases`, through a jump table; indices
    /// past the last case do nothing.
    pub fn switch(&mut self, index: Value, cases: usize, mut case: impl FnMut(&mut Self, usize)) {
        let done = self.b.create_block();
        let mut switch = cranelift_frontend::Switch::new();
        let blocks: Vec<_> = (0..cases).map(|_| self.b.create_block()).collect();
        for (i, &block) in blocks.iter().enumerate() {
            switch.set_entry(i as u128, block);
        }
        switch.emit(&mut self.b, index, done);
        for (i, block) in blocks.into_iter().enumerate() {
            self.b.switch_to_block(block);
            case(self, i);
            self.b.ins().jump(done, &[]);
        }
        self.b.switch_to_block(done);
    }
}

/// `floor(2^64 / d) + 1`, the multiplier of [`Emit::udiv_const`] (for `d >= 2`).
fn reciprocal(d: u64) -> u64 {
    ((1u128 << 64) / u128::from(d) + 1) as u64
}

pub fn new_context() -> FunctionBuilderContext {
    FunctionBuilderContext::new()
}

#[cfg(test)]
mod tests {
    use super::reciprocal;

    /// The high half of `n * reciprocal(d)` is `n / d` over the ranges kernels divide: extents
    /// below 2^32 by tiles and strides up to 12, and below 2^31 + 2^29 by steps up to 2^29.
    #[test]
    fn multiply_high_by_the_reciprocal_divides() {
        let quotient = |n: u64, d: u64| ((u128::from(n) * u128::from(reciprocal(d))) >> 64) as u64;
        let near = |x: u64| x.saturating_sub(3)..=x.saturating_add(3);
        for d in (2..=64u64).chain([1000, 12_345, (1 << 29) - 1, 1 << 29]) {
            if d.is_power_of_two() {
                continue;
            }
            let samples = (0..5000u64)
                .chain((1..64).flat_map(|k| near(k * d)))
                .chain(near(u64::from(u32::MAX)))
                .chain(near((1 << 31) + (1 << 29)))
                .chain((0..64).map(|i| (u64::from(u32::MAX) / 63) * i));
            for n in samples {
                assert_eq!(quotient(n, d), n / d, "{n} / {d}");
            }
        }
    }
}
