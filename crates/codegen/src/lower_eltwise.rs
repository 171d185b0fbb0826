//! Lowers the element-wise ops (relu, add, the activations, PReLU, the broadcasting binary
//! ops; at a wide tier around calls to the x64 backend's `EltwiseTile`), concat and channel
//! selection to Cranelift IR, with the vector approximations of `exp` and `tanh` the
//! activations need (Cranelift has neither).
//!
//! `exp` is Cephes' `expf`: `x = n ln 2 + r` with `n` rounded to the nearest integer and
//! `|r| <= ln(2) / 2`, `exp(r)` by a degree-7 polynomial, and `2^n` built in the exponent bits
//! (as two factors, so that `n` may reach 129 and -150 without an infinite or denormal
//! factor: the product overflows and underflows as the exact value does). Inputs are clamped
//! to `[-104, 89]` first, past which `exp` is 0 or infinite in f32 anyway; a NaN is put back at
//! the end (a clamp by `maxps`/`minps` drops it). `tanh` is Cephes' `tanhf`: an odd polynomial
//! below 0.625 and `1 - 2 / (exp(2|x|) + 1)` above. The bounds `runtime/tests/eltwise.rs`
//! checks against f64 are in [`EXP_ULPS`] and [`TANH_ULPS`].
//!
//! Sigmoid and SiLU divide their numerator (1 or `x`, halved) by `exp(-x) / 2 + 1 / 2`, whose
//! `2^(n - 1)` is one factor built from the rounding's own bits (`approx::LOGISTIC_EXP_MIN`),
//! and whose polynomial is of degree 5 (`approx::LOGISTIC_POLY`): 20 instructions to the 31 of
//! `1 / (1 + exp(-x))` through the general `exp` and a product, within 3 units in the last
//! place of f64 over the whole range (SiLU where `x` is above -87; below, the sigmoid
//! underflows and SiLU is within `1e-38 |x|`).

use crate::approx::{
    EXP_MAX, EXP_MIN, EXP_POLY, EXPM1_RANGE, LN2_HI, LN2_LO, LOGISTIC_EXP_MAX, LOGISTIC_EXP_MIN,
    LOGISTIC_POLY, ROUNDING_MAGIC, ROUNDING_MAGIC_HALF, TANH_POLY, TANH_SMALL,
};
use crate::backend::cranelift::{Emit, ExtentArg, F32_BYTES, FloatCC, Scalar, Value};
use crate::backend::x64::{EltwiseOp, EltwiseOperand, EltwiseTile, WideTile};
use crate::key::{Activation, BinaryKind, Broadcast, EltwiseDesc, EltwiseKind, Layout};
use crate::tile::LANES;

/// The largest error of the vector `exp` in units of the last place of the f32 result, where
/// that result is a normal number (tested over `[-87, 88]`); below, the absolute error is under
/// `2^-149` plus that of the last normal results.
pub const EXP_ULPS: f32 = 2.0;
/// The largest error of the vector `tanh`, in units of the last place of the result.
pub const TANH_ULPS: f32 = 3.0;

const SRC: usize = 0;
const DST: usize = 2;
const SRC2: usize = 3;

/// `y`, but NaN wherever `x` is NaN.
fn keep_nan(e: &mut Emit<'_>, x: Value, y: Value) -> Value {
    let nan = e.fcmp(FloatCC::Unordered, x, x);
    e.select_lanes(nan, x, y)
}

/// `2^k` for integer lanes `k` in `[-126, 127]`, built in the exponent bits.
fn pow2(e: &mut Emit<'_>, k: Value) -> Value {
    let bias = e.splat_i32(127);
    let biased = e.iadd(k, bias);
    let bits = e.ishl_imm(biased, 23);
    e.as_floats(bits)
}

