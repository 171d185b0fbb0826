//! Lowers pooling (windowed and global) and the FMA peak loops to Cranelift IR.
//!
//! All of them vectorize over four channels: a vector load per pixel in `nChw4c`, a gather of
//! four channel planes in NCHW (whose last, partial block of channels gets code of its own so
//! that no lane past the last channel is read or written).

use std::ops::Range;

use primjit_ir::PoolKind;

use crate::backend::cranelift::{
    ActStrides, Emit, ExtentArg, F32_BYTES, IntCC, Scalar, Value, row_pixels,
};
use crate::backend::x64::{GlobalPoolTile, PoolTile, WideTile};
use crate::conv::direct::{ColumnSplit, RunLen};
use crate::key::{
    FMA_BROADCAST_CHANNELS, FMA_PEAK_ACCUMULATORS, FmaPattern, GlobalPoolDesc, Layout,
};
use crate::plan::{Axis, AxisPlan, PoolPlan, Strides};
use crate::target::Isa;
use crate::tile::{GLOBAL_CHAINS, GROUP_TILES, GROUP_VECTORS, LANES};

const SRC: usize = 0;
const DST: usize = 2;

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

/// The value a pooling's reduction starts from.
fn identity(kind: PoolKind) -> f32 {
    match kind {
        PoolKind::Max => f32::NEG_INFINITY,
        PoolKind::Avg => 0.0,
    }
}

/// A pooling's reduction step: the larger of `a` and `x` (NaN once either is), or their sum.
fn combine(e: &mut Emit<'_>, kind: PoolKind, a: Value, x: Value) -> Value {
    match kind {
        PoolKind::Max => e.pmax_nan(a, x),
        PoolKind::Avg => e.fadd(a, x),
    }
}

fn load(
    e: &mut Emit<'_>,
    layout: Layout,
    channel_stride: Scalar,
    base: Value,
    off: i64,
    lanes: usize,
    fill: Value,
) -> Value {
    match layout {
        Layout::Nchw4c => e.load_vec(base, off),
        Layout::Nchw => {
            let stride = e.mul(channel_stride, F32_BYTES);
            e.gather(base, off, stride, lanes, fill)
        }
    }
}

fn store(
    e: &mut Emit<'_>,
    layout: Layout,
    channel_stride: Scalar,
    v: Value,
    base: Value,
    off: i64,
    lanes: usize,
) {
    match layout {
        Layout::Nchw4c => e.store_vec(v, base, off),
        Layout::Nchw => {
            let stride = e.mul(channel_stride, F32_BYTES);
            e.scatter(v, base, off, stride, lanes)
        }
    }
}

/// The taps of one axis for the outputs at hand, with the axis's factor of an average pool's
/// divisor.
#[derive(Clone)]
enum Taps {
    Fixed {
        taps: Range<usize>,
        count: usize,
    },
    /// Computed at run time: first tap, number of taps, divisor factor.
    Runtime {
        first: Value,
        taps: Value,
        count: Value,
    },
}

/// One side of the pool, its input or its output: extents and strides in fresh values. Runtime
/// extents are loaded from the kernel's argument where they are used, so that no runtime value
/// stays live across the loops and takes a register from the ones inside (the same reason as
/// in `conv::direct`).
struct Side {
    strides: ActStrides,
    h: Scalar,
    w: Scalar,
}

impl Side {
    fn input(e: &mut Emit<'_>, plan: &PoolPlan) -> Self {
        let d = &plan.desc;
        let h = e.extent_or(d.runtime.h, ExtentArg::InputH, d.ih);
        let w = e.extent_or(d.runtime.w, ExtentArg::InputW, d.iw);
        let rows = plan.src_rows.map_or(h, |rows| Scalar::Const(rows as i64));
        let strides = e.act_strides(d.src_layout, d.c, rows, w);
        Side { strides, h, w }
    }

    fn output(e: &mut Emit<'_>, plan: &PoolPlan) -> Self {
        let d = &plan.desc;
        let h = e.extent_or(d.runtime.h, ExtentArg::OutputH, d.oh());
        let w = e.extent_or(d.runtime.w, ExtentArg::OutputW, d.ow());
        let strides = e.act_strides(d.dst_layout, d.c, h, row_pixels(plan.dst_pitch, w));
        Side { strides, h, w }
    }
}

