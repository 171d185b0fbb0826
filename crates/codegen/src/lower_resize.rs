//! The resize kernel: per output pixel of nChw4c tensors, one vector of four channels copied
//! from its nearest source pixel or blended from the 2x2 around its source coordinate.
//!
//! Source coordinates are exact, as in the reference interpreter: along each axis the source
//! coordinate of output `x` is the rational `(a x + b) / d` of the coordinate mode
//! ([`primjit_ir::CoordMode::source_affine_by`]: by the scale factor where the key has one,
//! else by the extents), here shifted by one whole `d` so that its numerator is never
//! negative. A row's quotient and remainder come from one division; along a row they are
//! stepped from column to column by adding `a`'s quotient and remainder, so a column costs a
//! few integer instructions and no division. Extents may be runtime values (the input's with
//! scale factors, the input's and the output's with sizes): maps that depend on them are then
//! computed at the start of the call.

use crate::backend::cranelift::{Emit, ExtentArg, F32_BYTES, IntCC, Scalar, Value};
use crate::key::{CoordMode, NearestMode, ResizeDesc, ResizeMode, ResizeOut, ScaleFactor};

/// Buffer indices of the kernel's arguments.
const SRC: usize = 0;
const DST: usize = 2;
/// Bytes of one nChw4c pixel: four channels.
const PIXEL: i64 = 4 * F32_BYTES;

/// One axis's map from output to input index: the source numerator `a x + b` over `d`, all
/// three already adjusted for the rounding of the mode and shifted by one `d` so that the
/// numerator is at least 0 (every mode's `b` is above `-d`): the index is the quotient
/// less one.
struct AxisMap {
    input: Value,
    a: Value,
    b: Value,
    d: Value,
    /// `a / d` and `a % d`, the step of the quotient and remainder from one output to the next.
    a_div: Value,
    a_rem: Value,
}

/// `(a, b, d)` of [`CoordMode::source_affine`] for runtime extents: `i` and `o` are the
/// input and output extents, or a scale factor's denominator and numerator
/// ([`CoordMode::source_affine_by`]); `output` is the output extent, which decides whether the
/// modes that map a single pixel to 0 do.
fn runtime_affine(
    e: &mut Emit<'_>,
    coord: CoordMode,
    i: Value,
    o: Value,
    output: Value,
) -> [Value; 3] {
    let zero = e.iconst(0);
    let one = e.iconst(1);
    let two_i = e.imul_imm(i, 2);
    let two_o = e.imul_imm(o, 2);
    let i_less_o = e.isub(i, o);
    // The modes that map every output to 0 when the output has extent 1.
    let degenerate = |e: &mut Emit<'_>, [a, b, d]: [Value; 3]| {
        let single = e.icmp_imm(IntCC::Equal, output, 1);
        [
            e.select(single, zero, a),
            e.select(single, zero, b),
            e.select(single, one, d),
        ]
    };
    match coord {
        CoordMode::Asymmetric => [i, zero, o],
        CoordMode::HalfPixel => [two_i, i_less_o, two_o],
        CoordMode::PytorchHalfPixel => degenerate(e, [two_i, i_less_o, two_o]),
        CoordMode::AlignCorners => {
            let i1 = e.offset(i, -1);
            let o1 = e.offset(o, -1);
            degenerate(e, [i1, zero, o1])
        }
        CoordMode::TfHalfPixelForNearest => [two_i, i, two_o],
    }
}

