//! The element-wise activations in a wide tile's registers: the same operations, in the same
//! order, as the 128-bit Cranelift code of `lower_eltwise`, so a wide tile's outputs keep the
//! x128 kernel's bits.
//!
//! Each activation works on a [`Chain`]'s register in place with its four temporaries,
//! reading its constants from the tile's pool ([`Asm::constant`]) as memory operands. Given
//! several chains, it emits each step for all of them before the next: an activation with an
//! `exp` and a division is a chain of 60 to 80 cycles, and one value at a time left the
//! out-of-order window to overlap too few of them (SiLU in a 1x1 conv's epilogue on Zen3:
//! 1.12 ms one at a time, 1.08 ms as three chains; a standalone SiLU: 0.039 and 0.033 ms).
//! The polynomials and the reduction of `exp` are `lower_eltwise`'s, their constants
//! `crate::approx`'s; only the registers are chosen here. Every activation fits a chain's
//! four temporaries (ELU's `expm1` too: one fused multiply-add from `q` and `2^n`).

use iced_x86::code_asm::{AsmRegisterK, AsmRegisterZmm, k0, k1, k2, k3, k4, k5, k6, k7, ptr};

use super::{Asm, Src, YMM, ZMM, ok};
use crate::approx::{
    EXP_MAX, EXP_MIN, EXP_POLY, EXPM1_RANGE, LN2_HI, LN2_LO, LOGISTIC_EXP_MAX, LOGISTIC_EXP_MIN,
    LOGISTIC_POLY, ROUNDING_MAGIC, ROUNDING_MAGIC_HALF, TANH_POLY, TANH_SMALL,
};
use crate::key::Activation;

/// `vcmpps` predicates.
const LESS: u32 = 1;
const UNORDERED: u32 = 3;

const SIGN: u32 = 0x8000_0000;
const ABS: u32 = 0x7fff_ffff;

/// One value's registers in an epilogue: the value, four temporaries (a post-op's zero, clip
/// bounds or residual, or an activation's intermediates), and at avx512 an opmask for its
/// compares (`k2` to `k7`; `k1` holds a tail's lanes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Chain {
    pub(crate) x: usize,
    pub(crate) t: [usize; 4],
    pub(crate) k: usize,
}

impl Chain {
    /// The chain of a tile that keeps one value at a time: `x` and registers 0 to 3.
    pub(crate) fn single(x: usize) -> Chain {
        Chain {
            x,
            t: [0, 1, 2, 3],
            k: 2,
        }
    }

    /// Chain `i` of a group that owns the whole register file: registers `5i` to `5i + 4`.
    pub(crate) fn owned(i: usize) -> Chain {
        Chain {
            x: 5 * i,
            t: [5 * i + 1, 5 * i + 2, 5 * i + 3, 5 * i + 4],
            k: 2 + i,
        }
    }
}

/// Values whose chains fit a tier's register file at once (and its opmasks `k2` to `k7`).
pub(crate) fn chains_per_group(vector_registers: usize) -> usize {
    (vector_registers / 5).min(6)
}

/// `a pred b` lane by lane, for [`Asm::select`]: at avx2 the mask goes to the chain's
/// temporary `mask`, at avx512 to its opmask.
#[derive(Clone, Copy)]
struct Compare {
    a: usize,
    b: Src,
    pred: u32,
    mask: usize,
}

/// Opmask register `k`.
fn opmask(k: usize) -> AsmRegisterK {
    [k0, k1, k2, k3, k4, k5, k6, k7][k]
}

/// `z` written under a chain's opmask `k` (2 to 7).
fn masked(z: AsmRegisterZmm, k: usize) -> AsmRegisterZmm {
    match k {
        2 => z.k2(),
        3 => z.k3(),
        4 => z.k4(),
        5 => z.k5(),
        6 => z.k6(),
        7 => z.k7(),
        _ => unreachable!("chains compare into k2 to k7, not k{k}"),
    }
}

