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
//! contributes nothing (not even a NaN). Each output element is one chain from its bias over
//! the taps in `(kh, kw)` order and, within a tap, the input channels in order, then the
//! post-ops (relu, clip, activations); extents may be runtime values, which change no order, so
//! runtime-extent kernels give the exact kernels' bits. Groups are 1 (weights packed per tile
//! of four output blocks: `[kh][kw][ic][blocks x 4]`) or depthwise (per tile
//! `[kh][kw][blocks x 4]`, a vector FMA per block and tap); the bias follows, rounded up to
//! whole blocks.
//!
//! At a wide tier (`ConvTransposeDesc::tier_for`: a kernel the size of its stride, one tap per
//! output pixel) an output row is, per column phase, a 1x1 convolution of one input row
//! written every `sw` pixels: the direct convolution's wide tile ([`DirectTile`]) with a
//! destination pixel `sw` pixels wide, over the same packed weights, summing from the bias
//! over the input channels in order, so the bits are the 128-bit kernel's.

use crate::backend::cranelift::{Emit, ExtentArg, F32_BYTES, IntCC, Scalar, Value};
use crate::backend::x64::{DirectTile, TileFinish, TileInit, TileUnit, WideTile};
use crate::conv::apply_post_ops;
use crate::key::ConvTransposeDesc;
use crate::target::Isa;
use crate::tile::full_tile;

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
    let nonneg = e.icmp(IntCC::SignedGreaterThanOrEqual, t, zero);
    let t = e.imax(t, zero);
    let (q, whole) = if stride == 1 {
        (t, None)
    } else {
        let q = e.udiv_const(t, stride as u64);
        let qs = e.imul_imm(q, stride as i64);
        (q, Some(e.icmp(IntCC::Equal, qs, t)))
    };
    let inside = e.icmp(IntCC::SignedLessThan, q, input);
    let valid = e.band(nonneg, inside);
    let valid = match whole {
        Some(w) => e.band(valid, w),
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
    /// The input width, a constant where the key fixes it.
    iw_extent: Scalar,
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
    let qs = e.imul_imm(q, stride as i64);
    let r = e.isub(t, qs);
    // The taps of phase `r`: ceil((kernel - r) / stride), never negative as r < stride.
    let span = e.iconst((kernel + stride - 1) as i64);
    let span = e.isub(span, r);
    let count = e.udiv_const(span, stride as u64);
    let zero = e.iconst(0);
    let past = e.isub(q, input);
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
            let js = e.imul_imm(j, axis.stride as i64);
            let k = e.iadd(r, js);
            let i = e.isub(q, j);
            body(e, k, i, accs.to_vec())
        });
    }
    e.for_count(axis.kernel, &accs, |e, k, accs| {
        let dk = e.imul_imm(k, axis.dilation as i64);
        let tk = e.isub(t, dk);
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
                let row = e.imul(iy, g.in_row);
                let row = e.iadd(t.src, row);
                let tap_row = e.imul_imm(y, d.kw as i64 * tap_bytes);
                let w_row = e.iadd(t.weights, tap_row);
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
            let slopes = |_: &mut Emit<'_>| unreachable!("a transposed convolution takes no prelu");
            let y = apply_post_ops(e, &d.post_ops, acc, None, slopes, |_, _| {
                unreachable!("a transposed convolution takes no residual")
            });
            e.store_vec(y, out, 0);
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
            Scalar::Dyn(e.imul(h, r))
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
        iw_extent: iw,
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
                let out_off = e.imul(oy, out_row_v);
                let out = e.iadd(img[1], out_off);
                if d.isa != Isa::X128 {
                    let row = PhaseRow {
                        src: img[0],
                        out,
                        oy,
                        weights,
                        bias,
                    };
                    wide_row(e, d, &g, row);
                    zero_padding_lanes(e, d, &g, out);
                    return Vec::new();
                }
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
                zero_padding_lanes(e, d, &g, out);
                Vec::new()
            });
        },
    );
}

