//! Width-streamed (depth-first) execution: the convolutions at the start of a graph run in
//! column bands, and each keeps only the columns its consumers still need.
//!
//! The early layers of a CNN on wide inputs hold the largest activations (the trunk's layer1
//! tensors are 39 MB each at W=7680), but each output column reads only a few input columns.
//! A [`Segment`] is a prefix of the graph's nodes, every one a convolution (post-ops and a
//! fused max pool included) that reads graph inputs or values of the segment. A run
//! [`schedule`](Segment::schedule)s it as calls of each node's kernel on a range of its output columns:
//!
//! - The conv's window (and its pool's) maps the output columns to the input columns they
//!   read. A call runs on exactly those columns, with the node's own padding on a side where
//!   the range reaches the image's border and none elsewhere. Each output element is then
//!   computed from the same inputs, with the same taps in the same order, as in a
//!   whole-tensor run: the results are the same to the bit.
//! - Ranges start at multiples of [`COLUMN_ALIGN`] in every node's output, so Winograd's
//!   4-wide tiles fall where they fall in a whole-tensor run.
//! - A value read only inside the segment lives in a *window*: a buffer of its rows with a
//!   fixed row pitch ([`Schedule::window_pitch`]) that holds the columns a consumer may still
//!   read, about a band and its halo. Kernels take row pitches (`primjit_codegen::Pitches`),
//!   so a call reads its input and residual columns where they lie and writes its output
//!   columns into its window, whose rows move along the image with no copy: a column stays
//!   where it was written until no consumer reads it (`Window` in graph/streamed.rs). A value read
//!   after the segment, or a graph output, is written into a whole tensor; graph inputs and
//!   whole tensors are copied in.
//! - A conv that writes its output over its residual in a whole-tensor run (the residual's
//!   last reader, with a kernel that reads each residual element right before it writes the
//!   output element there) writes it over the residual's window too, when the schedule shows
//!   that the residual's other readers are past each call's columns: a residual block's
//!   input, its output and the next block's output share one window ([`Schedule::home`]).
//!
//! The first node advances by the band per sweep, every other node by at most the band
//! scaled to its own width and only as far as its inputs allow, so the chain moves through
//! the image together.

use std::fmt;

use primjit_codegen::{ConvDesc, Layout, Pitches, PrimitiveKey};
use primjit_ir::{Conv2d, Graph, Op, PostOp, Shapes, Value, conv_output_extent};

use crate::engine::Engine;

/// Every call's first output column is a multiple of this, in every node's own columns:
/// the width of a Winograd F(4x4, 3x3) tile.
pub const COLUMN_ALIGN: usize = 4;

/// A window's row pitch is its widest extent rounded up to a multiple of this many columns,
/// so that the pitch, part of its kernels' keys, stays the same over most image widths
/// (whose rounding moves the windows by a few columns) and a width-generic model compiles
/// its band kernels once.
pub const PITCH_ALIGN: usize = 16;

/// A run streams only an image more than this many bands wide. Each band costs calls and
/// copies of its halo; a narrower image's whole tensors are small (10 MB on the trunk at
/// W=1024, against 79 MB at W=7680), and streaming the calls just above one band (W=260 on
/// the trunk) slowed the workload's median call by 10%.
pub const MIN_BANDS: usize = 4;

/// A conv streams only if its band calls read its weights from memory at most this many
/// times as often per flop as its whole-tensor call. A Winograd kernel whose transformed
/// weights stream from beyond L2 reads them once per block of tiles, and a band call has fewer
/// tiles. On the trunk at W=7680 with bands of 64 columns (`streaming_cost --nodes`, 2
/// threads): layer2's stride-1 convs (80 tiles a call, 1.25 times the reads) ran at 1.00-1.13
/// of their whole-tensor time, layer3.0.conv2 (20 tiles, 2.5 times) at 1.20-1.30; left out of
/// the segment, it ran at 0.94-1.07, and the segment's peak rose from 26.4 to 34.8 MB
/// (docs/decisions/009-when-and-where-to-stream.md). The bound lies between the two measured
/// ratios; at W=4246, layer3.0.conv2's bands of 20 columns give 1.91. With the default
/// band of 128 columns, layer3.0.conv2's calls have 40 tiles (1.25 times) and stream.
pub const MAX_BAND_WEIGHT_READS: f64 = 1.5;

/// How a compiled graph runs its leading convolutions: in column bands of a given width, or
/// as whole tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Streaming {
    /// Columns of the first streamed node's output per band (a positive multiple of
    /// [`COLUMN_ALIGN`]), or `None` for whole tensors.
    band: Option<usize>,
    /// A run streams only if its whole tensors would take more than this many bytes at once.
    above: usize,
}

