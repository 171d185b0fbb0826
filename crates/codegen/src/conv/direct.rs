//! Lowers a convolution plan to Cranelift IR: register-tiled direct convolution.
//!
//! Loop nest: image, output-channel tile, rows (with fixed extents, one loop over the border
//! rows with their kernel-row range computed at run time, then the interior run; see
//! [`AxisPlan::Bordered`]), chunk of the
//! reduction (when a tile's weights exceed L1, see [`ConvPlan::chunks`]), column run, pixel
//! tile, with the tile and row loops swapped when the plan says so ([`ConvPlan::rows_outer`])
//! and the chunks outside the rows when it says that ([`ConvPlan::chunks_outer`]);
//! inside a tile the reduction loop over input channels carries the accumulators, with
//! an inner loop over the run's kernel rows and the kernel columns unrolled. Each FMA reads its
//! input pixel with its own broadcast load, so x64 folds it into `vbroadcastss m32`. Every
//! pixel's sum takes the same order in every tile, so that its value does not depend on how a
//! row is cut into tiles; a narrow tile (a border column, a row's remainder) computes several
//! output-channel tiles at once, so that it still has enough independent chains
//! ([`ConvPlan::narrow_group`]). At a wide tier, a fixed-width row's border columns sit inside
//! its tiles instead, which skip the kernel columns a border pixel misses
//! ([`ConvPlan::bordered_tiles`]).
//!
//! Runtime extents (see [`crate::key::RuntimeDims`]) change only the outer structure: strides
//! become registers, a runtime height computes each row's kernel-row range at run time, and a
//! runtime width walks its column template (specialized head and tail runs, a body of full
//! tiles in a loop and a jump table over the remainder tiles), or, below the template's
//! smallest width, one pixel at a time with runtime kernel-column bounds.

use super::apply_post_ops;
use crate::backend::cranelift::{
    ActStrides, Emit, ExtentArg, F32_BYTES, IntCC, Scalar, Value, row_pixels,
};
use crate::backend::x64::{
    DirectTile, LaneVector, LanewiseTile, LanewiseUnit, TileFinish, TileInit, TileUnit, WideTile,
};
use crate::key::{Layout, PostOpDesc};
use crate::plan::{AxisPlan, AxisTemplate, ConvPlan, RowChunk, RowVector, TileRun};
use crate::tile::LANES;

/// Buffer indices in the argument list.
const SRC: usize = 0;
const WEIGHTS: usize = 1;
const DST: usize = 2;
const FIRST_RESIDUAL: usize = 3;

/// How many lanes of each vector of a tile hold real output channels, for NCHW stores.
type LaneCounts = [usize; 2];

/// What the tiles of a class compute: their 4-lane vectors of output channels (the plan's
/// `vecs`, fewer for a short last tile, [`ConvPlan::last_tile_vecs`]) and the real lanes of
/// each for an NCHW destination.
#[derive(Clone, Copy)]
struct TileShape {
    vecs: usize,
    lanes: LaneCounts,
}

struct TileClass {
    tiles: std::ops::Range<usize>,
    shape: TileShape,
}

/// The pointers a pixel tile works from.
#[derive(Clone, Copy)]
struct TilePtrs {
    src: Value,
    weights: Value,
    /// The tile's channel parameters where the key has any: its bias (with a bias), then,
    /// [`ConvPlan::slopes_disp`] bytes on, its PReLU slopes (with a PReLU post-op).
    params: Option<Value>,
    dst: Value,
    /// Which chunk of the reduction this is, when the plan splits it
    /// ([`ConvPlan::chunks`]): the first starts from the bias, the last applies the post-ops,
    /// the others carry partial sums through the destination.
    chunk: Option<Value>,
    /// The output-channel tile's index: a narrow register tile spans the group of tiles that
    /// starts at a multiple of [`ConvPlan::narrow_group`].
    oc_tile: Value,
}

/// The kernel taps of one axis for the outputs at hand.
#[derive(Clone)]
enum Taps {
    Fixed(std::ops::Range<usize>),
    /// Computed at run time: the first tap and how many there are.
    Runtime {
        first: Value,
        count: Value,
    },
    /// The kernel rows of output row `oh`, computed by each pixel tile where it needs them, so
    /// that no tap value stays live across the row's loops (`oh` does anyway). Computed once
    /// per row instead, they pushed the kernel-row counter of the 128-channel layers' border
    /// rows to the stack, and the trunk's 20-row layers ran 1-3% slower.
    OfRow {
        oh: Value,
    },
}

/// Everything about the call's geometry the loops need, computed once at entry.
struct Geometry {
    src: ActStrides,
    dst: ActStrides,
    /// Bytes from one kernel row's input row to the next.
    kh_src_step: Scalar,
    /// Bytes from one step of the reduction's input channels to the next.
    ic_src_step: Scalar,
    /// Bytes between the channels of an NCHW destination (and its residuals).
    dst_lane_stride: Scalar,
    /// Bytes between two blocks of four channels of the destination.
    dst_block_bytes: Scalar,
    ih: Scalar,
    iw: Scalar,
    oh: Scalar,
    ow: Scalar,
}

/// The runtime split of a row into the column template's parts.
#[derive(Clone, Copy)]
pub(crate) struct ColumnSplit {
    /// Whether the template applies: the width is at least its smallest width.
    pub(crate) template: Value,
    /// `iw % stride`, when the tails differ between residue classes.
    pub(crate) class: Option<Value>,
    /// Where the tail starts, `ow - tail_len(class)`.
    pub(crate) tail_start: Value,
    pub(crate) full_tiles: Value,
    pub(crate) remainder: Value,
}

impl Geometry {
    /// The geometry in fresh values: runtime extents are loaded from the kernel's argument
    /// where they are needed, so that no runtime stride stays live across the loops (and takes
    /// a register from the innermost one, or is reloaded from the stack there).
    fn new(e: &mut Emit<'_>, plan: &ConvPlan) -> Self {
        let d = &plan.desc;
        let rt = d.runtime;
        let ih = e.extent_or(rt.h, ExtentArg::InputH, d.ih);
        let iw = e.extent_or(rt.w, ExtentArg::InputW, d.iw);
        let oh = e.extent_or(rt.h, ExtentArg::OutputH, d.oh());
        let ow = e.extent_or(rt.w, ExtentArg::OutputW, d.ow());
        let src = e.act_strides(d.src_layout, d.ic, ih, row_pixels(d.pitches.src, iw));
        let dst_rows = plan.dst_rows.map_or(oh, |rows| Scalar::Const(rows as i64));
        let dst = e.act_strides(d.dst_layout, d.oc, dst_rows, row_pixels(d.pitches.dst, ow));
        let f = F32_BYTES;
        let kh_src_step = e.mul(src.row, d.dilations[0] as i64 * f);
        let ic_src_step = match d.src_layout {
            Layout::Nchw => e.mul(src.channel, f),
            Layout::Nchw4c => e.mul(src.block, f),
        };
        let dst_lane_stride = e.mul(dst.channel, f);
        let dst_block_bytes = e.mul(dst.block, f);
        Geometry {
            src,
            dst,
            kh_src_step,
            ic_src_step,
            dst_lane_stride,
            dst_block_bytes,
            ih,
            iw,
            oh,
            ow,
        }
    }
}

impl ColumnSplit {
    /// The split from fresh loads of the widths. Kernels compute it where each part is
    /// needed, so that nothing computed before the body's loop stays live across it and takes
    /// a register from the loops inside.
    pub(crate) fn load(e: &mut Emit<'_>, t: &AxisTemplate, tile: usize) -> Self {
        let iw = e.extent(ExtentArg::InputW);
        let ow = e.extent(ExtentArg::OutputW);
        Self::new(e, t, iw, ow, tile)
    }

    fn new(e: &mut Emit<'_>, t: &AxisTemplate, iw: Value, ow: Value, tile: usize) -> Self {
        let template = e.icmp_imm(IntCC::SignedGreaterThanOrEqual, iw, t.min_input as i64);
        let classes = t.tails.len();
        let class = (classes > 1 && t.tails.iter().any(|c| c != &t.tails[0]))
            .then(|| e.urem_const(iw, classes as u64));
        let mut tail_len = e.iconst(t.tail_len(0) as i64);
        if let Some(class) = class {
            for c in 1..classes {
                let is_c = e.icmp_imm(IntCC::Equal, class, c as i64);
                let len = e.iconst(t.tail_len(c) as i64);
                tail_len = e.select(is_c, len, tail_len);
            }
        }
        let tail_start = e.isub(ow, tail_len);
        // Below the template's width the body may be negative; it is only used above it.
        let body = e.offset(tail_start, -(t.head_len() as i64));
        let zero = e.iconst(0);
        let body = e.imax(body, zero);
        let full_tiles = e.udiv_const(body, tile as u64);
        let remainder = e.urem_const(body, tile as u64);
        ColumnSplit {
            template,
            class,
            tail_start,
            full_tiles,
            remainder,
        }
    }
}

