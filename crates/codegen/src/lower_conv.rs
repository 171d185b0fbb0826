//! Lowers a convolution plan to Cranelift IR: register-tiled direct convolution.
//!
//! Loop nest: image, output-channel tile, row run, row (runtime range), column run, pixel
//! tile; inside a tile the reduction loop over input channels carries the accumulators, with
//! an inner loop over the run's kernel rows and the kernel columns unrolled. Each FMA reads its
//! input pixel with its own broadcast load, so x64 folds it into `vbroadcastss m32`.

use cranelift_codegen::ir::{InstBuilder, Value};

use crate::emit::{Emit, F32_BYTES};
use crate::key::{Layout, PostOpDesc};
use crate::plan::{AxisRun, ConvPlan, LANES, Strides};

/// Buffer indices in the argument list.
const SRC: usize = 0;
const WEIGHTS: usize = 1;
const DST: usize = 2;
const FIRST_RESIDUAL: usize = 3;

/// How many lanes of each vector of a tile hold real output channels, for NCHW stores.
type LaneCounts = [usize; 2];

struct TileClass {
    tiles: std::ops::Range<usize>,
    lanes: LaneCounts,
}

/// The pointers a pixel tile works from.
#[derive(Clone, Copy)]
struct TilePtrs {
    src: Value,
    weights: Value,
    bias: Option<Value>,
    dst: Value,
}

pub fn lower(e: &mut Emit<'_>, plan: &ConvPlan) {
    let d = &plan.desc;
    let src = e.buffer(SRC);
    let weights = e.buffer(WEIGHTS);
    let dst = e.buffer(DST);
    let residuals: Vec<Value> = (0..d.residuals())
        .map(|i| e.buffer(FIRST_RESIDUAL + i))
        .collect();

    let tile_oc = plan.vecs * LANES;
    // With an NCHW destination, lanes past the last output channel must not be stored, so a
    // partial last tile gets code of its own; nChw4c stores its padding lanes.
    let mut classes = vec![TileClass {
        tiles: 0..plan.oc_tiles,
        lanes: [LANES; 2],
    }];
    if d.dst_layout == Layout::Nchw && !d.oc.is_multiple_of(tile_oc) {
        let last = plan.oc_tiles - 1;
        let rem = d.oc - last * tile_oc;
        classes = vec![
            TileClass {
                tiles: 0..last,
                lanes: [LANES; 2],
            },
            TileClass {
                tiles: last..plan.oc_tiles,
                lanes: [rem.min(LANES), rem.saturating_sub(LANES)],
            },
        ];
    }

    let src_chan_bytes = |ch: usize| -> i64 {
        // Channel offsets of tile ranges are multiples of the reduction step.
        let elems = match d.src_layout {
            Layout::Nchw => ch * plan.src.channel,
            Layout::Nchw4c => ch / LANES * plan.src.block + ch % LANES,
        };
        elems as i64 * F32_BYTES
    };
    let tile_w_bytes = plan.tile_weights_len() as i64 * F32_BYTES;
    let tile_dst_bytes = (plan.vecs * plan.dst.block) as i64 * F32_BYTES;

    e.for_count_ptrs(
        d.mb,
        &[src, dst],
        &[
            plan.src.image as i64 * F32_BYTES,
            plan.dst.image as i64 * F32_BYTES,
        ],
        |e, p| {
            let (src_n, dst_n) = (p[0], p[1]);
            let res_n: Vec<Value> = residuals
                .iter()
                .map(|&r| {
                    // Residuals share the destination's layout: same offsets as `dst_n - dst`.
                    let off = e.b.ins().isub(dst_n, dst);
                    e.b.ins().iadd(r, off)
                })
                .collect();
            for class in &classes {
                let first = class.tiles.start;
                let src_t0 = e.offset(src_n, src_chan_bytes(plan.ic.begin + first * plan.ic.step));
                let w_t0 = e.offset(weights, first as i64 * tile_w_bytes);
                let bias_t0 = d
                    .bias
                    .then(|| (plan.bias_offset() + first * tile_oc) as i64 * F32_BYTES);
                let bias_t0 = bias_t0.map(|off| e.offset(weights, off));
                let dst_t0 = e.offset(dst_n, first as i64 * tile_dst_bytes);
                let res_t0: Vec<Value> = res_n
                    .iter()
                    .map(|&r| e.offset(r, first as i64 * tile_dst_bytes))
                    .collect();

                let mut ptrs = vec![src_t0, w_t0, dst_t0];
                let mut steps = vec![src_chan_bytes(plan.ic.step), tile_w_bytes, tile_dst_bytes];
                if let Some(b) = bias_t0 {
                    ptrs.push(b);
                    steps.push(tile_oc as i64 * F32_BYTES);
                }
                ptrs.extend(&res_t0);
                steps.extend(std::iter::repeat_n(tile_dst_bytes, res_t0.len()));
                let has_bias = d.bias;
                e.for_count_ptrs(class.tiles.len(), &ptrs, &steps, |e, p| {
                    let (bias, res) = if has_bias {
                        (Some(p[3]), &p[4..])
                    } else {
                        (None, &p[3..])
                    };
                    let tile = TilePtrs {
                        src: p[0],
                        weights: p[1],
                        bias,
                        dst: p[2],
                    };
                    rows(e, plan, tile, res, class.lanes);
                });
            }
        },
    );
}