impl Streaming {
    /// 128 columns: on the trunk at W=7680 the segment then runs through layer3.0.conv2 and
    /// holds 38.1 MB at its peak (64 columns: 34.8 MB, the segment ending before
    /// layer3.0.conv2), under the 40 MB it must hold; and its streamed calls ran about 1%
    /// faster than with 64, compared call by call in one process (five rounds, either side
    /// as the reference): conv1, layer1 and layer2 gained more in fewer, wider calls (303 a
    /// call at W=7680 against 556) than layer3.0.conv2 lost in bands (1.11-1.13 of its time
    /// whole in bands of 64; docs/decisions/010-bands-of-128-columns.md).
    pub const DEFAULT_BAND: usize = 128;

    /// 32 MiB: streaming costs a call more, in more and smaller kernel calls (2-5% of a wide
    /// call of the trunk on 2 threads), worth paying only where whole tensors would
    /// be large. On the workload, the calls wider than 3,260 columns stream: 8 of the first
    /// 100, 55% of the time.
    pub const DEFAULT_ABOVE: usize = 32 << 20;

    /// Streaming with the default band, for runs whose whole tensors would pass
    /// [`Self::DEFAULT_ABOVE`].
    pub const ON: Streaming = Streaming {
        band: Some(Self::DEFAULT_BAND),
        above: Self::DEFAULT_ABOVE,
    };

    /// Whole tensors.
    pub const OFF: Streaming = Streaming {
        band: None,
        above: 0,
    };

    /// Streaming in bands of `band` columns, which must be a positive multiple of
    /// [`COLUMN_ALIGN`] and at most [`MAX_BAND`], for runs whose whole tensors would pass
    /// [`Self::DEFAULT_ABOVE`].
    pub fn with_band(band: usize) -> Result<Streaming, InvalidBand> {
        if band == 0 || !band.is_multiple_of(COLUMN_ALIGN) || band > MAX_BAND {
            return Err(InvalidBand(band));
        }
        Ok(Streaming {
            band: Some(band),
            above: Self::DEFAULT_ABOVE,
        })
    }

    /// The same streaming for runs whose whole tensors would take more than `bytes` at once
    /// (0: every run more than [`MIN_BANDS`] bands wide).
    pub fn above(self, bytes: usize) -> Streaming {
        Streaming {
            above: bytes,
            ..self
        }
    }

    /// The band's columns, or `None` when off.
    pub fn band(self) -> Option<usize> {
        self.band
    }

    /// The whole-tensor bytes above which a run streams.
    pub fn threshold(self) -> usize {
        self.above
    }

    /// `on` or `off`, as the command line spells it.
    pub fn name(self) -> &'static str {
        match self.band {
            Some(_) => "on",
            None => "off",
        }
    }
}

/// The widest band: no tensor is wider (the IR caps a tensor at `MAX_TENSOR_ELEMENTS`), and
/// the schedule's products of band and width stay far from overflowing.
pub const MAX_BAND: usize = primjit_ir::MAX_TENSOR_ELEMENTS as usize;

/// A band width that is not a positive multiple of [`COLUMN_ALIGN`] up to [`MAX_BAND`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("a band of {0} columns: expected a positive multiple of {COLUMN_ALIGN} up to {MAX_BAND}")]
pub struct InvalidBand(pub usize);

/// Not `on` or `off`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown streaming setting `{0}`: expected on or off")]
pub struct UnknownStreaming(pub String);

impl std::str::FromStr for Streaming {
    type Err = UnknownStreaming;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "on" => Ok(Streaming::ON),
            "off" => Ok(Streaming::OFF),
            other => Err(UnknownStreaming(other.to_string())),
        }
    }
}

/// One axis of a window: kernel extent, stride, dilation and leading padding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Axis {
    kernel: usize,
    stride: usize,
    dilation: usize,
    pad_begin: usize,
}

impl Axis {
    /// The input columns `[begin, end)` that output columns `[x0, x1)` read, counting padding
    /// as columns: `begin` may be negative and `end` may pass the input's width.
    fn reads(&self, x0: usize, x1: usize) -> (i64, i64) {
        debug_assert!(x1 > x0);
        let begin = (x0 * self.stride) as i64 - self.pad_begin as i64;
        let last = (x1 - 1) * self.stride + self.dilation * (self.kernel - 1);
        (begin, last as i64 + 1 - self.pad_begin as i64)
    }
}

/// The input columns one call reads and the padding it gets on each side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BandInput {
    /// First and one-past-last input column.
    pub begin: usize,
    pub end: usize,
    /// The conv's left and right padding in this call: the node's own where the range reaches
    /// the image's border, else 0.
    pub pads: [usize; 2],
    /// The same for the fused pool's window, over the conv's output.
    pub pool_pads: [usize; 2],
}