/// The map of one axis from `i` input to `o` output pixels, by `scale` where the key has one.
fn axis_map(
    e: &mut Emit<'_>,
    mode: ResizeMode,
    coord: CoordMode,
    [i, o]: [Scalar; 2],
    scale: Option<ScaleFactor>,
) -> AxisMap {
    // The rounding of each nearest mode as a change of numerator and denominator:
    // floor(n / d), ceil = floor((n + d - 1) / d), halves down = floor((2n + d - 1) / 2d),
    // halves up = floor((2n + d) / 2d); then one `d` more.
    let adjust = |[a, b, d]: [i128; 3]| -> [i128; 3] {
        let [a, b, d] = match mode {
            ResizeMode::Linear | ResizeMode::Nearest(NearestMode::Floor) => [a, b, d],
            ResizeMode::Nearest(NearestMode::Ceil) => [a, b + d - 1, d],
            ResizeMode::Nearest(NearestMode::RoundPreferFloor) => [2 * a, 2 * b + d - 1, 2 * d],
            ResizeMode::Nearest(NearestMode::RoundPreferCeil) => [2 * a, 2 * b + d, 2 * d],
        };
        [a, b + d, d]
    };
    let input = e.value(i);
    let [a, b, d] = match (i, o) {
        (Scalar::Const(i), Scalar::Const(o)) => {
            let (a, b, d) = coord.source_affine_by(i as u64, o as u64, scale);
            let abd = adjust([a, b, d]).map(|v| v as i64);
            let [a, b, d] = abd.map(|v| e.iconst(v));
            let (a_div, a_rem) = (e.iconst(abd[0] / abd[2]), e.iconst(abd[0] % abd[2]));
            return AxisMap {
                input,
                a,
                b,
                d,
                a_div,
                a_rem,
            };
        }
        _ => {
            let output = e.value(o);
            let [i, o] = match scale {
                Some(s) if coord != CoordMode::AlignCorners => {
                    [e.iconst(s.den() as i64), e.iconst(s.num() as i64)]
                }
                _ => [input, output],
            };
            let [a, b, d] = runtime_affine(e, coord, i, o, output);
            match mode {
                ResizeMode::Linear | ResizeMode::Nearest(NearestMode::Floor) => [a, b, d],
                ResizeMode::Nearest(NearestMode::Ceil) => {
                    let b = e.iadd(b, d);
                    [a, e.offset(b, -1), d]
                }
                ResizeMode::Nearest(round) => {
                    let a2 = e.imul_imm(a, 2);
                    let b2 = e.imul_imm(b, 2);
                    let b2 = e.iadd(b2, d);
                    let b2 = if round == NearestMode::RoundPreferFloor {
                        e.offset(b2, -1)
                    } else {
                        b2
                    };
                    [a2, b2, e.imul_imm(d, 2)]
                }
            }
        }
    };
    let b = e.iadd(b, d);
    let a_div = e.udiv(a, d);
    let a_rem = e.urem(a, d);
    AxisMap {
        input,
        a,
        b,
        d,
        a_div,
        a_rem,
    }
}

/// The quotient and remainder of output `x`'s numerator, by one division.
fn divide_at(e: &mut Emit<'_>, m: &AxisMap, x: Value) -> (Value, Value) {
    let ax = e.imul(m.a, x);
    let n = e.iadd(ax, m.b);
    let q = e.udiv(n, m.d);
    let qd = e.imul(q, m.d);
    (q, e.isub(n, qd))
}

/// The quotient and remainder of the next output's numerator.
fn step(e: &mut Emit<'_>, m: &AxisMap, q: Value, r: Value) -> (Value, Value) {
    let r = e.iadd(r, m.a_rem);
    let q = e.iadd(q, m.a_div);
    let carry = e.icmp(IntCC::SignedGreaterThanOrEqual, r, m.d);
    let zero = e.iconst(0);
    let back = e.select(carry, m.d, zero);
    let r = e.isub(r, back);
    let carry = e.zero_extend(carry);
    (e.iadd(q, carry), r)
}

/// The taps of a quotient and remainder: `(i0, i1, w1)`, the first and second source index and
/// the second's weight as an f32 splat (for nearest, `i1 = i0` and no weight).
fn taps(
    e: &mut Emit<'_>,
    mode: ResizeMode,
    m: &AxisMap,
    q: Value,
    r: Value,
) -> (Value, Value, Option<Value>) {
    let zero = e.iconst(0);
    let last = e.offset(m.input, -1);
    let index = e.offset(q, -1);
    let i0 = e.imax(index, zero);
    let i0 = e.imin(i0, last);
    match mode {
        ResizeMode::Nearest(_) => (i0, i0, None),
        ResizeMode::Linear => {
            // Clamped coordinates sit on a pixel: no weight on the next.
            let inside = e.icmp(IntCC::Equal, i0, index);
            let below_last = e.icmp(IntCC::SignedLessThan, index, last);
            let inside = e.band(inside, below_last);
            let r = e.select(inside, r, zero);
            let next = e.offset(i0, 1);
            let i1 = e.imin(next, last);
            let rf = e.int_to_f32(r);
            let df = e.int_to_f32(m.d);
            let w = e.fdiv(rf, df);
            (i0, i1, Some(w))
        }
    }
}

/// `(1 - w) * x0 + w * x1` on vectors, with `w0 = 1 - w` and `w1 = w` splat.
fn blend(e: &mut Emit<'_>, w0: Value, w1: Value, x0: Value, x1: Value) -> Value {
    let p = e.fmul(w0, x0);
    e.fma(w1, x1, p)
}