/// The taps of the window at runtime output `o` along an axis of `input` (a runtime extent)
/// whose window is `axis`'s (its pads, kernel, stride and dilation), and its divisor factor.
fn runtime_taps(
    e: &mut Emit<'_>,
    o: Value,
    input: Value,
    axis: &Axis,
    count_include_pad: bool,
) -> Taps {
    let (first, taps) = e.runtime_taps(
        o,
        input,
        axis.pad_begin,
        axis.kernel,
        axis.stride,
        axis.dilation,
    );
    let count = if count_include_pad {
        // Cells inside the padded input: the taps of the same window over an input that
        // includes both pads.
        let padded = e.offset(input, (axis.pad_begin + axis.pad_end) as i64);
        e.runtime_taps(o, padded, 0, axis.kernel, axis.stride, axis.dilation)
            .1
    } else {
        taps
    };
    Taps::Runtime { first, taps, count }
}

pub fn lower_pool(e: &mut Emit<'_>, plan: &PoolPlan) {
    let d = &plan.desc;
    let f = F32_BYTES;
    let (input, output) = (Side::input(e, plan), Side::output(e, plan));
    let src = e.buffer(SRC);
    let dst = e.buffer(DST);
    let image_steps = [
        e.mul(input.strides.image, f),
        e.mul(output.strides.image, f),
    ];
    let block_steps = [
        e.mul(input.strides.block, f),
        e.mul(output.strides.block, f),
    ];
    e.for_ptrs(
        Scalar::Const(d.mb as i64),
        &[src, dst],
        &image_steps,
        |e, p| {
            for (blocks, lanes) in block_classes(d.c, d.src_layout, d.dst_layout) {
                let src_b = e.offset_by(p[0], block_steps[0], blocks.start as i64);
                let dst_b = e.offset_by(p[1], block_steps[1], blocks.start as i64);
                e.for_ptrs(
                    Scalar::Const(blocks.len() as i64),
                    &[src_b, dst_b],
                    &block_steps,
                    |e, q| {
                        let row = |e: &mut Emit<'_>, oh: Value, taps: Taps| {
                            let src_row_step = Side::input(e, plan).strides.row;
                            let dst_row_step = Side::output(e, plan).strides.row;
                            let src_row = e.scaled_by(
                                q[0],
                                oh,
                                src_row_step,
                                d.window.strides[0] as i64 * f,
                                0,
                            );
                            let top = e.mul(src_row_step, -(d.window.pads.top as i64) * f);
                            let src_row = e.offset_by(src_row, top, 1);
                            let dst_row = e.scaled_by(q[1], oh, dst_row_step, f, 0);
                            let row = PoolRow {
                                plan,
                                taps: &taps,
                                src_row,
                                dst_row,
                                lanes,
                            };
                            pool_columns(e, &row);
                        };
                        match &plan.rows {
                            AxisPlan::Fixed(runs) | AxisPlan::Bordered { runs, .. } => {
                                for run in runs {
                                    let (start, end) =
                                        e.clamp_items(run.outputs.start, run.outputs.end);
                                    e.for_range(start, end, &[], |e, oh, _| {
                                        let taps = Taps::Fixed {
                                            taps: run.taps.clone(),
                                            count: run.count,
                                        };
                                        row(e, oh, taps);
                                        vec![]
                                    });
                                }
                            }
                            AxisPlan::PerOutput | AxisPlan::Template(_) => {
                                let oh = Side::output(e, plan).h;
                                let (start, end) = e.clamp_items_to(Scalar::Const(0), oh);
                                e.for_range(start, end, &[], |e, oh, _| {
                                    let ih = Side::input(e, plan).h;
                                    let ih = e.value(ih);
                                    let [rows, _] = plan.window_axes();
                                    let taps = runtime_taps(e, oh, ih, &rows, d.count_include_pad);
                                    row(e, oh, taps);
                                    vec![]
                                });
                            }
                        }
                    },
                );
            }
        },
    );
}

