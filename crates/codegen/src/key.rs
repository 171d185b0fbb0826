//! Primitive keys: validated, hashable descriptions of one kernel with every shape fixed.
//!
//! A key plays the role of oneDNN's op descriptor: two calls with equal keys can share one
//! compiled kernel. Keys print as benchdnn-style one-liners (`Display`), which the cache's
//! verbose lines and `dump` use.
//!
//! Data only: fields, shapes and the checks that need no plan. What a kernel needs besides (its
//! tier, buffers, scratch, packed weights, work items) is the plans' to say (`contract`), so
//! this module imports only the tiers and the tiles' shapes.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Range;

/// The window of a fused pool ([`ConvDesc::pool`]), the IR's own.
pub use primjit_ir::PoolWindow;
/// The activations of post-ops and element-wise keys, and the binary ops, the IR's own.
pub use primjit_ir::{Activation, BinaryKind};
/// `resize`'s modes, the IR's own.
pub use primjit_ir::{CoordMode, NearestMode, ResizeMode, ScaleFactor};
use primjit_ir::{MAX_TENSOR_ELEMENTS, Pads, PoolKind, conv_output_extent, pool_output_extent};

use crate::target::Isa;
pub use crate::tile::WidePattern;
use crate::tile::{GEMM_UNROLL, GROUP_TILES, GROUP_VECTORS};

/// The memory layout of an activation tensor.
///
/// `Nchw` is the public layout. `Nchw4c` (oneDNN's `nChw4c`) groups channels by four, the
/// width of an f32x4 vector: element `(n, c, h, w)` lives at
/// `(((n * C4 + c / 4) * H + h) * W + w) * 4 + c % 4` where `C4 = ceil(C / 4)`. The lanes of a
/// last, partial block are padding; kernels write them and read them only against zero weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Layout {
    Nchw,
    Nchw4c,
}

impl Layout {
    /// The number of f32 elements a buffer of this layout holds for the given shape.
    pub fn buffer_len(self, [n, c, h, w]: [usize; 4]) -> usize {
        match self {
            Layout::Nchw => n * c * h * w,
            Layout::Nchw4c => n * c.div_ceil(4) * 4 * h * w,
        }
    }

    /// The number of f32 elements a buffer of this layout holds for the given shape when its
    /// rows are `pitch` pixels apart ([`Pitches`]): every row but the last spans the pitch,
    /// the last only its `w` pixels, so that the buffer may end where the last row does.
    pub fn pitched_len(self, [n, c, h, w]: [usize; 4], pitch: usize) -> usize {
        let (rows, elem) = match self {
            Layout::Nchw => (n * c * h, 1),
            Layout::Nchw4c => (n * c.div_ceil(4) * h, 4),
        };
        match rows {
            0 => 0,
            _ => ((rows - 1) * pitch + w) * elem,
        }
    }

    /// The element offset of `(n, c, h, w)`.
    pub fn offset(
        self,
        [_, c_total, h_total, w_total]: [usize; 4],
        [n, c, h, w]: [usize; 4],
    ) -> usize {
        match self {
            Layout::Nchw => ((n * c_total + c) * h_total + h) * w_total + w,
            Layout::Nchw4c => {
                (((n * c_total.div_ceil(4) + c / 4) * h_total + h) * w_total + w) * 4 + c % 4
            }
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Layout::Nchw => "nchw",
            Layout::Nchw4c => "nChw4c",
        }
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A post-op of a convolution key. `Add` reads one extra buffer of the output's shape and
/// layout; the kernel reads the residual buffers in the order of the `Add`s.
#[derive(Clone, Copy, Debug)]
pub enum PostOpDesc {
    Relu,
    Add,
    Clip {
        lo: f32,
        hi: f32,
    },
    /// An activation; its attributes compare and hash by their bits.
    Act(Activation),
    /// `x < 0 ? slope[c] * x : x`, one slope per output channel. The slopes are data, not
    /// key: they are packed with the weights, after the bias. A conv key takes at most one.
    PRelu,
}

impl PartialEq for PostOpDesc {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (PostOpDesc::Relu, PostOpDesc::Relu)
            | (PostOpDesc::Add, PostOpDesc::Add)
            | (PostOpDesc::PRelu, PostOpDesc::PRelu) => true,
            (PostOpDesc::Clip { lo: a, hi: b }, PostOpDesc::Clip { lo: c, hi: d }) => {
                a.to_bits() == c.to_bits() && b.to_bits() == d.to_bits()
            }
            (PostOpDesc::Act(a), PostOpDesc::Act(b)) => a == b,
            _ => false,
        }
    }
}

impl Eq for PostOpDesc {}

impl Hash for PostOpDesc {
    fn hash<H: Hasher>(&self, state: &mut H) {
        std::mem::discriminant(self).hash(state);
        if let PostOpDesc::Clip { lo, hi } = self {
            lo.to_bits().hash(state);
            hi.to_bits().hash(state);
        }
        if let PostOpDesc::Act(a) = self {
            a.hash(state);
        }
    }
}

impl fmt::Display for PostOpDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PostOpDesc::Relu => f.write_str("relu"),
            PostOpDesc::Add => f.write_str("add"),
            PostOpDesc::PRelu => f.write_str("prelu"),
            PostOpDesc::Clip { lo, hi } => write!(f, "clip:{lo:?}:{hi:?}"),
            PostOpDesc::Act(a) => write_activation(f, a),
        }
    }
}

/// An activation as a one-liner writes it: its name, then its attributes after colons
/// (`hardsigmoid:0.2:0.5`).
fn write_activation(f: &mut fmt::Formatter<'_>, a: &Activation) -> fmt::Result {
    f.write_str(a.name())?;
    for (_, v) in a.attrs() {
        write!(f, ":{v:?}")?;
    }
    Ok(())
}

/// Which spatial extents of a key are runtime values (convolutions, pooling, element-wise
/// ops, concatenations, resizes and transposed convolutions).
///
/// A runtime extent is not part of the key: its field holds 0, the kernel reads the call's
/// extent from its `extents` argument, and one compiled kernel serves every extent. The other
/// axis, channels, window, strides, pads, dilations, post-ops and tiles stay specialized.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RuntimeDims {
    pub h: bool,
    pub w: bool,
}

impl RuntimeDims {
    pub const NONE: RuntimeDims = RuntimeDims { h: false, w: false };

    pub fn any(self) -> bool {
        self.h || self.w
    }

    /// `[ih, iw]` with each runtime extent replaced by 0, as keys hold them.
    fn erase(self, [ih, iw]: [usize; 2]) -> [usize; 2] {
        [if self.h { 0 } else { ih }, if self.w { 0 } else { iw }]
    }

    /// A key's `fixed` extents with each runtime one taken from the call's `extents`.
    fn fill(self, fixed: [usize; 2], extents: [usize; 2]) -> [usize; 2] {
        [
            if self.h { extents[0] } else { fixed[0] },
            if self.w { extents[1] } else { fixed[1] },
        ]
    }
}

impl fmt::Display for RuntimeDims {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match (self.h, self.w) {
            (false, false) => "none",
            (true, false) => "h",
            (false, true) => "w",
            (true, true) => "hw",
        })
    }
}

/// `with_runtime` and `at` of a descriptor whose input height and width are the places `$h`
/// and `$w` of `self` (a resize's, which also cover its sizes, are its own).
macro_rules! runtime_extents {
    ($desc:ty, [$($h:tt)+], [$($w:tt)+]) => {
        impl $desc {
            /// The same key with the extents `runtime` names left to run time (their fields
            /// hold 0).
            pub fn with_runtime(mut self, runtime: RuntimeDims) -> Self {
                [self.$($h)+, self.$($w)+] = runtime.erase([self.$($h)+, self.$($w)+]);
                self.runtime = runtime;
                self
            }

            /// The fixed-shape key one call computes: the runtime extents take `extents`'
            /// values, the fixed ones keep theirs.
            pub fn at(&self, extents: [usize; 2]) -> Self {
                let mut d = self.clone();
                [d.$($h)+, d.$($w)+] = d.runtime.fill([d.$($h)+, d.$($w)+], extents);
                d.runtime = RuntimeDims::NONE;
                d
            }
        }
    };
}

runtime_extents!(ConvDesc, [ih], [iw]);
runtime_extents!(PoolDesc, [ih], [iw]);
runtime_extents!(GlobalPoolDesc, [ih], [iw]);
runtime_extents!(EltwiseDesc, [shape[2]], [shape[3]]);
runtime_extents!(ConcatDesc, [h], [w]);
runtime_extents!(ConvTransposeDesc, [ih], [iw]);

/// The extents of one call of a key with runtime extents: its input's `[h, w]`, and its
/// output's for a resize to sizes (another value's extents), the one key whose output's do
/// not follow from its input's. A fixed key's call passes none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallExtents {
    pub input: [usize; 2],
    pub output: Option<[usize; 2]>,
}

