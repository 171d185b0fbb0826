//! Lowers pooling (windowed and global) and standalone element-wise ops to Cranelift IR.
//!
//! All of them vectorize over four channels: a vector load per pixel in `nChw4c`, a gather of
//! four channel planes in NCHW (whose last, partial block of channels gets code of its own so
//! that no lane past the last channel is read or written).

use cranelift_codegen::ir::condcodes::FloatCC;
use cranelift_codegen::ir::{InstBuilder, Value};
use primjit_ir::PoolKind;

use crate::emit::{Emit, F32_BYTES};
use crate::key::{EltwiseDesc, EltwiseKind, GlobalPoolDesc, Layout};
use crate::plan::{AxisRun, LANES, PoolPlan, Strides};

const SRC: usize = 0;
const DST: usize = 2;
const SRC2: usize = 3;

/// Channel blocks grouped by how many of their lanes are real channels.
fn block_classes(
    channels: usize,
    src: Layout,
    dst: Layout,
) -> Vec<(std::ops::Range<usize>, usize)> {
    let blocks = channels.div_ceil(LANES);
    let tail = channels % LANES;
    if tail != 0 && (src == Layout::Nchw || dst == Layout::Nchw) {
        vec![(0..blocks - 1, LANES), (blocks - 1..blocks, tail)]
    } else {
        vec![(0..blocks, LANES)]
    }
}

fn load(
    e: &mut Emit<'_>,
    layout: Layout,
    strides: &Strides,
    base: Value,
    off: i64,
    lanes: usize,
    fill: Value,
) -> Value {
    match layout {
        Layout::Nchw4c => e.load_vec(base, off),
        Layout::Nchw => e.gather(base, off, strides.channel as i64 * F32_BYTES, lanes, fill),
    }
}

fn store(
    e: &mut Emit<'_>,
    layout: Layout,
    strides: &Strides,
    v: Value,
    base: Value,
    off: i64,
    lanes: usize,
) {
    match layout {
        Layout::Nchw4c => e.store_vec(v, base, off),
        Layout::Nchw => e.scatter(v, base, off, strides.channel as i64 * F32_BYTES, lanes),
    }
}

pub fn lower_pool(e: &mut Emit<'_>, plan: &PoolPlan) {
    let d = &plan.desc;
    let f = F32_BYTES;
    let src = e.buffer(SRC);
    let dst = e.buffer(DST);
    e.for_count_ptrs(
        d.mb,
        &[src, dst],
        &[plan.src.image as i64 * f, plan.dst.image as i64 * f],
        |e, p| {
            for (blocks, lanes) in block_classes(d.c, d.src_layout, d.dst_layout) {
                let src_b = e.offset(p[0], (blocks.start * plan.src.block) as i64 * f);
                let dst_b = e.offset(p[1], (blocks.start * plan.dst.block) as i64 * f);
                e.for_count_ptrs(
                    blocks.len(),
                    &[src_b, dst_b],
                    &[plan.src.block as i64 * f, plan.dst.block as i64 * f],
                    |e, q| {
                        for row in &plan.rows {
                            let (start, end) = e.clamp_items(row.outputs.start, row.outputs.end);
                            e.for_range(start, end, &[], |e, oh, _| {
                                let src_row_bytes = plan.src.row as i64 * f;
                                let src_row = e.scaled(
                                    q[0],
                                    oh,
                                    d.strides[0] as i64 * src_row_bytes,
                                    -(d.pads.top as i64) * src_row_bytes,
                                );
                                let dst_row = e.scaled(q[1], oh, plan.dst.row as i64 * f, 0);
                                for col in &plan.cols {
                                    pool_columns(e, plan, row, col, src_row, dst_row, lanes);
                                }
                                vec![]
                            });
                        }
                    },
                );
            }
        },
    );
}