/// What one output row's runs of columns share: the plan, the row's kernel-row taps, where
/// the row's window and output start, and the real channels of the block at hand (4, but in
/// an NCHW side's last block).
struct PoolRow<'a> {
    plan: &'a PoolPlan,
    taps: &'a Taps,
    src_row: Value,
    dst_row: Value,
    lanes: usize,
}

/// What a row's tiles share besides: the input's strides and the step from one kernel row to
/// the next, computed once per run (see `pool_run`).
struct PoolTiles<'a> {
    row: &'a PoolRow<'a>,
    input: ActStrides,
    kh_step: Scalar,
}

/// One row's columns: fixed runs, or the runtime template (or one pixel at a time below it).
fn pool_columns(e: &mut Emit<'_>, row: &PoolRow<'_>) {
    let plan = row.plan;
    let d = &plan.desc;
    let run = |e: &mut Emit<'_>, start: Scalar, len: RunLen, taps: Range<usize>, count: usize| {
        let col = Taps::Fixed { taps, count };
        pool_run(e, row, &col, start, len);
    };
    match &plan.cols {
        AxisPlan::Fixed(runs) => {
            for c in runs {
                let start = Scalar::Const(c.outputs.start as i64);
                run(
                    e,
                    start,
                    RunLen::Fixed(c.outputs.len()),
                    c.taps.clone(),
                    c.count,
                );
            }
        }
        AxisPlan::Template(t) => {
            // Once per row: a pooling tile is cheap (its row of 4-pixel tiles costs a few
            // thousand cycles), and its loops have registers to spare for the split.
            let split = &ColumnSplit::load(e, t, plan.pixel_tile);
            e.if_else(
                split.template,
                |e| {
                    for c in &t.head {
                        let start = Scalar::Const(c.outputs.start as i64);
                        run(
                            e,
                            start,
                            RunLen::Fixed(c.outputs.len()),
                            c.taps.clone(),
                            c.count,
                        );
                    }
                    let head = Scalar::Const(t.head_len() as i64);
                    let body = RunLen::Body {
                        template: t,
                        split: Some(*split),
                    };
                    run(e, head, body, t.body_taps.clone(), t.body_count);
                    let tail = |e: &mut Emit<'_>, class: usize| {
                        let total = t.tail_len(class) as i64;
                        for r in &t.tails[class] {
                            let start = e.offset(split.tail_start, total - r.back as i64);
                            let len = RunLen::Fixed(r.len);
                            run(e, Scalar::Dyn(start), len, r.taps.clone(), r.count);
                        }
                    };
                    match split.class {
                        None => tail(e, 0),
                        Some(class) => e.switch(class, t.tails.len(), tail),
                    }
                },
                |e| {
                    let zero = e.iconst(0);
                    let ow = Side::output(e, plan).w;
                    let ow = e.value(ow);
                    e.for_range(zero, ow, &[], |e, o, _| {
                        let iw = Side::input(e, plan).w;
                        let iw = e.value(iw);
                        let [_, cols] = plan.window_axes();
                        let col = runtime_taps(e, o, iw, &cols, d.count_include_pad);
                        pool_run(e, row, &col, Scalar::Dyn(o), RunLen::Fixed(1));
                        vec![]
                    });
                },
            );
        }
        AxisPlan::PerOutput | AxisPlan::Bordered { .. } => {
            unreachable!("columns use fixed runs or a template")
        }
    }
}