/// One node of a segment, as its schedule sees it: widths and windows along the width axis.
#[derive(Clone, Debug)]
pub struct SegmentNode {
    /// The node's index in the graph.
    pub node: usize,
    pub input: Value,
    /// Values added by `add` post-ops, read at the output's own columns.
    pub residuals: Vec<Value>,
    pub output: Value,
    conv: Axis,
    pool: Option<Axis>,
    in_width: usize,
    /// The conv's output width (before a fused pool).
    conv_width: usize,
    out_width: usize,
}

impl SegmentNode {
    /// What computing output columns `[x0, x1)` reads.
    pub fn band_input(&self, x0: usize, x1: usize) -> BandInput {
        let clip = |(b, e): (i64, i64), width: usize| {
            let begin = b.max(0) as usize;
            let end = (e.min(width as i64)) as usize;
            (
                begin,
                end,
                [(-b).max(0) as usize, (e - width as i64).max(0) as usize],
            )
        };
        let (c0, c1, pool_pads) = match self.pool {
            Some(pool) => clip(pool.reads(x0, x1), self.conv_width),
            None => (x0, x1, [0, 0]),
        };
        let (begin, end, pads) = clip(self.conv.reads(c0, c1), self.in_width);
        BandInput {
            begin,
            end,
            pads,
            pool_pads,
        }
    }

    /// The largest `x1` in `(x0, limit]` whose input range ends by `available`, or `x0`.
    fn reachable(&self, x0: usize, limit: usize, available: usize) -> usize {
        let mut x1 = limit;
        while x1 > x0 && self.band_input(x0, x1).end > available {
            x1 -= 1;
        }
        x1
    }

    pub fn out_width(&self) -> usize {
        self.out_width
    }

    /// The most columns one call computes: `band` (the first node's) scaled to this node's
    /// width, in whole tiles.
    fn own_band(&self, band: usize, first_width: usize) -> usize {
        (band * self.out_width)
            .div_ceil(first_width.max(1))
            .next_multiple_of(COLUMN_ALIGN)
    }

    /// How many times as often per flop this node's band calls read its weights from memory
    /// as a whole-tensor call does (`whole`: its fixed-shape key at the run's extents; see
    /// `ConvDesc::streamed_weight_bytes`); 1 where the weights stay in cache.
    fn band_weight_reads(&self, whole: &ConvDesc, band: usize, first_width: usize) -> f64 {
        let cols = self.own_band(band, first_width).min(self.out_width);
        if cols == 0 {
            return 1.0;
        }
        let band = self.band_desc(whole, &self.band_input(0, cols));
        let per_flop = |d: &ConvDesc| d.streamed_weight_bytes() as f64 / d.flops().max(1) as f64;
        match per_flop(whole) {
            0.0 => 1.0,
            w => per_flop(&band) / w,
        }
    }

    /// The fixed-shape key of the call computing output columns `[x0, x1)`, from the node's
    /// whole-width fixed-shape key.
    pub fn band_desc(&self, whole: &ConvDesc, band: &BandInput) -> ConvDesc {
        let mut d = whole.clone();
        d.iw = band.end - band.begin;
        d.pads.left = band.pads[0];
        d.pads.right = band.pads[1];
        if let Some(pool) = d.pool.as_mut() {
            pool.pads.left = band.pool_pads[0];
            pool.pads.right = band.pool_pads[1];
        }
        d
    }
}

/// A prefix of a graph's nodes that can run in column bands, with the values it writes whole.
#[derive(Clone, Debug)]
pub struct Segment {
    pub nodes: Vec<SegmentNode>,
    /// Per node of the segment: whether its output is read after the segment or is a graph
    /// output, and so is written into a whole tensor rather than a window.
    pub whole: Vec<bool>,
    /// The most bytes of whole tensors alive at once in a run that does not stream.
    pub unstreamed_bytes: usize,
    /// Per node: the node whose output its conv may write its own over (its only residual,
    /// which no later node reads: `plan_segment`'s `overwrites`), where both values live in
    /// windows. The schedule decides whether it does ([`Schedule::home`]).
    pub overwrites: Vec<Option<usize>>,
    /// The node right after the segment, where that node could not stream because its band
    /// calls would read its weights more than [`MAX_BAND_WEIGHT_READS`] times as often per
    /// flop as a whole call: its graph index and that ratio.
    pub ends_before: Option<(usize, f64)>,
}

/// One kernel call of a schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call {
    /// The node's index in the segment.
    pub node: usize,
    /// The output columns it computes.
    pub x0: usize,
    pub x1: usize,
    pub input: BandInput,
    /// For a windowed output: the first of its columns that a later call still reads, when
    /// this call runs; the bands before it can go.
    pub keep_from: usize,
}

