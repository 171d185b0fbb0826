//! Tiling plans: every choice the lowering makes, in one printable struct per op.
//!
//! A plan is derived from a key alone. It splits each spatial axis into *runs*: maximal ranges
//! of output coordinates whose windows cover the same taps (the interior, and each border
//! position that padding clips differently). Code is emitted once per run, with that run's
//! taps as constants, so no tap is ever tested at run time. The exceptions are rows, whose
//! kernel-row loop is a loop anyway: a convolution's border rows share one copy of the row's
//! code with the row's tap range computed at run time ([`AxisPlan::Bordered`]), and so do all
//! the rows of a pooling window taller than [`POOL_UNROLLED_ROWS`].

use std::fmt;
use std::ops::Range;

use primjit_ir::PoolKind;

use crate::key::{
    ConvAlgo, ConvDesc, Layout, Pitches, PoolDesc, PrimitiveKey, RuntimeDims, tap_interval,
};
use crate::target::Isa;
use crate::tile::{LANES, LANEWISE_CALL_PIXELS, LANEWISE_VECTORS};

/// How pooling counts the cells of a window for its divisor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CountMode {
    /// Convolutions and max pooling: no divisor.
    None,
    /// Cells inside the input.
    Valid,
    /// Cells inside the padded input (`count_include_pad`).
    Padded,
}

/// A maximal range of output coordinates along one axis whose windows cover the same taps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AxisRun {
    pub outputs: Range<usize>,
    pub taps: Range<usize>,
    /// This axis's factor of an average pool's divisor (0 when there is none).
    pub count: usize,
}

/// One wide vector of a lane-wise tile call ([`ConvPlan::lanewise_row`]): `pixels` output
/// columns from the call's column `first` on, whose windows cover the kernel columns `taps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowVector {
    pub first: usize,
    pub pixels: usize,
    pub taps: Range<usize>,
}

/// Calls of a lane-wise row ([`ConvPlan::lanewise_row`]): `repeat` calls of `vectors`, the
/// first at output column `first`, each `span` columns after the one before.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowChunk {
    pub first: usize,
    pub repeat: usize,
    pub span: usize,
    pub vectors: Vec<RowVector>,
}

/// Tiles of a fixed-width row whose border columns sit inside them
/// ([`ConvPlan::bordered_tiles`]): `count` tiles of `pixels` pixels, the first from output
/// column `first`, each the next `pixels` columns on; pixel `p` of each covers the kernel
/// columns `taps[p]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TileRun {
    pub first: usize,
    pub pixels: usize,
    pub count: usize,
    pub taps: Vec<Range<usize>>,
}

/// The geometry of one spatial axis of a window op.
#[derive(Clone, Copy, Debug)]
pub struct Axis {
    pub input: usize,
    pub output: usize,
    pub pad_begin: usize,
    pub pad_end: usize,
    pub kernel: usize,
    pub stride: usize,
    pub dilation: usize,
}

impl Axis {
    /// Splits the output coordinates into runs with identical taps (and divisor factor).
    pub fn runs(&self, count: CountMode) -> Vec<AxisRun> {
        let mut runs: Vec<AxisRun> = Vec::new();
        for o in 0..self.output {
            let taps = tap_interval(
                o,
                self.input,
                self.pad_begin,
                self.kernel,
                self.stride,
                self.dilation,
            );
            let count = match count {
                CountMode::None => 0,
                CountMode::Valid => taps.len(),
                CountMode::Padded => {
                    // The taps inside the padded input, `[-pad_begin, input + pad_end)`, in
                    // closed form: counted one by one, a window of 2^24 taps over as many
                    // outputs took 2^48 steps to plan.
                    let start = (o * self.stride) as i64 - self.pad_begin as i64;
                    let (lo, hi) = (-(self.pad_begin as i64), (self.input + self.pad_end) as i64);
                    let d = self.dilation.max(1) as i64;
                    let first = if start >= lo {
                        0
                    } else {
                        (lo - start + d - 1) / d
                    };
                    let end = if hi <= start {
                        0
                    } else {
                        (hi - start + d - 1) / d
                    };
                    (end.min(self.kernel as i64) - first).max(0) as usize
                }
            };
            match runs.last_mut() {
                Some(r) if r.taps == taps && r.count == count => r.outputs.end = o + 1,
                _ => runs.push(AxisRun {
                    outputs: o..o + 1,
                    taps,
                    count,
                }),
            }
        }
        runs
    }
}

/// A run at the end of an axis of runtime extent, placed from the last output backwards: it
/// covers outputs `[output - back, output - back + len)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TailRun {
    pub back: usize,
    pub len: usize,
    pub taps: Range<usize>,
    pub count: usize,
}

/// The runs of an axis whose input extent is a runtime value.
///
/// For every input of at least `min_input`, the outputs split into the same `head` runs
/// (clipped by the padding at the start, which does not depend on the extent), a body of full
/// windows whose length is the runtime part, and `tails` clipped by the padding at the end.
/// Where the end clips a window depends only on the input modulo the stride, so the tails are
/// kept per residue class `input % stride` and chosen at run time. Inputs below `min_input`
/// (where borders meet or overlap) compute their taps per output at run time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AxisTemplate {
    pub head: Vec<AxisRun>,
    pub body_taps: Range<usize>,
    pub body_count: usize,
    /// Indexed by `input % stride`; the first run of each is the furthest from the end.
    pub tails: Vec<Vec<TailRun>>,
    pub min_input: usize,
}

/// Per output coordinate: its taps and divisor factor.
type Expanded = Vec<(Range<usize>, usize)>;

fn expand(runs: &[AxisRun]) -> Expanded {
    runs.iter()
        .flat_map(|r| r.outputs.clone().map(move |_| (r.taps.clone(), r.count)))
        .collect()
}

impl AxisTemplate {
    /// The template of `axis` (whose `input` and `output` are ignored); `ceil` is pooling's
    /// ceil mode.
    pub fn new(axis: Axis, ceil: bool, count: CountMode) -> Self {
        let period = axis.stride;
        let probe_base = template_probe(&axis);
        let runs_at = |input: usize| -> Option<Vec<AxisRun>> {
            let output = axis_output(&axis, input, ceil)?;
            Some(
                Axis {
                    input,
                    output,
                    ..axis
                }
                .runs(count),
            )
        };
        let mut head = Vec::new();
        let mut body = (0..axis.kernel, 0);
        let mut tails = Vec::with_capacity(period);
        for class in 0..period {
            let input = probe_base + (class + period - probe_base % period) % period;
            let runs = runs_at(input).expect("probe inputs fit the window");
            let output = runs.last().map_or(0, |r| r.outputs.end);
            // The body is the longest run: at the probe extent it dwarfs every border.
            let (bi, b) = runs
                .iter()
                .enumerate()
                .max_by_key(|(_, r)| r.outputs.len())
                .expect("probe outputs are not empty");
            body = (b.taps.clone(), b.count);
            head = runs[..bi].to_vec();
            tails.push(
                runs[bi + 1..]
                    .iter()
                    .map(|r| TailRun {
                        back: output - r.outputs.start,
                        len: r.outputs.len(),
                        taps: r.taps.clone(),
                        count: r.count,
                    })
                    .collect(),
            );
        }
        let mut template = AxisTemplate {
            head,
            body_taps: body.0,
            body_count: body.1,
            tails,
            min_input: 1,
        };
        // The smallest extent from which the template holds: check every extent below the
        // probes (beyond them the borders are apart and nothing changes but the body).
        for input in (1..probe_base + period).rev() {
            let Some(runs) = runs_at(input) else { continue };
            if template.instantiate(input, runs.last().map_or(0, |r| r.outputs.end))
                != Some(expand(&runs))
            {
                template.min_input = input + 1;
                break;
            }
        }
        template
    }

    /// The runs of the end for an input of extent `input`.
    pub fn tail(&self, input: usize) -> &[TailRun] {
        &self.tails[input % self.tails.len()]
    }

    /// Outputs covered by the tail runs of each class.
    pub fn tail_len(&self, class: usize) -> usize {
        self.tails[class].first().map_or(0, |t| t.back)
    }

    pub fn head_len(&self) -> usize {
        self.head.last().map_or(0, |r| r.outputs.end)
    }

    /// Per output: taps and divisor factor as the template places them for `input`, or `None`
    /// when the borders would overlap.
    fn instantiate(&self, input: usize, output: usize) -> Option<Expanded> {
        let class = input % self.tails.len();
        let body = output.checked_sub(self.head_len() + self.tail_len(class))?;
        let mut out = expand(&self.head);
        out.extend(std::iter::repeat_n(
            (self.body_taps.clone(), self.body_count),
            body,
        ));
        for t in &self.tails[class] {
            out.extend(std::iter::repeat_n((t.taps.clone(), t.count), t.len));
        }
        Some(out)
    }
}

/// An input extent large enough that the borders of `axis` are far apart.
fn template_probe(axis: &Axis) -> usize {
    // Saturating: an invalid key (a zero kernel, a huge pad) is rejected after this probe.
    let extent = axis.kernel.saturating_sub(1).saturating_mul(axis.dilation) + 1;
    let borders = extent
        .saturating_add(axis.pad_begin)
        .saturating_add(axis.pad_end);
    borders
        .saturating_mul(4)
        .saturating_add(axis.stride.saturating_mul(8))
        .saturating_add(16)
}

fn axis_output(axis: &Axis, input: usize, ceil: bool) -> Option<usize> {
    primjit_ir::pool_output_extent(
        input,
        axis.pad_begin,
        axis.pad_end,
        axis.kernel,
        axis.stride,
        axis.dilation,
        ceil,
    )
    .filter(|&o| o > 0)
}

/// How the lowering walks one spatial axis.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AxisPlan {
    /// A fixed extent: every run is known.
    Fixed(Vec<AxisRun>),
    /// A runtime extent with specialized borders (columns, whose taps are unrolled).
    Template(AxisTemplate),
    /// A runtime extent whose taps each output computes at run time (rows: the kernel-row
    /// loop is a loop anyway, so runtime bounds cost a few scalar instructions per row).
    PerOutput,
    /// A fixed extent of convolution rows: the interior run (`runs[interior]`, the longest)
    /// has its taps as constants, and the border runs, where padding clips the window, share
    /// one loop that computes each row's taps at run time. One copy of a row's code for all the
    /// borders instead of one per border run: a 3x3 kernel compiles two copies, not three, and
    /// the trunk's conv1 (7x7, stride 2, pad 3) two, not four.
    ///
    /// Why not runtime taps for every row, one copy only: the interior rows then ran 3-4% slower
    /// with the same instructions in their hot loop (`primjit bench-op` on 64- and 256-channel
    /// 3x3 layers, alternating builds; callgrind counted 0.3-0.7% more instructions in all).
    Bordered { runs: Vec<AxisRun>, interior: usize },
}

impl AxisPlan {
    /// The plan of a row axis: fixed runs, or taps computed per row at run time.
    fn rows(axis: Axis, runtime: bool, count: CountMode) -> Self {
        if runtime {
            AxisPlan::PerOutput
        } else {
            AxisPlan::Fixed(axis.runs(count))
        }
    }

    /// The plan of a convolution's row axis: [`AxisPlan::Bordered`] when a fixed extent has
    /// more than one border run and the key has no runtime extent, else as
    /// [`AxisPlan::rows`]. With one border run (a stride-2 3x3 kernel clips only its top row)
    /// there is nothing to share.
    ///
    /// Runtime-width kernels keep one copy of the row's code per run: with the borders
    /// merged, regalloc2 moved the kernel-row step of their interior tiles to the stack, and
    /// the 64-channel residual layers of the trunk ran 10% slower than with fixed runs
    /// (`benches/dynamic-vs-exact.sh 320`). They compile once per configuration, not per width.
    fn conv_rows(axis: Axis, runtime: RuntimeDims) -> Self {
        match Self::rows(axis, runtime.h, CountMode::None) {
            AxisPlan::Fixed(runs) if runs.len() > 2 && !runtime.w => {
                let interior = (0..runs.len())
                    .rev()
                    .max_by_key(|&i| runs[i].outputs.len())
                    .expect("more than two runs");
                AxisPlan::Bordered { runs, interior }
            }
            plan => plan,
        }
    }