/// The output columns `[start, start + len)` of one row, whose windows share `col`'s taps.
fn pool_run(e: &mut Emit<'_>, row: &PoolRow<'_>, col: &Taps, start: Scalar, len: RunLen) {
    let plan = row.plan;
    let d = &plan.desc;
    let f = F32_BYTES;
    let src_px = pixel_stride(d.src_layout) * f;
    let dst_px = pixel_stride(d.dst_layout) * f;
    let src0 = e.offset_by(row.src_row, start, d.window.strides[1] as i64 * src_px);
    let src0 = e.offset(src0, -(d.window.pads.left as i64) * src_px);
    let dst0 = e.offset_by(row.dst_row, start, dst_px);
    let tile = plan.pixel_tile;
    let t = tile as i64;
    let steps = [
        Scalar::Const(t * d.window.strides[1] as i64 * src_px),
        Scalar::Const(t * dst_px),
    ];
    // Unlike a convolution's, a pooling tile's loop has registers to spare: its input strides
    // are computed once per run rather than per tile (where they cost a load and three
    // multiplies against a tile's ~80 instructions).
    let input = Side::input(e, plan).strides;
    let kh_step = e.mul(input.row, d.window.dilations[0] as i64 * f);
    let tiles = PoolTiles {
        row,
        input,
        kh_step,
    };
    let tile_at = |e: &mut Emit<'_>, pixels: usize, q: &[Value]| {
        pool_tile(e, &tiles, pixels, col, q[0], q[1]);
    };
    match len {
        RunLen::Fixed(len) if matches!(col, Taps::Runtime { .. }) => {
            debug_assert_eq!(len, 1, "runtime column taps take one pixel at a time");
            tile_at(e, 1, &[src0, dst0]);
        }
        RunLen::Fixed(len) => {
            // The remainder tile continues from where the full tiles left the pointers.
            let full = Scalar::Const((len / tile) as i64);
            let q = e.for_ptrs(full, &[src0, dst0], &steps, |e, q| tile_at(e, tile, q));
            if len % tile > 0 {
                tile_at(e, len % tile, &q);
            }
        }
        RunLen::Body { .. } => {
            let split = len.split(e, tile);
            let full = Scalar::Dyn(split.full_tiles);
            let q = e.for_ptrs(full, &[src0, dst0], &steps, |e, q| tile_at(e, tile, q));
            e.switch(split.remainder, tile, |e, pixels| {
                if pixels > 0 {
                    tile_at(e, pixels, &q);
                }
            });
        }
    }
}

/// Elements from one pixel to the next along a row.
fn pixel_stride(layout: Layout) -> i64 {
    match layout {
        Layout::Nchw => 1,
        Layout::Nchw4c => LANES as i64,
    }
}