impl From<[usize; 2]> for CallExtents {
    fn from(input: [usize; 2]) -> Self {
        CallExtents {
            input,
            output: None,
        }
    }
}

/// How a convolution is computed. Part of the key: the two algorithms take different packed
/// weights and scratch, and round differently.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ConvAlgo {
    /// Direct convolution: register-tiled FMAs over the kernel taps (any window).
    #[default]
    Direct,
    /// Winograd F(4x4, 3x3) (Lavin & Gray 2016): 6x6 input tiles with stride 4, 36
    /// independent GEMMs over channels, and an output transform that applies the bias and the
    /// post-ops; at stride 2, its polyphase form: 9x9 input tiles with stride 8 and 81 GEMMs
    /// (`conv::winograd::Form`). 3x3 kernels with strides 1 or 2 (the same on both axes) and
    /// unit dilations, no groups, `nChw4c` in and out, no fused pool.
    WinogradF4x3,
}

impl ConvAlgo {
    /// The name in a key's one-liner (`alg:wino_f4x3`), in the style of benchdnn's `alg=wino`.
    pub fn name(self) -> &'static str {
        match self {
            ConvAlgo::Direct => "direct",
            ConvAlgo::WinogradF4x3 => "wino_f4x3",
        }
    }
}

impl fmt::Display for ConvAlgo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Row pitches of a conv's activations, in pixels: how far apart the rows of the source and of
/// the destination (and its residuals, which share its geometry) are. `None` is dense, rows
/// as wide as the tensor. A pitched buffer is a window of columns of a wider one, which a
/// width-streamed run reads and writes in place; an NCHW plane is `h` such rows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Pitches {
    pub src: Option<usize>,
    pub dst: Option<usize>,
}

impl Pitches {
    /// Dense rows on both sides.
    pub const DENSE: Pitches = Pitches {
        src: None,
        dst: None,
    };
}

/// A 2-D convolution. Every extent is fixed except those `runtime` names.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConvDesc {
    pub mb: usize,
    pub ic: usize,
    pub ih: usize,
    pub iw: usize,
    pub oc: usize,
    pub kh: usize,
    pub kw: usize,
    pub strides: [usize; 2],
    pub dilations: [usize; 2],
    pub pads: Pads,
    pub groups: usize,
    pub bias: bool,
    pub post_ops: Vec<PostOpDesc>,
    /// A max pooling of the output after the post-ops, fused into the kernel: the destination
    /// has the pooled shape, and the full-resolution output exists only a few rows at a time,
    /// in a scratch buffer of [`ConvDesc::scratch_len`] floats per thread.
    pub pool: Option<PoolWindow>,
    pub src_layout: Layout,
    pub dst_layout: Layout,
    pub runtime: RuntimeDims,
    pub algo: ConvAlgo,
    /// Row pitches of the source and destination; dense unless a caller works on windows.
    pub pitches: Pitches,
    /// The vector tier of the register tiles (`Isa::X128` unless a wide tier applies, see
    /// [`ConvDesc::tier_for`]); it also shapes the tiles, and so the packed weights.
    pub isa: Isa,
}

impl ConvDesc {
    /// A dense convolution with unit strides and dilations, no padding, NCHW in and out.
    pub fn new(
        mb: usize,
        ic: usize,
        [ih, iw]: [usize; 2],
        oc: usize,
        [kh, kw]: [usize; 2],
    ) -> Self {
        ConvDesc {
            mb,
            ic,
            ih,
            iw,
            oc,
            kh,
            kw,
            strides: [1, 1],
            dilations: [1, 1],
            pads: Pads::default(),
            groups: 1,
            bias: false,
            post_ops: Vec::new(),
            pool: None,
            src_layout: Layout::Nchw,
            dst_layout: Layout::Nchw,
            runtime: RuntimeDims::NONE,
            algo: ConvAlgo::Direct,
            pitches: Pitches::DENSE,
            isa: Isa::X128,
        }
    }

    /// Whether each output channel reduces over its own input channel alone: a depthwise
    /// convolution (one input and one output channel per group) on an `nChw4c` source, whose
    /// blocks of four channels are then the input vectors of lane-wise FMAs.
    pub fn lanewise(&self) -> bool {
        self.groups > 1
            && self.groups == self.ic
            && self.groups == self.oc
            && self.src_layout == Layout::Nchw4c
    }

    /// The source's row pitch in pixels: its own, or the width when dense.
    pub fn src_pitch(&self) -> usize {
        self.pitches.src.unwrap_or(self.iw)
    }

    /// The destination's (and residuals') row pitch in pixels: its own, or the width when
    /// dense.
    pub fn dst_pitch(&self) -> usize {
        self.pitches.dst.unwrap_or(self.dst_shape()[3])
    }

    /// Why Winograd F(4x4, 3x3) cannot compute this convolution, or `None` when it can.
    pub fn winograd_unsupported(&self) -> Option<&'static str> {
        if (self.kh, self.kw) != (3, 3) {
            Some("winograd F(4x4, 3x3) needs a 3x3 kernel")
        } else if !matches!(self.strides, [1, 1] | [2, 2]) {
            Some("winograd F(4x4, 3x3) needs strides of 1 and 1 or of 2 and 2")
        } else if self.dilations != [1, 1] {
            Some("winograd F(4x4, 3x3) needs unit dilations")
        } else if self.groups != 1 {
            Some("winograd F(4x4, 3x3) does not support groups")
        } else if self.pool.is_some() {
            Some("winograd F(4x4, 3x3) does not support a fused pool")
        } else if self.src_layout != Layout::Nchw4c || self.dst_layout != Layout::Nchw4c {
            Some("winograd F(4x4, 3x3) needs nChw4c source and destination")
        } else {
            None
        }
    }

    pub fn oh(&self) -> usize {
        conv_output_extent(
            self.ih,
            self.pads.top,
            self.pads.bottom,
            self.kh,
            self.strides[0],
            self.dilations[0],
        )
        .unwrap_or(0)
    }

    pub fn ow(&self) -> usize {
        conv_output_extent(
            self.iw,
            self.pads.left,
            self.pads.right,
            self.kw,
            self.strides[1],
            self.dilations[1],
        )
        .unwrap_or(0)
    }

    pub fn src_shape(&self) -> [usize; 4] {
        [self.mb, self.ic, self.ih, self.iw]
    }

    /// The shape of the destination: the output's, pooled when a pool is fused.
    pub fn dst_shape(&self) -> [usize; 4] {
        match self.pool_desc() {
            Some(p) => p.dst_shape(),
            None => [self.mb, self.oc, self.oh(), self.ow()],
        }
    }

    /// The fused pooling as an op of its own on the conv's output: it reads `nChw4c` (the
    /// scratch band the conv writes) and writes the destination's layout. Its runtime extents
    /// are the conv's.
    pub fn pool_desc(&self) -> Option<PoolDesc> {
        let w = self.pool?;
        let d = PoolDesc {
            kind: PoolKind::Max,
            mb: self.mb,
            c: self.oc,
            ih: self.oh(),
            iw: self.ow(),
            window: w,
            count_include_pad: false,
            src_layout: Layout::Nchw4c,
            dst_layout: self.dst_layout,
            runtime: RuntimeDims::NONE,
            // The key holds no tier of its own for it: the fused kernel's plan takes the
            // conv's where the pool's tile covers it (`PoolDesc::tier_for`).
            isa: Isa::X128,
        };
        Some(d.with_runtime(self.runtime))
    }

    /// Rows of the output one pooled row's window spans: the height of the scratch band.
    pub fn pool_band_rows(&self) -> usize {
        self.pool.map_or(0, |w| {
            w.dilations[0].saturating_mul(w.kernel[0].saturating_sub(1)) + 1
        })
    }

    pub fn weight_shape(&self) -> [usize; 4] {
        [self.oc, self.ic / self.groups.max(1), self.kh, self.kw]
    }

    /// Multiply-adds times two: the flop count benchdnn reports (for Winograd, the direct
    /// equivalent: "effective" flops).
    pub fn flops(&self) -> u64 {
        let [oc, icg, kh, kw] = self.weight_shape();
        2 * (self.mb * oc * self.oh() * self.ow()) as u64 * (icg * kh * kw) as u64
    }

    pub fn residuals(&self) -> usize {
        self.post_ops
            .iter()
            .filter(|p| matches!(p, PostOpDesc::Add))
            .count()
    }

    /// Whether a post-op is a PReLU, whose slopes the packed weights then hold.
    pub fn prelu(&self) -> bool {
        self.post_ops.contains(&PostOpDesc::PRelu)
    }
}

/// A windowed pooling op. Every extent is fixed except those `runtime` names.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PoolDesc {
    pub kind: PoolKind,
    pub mb: usize,
    pub c: usize,
    pub ih: usize,
    pub iw: usize,
    /// Kernel, strides, pads, dilations and `ceil_mode`: the IR's window type.
    pub window: PoolWindow,
    pub count_include_pad: bool,
    pub src_layout: Layout,
    pub dst_layout: Layout,
    pub runtime: RuntimeDims,
    /// The vector tier of its kernel: `x128`, or the engine's where
    /// [`PoolDesc::tier_for`] grants it.
    pub isa: Isa,
}

