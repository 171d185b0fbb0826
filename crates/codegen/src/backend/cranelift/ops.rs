//! The Cranelift instructions the lowerings use, one method each, so that no lowering holds
//! Cranelift's `FunctionBuilder`: integer arithmetic on addresses, extents and lane masks
//! (any integer type, scalar or vector), `f32x4` arithmetic and comparisons, lane moves and
//! stack slots. Each is the one instruction its name says, so a lowering still chooses the
//! code instruction by instruction.

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{
    InstBuilder, MemFlagsData, StackSlot, StackSlotData, StackSlotKind, Value, types,
};

use super::Emit;

impl Emit<'_> {
    pub fn iadd(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().iadd(a, b)
    }

    pub fn isub(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().isub(a, b)
    }

    pub fn imul(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().imul(a, b)
    }

    pub fn imul_imm(&mut self, a: Value, k: i64) -> Value {
        self.b.ins().imul_imm_s(a, k)
    }

    pub fn ineg(&mut self, a: Value) -> Value {
        self.b.ins().ineg(a)
    }

    /// Unsigned division by a runtime value (a constant divisor: [`Emit::udiv_const`]).
    pub fn udiv(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().udiv(a, b)
    }

    pub fn urem(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().urem(a, b)
    }

    pub fn band(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().band(a, b)
    }

    pub fn band_imm(&mut self, a: Value, k: i64) -> Value {
        self.b.ins().band_imm_s(a, k)
    }

    pub fn bor(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().bor(a, b)
    }

    pub fn bxor_imm(&mut self, a: Value, k: i64) -> Value {
        self.b.ins().bxor_imm_s(a, k)
    }

    pub fn ishl_imm(&mut self, a: Value, k: i64) -> Value {
        self.b.ins().ishl_imm_s(a, k)
    }

    pub fn ushr_imm(&mut self, a: Value, k: i64) -> Value {
        self.b.ins().ushr_imm_s(a, k)
    }

    pub fn sshr_imm(&mut self, a: Value, k: i64) -> Value {
        self.b.ins().sshr_imm_s(a, k)
    }

    /// `a cc b` as a Cranelift boolean (an `i8` of 0 or 1).
    pub fn icmp(&mut self, cc: IntCC, a: Value, b: Value) -> Value {
        self.b.ins().icmp(cc, a, b)
    }

    pub fn icmp_imm(&mut self, cc: IntCC, a: Value, k: i64) -> Value {
        self.b.ins().icmp_imm_s(cc, a, k)
    }

    /// `cond ? a : b` for a scalar condition.
    pub fn select(&mut self, cond: Value, a: Value, b: Value) -> Value {
        self.b.ins().select(cond, a, b)
    }

    /// An `i8` boolean or an `i32` as an `i64`, zero-extended.
    pub fn zero_extend(&mut self, x: Value) -> Value {
        self.b.ins().uextend(types::I64, x)
    }

    pub fn fadd(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().fadd(a, b)
    }

    pub fn fsub(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().fsub(a, b)
    }

    pub fn fmul(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().fmul(a, b)
    }

    pub fn fdiv(&mut self, a: Value, b: Value) -> Value {
        self.b.ins().fdiv(a, b)
    }

    pub fn fneg(&mut self, a: Value) -> Value {
        self.b.ins().fneg(a)
    }

    pub fn fabs(&mut self, a: Value) -> Value {
        self.b.ins().fabs(a)
    }

    /// `a cc b` lane by lane: all ones where it holds, as an integer vector.
    pub fn fcmp(&mut self, cc: FloatCC, a: Value, b: Value) -> Value {
        self.b.ins().fcmp(cc, a, b)
    }

    /// `mask ? a : b` bit by bit.
    pub fn bitselect(&mut self, mask: Value, a: Value, b: Value) -> Value {
        self.b.ins().bitselect(mask, a, b)
    }

    /// `if mask { a } else { b }` lane by lane, for an `fcmp` or `icmp` mask.
    pub fn select_lanes(&mut self, mask: Value, a: Value, b: Value) -> Value {
        let mask = if self.b.func.dfg.value_type(mask) == types::F32X4 {
            mask
        } else {
            self.as_floats(mask)
        };
        self.b.ins().bitselect(mask, a, b)
    }

    /// The bits of an `f32x4` as an `i32x4`.
    pub fn as_ints(&mut self, x: Value) -> Value {
        self.b.ins().bitcast(types::I32X4, MemFlagsData::new(), x)
    }

    /// The bits of an `i32x4` as an `f32x4`.
    pub fn as_floats(&mut self, x: Value) -> Value {
        self.b.ins().bitcast(types::F32X4, MemFlagsData::new(), x)
    }

    /// The bits of a scalar `f32`, zero-extended to an `i64`.
    pub fn f32_bits(&mut self, x: Value) -> Value {
        let bits = self.b.ins().bitcast(types::I32, MemFlagsData::new(), x);
        self.zero_extend(bits)
    }

    pub fn f32const(&mut self, x: f32) -> Value {
        self.b.ins().f32const(x)
    }

    /// A scalar `f32` in every lane of an `f32x4`.
    pub fn splat_f32(&mut self, x: Value) -> Value {
        self.b.ins().splat(types::F32X4, x)
    }

    /// `v` in every lane of an `i32x4`.
    pub fn splat_i32(&mut self, v: i32) -> Value {
        let c = self.b.ins().iconst(types::I32, i64::from(v));
        self.b.ins().splat(types::I32X4, c)
    }

    /// An integer as the nearest `f32`.
    pub fn int_to_f32(&mut self, n: Value) -> Value {
        self.b.ins().fcvt_from_sint(types::F32, n)
    }

    pub fn extract_lane(&mut self, v: Value, lane: u8) -> Value {
        self.b.ins().extractlane(v, lane)
    }

    /// A stack slot of `bytes` bytes aligned to `2^align_shift`.
    pub fn stack_slot(&mut self, bytes: u32, align_shift: u8) -> StackSlot {
        self.b.create_sized_stack_slot(StackSlotData::new(
            StackSlotKind::ExplicitSlot,
            bytes,
            align_shift,
        ))
    }

    /// The address of byte `offset` of a stack slot.
    pub fn stack_addr(&mut self, slot: StackSlot, offset: i32) -> Value {
        self.b.ins().stack_addr(types::I64, slot, offset)
    }

    /// An `i64` stored at `base + offset`, in memory the kernel owns (a stack slot).
    pub fn store_i64(&mut self, v: Value, base: Value, offset: i32) {
        self.b.ins().store(MemFlagsData::new(), v, base, offset);
    }

    /// The `i64` at `base + offset`, as [`Self::store_i64`] stored it.
    pub fn load_i64(&mut self, base: Value, offset: i32) -> Value {
        self.b
            .ins()
            .load(types::I64, MemFlagsData::new(), base, offset)
    }
}