/// `pixels` output pixels of one channel vector from `src` to `dst`: every tap loaded and
/// reduced in registers (at a wide tier, the whole wide vectors by the x64 backend's tile).
fn pool_tile(
    e: &mut Emit<'_>,
    tiles: &PoolTiles<'_>,
    pixels: usize,
    col: &Taps,
    src: Value,
    dst: Value,
) {
    let PoolTiles {
        row,
        ref input,
        kh_step,
    } = *tiles;
    let plan = row.plan;
    if let Some(ratio) = plan.wide_ratio()
        && matches!(col, Taps::Fixed { .. })
        && pixels >= ratio
    {
        let done = wide_pool_tile(e, tiles, pixels / ratio, col, src, dst);
        if done < pixels {
            let f = F32_BYTES;
            let src_px = input.pixel * plan.desc.window.strides[1] as i64 * f;
            let dst_px = pixel_stride(plan.desc.dst_layout) * f;
            let src = e.offset(src, done as i64 * src_px);
            let dst = e.offset(dst, done as i64 * dst_px);
            let plan_x128 = plan.x128();
            let row_x128 = PoolRow {
                plan: &plan_x128,
                ..*row
            };
            let tiles_x128 = PoolTiles {
                row: &row_x128,
                ..*tiles
            };
            pool_tile(e, &tiles_x128, pixels - done, col, src, dst);
        }
        return;
    }
    let (row, lanes) = (row.taps, row.lanes);
    let d = &plan.desc;
    let f = F32_BYTES;
    let init = identity(d.kind);
    let fill = e.splat_const(0.0);
    let acc: Vec<Value> = (0..pixels).map(|_| e.splat_const(init)).collect();
    let src_px = input.pixel * f;
    let kw_step = d.window.dilations[1] as i64 * src_px;
    let channel = input.channel;
    let reduce = |e: &mut Emit<'_>, src: Value, off: i64, a: Value| {
        let x = load(e, d.src_layout, channel, src, off, lanes, fill);
        combine(e, d.kind, a, x)
    };
    // One kernel row at `src_kh`: its column taps, for every pixel.
    let kernel_row = |e: &mut Emit<'_>, src_kh: Value, acc: &[Value]| -> Vec<Value> {
        let mut acc = acc.to_vec();
        match col {
            Taps::Fixed { taps, .. } => {
                for kw in taps.clone() {
                    for (p, a) in acc.iter_mut().enumerate() {
                        let off = kw as i64 * kw_step + (p * d.window.strides[1]) as i64 * src_px;
                        *a = reduce(e, src_kh, off, *a);
                    }
                }
                acc
            }
            Taps::Runtime { first, taps, .. } => {
                let src_kw0 = e.scaled(src_kh, *first, kw_step, 0);
                let mut state = vec![src_kw0];
                state.extend(&acc);
                let zero = e.iconst(0);
                let out = e.for_range(zero, *taps, &state, |e, _, s| {
                    let mut next = vec![e.offset(s[0], kw_step)];
                    for (p, &a) in s[1..].iter().enumerate() {
                        next.push(reduce(
                            e,
                            s[0],
                            (p * d.window.strides[1]) as i64 * src_px,
                            a,
                        ));
                    }
                    next
                });
                out[1..].to_vec()
            }
        }
    };
    let src_kh0 = first_kernel_row(e, src, kh_step, row);
    let acc = match row {
        Taps::Fixed { taps, .. } => {
            let mut acc = acc;
            let mut src_kh = src_kh0;
            for _ in taps.clone() {
                acc = kernel_row(e, src_kh, &acc);
                src_kh = e.offset_by(src_kh, kh_step, 1);
            }
            acc
        }
        Taps::Runtime { taps, .. } => {
            let mut state = vec![src_kh0];
            state.extend(&acc);
            let zero = e.iconst(0);
            let out = e.for_range(zero, *taps, &state, |e, _, s| {
                let mut next = vec![e.offset_by(s[0], kh_step, 1)];
                next.extend(kernel_row(e, s[0], &s[1..]));
                next
            });
            out[1..].to_vec()
        }
    };
    let scale = (d.kind == PoolKind::Avg).then(|| {
        let recip = avg_reciprocal(e, row, col);
        e.splat_f32(recip)
    });
    // Only an NCHW destination needs its channel stride (and its extents).
    let dst_channel = match d.dst_layout {
        Layout::Nchw => Side::output(e, plan).strides.channel,
        Layout::Nchw4c => Scalar::Const(1),
    };
    for (p, &a) in acc.iter().enumerate() {
        let v = match scale {
            Some(s) => e.fmul(a, s),
            None => a,
        };
        let off = p as i64 * pixel_stride(d.dst_layout) * f;
        store(e, d.dst_layout, dst_channel, v, dst, off, lanes);
    }
}

/// The first `vectors` wide vectors of a pooling tile at a wide tier as one call of the x64
/// backend's [`PoolTile`] (`PoolDesc::tier_for`: `nChw4c`), which reduces each pixel's taps
/// in the order of the 128-bit tile and so gives the same bits. `col` holds fixed taps.
/// Returns the pixels it computed.
fn wide_pool_tile(
    e: &mut Emit<'_>,
    tiles: &PoolTiles<'_>,
    vectors: usize,
    col: &Taps,
    src: Value,
    dst: Value,
) -> usize {
    let (plan, row, input, kh_step) = (tiles.row.plan, tiles.row.taps, &tiles.input, tiles.kh_step);
    let Taps::Fixed { taps: col_taps, .. } = col else {
        unreachable!("a wide pooling tile has fixed column taps")
    };
    let d = &plan.desc;
    let src_px = input.pixel * F32_BYTES;
    let kw_step = d.window.dilations[1] as i64 * src_px;
    let spec = PoolTile {
        isa: d.isa,
        max: d.kind == PoolKind::Max,
        vectors,
        units: col_taps.clone().map(|kw| kw as i64 * kw_step).collect(),
        pixel_bytes: d.window.strides[1] as i64 * src_px,
    };
    let src_kh = first_kernel_row(e, src, kh_step, row);
    let kh_count = match row {
        Taps::Fixed { taps, .. } => e.iconst(taps.len() as i64),
        Taps::Runtime { taps, .. } => *taps,
    };
    let kh_step = e.value(kh_step);
    let scale = match d.kind {
        PoolKind::Max => e.iconst(0),
        PoolKind::Avg => {
            let recip = avg_reciprocal(e, row, col);
            e.f32_bits(recip)
        }
    };
    e.call_tile(
        WideTile::Pool(spec),
        &[src_kh, dst, kh_count, kh_step, scale],
    );
    vectors * plan.wide_ratio().expect("a wide plan")
}