impl PoolDesc {
    pub fn oh(&self) -> usize {
        let w = &self.window;
        pool_output_extent(
            self.ih,
            w.pads.top,
            w.pads.bottom,
            w.kernel[0],
            w.strides[0],
            w.dilations[0],
            w.ceil_mode,
        )
        .unwrap_or(0)
    }

    pub fn ow(&self) -> usize {
        let w = &self.window;
        pool_output_extent(
            self.iw,
            w.pads.left,
            w.pads.right,
            w.kernel[1],
            w.strides[1],
            w.dilations[1],
            w.ceil_mode,
        )
        .unwrap_or(0)
    }

    pub fn src_shape(&self) -> [usize; 4] {
        [self.mb, self.c, self.ih, self.iw]
    }

    pub fn dst_shape(&self) -> [usize; 4] {
        [self.mb, self.c, self.oh(), self.ow()]
    }
}

/// A global pooling op: one output per image and channel.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GlobalPoolDesc {
    pub kind: PoolKind,
    pub mb: usize,
    pub c: usize,
    pub ih: usize,
    pub iw: usize,
    pub src_layout: Layout,
    pub dst_layout: Layout,
    pub runtime: RuntimeDims,
    /// The vector tier of its kernel: `x128`, or the engine's where
    /// [`GlobalPoolDesc::tier_for`] grants it.
    pub isa: Isa,
}

/// An element-wise op that was not fused into a convolution.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EltwiseKind {
    Relu,
    /// Two sources of one shape; the second is the kernel's first extra buffer.
    Add,
    /// An activation (`lower_eltwise`'s vector approximations).
    Act(Activation),
    /// `x` where `x >= 0`, else `slope[c] * x`: the slopes, one per channel rounded up to
    /// whole vectors, are the kernel's first extra buffer.
    PRelu,
    /// `src op src2`; `src2` (the first extra buffer) is as `rhs` says, in the key's layout.
    Binary {
        op: BinaryKind,
        rhs: Broadcast,
    },
}

/// The shape of a binary element-wise op's second source, beside the first's `[N, C, H, W]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Broadcast {
    /// `[N, C, H, W]`: one value per element.
    Full,
    /// `[N, C, 1, 1]`: one value per image and channel.
    PerImageChannel,
    /// `[1, C, 1, 1]`: one value per channel.
    PerChannel,
}

impl Broadcast {
    /// The second source's shape beside a first source of `[n, c, h, w]`.
    pub fn shape(self, [n, c, h, w]: [usize; 4]) -> [usize; 4] {
        match self {
            Broadcast::Full => [n, c, h, w],
            Broadcast::PerImageChannel => [n, c, 1, 1],
            Broadcast::PerChannel => [1, c, 1, 1],
        }
    }
}

/// An element-wise op over one shape; all operands share `layout`. The height and width of
/// `shape` are 0 where `runtime` leaves them to run time.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct EltwiseDesc {
    pub kind: EltwiseKind,
    pub shape: [usize; 4],
    pub layout: Layout,
    /// The vector tier of the kernel's runs (`EltwiseDesc::tier_for`).
    pub isa: Isa,
    pub runtime: RuntimeDims,
}

/// Tensors joined along channels: input `i` has `channels[i]` channels, all share the batch,
/// height and width; the first input is the kernel's source, the others its extra buffers in
/// order. All buffers share `layout`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConcatDesc {
    pub mb: usize,
    pub channels: Vec<usize>,
    pub h: usize,
    pub w: usize,
    pub layout: Layout,
    pub runtime: RuntimeDims,
}

impl ConcatDesc {
    /// The channels of the result (saturating: an overflow fails validation).
    pub fn total_channels(&self) -> usize {
        self.channels
            .iter()
            .fold(0usize, |a, &c| a.saturating_add(c))
    }

    pub fn dst_shape(&self) -> [usize; 4] {
        [self.mb, self.total_channels(), self.h, self.w]
    }
}

/// Channels of a tensor picked by index (a split, a slice or a shuffle of channels): output
/// channel `j` is input channel `select[j]`; source and destination share `layout`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SelectDesc {
    pub mb: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub select: Vec<usize>,
    pub layout: Layout,
}

impl SelectDesc {
    pub fn dst_shape(&self) -> [usize; 4] {
        [self.mb, self.select.len(), self.h, self.w]
    }
}

/// How a resize key gets its output extents: the input's times scale factors, rounded down
/// (the input's may be left to run time; source coordinates map by the factors), or fixed
/// extents.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ResizeOut {
    Scale([ScaleFactor; 2]),
    Sizes([usize; 2]),
}

/// Spatial resizing of an nChw4c tensor ([`primjit_ir::Resize`]): per output pixel, the
/// vector of four channels of its nearest source pixel, or a blend of the 2x2 around its
/// source coordinate. Extents may be left to run time: with whole scale factors the input's,
/// from which the output's follow; with sizes the input's and the output's together, axis by
/// axis, each call passing both ([`CallExtents`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ResizeDesc {
    pub mb: usize,
    pub c: usize,
    pub ih: usize,
    pub iw: usize,
    pub out: ResizeOut,
    pub mode: ResizeMode,
    pub coord: CoordMode,
    pub runtime: RuntimeDims,
}

impl ResizeDesc {
    /// The key with the extents `runtime` names left to run time: the input's, and with sizes
    /// the output's on the same axes.
    pub fn with_runtime(mut self, runtime: RuntimeDims) -> Self {
        [self.ih, self.iw] = runtime.erase([self.ih, self.iw]);
        if let ResizeOut::Sizes(s) = &mut self.out {
            *s = runtime.erase(*s);
        }
        self.runtime = runtime;
        self
    }

    /// The fixed-shape resize of one call (see `ConvDesc::at`); a runtime size without the
    /// call's output extents stays 0, which validation refuses.
    pub fn at(&self, extents: CallExtents) -> ResizeDesc {
        let mut d = self.clone();
        [d.ih, d.iw] = d.runtime.fill([d.ih, d.iw], extents.input);
        if let ResizeOut::Sizes(s) = &mut d.out {
            *s = d.runtime.fill(*s, extents.output.unwrap_or([0, 0]));
        }
        d.runtime = RuntimeDims::NONE;
        d
    }

    /// The output extents (saturating; validation rejects overflowing ones).
    pub fn out_extents(&self) -> [usize; 2] {
        match self.out {
            ResizeOut::Scale(factors) => {
                let out = |s: ScaleFactor, i: usize| {
                    s.apply(i as u64)
                        .and_then(|o| usize::try_from(o).ok())
                        .unwrap_or(usize::MAX)
                };
                [out(factors[0], self.ih), out(factors[1], self.iw)]
            }
            ResizeOut::Sizes(s) => s,
        }
    }

    pub fn oh(&self) -> usize {
        self.out_extents()[0]
    }

    pub fn ow(&self) -> usize {
        self.out_extents()[1]
    }

    pub fn src_shape(&self) -> [usize; 4] {
        [self.mb, self.c, self.ih, self.iw]
    }

    pub fn dst_shape(&self) -> [usize; 4] {
        [self.mb, self.c, self.oh(), self.ow()]
    }
}

/// A transposed convolution of nChw4c tensors ([`primjit_ir::ConvTranspose2d`]), groups 1 or
/// depthwise (`groups == ic == oc`), with an optional bias; always x128 code. Input extents may
/// be left to run time; the output's follow them.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConvTransposeDesc {
    pub mb: usize,
    pub ic: usize,
    pub ih: usize,
    pub iw: usize,
    pub oc: usize,
    pub kh: usize,
    pub kw: usize,
    pub strides: [usize; 2],
    pub dilations: [usize; 2],
    pub pads: Pads,
    pub output_padding: [usize; 2],
    pub groups: usize,
    pub bias: bool,
    /// Applied to each output element after the bias: relu, clip and the activations (no
    /// `Add`, which validation refuses).
    pub post_ops: Vec<PostOpDesc>,
    pub runtime: RuntimeDims,
    /// The vector tier of its kernel: `x128`, or the engine's where
    /// [`ConvTransposeDesc::tier_for`] grants it.
    pub isa: Isa,
}

impl ConvTransposeDesc {
    /// Whether each channel is its own group (`groups == ic == oc`).
    pub fn depthwise(&self) -> bool {
        self.groups > 1 && self.groups == self.ic && self.groups == self.oc
    }

    /// The output height; 0 when it would be below 1 (validation rejects such keys).
    pub fn oh(&self) -> usize {
        primjit_ir::conv_transpose_output_extent(
            self.ih,
            self.pads.top,
            self.pads.bottom,
            self.kh,
            self.strides[0],
            self.dilations[0],
            self.output_padding[0],
        )
        .unwrap_or(0)
    }

