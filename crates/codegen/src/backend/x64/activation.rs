//! The element-wise activations in a wide tile's registers: the same operations, in the same
//! order, as the 128-bit Cranelift code of `lower_eltwise`, so a wide tile's outputs keep the
//! x128 kernel's bits.
//!
//! Each activation works on one register in place with the four temporaries below it (the
//! epilogue's registers 0 to 3), reading its constants from the tile's pool
//! ([`Asm::constant`]) as memory operands. The Cephes polynomials and the reduction of `exp`
//! are `lower_eltwise`'s, their constants `crate::approx`'s; only the registers are chosen
//! here. `Elu` needs a fifth register and stays with the Cranelift code after the tile.

use iced_x86::code_asm::{k2, ptr};

use super::{Asm, Src, YMM, ZMM, ok};
use crate::approx::{
    EXP_MAX, EXP_MIN, EXP_POLY, LN2_HI, LN2_LO, ROUNDING_MAGIC, TANH_POLY, TANH_SMALL,
};
use crate::key::Activation;

/// The temporaries: the epilogue's zero, clip bounds and residual, free once an activation
/// starts (the epilogue sets them again for a later post-op).
const T1: usize = 0;
const T2: usize = 1;
const T3: usize = 2;
const T4: usize = 3;

/// `vcmpps` predicates.
const LESS: u32 = 1;
const UNORDERED: u32 = 3;

/// `a pred b` lane by lane, for [`Asm::select`]; at avx2 the lanes' masks go to register
/// `mask`.
#[derive(Clone, Copy)]
struct Compare {
    a: usize,
    b: Src,
    pred: u32,
    mask: usize,
}

const SIGN: u32 = 0x8000_0000;
const ABS: u32 = 0x7fff_ffff;

impl Asm {
    /// `x` in every lane, from the constant pool.
    pub(super) fn f32(&mut self, x: f32) -> Src {
        Src::Mem(self.constant(x.to_bits()))
    }

    fn bits(&mut self, bits: u32) -> Src {
        Src::Mem(self.constant(bits))
    }

    fn load_f32(&mut self, r: usize, x: f32) {
        let m = self.constant(x.to_bits());
        self.load(r, m);
    }

    /// `d = a ^ b` (`vpxord` at avx512, which AVX-512F has; `vxorps` needs DQ).
    fn xor(&mut self, d: usize, a: usize, b: Src) {
        if self.wide() {
            three!(self, vpxord, d, a, b)
        } else {
            three!(self, vxorps, d, a, b)
        }
    }

    fn and(&mut self, d: usize, a: usize, b: Src) {
        if self.wide() {
            three!(self, vpandd, d, a, b)
        } else {
            three!(self, vandps, d, a, b)
        }
    }

    /// `d = cmp ? t : f`, lane by lane: the compare into `cmp.mask` (at avx2) or `k2` (at
    /// avx512, where `k1` may hold a tail's lanes), then a blend.
    fn select(&mut self, d: usize, cmp: Compare, t: usize, f: usize) {
        let Compare { a, b, pred, mask } = cmp;
        if self.wide() {
            let res = match b {
                Src::Reg(b) => self.a.vcmpps(k2, ZMM[a], ZMM[b], pred),
                Src::Mem(m) => self.a.vcmpps(k2, ZMM[a], ptr(m), pred),
            };
            ok(res);
            ok(self.a.vblendmps(ZMM[d].k2(), ZMM[f], ZMM[t]));
        } else {
            let res = match b {
                Src::Reg(b) => self.a.vcmpps(YMM[mask], YMM[a], YMM[b], pred),
                Src::Mem(m) => self.a.vcmpps(YMM[mask], YMM[a], ptr(m), pred),
            };
            ok(res);
            ok(self.a.vblendvps(YMM[d], YMM[f], YMM[t], YMM[mask]));
        }
    }

    /// `x < 0` lane by lane, its mask (at avx2) in register `mask`.
    fn negative(&mut self, x: usize, mask: usize) -> Compare {
        let zero = self.f32(0.0);
        Compare {
            a: x,
            b: zero,
            pred: LESS,
            mask,
        }
    }