/// A segment's calls at one input width, and what its windows hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    pub calls: Vec<Call>,
    /// Per node of the segment: the most columns of its output that consumers may still read
    /// at once, its window (0 for a whole output).
    pub window_columns: Vec<usize>,
    /// Per node of the segment: the row pitch of its window's buffer, in columns: its window
    /// rounded up to [`PITCH_ALIGN`] (0 for a whole output).
    pub window_pitch: Vec<usize>,
    /// Passes over the segment's nodes.
    pub sweeps: usize,
    /// Per node of the segment: the node whose output it writes its own over, as the schedule
    /// does (see [`Schedule::home`]).
    pub overwrites: Vec<Option<usize>>,
}

/// The node whose window holds node `i`'s output, given which node each writes its output
/// over: the first of the chain of residuals that `i` writes over.
fn home_of(overwrites: &[Option<usize>], mut i: usize) -> usize {
    while let Some(p) = overwrites[i] {
        i = p;
    }
    i
}

/// Which leading nodes of `graph` stream in bands of `band` columns, at the concrete `shapes`
/// of a run: of the longest prefix of convolutions that read graph inputs or earlier nodes (a
/// fused pool in floor mode) and whose band calls do not reread their weights much more often
/// than whole calls ([`MAX_BAND_WEIGHT_READS`]), the shortest that holds the fewest
/// activation bytes at once:
/// the larger of the unstreamed rest's peak and what the segment holds (the whole tensors it
/// writes for the rest, and an estimate of its windows). The graph's nodes of a prefix are
/// nodes `0..k`. `None` when no node can stream.
///
/// `keys` gives the nodes' keys (as the run compiles them, in graph order), `last_use`, per
/// value, the index of the last node reading it (`usize::MAX` for graph outputs), and
/// `overwrites`, per node, the residual its conv writes its output over (whose
/// buffer, or window, it then takes instead of a new one): the caller's, where liveness and
/// the node's kernel allow it.
pub fn plan_segment(
    graph: &Graph,
    shapes: &Shapes,
    keys: &[(String, PrimitiveKey)],
    last_use: &[usize],
    overwrites: &[Option<Value>],
    band: usize,
) -> Option<Segment> {
    let shape = |v: Value| {
        let s = shapes.concrete(v)?;
        Some([s[0], s[1], s[2], s[3]])
    };
    let (mut chain, ends_before) = streamable_chain(graph, &shape, keys, band);
    if chain.is_empty() {
        return None;
    }
    let bytes = |v: Value| shape(v).map_or(0, |s| Layout::Nchw4c.buffer_len(s) * 4);
    let footprint = Footprint::new(graph, &chain, last_use, overwrites, band, &bytes);
    let cut = footprint.best_cut();
    let unstreamed_bytes = footprint.rest_peak(0);
    chain.truncate(cut);
    let whole: Vec<bool> = chain
        .iter()
        .map(|n| last_use[n.output.index()] >= cut || last_use[n.output.index()] == usize::MAX)
        .collect();
    // Residuals are produced by earlier nodes of the segment (checked in `streamable_chain`).
    let segment_overwrites = chain
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let r = overwrites[n.node]?;
            let p = chain.iter().position(|m| m.output == r)?;
            (!whole[i] && !whole[p]).then_some(p)
        })
        .collect();
    Some(Segment {
        nodes: chain,
        whole,
        unstreamed_bytes,
        overwrites: segment_overwrites,
        ends_before: ends_before.filter(|&(i, _)| i == cut),
    })
}

/// The longest prefix of `graph`'s nodes that [`plan_segment`] may stream in bands of `band`
/// columns, and the node right after it with its band weight reads where those ended it.
fn streamable_chain(
    graph: &Graph,
    shape: &impl Fn(Value) -> Option<[usize; 4]>,
    keys: &[(String, PrimitiveKey)],
    band: usize,
) -> (Vec<SegmentNode>, Option<(usize, f64)>) {
    let is_input = |v: Value| graph.inputs().iter().any(|i| i.value == v);
    let mut chain: Vec<SegmentNode> = Vec::new();
    for (i, (_, node)) in graph.nodes().enumerate() {
        let Op::Conv2d(c) = &node.op else { break };
        let Some(node) = segment_node(graph, i, c, node.result, shape) else {
            break;
        };
        // Residuals are read in nChw4c, so they come from the segment; inputs may be graph
        // inputs too, read where the caller has them.
        let produced = |v: Value| chain.iter().any(|n| n.output == v);
        if !(is_input(node.input) || produced(node.input))
            || !node.residuals.iter().all(|&r| produced(r))
        {
            break;
        }
        let Some((_, PrimitiveKey::Conv(whole))) = keys.get(i) else {
            break;
        };
        let first_width = chain.first().unwrap_or(&node).out_width;
        let [_, _, ih, iw] = shape(c.input).expect("segment_node read the input's shape");
        let reads = node.band_weight_reads(&whole.at([ih, iw]), band, first_width);
        if reads > MAX_BAND_WEIGHT_READS {
            return (chain, Some((i, reads)));
        }
        chain.push(node);
    }
    (chain, None)
}