fn pool_columns(
    e: &mut Emit<'_>,
    plan: &PoolPlan,
    row: &AxisRun,
    col: &AxisRun,
    src_row: Value,
    dst_row: Value,
    lanes: usize,
) {
    let d = &plan.desc;
    let f = F32_BYTES;
    let src_px = plan.src.pixel as i64 * f;
    let dst_px = plan.dst.pixel as i64 * f;
    let ow0 = col.outputs.start as i64;
    let src0 = e.offset(
        src_row,
        (ow0 * d.strides[1] as i64 - d.pads.left as i64) * src_px,
    );
    let dst0 = e.offset(dst_row, ow0 * dst_px);
    let len = col.outputs.len();
    let tile = plan.pixel_tile;
    let (full, rem) = (len / tile, len % tile);
    let t = tile as i64;
    e.for_count_ptrs(
        full,
        &[src0, dst0],
        &[t * d.strides[1] as i64 * src_px, t * dst_px],
        |e, q| {
            pool_tile(e, plan, tile, row, col, q[0], q[1], lanes);
        },
    );
    if rem > 0 {
        let s = e.offset(src0, full as i64 * t * d.strides[1] as i64 * src_px);
        let o = e.offset(dst0, full as i64 * t * dst_px);
        pool_tile(e, plan, rem, row, col, s, o, lanes);
    }
}

#[allow(clippy::too_many_arguments)]
fn pool_tile(
    e: &mut Emit<'_>,
    plan: &PoolPlan,
    pixels: usize,
    row: &AxisRun,
    col: &AxisRun,
    src: Value,
    dst: Value,
    lanes: usize,
) {
    let d = &plan.desc;
    let f = F32_BYTES;
    let init = match d.kind {
        PoolKind::Max => f32::NEG_INFINITY,
        PoolKind::Avg => 0.0,
    };
    let fill = e.splat_const(0.0);
    let mut acc: Vec<Value> = (0..pixels).map(|_| e.splat_const(init)).collect();
    for kh in row.taps.clone() {
        for kw in col.taps.clone() {
            for (p, a) in acc.iter_mut().enumerate() {
                let off = (kh * d.dilations[0]) as i64 * plan.src.row as i64 * f
                    + ((kw * d.dilations[1]) as i64 + (p * d.strides[1]) as i64)
                        * plan.src.pixel as i64
                        * f;
                let x = load(e, d.src_layout, &plan.src, src, off, lanes, fill);
                *a = match d.kind {
                    PoolKind::Max => e.pmax(x, *a),
                    PoolKind::Avg => e.b.ins().fadd(*a, x),
                };
            }
        }
    }
    let scale =
        (d.kind == PoolKind::Avg).then(|| e.splat_const(1.0 / (row.count * col.count) as f32));
    for (p, &a) in acc.iter().enumerate() {
        let v = match scale {
            Some(s) => e.b.ins().fmul(a, s),
            None => a,
        };
        store(
            e,
            d.dst_layout,
            &plan.dst,
            v,
            dst,
            (p * plan.dst.pixel) as i64 * f,
            lanes,
        );
    }
}

pub fn lower_global_pool(e: &mut Emit<'_>, d: &GlobalPoolDesc) {
    let f = F32_BYTES;
    let src_s = Strides::new(d.src_layout, [d.mb, d.c, d.ih, d.iw]);
    let dst_s = Strides::new(d.dst_layout, [d.mb, d.c, 1, 1]);
    let src = e.buffer(SRC);
    let dst = e.buffer(DST);
    // One work item: the call computes everything or nothing.
    let (start, end) = e.clamp_items(0, 1);
    e.for_range(start, end, &[], |e, _, _| {
        e.for_count_ptrs(
            d.mb,
            &[src, dst],
            &[src_s.image as i64 * f, dst_s.image as i64 * f],
            |e, p| {
                for (blocks, lanes) in block_classes(d.c, d.src_layout, d.dst_layout) {
                    let src_b = e.offset(p[0], (blocks.start * src_s.block) as i64 * f);
                    let dst_b = e.offset(p[1], (blocks.start * dst_s.block) as i64 * f);
                    e.for_count_ptrs(
                        blocks.len(),
                        &[src_b, dst_b],
                        &[src_s.block as i64 * f, dst_s.block as i64 * f],
                        |e, q| {
                            let init = e.splat_const(if d.kind == PoolKind::Max {
                                f32::NEG_INFINITY
                            } else {
                                0.0
                            });
                            let fill = e.splat_const(0.0);
                            let out = e.for_count(d.ih * d.iw, &[q[0], init], |e, _, s| {
                                let x = load(e, d.src_layout, &src_s, s[0], 0, lanes, fill);
                                let a = match d.kind {
                                    PoolKind::Max => e.pmax(x, s[1]),
                                    PoolKind::Avg => e.b.ins().fadd(s[1], x),
                                };
                                vec![e.offset(s[0], src_s.pixel as i64 * f), a]
                            });
                            let mut v = out[1];
                            if d.kind == PoolKind::Avg {
                                let s = e.splat_const(1.0 / (d.ih * d.iw) as f32);
                                v = e.b.ins().fmul(v, s);
                            }
                            store(e, d.dst_layout, &dst_s, v, q[1], 0, lanes);
                        },
                    );
                }
            },
        );
        vec![]
    });
}