/// All row runs of one output-channel tile, restricted to the call's range of rows.
fn rows(e: &mut Emit<'_>, plan: &ConvPlan, tile: TilePtrs, residuals: &[Value], lanes: LaneCounts) {
    let d = &plan.desc;
    for run in &plan.rows {
        let (start, end) = e.clamp_items(run.outputs.start, run.outputs.end);
        e.for_range(start, end, &[], |e, oh, _| {
            // The input row of tap 0; valid taps of this run keep every access in bounds.
            let row_bytes = plan.src.row as i64 * F32_BYTES;
            let src_row = e.scaled(
                tile.src,
                oh,
                d.strides[0] as i64 * row_bytes,
                -(d.pads.top as i64) * row_bytes,
            );
            let dst_row_bytes = plan.dst.row as i64 * F32_BYTES;
            let dst_row = e.scaled(tile.dst, oh, dst_row_bytes, 0);
            let res_rows: Vec<Value> = residuals
                .iter()
                .map(|&r| e.scaled(r, oh, dst_row_bytes, 0))
                .collect();
            let row_tile = TilePtrs {
                src: src_row,
                dst: dst_row,
                ..tile
            };
            columns(e, plan, run, row_tile, &res_rows, lanes);
            vec![]
        });
    }
}

fn columns(
    e: &mut Emit<'_>,
    plan: &ConvPlan,
    row: &AxisRun,
    tile: TilePtrs,
    residuals: &[Value],
    lanes: LaneCounts,
) {
    let d = &plan.desc;
    let src_px = plan.src.pixel as i64 * F32_BYTES;
    let dst_px = plan.dst.pixel as i64 * F32_BYTES;
    for col in &plan.cols {
        let len = col.outputs.len();
        let (full, rem) = (len / plan.pixel_tile, len % plan.pixel_tile);
        let ow0 = col.outputs.start as i64;
        let src0 = e.offset(
            tile.src,
            (ow0 * d.strides[1] as i64 - d.pads.left as i64) * src_px,
        );
        let dst0 = e.offset(tile.dst, ow0 * dst_px);
        let res0: Vec<Value> = residuals
            .iter()
            .map(|&r| e.offset(r, ow0 * dst_px))
            .collect();
        let p = plan.pixel_tile as i64;
        let mut ptrs = vec![src0, dst0];
        ptrs.extend(&res0);
        let mut steps = vec![p * d.strides[1] as i64 * src_px, p * dst_px];
        steps.extend(std::iter::repeat_n(p * dst_px, res0.len()));
        e.for_count_ptrs(full, &ptrs, &steps, |e, q| {
            pixel_tile(
                e,
                plan,
                plan.pixel_tile,
                row,
                col,
                TilePtrs {
                    src: q[0],
                    dst: q[1],
                    ..tile
                },
                &q[2..],
                lanes,
            );
        });
        if rem > 0 {
            let skip = full as i64 * p;
            let src_r = e.offset(src0, skip * d.strides[1] as i64 * src_px);
            let dst_r = e.offset(dst0, skip * dst_px);
            let res_r: Vec<Value> = res0.iter().map(|&r| e.offset(r, skip * dst_px)).collect();
            pixel_tile(
                e,
                plan,
                rem,
                row,
                col,
                TilePtrs {
                    src: src_r,
                    dst: dst_r,
                    ..tile
                },
                &res_r,
                lanes,
            );
        }
    }
}