/// Node `i`, convolution `c` with output `result`, as a segment sees it along the width axis;
/// `None` where it cannot run in bands: a fused pool in ceil mode, a shape that is not
/// concrete, or output columns that read only padding.
fn segment_node(
    graph: &Graph,
    i: usize,
    c: &Conv2d,
    result: Value,
    shape: &impl Fn(Value) -> Option<[usize; 4]>,
) -> Option<SegmentNode> {
    let pool = c.post_ops.iter().find_map(|p| match p {
        PostOp::MaxPool(w) => Some(*w),
        _ => None,
    });
    if pool.is_some_and(|w| w.ceil_mode) {
        return None;
    }
    let residuals: Vec<Value> = c
        .post_ops
        .iter()
        .filter_map(|p| match p {
            PostOp::Add(r) => Some(*r),
            _ => None,
        })
        .collect();
    let (src, dst) = (shape(c.input)?, shape(result)?);
    let weight = &graph.param(c.weight).shape;
    let kw = weight[3];
    // The padding at this run's extents (an `auto_pad` conv's depends on them): the node's
    // key has the same, and band calls take the side of it they reach.
    let pads = c.pads_at([weight[2], kw], [src[2], src[3]])?;
    // A conv padded by its whole window or more has output columns that read only
    // padding: no band of input columns computes them, so it runs whole.
    let extent = c.dilations[1].saturating_mul(kw.saturating_sub(1)) + 1;
    if pads.left >= extent || pads.right >= extent {
        return None;
    }
    let conv_width = conv_output_extent(
        src[3],
        pads.left,
        pads.right,
        kw,
        c.strides[1],
        c.dilations[1],
    )?;
    Some(SegmentNode {
        node: i,
        input: c.input,
        residuals,
        output: result,
        conv: Axis {
            kernel: kw,
            stride: c.strides[1],
            dilation: c.dilations[1],
            pad_begin: pads.left,
        },
        pool: pool.map(|w| Axis {
            kernel: w.kernel[1],
            stride: w.strides[1],
            dilation: w.dilations[1],
            pad_begin: w.pads.left,
        }),
        in_width: src[3],
        conv_width,
        out_width: dst[3],
    })
}

/// The activation bytes a run holds at once when the first `cut` nodes of a chain stream:
/// what [`plan_segment`] minimizes over the cut.
struct Footprint<'a> {
    chain: &'a [SegmentNode],
    last_use: &'a [usize],
    overwrites: &'a [Option<Value>],
    band: usize,
    /// A value's bytes as a whole nChw4c tensor.
    bytes: &'a dyn Fn(Value) -> usize,
    /// Per node `i`: the most bytes of whole tensors alive while node `i` or a later one runs
    /// unstreamed (one more entry, 0, past the last node).
    suffix_peak: Vec<usize>,
}

impl<'a> Footprint<'a> {
    fn new(
        graph: &Graph,
        chain: &'a [SegmentNode],
        last_use: &'a [usize],
        overwrites: &'a [Option<Value>],
        band: usize,
        bytes: &'a dyn Fn(Value) -> usize,
    ) -> Self {
        // Bytes of the whole tensors alive while each node runs, when nodes [0, cut) stream:
        // the values read later that the segment writes, and every value of the rest.
        let outputs: Vec<Value> = graph.nodes().map(|(_, n)| n.result).collect();
        // The bytes alive while node i runs do not depend on the cut (for i at or after it),
        // so the rest's peak for every cut is a suffix maximum, computed once per run.
        let live_at: Vec<usize> = outputs
            .iter()
            .enumerate()
            .map(|(i, &out)| {
                let live: usize = outputs[..i]
                    .iter()
                    .filter(|v| last_use[v.index()] >= i)
                    .map(|&v| bytes(v))
                    .sum();
                live + if overwrites[i].is_some() {
                    0
                } else {
                    bytes(out)
                }
            })
            .collect();
        let mut suffix_peak = vec![0; live_at.len() + 1];
        for i in (0..live_at.len()).rev() {
            suffix_peak[i] = suffix_peak[i + 1].max(live_at[i]);
        }
        Footprint {
            chain,
            last_use,
            overwrites,
            band,
            bytes,
            suffix_peak,
        }
    }