/// Element-wise ops walk, for each image and channel plane (or block), the contiguous span of
/// the call's rows: four floats at a time, then one at a time for an NCHW remainder.
pub fn lower_eltwise(e: &mut Emit<'_>, d: &EltwiseDesc) {
    let f = F32_BYTES;
    let [n, c, h, w] = d.shape;
    let strides = Strides::new(d.layout, d.shape);
    let (planes, plane_stride) = match d.layout {
        Layout::Nchw => (n * c, h * w),
        Layout::Nchw4c => (n * c.div_ceil(LANES), strides.block),
    };
    let row = strides.row as i64;
    let src = e.buffer(SRC);
    let dst = e.buffer(DST);
    let src2 = (d.kind == EltwiseKind::Add).then(|| e.buffer(SRC2));
    let (start, end) = e.clamp_items(0, h);
    let first = e.b.ins().imul_imm_s(start, row * f);
    let count = e.b.ins().isub(end, start);
    let count = e.b.ins().imul_imm_s(count, row);
    let zero_i = e.iconst(0);
    let count = e.imax(count, zero_i);
    let vectors = e.b.ins().ushr_imm_u(count, 2);
    let tail = e.b.ins().band_imm_u(count, 3);
    let zero = e.splat_const(0.0);
    let zero_s = e.b.ins().f32const(0.0);

    let mut bases = vec![src, dst];
    bases.extend(src2);
    let step = plane_stride as i64 * f;
    let steps = vec![step; bases.len()];
    let bases: Vec<Value> = bases.iter().map(|&b| e.b.ins().iadd(b, first)).collect();
    e.for_count_ptrs(planes, &bases, &steps, |e, p| {
        let p = p.to_vec();
        let after = e.for_range(zero_i, vectors, &p, |e, _, q| {
            let x = e.load_vec(q[0], 0);
            let y = match d.kind {
                EltwiseKind::Relu => e.pmax(x, zero),
                EltwiseKind::Add => {
                    let z = e.load_vec(q[2], 0);
                    e.b.ins().fadd(x, z)
                }
            };
            e.store_vec(y, q[1], 0);
            q.iter().map(|&b| e.offset(b, LANES as i64 * f)).collect()
        });
        // Rows of nChw4c hold whole vectors; an NCHW span has a remainder only when W does.
        if d.layout == Layout::Nchw && !w.is_multiple_of(LANES) {
            e.for_range(zero_i, tail, &after, |e, _, q| {
                let x = e.load_f32(q[0], 0);
                let y = match d.kind {
                    EltwiseKind::Relu => {
                        let m = e.b.ins().fcmp(FloatCC::LessThan, zero_s, x);
                        e.b.ins().select(m, x, zero_s)
                    }
                    EltwiseKind::Add => {
                        let z = e.load_f32(q[2], 0);
                        e.b.ins().fadd(x, z)
                    }
                };
                e.store_f32(y, q[1], 0);
                q.iter().map(|&b| e.offset(b, f)).collect()
            });
        }
    });
}

/// The FMA peak loop: `[begin, end)` trips of 8 x 12 independent `vfmadd`s on registers.
pub fn lower_fma_peak(e: &mut Emit<'_>) {
    let src = e.buffer(SRC);
    let dst = e.buffer(DST);
    let a = e.load_vec(src, 0);
    let b = e.load_vec(src, 16);
    let acc: Vec<Value> = (0..crate::key::FMA_PEAK_ACCUMULATORS)
        .map(|k| e.load_vec(dst, 16 * k as i64))
        .collect();
    let (begin, end) = (e.begin, e.end);
    let out = e.for_range(begin, end, &acc, |e, _, acc| {
        let mut acc = acc.to_vec();
        for _ in 0..8 {
            for x in acc.iter_mut() {
                *x = e.fma(a, b, *x);
            }
        }
        acc
    });
    for (k, &x) in out.iter().enumerate() {
        e.store_vec(x, dst, 16 * k as i64);
    }
}