/// `x` clamped to `[lo, hi]` and reduced: `(kf, q)` with `kf = x log2(e) + magic` (whose low
/// bits hold `n = round(x / ln 2)` plus `magic`'s own) and `q = expm1(x - n ln 2)` by
/// `r + r^2 poly(r)`, so that `exp(x) = (1 + q) 2^n`.
fn reduce(
    e: &mut Emit<'_>,
    x: Value,
    [lo, hi]: [f32; 2],
    magic: f32,
    poly: &[f32],
) -> (Value, Value) {
    let lo = e.splat_const(lo);
    let hi = e.splat_const(hi);
    let x = e.pmax(x, lo);
    let x = e.pmin(x, hi);
    // n = round(x / ln 2) by a magic number of 1.5 * 2^23: adding it rounds to an integer.
    let magic = e.splat_const(magic);
    let log2e = e.splat_const(std::f32::consts::LOG2_E);
    let kf = e.fma(x, log2e, magic);
    let nf = e.fsub(kf, magic);
    // r = x - n ln 2 in two steps (Cody and Waite): n * C1 is exact.
    let c1 = e.splat_const(LN2_HI);
    let c2 = e.splat_const(LN2_LO);
    let r = e.fma(nf, c1, x);
    let r = e.fma(nf, c2, r);
    let mut p = e.splat_const(poly[0]);
    for &k in &poly[1..] {
        let k = e.splat_const(k);
        p = e.fma(p, r, k);
    }
    let r2 = e.fmul(r, r);
    (kf, e.fma(p, r2, r))
}

/// `exp(x)` as `(q, n)`: `exp(x) = (1 + q) 2^n` with `q = expm1(r)` of the reduced argument
/// (so that `q` is `expm1(x)` itself where `n` is 0), `n` in integer lanes. NaN lanes are not
/// kept: the caller puts them back.
fn exp_parts(e: &mut Emit<'_>, x: Value, range: [f32; 2]) -> (Value, Value) {
    let (kf, q) = reduce(e, x, range, ROUNDING_MAGIC, &EXP_POLY);
    let magic = e.splat_const(ROUNDING_MAGIC);
    let (k_bits, magic_bits) = (e.as_ints(kf), e.as_ints(magic));
    (q, e.isub(k_bits, magic_bits))
}

/// `(1 + q) 2^n` as two factors `2^(n >> 1)` and `2^(n - (n >> 1))`, each a normal number for
/// `n` in `[-150, 129]`.
fn scale(e: &mut Emit<'_>, q: Value, n: Value) -> Value {
    let one = e.splat_const(1.0);
    let y = e.fadd(q, one);
    let n1 = e.sshr_imm(n, 1);
    let n2 = e.isub(n, n1);
    let (p1, p2) = (pow2(e, n1), pow2(e, n2));
    let y = e.fmul(y, p1);
    e.fmul(y, p2)
}

/// `exp(x)` of a vector, NaN lanes dropped (see [`exp`]).
fn exp_raw(e: &mut Emit<'_>, x: Value) -> Value {
    let (q, n) = exp_parts(e, x, [EXP_MIN, EXP_MAX]);
    scale(e, q, n)
}

/// `exp(x)` of a vector.
pub(crate) fn exp(e: &mut Emit<'_>, x: Value) -> Value {
    let y = exp_raw(e, x);
    keep_nan(e, x, y)
}

/// `exp(x) - 1` as `q 2^n + (2^n - 1)` in one fused multiply-add: `q` itself where the
/// reduction leaves `n = 0`, and no `1 + q` rounded before 1 is taken off elsewhere. Its input
/// is clamped to `EXPM1_RANGE`, so that `2^n` is one normal factor (and no register more is
/// live than `exp`'s: the wide tiles compute it in a chain's four temporaries).
fn expm1_raw(e: &mut Emit<'_>, x: Value) -> Value {
    let (q, n) = exp_parts(e, x, EXPM1_RANGE);
    let s = pow2(e, n);
    let one = e.splat_const(1.0);
    let s_1 = e.fsub(s, one);
    e.fma(q, s, s_1)
}

/// The logistic function's numerator over `1 + exp(-x)`: `numerator / 2` over
/// `exp(-x) / 2 + 1 / 2` (`approx::LOGISTIC_EXP_MIN`), with `exp`'s reduction and polynomial.
/// Sigmoid's numerator is 1 (`None`), SiLU's `x`. NaN lanes of `x` are dropped where the
/// numerator does not carry them.
fn logistic(e: &mut Emit<'_>, x: Value, numerator: Option<Value>) -> Value {
    let z = e.fneg(x);
    let range = [LOGISTIC_EXP_MIN, LOGISTIC_EXP_MAX];
    let (kf, q) = reduce(e, z, range, ROUNDING_MAGIC_HALF, &LOGISTIC_POLY);
    // 2^(n - 1): the low bits of kf's are n + 126.
    let k_bits = e.as_ints(kf);
    let half_pow = e.ishl_imm(k_bits, 23);
    let half_pow = e.as_floats(half_pow);
    let one = e.splat_const(1.0);
    let y = e.fadd(q, one);
    // exp(-x) / 2 + 1 / 2: infinite where 2^(n - 1) is, as 1 + q is positive.
    let y = e.fmul(y, half_pow);
    let half = e.splat_const(0.5);
    let d = e.fadd(y, half);
    let n = match numerator {
        Some(v) => e.fmul(v, half),
        None => half,
    };
    e.fdiv(n, d)
}

