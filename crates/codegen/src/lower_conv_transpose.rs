//! The transposed-convolution kernel: output-stationary, per output pixel of nChw4c tensors a
//! register tile of up to four output-channel vectors summed over the taps that land in the
//! input.
//!
//! Output row `oy` meets kernel row `kh` where `oy + pad_top - kh * dilation` is a whole
//! multiple of the stride whose quotient is an input row (and likewise for columns). At unit
//! dilation those taps are one phase of the kernel, `kh = r + j * stride` with input row
//! `q - j` for `oy + pad_top = q * stride + r`, and the kernel loops over the `j` whose input
//! row exists (computed once per row, and once per pixel for columns); with a dilation it tests
//! every tap. Either way every tap it reads lies in the input, and a tap that misses the input
//! contributes nothing (not even a NaN). Each output element is one
//! chain from its bias over the taps in `(kh, kw)` order and, within a tap, the input channels
//! in order; extents may be runtime values, which change no order, so runtime-extent kernels
//! give the exact kernels' bits. Groups are 1 (weights packed per tile of four output blocks:
//! `[kh][kw][ic][blocks x 4]`) or depthwise (per tile `[kh][kw][blocks x 4]`, a vector FMA per
//! block and tap); the bias follows, rounded up to whole blocks.

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{InstBuilder, Value};

use crate::emit::{Emit, ExtentArg, F32_BYTES, Scalar};
use crate::key::ConvTransposeDesc;

/// Buffer indices of the kernel's arguments.
const SRC: usize = 0;
const WEIGHTS: usize = 1;
const DST: usize = 2;
/// Bytes of one nChw4c pixel: four channels.
const PIXEL: i64 = 4 * F32_BYTES;
/// Output-channel blocks (vectors) of a tile: the accumulators of one pixel.
const TILE_BLOCKS: usize = 4;

/// Packs ONNX `[ic, oc / groups, kh, kw]` weights and the optional bias for `d`'s kernel (see
/// the module documentation); padding lanes of the last block are zero.
///
/// # Panics
///
/// If `d` is not valid ([`crate::PrimitiveKey::validate`]) or the lengths do not match its
/// weight shape and output channels.
pub fn pack_conv_transpose_weights(
    d: &ConvTransposeDesc,
    weights: &[f32],
    bias: Option<&[f32]>,
) -> Vec<f32> {
    let [ic, ocg, kh, kw] = d.weight_shape();
    assert_eq!(
        weights.len(),
        ic * ocg * kh * kw,
        "weights of the key's shape"
    );
    let blocks = d.oc.div_ceil(4);
    let mut out = Vec::with_capacity(d.packed_weights_len());
    let w = |i: usize, o: usize, y: usize, x: usize| weights[((i * ocg + o) * kh + y) * kw + x];
    if d.depthwise() {
        for first in (0..blocks).step_by(TILE_BLOCKS) {
            let tile = TILE_BLOCKS.min(blocks - first);
            for y in 0..kh {
                for x in 0..kw {
                    for lane in 0..tile * 4 {
                        let c = first * 4 + lane;
                        out.push(if c < d.oc { w(c, 0, y, x) } else { 0.0 });
                    }
                }
            }
        }
    } else {
        for first in (0..blocks).step_by(TILE_BLOCKS) {
            let tile = TILE_BLOCKS.min(blocks - first);
            for y in 0..kh {
                for x in 0..kw {
                    for i in 0..ic {
                        for lane in 0..tile * 4 {
                            let o = first * 4 + lane;
                            out.push(if o < d.oc { w(i, o, y, x) } else { 0.0 });
                        }
                    }
                }
            }
        }
    }
    let bias_at = out.len();
    out.resize(bias_at + blocks * 4, 0.0);
    if let Some(b) = bias {
        assert_eq!(b.len(), d.oc, "a bias per output channel");
        out[bias_at..bias_at + d.oc].copy_from_slice(b);
    }
    debug_assert_eq!(out.len(), d.packed_weights_len());
    out
}