/// `src` moved to the window's first kernel row that `row` takes, kernel rows `kh_step` bytes
/// apart.
fn first_kernel_row(e: &mut Emit<'_>, src: Value, kh_step: Scalar, row: &Taps) -> Value {
    match row {
        Taps::Fixed { taps, .. } => e.offset_by(src, kh_step, taps.start as i64),
        Taps::Runtime { first, .. } => {
            let first_off = match kh_step {
                Scalar::Const(s) => e.imul_imm(*first, s),
                Scalar::Dyn(s) => e.imul(*first, s),
            };
            e.iadd(src, first_off)
        }
    }
}

/// An average pool's `1 / (row count x column count)`, as an f32 scalar: a constant for fixed
/// taps, else computed at run time as the same division.
fn avg_reciprocal(e: &mut Emit<'_>, row: &Taps, col: &Taps) -> Value {
    match (row, col) {
        (Taps::Fixed { count: r, .. }, Taps::Fixed { count: c, .. }) => {
            e.f32const(1.0 / (r * c) as f32)
        }
        _ => {
            let count = |e: &mut Emit<'_>, t: &Taps| match t {
                Taps::Fixed { count, .. } => e.iconst(*count as i64),
                Taps::Runtime { count, .. } => *count,
            };
            let (r, c) = (count(e, row), count(e, col));
            let n = e.imul(r, c);
            let n = e.int_to_f32(n);
            let one = e.f32const(1.0);
            e.fdiv(one, n)
        }
    }
}