    /// The output width; 0 when it would be below 1.
    pub fn ow(&self) -> usize {
        primjit_ir::conv_transpose_output_extent(
            self.iw,
            self.pads.left,
            self.pads.right,
            self.kw,
            self.strides[1],
            self.dilations[1],
            self.output_padding[1],
        )
        .unwrap_or(0)
    }

    pub fn src_shape(&self) -> [usize; 4] {
        [self.mb, self.ic, self.ih, self.iw]
    }

    pub fn dst_shape(&self) -> [usize; 4] {
        [self.mb, self.oc, self.oh(), self.ow()]
    }

    /// The ONNX weight shape, `[ic, oc / groups, kh, kw]`.
    pub fn weight_shape(&self) -> [usize; 4] {
        [self.ic, self.oc / self.groups.max(1), self.kh, self.kw]
    }

    /// Floats of the packed weights ([`crate::pack_conv_transpose_weights`]): per output
    /// block, its taps' weights, then the bias rounded up to whole blocks.
    pub fn packed_weights_len(&self) -> usize {
        let blocks = self.oc.div_ceil(4) * 4;
        let per_tap = if self.depthwise() { 1 } else { self.ic };
        blocks * self.kh * self.kw * per_tap + blocks
    }

    /// Multiply-adds count two: every input element meets `oc / groups` output channels at
    /// every tap (those of the border that the pads cut off included).
    pub fn flops(&self) -> u64 {
        let ocg = self.oc / self.groups.max(1);
        2 * (self.mb * self.ic * self.ih * self.iw) as u64 * (ocg * self.kh * self.kw) as u64
    }
}

/// Accumulators of the FMA peak kernel: enough independent chains to cover the FMA latency
/// on two pipes.
pub const FMA_PEAK_ACCUMULATORS: usize = 12;
/// Input channels per loop trip of the broadcast FMA peak kernels: the Winograd GEMM's.
pub const FMA_BROADCAST_CHANNELS: usize = GEMM_UNROLL;
/// Floats of the broadcast FMA peak kernel's source: a weight vector per channel, then a
/// scalar per channel and accumulator.
pub const FMA_BROADCAST_SOURCE: usize =
    FMA_BROADCAST_CHANNELS * 4 + FMA_BROADCAST_CHANNELS * FMA_PEAK_ACCUMULATORS;
/// Floats of the shared-broadcast FMA peak kernel's source: the Winograd tile's weight vectors
/// per channel, then a scalar per channel and tile.
pub const FMA_SHARED_SOURCE: usize =
    FMA_BROADCAST_CHANNELS * 4 * GROUP_VECTORS + FMA_BROADCAST_CHANNELS * GROUP_TILES;

/// The instruction pattern an FMA peak kernel runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FmaPattern {
    /// Independent FMAs on registers alone: the machine's 128-bit peak. A work item is 8
    /// steps of 12 FMAs (768 flops), each chain `x <- x * b + a`, reading `a` and `b` (8
    /// floats) from the source.
    Registers,
    /// The direct convolutions' register tile: per channel a weight-vector load, then for each
    /// of the 12 accumulators a broadcast load and an FMA, from a source that stays in L1
    /// ([`FMA_BROADCAST_SOURCE`] floats). A work item is 12 channels (1152 flops). Cranelift
    /// ties an FMA's result to a multiplicand, so a GEMM that reuses a loaded value needs a
    /// copy or a load per FMA: this is the ceiling of the code it emits for one.
    Broadcast,
    /// The Winograd GEMM's register tile (`conv::winograd`): per channel a weight-vector load
    /// for each of [`GROUP_VECTORS`] output-channel vectors, then for each of [`GROUP_TILES`]
    /// tiles a broadcast load that feeds one FMA per vector (through a register copy, as
    /// Cranelift emits it), from a source that stays in L1 ([`FMA_SHARED_SOURCE`] floats). A
    /// work item is 12 channels (960 flops), on 10 of the 12 accumulators.
    SharedBroadcast,
}

impl FmaPattern {
    /// Flops of one work item (loop trip).
    pub fn flops_per_item(self) -> u64 {
        let fmas = match self {
            FmaPattern::Registers => 8 * FMA_PEAK_ACCUMULATORS,
            FmaPattern::Broadcast => FMA_BROADCAST_CHANNELS * FMA_PEAK_ACCUMULATORS,
            FmaPattern::SharedBroadcast => FMA_BROADCAST_CHANNELS * GROUP_TILES * GROUP_VECTORS,
        };
        fmas as u64 * 8
    }

    /// Floats of the source buffer.
    pub fn source_len(self) -> usize {
        match self {
            FmaPattern::Registers => 8,
            FmaPattern::Broadcast => FMA_BROADCAST_SOURCE,
            FmaPattern::SharedBroadcast => FMA_SHARED_SOURCE,
        }
    }
}

/// The largest stride, dilation or pad of a valid key, `2^29`: times a row of at most `2^33`
/// bytes (a tensor of `MAX_TENSOR_ELEMENTS` floats) it fits the kernels' i64 byte offsets.
pub const MAX_STEP: usize = 1 << 29;

/// Entries of a kernel's `extents` argument ([`PrimitiveKey::extent_args`]).
pub const EXTENT_ARGS: usize = 6;

/// Everything that identifies one compiled kernel.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum PrimitiveKey {
    Conv(ConvDesc),
    Pool(PoolDesc),
    GlobalPool(GlobalPoolDesc),
    Eltwise(EltwiseDesc),
    Concat(ConcatDesc),
    SelectChannels(SelectDesc),
    Resize(ResizeDesc),
    ConvTranspose(ConvTransposeDesc),
    /// Not an op: a loop of f32x4 FMAs that measures the machine's peak, or the peak of a
    /// convolution's register tile ([`FmaPattern`]). Its work items are loop trips; it keeps
    /// its accumulators (12 vectors, 48 floats) in the destination.
    FmaPeak(FmaPattern),
    /// Not an op: the same at a wide tier, emitted by the x64 backend: the tier's FMA peak,
    /// or (`tile`) the rate of its direct convolution's full register tile
    /// (`backend::x64::peak_kernel`).
    WidePeak {
        isa: Isa,
        pattern: WidePattern,
    },
}

/// A key that describes no valid kernel ([`PrimitiveKey::validate`], and so every compile):
/// a zero extent, stride or dilation, groups that do not divide the channels, a window that
/// does not fit in the padded input or (pooling) covers only padding, a stride, dilation or
/// pad over [`MAX_STEP`], channels too many to round up to whole vectors, a tensor of more than
/// `MAX_TENSOR_ELEMENTS` elements, clip bounds with
/// `lo > hi` or NaN, a row pitch narrower than its rows. `key` is the key's one-liner,
/// `reason` what is wrong; fix that field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid primitive {key}: {reason}")]
pub struct KeyError {
    pub key: String,
    pub reason: String,
}

/// The role of a fused pool's scratch buffer ([`ConvDesc::scratch_len`]), always the last
/// buffer: a call may pass a multiple of its length, one band per thread, and runs on at most
/// that many threads.
pub const SCRATCH_ROLE: &str = "scratch";

/// One buffer a kernel reads or writes: its role, logical shape and layout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BufferSpec {
    pub role: &'static str,
    pub shape: Vec<usize>,
    pub layout: Option<Layout>,
    /// The number of f32 elements the buffer must hold exactly.
    pub len: usize,
}

impl PrimitiveKey {
    /// The extents this key leaves to run time.
    pub fn runtime_dims(&self) -> RuntimeDims {
        match self {
            PrimitiveKey::Conv(d) => d.runtime,
            PrimitiveKey::Pool(d) => d.runtime,
            PrimitiveKey::Resize(d) => d.runtime,
            PrimitiveKey::ConvTranspose(d) => d.runtime,
            PrimitiveKey::GlobalPool(d) => d.runtime,
            PrimitiveKey::Eltwise(d) => d.runtime,
            PrimitiveKey::Concat(d) => d.runtime,
            _ => RuntimeDims::NONE,
        }
    }

    /// The fixed-shape key of one call at `extents` (input extents `[ih, iw]`, or a
    /// [`CallExtents`]): runtime extents take these values, fixed ones keep theirs. A key
    /// without runtime extents is returned as is.
    pub fn at(&self, extents: impl Into<CallExtents>) -> PrimitiveKey {
        let call = extents.into();
        let extents = call.input;
        match self {
            PrimitiveKey::Conv(d) if d.runtime.any() => PrimitiveKey::Conv(d.at(extents)),
            PrimitiveKey::Pool(d) if d.runtime.any() => PrimitiveKey::Pool(d.at(extents)),
            PrimitiveKey::Resize(d) if d.runtime.any() => PrimitiveKey::Resize(d.at(call)),
            PrimitiveKey::ConvTranspose(d) if d.runtime.any() => {
                PrimitiveKey::ConvTranspose(d.at(extents))
            }
            PrimitiveKey::GlobalPool(d) if d.runtime.any() => {
                PrimitiveKey::GlobalPool(d.at(extents))
            }
            PrimitiveKey::Eltwise(d) if d.runtime.any() => PrimitiveKey::Eltwise(d.at(extents)),
            PrimitiveKey::Concat(d) if d.runtime.any() => PrimitiveKey::Concat(d.at(extents)),
            _ => self.clone(),
        }
    }