/// `(valid, index)` of a tap at `t = o + pad - k * dilation`: whether `t` is a whole multiple
/// of `stride` whose quotient `index` lies in `0..input`. The index is meaningless when not
/// valid.
fn tap(e: &mut Emit<'_>, t: Value, stride: usize, input: Value) -> (Value, Value) {
    let zero = e.iconst(0);
    let nonneg = e.b.ins().icmp(IntCC::SignedGreaterThanOrEqual, t, zero);
    let t = e.imax(t, zero);
    let (q, whole) = if stride == 1 {
        (t, None)
    } else {
        let q = e.udiv_const(t, stride as u64);
        let qs = e.b.ins().imul_imm_s(q, stride as i64);
        (q, Some(e.b.ins().icmp(IntCC::Equal, qs, t)))
    };
    let inside = e.b.ins().icmp(IntCC::SignedLessThan, q, input);
    let valid = e.b.ins().band(nonneg, inside);
    let valid = match whole {
        Some(w) => e.b.ins().band(valid, w),
        None => valid,
    };
    (valid, q)
}

/// What the pixel loop of one tile reads.
struct Tile {
    /// Output-channel blocks (accumulators).
    blocks: usize,
    /// The tile's input: the image (groups 1) or its first block's plane (depthwise).
    src: Value,
    weights: Value,
    bias: Value,
    /// The tile's first block at column 0 of the row.
    out: Value,
}

/// The extents and strides every tile shares.
struct Geometry {
    ih: Value,
    iw: Value,
    ow: Value,
    in_row: Value,
    in_plane: Scalar,
    out_plane: Scalar,
}

/// The taps of one output coordinate along an axis of unit dilation, without a test per tap:
/// with `t = o + pad = q * stride + r`, kernel index `r + j * stride` meets input `q - j`, for
/// `j` in `lo..hi` (the kernel's taps of that phase whose input lies in `0..input`).
struct TapRange {
    r: Value,
    q: Value,
    lo: Value,
    hi: Value,
}

fn tap_range(e: &mut Emit<'_>, t: Value, stride: usize, kernel: usize, input: Value) -> TapRange {
    let q = e.udiv_const(t, stride as u64);
    let qs = e.b.ins().imul_imm_s(q, stride as i64);
    let r = e.b.ins().isub(t, qs);
    // The taps of phase `r`: ceil((kernel - r) / stride), never negative as r < stride.
    let span = e.iconst((kernel + stride - 1) as i64);
    let span = e.b.ins().isub(span, r);
    let count = e.udiv_const(span, stride as u64);
    let zero = e.iconst(0);
    let past = e.b.ins().isub(q, input);
    let past = e.offset(past, 1);
    let lo = e.imax(past, zero);
    let q1 = e.offset(q, 1);
    let hi = e.imin(count, q1);
    TapRange { r, q, lo, hi }
}

/// One axis of the window: its stride, dilation and kernel extent.
#[derive(Clone, Copy)]
struct Axis {
    stride: usize,
    dilation: usize,
    kernel: usize,
}