/// A global pooling: per block of four channels (the work items, so threads split the
/// channels) and image, the pixels in [`GLOBAL_CHAINS`] partials, pixel `p` to partial
/// `p % GLOBAL_CHAINS`, summed as a tree. Runtime extents give the same partials and order:
/// the last pixels go to partials `0..rest`, each behind a test of `rest`. At a wide tier the
/// full trips are the x64 backend's tile (`wide_global_trips`), with the same partials.
pub fn lower_global_pool(e: &mut Emit<'_>, d: &GlobalPoolDesc) {
    let f = F32_BYTES;
    let ih = e.extent_or(d.runtime.h, ExtentArg::InputH, d.ih);
    let iw = e.extent_or(d.runtime.w, ExtentArg::InputW, d.iw);
    let src_s = e.act_strides(d.src_layout, d.c, ih, iw);
    let dst_s = Strides::new(d.dst_layout, [d.mb, d.c, 1, 1]);
    let pixels = e.product(ih, iw);
    for (blocks, lanes) in block_classes(d.c, d.src_layout, d.dst_layout) {
        let (start, end) = e.clamp_items(blocks.start, blocks.end);
        e.for_range(start, end, &[], |e, block, _| {
            let src = e.buffer(SRC);
            let dst = e.buffer(DST);
            let src_b = e.scaled_by(src, block, src_s.block, f, 0);
            let dst_b = e.scaled(dst, block, (dst_s.block * f as usize) as i64, 0);
            let image_steps = [e.mul(src_s.image, f), Scalar::Const(dst_s.image as i64 * f)];
            let images = Scalar::Const(d.mb as i64);
            e.for_ptrs(images, &[src_b, dst_b], &image_steps, |e, q| {
                let fill = e.splat_const(0.0);
                let pixel = src_s.pixel * f;
                let channel = src_s.channel;
                let reduce = |e: &mut Emit<'_>, a: Value, src: Value, off: i64| {
                    let x = load(e, d.src_layout, channel, src, off, lanes, fill);
                    combine(e, d.kind, a, x)
                };
                // Pixel `p` goes to partial `p % GLOBAL_CHAINS`: independent chains, where
                // one chain waited an add's latency per pixel.
                let chains = GLOBAL_CHAINS as i64;
                let body = |e: &mut Emit<'_>, _: Value, s: &[Value]| {
                    let mut next = vec![e.offset(s[0], chains * pixel)];
                    for (k, &a) in s[1..].iter().enumerate() {
                        next.push(reduce(e, a, s[0], k as i64 * pixel));
                    }
                    next
                };
                let trips = match pixels {
                    Scalar::Const(p) => Scalar::Const(p / chains),
                    Scalar::Dyn(p) => Scalar::Dyn(e.ushr_imm(p, chains.trailing_zeros() as i64)),
                };
                let out = if d.isa == Isa::X128 {
                    let init = e.splat_const(identity(d.kind));
                    let mut carried = vec![q[0]];
                    carried.extend([init; GLOBAL_CHAINS]);
                    match trips {
                        Scalar::Const(t) => e.for_count(t as usize, &carried, body),
                        Scalar::Dyn(t) => {
                            let zero = e.iconst(0);
                            e.for_range(zero, t, &carried, body)
                        }
                    }
                } else {
                    wide_global_trips(e, d, q[0], trips)
                };
                let mut partials = match pixels {
                    Scalar::Const(p) => {
                        let mut partials = out[1..].to_vec();
                        for (k, a) in partials
                            .iter_mut()
                            .take(p as usize % GLOBAL_CHAINS)
                            .enumerate()
                        {
                            *a = reduce(e, *a, out[0], k as i64 * pixel);
                        }
                        partials
                    }
                    Scalar::Dyn(p) => {
                        let rest = e.band_imm(p, chains - 1);
                        let mut partials = out[1..].to_vec();
                        for (k, a) in partials.iter_mut().enumerate().take(GLOBAL_CHAINS - 1) {
                            let more = e.icmp_imm(IntCC::SignedGreaterThan, rest, k as i64);
                            let prev = *a;
                            *a = e.if_else_values(
                                more,
                                |e| vec![reduce(e, prev, out[0], k as i64 * pixel)],
                                |_| vec![prev],
                            )[0];
                        }
                        partials
                    }
                };
                // Pairwise, as a tree: partials `k` and `k + half`, then halves.
                while partials.len() > 1 {
                    let half = partials.len() / 2;
                    partials = (0..half)
                        .map(|k| combine(e, d.kind, partials[k], partials[k + half]))
                        .collect();
                }
                let mut v = partials[0];
                if d.kind == PoolKind::Avg {
                    // `1 / pixels` rounded to f32 as a fixed key's constant is.
                    let scale = match pixels {
                        Scalar::Const(p) => e.f32const(1.0 / p as f32),
                        Scalar::Dyn(p) => {
                            let n = e.int_to_f32(p);
                            let one = e.f32const(1.0);
                            e.fdiv(one, n)
                        }
                    };
                    let s = e.splat_f32(scale);
                    v = e.fmul(v, s);
                }
                store(
                    e,
                    d.dst_layout,
                    Scalar::Const(dst_s.channel as i64),
                    v,
                    q[1],
                    0,
                    lanes,
                );
            });
            vec![]
        });
    }
}

/// A global pooling's full trips of [`GLOBAL_CHAINS`] pixels from `src` at a wide tier, as
/// the x64 backend's [`GlobalPoolTile`], its partials passed back through a stack slot:
/// returns the source after them and the partials, as the 128-bit loop does.
fn wide_global_trips(
    e: &mut Emit<'_>,
    d: &GlobalPoolDesc,
    src: Value,
    trips: Scalar,
) -> Vec<Value> {
    let vector = F32_BYTES * LANES as i64;
    let bytes = u32::try_from(GLOBAL_CHAINS as i64 * vector).expect("a small slot");
    let slot = e.stack_slot(bytes, 4);
    let partials = e.stack_addr(slot, 0);
    let count = e.value(trips);
    let tile = GlobalPoolTile {
        isa: d.isa,
        max: d.kind == PoolKind::Max,
    };
    e.call_tile(WideTile::GlobalPool(tile), &[src, count, partials]);
    let trip_bytes = GLOBAL_CHAINS as i64 * vector;
    let after = match trips {
        Scalar::Const(t) => e.offset(src, t * trip_bytes),
        Scalar::Dyn(t) => e.scaled(src, t, trip_bytes, 0),
    };
    let mut out = vec![after];
    out.extend((0..GLOBAL_CHAINS).map(|k| e.load_vec(partials, k as i64 * vector)));
    out
}