    /// The vector tier of the key's code.
    pub fn isa(&self) -> Isa {
        match self {
            PrimitiveKey::Conv(d) => d.isa,
            PrimitiveKey::Pool(d) => d.isa,
            PrimitiveKey::GlobalPool(d) => d.isa,
            PrimitiveKey::ConvTranspose(d) => d.isa,
            PrimitiveKey::Eltwise(d) => d.isa,
            PrimitiveKey::WidePeak { isa, .. } => *isa,
            _ => Isa::X128,
        }
    }

    /// The `[ih, iw]` input extents of a key (0 where runtime).
    pub fn input_extents(&self) -> [usize; 2] {
        match self {
            PrimitiveKey::Conv(d) => [d.ih, d.iw],
            PrimitiveKey::Pool(d) => [d.ih, d.iw],
            PrimitiveKey::GlobalPool(d) => [d.ih, d.iw],
            PrimitiveKey::Eltwise(d) => [d.shape[2], d.shape[3]],
            PrimitiveKey::Concat(d) => [d.h, d.w],
            PrimitiveKey::SelectChannels(d) => [d.h, d.w],
            PrimitiveKey::Resize(d) => [d.ih, d.iw],
            PrimitiveKey::ConvTranspose(d) => [d.ih, d.iw],
            PrimitiveKey::FmaPeak(_) | PrimitiveKey::WidePeak { .. } => [1, 1],
        }
    }

    /// The `extents` argument of a call of this key's kernel, `[ih, iw, oh, ow, ph, pw]`, for
    /// a key without runtime extents (so call it on [`Self::at`]'s result): the input, the
    /// output, and the output of a fused pool (the output again without one). A fused pool
    /// reads `[oh, ow, ph, pw]` as its own `[ih, iw, oh, ow]`.
    pub fn extent_args(&self) -> [i64; EXTENT_ARGS] {
        let [ih, iw] = self.input_extents();
        let [oh, ow] = match self {
            PrimitiveKey::Conv(d) => [d.oh(), d.ow()],
            PrimitiveKey::Pool(d) => [d.oh(), d.ow()],
            PrimitiveKey::Resize(d) => [d.oh(), d.ow()],
            PrimitiveKey::ConvTranspose(d) => [d.oh(), d.ow()],
            _ => [1, 1],
        };
        let [ph, pw] = match self {
            PrimitiveKey::Conv(d) => {
                let [_, _, ph, pw] = d.dst_shape();
                [ph, pw]
            }
            _ => [oh, ow],
        };
        [ih, iw, oh, ow, ph, pw].map(|x| x as i64)
    }

    /// [`Self::validate`] for a key whose extents are all fixed; `windows` also requires every
    /// pooling window to cover some input, which for runtime extents depends on the call's
    /// extents and is checked per call.
    pub(crate) fn check_fixed(&self, windows: bool) -> Result<(), KeyError> {
        let fail = |reason: String| {
            Err(KeyError {
                key: self.to_string(),
                reason,
            })
        };
        // Checked throughout, the channels' rounding up to whole vectors included: channels
        // of 2^64 - 1 rounded to 0 and passed as an empty tensor.
        let check_count = |what: &str, shape: [usize; 4]| -> Result<(), KeyError> {
            let count = shape[1].checked_next_multiple_of(4).and_then(|c| {
                [shape[0], c, shape[2], shape[3]]
                    .iter()
                    .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
            });
            match count {
                Some(c) if c <= MAX_TENSOR_ELEMENTS => Ok(()),
                _ => fail(format!(
                    "the {what} {shape:?} has more than {MAX_TENSOR_ELEMENTS} elements"
                )),
            }
        };
        // Kernels address rows with i64 byte offsets: a stride, dilation or pad times a row of
        // up to 2^33 bytes must fit, so each is at most 2^29 (found by fuzzing: a conv with a
        // stride of 2^63 overflowed while being lowered).
        let bounded = |what: &str, values: &[usize]| -> Result<(), KeyError> {
            if values.iter().any(|&v| v > MAX_STEP) {
                fail(format!(
                    "{what} must be at most {MAX_STEP}, found {values:?}"
                ))
            } else {
                Ok(())
            }
        };
        let positive = |what: &str, values: &[usize]| -> Result<(), KeyError> {
            if values.contains(&0) {
                fail(format!("{what} must be at least 1, found {values:?}"))
            } else {
                Ok(())
            }
        };
        // What conv and pooling windows share: positive, bounded steps and bounded pads.
        let window_steps = |strides: &[usize; 2], dilations: &[usize; 2], pads: &Pads| {
            positive("strides", strides)?;
            positive("dilations", dilations)?;
            bounded("strides", strides)?;
            bounded("dilations", dilations)?;
            bounded("pads", &[pads.top, pads.left, pads.bottom, pads.right])
        };
        match self {
            PrimitiveKey::Conv(d) => {
                positive(
                    "extents",
                    &[d.mb, d.ic, d.ih, d.iw, d.oc, d.kh, d.kw, d.groups],
                )?;
                window_steps(&d.strides, &d.dilations, &d.pads)?;
                if d.ic % d.groups != 0 || d.oc % d.groups != 0 {
                    return fail(format!(
                        "groups ({}) must divide the input ({}) and output ({}) channels",
                        d.groups, d.ic, d.oc
                    ));
                }
                let ext =
                    |k: usize, dil: usize| dil.checked_mul(k - 1).and_then(|e| e.checked_add(1));
                let (Some(eh), Some(ew)) = (ext(d.kh, d.dilations[0]), ext(d.kw, d.dilations[1]))
                else {
                    return fail("the window extent overflows".into());
                };
                // Saturating: the pads are bounded above, the extents only by the counts below.
                if d.ih.saturating_add(d.pads.top + d.pads.bottom) < eh
                    || d.iw.saturating_add(d.pads.left + d.pads.right) < ew
                {
                    return fail(
                        "the output would be empty: the window does not fit in the padded input"
                            .into(),
                    );
                }
                check_count("input", d.src_shape())?;
                check_count("output", [d.mb, d.oc, d.oh(), d.ow()])?;
                // A pitch at least as wide as its rows is a call's own matter (a runtime key's
                // width is its call's); its size is everyone's.
                let [_, _, dh, dw] = d.dst_shape();
                for (what, pitch, [c, h, w]) in [
                    ("source", d.pitches.src, [d.ic, d.ih, d.iw]),
                    ("destination", d.pitches.dst, [d.oc, dh, dw]),
                ] {
                    let Some(pitch) = pitch else { continue };
                    if windows && pitch < w {
                        return fail(format!(
                            "the {what}'s row pitch ({pitch}) is narrower than its rows ({w})"
                        ));
                    }
                    check_count(what, [d.mb, c, h, pitch.max(w)])?;
                }
                let Some(oc) = d.oc.checked_next_multiple_of(4) else {
                    return fail(format!("{} output channels are too many", d.oc));
                };
                check_count("weights", [oc, d.ic, d.kh, d.kw])?;
                if let Some(pool) = d.pool_desc() {
                    if d.residuals() > 0 {
                        return fail(
                            "a fused max pool cannot follow a residual add (not supported)".into(),
                        );
                    }
                    PrimitiveKey::Pool(pool)
                        .check_fixed(windows)
                        .or_else(|e| fail(format!("fused pool: {}", e.reason)))?;
                }
                if d.algo == ConvAlgo::WinogradF4x3
                    && let Some(reason) = d.winograd_unsupported()
                {
                    return fail(reason.into());
                }
                if d.post_ops
                    .iter()
                    .filter(|p| **p == PostOpDesc::PRelu)
                    .count()
                    > 1
                {
                    return fail("a conv takes at most one prelu post-op".into());
                }
                for p in &d.post_ops {
                    // Written so that NaN bounds are rejected too.
                    #[allow(clippy::neg_cmp_op_on_partial_ord)]
                    if let PostOpDesc::Clip { lo, hi } = p
                        && !(lo <= hi)
                    {
                        return fail(format!("clip needs lo <= hi, found {lo:?} > {hi:?}"));
                    }
                }
            }
            PrimitiveKey::Pool(d) => {
                positive("extents", &[d.mb, d.c, d.ih, d.iw])?;
                positive("kernel", &d.window.kernel)?;
                window_steps(&d.window.strides, &d.window.dilations, &d.window.pads)?;
                if d.oh() == 0 || d.ow() == 0 {
                    return fail(
                        "the output would be empty: the window does not fit in the padded input"
                            .into(),
                    );
                }
                // Sizes first: the scan below visits every output row and column, which must
                // not take minutes for a key that is rejected for its size anyway.
                check_count("input", d.src_shape())?;
                check_count("output", d.dst_shape())?;
                let axes = if windows { 2 } else { 0 };
                for (axis, (input, out, pad, k, s, dil)) in [
                    (
                        "row",
                        (
                            d.ih,
                            d.oh(),
                            d.window.pads.top,
                            d.window.kernel[0],
                            d.window.strides[0],
                            d.window.dilations[0],
                        ),
                    ),
                    (
                        "column",
                        (
                            d.iw,
                            d.ow(),
                            d.window.pads.left,
                            d.window.kernel[1],
                            d.window.strides[1],
                            d.window.dilations[1],
                        ),
                    ),
                ]
                .into_iter()
                .take(axes)
                {
                    if let Some(o) =
                        (0..out).find(|&o| tap_interval(o, input, pad, k, s, dil).is_empty())
                    {
                        return fail(format!(
                            "the window at output {axis} {o} covers only padding"
                        ));
                    }
                }
            }
            PrimitiveKey::GlobalPool(d) => {
                positive("extents", &[d.mb, d.c, d.ih, d.iw])?;
                check_count("input", [d.mb, d.c, d.ih, d.iw])?;
            }
            PrimitiveKey::Eltwise(d) => {
                positive("extents", &d.shape)?;
                check_count("tensor", d.shape)?;
            }
            PrimitiveKey::Concat(d) => {
                positive("extents", &[d.mb, d.h, d.w])?;
                if d.channels.is_empty() {
                    return fail("a concat needs at least one input".into());
                }
                positive("channels", &d.channels)?;
                for &c in &d.channels {
                    check_count("input", [d.mb, c, d.h, d.w])?;
                }
                if d.channels
                    .iter()
                    .try_fold(0usize, |a, &c| a.checked_add(c))
                    .is_none()
                {
                    return fail("the channels overflow".into());
                }
                check_count("output", d.dst_shape())?;
            }
            PrimitiveKey::SelectChannels(d) => {
                positive("extents", &[d.mb, d.c, d.h, d.w])?;
                if d.select.is_empty() {
                    return fail("a channel selection needs at least one channel".into());
                }
                if let Some(&bad) = d.select.iter().find(|&&s| s >= d.c) {
                    return fail(format!("channel {bad} is selected of {}", d.c));
                }
                check_count("input", [d.mb, d.c, d.h, d.w])?;
                check_count("output", d.dst_shape())?;
            }
            PrimitiveKey::Resize(d) => {
                positive("extents", &[d.mb, d.c, d.ih, d.iw])?;
                match d.out {
                    ResizeOut::Scale(f) => {
                        positive("scale factors", &f.map(|s| s.num() as usize))?;
                        bounded("scale factors", &f.map(|s| s.num() as usize))?;
                        if d.out_extents().contains(&usize::MAX) {
                            return fail("the output extents overflow".into());
                        }
                        positive("output extents", &d.out_extents())?;
                    }
                    ResizeOut::Sizes(s) => positive("output extents", &s)?,
                }
                check_count("input", d.src_shape())?;
                check_count("output", d.dst_shape())?;
                // The kernels' exact source coordinates multiply an input extent (or a scale's
                // denominator) and an output extent by at most 4 in i64.
                let den = match d.out {
                    ResizeOut::Scale(f) => f[0].den().max(f[1].den()),
                    ResizeOut::Sizes(_) => 1,
                };
                let input = d.ih.max(d.iw) as u128;
                if input.max(den as u128) * d.oh().max(d.ow()) as u128 * 4 > i64::MAX as u128 {
                    return fail("the extents are too large for exact coordinates".into());
                }
            }
            PrimitiveKey::ConvTranspose(d) => {
                positive(
                    "extents",
                    &[d.mb, d.ic, d.ih, d.iw, d.oc, d.kh, d.kw, d.groups],
                )?;
                window_steps(&d.strides, &d.dilations, &d.pads)?;
                bounded("output_padding", &d.output_padding)?;
                if (0..2).any(|a| d.output_padding[a] >= d.strides[a].max(d.dilations[a])) {
                    return fail(format!(
                        "output_padding {:?} must be less than the stride {:?} or the dilation {:?}",
                        d.output_padding, d.strides, d.dilations
                    ));
                }
                if d.post_ops.contains(&PostOpDesc::Add) {
                    return fail("a transposed convolution takes no residual add".into());
                }
                if d.post_ops.contains(&PostOpDesc::PRelu) {
                    return fail("a transposed convolution takes no prelu post-op".into());
                }
                if d.groups != 1 && !d.depthwise() {
                    return fail(format!(
                        "conv_transpose supports groups 1 and depthwise (groups = input channels = \
                         output channels), found {} groups of {} input and {} output channels",
                        d.groups, d.ic, d.oc
                    ));
                }
                if d.oh() == 0 || d.ow() == 0 {
                    return fail(
                        "the output would be empty: the pads remove every output row or column"
                            .into(),
                    );
                }
                check_count("input", d.src_shape())?;
                check_count("output", d.dst_shape())?;
                let Some(oc) = d.oc.checked_next_multiple_of(4) else {
                    return fail(format!("{} output channels are too many", d.oc));
                };
                check_count("weights", [oc, d.ic, d.kh, d.kw])?;
            }
            PrimitiveKey::FmaPeak(_) => {}
            PrimitiveKey::WidePeak { isa, .. } => {
                if *isa == Isa::X128 {
                    return Err(KeyError {
                        key: self.to_string(),
                        reason: "a wide peak needs a wide tier (avx2 or avx512)".into(),
                    });
                }
            }
        }
        Ok(())
    }