    /// The peak of the unstreamed rest, nodes `cut..`.
    fn rest_peak(&self, cut: usize) -> usize {
        self.suffix_peak[cut]
    }

    /// The values a cut leaves to whole tensors: those the segment writes and the rest reads.
    fn crossing(&self, cut: usize) -> usize {
        self.chain[..cut]
            .iter()
            .filter(|n| self.last_use[n.output.index()] >= cut)
            .map(|n| (self.bytes)(n.output))
            .sum()
    }

    /// The windows of the values the segment keeps to itself: a band (scaled to the value's
    /// width) and a few columns of halo and lag each, and a row's width over which the rows
    /// advance (see `Window` in graph/streamed.rs). A value written over its residual adds its
    /// lag to the residual's window instead.
    fn windows(&self, cut: usize) -> usize {
        let first = self.chain[0].out_width.max(1);
        self.chain[..cut]
            .iter()
            .filter(|n| self.last_use[n.output.index()] < cut)
            .map(|n| {
                let column = (self.bytes)(n.output) / n.out_width.max(1);
                if self.overwrites[n.node].is_some() {
                    return column * 2 * COLUMN_ALIGN;
                }
                let columns = self.band * n.out_width / first + 2 * COLUMN_ALIGN;
                let row = Layout::Nchw4c.buffer_len([1, 1, 1, n.out_width]) * 4;
                column * columns + row
            })
            .sum()
    }

    /// The shortest cut (at least one node) that holds the fewest bytes at once: the larger
    /// of the rest's peak and what the segment holds.
    fn best_cut(&self) -> usize {
        (1..=self.chain.len())
            .min_by_key(|&k| {
                let (rest, crossing) = (self.rest_peak(k), self.crossing(k));
                (rest.max(crossing + self.windows(k)), k)
            })
            .expect("a non-empty chain")
    }
}

/// The segment a run streams with `streaming`, and its band: [`plan_segment`]'s, where
/// streaming is on and pays ([`Segment::pays_at`]); else `None`.
pub fn streamed_segment(
    graph: &Graph,
    shapes: &Shapes,
    keys: &[(String, PrimitiveKey)],
    last_use: &[usize],
    overwrites: &[Option<Value>],
    streaming: Streaming,
) -> Option<(Segment, usize)> {
    let band = streaming.band()?;
    plan_segment(graph, shapes, keys, last_use, overwrites, band)
        .filter(|s| s.pays_at(band, streaming.threshold()))
        .map(|s| (s, band))
}

impl Segment {
    /// The first node's output width.
    pub fn width(&self) -> usize {
        self.nodes[0].out_width
    }

    /// Whether a run streams with bands of `band` columns, holding whole tensors of at most
    /// `above` bytes otherwise: only where the first node's output is wider than
    /// [`MIN_BANDS`] bands and the whole tensors would take more than `above`.
    pub fn pays_at(&self, band: usize, above: usize) -> bool {
        self.width() > MIN_BANDS * band && self.unstreamed_bytes > above
    }

    /// The segment's calls with bands of `band` columns of the first node's output (a
    /// multiple of [`COLUMN_ALIGN`]). A node writes its output over its residual's window
    /// ([`Segment::overwrites`]) unless one of its calls would overwrite residual columns that
    /// another node still reads; it then gets a window of its own.
    pub fn schedule(&self, band: usize) -> Schedule {
        let mut overwrites = self.overwrites.clone();
        loop {
            match self.schedule_with(band, &overwrites) {
                Ok(schedule) => return schedule,
                Err(node) => overwrites[node] = None,
            }
        }
    }