/// One output row of a one-tap-per-pixel kernel at a wide tier: its image's input, the row's
/// first pixel, its index, and the packed weights and bias.
struct PhaseRow {
    src: Value,
    out: Value,
    oy: Value,
    weights: Value,
    bias: Value,
}

/// Output row `oy` of a kernel whose every output pixel takes one tap (`tier_for`): for each
/// tile of output-channel blocks and run of input pixels `j`, the output pixels `sw * j + t`
/// of every column phase `t`, as [`DirectTile`]s over the `ic / 4` blocks of input channels,
/// tap `(oy % sh, t)`'s weights, from the tile's bias. The phases of a run are written one
/// after the other, so that the pixels they interleave fill each output line while it is in
/// L1, whatever the planes' distance.
fn wide_row(e: &mut Emit<'_>, d: &ConvTransposeDesc, g: &Geometry, row: PhaseRow) {
    let sh = d.strides[0];
    let iy = e.udiv_const(row.oy, sh as u64);
    let phase_y = e.urem_const(row.oy, sh as u64);
    let in_off = e.imul(iy, g.in_row);
    let src = e.iadd(row.src, in_off);
    let out_blocks = d.oc.div_ceil(4);
    let taps_bytes = (d.kh * d.kw * d.ic * 4) as i64 * F32_BYTES;
    let tile_w = TILE_BLOCKS as i64 * taps_bytes;
    let ic_src_step = e.value(g.in_plane);
    let dst_block_bytes = e.value(g.out_plane);
    let tile = |e: &mut Emit<'_>, blocks: usize, weights: Value, bias: Value, out: Value| {
        // Row `phase_y` of the tile's `[kh][kw][ic][blocks x 4]` weights.
        let tap_bytes = (d.ic * blocks * 4) as i64 * F32_BYTES;
        let row_w = e.imul_imm(phase_y, d.kw as i64 * tap_bytes);
        let w = e.iadd(weights, row_w);
        let phases = Phases {
            blocks,
            src,
            weights: w,
            tap_bytes,
            bias,
            out,
            ic_src_step,
            dst_block_bytes,
        };
        phase_tiles(e, d, g, &phases);
    };
    let full = out_blocks / TILE_BLOCKS;
    let p = e.for_count(full, &[row.weights, row.bias, row.out], |e, _, p| {
        tile(e, TILE_BLOCKS, p[0], p[1], p[2]);
        vec![
            e.offset(p[0], tile_w),
            e.offset(p[1], TILE_BLOCKS as i64 * PIXEL),
            e.offset_by(p[2], g.out_plane, TILE_BLOCKS as i64),
        ]
    });
    let rest = out_blocks % TILE_BLOCKS;
    if rest > 0 {
        tile(e, rest, p[0], p[1], p[2]);
    }
}

/// An output row's column phases for one tile of output-channel blocks: its input row, the
/// weights of phase 0's tap (phase `t`'s `t * tap_bytes` further), the tile's bias and its
/// first output pixel.
struct Phases {
    blocks: usize,
    src: Value,
    weights: Value,
    tap_bytes: i64,
    bias: Value,
    out: Value,
    ic_src_step: Value,
    dst_block_bytes: Value,
}