    /// The floating-point operations of one execution (multiply-adds count two).
    pub fn flops(&self) -> u64 {
        match self {
            PrimitiveKey::Conv(d) => d.flops(),
            PrimitiveKey::Pool(d) => {
                (d.mb * d.c * d.oh() * d.ow() * d.window.kernel[0] * d.window.kernel[1]) as u64
            }
            PrimitiveKey::GlobalPool(d) => (d.mb * d.c * d.ih * d.iw) as u64,
            PrimitiveKey::Eltwise(d) => d.shape.iter().product::<usize>() as u64,
            // None: a copy.
            PrimitiveKey::Concat(_) | PrimitiveKey::SelectChannels(_) => 0,
            // A blend of four pixels per output element: three multiply-adds and a multiply.
            PrimitiveKey::Resize(d) => match d.mode {
                ResizeMode::Nearest(_) => 0,
                ResizeMode::Linear => d.dst_shape().iter().product::<usize>() as u64 * 7,
            },
            PrimitiveKey::ConvTranspose(d) => d.flops(),
            PrimitiveKey::FmaPeak(pattern) => pattern.flops_per_item(),
            PrimitiveKey::WidePeak { isa, pattern } => pattern.flops_per_item(*isa),
        }
    }
}

impl fmt::Display for PrimitiveKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let layouts =
            |f: &mut fmt::Formatter<'_>, src: Layout, dst: Layout| write!(f, " {src}>{dst}");
        match self {
            PrimitiveKey::Conv(d) => {
                write!(f, "conv mb{}", d.mb)?;
                if d.groups != 1 {
                    write!(f, "g{}", d.groups)?;
                }
                let [ih, iw, oh, ow] = extent_fields(d.runtime, [d.ih, d.iw, d.oh(), d.ow()]);
                write!(f, "ic{}ih{ih}iw{iw}oc{}", d.ic, d.oc)?;
                // benchdnn writes dilation as the gap between taps (0 = dense) and only the top
                // and left padding: the bottom and right follow from the output extents. The
                // gap is signed: an invalid key with dilation 0 prints `dh-1` in its error.
                write!(f, "oh{oh}ow{ow}")?;
                window_fields(f, [d.kh, d.kw], d.strides, d.dilations, d.pads)?;
                if d.bias {
                    f.write_str(" bias")?;
                }
                post_fields(f, &d.post_ops)?;
                if let Some(p) = d.pool_desc() {
                    let [_, _, oh, ow] = extent_fields(p.runtime, [0, 0, p.oh(), p.ow()]);
                    write!(f, " +pool_max oh{oh}ow{ow}")?;
                    window_fields(
                        f,
                        p.window.kernel,
                        p.window.strides,
                        p.window.dilations,
                        p.window.pads,
                    )?;
                    if p.window.ceil_mode {
                        f.write_str(" ceil")?;
                    }
                }
                if d.algo != ConvAlgo::Direct {
                    write!(f, " alg:{}", d.algo)?;
                }
                if d.isa != Isa::X128 {
                    write!(f, " isa:{}", d.isa)?;
                }
                match (d.pitches.src, d.pitches.dst) {
                    (None, None) => {}
                    (Some(s), None) => write!(f, " pitch:src{s}")?,
                    (None, Some(t)) => write!(f, " pitch:dst{t}")?,
                    (Some(s), Some(t)) => write!(f, " pitch:src{s},dst{t}")?,
                }
                layouts(f, d.src_layout, d.dst_layout)
            }
            PrimitiveKey::Pool(d) => {
                let alg = match (d.kind, d.count_include_pad) {
                    (PoolKind::Max, _) => "max",
                    (PoolKind::Avg, false) => "avg_np",
                    (PoolKind::Avg, true) => "avg_p",
                };
                let [ih, iw, oh, ow] = extent_fields(d.runtime, [d.ih, d.iw, d.oh(), d.ow()]);
                write!(f, "pool_{alg} mb{}ic{}ih{ih}iw{iw}oh{oh}ow{ow}", d.mb, d.c)?;
                window_fields(
                    f,
                    d.window.kernel,
                    d.window.strides,
                    d.window.dilations,
                    d.window.pads,
                )?;
                if d.window.ceil_mode {
                    f.write_str(" ceil")?;
                }
                if d.isa != Isa::X128 {
                    write!(f, " isa:{}", d.isa)?;
                }
                layouts(f, d.src_layout, d.dst_layout)
            }
            PrimitiveKey::GlobalPool(d) => {
                let alg = if d.kind == PoolKind::Max {
                    "max"
                } else {
                    "avg"
                };
                let [ih, iw, _, _] = extent_fields(d.runtime, [d.ih, d.iw, 1, 1]);
                write!(f, "global_pool_{alg} mb{}ic{}ih{ih}iw{iw}", d.mb, d.c)?;
                if d.isa != Isa::X128 {
                    write!(f, " isa:{}", d.isa)?;
                }
                layouts(f, d.src_layout, d.dst_layout)
            }
            PrimitiveKey::Eltwise(d) => {
                let [n, c, h, w] = d.shape;
                f.write_str("eltwise_")?;
                match d.kind {
                    EltwiseKind::Relu => f.write_str("relu")?,
                    EltwiseKind::Add => f.write_str("add")?,
                    EltwiseKind::Act(a) => write_activation(f, &a)?,
                    EltwiseKind::PRelu => f.write_str("prelu")?,
                    EltwiseKind::Binary { op, rhs } => {
                        let op = match op {
                            BinaryKind::Add => "add",
                            BinaryKind::Sub => "sub",
                            BinaryKind::Mul => "mul",
                            BinaryKind::Div => "div",
                        };
                        let rhs = match rhs {
                            Broadcast::Full => "",
                            Broadcast::PerImageChannel => ":nc11",
                            Broadcast::PerChannel => ":1c11",
                        };
                        write!(f, "{op}{rhs}")?;
                    }
                }
                let [h, w, _, _] = extent_fields(d.runtime, [h, w, 1, 1]);
                write!(f, " mb{n}ic{c}ih{h}iw{w}")?;
                if d.isa != Isa::X128 {
                    write!(f, " isa:{}", d.isa)?;
                }
                write!(f, " {}", d.layout)
            }
            PrimitiveKey::Concat(d) => {
                let channels: Vec<String> = d.channels.iter().map(|c| c.to_string()).collect();
                let [h, w, _, _] = extent_fields(d.runtime, [d.h, d.w, 1, 1]);
                write!(
                    f,
                    "concat mb{}ic{}ih{h}iw{w} {}",
                    d.mb,
                    channels.join("+"),
                    d.layout
                )
            }
            PrimitiveKey::SelectChannels(d) => {
                let select: Vec<String> = d.select.iter().map(|c| c.to_string()).collect();
                write!(
                    f,
                    "select mb{}ic{}ih{}iw{} oc{} {}",
                    d.mb,
                    d.c,
                    d.h,
                    d.w,
                    select.join(","),
                    d.layout
                )
            }
            PrimitiveKey::Resize(d) => {
                f.write_str("resize_")?;
                match d.mode {
                    ResizeMode::Linear => f.write_str("linear")?,
                    ResizeMode::Nearest(m) => write!(f, "nearest:{m}")?,
                }
                let [ih, iw, oh, ow] = extent_fields(d.runtime, [d.ih, d.iw, d.oh(), d.ow()]);
                write!(f, " mb{}ic{}ih{ih}iw{iw}oh{oh}ow{ow}", d.mb, d.c)?;
                if let ResizeOut::Scale([sh, sw]) = d.out {
                    write!(f, " scale{sh}x{sw}")?;
                }
                write!(f, " {} {}", d.coord, Layout::Nchw4c)
            }
            PrimitiveKey::ConvTranspose(d) => {
                // benchdnn's deconvolution fields, and the output padding where there is one.
                write!(f, "deconv mb{}", d.mb)?;
                if d.groups != 1 {
                    write!(f, "g{}", d.groups)?;
                }
                let [ih, iw, oh, ow] = extent_fields(d.runtime, [d.ih, d.iw, d.oh(), d.ow()]);
                write!(f, "ic{}ih{ih}iw{iw}oc{}oh{oh}ow{ow}", d.ic, d.oc)?;
                window_fields(f, [d.kh, d.kw], d.strides, d.dilations, d.pads)?;
                if d.pads.bottom != d.pads.top || d.pads.right != d.pads.left {
                    write!(f, " pads:{}x{}", d.pads.bottom, d.pads.right)?;
                }
                if d.output_padding != [0, 0] {
                    write!(f, " opad{}x{}", d.output_padding[0], d.output_padding[1])?;
                }
                if d.bias {
                    f.write_str(" bias")?;
                }
                post_fields(f, &d.post_ops)?;
                if d.isa != Isa::X128 {
                    write!(f, " isa:{}", d.isa)?;
                }
                write!(f, " {}", Layout::Nchw4c)
            }
            PrimitiveKey::FmaPeak(FmaPattern::Registers) => f.write_str("fma_peak 8x12 f32x4"),
            PrimitiveKey::FmaPeak(FmaPattern::Broadcast) => {
                f.write_str("fma_peak broadcast 12x12 f32x4")
            }
            PrimitiveKey::FmaPeak(FmaPattern::SharedBroadcast) => {
                f.write_str("fma_peak shared broadcast 12x5x2 f32x4")
            }
            PrimitiveKey::WidePeak { isa, pattern } => match (pattern, pattern.tile(*isa)) {
                (WidePattern::GemmTile, Some((p, v))) => {
                    write!(f, "fma_peak gemm {p}x{v} isa:{isa}")
                }
                (_, Some((p, v))) => write!(f, "fma_peak tile {p}x{v} isa:{isa}"),
                (_, None) => write!(f, "fma_peak 8x12 isa:{isa}"),
            },
        }
    }
}