pub fn lower(e: &mut Emit<'_>, plan: &ConvPlan) {
    let d = &plan.desc;
    let tile_oc = plan.vecs * LANES;
    // With an NCHW destination, lanes past the last output channel must not be stored, so a
    // partial last tile gets code of its own; nChw4c stores its padding lanes. A short last
    // tile of a wide plan gets code of its own too: fewer vectors.
    let full = TileShape {
        vecs: plan.vecs,
        lanes: [LANES; 2],
    };
    let last = plan.oc_tiles - 1;
    let last_shape = if d.dst_layout == Layout::Nchw && !d.oc.is_multiple_of(tile_oc) {
        let rem = d.oc - last * tile_oc;
        Some(TileShape {
            lanes: [rem.min(LANES), rem.saturating_sub(LANES)],
            ..full
        })
    } else if plan.last_tile_vecs() != plan.vecs {
        Some(TileShape {
            vecs: plan.last_tile_vecs(),
            ..full
        })
    } else {
        None
    };
    let classes = match last_shape {
        None => vec![TileClass {
            tiles: 0..plan.oc_tiles,
            shape: full,
        }],
        Some(shape) => vec![
            TileClass {
                tiles: 0..last,
                shape: full,
            },
            TileClass {
                tiles: last..plan.oc_tiles,
                shape,
            },
        ],
    };
    // The loop order is the plan's (`ConvPlan::rows_outer`): rows outer keeps a row's input
    // rows in cache while every tile reads them; tiles outer keeps a tile's weights in cache
    // across the rows. A plan of one row whose work items are parts of the tiles has one
    // order.
    if let Some(per_item) = plan.tiles_per_item {
        lower_tile_items(e, plan, &classes, per_item);
    } else if plan.rows_outer {
        lower_rows_outer(e, plan, &classes);
    } else {
        lower_tiles_outer(e, plan, &classes);
    }
}

/// Output-channel tiles outer, rows inner: each tile's pointers step from tile to tile and
/// stay live across its rows.
fn lower_tiles_outer(e: &mut Emit<'_>, plan: &ConvPlan, classes: &[TileClass]) {
    let d = &plan.desc;
    let tile_oc = plan.vecs * LANES;
    let geo = Geometry::new(e, plan);
    let src = e.buffer(SRC);
    let weights = e.buffer(WEIGHTS);
    let dst = e.buffer(DST);
    let residuals: Vec<Value> = (0..d.residuals())
        .map(|i| e.buffer(FIRST_RESIDUAL + i))
        .collect();
    let tile_w_bytes = plan.tile_weights_len() as i64 * F32_BYTES;
    let tile_dst_bytes = e.mul(geo.dst.block, plan.vecs as i64 * F32_BYTES);
    let image_steps = [
        e.mul(geo.src.image, F32_BYTES),
        e.mul(geo.dst.image, F32_BYTES),
    ];

    e.for_ptrs(
        Scalar::Const(d.mb as i64),
        &[src, dst],
        &image_steps,
        |e, p| {
            let (src_n, dst_n) = (p[0], p[1]);
            let res_n: Vec<Value> = residuals
                .iter()
                .map(|&r| {
                    // Residuals share the destination's layout: same offsets as `dst_n - dst`.
                    let off = e.isub(dst_n, dst);
                    e.iadd(r, off)
                })
                .collect();
            for class in classes {
                let first = class.tiles.start;
                let first_ch = src_chan_bytes(e, plan, &geo, plan.ic.first(first));
                let src_t0 = e.offset_by(src_n, first_ch, 1);
                let w_t0 = e.offset(weights, first as i64 * tile_w_bytes);
                let params_t0 = (d.bias || d.prelu())
                    .then(|| (plan.bias_offset() + first * tile_oc) as i64 * F32_BYTES);
                let params_t0 = params_t0.map(|off| e.offset(weights, off));
                let dst_t0 = e.offset_by(dst_n, tile_dst_bytes, first as i64);
                let res_t0: Vec<Value> = res_n
                    .iter()
                    .map(|&r| e.offset_by(r, tile_dst_bytes, first as i64))
                    .collect();

                let mut ptrs = vec![src_t0, w_t0, dst_t0];
                // Tiles that share their group's range step their source in the body.
                let src_step = match plan.ic.every {
                    1 => src_chan_bytes(e, plan, &geo, plan.ic.step),
                    _ => Scalar::Const(0),
                };
                let mut steps = vec![src_step, Scalar::Const(tile_w_bytes), tile_dst_bytes];
                if let Some(b) = params_t0 {
                    ptrs.push(b);
                    steps.push(Scalar::Const(tile_oc as i64 * F32_BYTES));
                }
                ptrs.extend(&res_t0);
                steps.extend(std::iter::repeat_n(tile_dst_bytes, res_t0.len()));
                // The tile's index, last.
                ptrs.push(e.iconst(first as i64));
                steps.push(Scalar::Const(1));
                let has_params = params_t0.is_some();
                e.for_ptrs(
                    Scalar::Const(class.tiles.len() as i64),
                    &ptrs,
                    &steps,
                    |e, p| {
                        let (&oc_tile, p) = p.split_last().expect("the tile index");
                        let (params, res) = if has_params {
                            (Some(p[3]), &p[4..])
                        } else {
                            (None, &p[3..])
                        };
                        let src = match plan.ic.every {
                            1 => p[0],
                            every => {
                                let run = e.udiv_const(oc_tile, every as u64);
                                let run = e.offset(run, -((first / every) as i64));
                                let geo = Geometry::new(e, plan);
                                let step = src_chan_bytes(e, plan, &geo, plan.ic.step);
                                e.scaled_by(p[0], run, step, 1, 0)
                            }
                        };
                        let tile = TilePtrs {
                            src,
                            weights: p[1],
                            params,
                            dst: p[2],
                            chunk: None,
                            oc_tile,
                        };
                        if plan.chunks_outer {
                            tile_chunks(e, plan, tile, res, class.shape);
                            return;
                        }
                        rows(e, plan, &geo, |e, oh, taps| {
                            row(e, plan, oh, &taps, tile, res, class.shape)
                        });
                    },
                );
            }
        },
    );
}

/// The rows of one output-channel tile, chunk by chunk of the reduction
/// ([`ConvPlan::chunks_outer`]): each chunk's weights serve every row before the next chunk's.
fn tile_chunks(
    e: &mut Emit<'_>,
    plan: &ConvPlan,
    tile: TilePtrs,
    residuals: &[Value],
    shape: TileShape,
) {
    for_each_chunk(e, plan, tile, |e, chunk_tile| {
        let geo = Geometry::new(e, plan);
        rows(e, plan, &geo, |e, oh, taps| {
            row(e, plan, oh, &taps, chunk_tile, residuals, shape)
        });
    });
}