/// `tanh(x)`: Cephes' `tanhf`.
fn tanh_raw(e: &mut Emit<'_>, x: Value) -> Value {
    let ax = e.fabs(x);
    // Above 0.625: 1 - 2 / (exp(2|x|) + 1), with x's sign.
    let two = e.splat_const(2.0);
    let one = e.splat_const(1.0);
    let a2 = e.fmul(ax, two);
    let ex = exp_raw(e, a2);
    let d = e.fadd(ex, one);
    let t = e.fdiv(two, d);
    let big = e.fsub(one, t);
    let neg = e.fneg(big);
    let zero = e.splat_const(0.0);
    let negative = e.fcmp(FloatCC::LessThan, x, zero);
    let big = e.select_lanes(negative, neg, big);
    // Below: x + x^3 P(x^2).
    let z = e.fmul(x, x);
    let mut p = e.splat_const(TANH_POLY[0]);
    for &k in &TANH_POLY[1..] {
        let k = e.splat_const(k);
        p = e.fma(p, z, k);
    }
    let pz = e.fmul(p, z);
    let small = e.fma(pz, x, x);
    let limit = e.splat_const(TANH_SMALL);
    let is_small = e.fcmp(FloatCC::LessThan, ax, limit);
    e.select_lanes(is_small, small, big)
}

/// `max(0, min(1, alpha x + beta))`, NaN lanes dropped.
fn hard_sigmoid_raw(e: &mut Emit<'_>, x: Value, alpha: f32, beta: f32) -> Value {
    let (a, b) = (e.splat_const(alpha), e.splat_const(beta));
    let y = e.fma(x, a, b);
    let (zero, one) = (e.splat_const(0.0), e.splat_const(1.0));
    let y = e.pmax(y, zero);
    e.pmin(y, one)
}

/// `act(x)` of a vector, in registers: the standalone kernels' and the conv post-op's.
pub(crate) fn activation(e: &mut Emit<'_>, act: Activation, x: Value) -> Value {
    let zero = e.splat_const(0.0);
    match act {
        Activation::Sigmoid => {
            let y = logistic(e, x, None);
            keep_nan(e, x, y)
        }
        Activation::HardSigmoid { alpha, beta } => {
            let y = hard_sigmoid_raw(e, x, alpha, beta);
            keep_nan(e, x, y)
        }
        Activation::HardSwish => {
            let h = hard_sigmoid_raw(e, x, 1.0 / 6.0, 0.5);
            // NaN times anything is NaN: no lane to put back.
            e.fmul(x, h)
        }
        Activation::Tanh => {
            let y = tanh_raw(e, x);
            keep_nan(e, x, y)
        }
        Activation::LeakyRelu { alpha } => {
            let a = e.splat_const(alpha);
            let scaled = e.fmul(x, a);
            let negative = e.fcmp(FloatCC::LessThan, x, zero);
            e.select_lanes(negative, scaled, x)
        }
        Activation::Elu { alpha } => {
            let m = expm1_raw(e, x);
            let a = e.splat_const(alpha);
            let scaled = e.fmul(m, a);
            let negative = e.fcmp(FloatCC::LessThan, x, zero);
            e.select_lanes(negative, scaled, x)
        }
        Activation::Silu => logistic(e, x, Some(x)),
        Activation::Exp => exp(e, x),
    }
}

/// The second operand of a kernel's op for the plane at hand: a vector loaded once per plane
/// (a slope, a broadcast value), or one per vector of the source (a full second source).
#[derive(Clone, Copy)]
enum Operand {
    None,
    PerPlane,
    PerElement,
}

/// `x < 0 ? x * slope : x`: the standalone PReLU and a conv's PReLU post-op, so that both
/// round the same product (and a NaN or -0 goes through).
pub(crate) fn prelu(e: &mut Emit<'_>, x: Value, slope: Value, zero: Value) -> Value {
    let scaled = e.fmul(x, slope);
    let negative = e.fcmp(FloatCC::LessThan, x, zero);
    e.select_lanes(negative, scaled, x)
}