/// Runs `body(e, k, i, accs)` for every tap `k` of the axis whose input `i` lies in the
/// input, at `t = o + pad`, in increasing `k`: by the phase's range (`range`, or computed
/// here) at unit dilation, else by testing every tap.
fn for_taps(
    e: &mut Emit<'_>,
    axis: Axis,
    t: Value,
    input: Value,
    range: Option<&TapRange>,
    accs: Vec<Value>,
    mut body: impl FnMut(&mut Emit<'_>, Value, Value, Vec<Value>) -> Vec<Value>,
) -> Vec<Value> {
    if axis.dilation == 1 {
        let computed;
        let range = match range {
            Some(r) => r,
            None => {
                computed = tap_range(e, t, axis.stride, axis.kernel, input);
                &computed
            }
        };
        let (r, q) = (range.r, range.q);
        return e.for_range(range.lo, range.hi, &accs, |e, j, accs| {
            let js = e.b.ins().imul_imm_s(j, axis.stride as i64);
            let k = e.b.ins().iadd(r, js);
            let i = e.b.ins().isub(q, j);
            body(e, k, i, accs.to_vec())
        });
    }
    e.for_count(axis.kernel, &accs, |e, k, accs| {
        let dk = e.b.ins().imul_imm_s(k, axis.dilation as i64);
        let tk = e.b.ins().isub(t, dk);
        let (valid, i) = tap(e, tk, axis.stride, input);
        let accs = accs.to_vec();
        let skip = accs.clone();
        e.if_else_values(valid, |e| body(e, k, i, accs), |_| skip)
    })
}

/// One output row of a tile: per pixel, the bias and the sum over its taps, stored once.
fn pixel_loop(e: &mut Emit<'_>, d: &ConvTransposeDesc, g: &Geometry, ty: Value, t: Tile) {
    let per_tap = if d.depthwise() { 1 } else { d.ic };
    let tap_bytes = (per_tap * t.blocks) as i64 * PIXEL;
    let biases: Vec<Value> = (0..t.blocks)
        .map(|v| e.load_vec(t.bias, v as i64 * PIXEL))
        .collect();
    let rows = Axis {
        stride: d.strides[0],
        dilation: d.dilations[0],
        kernel: d.kh,
    };
    let cols = Axis {
        stride: d.strides[1],
        dilation: d.dilations[1],
        kernel: d.kw,
    };
    // The row's taps are the same for every pixel of the row.
    let row_range = (rows.dilation == 1).then(|| tap_range(e, ty, rows.stride, rows.kernel, g.ih));
    let zero = e.iconst(0);
    e.for_range(zero, g.ow, &[t.out], |e, ox, s| {
        let tx = e.offset(ox, d.pads.left as i64);
        let accs = for_taps(
            e,
            rows,
            ty,
            g.ih,
            row_range.as_ref(),
            biases.clone(),
            |e, y, iy, accs| {
                let row = e.b.ins().imul(iy, g.in_row);
                let row = e.b.ins().iadd(t.src, row);
                let tap_row = e.b.ins().imul_imm_s(y, d.kw as i64 * tap_bytes);
                let w_row = e.b.ins().iadd(t.weights, tap_row);
                for_taps(e, cols, tx, g.iw, None, accs, |e, x, ix, accs| {
                    let pix = e.scaled(row, ix, PIXEL, 0);
                    let w = e.scaled(w_row, x, tap_bytes, 0);
                    channels(e, d, g, t.blocks, pix, w, accs)
                })
            },
        );
        let mut out = s[0];
        for (v, &acc) in accs.iter().enumerate() {
            if v > 0 {
                out = e.offset_by(out, g.out_plane, 1);
            }
            e.store_vec(acc, out, 0);
        }
        vec![e.offset(s[0], PIXEL)]
    });
}

/// The accumulators after one tap: its input pixel `pix` times the tap's weights `w`.
fn channels(
    e: &mut Emit<'_>,
    d: &ConvTransposeDesc,
    g: &Geometry,
    blocks: usize,
    pix: Value,
    w: Value,
    accs: Vec<Value>,
) -> Vec<Value> {
    if d.depthwise() {
        // Block `v` of the tile: its own input plane and weight vector.
        let mut x_ptr = pix;
        let mut out = Vec::with_capacity(blocks);
        for (v, &acc) in accs.iter().enumerate() {
            if v > 0 {
                x_ptr = e.offset_by(x_ptr, g.in_plane, 1);
            }
            let x = e.load_vec(x_ptr, 0);
            let wv = e.load_vec(w, v as i64 * PIXEL);
            out.push(e.fma(x, wv, acc));
        }
        return out;
    }
    // Four input channels (one source vector) per step; a step's weights are 4 x blocks
    // vectors.
    let lanes = |e: &mut Emit<'_>, x: Value, w: Value, n: usize, accs: &mut [Value]| {
        for lane in 0..n {
            let xs = e.splat_lane(x, lane);
            for (v, acc) in accs.iter_mut().enumerate() {
                let wv = e.load_vec(w, (lane * blocks + v) as i64 * PIXEL);
                *acc = e.fma(xs, wv, *acc);
            }
        }
    };
    let step_bytes = 4 * blocks as i64 * PIXEL;
    let mut carried = vec![pix, w];
    carried.extend(accs);
    let out = e.for_count(d.ic / 4, &carried, |e, _, s| {
        let x = e.load_vec(s[0], 0);
        let mut accs = s[2..].to_vec();
        lanes(e, x, s[1], 4, &mut accs);
        let mut next = vec![e.offset_by(s[0], g.in_plane, 1), e.offset(s[1], step_bytes)];
        next.extend(accs);
        next
    });
    let mut accs = out[2..].to_vec();
    if !d.ic.is_multiple_of(4) {
        // The last block's real channels only: its padding lanes are never read.
        let x = e.load_vec(out[0], 0);
        lanes(e, x, out[1], d.ic % 4, &mut accs);
    }
    accs
}