    /// The plan of a column axis: fixed runs, or a template for a runtime width.
    fn columns(axis: Axis, runtime: bool, ceil: bool, count: CountMode) -> Self {
        if runtime {
            AxisPlan::Template(AxisTemplate::new(axis, ceil, count))
        } else {
            AxisPlan::Fixed(axis.runs(count))
        }
    }
}

/// Extents at which a key with runtime extents is validated (`PrimitiveKey::validate`): large
/// enough that its borders are apart.
pub fn representative_extents(key: &crate::PrimitiveKey) -> [usize; 2] {
    let [ih, iw] = key.input_extents();
    let rt = key.runtime_dims();
    let probe = |axis: Axis| template_probe(&axis);
    match key {
        crate::PrimitiveKey::Conv(d) => {
            let [rows, cols] = conv_axes(d);
            // A fused pool's borders must be apart too: the input that gives the pool's probe.
            let pooled = d.pool_desc().map(|p| pool_axes(&p));
            let probe_with_pool = |axis: Axis, pool: Option<Axis>| {
                let pool_input = pool.map_or(0, |p| template_probe(&p));
                let extent = axis.kernel.saturating_sub(1).saturating_mul(axis.dilation) + 1;
                let input = pool_input
                    .saturating_mul(axis.stride)
                    .saturating_add(extent);
                probe(axis).max(input)
            };
            [
                if rt.h {
                    probe_with_pool(rows, pooled.map(|[r, _]| r))
                } else {
                    ih
                },
                if rt.w {
                    probe_with_pool(cols, pooled.map(|[_, c]| c))
                } else {
                    iw
                },
            ]
        }
        crate::PrimitiveKey::Pool(d) => {
            let [rows, cols] = pool_axes(d);
            [
                if rt.h { probe(rows) } else { ih },
                if rt.w { probe(cols) } else { iw },
            ]
        }
        // The kernel checks every tap at run time, so any extent whose output is not empty
        // will do: one more than the pads leaves at least one row.
        crate::PrimitiveKey::ConvTranspose(d) => {
            let rep = |runtime: bool, fixed: usize, pads: usize| {
                if runtime {
                    pads.saturating_add(2).max(5)
                } else {
                    fixed
                }
            };
            [
                rep(rt.h, ih, d.pads.top.saturating_add(d.pads.bottom)),
                rep(rt.w, iw, d.pads.left.saturating_add(d.pads.right)),
            ]
        }
        // Any extent whose output is not empty will do: the kernel has no borders.
        crate::PrimitiveKey::Resize(crate::ResizeDesc {
            out: crate::ResizeOut::Scale(f),
            ..
        }) => {
            let rep = |runtime: bool, fixed: usize, f: crate::ScaleFactor| {
                if runtime {
                    // (A zero factor, which validation refuses, takes 5.)
                    (f.den().div_ceil(f.num().max(1)) as usize).max(5)
                } else {
                    fixed
                }
            };
            [rep(rt.h, ih, f[0]), rep(rt.w, iw, f[1])]
        }
        crate::PrimitiveKey::Resize(_)
        | crate::PrimitiveKey::GlobalPool(_)
        | crate::PrimitiveKey::Eltwise(_)
        | crate::PrimitiveKey::Concat(_) => [if rt.h { 5 } else { ih }, if rt.w { 5 } else { iw }],
        _ => [ih, iw],
    }
}

/// The row and column axes of a window op's geometry.
fn axes(
    [ih, iw]: [usize; 2],
    [oh, ow]: [usize; 2],
    pads: primjit_ir::Pads,
    kernel: [usize; 2],
    strides: [usize; 2],
    dilations: [usize; 2],
) -> [Axis; 2] {
    [
        Axis {
            input: ih,
            output: oh,
            pad_begin: pads.top,
            pad_end: pads.bottom,
            kernel: kernel[0],
            stride: strides[0],
            dilation: dilations[0],
        },
        Axis {
            input: iw,
            output: ow,
            pad_begin: pads.left,
            pad_end: pads.right,
            kernel: kernel[1],
            stride: strides[1],
            dilation: dilations[1],
        },
    ]
}

fn conv_axes(d: &ConvDesc) -> [Axis; 2] {
    axes(
        [d.ih, d.iw],
        [d.oh(), d.ow()],
        d.pads,
        [d.kh, d.kw],
        d.strides,
        d.dilations,
    )
}

fn pool_axes(d: &PoolDesc) -> [Axis; 2] {
    axes(
        [d.ih, d.iw],
        [d.oh(), d.ow()],
        d.window.pads,
        d.window.kernel,
        d.window.strides,
        d.window.dilations,
    )
}

/// Strides of an activation buffer, in elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Strides {
    pub image: usize,
    /// From one channel to the next within a block of four (1 in `nChw4c`, a plane in NCHW).
    pub channel: usize,
    /// From one block of four channels to the next.
    pub block: usize,
    pub row: usize,
    pub pixel: usize,
}

impl Strides {
    pub fn new(layout: Layout, [_, c, h, w]: [usize; 4]) -> Self {
        match layout {
            Layout::Nchw => Strides {
                image: c * h * w,
                channel: h * w,
                block: 4 * h * w,
                row: w,
                pixel: 1,
            },
            Layout::Nchw4c => Strides {
                image: c.div_ceil(4) * 4 * h * w,
                channel: 1,
                block: 4 * h * w,
                row: 4 * w,
                pixel: 4,
            },
        }
    }
}

/// The input-channel range one output-channel tile reduces over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IcRange {
    /// First input channel of tile 0.
    pub begin: usize,
    /// Input channels per tile (a multiple of `ic_step`).
    pub len: usize,
    /// How far the range moves from one run of `every` tiles to the next.
    pub step: usize,
    /// Consecutive tiles that share a range: the tiles of one group, where a group's output
    /// channels span several tiles; 1 otherwise.
    pub every: usize,
}

impl IcRange {
    /// The first input channel of tile `t`'s range.
    pub fn first(&self, t: usize) -> usize {
        self.begin + t / self.every * self.step
    }
}

/// The tiling plan of a convolution.
///
/// Output channels are tiled by `vecs` vectors of four, the last tile holding the blocks left
/// ([`ConvPlan::last_tile_vecs`], fewer at a wide tier where the blocks fill no whole wide
/// vectors); output pixels of a row by
/// `pixel_tile`; each (pixel, vector) pair holds one accumulator, `vecs * pixel_tile <= 12` so
/// that the accumulators, a weight vector and a broadcast fit in the 16 xmm registers with
/// room to spare (see `ConvPlan::accumulators`).
/// The reduction walks the tile's input channels `ic_step` at a time (a block of four in
/// `nChw4c`) with the kernel rows in an inner loop and the kernel columns unrolled.
///
/// Packed weights are `[tile][ic in range][kh][kw][vecs * 4]`, zero for padding lanes (and a
/// short last tile's missing blocks), for
/// input channels outside an output channel's group, and for channels past the input's; the
/// padded bias (`ceil(oc / 4) * 4` values) follows when the key has one. A lane-wise plan
/// ([`ConvPlan::lanewise`]) packs `[tile][kh][kw][4]`: each lane's own channel's taps.
#[derive(Clone, Debug, PartialEq)]
pub struct ConvPlan {
    pub desc: ConvDesc,
    pub vecs: usize,
    pub oc_tiles: usize,
    pub pixel_tile: usize,
    pub ic_step: usize,
    pub ic: IcRange,
    /// Input channels per chunk of the reduction (a divisor of `ic.len`); see
    /// `ConvPlan::chunk_len`.
    pub ic_chunk: usize,
    /// Whether rows are the outer loop and output-channel tiles the inner one (see
    /// [`ROWS_OUTER_WEIGHT_BYTES`]); otherwise each tile runs all its rows.
    pub rows_outer: bool,
    /// Whether a tile that runs all its rows (not [`Self::rows_outer`]) runs them for one
    /// chunk of the reduction ([`Self::chunks`]) before the next, rather than every chunk
    /// for one row before the next row.
    ///
    /// Such plans have large weights (over [`ROWS_OUTER_WEIGHT_BYTES`]), which on small
    /// images a row barely reuses: a 7-pixel row ran each 18 KiB chunk's weights through one
    /// or two pixel tiles and moved on, so a 512-channel 3x3 layer at 7x7 read its tile's
    /// 288 KiB of weights from L2 or beyond once per row. Chunk by chunk, a chunk's weights
    /// stay in L1 across the tile's rows; the partial sums of the tile's rows go through the
    /// destination once per chunk, a few bytes per hundred FMAs. The sums and their order do
    /// not change (decision 031).
    pub chunks_outer: bool,
    pub rows: AxisPlan,
    pub cols: AxisPlan,
    /// Rows the destination holds when it is a fused pool's scratch band instead of the whole
    /// output: the lowering then addresses row `oh` of a destination whose pointer was moved
    /// back by the band's first row (see `lower_fused`).
    pub dst_rows: Option<usize>,
    /// Whether each output channel reduces over its own input channel alone: a depthwise
    /// convolution (one output channel per group of one input channel) on `nChw4c`. Its tiles
    /// are one vector of four channels, and each FMA multiplies an input vector (four
    /// channels of one pixel) by a weight vector lane by lane, where the broadcast reduction
    /// would take four FMAs per vector, three of them by zero weights. A zero weight also
    /// turned a NaN in one channel into NaN in its three neighbours.
    pub lanewise: bool,
    /// Whether a tile's reduction reaches input channels of other groups than some of its
    /// output lanes' (groups whose output channels are not whole vectors, or whose input
    /// channels are not whole steps): their weights are zero, but `Inf * 0` is NaN, so each
    /// broadcast input is ANDed with a lane mask of the output channels in its group first.
    /// The masks follow the bias, one per weight vector at the same place relative to
    /// [`Self::mask_offset`] as the vector to [`Self::pack_weights`]'s start.
    pub group_masks: bool,
    /// The key's output rows per row of the plan ([`Self::joined_rows`], or all of them,
    /// [`Self::tiles_per_item`]); `desc` is the convolution on the joined rows.
    pub joined: usize,
    /// Where the plan joins the whole image into one row, the output-channel tiles of one
    /// work item: item `i` computes tiles `[i * n, (i + 1) * n)` (the last up to
    /// `oc_tiles`) of the row, `n` a multiple of every narrow group the row's tiles form
    /// ([`Self::narrow_group`]). `None`: a work item is a row of the plan.
    pub tiles_per_item: Option<usize>,
}

/// Dependent FMA chains from which a register tile is wide enough ([`ConvPlan::narrow_group`]).
const NARROW_CHAINS: usize = 8;

/// The most packed-weight bytes for which rows are the outer loop.
///
/// With rows outer, a row's input rows stay in cache while every output-channel tile reads
/// them, but all the weights pass through the cache once per row; with tiles outer, a tile's
/// weights stay in cache across the rows, but the whole input passes once per tile. Measured
/// on the trunk at W=1031 (`primjit bench-op --model`): with rows outer, the layers with
/// 33 KB-1.2 MB of weights gained 2-20 points of peak (layer2.0.conv1 69% to 89%,
/// layer3.0.conv1 83% to 87.5%, the downsamples 67-73% to 80%), and the 256-channel 3x3
/// layers (2.4 MB) lost 2-5.
pub const ROWS_OUTER_WEIGHT_BYTES: usize = 2 * 1024 * 1024;

/// The bytes of packed weights one chunk of the reduction may take: about two thirds of the
/// 32 KiB L1 data cache, the rest being for the tile's input rows and outputs.
pub const CHUNK_WEIGHT_BYTES: usize = 20 * 1024;

/// Bytes of one input channel's packed weights in an output-channel tile.
fn channel_weight_bytes(d: &ConvDesc, vecs: usize) -> usize {
    d.kh * d.kw * vecs * LANES * std::mem::size_of::<f32>()
}

/// The least common multiple of two positive counts.
fn lcm(a: usize, b: usize) -> usize {
    let (mut x, mut y) = (a, b);
    while y != 0 {
        (x, y) = (y, x % y);
    }
    a / x * b
}