/// `x op y` of the key's kind; `zero` is a vector of zeros for relu and PReLU, made once
/// before the loops (made in a loop's body, it was a constant load per vector).
fn apply(
    e: &mut Emit<'_>,
    kind: EltwiseKind,
    x: Value,
    y: Option<Value>,
    zero: Option<Value>,
) -> Value {
    match kind {
        EltwiseKind::Act(a) => activation(e, a, x),
        EltwiseKind::PRelu => prelu(e, x, y.expect("a slope"), zero.expect("zeros")),
        EltwiseKind::Binary { op, .. } => {
            let y = y.expect("a second operand");
            match op {
                BinaryKind::Add => e.fadd(x, y),
                BinaryKind::Sub => e.fsub(x, y),
                BinaryKind::Mul => e.fmul(x, y),
                BinaryKind::Div => e.fdiv(x, y),
            }
        }
        // `x` unless below zero: NaN stays.
        EltwiseKind::Relu => e.pmax(zero.expect("zeros"), x),
        EltwiseKind::Add => {
            let y = y.expect("a second source");
            e.fadd(x, y)
        }
    }
}

/// Every element-wise op: for each image and channel plane (a block of four channels in
/// `nChw4c`), the contiguous span of the call's rows: at a wide tier its whole wide vectors in
/// the backend's `EltwiseTile` (but in a masked last block), then four floats at a time (one at
/// a time for an NCHW remainder), with the tile's operations on each vector. A per-channel
/// operand is loaded once per plane. In `nChw4c` the padding lanes of a last, partial block
/// are written as zeros, so that no op (a division of zeros) leaves a NaN there for a
/// convolution to multiply by its zero weights. Runtime extents change only the strides and
/// the span's length, which the loops take from registers.
pub fn lower(e: &mut Emit<'_>, d: &EltwiseDesc) {
    let f = F32_BYTES;
    let [n, c, h, w] = d.shape;
    let h = e.extent_or(d.runtime.h, ExtentArg::InputH, h);
    let w = e.extent_or(d.runtime.w, ExtentArg::InputW, w);
    let strides = e.act_strides(d.layout, c, h, w);
    let planes = match d.layout {
        Layout::Nchw => c,
        Layout::Nchw4c => c.div_ceil(LANES),
    };
    let plane_stride = match d.layout {
        Layout::Nchw => strides.channel,
        Layout::Nchw4c => strides.block,
    };
    let image_stride = e.mul(strides.image, f);
    let plane_bytes = e.mul(plane_stride, f);
    let row = strides.row;
    // Per image and per plane: how far the second operand's pointer moves, in bytes.
    let lane_bytes = match d.layout {
        Layout::Nchw => f,
        Layout::Nchw4c => LANES as i64 * f,
    };
    let per_plane = |image: i64| {
        (
            Operand::PerPlane,
            Scalar::Const(image),
            Scalar::Const(lane_bytes),
        )
    };
    let (operand, image_step, step) = match d.kind {
        EltwiseKind::PRelu => per_plane(0),
        EltwiseKind::Add
        | EltwiseKind::Binary {
            rhs: Broadcast::Full,
            ..
        } => (Operand::PerElement, image_stride, plane_bytes),
        EltwiseKind::Binary {
            rhs: Broadcast::PerImageChannel,
            ..
        } => per_plane(planes as i64 * lane_bytes),
        EltwiseKind::Binary {
            rhs: Broadcast::PerChannel,
            ..
        } => per_plane(0),
        EltwiseKind::Relu | EltwiseKind::Act(_) => {
            (Operand::None, Scalar::Const(0), Scalar::Const(0))
        }
    };
    let src = e.buffer(SRC);
    let dst = e.buffer(DST);
    let second = !matches!(operand, Operand::None);
    let src2 = second.then(|| e.buffer(SRC2));
    let zero = Scalar::Const(0);
    let (start, end) = e.clamp_items_to(zero, h);
    let row_bytes = e.mul(row, f);
    let row_bytes = e.value(row_bytes);
    let first = e.imul(start, row_bytes);
    let count = e.isub(end, start);
    let row = e.value(row);
    let count = e.imul(count, row);
    let zero_i = e.iconst(0);
    let count = e.imax(count, zero_i);
    let vectors = e.ushr_imm(count, 2);
    let tail = e.band_imm(count, 3);

    let src0 = e.iadd(src, first);
    let dst0 = e.iadd(dst, first);
    let mut bases = vec![src0, dst0];
    // A full second source starts at the call's first row like the first; a per-plane one at
    // its first plane.
    if let Some(s2) = src2 {
        bases.push(match operand {
            Operand::PerElement => e.iadd(s2, first),
            _ => s2,
        });
    }
    let mut image_steps = vec![image_stride, image_stride];
    let mut plane_steps = vec![plane_bytes, plane_bytes];
    if second {
        image_steps.push(image_step);
        plane_steps.push(step);
    }
    let partial = c % LANES;
    let masked = d.layout == Layout::Nchw4c && partial != 0;
    // Rows of nChw4c hold whole vectors; an NCHW span has a remainder only when W does.
    let scalar_tail =
        d.layout == Layout::Nchw && !matches!(w, Scalar::Const(w) if w % LANES as i64 == 0);
    let kind = d.kind;
    let zeros = matches!(kind, EltwiseKind::Relu | EltwiseKind::PRelu).then(|| e.splat_const(0.0));
    let wide = wide_tile(d, operand);
    // One plane: its operand, its vectors (whole wide vectors first at a wide tier, but in a
    // masked plane), its scalar remainder.
    let plane = |e: &mut Emit<'_>, p: &[Value], mask: Option<Value>| {
        let (first, p) = match (&wide, mask) {
            (Some(tile), None) => {
                // `lanes / 4` four-float units a wide vector.
                let units = tile.isa.target().lanes / LANES;
                let whole = e.ushr_imm(vectors, units.trailing_zeros() as i64);
                let src2 = if second { p[2] } else { p[0] };
                e.call_tile(WideTile::Eltwise(tile.clone()), &[p[0], p[1], src2, whole]);
                let first = e.imul_imm(whole, units as i64);
                let bytes = e.imul_imm(first, LANES as i64 * f);
                let mut moved = vec![e.iadd(p[0], bytes), e.iadd(p[1], bytes)];
                if second {
                    moved.push(match operand {
                        Operand::PerElement => e.iadd(p[2], bytes),
                        _ => p[2],
                    });
                }
                (first, moved)
            }
            _ => (zero_i, p.to_vec()),
        };
        let p = &p[..];
        let per_plane = match operand {
            Operand::PerPlane => Some(match d.layout {
                Layout::Nchw4c => e.load_vec(p[2], 0),
                Layout::Nchw => e.splat_load(p[2], 0),
            }),
            _ => None,
        };
        let after = e.for_range(first, vectors, p, |e, _, q| {
            let x = e.load_vec(q[0], 0);
            let y = match per_plane {
                Some(v) => Some(v),
                None if second => Some(e.load_vec(q[2], 0)),
                None => None,
            };
            let mut r = apply(e, kind, x, y, zeros);
            if let Some(m) = mask {
                r = e.keep_lanes(r, m);
            }
            e.store_vec(r, q[1], 0);
            let mut next = vec![
                e.offset(q[0], LANES as i64 * f),
                e.offset(q[1], LANES as i64 * f),
            ];
            if second {
                next.push(match operand {
                    Operand::PerElement => e.offset(q[2], LANES as i64 * f),
                    _ => q[2],
                });
            }
            next
        });
        if scalar_tail {
            e.for_range(zero_i, tail, &after, |e, _, q| {
                let x = e.load_f32(q[0], 0);
                let x = e.splat_f32(x);
                let y = match per_plane {
                    Some(v) => Some(v),
                    None if second => Some(e.splat_load(q[2], 0)),
                    None => None,
                };
                let r = apply(e, kind, x, y, zeros);
                let r = e.extract_lane(r, 0);
                e.store_f32(r, q[1], 0);
                let mut next = vec![e.offset(q[0], f), e.offset(q[1], f)];
                if second {
                    next.push(match operand {
                        Operand::PerElement => e.offset(q[2], f),
                        _ => q[2],
                    });
                }
                next
            });
        }
    };
    let full_planes = if masked { planes - 1 } else { planes };
    let count = |k: usize| Scalar::Const(k as i64);
    e.for_ptrs(count(n), &bases, &image_steps, |e, p| {
        let p = p.to_vec();
        let last = e.for_ptrs(count(full_planes), &p, &plane_steps, |e, q| {
            plane(e, q, None);
        });
        if masked {
            let mask = e.lane_mask(partial);
            plane(e, &last, Some(mask));
        }
    });
}