/// The taps `k` of a window at output coordinate `o` that land inside the input:
/// `0 <= o * stride - pad_begin + k * dilation < input`.
pub fn tap_interval(
    o: usize,
    input: usize,
    pad_begin: usize,
    kernel: usize,
    stride: usize,
    dilation: usize,
) -> Range<usize> {
    let start = (o * stride) as i64 - pad_begin as i64;
    let d = dilation as i64;
    let lo = if start >= 0 { 0 } else { (-start + d - 1) / d };
    let last = input as i64 - 1 - start;
    let hi = if last < 0 {
        0
    } else {
        (last / d + 1).min(kernel as i64)
    };
    let lo = lo.min(kernel as i64) as usize;
    lo..(hi as usize).max(lo)
}

/// ` post=relu+add` of a key's post-ops, where it has any.
fn post_fields(f: &mut fmt::Formatter<'_>, posts: &[PostOpDesc]) -> fmt::Result {
    if posts.is_empty() {
        return Ok(());
    }
    let posts: Vec<String> = posts.iter().map(|p| p.to_string()).collect();
    write!(f, " post={}", posts.join("+"))
}

/// A pooling window's `kh kw sh sw [dh dw] ph pw` fields (dilation as benchdnn's gap).
fn window_fields(
    f: &mut fmt::Formatter<'_>,
    kernel: [usize; 2],
    strides: [usize; 2],
    dilations: [usize; 2],
    pads: Pads,
) -> fmt::Result {
    write!(
        f,
        "kh{}kw{}sh{}sw{}",
        kernel[0], kernel[1], strides[0], strides[1]
    )?;
    if dilations != [1, 1] {
        write!(
            f,
            "dh{}dw{}",
            dilations[0] as i128 - 1,
            dilations[1] as i128 - 1
        )?;
    }
    write!(f, "ph{}pw{}", pads.top, pads.left)
}