/// One register tile: `pixels` output pixels by `plan.vecs` vectors of output channels.
#[allow(clippy::too_many_arguments)]
fn pixel_tile(
    e: &mut Emit<'_>,
    plan: &ConvPlan,
    pixels: usize,
    row: &AxisRun,
    col: &AxisRun,
    tile: TilePtrs,
    residuals: &[Value],
    lanes: LaneCounts,
) {
    let d = &plan.desc;
    let vecs = plan.vecs;
    let f = F32_BYTES;
    let tile_oc = (vecs * LANES) as i64;

    let mut acc = Vec::with_capacity(pixels * vecs);
    for _ in 0..pixels {
        for v in 0..vecs {
            acc.push(match tile.bias {
                Some(b) => e.load_vec(b, v as i64 * LANES as i64 * f),
                None => e.splat_const(0.0),
            });
        }
    }

    let src_row = plan.src.row as i64 * f;
    let src_px = plan.src.pixel as i64 * f;
    let (kh_taps, kw_taps) = (row.taps.clone(), col.taps.clone());
    let per_kh = d.kw as i64 * tile_oc * f;
    let per_ic = (d.kh * d.kw) as i64 * tile_oc * f;
    let ic_src_step = match d.src_layout {
        Layout::Nchw => plan.src.channel as i64 * f,
        Layout::Nchw4c => plan.src.block as i64 * f,
    };
    let chan_in_step = plan.src.channel as i64 * f;
    let steps = plan.ic.len / plan.ic_step;

    if !kh_taps.is_empty() && !kw_taps.is_empty() {
        let mut state = vec![tile.src, tile.weights];
        state.extend(&acc);
        let out = e.for_count(steps, &state, |e, _, s| {
            let (src_ic, w_ic) = (s[0], s[1]);
            let src_kh0 = e.offset(
                src_ic,
                kh_taps.start as i64 * d.dilations[0] as i64 * src_row,
            );
            let w_kh0 = e.offset(w_ic, kh_taps.start as i64 * per_kh);
            let mut inner = vec![src_kh0, w_kh0];
            inner.extend(&s[2..]);
            let acc_out = e.for_count(kh_taps.len(), &inner, |e, _, k| {
                let (src_kh, w_kh) = (k[0], k[1]);
                let mut acc = k[2..].to_vec();
                for c in 0..plan.ic_step as i64 {
                    for kw in kw_taps.clone() {
                        let w_off = c * per_ic + kw as i64 * tile_oc * f;
                        let wv: Vec<Value> = (0..vecs)
                            .map(|v| e.load_vec(w_kh, w_off + v as i64 * LANES as i64 * f))
                            .collect();
                        for p in 0..pixels as i64 {
                            let x_off = c * chan_in_step
                                + (kw as i64 * d.dilations[1] as i64 + p * d.strides[1] as i64)
                                    * src_px;
                            for (v, &w) in wv.iter().enumerate() {
                                // A broadcast per FMA: the FMA overwrites its first factor,
                                // so a shared broadcast would cost a register copy, while a
                                // fresh one folds into `vbroadcastss m32`.
                                let x = e.splat_load(src_kh, x_off);
                                let a = &mut acc[p as usize * vecs + v];
                                *a = e.fma(x, w, *a);
                            }
                        }
                    }
                }
                let mut next = vec![
                    e.offset(src_kh, d.dilations[0] as i64 * src_row),
                    e.offset(w_kh, per_kh),
                ];
                next.extend(acc);
                next
            });
            let mut next = vec![
                e.offset(src_ic, ic_src_step),
                e.offset(w_ic, plan.ic_step as i64 * per_ic),
            ];
            next.extend(&acc_out[2..]);
            next
        });
        acc = out[2..].to_vec();
    }

    epilogue(e, plan, pixels, &acc, tile.dst, residuals, lanes);
}

/// Applies the post-ops in registers and stores each accumulator once.
fn epilogue(
    e: &mut Emit<'_>,
    plan: &ConvPlan,
    pixels: usize,
    acc: &[Value],
    dst: Value,
    residuals: &[Value],
    lanes: LaneCounts,
) {
    let d = &plan.desc;
    let f = F32_BYTES;
    let dst_strides: Strides = plan.dst;
    let zero = d
        .post_ops
        .iter()
        .any(|p| matches!(p, PostOpDesc::Relu))
        .then(|| e.splat_const(0.0));
    for p in 0..pixels {
        for v in 0..plan.vecs {
            let off = (v * dst_strides.block + p * dst_strides.pixel) as i64 * f;
            let mut x = acc[p * plan.vecs + v];
            let mut residual = 0;
            for post in &d.post_ops {
                x = match post {
                    PostOpDesc::Relu => e.pmax(x, zero.expect("made for relu")),
                    PostOpDesc::Clip { lo, hi } => {
                        let lo = e.splat_const(*lo);
                        let hi = e.splat_const(*hi);
                        let x = e.pmax(x, lo);
                        e.pmin(x, hi)
                    }
                    PostOpDesc::Add => {
                        let r = residuals[residual];
                        residual += 1;
                        let y = match d.dst_layout {
                            Layout::Nchw4c => e.load_vec(r, off),
                            Layout::Nchw => {
                                let fill = e.splat_const(0.0);
                                e.gather(r, off, dst_strides.channel as i64 * f, lanes[v], fill)
                            }
                        };
                        e.b.ins().fadd(x, y)
                    }
                };
            }
            match d.dst_layout {
                Layout::Nchw4c => e.store_vec(x, dst, off),
                Layout::Nchw => e.scatter(x, dst, off, dst_strides.channel as i64 * f, lanes[v]),
            }
        }
    }
}