/// The shortest row a 1x1 convolution's tiles run on before [`ConvPlan::joined_rows`] joins
/// rows: four 6-pixel tiles, past which a row's remainder tile costs little.
pub const JOINED_ROW_PIXELS: usize = 24;

/// Output-channel blocks from which a 1x1 convolution at avx2 takes tiles of three `ymm` by
/// four pixels even where its last tile is short (`ConvPlan::wide_tile`). Four-pixel tiles
/// fit the 7- and 28-pixel rows of 224x224 networks without a narrow remainder, and three
/// vectors load 7 times per 12 FMAs where two load 8; a short last tile (one or two `ymm`,
/// 4 or 8 FMA chains) costs its share of the blocks. Measured with `bench-op` against two
/// `ymm` by six pixels, alternated (% of the avx2 peak, Zen3): 64 blocks `ic1024ih14oc256`
/// 89 to 92, 80 blocks `ic1152ih7oc320` 74 to 83, 512 blocks `ic512ih7oc2048` 75 to 90,
/// 128 blocks `ic128ih28oc512` 93 to 92; below, 32 blocks `ic512ih28oc128` 93 to 88, 20
/// blocks `ic480ih14oc80` 96 to 88, 16 blocks `ic256ih56oc64` 92 to 73. Inside ResNet50 the
/// 7x7 layers gained 5-7% and its 14x14 and 28x28 ones lost 1-4%: the tile cannot follow the
/// extent, so the rule trades them (docs/perf/2026-12-zen3.md, session 44).
pub const POINTWISE_SHORT_TILE_BLOCKS: usize = 64;

impl ConvPlan {
    /// The plan of a key: for a 1x1 convolution over contiguous rows, the plan of the same
    /// convolution on rows of [`Self::joined_rows`] rows each.
    pub fn new(d: &ConvDesc) -> Self {
        match Self::joined_rows(d) {
            1 => Self::whole_image(d).unwrap_or_else(|| Self::unjoined(d)),
            k => Self::joined(d, k),
        }
    }

    /// The plan of `d` on rows of `k` of its rows.
    fn joined(d: &ConvDesc, k: usize) -> Self {
        let mut plan = Self::unjoined(&ConvDesc {
            ih: d.ih / k,
            iw: d.iw * k,
            ..d.clone()
        });
        plan.joined = k;
        plan
    }

    /// The plan of a joinable key whose rows no divisor joins into rows of
    /// [`JOINED_ROW_PIXELS`] while leaving two (a 7x7 image): its whole image as one row,
    /// the work items parts of the output-channel tiles ([`Self::tiles_per_item`]), so that
    /// threads still share the work. `None` where the key is not such, or its tiles make
    /// fewer than two items.
    ///
    /// One row of 49 pixels takes whole tiles where seven rows of 7 each end in a narrow
    /// remainder tile: ResNet50's 7x7 1x1 layers took 0.90x their time in the network, on
    /// one thread and on two (Zen3, avx2; docs/decisions/030-whole-image-rows-for-1x1-convolutions.md).
    /// Split by output channels, each thread reads all of the small image and only its
    /// part of the weights, which at 7x7 are most of the bytes.
    fn whole_image(d: &ConvDesc) -> Option<Self> {
        if !Self::joinable(d) || d.ih < 2 {
            return None;
        }
        let plan = Self::joined(d, d.ih);
        let AxisPlan::Fixed(runs) = &plan.cols else {
            return None;
        };
        // A narrow tile of `g` output-channel tiles is computed by the tile at a multiple
        // of `g`: a part starts at a multiple of every such group.
        let per_item = runs
            .iter()
            .map(|run| run.outputs.len() % plan.pixel_tile)
            .filter(|&rem| rem > 0)
            .map(|rem| plan.narrow_group(rem))
            .fold(1, lcm);
        (plan.oc_tiles.div_ceil(per_item) >= 2).then_some(ConvPlan {
            tiles_per_item: Some(per_item),
            ..plan
        })
    }

    /// The work items of the kernel of `d` (a direct convolution at fixed extents): the
    /// plan's rows, or its parts of output-channel tiles ([`Self::tiles_per_item`]).
    pub fn work_items_of(d: &ConvDesc) -> usize {
        match Self::joined_rows(d) {
            // Only a key whose rows would stay unjoined may take a whole-image plan.
            1 if Self::joinable(d) && d.ih >= 2 => Self::new(d).work_items(),
            k => d.dst_shape()[2] / k,
        }
    }

    /// This plan's work items (see [`Self::work_items_of`]).
    pub fn work_items(&self) -> usize {
        match self.tiles_per_item {
            Some(n) => self.oc_tiles.div_ceil(n),
            None => self.desc.dst_shape()[2],
        }
    }

    /// The output rows and the output channels (counted in whole `nChw4c` blocks: a last
    /// tile writes its block's padding lanes) that work items `items` write, in the key's
    /// rows: every channel of their rows, or every row of their channels.
    pub fn item_outputs(&self, items: Range<usize>) -> (Range<usize>, Range<usize>) {
        let channels = self.desc.oc.div_ceil(LANES) * LANES;
        let rows = self.desc.dst_shape()[2] * self.joined;
        if items.is_empty() {
            return (0..0, 0..0);
        }
        match self.tiles_per_item {
            Some(n) => {
                let tile_oc = n * self.vecs * LANES;
                let hi = (items.end * tile_oc).min(channels);
                (0..rows, (items.start * tile_oc).min(hi)..hi)
            }
            None => (
                items.start * self.joined..items.end * self.joined,
                0..channels,
            ),
        }
    }

    /// How many output rows a work item of `d`'s kernel spans. A 1x1 convolution of unit
    /// stride without padding, on dense rows at fixed extents, computes each output pixel from
    /// the input pixel at the same place, and its rows lie end to end in both buffers: it is
    /// the same convolution on rows of `k` rows each. Narrow rows then take whole tiles
    /// instead of a remainder tile each: measured on ResNeXt50's 1x1 layers at 14x14 (`bench-op
    /// mb1ic1024ih14iw14oc256kh1` against `ih7iw28`), 79% of the peak and 91% (avx2, Zen3).
    /// `k` is the least divisor of the rows that makes a row [`JOINED_ROW_PIXELS`] long while
    /// leaving two rows, for two threads (7x7 keeps its rows: one row of 49 ran at 89% against
    /// 67%, but on one thread only).
    pub fn joined_rows(d: &ConvDesc) -> usize {
        if !Self::joinable(d) {
            return 1;
        }
        let rows = d.ih;
        (2..=rows / 2)
            .find(|&k| rows.is_multiple_of(k) && d.iw * k >= JOINED_ROW_PIXELS)
            .unwrap_or(1)
    }

    /// Whether `d` computes each output pixel from the input pixel at the same place, on
    /// rows lying end to end in both buffers, and its rows are narrow: a direct 1x1
    /// convolution of unit stride without padding or a fused pool, on dense rows at fixed
    /// extents, narrower than [`JOINED_ROW_PIXELS`].
    fn joinable(d: &ConvDesc) -> bool {
        d.algo == ConvAlgo::Direct
            && (d.kh, d.kw) == (1, 1)
            && d.strides == [1, 1]
            && d.pads == primjit_ir::Pads::default()
            && d.pool.is_none()
            && d.pitches == Pitches::DENSE
            && !d.runtime.any()
            && d.iw < JOINED_ROW_PIXELS
    }

    /// The plan of `d` as it is, its rows unjoined: what a fused pool's conv stage takes,
    /// whose rows are a band's.
    pub(crate) fn unjoined(d: &ConvDesc) -> Self {
        let oc_blocks = d.oc.div_ceil(LANES);
        let ic_step = match d.src_layout {
            Layout::Nchw => 1,
            Layout::Nchw4c => LANES,
        };
        let ic_padded = d.ic.div_ceil(ic_step) * ic_step;
        let lanewise = d.lanewise();
        let (vecs, pixel_tile) = match Self::wide_tile(d, oc_blocks) {
            _ if lanewise => (1, Self::lanewise_pixels(d.isa)),
            Some(tile) => tile,
            None => {
                let vecs = Self::oc_vectors(d, oc_blocks, ic_padded);
                (vecs, Self::accumulators(d.kw * ic_step) / vecs)
            }
        };
        let tile_oc = vecs * LANES;
        let oc_tiles = oc_blocks.div_ceil(vecs);
        let (icg, ocg) = (d.ic / d.groups, d.oc / d.groups);
        let tile_range = |t: usize| {
            let first = (t * tile_oc).min(d.oc - 1) / ocg;
            let last = ((t + 1) * tile_oc).min(d.oc).saturating_sub(1) / ocg;
            let begin = first * icg / ic_step * ic_step;
            let end = ((last + 1) * icg).div_ceil(ic_step) * ic_step;
            (begin, end - begin)
        };
        let (b0, len0) = tile_range(0);
        // Tiles move on to the next input range one by one, or, where a group (or a block
        // of the input) spans several tiles, once per run of tiles that share one.
        let every = (1..oc_tiles).find(|&t| tile_range(t).0 != b0).unwrap_or(1);
        let step = if oc_tiles > every {
            tile_range(every).0 - b0
        } else {
            0
        };
        let ranges = IcRange {
            begin: b0,
            len: len0,
            step,
            every,
        };
        let regular = (0..oc_tiles).all(|t| tile_range(t) == (ranges.first(t), len0));
        // Irregular groupings reduce over every channel: zero weights make that exact.
        let ic = if regular {
            ranges
        } else {
            IcRange {
                begin: 0,
                len: ic_padded,
                step: 0,
                every: 1,
            }
        };
        let [rows, cols] = conv_axes(d);
        let ic_chunk = if lanewise {
            ic.len
        } else {
            Self::chunk_len(d, ic.len, ic_step, channel_weight_bytes(d, vecs))
        };
        let mut plan = ConvPlan {
            desc: d.clone(),
            vecs,
            oc_tiles,
            pixel_tile,
            ic_step,
            ic,
            ic_chunk,
            rows_outer: false,
            chunks_outer: false,
            rows: AxisPlan::conv_rows(rows, d.runtime),
            cols: AxisPlan::columns(cols, d.runtime.w, false, CountMode::None),
            dst_rows: None,
            lanewise,
            joined: 1,
            tiles_per_item: None,
            group_masks: d.groups > 1
                && !lanewise
                && !(ocg.is_multiple_of(tile_oc) && icg.is_multiple_of(ic_step)),
        };
        debug_assert!(
            !(plan.group_masks && plan.wide_ratio().is_some()),
            "a wide tile never reaches another group's channels"
        );
        // A grouped tile reads only its group's planes, so tiles outer stream them one group
        // at a time, where rows outer would visit every plane per row: MobileNetV2's depthwise
        // layers took 0.54-0.88x the time, ResNeXt50's grouped ones 0.89-0.99x (`bench-op
        // --model`, 3-4 rounds alternated, Zen3).
        plan.rows_outer =
            d.groups == 1 && Self::weights_allow_rows_outer(plan.packed_weights_len());
        plan.chunks_outer = !plan.rows_outer && plan.chunks() > 1;
        plan
    }