/// Runs `body` once per chunk of the reduction ([`ConvPlan::chunks`]), with `tile`'s source
/// and weights moved to the chunk's input channels and `chunk` set.
fn for_each_chunk(
    e: &mut Emit<'_>,
    plan: &ConvPlan,
    tile: TilePtrs,
    mut body: impl FnMut(&mut Emit<'_>, TilePtrs),
) {
    let d = &plan.desc;
    let zero = e.iconst(0);
    let count = e.iconst(plan.chunks() as i64);
    let carried = [tile.src, tile.weights];
    e.for_range(zero, count, &carried, |e, chunk, p| {
        let chunk_tile = TilePtrs {
            src: p[0],
            weights: p[1],
            chunk: Some(chunk),
            ..tile
        };
        body(e, chunk_tile);
        let geo = Geometry::new(e, plan);
        let ic_steps = (plan.ic_chunk / plan.ic_step) as i64;
        let w_bytes = (plan.ic_chunk * d.kh * d.kw * plan.vecs * LANES) as i64 * F32_BYTES;
        vec![
            e.offset_by(p[0], geo.ic_src_step, ic_steps),
            e.offset(p[1], w_bytes),
        ]
    });
}

/// Rows outer, output-channel tiles inner. The tile loop carries only its index: a tile's
/// pointers are computed from it and from fresh loads of the buffer list, so that nothing
/// stays live across a row's column loops but the row and tile indices. Carried pointers
/// (five with a bias and a residual, plus the image's) took the registers of the innermost
/// loop, whose kernel-row step was then reloaded from the stack on every trip (measured 7-11%
/// slower on runtime-width convs with a residual).
fn lower_rows_outer(e: &mut Emit<'_>, plan: &ConvPlan, classes: &[TileClass]) {
    let d = &plan.desc;
    let geo = Geometry::new(e, plan);
    e.for_count(d.mb, &[], |e, n, _| {
        rows(e, plan, &geo, |e, oh, taps| {
            for class in classes {
                let start = e.iconst(class.tiles.start as i64);
                let end = e.iconst(class.tiles.end as i64);
                e.for_range(start, end, &[], |e, t, _| {
                    let (tile, res) = tile_ptrs(e, plan, n, t);
                    row(e, plan, oh, &taps, tile, &res, class.shape);
                    vec![]
                });
            }
        });
        vec![]
    });
}

/// The whole image as one row (`ConvPlan::tiles_per_item`): the call's work items `[begin,
/// end)` are the tiles `[begin * per_item, end * per_item)`, each of which runs the row as
/// in [`lower_rows_outer`]. Parts start at multiples of every narrow group, so a group's
/// first tile, which computes the group's narrow tiles, is in the same call as the rest.
fn lower_tile_items(e: &mut Emit<'_>, plan: &ConvPlan, classes: &[TileClass], per_item: usize) {
    let d = &plan.desc;
    let taps = match &plan.rows {
        AxisPlan::Fixed(runs) if runs.len() == 1 => Taps::Fixed(runs[0].taps.clone()),
        _ => unreachable!("a whole-image plan is one row of fixed taps"),
    };
    let per_item = per_item as i64;
    let begin = e.mul(Scalar::Dyn(e.begin), per_item);
    let end = e.mul(Scalar::Dyn(e.end), per_item);
    let (lo, hi) = (e.value(begin), e.value(end));
    e.for_count(d.mb, &[], |e, n, _| {
        let oh = e.iconst(0);
        for class in classes {
            let start = e.iconst(class.tiles.start as i64);
            let start = e.imax(lo, start);
            let end = e.iconst(class.tiles.end as i64);
            let end = e.imin(hi, end);
            e.for_range(start, end, &[], |e, t, _| {
                let (tile, res) = tile_ptrs(e, plan, n, t);
                row(e, plan, oh, &taps, tile, &res, class.shape);
                vec![]
            });
        }
        vec![]
    });
}

/// Byte offset of input channel `ch` (a multiple of the reduction step) in the source.
fn src_chan_bytes(e: &mut Emit<'_>, plan: &ConvPlan, geo: &Geometry, ch: usize) -> Scalar {
    let elems = match plan.desc.src_layout {
        Layout::Nchw => e.mul(geo.src.channel, ch as i64),
        Layout::Nchw4c => {
            let blocks = e.mul(geo.src.block, (ch / LANES) as i64);
            e.add(blocks, (ch % LANES) as i64)
        }
    };
    e.mul(elems, F32_BYTES)
}

/// The pointers of output-channel tile `t` of image `n`, and its residuals', from fresh loads.
fn tile_ptrs(e: &mut Emit<'_>, plan: &ConvPlan, n: Value, t: Value) -> (TilePtrs, Vec<Value>) {
    let d = &plan.desc;
    let geo = Geometry::new(e, plan);
    let image = |e: &mut Emit<'_>, base: Value, stride: Scalar| {
        if d.mb == 1 {
            base
        } else {
            e.scaled_by(base, n, stride, F32_BYTES, 0)
        }
    };
    let src = e.buffer(SRC);
    let src = image(e, src, geo.src.image);
    let first = src_chan_bytes(e, plan, &geo, plan.ic.begin);
    let src = e.offset_by(src, first, 1);
    let step = src_chan_bytes(e, plan, &geo, plan.ic.step);
    let src = match (step, plan.ic.every) {
        (Scalar::Const(0), _) => src,
        (step, 1) => e.scaled_by(src, t, step, 1, 0),
        (step, every) => {
            let run = e.udiv_const(t, every as u64);
            e.scaled_by(src, run, step, 1, 0)
        }
    };
    let weights = e.buffer(WEIGHTS);
    let tile_w_bytes = plan.tile_weights_len() as i64 * F32_BYTES;
    let tile_oc = plan.vecs * LANES;
    let params = (d.bias || d.prelu()).then(|| {
        let off = plan.bias_offset() as i64 * F32_BYTES;
        e.scaled(weights, t, tile_oc as i64 * F32_BYTES, off)
    });
    let w = e.scaled(weights, t, tile_w_bytes, 0);
    let tile_dst_bytes = e.mul(geo.dst.block, plan.vecs as i64 * F32_BYTES);
    let at_tile = |e: &mut Emit<'_>, index: usize| {
        let base = e.buffer(index);
        let base = image(e, base, geo.dst.image);
        e.scaled_by(base, t, tile_dst_bytes, 1, 0)
    };
    let dst = at_tile(e, DST);
    let res = (0..d.residuals())
        .map(|i| at_tile(e, FIRST_RESIDUAL + i))
        .collect();
    let tile = TilePtrs {
        src,
        weights: w,
        params,
        dst,
        chunk: None,
        oc_tile: t,
    };
    (tile, res)
}

/// Every row of the call's range of rows, with its kernel-row taps.
fn rows(
    e: &mut Emit<'_>,
    plan: &ConvPlan,
    geo: &Geometry,
    mut row: impl FnMut(&mut Emit<'_>, Value, Taps),
) {
    let d = &plan.desc;
    let wide = plan.wide_ratio().is_some() || plan.lanewise_ratio().is_some();
    match &plan.rows {
        AxisPlan::Fixed(runs) | AxisPlan::Bordered { runs, .. } if wide && runs.len() > 1 => {
            // A wide tile takes its kernel rows as arguments, so a border row's code is the
            // interior's: one loop over every row, each computing its taps, emits the row's
            // columns once instead of once per run (the 7x7 stem has four) for a few integer
            // operations per tile call.
            let rows = runs.last().map_or(0, |r| r.outputs.end);
            let (start, end) = e.clamp_items(0, rows);
            e.for_range(start, end, &[], |e, oh, _| {
                row(e, oh, Taps::OfRow { oh });
                vec![]
            });
        }
        AxisPlan::Fixed(runs) => {
            for run in runs {
                let (start, end) = e.clamp_items(run.outputs.start, run.outputs.end);
                e.for_range(start, end, &[], |e, oh, _| {
                    row(e, oh, Taps::Fixed(run.taps.clone()));
                    vec![]
                });
            }
        }
        AxisPlan::Bordered { runs, interior } => {
            // The border rows first, so that the call's work items are dead in the interior's
            // loop. Border row `i` is output row `i` before the interior `[a, b)` and
            // `i + (b - a)` after it; the call's rows among them are one range of `i`, since
            // both parts are only taken when the call covers the whole interior.
            let mid = &runs[*interior];
            let (a, b) = (mid.outputs.start as i64, mid.outputs.end as i64);
            let rows = runs.last().map_or(0, |r| r.outputs.end) as i64;
            let len = b - a;
            let (begin, end) = (e.begin, e.end);
            let zero = e.iconst(0);
            let from_top = e.imax(begin, zero);
            let b_value = e.iconst(b);
            let from_bottom = e.imax(begin, b_value);
            let from_bottom = e.offset(from_bottom, -len);
            let in_top = e.icmp_imm(IntCC::SignedLessThan, begin, a);
            let lo = e.select(in_top, from_top, from_bottom);
            let rows_value = e.iconst(rows);
            let to_bottom = e.imin(end, rows_value);
            let to_bottom = e.offset(to_bottom, -len);
            let a_value = e.iconst(a);
            let to_top = e.imin(end, a_value);
            let in_bottom = e.icmp_imm(IntCC::SignedGreaterThan, end, b);
            let hi = e.select(in_bottom, to_bottom, to_top);
            e.for_range(lo, hi, &[], |e, i, _| {
                let past = e.icmp_imm(IntCC::SignedGreaterThanOrEqual, i, a);
                let jump = e.iconst(len);
                let zero = e.iconst(0);
                let jump = e.select(past, jump, zero);
                let oh = e.iadd(i, jump);
                row(e, oh, Taps::OfRow { oh });
                vec![]
            });
            let (start, end) = e.clamp_items(mid.outputs.start, mid.outputs.end);
            e.for_range(start, end, &[], |e, oh, _| {
                row(e, oh, Taps::Fixed(mid.taps.clone()));
                vec![]
            });
        }
        AxisPlan::PerOutput | AxisPlan::Template(_) => {
            let (start, end) = e.clamp_items_to(Scalar::Const(0), geo.oh);
            e.for_range(start, end, &[], |e, oh, _| {
                let geo = Geometry::new(e, plan);
                let ih = e.value(geo.ih);
                let (first, count) =
                    e.runtime_taps(oh, ih, d.pads.top, d.kh, d.strides[0], d.dilations[0]);
                row(e, oh, Taps::Runtime { first, count });
                vec![]
            });
        }
    }
}

/// Output row `oh` of one output-channel tile: every chunk of the reduction, or the one
/// `tile.chunk` names ([`ConvPlan::chunks_outer`]).
fn row(
    e: &mut Emit<'_>,
    plan: &ConvPlan,
    oh: Value,
    taps: &Taps,
    tile: TilePtrs,
    residuals: &[Value],
    shape: TileShape,
) {
    let d = &plan.desc;
    let geo = &Geometry::new(e, plan);
    // The input row of tap 0; valid taps keep every access in bounds.
    let src_row = e.scaled_by(
        tile.src,
        oh,
        geo.src.row,
        d.strides[0] as i64 * F32_BYTES,
        0,
    );
    let top = e.mul(geo.src.row, -(d.pads.top as i64) * F32_BYTES);
    let src_row = e.offset_by(src_row, top, 1);
    let dst_row = e.scaled_by(tile.dst, oh, geo.dst.row, F32_BYTES, 0);
    let res_rows: Vec<Value> = residuals
        .iter()
        .map(|&r| e.scaled_by(r, oh, geo.dst.row, F32_BYTES, 0))
        .collect();
    let row_tile = TilePtrs {
        src: src_row,
        dst: dst_row,
        ..tile
    };
    if plan.chunks() == 1 || tile.chunk.is_some() {
        let row = RowTiles {
            plan,
            row_taps: taps,
            tile: row_tile,
            residuals: &res_rows,
            shape,
        };
        columns(e, geo, row);
    } else {
        row_chunks(e, plan, taps, row_tile, &res_rows, shape);
    }
    zero_padding_lanes(e, plan, row_tile);
}

/// A row whose reduction the plan splits into chunks ([`ConvPlan::chunks`]): the whole row
/// for one chunk of input channels, then for the next, so that the chunk's weights stay in L1
/// across the row's pixel tiles.
fn row_chunks(
    e: &mut Emit<'_>,
    plan: &ConvPlan,
    taps: &Taps,
    row_tile: TilePtrs,
    res_rows: &[Value],
    shape: TileShape,
) {
    for_each_chunk(e, plan, row_tile, |e, chunk_tile| {
        let geo = &Geometry::new(e, plan);
        let row = RowTiles {
            plan,
            row_taps: taps,
            tile: chunk_tile,
            residuals: res_rows,
            shape,
        };
        columns(e, geo, row);
    });
}

/// Sets the padding lanes of the destination's last block to +0 in the row at `tile.dst`, once
/// its tile has stored them. They hold zero weights times the inputs, which is NaN where an
/// input is NaN or infinite, and the next convolution would multiply that NaN by its own zero
/// weights into every real channel. A lane-wise conv's post-ops (a clip) may leave them
/// nonzero too; every other op writes zeros there ([`crate::lower_eltwise::lower`]).
fn zero_padding_lanes(e: &mut Emit<'_>, plan: &ConvPlan, tile: TilePtrs) {
    let d = &plan.desc;
    let real = d.oc % LANES;
    if d.dst_layout != Layout::Nchw4c || real == 0 {
        return;
    }
    let zero_row = |e: &mut Emit<'_>| {
        let geo = Geometry::new(e, plan);
        // The last tile's last block.
        let block = e.offset_by(
            tile.dst,
            geo.dst_block_bytes,
            plan.last_tile_vecs() as i64 - 1,
        );
        e.clear_padding_lanes(block, geo.ow, geo.dst.pixel * F32_BYTES, real);
    };
    if plan.oc_tiles == 1 {
        zero_row(e);
    } else {
        let last = e.icmp_imm(IntCC::Equal, tile.oc_tile, plan.oc_tiles as i64 - 1);
        e.if_else(last, zero_row, |_| {});
    }
}