/// The backend's tile for the whole wide vectors of a plane's span, at a wide tier.
fn wide_tile(d: &EltwiseDesc, operand: Operand) -> Option<EltwiseTile> {
    let op = match d.kind {
        EltwiseKind::Act(act) => EltwiseOp::Act(act),
        EltwiseKind::PRelu => EltwiseOp::PRelu,
        EltwiseKind::Binary { op, .. } => EltwiseOp::Binary(op),
        // Memory-bound at x128 already (decision 023).
        EltwiseKind::Relu | EltwiseKind::Add => return None,
    };
    let operand = match (operand, d.layout) {
        (Operand::None, _) => EltwiseOperand::None,
        (Operand::PerElement, _) => EltwiseOperand::Vector,
        (Operand::PerPlane, Layout::Nchw4c) => EltwiseOperand::Block,
        (Operand::PerPlane, Layout::Nchw) => EltwiseOperand::Scalar,
    };
    let tile = EltwiseTile {
        isa: d.isa,
        op,
        operand,
    };
    tile.fits().then_some(tile)
}

/// Copies `pixels` pixels of `lanes` channels from `src` (lanes `0..lanes` of each
/// `nChw4c` pixel) to `dst`, where source lane `l` lands in channel `shift + l` counted from
/// the block at `dst` (the next block is `dst_block` bytes on): a vector per pixel where the
/// blocks line up, scalars elsewhere.
fn copy_lanes(
    e: &mut Emit<'_>,
    pixels: Value,
    src: Value,
    dst: Value,
    lanes: usize,
    shift: usize,
    dst_block: Scalar,
) {
    let f = F32_BYTES;
    let zero = e.iconst(0);
    let px = LANES as i64 * f;
    // Lanes past the block land in the next one, a pointer of its own (its distance may be a
    // runtime value).
    let mut ptrs = vec![src, dst];
    if shift + lanes > LANES {
        ptrs.push(e.offset_by(dst, dst_block, 1));
    }
    e.for_range(zero, pixels, &ptrs, |e, _, q| {
        if shift == 0 && lanes == LANES {
            let v = e.load_vec(q[0], 0);
            e.store_vec(v, q[1], 0);
        } else {
            for l in 0..lanes {
                let t = shift + l;
                let x = e.load_f32(q[0], l as i64 * f);
                e.store_f32(x, q[1 + t / LANES], (t % LANES) as i64 * f);
            }
        }
        q.iter().map(|&p| e.offset(p, px)).collect()
    });
}