    /// The pixel tiles of a fixed-width row at a wide tier, border columns included, when
    /// the row has border columns; `None` keeps the column runs (x128, runtime widths,
    /// lane-wise plans, rows without borders).
    ///
    /// A wide tile skips the FMAs of a kernel column that a pixel's window misses
    /// (`backend::x64::TileUnit`), so a border pixel joins its neighbours' tile and sums the
    /// same products in the same order as a tile of its own would: the bits do not change.
    /// On its own, a border column was a one-pixel tile spanning four output-channel tiles
    /// ([`ConvPlan::narrow_group`]), a weight vector loaded per FMA from four tiles' weights,
    /// which missed L1 on every row: at 7x7 its two border columns took half of a 512-channel
    /// layer's time for a fifth of its FMAs (decision 031). Full tiles, then the last two
    /// tiles split evenly where a lone remainder would hold too few chains: a 7-pixel row is
    /// a tile of 4 and one of 3, a 14-pixel row tiles of 6, 4 and 4.
    pub fn bordered_tiles(&self) -> Option<Vec<TileRun>> {
        let ratio = self.wide_ratio()?;
        let AxisPlan::Fixed(runs) = &self.cols else {
            return None;
        };
        let width = runs.last().map_or(0, |r| r.outputs.end);
        if runs.len() < 2 || width == 0 {
            return None;
        }
        let p = self.pixel_tile;
        let (full, rest) = (width / p, width % p);
        // The fewest pixels whose tile holds enough chains of its own.
        let least = NARROW_CHAINS.div_ceil(self.vecs.div_ceil(ratio));
        let sizes: Vec<usize> = if rest == 0 || rest >= least || full == 0 {
            let last = (rest > 0).then_some(rest);
            std::iter::repeat_n(p, full).chain(last).collect()
        } else {
            let pair = p + rest;
            std::iter::repeat_n(p, full - 1)
                .chain([pair.div_ceil(2), pair / 2])
                .collect()
        };
        let taps_of = |q: usize| {
            runs.iter()
                .find(|r| r.outputs.contains(&q))
                .map_or(0..0, |r| r.taps.clone())
        };
        let mut tiles: Vec<TileRun> = Vec::new();
        let mut first = 0;
        for pixels in sizes {
            let taps: Vec<Range<usize>> = (first..first + pixels).map(taps_of).collect();
            match tiles.last_mut() {
                Some(run) if run.pixels == pixels && run.taps == taps => run.count += 1,
                _ => tiles.push(TileRun {
                    first,
                    pixels,
                    count: 1,
                    taps,
                }),
            }
            first += pixels;
        }
        Some(tiles)
    }

    /// Output-channel tiles that a tile of `pixels` pixels of [`Self::bordered_tiles`] spans:
    /// one where it holds three quarters of the chains a core keeps busy (a 3-pixel tile of
    /// two wide vectors: six), else as a narrow tile ([`Self::narrow_group`]). Spanning two
    /// tiles doubles the weights a tile reads, which then no longer stay in L1 across the
    /// rows of a chunk ([`Self::chunks_outer`]): the 3-pixel tiles of a 512-channel 3x3 layer
    /// at 7x7 spanning two tiles took the layer from 4.2 to 5.0 ms (decision 031).
    pub fn bordered_group(&self, pixels: usize) -> usize {
        let ratio = self.wide_ratio().unwrap_or(1);
        let chains = pixels * self.vecs.div_ceil(ratio);
        if 4 * chains >= 3 * NARROW_CHAINS {
            1
        } else {
            self.narrow_group(pixels)
        }
    }

    /// Pixels of a lane-wise tile ([`ConvPlan::lanewise`]). At `x128` 10: an accumulator
    /// per pixel, the weight vector and each FMA's input vector take 12 of the 16 registers,
    /// which leaves the allocator room to rotate the accumulators at the loop's back edge
    /// (with 12 it spilled three of them there). At a wide tier, 8 wide vectors of
    /// consecutive pixels (`backend::x64::LanewiseTile`): 8 chains of FMAs, as many as two
    /// FMA ports of 4 cycles' latency keep busy.
    fn lanewise_pixels(isa: Isa) -> usize {
        match isa {
            Isa::X128 => 10,
            wide => LANEWISE_VECTORS * (wide.target().lanes / LANES),
        }
    }

    /// Consecutive pixels per wide vector of a lane-wise plan at a wide tier, else `None`.
    pub fn lanewise_ratio(&self) -> Option<usize> {
        let ratio = self.desc.isa.target().lanes / LANES;
        (self.lanewise && ratio > 1).then_some(ratio)
    }

    /// The calls of a lane-wise plan's rows at a wide tier, where the columns are fixed: the
    /// row's column runs cut into vectors (each run whole vectors, then its remainder as
    /// one-pixel vectors, each skipping the taps its run's windows miss), and these into
    /// calls of [`LANEWISE_VECTORS`], or of the whole row, or with a short last call joined
    /// to the one before, where that takes at most [`crate::tile::lanewise_row_vectors`]
    /// and [`LANEWISE_CALL_PIXELS`]. Calls of the same vectors in a row become one
    /// [`RowChunk`] that repeats.
    ///
    /// A row's border columns are then vectors of the calls beside the interior's, where
    /// the column runs made each a one-pixel 128-bit tile, one chain of dependent FMAs: on a
    /// 7-pixel row under a 5x5 kernel with pads of 2, 4 such chains of 25 FMAs beside one
    /// tile of the 3 interior pixels; in one call the row is 6 independent chains (`ymm`
    /// and `xmm` at `avx2`). A pixel still adds its taps in the order of every other tile,
    /// so the bits do not change.
    pub fn lanewise_row(&self) -> Option<Vec<RowChunk>> {
        let ratio = self.lanewise_ratio()?;
        let AxisPlan::Fixed(runs) = &self.cols else {
            return None;
        };
        let mut vectors = Vec::new();
        for run in runs {
            let (start, len) = (run.outputs.start, run.outputs.len());
            let whole = (0..len / ratio).map(|k| (start + k * ratio, ratio));
            let rest = (start + len / ratio * ratio..run.outputs.end).map(|q| (q, 1));
            vectors.extend(whole.chain(rest).map(|(first, pixels)| RowVector {
                first,
                pixels,
                taps: run.taps.clone(),
            }));
        }
        if vectors.is_empty() {
            return None;
        }
        // A call's vectors from `vectors[a..b]`, within the tile's registers and the reach
        // `tier_for` checks.
        let most = crate::tile::lanewise_row_vectors(self.desc.isa);
        let span =
            |a: usize, b: usize| vectors[b - 1].first + vectors[b - 1].pixels - vectors[a].first;
        let fits = |a: usize, b: usize| b - a <= most && span(a, b) <= LANEWISE_CALL_PIXELS;
        let mut bounds: Vec<usize> = if fits(0, vectors.len()) {
            vec![0, vectors.len()]
        } else {
            (0..vectors.len())
                .step_by(LANEWISE_VECTORS)
                .chain([vectors.len()])
                .collect()
        };
        // A short last call joins the one before where both fit one (a row's lone border
        // pixel would be one chain of dependent FMAs).
        if let [.., a, b, c] = bounds[..]
            && c - b < LANEWISE_VECTORS
            && fits(a, c)
        {
            bounds.remove(bounds.len() - 2);
        }
        let mut chunks: Vec<RowChunk> = Vec::new();
        for (a, b) in bounds.iter().zip(&bounds[1..]) {
            let call = &vectors[*a..*b];
            let first = call[0].first;
            let span = span(*a, *b);
            let vectors: Vec<RowVector> = call
                .iter()
                .map(|v| RowVector {
                    first: v.first - first,
                    ..v.clone()
                })
                .collect();
            match chunks.last_mut() {
                Some(c) if c.vectors == vectors && c.first + c.repeat * c.span == first => {
                    c.repeat += 1;
                }
                _ => chunks.push(RowChunk {
                    first,
                    repeat: 1,
                    span,
                    vectors,
                }),
            }
        }
        Some(chunks)
    }

    /// Input channels per tile in the packed weights: each lane's own at most, for a
    /// lane-wise plan; the tile's reduction range otherwise.
    fn weight_channels(&self) -> usize {
        if self.lanewise { 1 } else { self.ic.len }
    }

    /// Output-channel vectors per tile: one (a tile of 10-12 pixels) for a convolution with
    /// rows outer (see [`ROWS_OUTER_WEIGHT_BYTES`]) and a kernel larger than 1x1; otherwise two
    /// (5-6 pixels) when the channel blocks pair up.
    ///
    /// The two load ports bound a tile before its FMAs do: every FMA takes its own broadcast
    /// load, and each weight vector is loaded once for the tile's pixels. A trip of a 3x3
    /// tile holds 144 FMAs (72 cycles on two FMA ports) and, with 6 pixels x 2 vectors, 168
    /// loads (84 cycles on two load ports); with 12 pixels x 1 vector, 156 loads (78 cycles).
    /// One vector doubles the output-channel tiles, each of which reads the input again, which
    /// rows outer keeps in cache.
    ///
    /// Measured with `primjit bench-op DESCRIPTOR`, 3 rounds alternating with two vectors
    /// everywhere: the 64-channel 3x3 layer at W=1031 (`mb1ic64ih80iw258oc64kh3ph1`) went from
    /// 90.1-91.1% to 96.5-97.1% of peak, the 128-channel one at W=320 from 88.4-90.8% to
    /// 92.9-94.3%, the strided `mb1ic64ih80iw258oc128kh3sh2ph1` from 83.5-88.3% to 90.2-91.8%,
    /// and in the trunk conv1 from 88% to 94-95%. The 1x1 downsamples did not change beyond the
    /// noise, and keep two.
    ///
    /// The trunk's layers with tiles outer, the 256-channel ones, also have its narrowest rows:
    /// 20 pixels at W=320, where one vector lost 8-10 points (a row's two one-pixel border
    /// tiles, at 2 loads per FMA, and its 6-pixel remainder, 6 FMA chains, take a third of its
    /// time), while at 65 pixels (W=1031) it gained 2-4. The choice cannot depend on the width,
    /// since a runtime-width kernel must tile as the exact ones do, so these keep two.
    fn oc_vectors(d: &ConvDesc, oc_blocks: usize, ic_padded: usize) -> usize {
        // The packed weights without groups, whatever the tile: what `rows_outer` is set from.
        let floats = oc_blocks * LANES * (ic_padded * d.kh * d.kw + usize::from(d.bias));
        let one_vector = d.groups == 1 && d.kh * d.kw > 1 && Self::weights_allow_rows_outer(floats);
        // A tile of two vectors across groups of fewer output channels reduces over each
        // group's input channels for every output channel, most of them by zero weights:
        // ResNeXt's groups of 4 ran at 27% of peak with two vectors.
        let straddles = d.groups > 1 && !(d.oc / d.groups).is_multiple_of(2 * LANES);
        if one_vector || straddles || !oc_blocks.is_multiple_of(2) {
            1
        } else {
            2
        }
    }

    /// At a wide tier, `(vecs, pixel_tile)` in 4-lane vectors: the tier's full tile
    /// (`backend::x64::full_tile`: 6 pixels x 2 `ymm`, 12 pixels x 2 `zmm`) where the
    /// output-channel blocks (a group's, for a grouped conv) fill pairs of wide vectors,
    /// three wide vectors and a third of the pixels where they fill threes, one wide vector
    /// and twice the pixels where they fill ones, and otherwise a tile of all the blocks of
    /// the largest divisor of the block count that two wide vectors hold, its last vector a
    /// tail (an opmask at `avx512`, the low half at `avx2`). Blocks that fill no whole wide
    /// vectors and more than one full tile take full tiles and a short last one
    /// ([`ConvPlan::last_tile_vecs`]): ShuffleNetV2's 116 channels, 29 blocks, ran 29 tiles of
    /// one block, every FMA on a half `ymm`, at 30% of the avx2 peak
    /// (`bench-op mb1ic116ih14iw14oc116oh14ow14kh1kw1`, against 94% for 120 channels).
    /// `None` (the 128-bit tiling) at `x128`, and for an NCHW destination, whose lanes are
    /// scattered one channel at a time.
    ///
    /// Two weight vectors per tile: each unit of the reduction then loads 2 weight vectors
    /// and 6 (12) broadcasts for 12 (24) FMAs, within the two load ports' rate, where one
    /// vector of 12 (24) pixels loads more than it multiplies. Three vectors of 4 (8) pixels
    /// load 7 (11): RegNetY's groups of 24 channels (`bench-op mb1g2ic48ih56iw56oc48kh3ph1`)
    /// went from 52-80% of the avx2 peak to 77-91%, `mb1g5ic120ih14iw14oc120kh3ph1` from
    /// 50-66% to 73-94% (Zen3, three rounds alternated).
    fn wide_tile(d: &ConvDesc, oc_blocks: usize) -> Option<(usize, usize)> {
        // A fused pool's conv stage writes an nChw4c band whatever the destination, and the
        // weights are packed for it from this key.
        if d.isa == Isa::X128 || (d.dst_layout != Layout::Nchw4c && d.pool.is_none()) {
            return None;
        }
        let ratio = d.isa.target().lanes / LANES;
        let (pixels, vectors) = crate::tile::full_tile(d.isa);
        let accumulators = pixels * vectors;
        // A grouped tile stays within one group, whose output channels are whole wide
        // vectors (`ConvDesc::tier_for`): a tile across groups would reduce over both groups'
        // inputs, half of them by zero weights.
        let oc_blocks = if d.groups > 1 && !d.lanewise() {
            d.oc / d.groups / LANES
        } else {
            oc_blocks
        };
        // A 1x1 convolution without groups at avx2 takes three `ymm` by four pixels where
        // the blocks fill threes, would fill only single vectors otherwise, or are many
        // enough that a short last tile costs little (see `POINTWISE_SHORT_TILE_BLOCKS`).
        let pointwise = d.kh == 1
            && d.kw == 1
            && d.groups == 1
            && ratio == 2
            && oc_blocks >= 3 * ratio
            && (oc_blocks.is_multiple_of(3 * ratio)
                || oc_blocks % (2 * ratio) == ratio
                || oc_blocks >= POINTWISE_SHORT_TILE_BLOCKS);
        let vecs = if pointwise {
            3 * ratio
        } else if oc_blocks.is_multiple_of(ratio * vectors) {
            ratio * vectors
        } else if oc_blocks.is_multiple_of(3 * ratio) {
            // Three wide vectors and a third of the pixels: a unit loads 3 weight vectors and
            // 4 (8) broadcasts for 12 (24) FMAs, where one vector of 12 (24) pixels loads
            // 13 (25).
            3 * ratio
        } else if oc_blocks.is_multiple_of(ratio) {
            ratio
        } else if d.groups == 1 && oc_blocks > ratio * vectors {
            // Full tiles, and a short last one whose last vector is a tail.
            ratio * vectors
        } else {
            // A tail of one block at avx2 (its low half), of one to three at avx512.
            (1..=ratio * vectors)
                .rev()
                .find(|&v| oc_blocks.is_multiple_of(v) && (ratio == 4 || v % ratio <= 1))?
        };
        Some((vecs, accumulators / vecs.div_ceil(ratio)))
    }