/// The FMA peak loop: `[begin, end)` trips of `pattern` on 12 chains: 8 x 12 independent
/// `vfmadd`s on registers (each chain `x <- x * b + a`), or the direct convolutions' register
/// tile over 12 channels (a weight vector, then a broadcast load and an FMA per accumulator),
/// or, on 10 chains, the Winograd GEMM's (two weight vectors, then per tile a broadcast load
/// and an FMA per vector).
pub fn lower_fma_peak(e: &mut Emit<'_>, pattern: FmaPattern) {
    let src = e.buffer(SRC);
    let dst = e.buffer(DST);
    // Only the chains the pattern runs: a value carried through the loop untouched would take
    // a register of the 16.
    let chains = match pattern {
        FmaPattern::Registers | FmaPattern::Broadcast => FMA_PEAK_ACCUMULATORS,
        FmaPattern::SharedBroadcast => GROUP_TILES * GROUP_VECTORS,
    };
    let acc: Vec<Value> = (0..chains)
        .map(|k| e.load_vec(dst, 16 * k as i64))
        .collect();
    let (begin, end) = (e.begin, e.end);
    let out = match pattern {
        FmaPattern::Registers => {
            let a = e.load_vec(src, 0);
            let b = e.load_vec(src, 16);
            // `x * b + a`, not `a * b + x`: Cranelift ties an FMA's result to its first
            // multiplicand, so each chain's value is consumed in place; with `a` first, every
            // FMA needed a register copy of it (a move per FMA, and a peak about 5% low).
            e.for_range(begin, end, &acc, |e, _, acc| {
                let mut acc = acc.to_vec();
                for _ in 0..8 {
                    for x in acc.iter_mut() {
                        *x = e.fma(*x, b, a);
                    }
                }
                acc
            })
        }
        FmaPattern::Broadcast => e.for_range(begin, end, &acc, |e, _, acc| {
            let mut acc = acc.to_vec();
            let scalars = 4 * FMA_BROADCAST_CHANNELS as i64;
            for channel in 0..FMA_BROADCAST_CHANNELS as i64 {
                let w = e.load_vec(src, 16 * channel);
                for (k, x) in acc.iter_mut().enumerate() {
                    let at = scalars + channel * FMA_PEAK_ACCUMULATORS as i64 + k as i64;
                    let b = e.splat_load(src, 4 * at);
                    *x = e.fma(b, w, *x);
                }
            }
            acc
        }),
        // As `conv::winograd`'s register tile emits it: the broadcast is the FMAs' first
        // multiplicand, and the accumulators are vector-major.
        FmaPattern::SharedBroadcast => e.for_range(begin, end, &acc, |e, _, acc| {
            let mut acc = acc.to_vec();
            let vector_floats = 4 * GROUP_VECTORS as i64;
            let scalars = vector_floats * FMA_BROADCAST_CHANNELS as i64;
            for channel in 0..FMA_BROADCAST_CHANNELS as i64 {
                let w: Vec<Value> = (0..GROUP_VECTORS as i64)
                    .map(|j| e.load_vec(src, 4 * (channel * vector_floats + 4 * j)))
                    .collect();
                for tile in 0..GROUP_TILES {
                    let at = scalars + channel * GROUP_TILES as i64 + tile as i64;
                    let b = e.splat_load(src, 4 * at);
                    for (j, &w) in w.iter().enumerate() {
                        let x = &mut acc[j * GROUP_TILES + tile];
                        *x = e.fma(b, w, *x);
                    }
                }
            }
            acc
        }),
    };
    for (k, &x) in out.iter().enumerate() {
        e.store_vec(x, dst, 16 * k as i64);
    }
}