/// Concat along channels: every input's rows of the call copied into the result's channels
/// from its offset on. In `nChw4c`, whole source blocks go by one loop over blocks (a vector
/// copy per pixel when the offset is a multiple of four, four lane copies otherwise), a last
/// partial block lane by lane, and the result's padding lanes are written as zeros; in NCHW
/// each channel's span of rows is contiguous in both, and is copied four floats at a time.
/// Runtime extents change only the strides and the spans' lengths.
pub fn lower_concat(e: &mut Emit<'_>, d: &crate::key::ConcatDesc) {
    let f = F32_BYTES;
    let h = e.extent_or(d.runtime.h, ExtentArg::InputH, d.h);
    let w = e.extent_or(d.runtime.w, ExtentArg::InputW, d.w);
    let total = d.total_channels();
    let dst = e.buffer(DST);
    let srcs: Vec<Value> = (0..d.channels.len())
        .map(|i| e.buffer(if i == 0 { SRC } else { SRC2 + i - 1 }))
        .collect();
    let (start, end) = e.clamp_items_to(Scalar::Const(0), h);
    let rows = e.isub(end, start);
    let zero_i = e.iconst(0);
    let rows = e.imax(rows, zero_i);
    let w_value = e.value(w);
    let pixels = e.imul(rows, w_value);
    // Byte strides: a channel's plane in NCHW, and (`x4`) a block's in nChw4c.
    let plane = e.product(h, w);
    let plane_bytes = e.mul(plane, f);
    let count = |k: usize| Scalar::Const(k as i64);
    match d.layout {
        Layout::Nchw4c => {
            let block = e.mul(plane_bytes, LANES as i64);
            let row_bytes = e.mul(w, LANES as i64 * f);
            let row_bytes = e.value(row_bytes);
            let first = e.imul(start, row_bytes);
            let dst0 = e.iadd(dst, first);
            let dst_image = e.mul(block, total.div_ceil(LANES) as i64);
            let mut c0 = 0;
            for (&c, &src) in d.channels.iter().zip(&srcs) {
                let src0 = e.iadd(src, first);
                let src_image = e.mul(block, c.div_ceil(LANES) as i64);
                let (full, part, shift) = (c / LANES, c % LANES, c0 % LANES);
                let dst_c = e.offset_by(dst0, block, (c0 / LANES) as i64);
                e.for_ptrs(
                    count(d.mb),
                    &[src0, dst_c],
                    &[src_image, dst_image],
                    |e, p| {
                        let last = e.for_ptrs(count(full), p, &[block, block], |e, q| {
                            copy_lanes(e, pixels, q[0], q[1], LANES, shift, block);
                        });
                        if part > 0 {
                            copy_lanes(e, pixels, last[0], last[1], part, shift, block);
                        }
                    },
                );
                c0 += c;
            }
            let padded = total % LANES;
            if padded != 0 {
                let last = e.offset_by(dst0, block, (total / LANES) as i64);
                let zero = e.f32const(0.0);
                e.for_ptrs(count(d.mb), &[last], &[dst_image], |e, p| {
                    e.for_range(zero_i, pixels, p, |e, _, q| {
                        for l in padded..LANES {
                            e.store_f32(zero, q[0], l as i64 * f);
                        }
                        vec![e.offset(q[0], LANES as i64 * f)]
                    });
                });
            }
        }
        Layout::Nchw => {
            let row_bytes = e.mul(w, f);
            let row_bytes = e.value(row_bytes);
            let first = e.imul(start, row_bytes);
            let dst0 = e.iadd(dst, first);
            let dst_image = e.mul(plane_bytes, total as i64);
            let vectors = e.ushr_imm(pixels, 2);
            let tail = e.band_imm(pixels, 3);
            let mut c0 = 0;
            for (&c, &src) in d.channels.iter().zip(&srcs) {
                let src0 = e.iadd(src, first);
                let dst_c = e.offset_by(dst0, plane_bytes, c0 as i64);
                let src_image = e.mul(plane_bytes, c as i64);
                let steps = [src_image, dst_image];
                e.for_ptrs(count(d.mb), &[src0, dst_c], &steps, |e, p| {
                    e.for_ptrs(count(c), p, &[plane_bytes, plane_bytes], |e, q| {
                        let after = e.for_range(zero_i, vectors, q, |e, _, r| {
                            let v = e.load_vec(r[0], 0);
                            e.store_vec(v, r[1], 0);
                            let step = LANES as i64 * f;
                            vec![e.offset(r[0], step), e.offset(r[1], step)]
                        });
                        e.for_range(zero_i, tail, &after, |e, _, r| {
                            let x = e.load_f32(r[0], 0);
                            e.store_f32(x, r[1], 0);
                            vec![e.offset(r[0], f), e.offset(r[1], f)]
                        });
                    });
                });
                c0 += c;
            }
        }
    }
}