/// Splats of `(1 - w, w)`.
fn weights(e: &mut Emit<'_>, w: Value) -> (Value, Value) {
    let one = e.f32const(1.0);
    let w0 = e.fsub(one, w);
    (e.splat_f32(w0), e.splat_f32(w))
}

/// The kernel of a resize key: work items are output rows, of every image.
pub fn lower_resize(e: &mut Emit<'_>, d: &ResizeDesc) {
    let [oh_fixed, ow_fixed] = d.out_extents();
    let ih = e.extent_or(d.runtime.h, ExtentArg::InputH, d.ih);
    let iw = e.extent_or(d.runtime.w, ExtentArg::InputW, d.iw);
    let oh = e.extent_or(d.runtime.h, ExtentArg::OutputH, oh_fixed);
    let ow = e.extent_or(d.runtime.w, ExtentArg::OutputW, ow_fixed);
    let scale = match d.out {
        ResizeOut::Scale(f) => Some(f),
        ResizeOut::Sizes(_) => None,
    };
    let rows = axis_map(e, d.mode, d.coord, [ih, oh], scale.map(|f| f[0]));
    let cols = axis_map(e, d.mode, d.coord, [iw, ow], scale.map(|f| f[1]));
    let src = e.buffer(SRC);
    let dst = e.buffer(DST);
    let blocks = d.c.div_ceil(4) as i64;
    let in_row = e.mul(iw, PIXEL);
    let out_row = e.mul(ow, PIXEL);
    let in_plane = e.product(ih, in_row);
    let out_plane = e.product(oh, out_row);
    let in_image = e.mul(in_plane, blocks);
    let out_image = e.mul(out_plane, blocks);
    let zero = e.iconst(0);
    let (start, end) = e.clamp_items_to(Scalar::Const(0), oh);
    let ow_v = e.value(ow);
    let in_row_v = e.value(in_row);
    let out_row_v = e.value(out_row);
    // The first column's quotient and remainder, the same for every row.
    let (q0, r0) = divide_at(e, &cols, zero);
    e.for_ptrs(
        Scalar::Const(d.mb as i64),
        &[src, dst],
        &[in_image, out_image],
        |e, img| {
            e.for_range(start, end, &[], |e, oy, _| {
                let (qy, ry) = divide_at(e, &rows, oy);
                let (y0, y1, wy) = taps(e, d.mode, &rows, qy, ry);
                let off0 = e.imul(y0, in_row_v);
                let row0 = e.iadd(img[0], off0);
                let off1 = e.imul(y1, in_row_v);
                let row1 = e.iadd(img[0], off1);
                let out_off = e.imul(oy, out_row_v);
                let out = e.iadd(img[1], out_off);
                let wy = wy.map(|w| weights(e, w));
                e.for_range(zero, ow_v, &[q0, r0, out], |e, _, s| {
                    let (x0, x1, wx) = taps(e, d.mode, &cols, s[0], s[1]);
                    let x0b = e.imul_imm(x0, PIXEL);
                    let p00 = e.iadd(row0, x0b);
                    match (wx, wy) {
                        (Some(wx), Some((wy0, wy1))) => {
                            let (wx0, wx1) = weights(e, wx);
                            let x1b = e.imul_imm(x1, PIXEL);
                            let p01 = e.iadd(row0, x1b);
                            let p10 = e.iadd(row1, x0b);
                            let p11 = e.iadd(row1, x1b);
                            e.for_ptrs(
                                Scalar::Const(blocks),
                                &[p00, p01, p10, p11, s[2]],
                                &[in_plane, in_plane, in_plane, in_plane, out_plane],
                                |e, p| {
                                    let v00 = e.load_vec(p[0], 0);
                                    let v01 = e.load_vec(p[1], 0);
                                    let v10 = e.load_vec(p[2], 0);
                                    let v11 = e.load_vec(p[3], 0);
                                    let top = blend(e, wx0, wx1, v00, v01);
                                    let bottom = blend(e, wx0, wx1, v10, v11);
                                    let v = blend(e, wy0, wy1, top, bottom);
                                    e.store_vec(v, p[4], 0);
                                },
                            );
                        }
                        _ => {
                            e.for_ptrs(
                                Scalar::Const(blocks),
                                &[p00, s[2]],
                                &[in_plane, out_plane],
                                |e, p| {
                                    let v = e.load_vec(p[0], 0);
                                    e.store_vec(v, p[1], 0);
                                },
                            );
                        }
                    }
                    let (q, r) = step(e, &cols, s[0], s[1]);
                    let next = e.offset(s[2], PIXEL);
                    vec![q, r, next]
                });
                Vec::new()
            });
        },
    );
}