/// The length of a run of output columns.
pub(crate) enum RunLen<'a> {
    Fixed(usize),
    /// The runtime body of a column template: full tiles in a loop, then one remainder tile
    /// picked by a jump table. With `split`, from the row's split; without, from a split
    /// loaded where each part is used ([`ColumnSplit::load`]).
    Body {
        template: &'a AxisTemplate,
        split: Option<ColumnSplit>,
    },
}

impl RunLen<'_> {
    /// The row's split into template parts, for a runtime body.
    pub(crate) fn split(&self, e: &mut Emit<'_>, tile: usize) -> ColumnSplit {
        match self {
            RunLen::Body {
                split: Some(split), ..
            } => *split,
            RunLen::Body { template, .. } => ColumnSplit::load(e, template, tile),
            RunLen::Fixed(_) => unreachable!("a fixed run has no split"),
        }
    }
}

/// What the pixel tiles of one output row share: the plan, the row's kernel rows, the
/// pointers at the row (or the column run's start), the residuals' rows and the lanes the
/// last vectors store.
#[derive(Clone, Copy)]
struct RowTiles<'a> {
    plan: &'a ConvPlan,
    row_taps: &'a Taps,
    tile: TilePtrs,
    residuals: &'a [Value],
    shape: TileShape,
}