    /// `x = x is NaN ? x : y` (`lower_eltwise::keep_nan`), with `mask` free.
    fn keep_nan(&mut self, x: usize, y: usize, mask: usize) {
        let nan = Compare {
            a: x,
            b: Src::Reg(x),
            pred: UNORDERED,
            mask,
        };
        self.select(x, nan, x, y);
    }

    /// `exp` of `T1` reduced (`lower_eltwise::exp_parts`): `q` in `T1`, `n` in `T2`'s integer
    /// lanes; `T3` and `T4` are clobbered.
    fn exp_parts(&mut self) {
        let (lo, hi) = (self.f32(EXP_MIN), self.f32(EXP_MAX));
        three!(self, vmaxps, T1, T1, lo);
        three!(self, vminps, T1, T1, hi);
        let magic = self.f32(ROUNDING_MAGIC);
        // kf = x * log2e + magic
        self.load_f32(T2, std::f32::consts::LOG2_E);
        three!(self, vfmadd213ps, T2, T1, magic);
        // nf = kf - magic; n = bits(kf) - bits(magic)
        three!(self, vsubps, T3, T2, magic);
        three!(self, vpsubd, T2, T2, magic);
        // r = nf * c1 + x, then nf * c2 + r
        let (c1, c2) = (self.f32(LN2_HI), self.f32(LN2_LO));
        three!(self, vfmadd231ps, T1, T3, c1);
        three!(self, vfmadd231ps, T1, T3, c2);
        // p = p * r + k
        self.load_f32(T3, EXP_POLY[0]);
        for &k in &EXP_POLY[1..] {
            let k = self.f32(k);
            three!(self, vfmadd213ps, T3, T1, k);
        }
        // q = p * r^2 + r
        three!(self, vmulps, T4, T1, Src::Reg(T1));
        three!(self, vfmadd231ps, T1, T3, Src::Reg(T4));
    }

    /// `(1 + q) 2^n` from [`Self::exp_parts`]' registers into `T1`, as two factors
    /// (`lower_eltwise::scale`); `T2` and `T3` are clobbered.
    fn exp_scale(&mut self) {
        let one = self.f32(1.0);
        three!(self, vaddps, T1, T1, one);
        let bias = self.bits(127);
        ok(if self.wide() {
            self.a.vpsrad(ZMM[T3], ZMM[T2], 1u32)
        } else {
            self.a.vpsrad(YMM[T3], YMM[T2], 1u32)
        });
        three!(self, vpsubd, T2, T2, Src::Reg(T3));
        for r in [T3, T2] {
            three!(self, vpaddd, r, r, bias);
            ok(if self.wide() {
                self.a.vpslld(ZMM[r], ZMM[r], 23u32)
            } else {
                self.a.vpslld(YMM[r], YMM[r], 23u32)
            });
        }
        three!(self, vmulps, T1, T1, Src::Reg(T3));
        three!(self, vmulps, T1, T1, Src::Reg(T2));
    }

    /// `exp(T1)` into `T1`, NaN lanes dropped; `T2` to `T4` are clobbered.
    fn exp_raw(&mut self) {
        self.exp_parts();
        self.exp_scale();
    }

    /// `1 / (1 + exp(-x))` into `T2`, NaN lanes dropped; `T1`, `T3` and `T4` are clobbered.
    fn sigmoid_raw(&mut self, x: usize) {
        let sign = self.bits(SIGN);
        self.xor(T1, x, sign);
        self.exp_raw();
        let one = self.f32(1.0);
        three!(self, vaddps, T1, T1, one);
        self.load_f32(T2, 1.0);
        three!(self, vdivps, T2, T2, Src::Reg(T1));
    }

    /// `max(0, min(1, alpha x + beta))` into `T1`, NaN lanes dropped.
    fn hard_sigmoid_raw(&mut self, x: usize, alpha: f32, beta: f32) {
        self.load_f32(T1, alpha);
        let beta = self.f32(beta);
        three!(self, vfmadd213ps, T1, x, beta);
        let (zero, one) = (self.f32(0.0), self.f32(1.0));
        three!(self, vmaxps, T1, T1, zero);
        three!(self, vminps, T1, T1, one);
    }