    /// [`Self::schedule`] with the nodes in `overwrites` writing over their residuals, or the
    /// first of them that cannot.
    fn schedule_with(&self, band: usize, overwrites: &[Option<usize>]) -> Result<Schedule, usize> {
        debug_assert!(band > 0 && band.is_multiple_of(COLUMN_ALIGN));
        let n = self.nodes.len();
        let home: Vec<usize> = (0..n).map(|i| home_of(overwrites, i)).collect();
        let index_of = |v: Value| self.nodes.iter().position(|s| s.output == v);
        let mut done = vec![0usize; n];
        let mut window_columns = vec![0usize; n];
        let mut calls = Vec::new();
        let mut sweeps = 0;
        let first_width = self.nodes[0].out_width.max(1);
        // The columns of a value that a node can read: all of a graph input, what a node of
        // the segment has produced so far.
        let available = |done: &[usize], v: Value| index_of(v).map(|j| done[j]);
        while done.iter().zip(&self.nodes).any(|(d, s)| *d < s.out_width) {
            sweeps += 1;
            let mut progress = false;
            for i in 0..n {
                let s = &self.nodes[i];
                let x0 = done[i];
                if x0 == s.out_width {
                    continue;
                }
                // Every node advances by at most a band scaled to its width, so that a node
                // lagging behind its inputs catches up over several sweeps rather than in one
                // wide call (which would widen every window it reads and writes).
                let mut x1 = (x0 + s.own_band(band, first_width)).min(s.out_width);
                if let Some(a) = available(&done, s.input)
                    && a < self.nodes[index_of(s.input).expect("in segment")].out_width
                {
                    x1 = s.reachable(x0, x1, a);
                }
                for &r in &s.residuals {
                    if let Some(j) = index_of(r)
                        && done[j] < self.nodes[j].out_width
                    {
                        x1 = x1.min(done[j]);
                    }
                }
                if x1 < s.out_width {
                    x1 -= x1 % COLUMN_ALIGN;
                }
                if x1 <= x0 {
                    continue;
                }
                // Writing over the residual's columns [x0, x1) needs its other readers past
                // them; the node's own read of each element comes right before its write.
                if let Some(p) = overwrites[i]
                    && self.keep_from(p, &done, Some(i)) < x1
                {
                    return Err(i);
                }
                // A window keeps the columns still read of every value it holds.
                let keep_from = if self.whole[i] {
                    0
                } else {
                    (0..n)
                        .filter(|&j| home[j] == home[i])
                        .map(|j| self.keep_from(j, &done, None))
                        .min()
                        .unwrap_or(usize::MAX)
                        .min(x0)
                };
                if !self.whole[i] {
                    let h = home[i];
                    window_columns[h] = window_columns[h].max(x1 - keep_from);
                }
                calls.push(Call {
                    node: i,
                    x0,
                    x1,
                    input: s.band_input(x0, x1),
                    keep_from,
                });
                done[i] = x1;
                progress = true;
            }
            // The first unfinished node reads only finished values, so it reaches its width.
            assert!(progress, "a band schedule always advances");
        }
        let window_pitch = window_columns
            .iter()
            .map(|&c| c.next_multiple_of(PITCH_ALIGN))
            .collect();
        Ok(Schedule {
            calls,
            window_columns,
            window_pitch,
            sweeps,
            overwrites: overwrites.to_vec(),
        })
    }

    /// The node of the segment that writes `v` into a window: a value of the segment that is
    /// not written whole. Its window is the one of its home ([`Schedule::window_of`]).
    pub fn windowed(&self, v: Value) -> Option<usize> {
        self.nodes
            .iter()
            .position(|t| t.output == v)
            .filter(|&j| !self.whole[j])
    }

    /// The key of `call` in `schedule`: its node's whole-width key (`whole`, on an input of
    /// `extents`) with the call's width and padding ([`band_key`]), reading its input and
    /// writing its output at the row pitches of the windows they lie in. A conv (a fused
    /// pool's pooled rows included) writes at its window's pitch or, for a whole output, at its
    /// residuals' (which it reads at its destination's pitch; a residual in a window of
    /// another pitch is copied), and its own columns are then copied into the whole tensor.
    pub fn call_key(
        &self,
        schedule: &Schedule,
        call: &Call,
        whole: &PrimitiveKey,
        extents: [usize; 2],
    ) -> PrimitiveKey {
        let s = &self.nodes[call.node];
        let mut key = band_key(s, whole, extents, &call.input);
        let PrimitiveKey::Conv(desc) = &mut key else {
            unreachable!("segments hold convolutions")
        };
        let pitch = |v: Value| {
            schedule
                .window_of(self, v)
                .map(|j| schedule.window_pitch[j])
        };
        desc.pitches = Pitches {
            src: pitch(s.input),
            dst: pitch(s.output).or_else(|| s.residuals.iter().find_map(|&r| pitch(r))),
        };
        key
    }

    /// The first column of node `i`'s output that a consumer in the segment still reads,
    /// given how far each node has got (`done`): the smallest start of the consumers' next
    /// calls, leaving out node `except`'s reads of it as a residual; `usize::MAX` when none
    /// remains.
    fn keep_from(&self, i: usize, done: &[usize], except: Option<usize>) -> usize {
        let v = self.nodes[i].output;
        self.nodes
            .iter()
            .zip(done)
            .enumerate()
            .filter(|(_, (c, d))| **d < c.out_width)
            .flat_map(|(j, (c, &d))| {
                let as_input = (c.input == v).then(|| c.band_input(d, d + 1).begin);
                let as_residual = (c.residuals.contains(&v) && except != Some(j)).then_some(d);
                as_input.into_iter().chain(as_residual)
            })
            .min()
            .unwrap_or(usize::MAX)
    }
}