fn columns(e: &mut Emit<'_>, geo: &Geometry, row: RowTiles<'_>) {
    let plan = row.plan;
    let d = &plan.desc;
    let run = |e: &mut Emit<'_>, start: Scalar, len: RunLen, taps: std::ops::Range<usize>| {
        column_run(e, geo, row, &Taps::Fixed(taps), start, len);
    };
    match &plan.cols {
        AxisPlan::Fixed(_) if let Some(chunks) = plan.lanewise_row() => {
            lanewise_wide_row(e, geo, row, &chunks);
        }
        AxisPlan::Fixed(_) if let Some(tiles) = plan.bordered_tiles() => {
            bordered_row(e, geo, row, &tiles);
        }
        AxisPlan::Fixed(runs) => {
            for col in runs {
                let start = Scalar::Const(col.outputs.start as i64);
                run(e, start, RunLen::Fixed(col.outputs.len()), col.taps.clone());
            }
        }
        AxisPlan::Template(t) => {
            let template = ColumnSplit::load(e, t, plan.pixel_tile).template;
            e.if_else(
                template,
                |e| {
                    for col in &t.head {
                        let start = Scalar::Const(col.outputs.start as i64);
                        run(e, start, RunLen::Fixed(col.outputs.len()), col.taps.clone());
                    }
                    let body_start = Scalar::Const(t.head_len() as i64);
                    let body = RunLen::Body {
                        template: t,
                        split: None,
                    };
                    run(e, body_start, body, t.body_taps.clone());
                    let split = &ColumnSplit::load(e, t, plan.pixel_tile);
                    let tail = |e: &mut Emit<'_>, class: usize| {
                        let total = t.tail_len(class) as i64;
                        for r in &t.tails[class] {
                            let start = e.offset(split.tail_start, total - r.back as i64);
                            run(e, Scalar::Dyn(start), RunLen::Fixed(r.len), r.taps.clone());
                        }
                    };
                    match split.class {
                        None => tail(e, 0),
                        Some(class) => e.switch(class, t.tails.len(), tail),
                    }
                },
                |e| {
                    // Narrow inputs, where borders meet: one pixel at a time.
                    let (iw, ow) = (e.value(geo.iw), e.value(geo.ow));
                    let zero = e.iconst(0);
                    e.for_range(zero, ow, &[], |e, o, _| {
                        let (first, count) =
                            e.runtime_taps(o, iw, d.pads.left, d.kw, d.strides[1], d.dilations[1]);
                        let cols = Taps::Runtime { first, count };
                        column_run(e, geo, row, &cols, Scalar::Dyn(o), RunLen::Fixed(1));
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

/// The output columns `[start, start + len)` of one row, whose windows share `col_taps`.
fn column_run(
    e: &mut Emit<'_>,
    geo: &Geometry,
    row: RowTiles<'_>,
    col_taps: &Taps,
    start: Scalar,
    len: RunLen,
) {
    let RowTiles {
        plan,
        tile,
        residuals,
        ..
    } = row;
    let d = &plan.desc;
    let src_px = geo.src.pixel * F32_BYTES;
    let dst_px = geo.dst.pixel * F32_BYTES;
    let src0 = e.offset_by(tile.src, start, d.strides[1] as i64 * src_px);
    let src0 = e.offset(src0, -(d.pads.left as i64) * src_px);
    let dst0 = e.offset_by(tile.dst, start, dst_px);
    let res0: Vec<Value> = residuals
        .iter()
        .map(|&r| e.offset_by(r, start, dst_px))
        .collect();
    let tile_px = plan.pixel_tile as i64;
    let mut ptrs = vec![src0, dst0];
    ptrs.extend(&res0);
    let mut steps = vec![
        Scalar::Const(tile_px * d.strides[1] as i64 * src_px),
        Scalar::Const(tile_px * dst_px),
    ];
    steps.extend(std::iter::repeat_n(
        Scalar::Const(tile_px * dst_px),
        res0.len(),
    ));
    let at = |q: &[Value]| {
        (
            TilePtrs {
                src: q[0],
                dst: q[1],
                ..tile
            },
            q[2..].to_vec(),
        )
    };
    let tile_at = |e: &mut Emit<'_>, pixels: usize, q: &[Value]| {
        let (t, r) = at(q);
        // Runtime column taps take 128-bit tiles even at a wide tier: one tile's vectors
        // already fill the 16 xmm registers' budget there.
        // A short last tile computes alone.
        let group = match col_taps {
            _ if row.shape.vecs != plan.vecs => 1,
            Taps::Runtime { .. } if plan.wide_ratio().is_some() => 1,
            _ => plan.narrow_group(pixels),
        };
        let at_tile = RowTiles {
            tile: t,
            residuals: &r,
            ..row
        };
        group_leader(e, t.oc_tile, group, |e| {
            pixel_tile(e, at_tile, pixels, group, col_taps)
        });
    };
    let p = plan.pixel_tile;
    match len {
        RunLen::Fixed(len) if matches!(col_taps, Taps::Runtime { .. }) => {
            debug_assert_eq!(len, 1, "runtime column taps take one pixel at a time");
            tile_at(e, 1, &ptrs);
        }
        RunLen::Fixed(len) => {
            // The remainder tile continues from where the full tiles left the pointers.
            let q = e.for_ptrs(Scalar::Const((len / p) as i64), &ptrs, &steps, |e, q| {
                tile_at(e, p, q)
            });
            if len % p > 0 {
                tile_at(e, len % p, &q);
            }
        }
        RunLen::Body { .. } => {
            let full_tiles = len.split(e, p).full_tiles;
            let q = e.for_ptrs(Scalar::Dyn(full_tiles), &ptrs, &steps, |e, q| {
                tile_at(e, p, q)
            });
            let remainder = len.split(e, p).remainder;
            e.switch(remainder, p, |e, pixels| {
                if pixels > 0 {
                    tile_at(e, pixels, &q);
                }
            });
        }
    }
}

/// A fixed-width row at a wide tier as pixel tiles with its border columns inside
/// ([`ConvPlan::bordered_tiles`]): each run of identical tiles in a loop, a tile too narrow
/// for enough chains of its own spanning output-channel tiles as in [`column_run`].
fn bordered_row(e: &mut Emit<'_>, geo: &Geometry, row: RowTiles<'_>, runs: &[TileRun]) {
    let RowTiles {
        plan,
        tile,
        residuals,
        ..
    } = row;
    let d = &plan.desc;
    let ratio = plan.wide_ratio().expect("bordered tiles are wide");
    let src_px = geo.src.pixel * F32_BYTES;
    let dst_px = geo.dst.pixel * F32_BYTES;
    for run in runs {
        let first = run.first as i64;
        // The source of the tile's first pixel's kernel column 0; a border pixel never
        // reads the columns before the row, which its taps skip.
        let src0 = e.offset(
            tile.src,
            (first * d.strides[1] as i64 - d.pads.left as i64) * src_px,
        );
        let mut ptrs = vec![src0, e.offset(tile.dst, first * dst_px)];
        ptrs.extend(residuals.iter().map(|&r| e.offset(r, first * dst_px)));
        let px = run.pixels as i64;
        let mut steps = vec![Scalar::Const(px * d.strides[1] as i64 * src_px)];
        steps.extend(std::iter::repeat_n(
            Scalar::Const(px * dst_px),
            1 + residuals.len(),
        ));
        let group = if row.shape.vecs == plan.vecs {
            plan.bordered_group(run.pixels)
        } else {
            1
        };
        e.for_ptrs(Scalar::Const(run.count as i64), &ptrs, &steps, |e, q| {
            let at_tile = RowTiles {
                tile: TilePtrs {
                    src: q[0],
                    dst: q[1],
                    ..tile
                },
                residuals: &q[2..],
                ..row
            };
            group_leader(e, tile.oc_tile, group, |e| {
                wide_pixel_tile(e, at_tile, run.pixels, group, &run.taps, ratio)
            });
        });
    }
}

/// Emits `tile` (a register tile spanning `group` output-channel tiles) for the group's first
/// output-channel tile only, which computes the group's pixels; the others skip them.
fn group_leader(e: &mut Emit<'_>, oc_tile: Value, group: usize, tile: impl FnOnce(&mut Emit<'_>)) {
    if group == 1 {
        return tile(e);
    }
    let within = e.urem_const(oc_tile, group as u64);
    let first = e.icmp_imm(IntCC::Equal, within, 0);
    e.if_else(first, tile, |_| {});
}

/// One register tile: `pixels` output pixels by the vectors of output channels of `group`
/// consecutive output-channel tiles (see [`ConvPlan::narrow_group`]), `row.shape.vecs` each.
fn pixel_tile(e: &mut Emit<'_>, row: RowTiles<'_>, pixels: usize, group: usize, col_taps: &Taps) {
    let RowTiles {
        plan,
        row_taps,
        tile,
        ..
    } = row;
    if let (Some(ratio), Taps::Fixed(kw_taps)) = (plan.lanewise_ratio(), col_taps)
        && pixels >= ratio
    {
        return lanewise_wide_tile(e, row, pixels, ratio, kw_taps);
    }
    if let (Some(ratio), Taps::Fixed(kw_taps)) = (plan.wide_ratio(), col_taps) {
        let taps = vec![kw_taps.clone(); pixels];
        return wide_pixel_tile(e, row, pixels, group, &taps, ratio);
    }
    let d = &plan.desc;
    let vecs = row.shape.vecs * group;
    let f = F32_BYTES;
    let tile_oc = (plan.vecs * LANES) as i64;
    // Vector `v`'s weights, from its tile's: vector `v % plan.vecs` of tile `v / plan.vecs`
    // of the group. The tiles' destinations and biases follow one another as one tile's
    // vectors do.
    let tile_w_bytes = plan.tile_weights_len() as i64 * f;
    let w_vecs: Vec<i64> = (0..vecs)
        .map(|v| (v / plan.vecs) as i64 * tile_w_bytes + (v % plan.vecs * LANES) as i64 * f)
        .collect();
    // Bytes from a weight vector to its group mask ([`ConvPlan::group_masks`]).
    let masks = plan.group_masks.then(|| plan.mask_offset() as i64 * f);

    let start = |e: &mut Emit<'_>| -> Vec<Value> {
        let mut acc = Vec::with_capacity(pixels * vecs);
        for _ in 0..pixels {
            for v in 0..vecs {
                acc.push(match tile.params.filter(|_| d.bias) {
                    Some(b) => e.load_vec(b, v as i64 * LANES as i64 * f),
                    None => e.splat_const(0.0),
                });
            }
        }
        acc
    };
    let acc = match tile.chunk {
        None => start(e),
        Some(chunk) => {
            let first = e.icmp_imm(IntCC::Equal, chunk, 0);
            let partial = |e: &mut Emit<'_>| partial_sums(e, plan, pixels, vecs, tile.dst, None);
            e.if_else_values(first, start, partial)
        }
    };
    // Every tile, however narrow, sums each pixel's products in one chain, in the order of
    // the full tiles (channel step, kernel row, channel, kernel column): a pixel's value then
    // does not depend on the tile it falls in, so a run on column bands of an image
    // (`primjit_runtime::stream`) gives the same bits as a run on the whole image. (Splitting
    // a narrow tile's chain over several sets of accumulators ran a 64-channel layer 40
    // pixels wide at 92% of peak instead of 83%, but changed a pixel's sum with its tile.) A
    // narrow tile takes its chains from the output channels instead: `group` tiles' vectors.
    let mut acc = acc;

    let geo = &Geometry::new(e, plan);
    let src_px = geo.src.pixel * f;
    let kh_src_step = geo.kh_src_step;
    let per_kh = d.kw as i64 * tile_oc * f;
    let per_ic = (d.kh * d.kw) as i64 * tile_oc * f;
    let ic_src_step = geo.ic_src_step;
    // Channels within a step of the reduction: a block of four sits in one pixel's vector in
    // nChw4c; NCHW steps one channel at a time.
    let chan_in_step = match d.src_layout {
        Layout::Nchw => 0,
        Layout::Nchw4c => f,
    };
    let steps = plan.ic_chunk / plan.ic_step;

    let empty = matches!((row_taps, col_taps), (Taps::Fixed(r), _) if r.is_empty())
        || matches!(col_taps, Taps::Fixed(c) if c.is_empty());
    if !empty {
        let (kh_first, kh_count) = row_tap_range(e, plan, geo, row_taps);
        let kh_src_off = kh_src_offset(e, kh_first, kh_src_step);
        let kh_w_off = e.mul(kh_first, per_kh);
        // The kernel-row loop carries the reduction's own pointers, and the channel step
        // continues from where it leaves them: no pointer of the channel loop stays live
        // across the kernel-row loop beside the pointers that loop carries.
        //
        // A single kernel row (1x1 kernels, and rows clipped to one tap) leaves the pointers
        // where they are: the channel step is then one add per pointer instead of a kernel-row
        // step and its rewind, in the hot loop of every 1x1 convolution.
        let walks = !matches!(kh_count, Scalar::Const(1));
        let kh_src_walk = match (kh_count, kh_src_step) {
            _ if !walks => Scalar::Const(0),
            (Scalar::Const(n), s) => e.mul(s, n),
            (n, s) => {
                let (n, s) = (e.value(n), e.value(s));
                Scalar::Dyn(e.imul(n, s))
            }
        };
        let ic_src_rest = match (ic_src_step, kh_src_walk) {
            (a, Scalar::Const(0)) => a,
            (Scalar::Const(a), Scalar::Const(b)) => Scalar::Const(a - b),
            (a, b) => {
                let (a, b) = (e.value(a), e.value(b));
                Scalar::Dyn(e.isub(a, b))
            }
        };
        let ic_w_step = plan.ic_step as i64 * per_ic;
        let ic_w_rest = match kh_count {
            _ if !walks => Scalar::Const(ic_w_step),
            Scalar::Const(n) => Scalar::Const(ic_w_step - n * per_kh),
            Scalar::Dyn(n) => {
                let walk = e.imul_imm(n, per_kh);
                let step = e.iconst(ic_w_step);
                Scalar::Dyn(e.isub(step, walk))
            }
        };
        let mut state = vec![
            e.offset_by(tile.src, kh_src_off, 1),
            e.offset_by(tile.weights, kh_w_off, 1),
        ];
        state.extend(&acc);
        let mut ic_body = |e: &mut Emit<'_>, _: Value, s: &[Value]| -> Vec<Value> {
            let kh_body = |e: &mut Emit<'_>, _: Value, k: &[Value]| -> Vec<Value> {
                let (src_kh, w_kh) = (k[0], k[1]);
                let mut acc = k[2..].to_vec();
                match col_taps {
                    Taps::Fixed(kw_taps) if plan.lanewise => {
                        for kw in kw_taps.clone() {
                            let x_offs: Vec<i64> = (0..pixels as i64)
                                .map(|p| {
                                    (kw as i64 * d.dilations[1] as i64 + p * d.strides[1] as i64)
                                        * src_px
                                })
                                .collect();
                            let w_off = kw as i64 * tile_oc * f;
                            lanewise_step(e, w_kh, w_off, src_kh, &x_offs, &mut acc);
                        }
                    }
                    Taps::Fixed(kw_taps) if pixels == 1 && d.src_layout == Layout::Nchw4c => {
                        let w = (w_kh, masks);
                        one_pixel_taps(e, plan, &w_vecs, kw_taps, w, src_kh, &mut acc);
                    }
                    Taps::Fixed(kw_taps) => {
                        let units = (0..plan.ic_step as i64)
                            .flat_map(|c| kw_taps.clone().map(move |kw| (c, kw)));
                        for (c, kw) in units {
                            let w_off = c * per_ic + kw as i64 * tile_oc * f;
                            let x_offs: Vec<i64> = (0..pixels as i64)
                                .map(|p| {
                                    c * chan_in_step
                                        + (kw as i64 * d.dilations[1] as i64
                                            + p * d.strides[1] as i64)
                                            * src_px
                                })
                                .collect();
                            let w = (w_kh, w_off);
                            fma_step(e, &w_vecs, w, masks, src_kh, &x_offs, &mut acc);
                        }
                    }
                    Taps::OfRow { .. } => unreachable!("a row's taps are never a column's"),
                    Taps::Runtime { first, count } => {
                        // Channel outer, tap inner, as in the fixed path; a lane-wise
                        // reduction takes its channels in one step.
                        let channels = if plan.lanewise {
                            1
                        } else {
                            plan.ic_step as i64
                        };
                        for c in 0..channels {
                            let src_kw0 =
                                e.scaled(src_kh, *first, d.dilations[1] as i64 * src_px, 0);
                            let w_kw0 = e.scaled(w_kh, *first, tile_oc * f, 0);
                            let mut kw_state = vec![src_kw0, w_kw0];
                            kw_state.extend(&acc);
                            let zero = e.iconst(0);
                            let out = e.for_range(zero, *count, &kw_state, |e, _, q| {
                                let (src_kw, w_kw) = (q[0], q[1]);
                                let mut acc = q[2..].to_vec();
                                let x_offs: Vec<i64> = (0..pixels as i64)
                                    .map(|p| c * chan_in_step + p * d.strides[1] as i64 * src_px)
                                    .collect();
                                if plan.lanewise {
                                    lanewise_step(e, w_kw, 0, src_kw, &x_offs, &mut acc);
                                } else {
                                    fma_step(
                                        e,
                                        &w_vecs,
                                        (w_kw, c * per_ic),
                                        masks,
                                        src_kw,
                                        &x_offs,
                                        &mut acc,
                                    );
                                }
                                let mut next = vec![
                                    e.offset(src_kw, d.dilations[1] as i64 * src_px),
                                    e.offset(w_kw, tile_oc * f),
                                ];
                                next.extend(acc);
                                next
                            });
                            acc.copy_from_slice(&out[2..]);
                        }
                    }
                }
                let mut next = if walks {
                    vec![e.offset_by(src_kh, kh_src_step, 1), e.offset(w_kh, per_kh)]
                } else {
                    vec![src_kh, w_kh]
                };
                next.extend(acc);
                next
            };
            let kh_out = match kh_count {
                Scalar::Const(n) => e.for_count(n as usize, s, kh_body),
                Scalar::Dyn(n) => {
                    let zero = e.iconst(0);
                    e.for_range(zero, n, s, kh_body)
                }
            };
            let mut next = vec![
                e.offset_by(kh_out[0], ic_src_rest, 1),
                e.offset_by(kh_out[1], ic_w_rest, 1),
            ];
            next.extend(&kh_out[2..]);
            next
        };
        // A 1x1 kernel's channel step is only 4 units (40 FMAs for 10 accumulators), so the
        // loop's own counter, compare and branch weigh on it: two steps per trip. Measured
        // with `primjit bench-op mb1ic64ih80iw258oc128kh1sh2` and two more downsample shapes,
        // alternating in quiet moments: 72-73% of peak before, 74.5-75.5% after.
        let unroll = if d.kh * d.kw == 1 { 2 } else { 1 };
        let out = if unroll > 1 && steps >= unroll {
            let mid = e.for_count(steps / unroll, &state, |e, i, s| {
                let mut s = s.to_vec();
                for _ in 0..unroll {
                    s = ic_body(e, i, &s);
                }
                s
            });
            e.for_count(steps % unroll, &mid, &mut ic_body)
        } else {
            e.for_count(steps, &state, ic_body)
        };
        acc = out[2..].to_vec();
    }
    match tile.chunk {
        None => epilogue(e, row, pixels, vecs, &acc),
        Some(chunk) => {
            let last = e.icmp_imm(IntCC::Equal, chunk, plan.chunks() as i64 - 1);
            e.if_else(
                last,
                |e| epilogue(e, row, pixels, vecs, &acc),
                |e| {
                    partial_sums(e, plan, pixels, vecs, tile.dst, Some(&acc));
                },
            );
        }
    }
}