/// The kernel of a transposed-convolution key: work items are output rows, of every image.
pub fn lower(e: &mut Emit<'_>, d: &ConvTransposeDesc) {
    let ih = e.extent_or(d.runtime.h, ExtentArg::InputH, d.ih);
    let iw = e.extent_or(d.runtime.w, ExtentArg::InputW, d.iw);
    let oh = e.extent_or(d.runtime.h, ExtentArg::OutputH, d.oh());
    let ow = e.extent_or(d.runtime.w, ExtentArg::OutputW, d.ow());
    let src = e.buffer(SRC);
    let weights = e.buffer(WEIGHTS);
    let dst = e.buffer(DST);
    let in_blocks = d.ic.div_ceil(4) as i64;
    let out_blocks = d.oc.div_ceil(4);
    let in_row = e.mul(iw, PIXEL);
    let out_row = e.mul(ow, PIXEL);
    let plane = |e: &mut Emit<'_>, h: Scalar, row: Scalar| match (h, row) {
        (Scalar::Const(h), Scalar::Const(r)) => Scalar::Const(h * r),
        _ => {
            let (h, r) = (e.value(h), e.value(row));
            Scalar::Dyn(e.b.ins().imul(h, r))
        }
    };
    let in_plane = plane(e, ih, in_row);
    let out_plane = plane(e, oh, out_row);
    let in_image = e.mul(in_plane, in_blocks);
    let out_image = e.mul(out_plane, out_blocks as i64);
    let (start, end) = e.clamp_items_to(Scalar::Const(0), oh);
    let g = Geometry {
        ih: e.value(ih),
        iw: e.value(iw),
        ow: e.value(ow),
        in_row: e.value(in_row),
        in_plane,
        out_plane,
    };
    let out_row_v = e.value(out_row);
    let per_tap = if d.depthwise() { 1 } else { d.ic };
    let taps_bytes = (d.kh * d.kw * per_tap * 4) as i64 * F32_BYTES;
    let bias = e.offset(weights, out_blocks as i64 * taps_bytes);
    e.for_ptrs(
        Scalar::Const(d.mb as i64),
        &[src, dst],
        &[in_image, out_image],
        |e, img| {
            e.for_range(start, end, &[], |e, oy, _| {
                let ty = e.offset(oy, d.pads.top as i64);
                let out_off = e.b.ins().imul(oy, out_row_v);
                let out = e.b.ins().iadd(img[1], out_off);
                // Tiles of four output blocks; a depthwise tile reads its own four input
                // planes, a dense one every plane.
                let full = out_blocks / TILE_BLOCKS;
                let tile_w = TILE_BLOCKS as i64 * taps_bytes;
                let src_step = if d.depthwise() { TILE_BLOCKS as i64 } else { 0 };
                let p = e.for_count(full, &[img[0], weights, bias, out], |e, _, p| {
                    let tile = Tile {
                        blocks: TILE_BLOCKS,
                        src: p[0],
                        weights: p[1],
                        bias: p[2],
                        out: p[3],
                    };
                    pixel_loop(e, d, &g, ty, tile);
                    vec![
                        e.offset_by(p[0], g.in_plane, src_step),
                        e.offset(p[1], tile_w),
                        e.offset(p[2], TILE_BLOCKS as i64 * PIXEL),
                        e.offset_by(p[3], g.out_plane, TILE_BLOCKS as i64),
                    ]
                });
                let rest = out_blocks % TILE_BLOCKS;
                if rest > 0 {
                    let tile = Tile {
                        blocks: rest,
                        src: p[0],
                        weights: p[1],
                        bias: p[2],
                        out: p[3],
                    };
                    pixel_loop(e, d, &g, ty, tile);
                }
                Vec::new()
            });
        },
    );
}