/// Picks channels: for each image and destination block of four channels, the pixels of the
/// call's rows, each a vector copy where the block's four source channels are one aligned
/// source block, else four lane copies (zeros in the padding lanes of a last, partial
/// block); in NCHW, each destination channel's span of rows copied from its source channel.
/// How an `nChw4c` channel selection fills one destination block from its four source
/// channels (`None`: a padding lane, +0).
#[derive(Clone, Copy, Debug, PartialEq)]
enum BlockCopy {
    /// A whole source block, starting at this channel.
    Whole(usize),
    /// Lanes of at most two source blocks (any channel of each), padding lanes from a zero
    /// vector where only one block is read: one shuffle per pixel (a channel shuffle's
    /// interleave of two halves, an unaligned slice).
    Shuffle {
        first: usize,
        second: Option<usize>,
        lanes: [u8; 4],
    },
    /// Lane by lane: three or four source blocks, or padding lanes beside two.
    Lanes,
}

impl BlockCopy {
    fn of(lanes: &[Option<usize>]) -> BlockCopy {
        let block = |s: usize| s / LANES;
        if let Some(s0) = lanes[0]
            && s0 % LANES == 0
            && (0..LANES).all(|l| lanes[l] == Some(s0 + l))
        {
            return BlockCopy::Whole(s0);
        }
        let mut blocks: Vec<usize> = lanes.iter().flatten().map(|&s| block(s)).collect();
        blocks.sort_unstable();
        blocks.dedup();
        let padded = lanes.iter().any(Option::is_none);
        let (first, second) = match blocks[..] {
            [a] => (a, None),
            [a, b] if !padded => (a, Some(b)),
            _ => return BlockCopy::Lanes,
        };
        let lane = |s: Option<usize>| match s {
            Some(s) if block(s) == first => (s % LANES) as u8,
            Some(s) => (LANES + s % LANES) as u8,
            // Lane 0 of the zero vector.
            None => LANES as u8,
        };
        BlockCopy::Shuffle {
            first: first * LANES,
            second: second.map(|b| b * LANES),
            lanes: [
                lane(lanes[0]),
                lane(lanes[1]),
                lane(lanes[2]),
                lane(lanes[3]),
            ],
        }
    }
}