/// The first kernel row of a tile's taps and how many there are.
fn row_tap_range(
    e: &mut Emit<'_>,
    plan: &ConvPlan,
    geo: &Geometry,
    row_taps: &Taps,
) -> (Scalar, Scalar) {
    let d = &plan.desc;
    match row_taps {
        Taps::Fixed(r) => (Scalar::Const(r.start as i64), Scalar::Const(r.len() as i64)),
        Taps::Runtime { first, count } => (Scalar::Dyn(*first), Scalar::Dyn(*count)),
        Taps::OfRow { oh } => {
            let ih = e.value(geo.ih);
            let (first, count) =
                e.runtime_taps(*oh, ih, d.pads.top, d.kh, d.strides[0], d.dilations[0]);
            (Scalar::Dyn(first), Scalar::Dyn(count))
        }
    }
}

/// Where the first kernel row's input starts, relative to the tile's input row.
fn kh_src_offset(e: &mut Emit<'_>, kh_first: Scalar, kh_src_step: Scalar) -> Scalar {
    match (kh_first, kh_src_step) {
        (Scalar::Const(k), s) => e.mul(s, k),
        (k, s) => {
            let (k, s) = (e.value(k), e.value(s));
            Scalar::Dyn(e.imul(k, s))
        }
    }
}