    /// 4-lane vectors of the last output-channel tile: `vecs`, or the blocks left after the
    /// full tiles (a short tile of a wide plan, `ConvPlan::wide_tile`).
    pub fn last_tile_vecs(&self) -> usize {
        if self.lanewise {
            return self.vecs;
        }
        self.desc.oc.div_ceil(LANES) - (self.oc_tiles - 1) * self.vecs
    }

    /// Output-channel tiles of `vecs` vectors: all, or all but a short last one.
    pub fn full_oc_tiles(&self) -> usize {
        if self.last_tile_vecs() == self.vecs {
            self.oc_tiles
        } else {
            self.oc_tiles - 1
        }
    }

    /// 4-lane vectors per wide vector, when the tiles are wide: the plan's tier is wide and
    /// its tiling is the tier's (`ConvPlan::wide_tile`).
    pub fn wide_ratio(&self) -> Option<usize> {
        let ratio = self.desc.isa.target().lanes / LANES;
        if self.lanewise {
            return None;
        }
        Self::wide_tile(&self.desc, self.desc.oc.div_ceil(LANES))
            .filter(|&(vecs, _)| vecs == self.vecs)
            .map(|_| ratio)
    }

    /// Whether `floats` of packed weights let rows be the outer loop.
    fn weights_allow_rows_outer(floats: usize) -> bool {
        floats * std::mem::size_of::<f32>() <= ROWS_OUTER_WEIGHT_BYTES
    }

    /// How many accumulators a tile holds, given the FMAs each of them takes per trip of the
    /// innermost reduction loop (its unrolled kernel columns times the channels of a step).
    ///
    /// Every FMA leaves its sum in the register of its broadcast, so the accumulators rotate
    /// through the registers and the loop's back edge must put them back. With 12 of them
    /// (plus a weight vector and a broadcast: 14 of the 16 xmm registers) Cranelift's
    /// allocator does that with moves when a trip holds 12 FMAs per accumulator (3x3 kernels
    /// on `nChw4c`), but spills inside the loop when it holds fewer (4 for 1x1 kernels, 7 for
    /// a 7x7 kernel on `NCHW`); 10 accumulators leave it room. Measured on the trunk at
    /// W=320 (`primjit bench-op --model`): the 1x1 downsamples went from 60% to 72% of peak
    /// and conv1 from 85% to 89%, while the 3x3 layers lost 4 points with 10.
    fn accumulators(fmas_per_trip: usize) -> usize {
        if fmas_per_trip >= 12 { 12 } else { 10 }
    }

    /// How many input channels a chunk of the reduction covers.
    ///
    /// A pixel tile reads all of its output-channel tile's weights. When they exceed the L1
    /// cache (128 input channels of a 3x3 kernel take 36 KiB), each pixel tile of a row would
    /// fetch them again from L2. The reduction is then split into chunks whose weights fit
    /// ([`CHUNK_WEIGHT_BYTES`]), and a row runs all of its pixel tiles for one chunk before the
    /// next, keeping partial sums in the destination. The sums are stored and reloaded as f32,
    /// unchanged, so the result is bit for bit that of one chunk. Only `nChw4c` destinations
    /// are chunked (a partial sum is then one vector per pixel). Measured with `primjit
    /// bench-op`: 256-channel 3x3 layers 20 pixels wide went from 89% to 92% of peak; the
    /// 128-channel ones did not change, within the noise.
    fn chunk_len(d: &ConvDesc, len: usize, ic_step: usize, per_channel: usize) -> usize {
        if d.dst_layout != Layout::Nchw4c || len <= ic_step {
            return len;
        }
        (1..=len / ic_step)
            .filter(|&n| len.is_multiple_of(n) && (len / n).is_multiple_of(ic_step))
            .map(|n| len / n)
            .find(|&chunk| chunk * per_channel <= CHUNK_WEIGHT_BYTES)
            .unwrap_or(ic_step)
    }

    /// Chunks of the reduction per pixel tile.
    pub fn chunks(&self) -> usize {
        self.ic.len / self.ic_chunk
    }

    /// Output-channel tiles that one register tile of `pixels` pixels spans: 1 for a full
    /// tile, more for a narrow one (a border column, a row's remainder).
    ///
    /// Each accumulator is one chain of dependent FMAs, and a core needs about eight chains in
    /// flight (4 cycles of latency, 2 FMAs a cycle) to reach its peak: a 1-pixel tile of one
    /// output-channel vector ran at an eighth of it. Since every pixel must sum in one chain
    /// (bit-identity across tilings, see `conv::direct::pixel_tile`), a narrow tile takes more
    /// chains from the output channels instead: the tile of output-channel tile `t` (with `t`
    /// a multiple of the group) also computes tiles `t + 1 ..`, whose own narrow tiles are
    /// skipped. The group is the largest divisor of the tile count that keeps the tile within
    /// the full tile's accumulators (see `ConvPlan::accumulators`), taken only where the tile has
    /// fewer than 8 chains; an NCHW destination, whose last tile may store fewer lanes, and
    /// a grouped convolution, whose tiles read different input channels, keep groups of 1.
    pub fn narrow_group(&self, pixels: usize) -> usize {
        // A wide tile's chain is a wide vector: count in those. A tile whose last vector is
        // a tail keeps groups of 1: its vectors would straddle two tiles' weights.
        let ratio = self.wide_ratio().unwrap_or(1);
        if !self.vecs.is_multiple_of(ratio) {
            return 1;
        }
        let chains = pixels * self.vecs / ratio;
        // Tiles that read different input channels (grouped convolutions) cannot share one.
        let shared_input = self.ic.step == 0;
        if self.desc.dst_layout != Layout::Nchw4c
            || !shared_input
            || chains == 0
            || chains >= NARROW_CHAINS
        {
            return 1;
        }
        // Groups of full tiles: a short last tile computes alone.
        (1..=self.pixel_tile * self.vecs / ratio / chains)
            .rev()
            .find(|&g| self.full_oc_tiles().is_multiple_of(g))
            .unwrap_or(1)
    }

    /// Whether the kernel may write its output over its residual (its destination and its
    /// one residual being the same buffer). It may when the only read of the residual is the
    /// epilogue's (`conv::direct::epilogue`), which loads each residual element right before it
    /// stores the destination element at the same place, and nothing is stored to the
    /// destination before that: one `add` post-op, no fused pool (which computes into its
    /// band and pools from there), one chunk of the reduction (chunks keep partial sums in
    /// the destination), and an `nChw4c` destination.
    pub fn residual_in_place(&self) -> bool {
        let d = &self.desc;
        d.residuals() == 1
            && d.pool.is_none()
            && self.chunks() == 1
            && d.dst_layout == Layout::Nchw4c
    }

    /// Floats per output-channel tile of packed weights.
    pub fn tile_weights_len(&self) -> usize {
        self.weight_channels() * self.desc.kh * self.desc.kw * self.vecs * LANES
    }

    /// Where the padded bias starts in the packed weights.
    pub fn bias_offset(&self) -> usize {
        self.oc_tiles * self.tile_weights_len()
    }

    /// Where a PReLU post-op's slopes start in the packed weights: after the bias, padded
    /// like it. A tile's slopes are as far from its bias as these are from the bias.
    pub fn slopes_offset(&self) -> usize {
        self.bias_offset()
            + if self.desc.bias {
                self.desc.oc.div_ceil(LANES) * LANES
            } else {
                0
            }
    }

    /// Bytes from a tile's bias to its slopes: where a tile's channel parameters are one
    /// pointer, its slopes follow at this displacement (0 without a bias).
    pub fn slopes_disp(&self) -> i64 {
        ((self.slopes_offset() - self.bias_offset()) * size_of::<f32>()) as i64
    }

    /// Where the group masks start in the packed weights ([`Self::group_masks`]).
    pub fn mask_offset(&self) -> usize {
        self.slopes_offset()
            + if self.desc.prelu() {
                self.desc.oc.div_ceil(LANES) * LANES
            } else {
                0
            }
    }

    pub fn packed_weights_len(&self) -> usize {
        self.mask_offset()
            + if self.group_masks {
                self.bias_offset()
            } else {
                0
            }
    }

    /// Packs OIHW weights (and the bias, and a PReLU post-op's slopes) into the kernel's
    /// layout.
    ///
    /// Panics if `weights`, `bias` or `slopes` have the wrong length, or `slopes` are given
    /// without a PReLU post-op or missing with one; callers check first.
    pub fn pack_weights(
        &self,
        weights: &[f32],
        bias: Option<&[f32]>,
        slopes: Option<&[f32]>,
    ) -> Vec<f32> {
        let d = &self.desc;
        let [oc, icg, kh, kw] = d.weight_shape();
        assert_eq!(
            weights.len(),
            oc * icg * kh * kw,
            "weights must be OIHW {:?}",
            d.weight_shape()
        );
        let ocg = oc / d.groups;
        let tile_oc = self.vecs * LANES;
        let mut out = vec![0.0; self.packed_weights_len()];
        for o in (0..oc).filter(|_| self.lanewise) {
            let (t, lane) = (o / tile_oc, o % tile_oc);
            for tap in 0..kh * kw {
                out[t * self.tile_weights_len() + tap * tile_oc + lane] =
                    weights[o * kh * kw + tap];
            }
        }
        for t in (0..self.oc_tiles).filter(|_| !self.lanewise) {
            let ic_begin = self.ic.first(t);
            for ic_rel in 0..self.ic.len {
                let ic = ic_begin + ic_rel;
                for y in 0..kh {
                    for x in 0..kw {
                        for lane in 0..tile_oc {
                            let o = t * tile_oc + lane;
                            if o >= oc || ic >= d.ic {
                                continue;
                            }
                            let g = o / ocg;
                            let Some(i) = ic.checked_sub(g * icg).filter(|&i| i < icg) else {
                                continue;
                            };
                            let dst = t * self.tile_weights_len()
                                + ((ic_rel * kh + y) * kw + x) * tile_oc
                                + lane;
                            out[dst] = weights[((o * icg + i) * kh + y) * kw + x];
                            if self.group_masks {
                                out[self.mask_offset() + dst] = f32::from_bits(u32::MAX);
                            }
                        }
                    }
                }
            }
        }
        if let Some(b) = bias {
            assert_eq!(b.len(), oc, "bias must have {oc} values");
            out[self.bias_offset()..self.bias_offset() + oc].copy_from_slice(b);
        }
        pack_slopes(&mut out[self.slopes_offset()..], d, slopes);
        out
    }
}