pub fn lower_select(e: &mut Emit<'_>, d: &crate::key::SelectDesc) {
    let f = F32_BYTES;
    let (h, w, out) = (d.h, d.w, d.select.len());
    let src = e.buffer(SRC);
    let dst = e.buffer(DST);
    let (start, end) = e.clamp_items(0, h);
    let rows = e.isub(end, start);
    let zero_i = e.iconst(0);
    let rows = e.imax(rows, zero_i);
    let pixels = e.imul_imm(rows, w as i64);
    let plane_bytes = (h * w) as i64 * f;
    match d.layout {
        Layout::Nchw4c => {
            let block = plane_bytes * LANES as i64;
            let first = e.imul_imm(start, (w * LANES) as i64 * f);
            let src0 = e.iadd(src, first);
            let dst0 = e.iadd(dst, first);
            let steps = [
                d.c.div_ceil(LANES) as i64 * block,
                out.div_ceil(LANES) as i64 * block,
            ];
            let zero = e.f32const(0.0);
            e.for_count_ptrs(d.mb, &[src0, dst0], &steps, |e, p| {
                for b in 0..out.div_ceil(LANES) {
                    let lanes: Vec<Option<usize>> = (0..LANES)
                        .map(|l| d.select.get(b * LANES + l).copied())
                        .collect();
                    let copy = BlockCopy::of(&lanes);
                    let dst_b = e.offset(p[1], b as i64 * block);
                    let px = LANES as i64 * f;
                    e.for_range(zero_i, pixels, &[p[0], dst_b], |e, _, q| {
                        let source = |e: &mut Emit<'_>, s: usize| {
                            e.load_vec(q[0], (s / LANES) as i64 * block)
                        };
                        match copy {
                            BlockCopy::Whole(s0) => {
                                let v = source(e, s0);
                                e.store_vec(v, q[1], 0);
                            }
                            BlockCopy::Shuffle {
                                first,
                                second,
                                lanes,
                            } => {
                                let a = source(e, first);
                                let b = match second {
                                    Some(s) => source(e, s),
                                    None => e.splat_const(0.0),
                                };
                                let v = e.shuffle_lanes(a, b, lanes);
                                e.store_vec(v, q[1], 0);
                            }
                            BlockCopy::Lanes => {
                                for (l, s) in lanes.iter().enumerate() {
                                    let x = match s {
                                        Some(s) => {
                                            let off =
                                                (s / LANES) as i64 * block + (s % LANES) as i64 * f;
                                            e.load_f32(q[0], off)
                                        }
                                        None => zero,
                                    };
                                    e.store_f32(x, q[1], l as i64 * f);
                                }
                            }
                        }
                        vec![e.offset(q[0], px), e.offset(q[1], px)]
                    });
                }
            });
        }
        Layout::Nchw => {
            let first = e.imul_imm(start, w as i64 * f);
            let src0 = e.iadd(src, first);
            let dst0 = e.iadd(dst, first);
            let vectors = e.ushr_imm(pixels, 2);
            let tail = e.band_imm(pixels, 3);
            let steps = [d.c as i64 * plane_bytes, out as i64 * plane_bytes];
            e.for_count_ptrs(d.mb, &[src0, dst0], &steps, |e, p| {
                for (j, &s) in d.select.iter().enumerate() {
                    let q = [
                        e.offset(p[0], s as i64 * plane_bytes),
                        e.offset(p[1], j as i64 * plane_bytes),
                    ];
                    let after = e.for_range(zero_i, vectors, &q, |e, _, r| {
                        let v = e.load_vec(r[0], 0);
                        e.store_vec(v, r[1], 0);
                        let step = LANES as i64 * f;
                        vec![e.offset(r[0], step), e.offset(r[1], step)]
                    });
                    e.for_range(zero_i, tail, &after, |e, _, r| {
                        let x = e.load_f32(r[0], 0);
                        e.store_f32(x, r[1], 0);
                        vec![e.offset(r[0], f), e.offset(r[1], f)]
                    });
                }
            });
        }
    }
}