/// A register tile at a wide tier: the same reduction as [`pixel_tile`]'s, unit for unit and
/// in the same order, and the same epilogue, as one call of a tile emitted by the x64
/// backend ([`DirectTile`]). The Cranelift code only computes the tile's pointers and the
/// call's strides; for a chunked reduction it picks the tile that starts from the bias or from
/// the partial sums, and ends in the post-ops or in partial sums.
fn wide_pixel_tile(
    e: &mut Emit<'_>,
    row: RowTiles<'_>,
    pixels: usize,
    group: usize,
    kw_taps: &[std::ops::Range<usize>],
    ratio: usize,
) {
    let RowTiles {
        plan,
        row_taps,
        tile,
        residuals,
        ..
    } = row;
    let d = &plan.desc;
    let f = F32_BYTES;
    let tile_oc = (plan.vecs * LANES) as i64;
    let tile_w_bytes = plan.tile_weights_len() as i64 * f;
    // Wide vector `u` is 4-lane vectors `u * ratio ..` of the group, which lie side by side in
    // one tile's weights: a tile's vectors are a multiple of the ratio, or the group is one
    // tile whose last vector is a tail ([`ConvPlan::narrow_group`]).
    let blocks = row.shape.vecs * group;
    let w_vecs: Vec<i64> = (0..blocks.div_ceil(ratio))
        .map(|u| u * ratio)
        .map(|v| (v / plan.vecs) as i64 * tile_w_bytes + (v % plan.vecs * LANES) as i64 * f)
        .collect();
    let geo = &Geometry::new(e, plan);
    let src_px = geo.src.pixel * f;
    let per_kh = d.kw as i64 * tile_oc * f;
    let per_ic = (d.kh * d.kw) as i64 * tile_oc * f;
    let chan_in_step = match d.src_layout {
        Layout::Nchw => 0,
        Layout::Nchw4c => f,
    };
    // The kernel columns of any pixel, each pixel's FMA only where its window has the column:
    // a pixel's products keep the order of a tile of its own.
    let kws = kw_taps.iter().map(|k| k.start).min().unwrap_or(0)
        ..kw_taps.iter().map(|k| k.end).max().unwrap_or(0);
    let units: Vec<TileUnit> = (0..plan.ic_step as i64)
        .flat_map(|c| kws.clone().map(move |kw| (c, kw)))
        .map(|(c, kw)| TileUnit {
            w: c * per_ic + kw as i64 * tile_oc * f,
            x: (0..pixels)
                .map(|p| {
                    let at = (kw * d.dilations[1] + p * d.strides[1]) as i64 * src_px;
                    kw_taps[p].contains(&kw).then_some(c * chan_in_step + at)
                })
                .collect(),
        })
        .filter(|u| u.x.iter().any(Option::is_some))
        .collect();
    let spec = |init: TileInit, finish: TileFinish| {
        WideTile::Direct(DirectTile {
            isa: d.isa,
            pixels,
            w_vecs: w_vecs.clone(),
            tail_blocks: blocks % ratio,
            steps: plan.ic_chunk / plan.ic_step,
            units: units.clone(),
            per_kh,
            ic_w_step: plan.ic_step as i64 * per_ic,
            dst_pixel_bytes: geo.dst.pixel * F32_BYTES,
            slopes_disp: plan.slopes_disp(),
            init,
            finish,
        })
    };
    let mut args = wide_call_start(e, plan, geo, row_taps, tile, per_kh);
    args.extend([e.value(geo.ic_src_step), e.value(geo.dst_block_bytes)]);
    args.push(bias_arg(e, tile));
    args.extend(residuals);
    let start = if d.bias {
        TileInit::Bias
    } else {
        TileInit::Zero
    };
    let posts = TileFinish::PostOps(d.post_ops.clone());
    let Some(chunk) = tile.chunk else {
        e.call_tile(spec(start, posts), &args);
        return;
    };
    // Residuals are read only by the last chunk's tile: the others take none.
    let partial_args = &args[..8];
    let first = e.icmp_imm(IntCC::Equal, chunk, 0);
    e.if_else(
        first,
        |e| e.call_tile(spec(start, TileFinish::Partial), partial_args),
        |e| {
            let last = e.icmp_imm(IntCC::Equal, chunk, plan.chunks() as i64 - 1);
            e.if_else(
                last,
                |e| e.call_tile(spec(TileInit::Partial, posts.clone()), &args),
                |e| e.call_tile(spec(TileInit::Partial, TileFinish::Partial), partial_args),
            );
        },
    );
}

/// A lane-wise tile at a wide tier ([`ConvPlan::lanewise_ratio`]): wide vectors of `ratio`
/// consecutive output pixels (their sources gathered at a stride past 1), the last a tail of
/// the pixels left over, as one call of the x64 backend's tile ([`LanewiseTile`]). It sums
/// each pixel's taps in the order of the 128-bit lane-wise tile, so a pixel's bits do not
/// depend on the tier. A 7-pixel row took three vectors and a 128-bit tile of one pixel,
/// each a chain of 25 dependent FMAs for a 5x5 kernel: the one pixel took as long as the
/// six. Rows of a fixed width take [`lanewise_wide_row`] instead; this serves the column
/// template of runtime widths.
fn lanewise_wide_tile(
    e: &mut Emit<'_>,
    row: RowTiles<'_>,
    pixels: usize,
    ratio: usize,
    kw_taps: &std::ops::Range<usize>,
) {
    let geo = &Geometry::new(e, row.plan);
    let vectors: Vec<RowVector> = (0..pixels.div_ceil(ratio))
        .map(|j| RowVector {
            first: j * ratio,
            pixels: ratio.min(pixels - j * ratio),
            taps: kw_taps.clone(),
        })
        .collect();
    call_lanewise(e, geo, row, &vectors);
}

/// An output row of a lane-wise plan at a wide tier as calls of the x64 backend's tile
/// ([`ConvPlan::lanewise_row`]): the row's border columns are vectors of the calls, each
/// skipping the taps its window misses, where the column runs made them 128-bit tiles. A
/// chunk that repeats is a loop.
fn lanewise_wide_row(e: &mut Emit<'_>, geo: &Geometry, row: RowTiles<'_>, chunks: &[RowChunk]) {
    let d = &row.plan.desc;
    let src_px = geo.src.pixel * F32_BYTES;
    let dst_px = geo.dst.pixel * F32_BYTES;
    let src_col = d.strides[1] as i64 * src_px;
    for chunk in chunks {
        // The chunk's source from its first pixel's first tap column, as `column_run` sets it.
        let first = chunk.first as i64;
        let src_off = first * src_col - d.pads.left as i64 * src_px;
        let mut ptrs = vec![
            e.offset(row.tile.src, src_off),
            e.offset(row.tile.dst, first * dst_px),
        ];
        ptrs.extend(row.residuals.iter().map(|&r| e.offset(r, first * dst_px)));
        let span = chunk.span as i64;
        let mut steps = vec![Scalar::Const(span * src_col)];
        steps.extend(std::iter::repeat_n(
            Scalar::Const(span * dst_px),
            ptrs.len() - 1,
        ));
        let call = |e: &mut Emit<'_>, q: &[Value]| {
            let tile = TilePtrs {
                src: q[0],
                dst: q[1],
                ..row.tile
            };
            let at = RowTiles {
                tile,
                residuals: &q[2..],
                ..row
            };
            call_lanewise(e, geo, at, &chunk.vectors);
        };
        if chunk.repeat == 1 {
            call(e, &ptrs);
        } else {
            e.for_ptrs(Scalar::Const(chunk.repeat as i64), &ptrs, &steps, call);
        }
    }
}

/// One call of the lane-wise tile of `vectors`, their pixels counted from `row.tile.dst` and
/// their sources from `row.tile.src` (the first tap column of the first pixel): a unit per
/// kernel column, which each vector takes where its taps hold it.
fn call_lanewise(e: &mut Emit<'_>, geo: &Geometry, row: RowTiles<'_>, vectors: &[RowVector]) {
    let RowTiles {
        plan,
        row_taps,
        tile,
        residuals,
        ..
    } = row;
    let d = &plan.desc;
    let f = F32_BYTES;
    let src_px = geo.src.pixel * f;
    // From one output pixel's source to the next's.
    let src_step = d.strides[1] as i64 * src_px;
    let tile_oc = (plan.vecs * LANES) as i64;
    let kw_taps = vectors
        .iter()
        .map(|v| v.taps.clone())
        .reduce(|a, b| a.start.min(b.start)..a.end.max(b.end))
        .unwrap_or(0..0);
    let units = kw_taps
        .map(|kw| LanewiseUnit {
            w: kw as i64 * tile_oc * f,
            x: vectors
                .iter()
                .map(|v| {
                    v.taps.contains(&kw).then(|| {
                        kw as i64 * d.dilations[1] as i64 * src_px + v.first as i64 * src_step
                    })
                })
                .collect(),
        })
        .collect();
    let per_kh = d.kw as i64 * tile_oc * f;
    let spec = LanewiseTile {
        isa: d.isa,
        vectors: vectors
            .iter()
            .map(|v| LaneVector {
                first: v.first,
                pixels: v.pixels,
            })
            .collect(),
        units,
        pixel_step: src_step,
        per_kh,
        bias: d.bias,
        slopes_disp: plan.slopes_disp(),
        posts: d.post_ops.clone(),
    };
    let mut args = wide_call_start(e, plan, geo, row_taps, tile, per_kh);
    args.push(bias_arg(e, tile));
    args.extend(residuals);
    e.call_tile(WideTile::Lanewise(spec), &args);
}

/// The first arguments of a wide tile's call: the source and weights at the first of the
/// tile's kernel rows, the destination, how many kernel rows it walks, and the source's step
/// from one to the next.
fn wide_call_start(
    e: &mut Emit<'_>,
    plan: &ConvPlan,
    geo: &Geometry,
    row_taps: &Taps,
    tile: TilePtrs,
    per_kh: i64,
) -> Vec<Value> {
    let (kh_first, kh_count) = match row_taps {
        Taps::Fixed(r) if r.is_empty() => (Scalar::Const(0), Scalar::Const(0)),
        _ => row_tap_range(e, plan, geo, row_taps),
    };
    let kh_src_off = kh_src_offset(e, kh_first, geo.kh_src_step);
    let kh_w_off = e.mul(kh_first, per_kh);
    vec![
        e.offset_by(tile.src, kh_src_off, 1),
        e.offset_by(tile.weights, kh_w_off, 1),
        tile.dst,
        e.value(kh_count),
        e.value(geo.kh_src_step),
    ]
}