/// Writes a PReLU post-op's slopes at the start of `out`, where the packing keeps them.
///
/// # Panics
///
/// If `slopes` are given without a PReLU post-op in `d` or missing with one, or are not `d.oc`
/// values.
pub(crate) fn pack_slopes(out: &mut [f32], d: &ConvDesc, slopes: Option<&[f32]>) {
    assert_eq!(
        slopes.is_some(),
        d.prelu(),
        "slopes are given exactly when the key has a prelu post-op"
    );
    if let Some(s) = slopes {
        assert_eq!(s.len(), d.oc, "one slope per output channel");
        out[..d.oc].copy_from_slice(s);
    }
}

fn fmt_runs(f: &mut fmt::Formatter<'_>, runs: &[AxisRun]) -> fmt::Result {
    for r in runs {
        write!(
            f,
            " [{}..{}) taps {}..{}",
            r.outputs.start, r.outputs.end, r.taps.start, r.taps.end
        )?;
        if r.count > 0 {
            write!(f, " count {}", r.count)?;
        }
        write!(f, ";")?;
    }
    Ok(())
}

fn fmt_axis(f: &mut fmt::Formatter<'_>, name: &str, axis: &AxisPlan, tile: usize) -> fmt::Result {
    match axis {
        AxisPlan::Fixed(runs) => {
            write!(f, "  {name} runs:")?;
            fmt_runs(f, runs)?;
            writeln!(f)
        }
        AxisPlan::PerOutput => writeln!(
            f,
            "  {name}s: runtime extent; each {name} computes its taps at run time"
        ),
        AxisPlan::Bordered { runs, interior } => {
            write!(f, "  {name} runs: interior")?;
            fmt_runs(f, std::slice::from_ref(&runs[*interior]))?;
            write!(f, " border")?;
            let borders: Vec<AxisRun> = runs
                .iter()
                .enumerate()
                .filter(|&(i, _)| i != *interior)
                .map(|(_, r)| r.clone())
                .collect();
            fmt_runs(f, &borders)?;
            writeln!(
                f,
                " in one loop, each {name} computing its taps at run time"
            )
        }
        AxisPlan::Template(t) => {
            writeln!(
                f,
                "  {name}s: runtime extent; template from {} inputs, taps computed per output below",
                t.min_input
            )?;
            write!(f, "    head:")?;
            fmt_runs(f, &t.head)?;
            writeln!(
                f,
                "\n    body: [{}..out-tail) taps {}..{}, {tile}-pixel tiles in a loop, remainder 1..{} by jump table",
                t.head_len(),
                t.body_taps.start,
                t.body_taps.end,
                tile.saturating_sub(1)
            )?;
            for (class, tail) in t.tails.iter().enumerate() {
                if t.tails.len() == 1 {
                    write!(f, "    tail:")?;
                } else {
                    write!(
                        f,
                        "    tail (input % {} == {class}, chosen by jump table):",
                        t.tails.len()
                    )?;
                }
                for r in tail {
                    write!(
                        f,
                        " [out-{}..out-{}) taps {}..{}",
                        r.back,
                        r.back - r.len,
                        r.taps.start,
                        r.taps.end
                    )?;
                    if r.count > 0 {
                        write!(f, " count {}", r.count)?;
                    }
                    write!(f, ";")?;
                }
                writeln!(f)?;
            }
            Ok(())
        }
    }
}

impl fmt::Display for ConvPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.tiles_per_item {
            Some(n) => writeln!(
                f,
                "  rows joined: all {}, one row of {} pixels; work items: {} parts of {} oc tile(s)",
                self.joined,
                self.desc.iw,
                self.work_items(),
                n
            )?,
            None if self.joined > 1 => writeln!(
                f,
                "  rows joined: {} at a time, {} rows of {} pixels",
                self.joined, self.desc.ih, self.desc.iw
            )?,
            None => {}
        }
        writeln!(
            f,
            "  conv tile: {} pixels x {} oc vectors ({} accumulators), {} oc tiles{}",
            self.pixel_tile,
            self.vecs,
            self.pixel_tile * self.vecs,
            self.oc_tiles,
            match self.last_tile_vecs() {
                v if v == self.vecs => String::new(),
                v => format!(", the last of {v} vectors"),
            }
        )?;
        if self.lanewise {
            writeln!(
                f,
                "  reduction: lane-wise, each output channel over its own input channel, kh loop, kw unrolled"
            )?;
            if let Some(chunks) = self.lanewise_row() {
                let calls: Vec<String> = chunks
                    .iter()
                    .map(|c| {
                        let partial = c.vectors.iter().filter(|v| v.pixels == 1).count();
                        let times = if c.repeat > 1 {
                            format!("{} x ", c.repeat)
                        } else {
                            String::new()
                        };
                        format!(
                            "{times}{} vectors ({partial} of one pixel)",
                            c.vectors.len()
                        )
                    })
                    .collect();
                writeln!(f, "  row calls: {}", calls.join(", "))?;
            }
        } else {
            writeln!(
                f,
                "  reduction: {} input channels per tile from {} (+{} per {} tile(s)), {} per step, kh loop, kw unrolled",
                self.ic.len, self.ic.begin, self.ic.step, self.ic.every, self.ic_step
            )?;
        }
        writeln!(
            f,
            "  loop order: {}",
            if self.tiles_per_item.is_some() {
                "one row, its output-channel tiles in parts"
            } else if self.rows_outer {
                "rows outer, output-channel tiles inner"
            } else if self.chunks_outer {
                "output-channel tiles outer, then chunks of the reduction, rows inner"
            } else {
                "output-channel tiles outer, rows inner"
            }
        )?;
        let grouped: Vec<String> = (1..self.pixel_tile)
            .filter_map(|p| {
                let g = self.narrow_group(p);
                (g > 1).then(|| format!("{p} px x {g}"))
            })
            .collect();
        if !grouped.is_empty() {
            writeln!(
                f,
                "  narrow tiles span output-channel tiles (pixels x tiles): {}",
                grouped.join(", ")
            )?;
        }
        if self.chunks() > 1 {
            writeln!(
                f,
                "  reduction chunks: {} of {} input channels ({} bytes of weights each), partial sums kept in the destination",
                self.chunks(),
                self.ic_chunk,
                self.ic_chunk * channel_weight_bytes(&self.desc, self.vecs)
            )?;
        }
        writeln!(
            f,
            "  packed weights: {} floats ({} per tile)",
            self.packed_weights_len(),
            self.tile_weights_len()
        )?;
        fmt_axis(f, "row", &self.rows, 1)?;
        fmt_axis(f, "column", &self.cols, self.pixel_tile)?;
        if let Some(tiles) = self.bordered_tiles() {
            let runs: Vec<String> = tiles
                .iter()
                .map(|t| {
                    let end = t.first + t.pixels * t.count;
                    let taps: Vec<String> = t
                        .taps
                        .iter()
                        .map(|k| format!("{}..{}", k.start, k.end))
                        .collect();
                    let spans = match self.bordered_group(t.pixels) {
                        1 => String::new(),
                        g => format!(", spanning {g} oc tiles"),
                    };
                    format!(
                        "[{}..{end}) {} x {} px (taps {}{spans})",
                        t.first,
                        t.count,
                        t.pixels,
                        taps.join(" ")
                    )
                })
                .collect();
            writeln!(f, "  pixel tiles, borders inside: {}", runs.join("; "))?;
        }
        Ok(())
    }
}

/// The tiling plan of a windowed pooling op: one vector of four channels per pixel, tiles of
/// `pixel_tile` pixels along a row, taps fully unrolled per run.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolPlan {
    pub desc: PoolDesc,
    pub pixel_tile: usize,
    pub rows: AxisPlan,
    pub cols: AxisPlan,
    /// Rows the source holds when it is a fused pool's scratch band (as
    /// [`ConvPlan::dst_rows`]).
    pub src_rows: Option<usize>,
    /// The destination's row pitch in pixels when it is a fused pool's pitched destination
    /// (`ConvDesc::pitches`), else dense rows.
    pub dst_pitch: Option<usize>,
}

/// The most kernel rows a pooling window unrolls; a taller window loops over its rows at run
/// time, one copy of a row's code for every output row.
///
/// Unrolled, each border run of rows had a copy of the window's code, every tap of every row
/// unrolled: the 5x5 stride-1 max pool of YOLO's SPPF compiled in 10.4 ms to 17 KB, the 13x13
/// of SPP in 223 ms to 507 KB (`primjit bench-op --pool`, Zen3). A kernel-row loop costs a few
/// scalar instructions per row against a row's `kw` x 4 loads and maxima.
pub const POOL_UNROLLED_ROWS: usize = 3;

impl PoolPlan {
    pub fn new(d: &PoolDesc) -> Self {
        let count = match (d.kind, d.count_include_pad) {
            (PoolKind::Max, _) => CountMode::None,
            (PoolKind::Avg, false) => CountMode::Valid,
            (PoolKind::Avg, true) => CountMode::Padded,
        };
        let [rows, cols] = pool_axes(d);
        let rows = if d.window.kernel[0] > POOL_UNROLLED_ROWS {
            AxisPlan::PerOutput
        } else {
            AxisPlan::rows(rows, d.runtime.h, count)
        };
        // At a wide tier a tile is the x64 backend's full `PoolTile` of consecutive pixels
        // (`LANEWISE_VECTORS` wide vectors), its leftovers 128-bit code.
        let pixel_tile = match d.isa {
            Isa::X128 => 4,
            wide => LANEWISE_VECTORS * (wide.target().lanes / LANES),
        };
        PoolPlan {
            desc: d.clone(),
            pixel_tile,
            rows,
            cols: AxisPlan::columns(cols, d.runtime.w, d.window.ceil_mode, count),
            src_rows: None,
            dst_pitch: None,
        }
    }
}

impl PoolPlan {
    /// The window's row and column axes at the key's extents (0 where runtime).
    pub fn window_axes(&self) -> [Axis; 2] {
        pool_axes(&self.desc)
    }

    /// The same plan at `x128`: the 128-bit tile that computes a wide tile's leftover pixels.
    pub fn x128(&self) -> PoolPlan {
        PoolPlan {
            desc: PoolDesc {
                isa: Isa::X128,
                ..self.desc.clone()
            },
            pixel_tile: 4,
            ..self.clone()
        }
    }

    /// Output pixels per wide vector where the tile is the x64 backend's
    /// ([`PoolDesc::tier_for`]): 2 at `avx2`, 4 at `avx512`.
    pub fn wide_ratio(&self) -> Option<usize> {
        match self.desc.isa {
            Isa::X128 => None,
            wide => Some(wide.target().lanes / LANES),
        }
    }
}

impl fmt::Display for PoolPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.wide_ratio() {
            Some(ratio) => writeln!(
                f,
                "  pool tile: {} pixels of one channel block, {} {} vectors of {ratio} pixels \
                 (x64 backend), column taps unrolled",
                self.pixel_tile,
                self.pixel_tile / ratio,
                self.desc.isa
            )?,
            None => writeln!(
                f,
                "  pool tile: {} pixels x 1 channel vector, column taps unrolled",
                self.pixel_tile
            )?,
        }
        fmt_axis(f, "row", &self.rows, 1)?;
        fmt_axis(f, "column", &self.cols, self.pixel_tile)
    }
}