/// Chains' temporaries by role, in the order of the single-value code's registers 0 to 3.
const T1: usize = 0;
const T2: usize = 1;
const T3: usize = 2;
const T4: usize = 3;

impl Asm {
    /// `x` in every lane, from the constant pool.
    pub(super) fn f32(&mut self, x: f32) -> Src {
        Src::Mem(self.constant(x.to_bits()))
    }

    fn bits(&mut self, bits: u32) -> Src {
        Src::Mem(self.constant(bits))
    }

    /// Every chain's temporary `t` set to `x` in every lane.
    fn load_f32(&mut self, chains: &[Chain], t: usize, x: f32) {
        let m = self.constant(x.to_bits());
        for c in chains {
            self.load(c.t[t], m);
        }
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

    /// Register `r`'s 32-bit lanes shifted left by `bits`.
    fn shift_left(&mut self, r: usize, bits: u32) {
        ok(if self.wide() {
            self.a.vpslld(ZMM[r], ZMM[r], bits)
        } else {
            self.a.vpslld(YMM[r], YMM[r], bits)
        });
    }

    /// `d = cmp ? t : f` lane by lane for every chain, registers given per chain: all
    /// compares, then all blends.
    fn select(&mut self, chains: &[Chain], of: impl Fn(&Chain) -> (usize, Compare, usize, usize)) {
        for c in chains {
            let (_, Compare { a, b, pred, mask }, _, _) = of(c);
            let res = match (self.wide(), b) {
                (true, Src::Reg(b)) => self.a.vcmpps(opmask(c.k), ZMM[a], ZMM[b], pred),
                (true, Src::Mem(m)) => self.a.vcmpps(opmask(c.k), ZMM[a], ptr(m), pred),
                (false, Src::Reg(b)) => self.a.vcmpps(YMM[mask], YMM[a], YMM[b], pred),
                (false, Src::Mem(m)) => self.a.vcmpps(YMM[mask], YMM[a], ptr(m), pred),
            };
            ok(res);
        }
        for c in chains {
            let (d, Compare { mask, .. }, t, f) = of(c);
            ok(if self.wide() {
                self.a.vblendmps(masked(ZMM[d], c.k), ZMM[f], ZMM[t])
            } else {
                self.a.vblendvps(YMM[d], YMM[f], YMM[t], YMM[mask])
            });
        }
    }

    /// `d = x < 0 ? t : f` for each chain's `x`, `(d, t, f)` its registers, the mask (at
    /// avx2) in its temporary `mask`.
    fn select_negative(
        &mut self,
        chains: &[Chain],
        mask: usize,
        regs: impl Fn(&Chain) -> (usize, usize, usize),
    ) {
        let zero = self.f32(0.0);
        self.select(chains, |c| {
            let (d, t, f) = regs(c);
            let negative = Compare {
                a: c.x,
                b: zero,
                pred: LESS,
                mask: c.t[mask],
            };
            (d, negative, t, f)
        });
    }

    /// `x = x is NaN ? x : t[y]` (`lower_eltwise::keep_nan`), with `t[mask]` free.
    fn keep_nan(&mut self, chains: &[Chain], y: usize, mask: usize) {
        self.select(chains, |c| {
            let nan = Compare {
                a: c.x,
                b: Src::Reg(c.x),
                pred: UNORDERED,
                mask: c.t[mask],
            };
            (c.x, nan, c.x, c.t[y])
        });
    }

    /// `T1` clamped to `[lo, hi]`, then `kf = T1 log2(e) + magic` in `T2` and `kf - magic`
    /// (`n` as a float) in `T3` (`lower_eltwise::reduce`'s first steps).
    fn round_log2(&mut self, chains: &[Chain], [lo, hi]: [f32; 2], magic: f32) {
        let (lo, hi) = (self.f32(lo), self.f32(hi));
        for c in chains {
            three!(self, vmaxps, c.t[T1], c.t[T1], lo);
        }
        for c in chains {
            three!(self, vminps, c.t[T1], c.t[T1], hi);
        }
        let magic = self.f32(magic);
        self.load_f32(chains, T2, std::f32::consts::LOG2_E);
        for c in chains {
            three!(self, vfmadd213ps, c.t[T2], c.t[T1], magic);
        }
        for c in chains {
            three!(self, vsubps, c.t[T3], c.t[T2], magic);
        }
    }

    /// `exp` of `T1` clamped to `range` and reduced (`lower_eltwise::exp_parts`): `q` in `T1`,
    /// `n` in `T2`'s integer lanes; `T3` and `T4` are clobbered.
    fn exp_parts(&mut self, chains: &[Chain], range: [f32; 2]) {
        self.round_log2(chains, range, ROUNDING_MAGIC);
        // n = bits(kf) - bits(magic)
        let magic = self.f32(ROUNDING_MAGIC);
        for c in chains {
            three!(self, vpsubd, c.t[T2], c.t[T2], magic);
        }
        self.reduce_and_expm1(chains, &EXP_POLY);
    }

    /// From `T1` holding `x` and `T3` holding `n` as a float: `q = expm1(x - n ln 2)` in
    /// `T1` (Cody and Waite's reduction, then the polynomial); `T3` and `T4` are clobbered.
    fn reduce_and_expm1(&mut self, chains: &[Chain], poly: &[f32]) {
        // r = nf * c1 + x, then nf * c2 + r
        let (c1, c2) = (self.f32(LN2_HI), self.f32(LN2_LO));
        for c in chains {
            three!(self, vfmadd231ps, c.t[T1], c.t[T3], c1);
        }
        for c in chains {
            three!(self, vfmadd231ps, c.t[T1], c.t[T3], c2);
        }
        // p = p * r + k
        self.load_f32(chains, T3, poly[0]);
        for &k in &poly[1..] {
            let k = self.f32(k);
            for c in chains {
                three!(self, vfmadd213ps, c.t[T3], c.t[T1], k);
            }
        }
        // q = p * r^2 + r
        for c in chains {
            three!(self, vmulps, c.t[T4], c.t[T1], Src::Reg(c.t[T1]));
        }
        for c in chains {
            three!(self, vfmadd231ps, c.t[T1], c.t[T3], Src::Reg(c.t[T4]));
        }
    }

    /// `(1 + q) 2^n` from [`Self::exp_parts`]' registers into `T1`, as two factors
    /// (`lower_eltwise::scale`); `T2` and `T3` are clobbered.
    fn exp_scale(&mut self, chains: &[Chain]) {
        let one = self.f32(1.0);
        let bias = self.bits(127);
        for c in chains {
            three!(self, vaddps, c.t[T1], c.t[T1], one);
            ok(if self.wide() {
                self.a.vpsrad(ZMM[c.t[T3]], ZMM[c.t[T2]], 1u32)
            } else {
                self.a.vpsrad(YMM[c.t[T3]], YMM[c.t[T2]], 1u32)
            });
            three!(self, vpsubd, c.t[T2], c.t[T2], Src::Reg(c.t[T3]));
        }
        for c in chains {
            for r in [c.t[T3], c.t[T2]] {
                three!(self, vpaddd, r, r, bias);
                self.shift_left(r, 23);
            }
        }
        for c in chains {
            three!(self, vmulps, c.t[T1], c.t[T1], Src::Reg(c.t[T3]));
        }
        for c in chains {
            three!(self, vmulps, c.t[T1], c.t[T1], Src::Reg(c.t[T2]));
        }
    }

    /// `exp(T1)` into `T1`, NaN lanes dropped; `T2` to `T4` are clobbered.
    fn exp_raw(&mut self, chains: &[Chain]) {
        self.exp_parts(chains, [EXP_MIN, EXP_MAX]);
        self.exp_scale(chains);
    }

    /// `expm1(T1)` into `T1` as `q 2^n + (2^n - 1)` (`lower_eltwise::expm1_raw`); `T2` to `T4`
    /// are clobbered.
    fn expm1_raw(&mut self, chains: &[Chain]) {
        self.exp_parts(chains, EXPM1_RANGE);
        let bias = self.bits(127);
        for c in chains {
            three!(self, vpaddd, c.t[T2], c.t[T2], bias);
            self.shift_left(c.t[T2], 23);
        }
        let one = self.f32(1.0);
        for c in chains {
            three!(self, vsubps, c.t[T3], c.t[T2], one);
        }
        for c in chains {
            three!(self, vfmadd213ps, c.t[T1], c.t[T2], Src::Reg(c.t[T3]));
        }
    }

    /// The logistic function's numerator over `1 + exp(-x)` into `T2`, as
    /// `lower_eltwise::logistic` computes it: sigmoid's numerator is 1 (`silu` false), SiLU's
    /// `x`. NaN lanes are dropped where the numerator does not carry them; `T1`, `T3` and `T4`
    /// are clobbered.
    fn logistic(&mut self, chains: &[Chain], silu: bool) {
        let sign = self.bits(SIGN);
        for c in chains {
            self.xor(c.t[T1], c.x, sign);
        }
        let range = [LOGISTIC_EXP_MIN, LOGISTIC_EXP_MAX];
        self.round_log2(chains, range, ROUNDING_MAGIC_HALF);
        // 2^(n - 1) from kf's low bits
        for c in chains {
            self.shift_left(c.t[T2], 23);
        }
        self.reduce_and_expm1(chains, &LOGISTIC_POLY);
        // d = (1 + q) 2^(n - 1) + 1 / 2
        let (one, half) = (self.f32(1.0), self.f32(0.5));
        for c in chains {
            three!(self, vaddps, c.t[T1], c.t[T1], one);
        }
        for c in chains {
            three!(self, vmulps, c.t[T1], c.t[T1], Src::Reg(c.t[T2]));
        }
        for c in chains {
            three!(self, vaddps, c.t[T1], c.t[T1], half);
        }
        if silu {
            for c in chains {
                three!(self, vmulps, c.t[T2], c.x, half);
            }
        } else {
            self.load_f32(chains, T2, 0.5);
        }
        for c in chains {
            three!(self, vdivps, c.t[T2], c.t[T2], Src::Reg(c.t[T1]));
        }
    }

    /// `max(0, min(1, alpha x + beta))` into `T1`, NaN lanes dropped.
    fn hard_sigmoid_raw(&mut self, chains: &[Chain], alpha: f32, beta: f32) {
        self.load_f32(chains, T1, alpha);
        let beta = self.f32(beta);
        let (zero, one) = (self.f32(0.0), self.f32(1.0));
        for c in chains {
            three!(self, vfmadd213ps, c.t[T1], c.x, beta);
        }
        for c in chains {
            three!(self, vmaxps, c.t[T1], c.t[T1], zero);
        }
        for c in chains {
            three!(self, vminps, c.t[T1], c.t[T1], one);
        }
    }

    /// `tanh(x)` into `T1` (`lower_eltwise::tanh_raw`), NaN lanes dropped; `T2` to `T4` are
    /// clobbered.
    fn tanh_raw(&mut self, chains: &[Chain]) {
        let abs = self.bits(ABS);
        let two = self.f32(2.0);
        for c in chains {
            self.and(c.t[T1], c.x, abs);
        }
        for c in chains {
            three!(self, vmulps, c.t[T1], c.t[T1], two);
        }
        self.exp_raw(chains);
        let one = self.f32(1.0);
        for c in chains {
            three!(self, vaddps, c.t[T1], c.t[T1], one);
        }
        self.load_f32(chains, T2, 2.0);
        for c in chains {
            three!(self, vdivps, c.t[T2], c.t[T2], Src::Reg(c.t[T1]));
        }
        // big = 1 - 2 / (exp(2|x|) + 1), negated where x < 0.
        self.load_f32(chains, T1, 1.0);
        let sign = self.bits(SIGN);
        for c in chains {
            three!(self, vsubps, c.t[T1], c.t[T1], Src::Reg(c.t[T2]));
        }
        for c in chains {
            self.xor(c.t[T2], c.t[T1], sign);
        }
        self.select_negative(chains, T3, |c| (c.t[T1], c.t[T2], c.t[T1]));
        // small = x + x^3 P(x^2)
        for c in chains {
            three!(self, vmulps, c.t[T2], c.x, Src::Reg(c.x));
        }
        self.load_f32(chains, T3, TANH_POLY[0]);
        for &k in &TANH_POLY[1..] {
            let k = self.f32(k);
            for c in chains {
                three!(self, vfmadd213ps, c.t[T3], c.t[T2], k);
            }
        }
        for c in chains {
            three!(self, vmulps, c.t[T3], c.t[T3], Src::Reg(c.t[T2]));
        }
        for c in chains {
            three!(self, vfmadd213ps, c.t[T3], c.x, Src::Reg(c.x));
        }
        for c in chains {
            self.and(c.t[T2], c.x, abs);
        }
        let limit = self.f32(TANH_SMALL);
        self.select(chains, |c| {
            let small = Compare {
                a: c.t[T2],
                b: limit,
                pred: LESS,
                mask: c.t[T4],
            };
            (c.t[T1], small, c.t[T3], c.t[T1])
        });
    }

    /// `act(x)` in each chain's register `x`, as `lower_eltwise::activation` computes it,
    /// the chains' instructions interleaved; the chains' temporaries are clobbered (and their
    /// opmasks at avx512).
    pub(crate) fn activation(&mut self, chains: &[Chain], act: Activation) {
        debug_assert!(
            chains.iter().all(|c| !c.t.contains(&c.x)),
            "the activation's register is none of its temporaries"
        );
        match act {
            Activation::Sigmoid => {
                self.logistic(chains, false);
                self.keep_nan(chains, T2, T3);
            }
            Activation::Silu => {
                self.logistic(chains, true);
                for c in chains {
                    self.copy(c.x, c.t[T2]);
                }
            }
            Activation::HardSigmoid { alpha, beta } => {
                self.hard_sigmoid_raw(chains, alpha, beta);
                self.keep_nan(chains, T1, T2);
            }
            Activation::HardSwish => {
                self.hard_sigmoid_raw(chains, 1.0 / 6.0, 0.5);
                // NaN times anything is NaN: no lane to put back.
                for c in chains {
                    three!(self, vmulps, c.x, c.x, Src::Reg(c.t[T1]));
                }
            }
            Activation::Tanh => {
                self.tanh_raw(chains);
                self.keep_nan(chains, T1, T2);
            }
            Activation::LeakyRelu { alpha } => {
                let alpha = self.f32(alpha);
                self.prelu(chains, |_| alpha);
            }
            Activation::Exp => {
                for c in chains {
                    self.copy(c.t[T1], c.x);
                }
                self.exp_raw(chains);
                self.keep_nan(chains, T1, T2);
            }
            Activation::Elu { alpha } => {
                for c in chains {
                    self.copy(c.t[T1], c.x);
                }
                self.expm1_raw(chains);
                let alpha = self.f32(alpha);
                for c in chains {
                    three!(self, vmulps, c.t[T1], c.t[T1], alpha);
                }
                self.select_negative(chains, T2, |c| (c.x, c.t[T1], c.x));
            }
        }
    }

    /// `x < 0 ? x * slope : x` in each chain's register `x` (`lower_eltwise::prelu`: the
    /// standalone PReLU, a conv's PReLU post-op and leaky relu, a slope per channel or one
    /// constant), the slopes of chain `c` at `slope(c)`; temporaries 0 and 1 are clobbered
    /// (and the opmasks at avx512).
    pub(crate) fn prelu(&mut self, chains: &[Chain], slope: impl Fn(&Chain) -> Src) {
        for c in chains {
            three!(self, vmulps, c.t[T1], c.x, slope(c));
        }
        self.select_negative(chains, T2, |c| (c.x, c.t[T1], c.x));
    }
}