/// A wide tile's bias argument: the tile's channel parameters, or a null pointer it does not
/// read.
fn bias_arg(e: &mut Emit<'_>, tile: TilePtrs) -> Value {
    match tile.params {
        Some(b) => b,
        None => e.iconst(0),
    }
}

/// Loads the partial sums of a tile of `vecs` output-channel vectors from an `nChw4c`
/// destination, or stores `acc` there.
fn partial_sums(
    e: &mut Emit<'_>,
    plan: &ConvPlan,
    pixels: usize,
    vecs: usize,
    dst: Value,
    acc: Option<&[Value]>,
) -> Vec<Value> {
    debug_assert_eq!(
        plan.desc.dst_layout,
        Layout::Nchw4c,
        "only nChw4c is chunked"
    );
    let geo = Geometry::new(e, plan);
    let mut loaded = Vec::new();
    for p in 0..pixels {
        for v in 0..vecs {
            let (base, off) = match geo.dst_block_bytes {
                Scalar::Const(b) => (dst, v as i64 * b),
                block => (e.offset_by(dst, block, v as i64), 0),
            };
            let off = off + p as i64 * geo.dst.pixel * F32_BYTES;
            match acc {
                Some(acc) => e.store_vec(acc[p * vecs + v], base, off),
                None => loaded.push(e.load_vec(base, off)),
            }
        }
    }
    loaded
}

/// The FMAs of one pixel (a border column) for one kernel row, in the order of the wider
/// tiles' units (channel outer, kernel column inner).
///
/// A pixel's four channels of a step are one vector, loaded once per kernel column, and each
/// FMA takes its channel's lane with a register shuffle (`vpshufd`) instead of a broadcast
/// load; the weight vector then folds into the FMA (`vfmadd132ps` with a memory operand). A
/// one-pixel tile thus loads 1.25 vectors per FMA with one output-channel vector (2 with
/// broadcasts) and 1.125 with two (1.5). The lanes are the very floats the broadcasts
/// loaded, so the sums are bit for bit the same.
fn one_pixel_taps(
    e: &mut Emit<'_>,
    plan: &ConvPlan,
    w_vecs: &[i64],
    kw_taps: &std::ops::Range<usize>,
    (w, masks): (Value, Option<i64>),
    src: Value,
    acc: &mut [Value],
) {
    let d = &plan.desc;
    let f = F32_BYTES;
    // An `nChw4c` source's pixels are a block's four floats apart.
    let src_px = LANES as i64 * f;
    let tile_oc = (plan.vecs * LANES) as i64;
    let per_ic = (d.kh * d.kw) as i64 * tile_oc * f;
    let pixels: Vec<Value> = kw_taps
        .clone()
        .map(|kw| e.load_vec(src, kw as i64 * d.dilations[1] as i64 * src_px))
        .collect();
    let units =
        (0..plan.ic_step).flat_map(|c| kw_taps.clone().enumerate().map(move |(i, kw)| (c, i, kw)));
    for (c, i, kw) in units {
        for (v, a) in acc.iter_mut().enumerate() {
            // A fresh shuffle per FMA: the FMA overwrites it.
            let x = e.splat_lane(pixels[i], c);
            let off = c as i64 * per_ic + kw as i64 * tile_oc * f + w_vecs[v];
            let x = match masks {
                Some(m) => {
                    let mask = e.load_lane_mask(w, off + m);
                    e.keep_lanes(x, mask)
                }
                None => x,
            };
            let wv = e.load_vec(w, off);
            *a = e.fma(x, wv, *a);
        }
    }
}

/// One kernel tap of one input channel: a weight vector at `w.0 + w.1 + w_vecs[v]` for each
/// output-channel vector `v` of the tile, and for each pixel an input at `src + x_offs[p]`,
/// multiplied and added into the tile's accumulators. With `masks`, the bytes from a weight
/// vector to its group mask, each input is first ANDed with the mask
/// ([`ConvPlan::group_masks`]).
///
/// Weight vector outer, pixel inner: each weight vector is loaded right before its FMAs and
/// dies after them, so a tile of 12 accumulators needs 14 vector registers, not 15. The one
/// left over lets the register allocator rotate the accumulators at the loop's back edge
/// (every FMA leaves its sum in the register of its broadcast) without spilling.
fn fma_step(
    e: &mut Emit<'_>,
    w_vecs: &[i64],
    (w, w_off): (Value, i64),
    masks: Option<i64>,
    src: Value,
    x_offs: &[i64],
    acc: &mut [Value],
) {
    let vecs = w_vecs.len();
    for (v, &w_vec) in w_vecs.iter().enumerate() {
        let wv = e.load_vec(w, w_off + w_vec);
        let mask = masks.map(|m| e.load_lane_mask(w, w_off + w_vec + m));
        for (p, &x_off) in x_offs.iter().enumerate() {
            // A broadcast per FMA: the FMA overwrites its first factor, so a shared broadcast
            // would cost a register copy, while a fresh one folds into `vbroadcastss m32`.
            let x = e.splat_load(src, x_off);
            let x = match mask {
                Some(m) => e.keep_lanes(x, m),
                None => x,
            };
            let a = &mut acc[p * vecs + v];
            *a = e.fma(x, wv, *a);
        }
    }
}

/// One kernel tap of a lane-wise tile ([`ConvPlan::lanewise`]): the weight vector at
/// `w + w_off` times each pixel's input vector at `src + x_offs[p]`, lane by lane, added into
/// the pixel's accumulator. Each input vector is loaded into a register of its own, where
/// the FMA leaves its sum ([`Emit::load_vec_unfolded`]): folded into the FMA, the load made
/// x64 copy the weight vector into the result's register first, and rotate the accumulators
/// through the stack at the loop's back edge.
fn lanewise_step(
    e: &mut Emit<'_>,
    w: Value,
    w_off: i64,
    src: Value,
    x_offs: &[i64],
    acc: &mut [Value],
) {
    let wv = e.load_vec(w, w_off);
    for (a, &x_off) in acc.iter_mut().zip(x_offs) {
        let x = e.load_vec_unfolded(src, x_off);
        *a = e.fma(x, wv, *a);
    }
}

/// Applies the post-ops in registers and stores each accumulator once, at `row.tile.dst`.
fn epilogue(e: &mut Emit<'_>, row: RowTiles<'_>, pixels: usize, vecs: usize, acc: &[Value]) {
    let RowTiles {
        plan,
        tile,
        residuals,
        shape: TileShape { lanes, .. },
        ..
    } = row;
    let dst = tile.dst;
    let d = &plan.desc;
    let f = F32_BYTES;
    let geo = &Geometry::new(e, plan);
    let strides = geo.dst;
    let lane_stride = geo.dst_lane_stride;
    let zero = d
        .post_ops
        .iter()
        .any(|p| matches!(p, PostOpDesc::Relu | PostOpDesc::PRelu))
        .then(|| e.splat_const(0.0));
    // The base and immediate offset of vector `v` of a buffer in the destination's layout:
    // a runtime block stride moves the base, a fixed one folds into the offset.
    let vec_base = |e: &mut Emit<'_>, base: Value, v: usize| -> (Value, i64) {
        match geo.dst_block_bytes {
            Scalar::Const(b) => (base, v as i64 * b),
            block => (e.offset_by(base, block, v as i64), 0),
        }
    };
    for v in 0..vecs {
        let (dst_v, dst_off) = vec_base(e, dst, v);
        let res_v: Vec<(Value, i64)> = residuals.iter().map(|&r| vec_base(e, r, v)).collect();
        for p in 0..pixels {
            let px = p as i64 * strides.pixel * f;
            let slopes = |e: &mut Emit<'_>| {
                let params = tile.params.expect("a prelu tile's parameters");
                e.load_vec(params, plan.slopes_disp() + (v * LANES) as i64 * f)
            };
            let x = apply_post_ops(e, &d.post_ops, acc[p * vecs + v], zero, slopes, |e, i| {
                let (r, r_off) = res_v[i];
                match d.dst_layout {
                    Layout::Nchw4c => e.load_vec(r, r_off + px),
                    Layout::Nchw => {
                        let fill = e.splat_const(0.0);
                        e.gather(r, r_off + px, lane_stride, lanes[v], fill)
                    }
                }
            });
            match d.dst_layout {
                Layout::Nchw4c => e.store_vec(x, dst_v, dst_off + px),
                Layout::Nchw => e.scatter(x, dst_v, dst_off + px, lane_stride, lanes[v]),
            }
        }
    }
}