/// The input row's pixels through a tile's phases: runs of the full tile's pixels, then the
/// rest in tiles of halving sizes (one test each where the width is a runtime value); each
/// run of pixels through every phase before the next.
fn phase_tiles(e: &mut Emit<'_>, d: &ConvTransposeDesc, g: &Geometry, ph: &Phases) {
    let ratio = d.isa.target().lanes / 4;
    let vectors = ph.blocks.div_ceil(ratio);
    let (full_pixels, full_vectors) = full_tile(d.isa);
    // As many accumulators as the direct convolution's full tile.
    let pixels = full_pixels * full_vectors / vectors;
    let sw = d.strides[1] as i64;
    let spec = |n: usize| {
        let channel_bytes = (ph.blocks * 4) as i64 * F32_BYTES;
        WideTile::Direct(DirectTile {
            isa: d.isa,
            pixels: n,
            w_vecs: (0..vectors)
                .map(|u| (u * d.isa.target().lanes) as i64 * F32_BYTES)
                .collect(),
            tail_blocks: ph.blocks % ratio,
            steps: d.ic / 4,
            units: (0..4)
                .map(|c| TileUnit {
                    w: c * channel_bytes,
                    x: (0..n as i64)
                        .map(|p| Some(p * PIXEL + c * F32_BYTES))
                        .collect(),
                })
                .collect(),
            per_kh: 0,
            ic_w_step: 4 * channel_bytes,
            dst_pixel_bytes: sw * PIXEL,
            // A transposed convolution takes no PReLU (`PrimitiveKey::validate`).
            slopes_disp: 0,
            init: TileInit::Bias,
            finish: TileFinish::PostOps(d.post_ops.clone()),
        })
    };
    // `n` pixels from `src` to `out`, every phase.
    let call = |e: &mut Emit<'_>, n: usize, src: Value, out: Value| {
        let (one, zero) = (e.iconst(1), e.iconst(0));
        for t in 0..sw {
            let weights = e.offset(ph.weights, t * ph.tap_bytes);
            let out = e.offset(out, t * PIXEL);
            let args = [
                src,
                weights,
                out,
                one,
                zero,
                ph.ic_src_step,
                ph.dst_block_bytes,
                ph.bias,
            ];
            e.call_tile(spec(n), &args);
        }
    };
    let runs = match g.iw_extent {
        Scalar::Const(w) => Scalar::Const(w / pixels as i64),
        Scalar::Dyn(w) => Scalar::Dyn(e.udiv_const(w, pixels as u64)),
    };
    let steps = [
        Scalar::Const(pixels as i64 * PIXEL),
        Scalar::Const(pixels as i64 * sw * PIXEL),
    ];
    let end = e.for_ptrs(runs, &[ph.src, ph.out], &steps, |e, p| {
        call(e, pixels, p[0], p[1]);
    });
    let (mut src, mut out) = (end[0], end[1]);
    // The rest, `iw % pixels`, as tiles of its binary digits, largest first.
    match g.iw_extent {
        Scalar::Const(w) => {
            let mut rest = w as usize % pixels;
            while rest > 0 {
                let k = 1 << rest.ilog2();
                call(e, k, src, out);
                src = e.offset(src, k as i64 * PIXEL);
                out = e.offset(out, k as i64 * sw * PIXEL);
                rest -= k;
            }
        }
        Scalar::Dyn(w) => {
            let rest = e.urem_const(w, pixels as u64);
            let mut n = pixels.next_power_of_two() / 2;
            while n > 0 {
                let k = n;
                let has = e.band_imm(rest, k as i64);
                let done = e.if_else_values(
                    has,
                    |e| {
                        call(e, k, src, out);
                        vec![
                            e.offset(src, k as i64 * PIXEL),
                            e.offset(out, k as i64 * sw * PIXEL),
                        ]
                    },
                    |_| vec![src, out],
                );
                (src, out) = (done[0], done[1]);
                n /= 2;
            }
        }
    }
}

/// Sets the padding lanes of the output row's last block to +0 once its tiles stored them:
/// they hold the post-ops of zero (a sigmoid's 0.5), or zero weights times an infinite or NaN
/// input, which the next convolution's zero weights would carry into real channels.
fn zero_padding_lanes(e: &mut Emit<'_>, d: &ConvTransposeDesc, g: &Geometry, out: Value) {
    let real = d.oc % 4;
    if real == 0 {
        return;
    }
    let block = e.offset_by(out, g.out_plane, d.oc.div_ceil(4) as i64 - 1);
    e.clear_padding_lanes(block, Scalar::Dyn(g.ow), PIXEL, real);
}