    /// `tanh(x)` into `T1` (`lower_eltwise::tanh_raw`), NaN lanes dropped; `T2` to `T4` are
    /// clobbered.
    fn tanh_raw(&mut self, x: usize) {
        let abs = self.bits(ABS);
        self.and(T1, x, abs);
        let two = self.f32(2.0);
        three!(self, vmulps, T1, T1, two);
        self.exp_raw();
        let one = self.f32(1.0);
        three!(self, vaddps, T1, T1, one);
        self.load_f32(T2, 2.0);
        three!(self, vdivps, T2, T2, Src::Reg(T1));
        // big = 1 - 2 / (exp(2|x|) + 1), negated where x < 0.
        self.load_f32(T1, 1.0);
        three!(self, vsubps, T1, T1, Src::Reg(T2));
        let sign = self.bits(SIGN);
        self.xor(T2, T1, sign);
        let negative = self.negative(x, T3);
        self.select(T1, negative, T2, T1);
        // small = x + x^3 P(x^2)
        three!(self, vmulps, T2, x, Src::Reg(x));
        self.load_f32(T3, TANH_POLY[0]);
        for &k in &TANH_POLY[1..] {
            let k = self.f32(k);
            three!(self, vfmadd213ps, T3, T2, k);
        }
        three!(self, vmulps, T3, T3, Src::Reg(T2));
        three!(self, vfmadd213ps, T3, x, Src::Reg(x));
        let abs = self.bits(ABS);
        self.and(T2, x, abs);
        let limit = self.f32(TANH_SMALL);
        let small = Compare {
            a: T2,
            b: limit,
            pred: LESS,
            mask: T4,
        };
        self.select(T1, small, T3, T1);
    }

    /// `act(x)` in register `x`, as `lower_eltwise::activation` computes it; registers 0 to 3
    /// are clobbered (and `k2` at avx512).
    ///
    /// # Panics
    ///
    /// On `Elu`, which [`computes`] rules out.
    pub(crate) fn activation(&mut self, x: usize, act: Activation) {
        debug_assert!(
            x > T4,
            "the activation's register is none of its temporaries"
        );
        match act {
            Activation::Sigmoid => {
                self.sigmoid_raw(x);
                self.keep_nan(x, T2, T3);
            }
            Activation::Silu => {
                self.sigmoid_raw(x);
                three!(self, vmulps, x, x, Src::Reg(T2));
            }
            Activation::HardSigmoid { alpha, beta } => {
                self.hard_sigmoid_raw(x, alpha, beta);
                self.keep_nan(x, T1, T2);
            }
            Activation::HardSwish => {
                self.hard_sigmoid_raw(x, 1.0 / 6.0, 0.5);
                // NaN times anything is NaN: no lane to put back.
                three!(self, vmulps, x, x, Src::Reg(T1));
            }
            Activation::Tanh => {
                self.tanh_raw(x);
                self.keep_nan(x, T1, T2);
            }
            Activation::LeakyRelu { alpha } => {
                let alpha = self.f32(alpha);
                self.prelu(x, alpha);
            }
            Activation::Exp => {
                self.copy(T1, x);
                self.exp_raw();
                self.keep_nan(x, T1, T2);
            }
            Activation::Elu { .. } => unreachable!("elu is left to the cranelift code"),
        }
    }

    /// `x < 0 ? x * slope : x` in register `x` (`lower_eltwise`'s PReLU and leaky relu, a
    /// slope per channel or one constant); registers 0 and 1 are clobbered (and `k2` at
    /// avx512).
    pub(crate) fn prelu(&mut self, x: usize, slope: Src) {
        three!(self, vmulps, T1, x, slope);
        let negative = self.negative(x, T2);
        self.select(x, negative, T1, x);
    }
}

/// Whether a wide tile computes `act` in its registers ([`Asm::activation`]).
pub(crate) fn computes(act: Activation) -> bool {
    !matches!(act, Activation::Elu { .. })
}