impl Schedule {
    /// The node whose window holds node `i`'s output. A conv that writes its output over its
    /// residual (`Segment::overwrites`, where the schedule allows it) shares its residual's
    /// window: the residual's readers other than the conv are past the columns each of its
    /// calls writes, and the conv reads each residual element right before it writes the
    /// output element at the same place. Only a node that is its own home has a window, whose
    /// columns and pitch cover every value it holds.
    pub fn home(&self, i: usize) -> usize {
        home_of(&self.overwrites, i)
    }

    /// The node whose window holds `v`, a value of `segment` not written whole: its
    /// producer's home.
    pub fn window_of(&self, segment: &Segment, v: Value) -> Option<usize> {
        segment.windowed(v).map(|j| self.home(j))
    }

    /// The residual that node `i` writes its output over, in its window.
    pub fn overwritten(&self, segment: &Segment, i: usize) -> Option<Value> {
        self.overwrites[i].map(|p| segment.nodes[p].output)
    }
}

/// What a streamed segment of a run held and did, for [`crate::RunStats`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SegmentRun {
    /// The names of the segment's first and last nodes.
    pub first: String,
    pub last: String,
    /// The band width, in columns of the first node's output.
    pub band: usize,
    pub sweeps: usize,
    pub calls: usize,
    /// The most bytes of bands held at once for the values read only inside the segment.
    pub window_bytes: usize,
    /// Bytes of the whole tensors the segment writes (values read after it, outputs).
    pub whole_bytes: usize,
    /// The most bytes of bands, whole tensors and per-call copies alive at once.
    pub peak_bytes: usize,
}

impl fmt::Display for SegmentRun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "streamed %{}..%{}: band {} columns, {} sweeps, {} calls, windows {} bytes, \
             whole tensors {} bytes, peak {} bytes",
            self.first,
            self.last,
            self.band,
            self.sweeps,
            self.calls,
            self.window_bytes,
            self.whole_bytes,
            self.peak_bytes
        )
    }
}

/// A fixed-shape conv key as the call of a streamed node: `whole`'s key with the band's
/// width and padding, keeping `whole`'s runtime extents if it has them.
pub fn band_key(
    node: &SegmentNode,
    whole: &PrimitiveKey,
    extents: [usize; 2],
    band: &BandInput,
) -> PrimitiveKey {
    let PrimitiveKey::Conv(d) = whole else {
        unreachable!("segments hold convolutions")
    };
    let runtime = d.runtime;
    let fixed = if runtime.any() {
        d.at(extents)
    } else {
        d.clone()
    };
    PrimitiveKey::Conv(node.band_desc(&fixed, band).with_runtime(runtime))
}

/// One side of a [`copy_columns`]: rows of pixels in `data`, `pitch` pixels apart, from
/// column `col` on.
pub struct Columns<B> {
    pub data: B,
    pub pitch: usize,
    pub col: usize,
}

/// Copies `cols` columns of `rows` rows of `elem` floats per pixel from `src` to `dst`, the
/// rows shared among the engine's threads. A buffer may end where its last row's columns do.
pub fn copy_columns(
    src: Columns<&[f32]>,
    dst: Columns<&mut [f32]>,
    cols: usize,
    rows: usize,
    elem: usize,
    engine: &Engine,
) {
    use rayon::prelude::*;
    let Columns {
        data: src,
        pitch: src_width,
        col: src_col,
    } = src;
    let Columns {
        data: dst,
        pitch: dst_width,
        col: dst_col,
    } = dst;
    let len = cols * elem;
    if len == 0 || rows == 0 {
        return;
    }
    let copy_row = |(d, s): (&mut [f32], &[f32])| {
        d[dst_col * elem..][..len].copy_from_slice(&s[src_col * elem..][..len]);
    };
    if !engine.uses_pool() {
        // A run on its caller's thread alone, or a one-thread engine.
        dst.chunks_mut(dst_width * elem)
            .zip(src.chunks(src_width * elem))
            .take(rows)
            .for_each(copy_row);
        return;
    }
    engine.install(|| {
        dst.par_chunks_mut(dst_width * elem)
            .zip(src.par_chunks(src_width * elem))
            .take(rows)
            .with_min_len(64)
            .for_each(copy_row);
    });
}

/// Floats per pixel and rows of a tensor of `shape` in `layout`, as [`copy_columns`] sees it.
pub fn rows_and_elem(layout: Layout, [n, c, h, _]: [usize; 4]) -> (usize, usize) {
    match layout {
        Layout::Nchw => (n * c * h, 1),
        Layout::Nchw4c => (n * c.div_ceil(4) * h, 4),
    }
}