/// Whether `key`'s kernel may write its output over its residual: a direct convolution whose
/// plan allows it ([`ConvPlan::residual_in_place`]), or a Winograd one with a single residual
/// (its output transform computes a tile's rows on the stack and reads each residual element
/// right before it stores the output element at the same place, `conv::winograd`; nothing
/// else of it writes the destination); no other kernel.
pub fn residual_in_place(key: &PrimitiveKey) -> bool {
    match key {
        PrimitiveKey::Conv(d) => match d.algo {
            crate::ConvAlgo::Direct => ConvPlan::new(d).residual_in_place(),
            crate::ConvAlgo::WinogradF4x3 => {
                d.residuals() == 1 && d.pool.is_none() && d.dst_layout == Layout::Nchw4c
            }
        },
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tap_intervals_clip_at_borders() {
        // 3 taps, pad 1, stride 1 over 5 inputs.
        assert_eq!(tap_interval(0, 5, 1, 3, 1, 1), 1..3);
        assert_eq!(tap_interval(2, 5, 1, 3, 1, 1), 0..3);
        assert_eq!(tap_interval(4, 5, 1, 3, 1, 1), 0..2);
        // Dilation 2, pad 2: taps at -2, 0, 2 for o = 0.
        assert_eq!(tap_interval(0, 3, 2, 3, 1, 2), 1..3);
        // Kernel larger than the input: only the middle tap lands for a 1-wide input.
        assert_eq!(tap_interval(0, 1, 2, 5, 1, 1), 2..3);
        // A window entirely in padding is empty.
        assert!(tap_interval(0, 1, 3, 2, 1, 1).is_empty());
    }

    /// The padded count in closed form agrees with counting the taps one by one, on every
    /// small axis (outputs past the last window included, as in ceil mode).
    #[test]
    fn padded_counts_match_counting_the_taps() {
        for input in 1..6usize {
            for (pad_begin, pad_end) in [(0, 0), (1, 0), (0, 2), (2, 1), (3, 3)] {
                for kernel in 1..6usize {
                    for stride in 1..4usize {
                        for dilation in 1..4usize {
                            let axis = Axis {
                                input,
                                output: 8,
                                pad_begin,
                                pad_end,
                                kernel,
                                stride,
                                dilation,
                            };
                            let mut got = vec![0; 8];
                            for r in axis.runs(CountMode::Padded) {
                                got[r.outputs].fill(r.count);
                            }
                            let want: Vec<usize> = (0..8)
                                .map(|o| {
                                    let start = (o * stride) as i64 - pad_begin as i64;
                                    (0..kernel as i64)
                                        .map(|k| start + k * dilation as i64)
                                        .filter(|&x| {
                                            x >= -(pad_begin as i64) && x < (input + pad_end) as i64
                                        })
                                        .count()
                                })
                                .collect();
                            assert_eq!(got, want, "{axis:?}");
                        }
                    }
                }
            }
        }
        // A window of 2^24 taps over 2^24 outputs plans at once.
        let huge = Axis {
            input: 1,
            output: 1 << 24,
            pad_begin: (1 << 24) - 1,
            pad_end: (1 << 24) - 1,
            kernel: 1 << 24,
            stride: 1,
            dilation: 1,
        };
        assert!(!huge.runs(CountMode::Padded).is_empty());
    }

    #[test]
    fn runs_group_the_interior() {
        let axis = Axis {
            input: 80,
            output: 80,
            pad_begin: 1,
            pad_end: 1,
            kernel: 3,
            stride: 1,
            dilation: 1,
        };
        let runs = axis.runs(CountMode::None);
        assert_eq!(runs.len(), 3);
        assert_eq!(
            runs[1],
            AxisRun {
                outputs: 1..79,
                taps: 0..3,
                count: 0
            }
        );
        let avg = Axis {
            input: 5,
            output: 3,
            pad_begin: 1,
            pad_end: 1,
            kernel: 3,
            stride: 2,
            dilation: 1,
        };
        let counts: Vec<usize> = avg
            .runs(CountMode::Padded)
            .iter()
            .map(|r| r.count)
            .collect();
        assert_eq!(
            counts,
            vec![3, 3, 3],
            "padded cells count; the taps still differ"
        );
        let counts: Vec<usize> = avg.runs(CountMode::Valid).iter().map(|r| r.count).collect();
        assert_eq!(counts, vec![2, 3, 2]);
    }

    #[test]
    fn convolution_rows_keep_the_interior_fixed_and_loop_over_the_borders() {
        let axis = |input: usize, pad_begin: usize, kernel: usize, stride: usize| Axis {
            input,
            output: (input + 2 * pad_begin - kernel) / stride + 1,
            pad_begin,
            pad_end: pad_begin,
            kernel,
            stride,
            dilation: 1,
        };
        // 3x3, pad 1: rows 0 and 79 are borders, the interior [1, 79) is run 1.
        let fixed = RuntimeDims::NONE;
        let AxisPlan::Bordered { runs, interior } = AxisPlan::conv_rows(axis(80, 1, 3, 1), fixed)
        else {
            panic!("a padded 3x3 conv has border rows");
        };
        assert_eq!((runs.len(), interior), (3, 1));
        assert_eq!(runs[interior].outputs, 1..79);
        // conv1, 7x7 stride 2 pad 3 over 320 rows: two top borders, one bottom border.
        let AxisPlan::Bordered { runs, interior } = AxisPlan::conv_rows(axis(320, 3, 7, 2), fixed)
        else {
            panic!("conv1 has border rows");
        };
        assert_eq!(runs[interior].outputs, 2..159);
        assert_eq!(runs.len(), 4);
        // No padding, or one border run: nothing to share. A runtime height computes every
        // row's taps; a runtime width keeps the runs apart.
        assert!(matches!(
            AxisPlan::conv_rows(axis(80, 0, 1, 2), fixed),
            AxisPlan::Fixed(r) if r.len() == 1
        ));
        assert!(matches!(
            AxisPlan::conv_rows(axis(80, 1, 3, 2), fixed),
            AxisPlan::Fixed(r) if r.len() == 2
        ));
        let runtime = |h, w| RuntimeDims { h, w };
        assert_eq!(
            AxisPlan::conv_rows(axis(80, 1, 3, 1), runtime(true, false)),
            AxisPlan::PerOutput
        );
        assert!(matches!(
            AxisPlan::conv_rows(axis(80, 1, 3, 1), runtime(false, true)),
            AxisPlan::Fixed(r) if r.len() == 3
        ));
    }

    /// Every small geometry: from its smallest width on, the template places the same taps
    /// (and divisor factors) as the fixed runs of that width, far past the probe extents.
    #[test]
    fn templates_hold_from_their_smallest_input() {
        for kernel in 1..=5 {
            for stride in 1..=3 {
                for dilation in 1..=2 {
                    for (pad_begin, pad_end) in [(0, 0), (1, 1), (2, 0), (0, 3), (3, 3)] {
                        for ceil in [false, true] {
                            let axis = Axis {
                                input: 0,
                                output: 0,
                                pad_begin,
                                pad_end,
                                kernel,
                                stride,
                                dilation,
                            };
                            for count in [CountMode::None, CountMode::Valid, CountMode::Padded] {
                                let t = AxisTemplate::new(axis, ceil, count);
                                for input in t.min_input..3 * template_probe(&axis) {
                                    let Some(output) = axis_output(&axis, input, ceil) else {
                                        continue;
                                    };
                                    let runs = Axis {
                                        input,
                                        output,
                                        ..axis
                                    }
                                    .runs(count);
                                    assert_eq!(
                                        t.instantiate(input, output),
                                        Some(expand(&runs)),
                                        "{axis:?} ceil {ceil} {count:?} at input {input}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn trunk_templates_start_at_small_widths() {
        // 3x3 pad 1: one clipped column at each end, from width 2 on.
        let axis = Axis {
            input: 0,
            output: 0,
            pad_begin: 1,
            pad_end: 1,
            kernel: 3,
            stride: 1,
            dilation: 1,
        };
        let t = AxisTemplate::new(axis, false, CountMode::None);
        assert_eq!(t.min_input, 2);
        assert_eq!((t.head_len(), t.tail_len(0)), (1, 1));
        // 7x7/2 pad 3: the tail depends on the width's parity.
        let t = AxisTemplate::new(
            Axis {
                kernel: 7,
                stride: 2,
                pad_begin: 3,
                pad_end: 3,
                ..axis
            },
            false,
            CountMode::None,
        );
        assert_eq!(t.tails.len(), 2);
        assert_ne!(t.tails[0], t.tails[1]);
    }

    /// The calls of a depthwise row at avx2: a 7-pixel row under a 5x5 kernel in one call, its
    /// border pixels one-pixel vectors with the taps their windows cover; a 112-pixel row as
    /// calls of 8 vectors, the interior's in a loop, the lone right border pixel joined to the
    /// call before it; x128 and runtime widths keep their column runs.
    #[test]
    fn depthwise_rows_at_a_wide_tier_are_calls_of_whole_vectors_and_border_pixels() {
        let depthwise = |w: usize, k: usize, isa: Isa| {
            let mut d = ConvDesc::new(1, 16, [5, w], 16, [k, k]);
            d.groups = 16;
            d.pads = primjit_ir::Pads::uniform(k / 2);
            d.src_layout = Layout::Nchw4c;
            d.dst_layout = Layout::Nchw4c;
            d.isa = isa;
            ConvPlan::new(&d)
        };
        let v = |first, pixels, taps| RowVector {
            first,
            pixels,
            taps,
        };
        let chunks = depthwise(7, 5, Isa::Avx2)
            .lanewise_row()
            .expect("a row plan");
        assert_eq!(
            chunks,
            [RowChunk {
                first: 0,
                repeat: 1,
                span: 7,
                vectors: vec![
                    v(0, 1, 2..5),
                    v(1, 1, 1..5),
                    v(2, 2, 0..5),
                    v(4, 1, 0..5),
                    v(5, 1, 0..4),
                    v(6, 1, 0..3),
                ],
            }]
        );
        let chunks = depthwise(112, 3, Isa::Avx2)
            .lanewise_row()
            .expect("a row plan");
        let shape: Vec<(usize, usize, usize, usize)> = chunks
            .iter()
            .map(|c| (c.first, c.repeat, c.span, c.vectors.len()))
            .collect();
        // 1 + 55 whole vectors + 1: 8, then 5 x 8, then the last 8 with the border pixel.
        assert_eq!(shape, [(0, 1, 15, 8), (15, 5, 16, 8), (95, 1, 17, 9)]);
        assert_eq!(chunks[1].vectors[7], v(14, 2, 0..3));
        assert_eq!(chunks[2].vectors[8], v(16, 1, 0..2));
        assert_eq!(depthwise(7, 5, Isa::X128).lanewise_row(), None);
    }

    #[test]
    fn a_7x7_pointwise_conv_is_one_row_whose_work_items_are_parts_of_its_tiles() {
        let pointwise = |[h, w]: [usize; 2], oc: usize, isa: Isa| {
            let mut d = ConvDesc::new(1, 1152, [h, w], oc, [1, 1]);
            d.src_layout = Layout::Nchw4c;
            d.dst_layout = Layout::Nchw4c;
            d.isa = isa;
            d
        };
        // EfficientNet-B0's 1152 -> 192 at 7x7: 8 tiles of three `ymm` by four pixels; the
        // row of 49 ends in one pixel, whose narrow tile spans 4 tiles, so parts are 4 tiles.
        let d = pointwise([7, 7], 192, Isa::Avx2);
        let plan = ConvPlan::new(&d);
        assert_eq!((plan.joined, plan.desc.ih, plan.desc.iw), (7, 1, 49));
        assert_eq!((plan.vecs, plan.pixel_tile, plan.oc_tiles), (6, 4, 8));
        assert_eq!(plan.narrow_group(1), 4);
        assert_eq!(plan.tiles_per_item, Some(4));
        assert_eq!(plan.work_items(), 2);
        assert_eq!(ConvPlan::work_items_of(&d), 2);
        assert_eq!(plan.item_outputs(1..2), (0..7, 96..192));
        assert_eq!(plan.item_outputs(0..2), (0..7, 0..192));
        assert_eq!(plan.item_outputs(1..1), (0..0, 0..0));
        // ResNet50's 2048 outputs: 86 tiles, the last of two vectors, each its own part.
        let d = pointwise([7, 7], 2048, Isa::Avx2);
        let plan = ConvPlan::new(&d);
        assert_eq!((plan.oc_tiles, plan.tiles_per_item), (86, Some(1)));
        assert_eq!(plan.item_outputs(85..86), (0..7, 2040..2048));
        // A row that divisors join keeps row items; one tile makes no two parts.
        let plan = ConvPlan::new(&pointwise([14, 14], 192, Isa::Avx2));
        assert_eq!(
            (plan.joined, plan.tiles_per_item, plan.work_items()),
            (2, None, 7)
        );
        let d = pointwise([7, 7], 24, Isa::Avx2);
        let plan = ConvPlan::new(&d);
        assert_eq!(
            (plan.joined, plan.tiles_per_item, plan.work_items()),
            (1, None, 7)
        );
        assert_eq!(ConvPlan::work_items_of(&d), 7);
        // Runtime extents keep their rows.
        let d = pointwise([7, 7], 192, Isa::Avx2)
            .with_runtime(crate::key::RuntimeDims { h: false, w: true });
        assert_eq!(ConvPlan::new(&d).tiles_per_item, None);
    }

    #[test]
    fn border_columns_join_the_pixel_tiles_of_fixed_width_rows_at_wide_tiers() {
        let conv = |ic: usize, [h, w]: [usize; 2], oc: usize, stride: usize, isa: Isa| {
            let mut d = ConvDesc::new(1, ic, [h, w], oc, [3, 3]);
            d.strides = [stride, stride];
            d.pads = primjit_ir::Pads::uniform(1);
            d.src_layout = Layout::Nchw4c;
            d.dst_layout = Layout::Nchw4c;
            d.isa = isa;
            ConvPlan::new(&d)
        };
        let sizes = |plan: &ConvPlan| -> Vec<(usize, usize, usize)> {
            let tiles = plan.bordered_tiles().expect("bordered tiles");
            tiles.iter().map(|t| (t.first, t.pixels, t.count)).collect()
        };
        // ResNet's 512-channel layers at 7x7: tiles of 6 pixels by two `ymm`; the 7-pixel
        // row is a tile of 4 (the left border inside) and one of 3 (the right), each over its
        // own output channels.
        let plan = conv(512, [7, 7], 512, 1, Isa::Avx2);
        assert_eq!((plan.pixel_tile, plan.vecs), (6, 4));
        assert!(plan.chunks_outer && !plan.rows_outer && plan.chunks() == 16);
        assert_eq!(sizes(&plan), [(0, 4, 1), (4, 3, 1)]);
        let tiles = plan.bordered_tiles().unwrap();
        assert_eq!(tiles[0].taps, [1..3, 0..3, 0..3, 0..3]);
        assert_eq!(tiles[1].taps, [0..3, 0..3, 0..2]);
        assert_eq!((plan.bordered_group(4), plan.bordered_group(3)), (1, 1));
        // Stride 2 from 14x14: only the left column is a border.
        let plan = conv(512, [14, 14], 512, 2, Isa::Avx2);
        assert_eq!(sizes(&plan), [(0, 4, 1), (4, 3, 1)]);
        assert_eq!(plan.bordered_tiles().unwrap()[1].taps, [0..3, 0..3, 0..3]);
        // Wider rows: full tiles in a loop, the borders in the first and last; a remainder
        // too narrow for its chains shares the last two tiles' pixels.
        let plan = conv(64, [14, 14], 64, 1, Isa::Avx2);
        assert!(plan.rows_outer && !plan.chunks_outer);
        assert_eq!(sizes(&plan), [(0, 6, 1), (6, 4, 1), (10, 4, 1)]);
        let plan = conv(64, [56, 56], 64, 1, Isa::Avx2);
        assert_eq!(sizes(&plan), [(0, 6, 1), (6, 6, 7), (48, 4, 1), (52, 4, 1)]);
        // A row narrower than a tile: one tile, spanning output-channel tiles where it holds
        // too few chains.
        let plan = conv(64, [2, 2], 64, 1, Isa::Avx2);
        assert_eq!(sizes(&plan), [(0, 2, 1)]);
        assert_eq!(plan.bordered_group(2), plan.narrow_group(2));
        assert!(plan.bordered_group(2) > 1);
        // No borders, x128, runtime widths: column runs.
        let mut d = conv(64, [9, 9], 64, 1, Isa::Avx2).desc;
        d.pads = primjit_ir::Pads::uniform(0);
        assert_eq!(ConvPlan::new(&d).bordered_tiles(), None);
        assert_eq!(conv(64, [7, 7], 64, 1, Isa::X128).bordered_tiles(), None);
        let d = conv(64, [7, 7], 64, 1, Isa::Avx2)
            .desc
            .with_runtime(crate::key::RuntimeDims { h: false, w: true });
        assert_eq!(ConvPlan::new(&d).bordered_tiles(), None);
    }

    #[test]
    fn depthwise_tiles_reduce_over_their_own_channels() {
        let mut d = ConvDesc::new(1, 16, [5, 5], 16, [3, 3]);
        d.groups = 16;
        d.src_layout = Layout::Nchw4c;
        let plan = ConvPlan::new(&d);
        // Depthwise: lane-wise tiles of one vector, each over its own block, packing each
        // lane's own channel's taps only.
        assert!(plan.lanewise);
        assert_eq!((plan.vecs, plan.oc_tiles, plan.chunks()), (1, 4, 1));
        assert_eq!(
            plan.ic,
            IcRange {
                begin: 0,
                len: 4,
                step: 4,
                every: 1
            }
        );
        let weights: Vec<f32> = (0..16 * 9).map(|i| i as f32).collect();
        let packed = plan.pack_weights(&weights, None, None);
        assert_eq!(packed.len(), 16 * 9);
        // Tile 2, tap (1, 2), lane 3: channel 11's tap 5.
        assert_eq!(packed[2 * 36 + 5 * 4 + 3], (11 * 9 + 5) as f32);
        // A PReLU post-op's slopes follow the bias, padded like it, as far from it as each
        // tile's are from its own.
        let mut with_slopes = d.clone();
        with_slopes.bias = true;
        with_slopes.post_ops = vec![crate::key::PostOpDesc::PRelu];
        let plan = ConvPlan::new(&with_slopes);
        let (bias, slopes): (Vec<f32>, Vec<f32>) = (0..16).map(|c| (c as f32, -(c as f32))).unzip();
        let packed = plan.pack_weights(&weights, Some(&bias), Some(&slopes));
        assert_eq!(packed.len(), 16 * 9 + 16 + 16);
        assert_eq!(plan.slopes_offset(), plan.bias_offset() + 16);
        assert_eq!(plan.slopes_disp(), 16 * 4);
        assert_eq!(packed[plan.slopes_offset() + 11], -11.0);
        // A depthwise conv on NCHW, or with two outputs per channel, broadcasts.
        d.src_layout = Layout::Nchw;
        assert!(!ConvPlan::new(&d).lanewise);
        // Tiles of one vector over groups of 2 output channels and 1 input channel: two
        // tiles share each block of the input.
        let mut d = ConvDesc::new(1, 8, [5, 5], 16, [3, 3]);
        d.groups = 8;
        d.src_layout = Layout::Nchw4c;
        let plan = ConvPlan::new(&d);
        assert!(!plan.lanewise);
        assert_eq!(plan.vecs, 1);
        assert_eq!(
            plan.ic,
            IcRange {
                begin: 0,
                len: 4,
                step: 4,
                every: 2
            }
        );
        // ResNeXt's groups of 16 channels: two tiles of 8 per group.
        let mut d = ConvDesc::new(1, 64, [5, 5], 64, [3, 3]);
        d.groups = 4;
        d.src_layout = Layout::Nchw4c;
        let plan = ConvPlan::new(&d);
        assert_eq!((plan.vecs, plan.ic.first(3), plan.ic.len), (2, 16, 16));
        // Tiles of 8 output channels over groups of 3 straddle groups irregularly: the
        // reduction falls back to every channel.
        let mut d = ConvDesc::new(1, 16, [5, 5], 24, [1, 1]);
        d.groups = 8;
        let plan = ConvPlan::new(&d);
        assert_eq!(
            plan.ic,
            IcRange {
                begin: 0,
                len: 16,
                step: 0,
                every: 1
            }
        );
    }

    #[test]
    fn narrow_tiles_take_their_chains_from_output_channel_tiles() {
        let conv = |ic: usize, oc: usize, groups: usize, dst: Layout| {
            let mut d = ConvDesc::new(1, ic, [20, 20], oc, [3, 3]);
            d.groups = groups;
            d.strides = [2, 2];
            d.src_layout = Layout::Nchw4c;
            d.dst_layout = dst;
            ConvPlan::new(&d)
        };
        // layer3.0.conv1: 12 pixels x 1 vector, 64 tiles; a tile of p pixels takes the
        // largest divisor of 64 within 12 / p tiles, up to 7 pixels (7 chains).
        let p = conv(128, 256, 1, Layout::Nchw4c);
        assert_eq!((p.pixel_tile, p.vecs, p.oc_tiles), (12, 1, 64));
        let groups: Vec<usize> = (1..=12).map(|px| p.narrow_group(px)).collect();
        assert_eq!(groups, [8, 4, 4, 2, 2, 2, 1, 1, 1, 1, 1, 1]);
        // Three tiles of four channels: a group is all three or none.
        let p = conv(8, 12, 1, Layout::Nchw4c);
        assert_eq!((p.vecs, p.oc_tiles), (1, 3));
        assert_eq!(p.narrow_group(1), 3);
        assert_eq!(p.narrow_group(4), 3);
        assert_eq!(p.narrow_group(5), 1);
        // No group across tiles that read other input channels, or store partial lanes.
        assert_eq!(conv(16, 16, 2, Layout::Nchw4c).narrow_group(1), 1);
        assert_eq!(conv(16, 16, 1, Layout::Nchw).narrow_group(1), 1);
    }

    #[test]
    fn one_channel_vector_exactly_where_rows_are_outer() {
        let conv = |ic: usize, oc: usize, k: usize| {
            let mut d = ConvDesc::new(1, ic, [20, 20], oc, [k, k]);
            d.bias = true;
            d.src_layout = Layout::Nchw4c;
            d.dst_layout = Layout::Nchw4c;
            ConvPlan::new(&d)
        };
        let tile = |p: &ConvPlan| (p.pixel_tile, p.vecs, p.rows_outer);
        // The trunk: 3x3 layers up to 128 channels, 12 x 1; 256 channels and 1x1, two vectors.
        assert_eq!(tile(&conv(64, 64, 3)), (12, 1, true));
        assert_eq!(tile(&conv(128, 128, 3)), (12, 1, true));
        assert_eq!(tile(&conv(256, 256, 3)), (6, 2, false));
        assert_eq!(tile(&conv(64, 128, 1)), (5, 2, true));
        // Across the weight limit the two choices switch at the same input channel count.
        let flips =
            |f: fn(&ConvPlan) -> bool| (4..=256).step_by(4).find(|&ic| f(&conv(ic, 256, 3)));
        let two_vectors = flips(|p| p.vecs == 2);
        assert!(two_vectors.is_some());
        assert_eq!(two_vectors, flips(|p| !p.rows_outer));
    }

    #[test]
    fn blocks_that_fill_no_whole_wide_vectors_take_full_tiles_and_a_short_last_one() {
        let plan = |oc: usize, isa: Isa| {
            let mut d = ConvDesc::new(1, 116, [14, 14], oc, [1, 1]);
            d.src_layout = Layout::Nchw4c;
            d.dst_layout = Layout::Nchw4c;
            d.isa = isa;
            let p = ConvPlan::new(&d);
            (p.vecs, p.oc_tiles, p.last_tile_vecs(), p.full_oc_tiles())
        };
        // 29 blocks: 7 tiles of two `ymm` and one of a block; 3 of two `zmm` and one of 5.
        assert_eq!(plan(116, Isa::Avx2), (4, 8, 1, 7));
        assert_eq!(plan(116, Isa::Avx512), (8, 4, 5, 3));
        // 15 blocks at avx2: 3 full tiles and one of a `ymm` and a half.
        assert_eq!(plan(58, Isa::Avx2), (4, 4, 3, 3));
        // Whole wide vectors, or blocks that fit one tile, keep uniform tiles.
        assert_eq!(plan(120, Isa::Avx2), (6, 5, 6, 5));
        assert_eq!(plan(12, Isa::Avx2), (3, 1, 3, 1));
        // The 128-bit tiling's tiles are uniform.
        let (vecs, tiles, last, _) = plan(116, Isa::X128);
        assert_eq!(vecs * tiles, 29);
        assert_eq!(last, vecs);
    }
}