/// The `ih iw oh ow` fields of a one-liner: a runtime extent prints as `*`.
fn extent_fields(runtime: RuntimeDims, [ih, iw, oh, ow]: [usize; 4]) -> [String; 4] {
    let field = |runtime: bool, v: usize| {
        if runtime {
            "*".to_string()
        } else {
            v.to_string()
        }
    };
    [
        field(runtime.h, ih),
        field(runtime.w, iw),
        field(runtime.h, oh),
        field(runtime.w, ow),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conv_one_liner_is_benchdnn_style() {
        let mut d = ConvDesc::new(1, 64, [80, 80], 64, [3, 3]);
        d.pads = Pads::uniform(1);
        let key = PrimitiveKey::Conv(d.clone());
        assert_eq!(
            key.to_string(),
            "conv mb1ic64ih80iw80oc64oh80ow80kh3kw3sh1sw1ph1pw1 nchw>nchw"
        );
        d.post_ops = vec![PostOpDesc::Add, PostOpDesc::Relu];
        d.bias = true;
        d.dilations = [2, 1];
        d.groups = 2;
        assert_eq!(
            PrimitiveKey::Conv(d).to_string(),
            "conv mb1g2ic64ih80iw80oc64oh78ow80kh3kw3sh1sw1dh1dw0ph1pw1 bias post=add+relu nchw>nchw"
        );
    }

    #[test]
    fn a_fused_pool_shapes_the_destination_the_work_and_the_scratch() {
        // The trunk's stem at W=1031: conv 160x516, pooled 80x258.
        let mut d = ConvDesc::new(1, 3, [320, 1031], 64, [7, 7]);
        d.strides = [2, 2];
        d.pads = Pads::uniform(3);
        d.bias = true;
        d.post_ops = vec![PostOpDesc::Relu];
        d.pool = Some(PoolWindow {
            kernel: [3, 3],
            strides: [2, 2],
            pads: Pads::uniform(1),
            dilations: [1, 1],
            ceil_mode: false,
        });
        d.dst_layout = Layout::Nchw4c;
        let key = PrimitiveKey::Conv(d.clone());
        key.validate().unwrap();
        assert_eq!(
            key.to_string(),
            "conv mb1ic3ih320iw1031oc64oh160ow516kh7kw7sh2sw2ph3pw3 bias post=relu \
             +pool_max oh80ow258kh3kw3sh2sw2ph1pw1 nchw>nChw4c"
        );
        assert_eq!(d.dst_shape(), [1, 64, 80, 258]);
        assert_eq!(key.work_items(), 80);
        assert_eq!(key.extent_args(), [320, 1031, 160, 516, 80, 258]);
        // A band of the window's three rows at the conv's width, per thread.
        assert_eq!(d.scratch_len(), 3 * 516 * 64);
        let buffers = key.buffers();
        let scratch = buffers.last().unwrap();
        assert_eq!((scratch.role, scratch.len), (SCRATCH_ROLE, 3 * 516 * 64));
        assert_eq!(buffers[2].shape, [1, 64, 80, 258]);

        let w = RuntimeDims { h: false, w: true };
        let runtime = PrimitiveKey::Conv(d.clone().with_runtime(w));
        runtime.validate().unwrap();
        assert!(runtime.to_string().contains("ow*kh7"), "{runtime}");
        assert!(
            runtime.to_string().contains("+pool_max oh80ow*kh3"),
            "{runtime}"
        );
        assert_eq!(runtime.at([0, 1031]), key);

        // A residual is read at full resolution: no pool after it.
        let mut residual = d.clone();
        residual.post_ops.insert(0, PostOpDesc::Add);
        let err = PrimitiveKey::Conv(residual).validate().unwrap_err();
        assert!(err.reason.contains("cannot follow a residual add"), "{err}");
        // The pool's own rules hold on the conv's output.
        let mut padding_only = d;
        padding_only.pool.as_mut().unwrap().pads = Pads::uniform(3);
        let err = PrimitiveKey::Conv(padding_only).validate().unwrap_err();
        assert!(err.reason.starts_with("fused pool: "), "{err}");
    }

    #[test]
    fn runtime_extents_print_as_stars_and_instantiate_per_call() {
        let mut d = ConvDesc::new(1, 64, [80, 1031], 64, [3, 3]);
        d.pads = Pads::uniform(1);
        let w = RuntimeDims { h: false, w: true };
        let key = PrimitiveKey::Conv(d.clone().with_runtime(w));
        assert_eq!(
            key.to_string(),
            "conv mb1ic64ih80iw*oc64oh80ow*kh3kw3sh1sw1ph1pw1 nchw>nchw"
        );
        key.validate().unwrap();
        // Every width shares the key; the call's key is the exact one.
        let other = PrimitiveKey::Conv(ConvDesc { iw: 7, ..d.clone() }.with_runtime(w));
        assert_eq!(key, other);
        assert_eq!(key.at([0, 1031]), PrimitiveKey::Conv(d.clone()));
        assert_eq!(
            key.at([0, 1031]).extent_args(),
            [80, 1031, 80, 1031, 80, 1031]
        );
        // A runtime field must hold 0, so that equal kernels have equal keys.
        let mut bad = d.clone().with_runtime(w);
        bad.iw = 5;
        let err = PrimitiveKey::Conv(bad).validate().unwrap_err();
        assert!(err.reason.contains("must hold 0"), "{err}");
        // Per call: a width whose output would be empty is rejected by the call's key.
        let mut wide = d.clone();
        wide.kw = 5;
        wide.pads.left = 0;
        wide.pads.right = 0;
        let key = PrimitiveKey::Conv(wide.with_runtime(w));
        key.validate().unwrap();
        assert!(key.at([0, 4]).validate().is_err());
        assert!(key.at([0, 5]).validate().is_ok());
    }

    #[test]
    fn layout_offsets_and_lengths() {
        let shape = [2, 5, 3, 7];
        assert_eq!(Layout::Nchw.buffer_len(shape), 2 * 5 * 3 * 7);
        assert_eq!(Layout::Nchw4c.buffer_len(shape), 2 * 8 * 3 * 7);
        assert_eq!(
            Layout::Nchw4c.offset(shape, [1, 5 - 1, 2, 6]),
            (((2 + 1) * 3 + 2) * 7 + 6) * 4
        );
        assert_eq!(
            Layout::Nchw.offset(shape, [1, 4, 2, 6]),
            Layout::Nchw.buffer_len(shape) - 1
        );
    }

    #[test]
    fn pitched_buffers_end_with_their_last_row() {
        let shape = [2, 5, 3, 7];
        // 2 images x 2 channel blocks x 3 rows: 11 rows at a pitch of 10, then 7 pixels.
        assert_eq!(Layout::Nchw4c.pitched_len(shape, 10), (11 * 10 + 7) * 4);
        assert_eq!(Layout::Nchw.pitched_len(shape, 10), 29 * 10 + 7);
        assert_eq!(
            Layout::Nchw4c.pitched_len(shape, 7),
            Layout::Nchw4c.buffer_len(shape)
        );
        assert_eq!(Layout::Nchw.pitched_len([1, 0, 3, 7], 10), 0);

        let mut d = ConvDesc::new(1, 8, [6, 9], 4, [3, 3]);
        d.src_layout = Layout::Nchw4c;
        d.dst_layout = Layout::Nchw4c;
        d.post_ops = vec![PostOpDesc::Add];
        d.pitches = Pitches {
            src: Some(16),
            dst: Some(12),
        };
        let key = PrimitiveKey::Conv(d.clone());
        assert!(
            key.to_string()
                .ends_with(" pitch:src16,dst12 nChw4c>nChw4c"),
            "{key}"
        );
        let lens: Vec<(&str, usize)> = key.buffers().iter().map(|b| (b.role, b.len)).collect();
        assert_eq!(
            lens,
            [
                ("src", (11 * 16 + 9) * 4),
                ("weights", d.packed_weights_len()),
                ("dst", (3 * 12 + 7) * 4),
                ("residual", (3 * 12 + 7) * 4),
            ]
        );
        // Pitches are part of the key.
        assert_ne!(
            key,
            PrimitiveKey::Conv(ConvDesc {
                pitches: Pitches::DENSE,
                ..d.clone()
            })
        );
        // A fused pool's destination pitch spans its pooled rows (2 x 3 pixels here).
        d.post_ops.clear();
        d.pool = Some(PoolWindow {
            kernel: [2, 2],
            strides: [2, 2],
            pads: Pads::default(),
            dilations: [1, 1],
            ceil_mode: false,
        });
        let key = PrimitiveKey::Conv(d.clone());
        key.validate().unwrap();
        assert_eq!(key.buffers()[2].len, (12 + 3) * 4);
        d.pitches.dst = Some(2);
        let err = PrimitiveKey::Conv(d).validate().unwrap_err();
        assert!(
            err.reason
                .contains("destination's row pitch (2) is narrower than its rows (3)"),
            "{err}"
        );
    }

    #[test]
    fn validation_rejects_impossible_keys() {
        let mut d = ConvDesc::new(1, 6, [4, 4], 4, [5, 5]);
        let err = PrimitiveKey::Conv(d.clone()).validate().unwrap_err();
        assert!(err.reason.contains("does not fit"), "{err}");
        d.pads = Pads {
            top: 1,
            left: 1,
            bottom: 0,
            right: 0,
        };
        d.groups = 4;
        let err = PrimitiveKey::Conv(d).validate().unwrap_err();
        assert!(err.reason.contains("groups (4) must divide"), "{err}");
        let huge = ConvDesc::new(1 << 20, 1 << 10, [1 << 10, 1], 4, [1, 1]);
        assert!(
            PrimitiveKey::Conv(huge)
                .validate()
                .unwrap_err()
                .reason
                .contains("more than")
        );
    }
}
