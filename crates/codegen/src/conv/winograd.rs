//! Winograd F(4x4, 3x3) convolution (Lavin & Gray 2016): 36 multiplications per 4x4 output
//! tile and channel pair instead of direct convolution's 144, and, for stride 2, its polyphase
//! form: 81 instead of 144.
//!
//! For a 3x3 kernel `g` and a 6x6 input patch `d` (stride 4 between patches), the 4x4 output
//! is `Y = Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A`, summed over input channels. The weights' transform
//! `U = G g Gᵀ` is done once per model ([`WinogradPlan::pack_weights`]); a kernel call runs,
//! per work item (a block of tiles and a chunk of output channels, see [`WinogradPlan`]):
//! 1. the input transform of each tile, four channels (one `nChw4c` vector) at a time, into
//!    `V[point][channel block][tile][4]` in the thread's scratch; a tile that reaches outside
//!    the input (padding, or the partial last tile of a row or column) is first copied into a
//!    zeroed patch on the stack, so the transform itself never tests a bound; at a wide
//!    tier, `lanes / 4` consecutive tiles of one tile row take the x64 backend's
//!    `InputTransformTile` together (a tile per 128-bit lane group, the same bits), from a
//!    zeroed copy of their union window where one reaches outside the input;
//! 2. independent GEMMs, one per point, `M[point] = V[point] (tiles x ic) · U[point] (ic x
//!    oc)`, with a register tile of 5 tiles x two output-channel vectors, one broadcast load
//!    per two FMAs (see [`GROUP_TILES`]), into `M[point][channel block][tile][4]`; at a wide
//!    tier the tile is the x64 backend's `GemmTile` (two `ymm` or `zmm`, the same sums in the
//!    same order); where the weights stream from memory, each group of tiles prefetches a
//!    slice of the next weight panel (see `PanelPrefetch`);
//! 3. the output transform of each tile, which adds the bias, applies every post-op (relu,
//!    clip, residual add) and stores each output pixel once; the partial last tile of a row
//!    or column stores only its pixels inside the output; at a wide tier, `lanes / 4`
//!    consecutive whole tiles of one tile row take the backend's `OutputTransformTile`
//!    together (but in a last block whose padding lanes are masked).
//!
//! **Stride 2** ([`Form::Polyphase`]). A 4x4 output tile reads a 9x9 patch (stride 8 between
//! patches). Along each axis, the patch's even positions (the taps 0 and 2 of consecutive
//! outputs) form a 2-tap correlation of 5 inputs, which F(4, 2) computes from 5 points, and its
//! odd positions (tap 1) a 1-tap one of 4 inputs, which needs no transform: 9 points per axis,
//! `Bᵀ = [B₂ᵀ on the even positions; the odd positions]`, `G = [G₂ on taps 0 and 2; tap 1]`,
//! `Aᵀ = [A₂ᵀ | I₄]`. The 81 points are the four phases' transforms side by side (25, 20, 20
//! and 16 points), the sum of their four correlations falls out of the one separable output
//! transform, and the kernel is the stride-1 kernel with other 1-D transforms and 81 GEMMs.
//! The patch is exactly the 4x4 outputs' receptive field. Only a partial last tile may read
//! one more input row or column (where the floor of the output extent drops its output): an
//! odd position, which only its output `q` reads, through the identity part of the
//! transforms, and that output lies outside the image and is never stored.
//!
//! Tiles are numbered across images and tile rows, so a block can span rows, and a call's
//! tiles are shared evenly among its blocks. Nothing depends on the spatial extents but the tile
//! count: runtime extents (see [`crate::key::RuntimeDims`]) only make the tile arithmetic
//! read the call's extents. The scratch holds `points x block x (ic + oc / chunks)` floats,
//! and a cache line after each point of `V` and `M` (`POINT_PAD`), per thread, where `block`
//! is the call's tiles per block: it never grows past `block_tiles`, and a small image takes
//! no more than its own tiles (`V` and `M` are laid out with the call's block as their
//! stride, a runtime value for runtime extents).

use std::fmt;

use super::apply_post_ops;
use crate::backend::cranelift::{
    Emit, ExtentArg, F32_BYTES, IntCC, Scalar, StackSlot, Value, row_pixels,
};
use crate::backend::x64::{GemmTile, InputTransformTile, OutputTransformTile, WideTile};
use crate::key::ConvDesc;
use crate::target::Isa;
use crate::tile::{GEMM_UNROLL, GROUP_TILES, GROUP_VECTORS, LANES};

/// Output pixels per tile side.
pub const TILE: usize = 4;
/// Input pixels per tile side at stride 1: the output tile plus the kernel's reach.
pub const PATCH: usize = TILE + 2;
/// Input pixels per tile side at stride 2: the receptive field of 4 outputs.
const PATCH_S2: usize = 2 * TILE + 1;

/// How a key's convolution maps onto Winograd's transforms, by its stride.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// Stride 1: F(4x4, 3x3), 6x6 patches, 36 points.
    Unit,
    /// Stride 2, computed as the sum of its four polyphase parts: F(4x4, 2x2), F(4x4, 2x1),
    /// F(4x4, 1x2) and a plain 1x1 product, from 9x9 patches, 81 points (see the module
    /// documentation).
    Polyphase,
}

impl Form {
    /// The form for a convolution's strides: 1 or 2 on both axes (`winograd_unsupported`
    /// rejects the others).
    pub fn of(d: &ConvDesc) -> Form {
        if d.strides == [2, 2] {
            Form::Polyphase
        } else {
            Form::Unit
        }
    }

    /// The convolution's stride on both axes.
    pub fn stride(self) -> usize {
        match self {
            Form::Unit => 1,
            Form::Polyphase => 2,
        }
    }

    /// Input pixels (and points) per patch side.
    pub fn patch(self) -> usize {
        match self {
            Form::Unit => PATCH,
            Form::Polyphase => PATCH_S2,
        }
    }

    /// Points of a transformed tile: the number of GEMMs.
    pub fn points(self) -> usize {
        self.patch() * self.patch()
    }

    /// Distinct weight points per axis. At stride 2, the four odd points of an axis all
    /// multiply by tap 1, so they share one row of `G`: 6 rows, as at stride 1, and 36
    /// transformed weights per channel pair instead of 81.
    pub fn weight_side(self) -> usize {
        PATCH
    }

    /// Transformed weights per channel pair.
    pub fn weight_points(self) -> usize {
        self.weight_side() * self.weight_side()
    }

    /// The row of `G` (and of the packed weights) that point `i` of an axis multiplies by.
    pub fn weight_row(self, i: usize) -> usize {
        i.min(self.weight_side() - 1)
    }

    /// `G` as rows of the 3 taps' coefficients, one per distinct weight point of an axis:
    /// at stride 2, `G₂` on taps 0 and 2, then tap 1 alone.
    fn g(self) -> Vec<[f64; 3]> {
        match self {
            Form::Unit => G.to_vec(),
            Form::Polyphase => {
                let even = G2.iter().map(|&[a, b]| [a, 0.0, b]);
                even.chain([[0.0, 1.0, 0.0]]).collect()
            }
        }
    }
}

/// Tiles per block of the layers whose transformed weights stay in L2.
const CACHED_BLOCK_TILES: usize = 2 * GROUP_TILES;

/// Tiles per block of the stride-1 layers whose transformed weights stream from memory.
const STREAMED_BLOCK_TILES: usize = 10 * GROUP_TILES;

/// The least a group of tiles prefetches of the next weight panel: 16 lines. (Measured on the
/// trunk, layer3 ran as fast with 4 or 8 lines and slower with 32: at W=1031, where a block
/// has 10 groups, 1.08-1.16 times faster than without prefetches against 1.22-1.26 with 16.)
const PREFETCH_SLICE: i64 = 1024;

/// Bytes of a cache line.
const LINE_BYTES: i64 = 64;

/// Transformed weights larger than this are streamed from beyond L2 once per block: the plan
/// then splits output channels between work items and, at stride 1, takes blocks of
/// [`STREAMED_BLOCK_TILES`] tiles. 1 MiB is the L2 of a Zen4 or Zen5 core, where this was
/// measured. A Zen2 core has 512 KiB, where the 64-channel layers' 0.6 MB do not stay, yet
/// streaming them did not pay there (a temporary build with a 512 KiB threshold, 2 threads):
/// layer1's conv at W=7680 took 51-57 ms against 51-53 ms (`bench-op`, medians of 50 runs, two
/// rounds), and in streamed runs its band calls took 1.07-1.16 of its whole-tensor time
/// against 0.98-1.10 (`streaming_cost --nodes`, three rounds). So the threshold stays a
/// constant rather than the host's cache size.
const STREAMED_WEIGHT_BYTES: usize = 1 << 20;

/// `tiles` rounded up to whole groups, at least one.
const fn whole_groups(tiles: usize) -> usize {
    if tiles == 0 {
        GROUP_TILES
    } else {
        tiles.next_multiple_of(GROUP_TILES)
    }
}
const _: () = assert!(
    CACHED_BLOCK_TILES.is_multiple_of(GROUP_TILES)
        && STREAMED_BLOCK_TILES.is_multiple_of(GROUP_TILES),
    "blocks hold whole groups"
);

/// `G`, 6x3: the weights' transform `U = G g Gᵀ`.
const G: [[f64; 3]; PATCH] = [
    [1.0 / 4.0, 0.0, 0.0],
    [-1.0 / 6.0, -1.0 / 6.0, -1.0 / 6.0],
    [-1.0 / 6.0, 1.0 / 6.0, -1.0 / 6.0],
    [1.0 / 24.0, 1.0 / 12.0, 1.0 / 6.0],
    [1.0 / 24.0, -1.0 / 12.0, 1.0 / 6.0],
    [0.0, 0.0, 1.0],
];

/// `G₂`, 5x2: the weights' transform of F(4, 2), points 0, 1, -1, 2 and infinity.
const G2: [[f64; 2]; TILE + 1] = [
    [1.0 / 2.0, 0.0],
    [-1.0 / 2.0, -1.0 / 2.0],
    [-1.0 / 6.0, 1.0 / 6.0],
    [1.0 / 6.0, 1.0 / 3.0],
    [0.0, 1.0],
];

/// `Bᵀ`, 6x6: the input transform `V = Bᵀ d B`.
#[cfg(test)]
const BT: [[f64; PATCH]; PATCH] = [
    [4.0, 0.0, -5.0, 0.0, 1.0, 0.0],
    [0.0, -4.0, -4.0, 1.0, 1.0, 0.0],
    [0.0, 4.0, -4.0, -1.0, 1.0, 0.0],
    [0.0, -2.0, -1.0, 2.0, 1.0, 0.0],
    [0.0, 2.0, -1.0, -2.0, 1.0, 0.0],
    [0.0, 4.0, 0.0, -5.0, 0.0, 1.0],
];

/// `Aᵀ`, 4x6: the output transform `Y = Aᵀ M A`.
#[cfg(test)]
const AT: [[f64; PATCH]; TILE] = [
    [1.0, 1.0, 1.0, 1.0, 1.0, 0.0],
    [0.0, 1.0, -1.0, 2.0, -2.0, 0.0],
    [0.0, 1.0, 1.0, 4.0, 4.0, 0.0],
    [0.0, 1.0, -1.0, 8.0, -8.0, 1.0],
];

/// `B₂ᵀ`, 5x5: F(4, 2)'s input transform.
#[cfg(test)]
const BT2: [[f64; TILE + 1]; TILE + 1] = [
    [2.0, -1.0, -2.0, 1.0, 0.0],
    [0.0, -2.0, -1.0, 1.0, 0.0],
    [0.0, 2.0, -3.0, 1.0, 0.0],
    [0.0, -1.0, 0.0, 1.0, 0.0],
    [0.0, 2.0, -1.0, -2.0, 1.0],
];

/// `A₂ᵀ`, 4x5: F(4, 2)'s output transform.
#[cfg(test)]
const AT2: [[f64; TILE + 1]; TILE] = [
    [1.0, 1.0, 1.0, 1.0, 0.0],
    [0.0, 1.0, -1.0, 2.0, 0.0],
    [0.0, 1.0, 1.0, 4.0, 0.0],
    [0.0, 1.0, -1.0, 8.0, 1.0],
];

/// Floats of padding after each point of `V` and `M` in the scratch: one cache line.
///
/// A transform writes (reads) a tile's 36 (stride 2: 81) points at once, one vector in each
/// point's array. Unpadded, the arrays lie `block x channels x 4` bytes apart, a multiple of
/// 4 KiB for the 128- and 256-channel layers' 48-tile blocks (and of 1 KiB for the 64-channel
/// layers' 12), so all the streams fall in the same few L1 sets, whose 8 ways cannot hold them.
/// A line more makes the distance an odd number of lines for the trunk's layers, and the 36
/// streams take 36 different sets (the 81 at most two to a set).
const POINT_PAD: usize = 16;

/// Buffer indices in the argument list.
const SRC: usize = 0;
const WEIGHTS: usize = 1;
const DST: usize = 2;

/// Bytes of one `nChw4c` pixel: a vector of four channels.
const PIXEL_BYTES: i64 = LANES as i64 * F32_BYTES;

/// Everything the Winograd lowering derives from a key.
///
/// A call's tiles are shared evenly, in groups of [`GROUP_TILES`], among `ceil(tiles /
/// block_tiles)` blocks (made even where a block is one work item, see
/// `WinogradPlan::blocks_for`), and each block among `oc_chunks` chunks of output channels: a
/// work item is one chunk of one block, and computes the block's input transform, the GEMMs of
/// its chunk and their output transform. Small transformed weights (the 64-channel layers' 0.6
/// MB) stay in L2 across blocks: 10 tiles a block, one chunk. Larger ones (2.4 MB at 128
/// channels, 9.4 MB at 256) stream from memory once per block: 50 tiles a block, a quarter of
/// the traffic of blocks of 12: with the earlier register tile of 12 tiles by one vector, the
/// trunk ran 5-8% faster with 48 than with 24, and no faster with 72. Two chunks let two threads
/// share one block's weights instead of streaming all of them each (a call that runs both
/// chunks of a block transforms its inputs once; two threads that share a block each do).
///
/// At stride 2 a block is 10 tiles whatever the weights: its 81 points make `V` and `M` 2.25
/// times a stride-1 block's, and with 48 tiles (2 MB of them at 128 channels, twice L2) the
/// trunk's stride-2 layers ran 1.4-2.3x slower on 2 threads than with 12 (layer3.0.conv1 at
/// W=1031: 7.5-10.6 ms against 5.4-7.3; at W=200, one block of 20 tiles that both threads
/// transformed, 2.6-3.3 ms against 1.1-1.5), and no faster on one.
#[derive(Clone, Debug)]
pub struct WinogradPlan {
    pub desc: ConvDesc,
    /// Stride 1 or the polyphase stride 2.
    pub form: Form,
    /// Most tiles per block.
    pub block_tiles: usize,
    /// Work items per block: chunks of output-channel vectors.
    pub oc_chunks: usize,
    /// The transformed weights are larger than `STREAMED_WEIGHT_BYTES` (1 MiB): each block
    /// reads them from beyond L2, and the GEMM prefetches the next weight panel while it
    /// computes the current one.
    pub streamed: bool,
}

impl WinogradPlan {
    pub fn new(d: &ConvDesc) -> Self {
        let oc_blocks = d.oc.div_ceil(LANES);
        let form = Form::of(d);
        let streamed = form.weight_points() * d.ic * oc_blocks * LANES * 4 > STREAMED_WEIGHT_BYTES;
        WinogradPlan {
            desc: d.clone(),
            form,
            block_tiles: if streamed && form == Form::Unit {
                STREAMED_BLOCK_TILES
            } else {
                CACHED_BLOCK_TILES
            },
            oc_chunks: if streamed && oc_blocks.is_multiple_of(2) {
                2
            } else {
                1
            },
            streamed,
        }
    }

    /// The wide tier's input transform of runs of tiles (`None` at x128): the backend's
    /// [`InputTransformTile`], `lanes / 4` tiles a call.
    pub fn input_tile(&self) -> Option<InputTransformTile> {
        let tile = InputTransformTile {
            isa: self.desc.isa,
            patch: self.form.patch(),
            tile_step: (TILE * self.form.stride()) as i64 * PIXEL_BYTES,
        };
        tile.fits().then_some(tile)
    }

    /// The wide tier's output transform of runs of whole tiles (`None` at x128, or where the
    /// backend does not compute a post-op): the backend's [`OutputTransformTile`].
    pub fn output_tile(&self) -> Option<OutputTransformTile> {
        let tile = OutputTransformTile {
            isa: self.desc.isa,
            patch: self.form.patch(),
            bias: self.desc.bias,
            slopes_disp: self.slopes_disp(),
            posts: self.desc.post_ops.clone(),
        };
        tile.fits().then_some(tile)
    }

    /// Whether the GEMM prefetches each weight panel while it computes the one before: where
    /// the weights stream, at stride 1. (At stride 2, whose 10-tile blocks read each panel
    /// for two groups and whose points share weight points, layer3.0.conv1 gained 4-7% at
    /// W=232 and lost 1-2% at W=1031.)
    pub fn prefetches(&self) -> bool {
        self.streamed && self.form == Form::Unit
    }

    /// Output-channel vectors per chunk.
    pub(crate) fn chunk_blocks(&self) -> usize {
        self.desc.oc.div_ceil(LANES) / self.oc_chunks
    }

    /// Blocks of four output channels per weight panel, whose weights lie side by side for
    /// each input channel: a pair (two `xmm` or one `ymm`), or an `avx512` vector's four.
    fn panel_blocks(&self) -> usize {
        GROUP_VECTORS.max(self.desc.isa.target().lanes / LANES)
    }

    /// Blocks of four output channels one register tile computes: a pair of 128-bit vectors,
    /// or two vectors of a wide tier (two panels).
    fn tile_blocks(&self) -> usize {
        match self.desc.isa {
            Isa::X128 => GROUP_VECTORS,
            _ => GROUP_VECTORS * self.panel_blocks(),
        }
    }

    /// Blocks for `tiles` tiles: enough for at most `block_tiles` each and, where a block is
    /// one work item (one chunk), an even number of them when there are several, so that two
    /// threads get the same work. (With 27 blocks of a 64-channel layer's 320 tiles, one
    /// thread had 164 tiles and the other 156.) See [`block_start`].
    fn blocks_for(&self, tiles: usize) -> usize {
        let blocks = tiles.div_ceil(self.block_tiles).max(1);
        if blocks > 1 && !self.oc_chunks.is_multiple_of(2) {
            blocks.next_multiple_of(2)
        } else {
            blocks
        }
    }

    /// Blocks of a fixed-shape key, and the most tiles a block has.
    fn block_split(&self) -> (usize, usize) {
        let tiles: usize = self.tiles().iter().product();
        let blocks = self.blocks_for(tiles);
        (
            blocks,
            GROUP_TILES * tiles.div_ceil(GROUP_TILES).div_ceil(blocks),
        )
    }

    /// Bytes of transformed weights a call of this fixed-shape key reads from beyond L2: all
    /// of them once per block (each of a block's work items reads its chunk's) where they
    /// stream, none where they stay in L2 across blocks.
    pub fn streamed_weight_bytes(&self) -> u64 {
        if !self.streamed {
            return 0;
        }
        self.block_split().0 as u64 * self.packed_weights_len() as u64 * F32_BYTES as u64
    }

    /// Tiles per block of the scratch's layout: the call's own for a fixed-shape key, the most
    /// any call takes (`block_tiles`) for a key with runtime extents; whole groups (at least
    /// one), as the GEMM computes a partial last group's missing tiles (see [`gemm`]).
    fn stride_tiles(&self) -> usize {
        if self.desc.runtime.any() {
            self.block_tiles
        } else {
            whole_groups(self.block_split().1)
        }
    }

    /// The work item that computes output channel `channel` of tile `tile` (numbered by
    /// image, tile row and tile column), for a fixed-shape key.
    pub fn work_item_of(&self, tile: usize, channel: usize) -> usize {
        let tiles: usize = self.tiles().iter().product();
        let (blocks, groups) = (self.blocks_for(tiles), tiles.div_ceil(GROUP_TILES));
        // The last block whose first group (`block_start`) is at most the tile's.
        let block = ((tile / GROUP_TILES + 1) * blocks - 1) / groups;
        block * self.oc_chunks + channel / LANES / self.chunk_blocks()
    }

    /// Input channels rounded up to whole `nChw4c` blocks.
    fn icp(&self) -> usize {
        self.desc.ic.div_ceil(LANES) * LANES
    }

    /// Output channels rounded up to whole `nChw4c` blocks.
    fn ocp(&self) -> usize {
        self.desc.oc.div_ceil(LANES) * LANES
    }

    /// Tiles of the output: images, tile rows and tile columns (0 for a runtime extent).
    pub fn tiles(&self) -> [usize; 3] {
        let d = &self.desc;
        [d.mb, d.oh().div_ceil(TILE), d.ow().div_ceil(TILE)]
    }

    /// The kernel's work items for a fixed-shape key: blocks times output-channel chunks.
    pub fn work_items(&self) -> usize {
        self.block_split().0 * self.oc_chunks
    }

    /// Floats of `V` (transformed input tiles) in the scratch: a point's `block x icp`
    /// floats and a cache line ([`POINT_PAD`]) for each of the form's points.
    fn v_len(&self) -> usize {
        self.form.points() * self.v_point_floats(self.stride_tiles())
    }

    /// Floats from one point of `V` to the next, for `stride` tiles per block.
    fn v_point_floats(&self, stride: usize) -> usize {
        stride * self.icp() + POINT_PAD
    }

    /// Floats from one point of `M` to the next, for `stride` tiles per block.
    fn m_point_floats(&self, stride: usize) -> usize {
        stride * self.m_tile_len() + POINT_PAD
    }

    /// Floats of one tile's GEMM results for one chunk of output channels.
    fn m_tile_len(&self) -> usize {
        self.chunk_blocks() * LANES
    }

    /// Floats of scratch per thread: `V`, then `M` (the GEMMs' results for one chunk),
    /// `block x chunk` floats and a cache line per point.
    pub fn scratch_len(&self) -> usize {
        self.v_len() + self.form.points() * self.m_point_floats(self.stride_tiles())
    }

    /// Bytes from one point of `V` to the next, for `stride` tiles per block (a runtime
    /// value for runtime extents): [`Self::v_point_floats`] in code.
    fn v_point(&self, e: &mut Emit<'_>, stride: Scalar) -> Scalar {
        let bytes = e.mul(stride, self.icp() as i64 * F32_BYTES);
        e.add(bytes, POINT_PAD as i64 * F32_BYTES)
    }

    /// Bytes from one point of `M` to the next: [`Self::m_point_floats`] in code.
    fn m_point(&self, e: &mut Emit<'_>, stride: Scalar) -> Scalar {
        let bytes = e.mul(stride, self.m_tile_len() as i64 * F32_BYTES);
        e.add(bytes, POINT_PAD as i64 * F32_BYTES)
    }

    /// Floats of the packed weights: `U[weight point][oc block][ic][4]`, then the bias and a
    /// PReLU post-op's slopes, each padded to `ocp`.
    pub fn packed_weights_len(&self) -> usize {
        self.slopes_offset() + if self.desc.prelu() { self.ocp() } else { 0 }
    }

    /// Where the packed weights keep `U[point][o][c]`: at the weight point's `ic x ocp`
    /// floats, the chunk's `ic x chunk_blocks` vectors, then the panel of output-channel
    /// vectors that holds `o` ([`Self::panel_blocks`] of them: a pair, or an `avx512` vector's
    /// four), each input channel's vectors side by side, or the chunk's odd last vector alone.
    fn u_float(&self, point: usize, o: usize, c: usize) -> usize {
        let (ic, chunk_blocks, panel) = (self.desc.ic, self.chunk_blocks(), self.panel_blocks());
        let vector = o / LANES;
        let (chunk, q) = (vector / chunk_blocks, vector % chunk_blocks);
        let paired = chunk_blocks / panel * panel;
        let chunk_start = (point * self.ocp() + chunk * chunk_blocks * LANES) * ic;
        let within = if q < paired {
            let (pair, half) = (q / panel, q % panel);
            ((pair * ic + c) * panel + half) * LANES
        } else {
            (paired * ic + c) * LANES
        };
        chunk_start + within + o % LANES
    }

    fn bias_offset(&self) -> usize {
        self.form.weight_points() * self.desc.ic * self.ocp()
    }

    fn slopes_offset(&self) -> usize {
        self.bias_offset() + if self.desc.bias { self.ocp() } else { 0 }
    }

    /// Bytes from a block's bias to its PReLU slopes.
    fn slopes_disp(&self) -> i64 {
        (self.slopes_offset() - self.bias_offset()) as i64 * F32_BYTES
    }

    /// Transforms OIHW 3x3 weights to `U = G g Gᵀ` (in f64, rounded once), packed per weight
    /// point (36; at stride 2, the points whose rows and columns of `G` are the same share
    /// them, [`Form::weight_row`]) and chunk as `[oc panel][ic][2][4]` (at avx512
    /// `[oc panel][ic][4][4]`), and a chunk's odd last vector as `[ic][4]` (see
    /// `WinogradPlan::u_float`): a GEMM's register tile reads its
    /// weights as one sequential stream (the 256-channel layers' 9.4 MB do not fit in L2, and
    /// a stride of a row of output channels defeated the prefetchers), with output channels
    /// padded to whole vectors by zeros (so the padding lanes of the destination get zero plus
    /// their post-ops), followed by the bias and a PReLU post-op's slopes.
    pub fn pack_weights(
        &self,
        weights: &[f32],
        bias: Option<&[f32]>,
        slopes: Option<&[f32]>,
    ) -> Vec<f32> {
        let d = &self.desc;
        let (ic, oc) = (d.ic, d.oc);
        assert_eq!(weights.len(), oc * ic * 9, "OIHW 3x3 weights");
        let mut packed = vec![0.0f32; self.packed_weights_len()];
        let big_g = self.form.g();
        let side = self.form.weight_side();
        for o in 0..oc {
            for c in 0..ic {
                let g = &weights[(o * ic + c) * 9..][..9];
                // G g: points x 3.
                let gg: Vec<[f64; 3]> = big_g
                    .iter()
                    .map(|gi| {
                        std::array::from_fn(|b| {
                            (0..3).map(|a| gi[a] * f64::from(g[a * 3 + b])).sum()
                        })
                    })
                    .collect();
                for (i, gg_row) in gg.iter().enumerate() {
                    for (j, g_row) in big_g.iter().enumerate() {
                        let u: f64 = (0..3).map(|b| gg_row[b] * g_row[b]).sum();
                        packed[self.u_float(i * side + j, o, c)] = u as f32;
                    }
                }
            }
        }
        if let Some(b) = bias {
            assert_eq!(b.len(), oc, "one bias per output channel");
            packed[self.bias_offset()..][..oc].copy_from_slice(b);
        }
        crate::plan::pack_slopes(&mut packed[self.slopes_offset()..], d, slopes);
        packed
    }
}

impl fmt::Display for WinogradPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = &self.desc;
        let [n, th, tw] = self.tiles();
        let extent = |runtime: bool, tiles: usize| {
            if runtime {
                "*".to_string()
            } else {
                tiles.to_string()
            }
        };
        let (patch, points) = (self.form.patch(), self.form.points());
        let form = match self.form {
            Form::Unit => "winograd F(4x4, 3x3)",
            Form::Polyphase => {
                "winograd F(4x4, 3x3) at stride 2, polyphase (F(4x4, 2x2), F(4x4, 2x1), \
                 F(4x4, 1x2) and 1x1 side by side)"
            }
        };
        writeln!(
            f,
            "  {form}: {patch}x{patch} input tiles with stride {}, {n} x {} x {} tiles \
             (images x rows x columns), shared evenly by blocks of at most {} tiles; {} work \
             item(s) per block, one per chunk of {} output channels",
            TILE * self.form.stride(),
            extent(d.runtime.h, th),
            extent(d.runtime.w, tw),
            self.block_tiles,
            self.oc_chunks,
            self.m_tile_len(),
        )?;
        writeln!(
            f,
            "  per work item: input transform into scratch, {points} GEMMs of the block's tiles \
             x {} input x {} output channels (register tile: {} tiles x {} {} oc vectors{}), \
             output transform with bias and post-ops",
            d.ic,
            self.m_tile_len(),
            GROUP_TILES,
            GROUP_VECTORS,
            match d.isa {
                Isa::X128 => "f32x4",
                Isa::Avx2 => "ymm",
                Isa::Avx512 => "zmm",
            },
            if d.isa == Isa::X128 {
                ""
            } else {
                ", x64 backend"
            },
        )?;
        if let Some(tile) = self.input_tile() {
            writeln!(
                f,
                "  transforms: {} tiles of a row at a time in the x64 backend ({}), the others \
                 one by one",
                tile.tiles(),
                if self.output_tile().is_some() {
                    "the output transform's of whole tiles outside a masked last block"
                } else {
                    "the input transform's; the output transform stays x128 for its post-ops"
                },
            )?;
        }
        writeln!(
            f,
            "  scratch: {}{} bytes per thread; transformed weights: {} bytes ({} floats per \
             channel pair, against the direct kernel's 9), {}",
            if d.runtime.any() { "at most " } else { "" },
            self.scratch_len() * 4,
            self.packed_weights_len() * 4,
            self.form.weight_points(),
            match (self.streamed, self.prefetches()) {
                (true, true) => {
                    "streamed from beyond L2 once per block, each panel prefetched during the \
                     one before"
                }
                (true, false) => "streamed from beyond L2 once per block",
                (false, _) => "kept in cache across blocks (in L2 where the L2 is 1 MiB)",
            },
        )
    }
}

/// The 1-D input transform `Bᵀ x` of six vectors.
fn input_1d(e: &mut Emit<'_>, x: [Value; PATCH]) -> [Value; PATCH] {
    let [d0, d1, d2, d3, d4, d5] = x;
    let (c4, c5, c2) = (e.splat_const(4.0), e.splat_const(-5.0), e.splat_const(2.0));
    // r0 = 4 d0 - 5 d2 + d4
    let t = e.fma(c5, d2, d4);
    let r0 = e.fma(c4, d0, t);
    // r1 = -4 (d1 + d2) + (d3 + d4); r2 = 4 (d1 - d2) + (d4 - d3)
    let s12 = e.fadd(d1, d2);
    let s34 = e.fadd(d3, d4);
    let n12 = e.fneg(s12);
    let r1 = e.fma(c4, n12, s34);
    let m12 = e.fsub(d1, d2);
    let m43 = e.fsub(d4, d3);
    let r2 = e.fma(c4, m12, m43);
    // r3 = -2 (d1 - d3) + (d4 - d2); r4 = 2 (d1 - d3) + (d4 - d2)
    let m13 = e.fsub(d1, d3);
    let m42 = e.fsub(d4, d2);
    let n13 = e.fneg(m13);
    let r3 = e.fma(c2, n13, m42);
    let r4 = e.fma(c2, m13, m42);
    // r5 = 4 d1 - 5 d3 + d5
    let t = e.fma(c5, d3, d5);
    let r5 = e.fma(c4, d1, t);
    [r0, r1, r2, r3, r4, r5]
}

/// The 1-D output transform `Aᵀ m` of six vectors.
fn output_1d(e: &mut Emit<'_>, m: [Value; PATCH]) -> [Value; TILE] {
    let [m0, m1, m2, m3, m4, m5] = m;
    let c = e.fadd(m3, m4);
    let d = e.fsub(m3, m4);
    output_rows(e, m0, [m1, m2], [c, d], m5)
}

/// The rows of `Aᵀ` on points 0, 1, -1, 2, -2 and infinity, given the sum `c` and difference
/// `d` of the ±2 points: `[m0 + (m1 + m2) + c, (m1 - m2) + 2 d, (m1 + m2) + 4 c, (m1 - m2) + 8
/// d + last]`. F(4, 2)'s single point 2 is the case `c = d = m3`.
fn output_rows(
    e: &mut Emit<'_>,
    m0: Value,
    [m1, m2]: [Value; 2],
    [c, d]: [Value; 2],
    last: Value,
) -> [Value; TILE] {
    let (c2, c4, c8) = (e.splat_const(2.0), e.splat_const(4.0), e.splat_const(8.0));
    let a = e.fadd(m1, m2);
    let b = e.fsub(m1, m2);
    let o0 = e.fadd(m0, a);
    let o0 = e.fadd(o0, c);
    let o1 = e.fma(c2, d, b);
    let o2 = e.fma(c4, c, a);
    let o3 = e.fma(c8, d, b);
    let o3 = e.fadd(o3, last);
    [o0, o1, o2, o3]
}

/// The 1-D input transform of stride 2's nine vectors: F(4, 2)'s `B₂ᵀ` of the even
/// positions (taps 0 and 2 of consecutive outputs), then the odd positions (tap 1) as they are.
fn input_1d_s2(e: &mut Emit<'_>, x: [Value; PATCH_S2]) -> [Value; PATCH_S2] {
    let [d0, d1, d2, d3, d4] = [x[0], x[2], x[4], x[6], x[8]];
    let (c2, cm2, cm3) = (e.splat_const(2.0), e.splat_const(-2.0), e.splat_const(-3.0));
    // r3 = d3 - d1
    let r3 = e.fsub(d3, d1);
    // r0 = 2 (d0 - d2) + (d3 - d1)
    let m02 = e.fsub(d0, d2);
    let r0 = e.fma(c2, m02, r3);
    // r1 = -2 d1 + (d3 - d2)
    let m32 = e.fsub(d3, d2);
    let r1 = e.fma(cm2, d1, m32);
    // r2 = 2 d1 - 3 d2 + d3
    let t = e.fma(cm3, d2, d3);
    let r2 = e.fma(c2, d1, t);
    // r4 = 2 (d1 - d3) + (d4 - d2)
    let m13 = e.fsub(d1, d3);
    let m42 = e.fsub(d4, d2);
    let r4 = e.fma(c2, m13, m42);
    [r0, r1, r2, r3, r4, x[1], x[3], x[5], x[7]]
}

/// The 1-D output transform of stride 2's nine vectors: `A₂ᵀ` of the first five plus the
/// last four, the two phases' outputs summed.
fn output_1d_s2(e: &mut Emit<'_>, m: [Value; PATCH_S2]) -> [Value; TILE] {
    let sums = output_rows(e, m[0], [m[1], m[2]], [m[3], m[3]], m[4]);
    std::array::from_fn(|i| e.fadd(sums[i], m[5 + i]))
}

/// The form's 1-D input transform of `x` (its patch's length).
fn input_1d_form(e: &mut Emit<'_>, form: Form, x: &[Value]) -> Vec<Value> {
    match form {
        Form::Unit => input_1d(e, x.try_into().expect("six vectors")).to_vec(),
        Form::Polyphase => input_1d_s2(e, x.try_into().expect("nine vectors")).to_vec(),
    }
}

/// The form's 1-D output transform of `m` (its patch's length).
fn output_1d_form(e: &mut Emit<'_>, form: Form, m: &[Value]) -> [Value; TILE] {
    match form {
        Form::Unit => output_1d(e, m.try_into().expect("six vectors")),
        Form::Polyphase => output_1d_s2(e, m.try_into().expect("nine vectors")),
    }
}

/// A 16-byte aligned stack slot of `vectors` f32x4 vectors.
fn vector_slot(e: &mut Emit<'_>, vectors: usize) -> StackSlot {
    let bytes = u32::try_from(vectors as i64 * PIXEL_BYTES).expect("a small slot");
    e.stack_slot(bytes, 4)
}

/// The tile extents of a call: tile rows and columns of the output, and tiles per image.
struct TileGrid {
    tw: Scalar,
    per_image: Scalar,
}

impl TileGrid {
    /// Fresh loads of the call's output extents where they are runtime values: the grid is
    /// recomputed where it is used rather than kept live across the loop nest.
    fn new(e: &mut Emit<'_>, d: &ConvDesc) -> Self {
        let oh = e.extent_or(d.runtime.h, ExtentArg::OutputH, d.oh());
        let ow = e.extent_or(d.runtime.w, ExtentArg::OutputW, d.ow());
        let tiles = |e: &mut Emit<'_>, x: Scalar| match x {
            Scalar::Const(c) => Scalar::Const((c as usize).div_ceil(TILE) as i64),
            Scalar::Dyn(v) => {
                let v = e.offset(v, TILE as i64 - 1);
                Scalar::Dyn(e.ushr_imm(v, 2))
            }
        };
        let (th, tw) = (tiles(e, oh), tiles(e, ow));
        let per_image = match (th, tw) {
            (Scalar::Const(a), Scalar::Const(b)) => Scalar::Const(a * b),
            _ => {
                let (a, b) = (e.value(th), e.value(tw));
                Scalar::Dyn(e.imul(a, b))
            }
        };
        TileGrid { tw, per_image }
    }

    /// `(image, tile row, tile column)` of tile number `l`.
    fn coords(&self, e: &mut Emit<'_>, l: Value) -> (Value, Value, Value) {
        let div = |e: &mut Emit<'_>, x: Value, by: Scalar| -> (Value, Value) {
            let q = match by {
                Scalar::Const(c) => e.udiv_const(x, c as u64),
                Scalar::Dyn(v) => e.udiv(x, v),
            };
            let qd = match by {
                Scalar::Const(c) => e.imul_imm(q, c),
                Scalar::Dyn(v) => e.imul(q, v),
            };
            (q, e.isub(x, qd))
        };
        let (n, r) = div(e, l, self.per_image);
        let (ty, tx) = div(e, r, self.tw);
        (n, ty, tx)
    }

    /// Tiles of all `mb` images.
    fn total(&self, e: &mut Emit<'_>, mb: usize) -> Scalar {
        e.mul(self.per_image, mb as i64)
    }
}

/// Byte strides of an `nChw4c` activation with `channels` channels and `h` x `w` pixels.
struct Blocked {
    image: Scalar,
    block: Scalar,
    row: Scalar,
}

impl Blocked {
    fn new(e: &mut Emit<'_>, channels: usize, h: Scalar, w: Scalar) -> Self {
        let s = e.act_strides(crate::key::Layout::Nchw4c, channels, h, w);
        Blocked {
            image: e.mul(s.image, F32_BYTES),
            block: e.mul(s.block, F32_BYTES),
            row: e.mul(s.row, F32_BYTES),
        }
    }
}

pub fn lower(e: &mut Emit<'_>, plan: &WinogradPlan) {
    let d = &plan.desc;
    let scratch_index = DST + 1 + d.residuals();
    let points = plan.form.points();
    let patch = vector_slot(e, points);
    let in_tmp = vector_slot(e, points);
    let out_tmp = vector_slot(e, TILE * plan.form.patch());
    let info = tile_info_slot(e, plan.block_tiles);
    // Aligned to a cache line: no vector of a wide scratch splits two.
    let mut line_slot = |bytes: usize| {
        let bytes = u32::try_from(bytes).expect("a small slot");
        e.stack_slot(bytes, 6)
    };
    let wide_input = plan.input_tile().map(|tile| {
        let union_cols = plan.form.patch() + (tile.tiles() - 1) * TILE * plan.form.stride();
        let union = plan.form.patch() * union_cols * PIXEL_BYTES as usize;
        (
            tile.clone(),
            (line_slot(tile.tmp_bytes()), line_slot(union)),
        )
    });
    let wide_output = plan
        .output_tile()
        .map(|tile| (tile.clone(), line_slot(tile.tmp_bytes())));
    let (begin, end) = (e.begin, e.end);
    e.for_range(begin, end, &[], |e, item, _| {
        let block = e.udiv_const(item, plan.oc_chunks as u64);
        let chunk = e.urem_const(item, plan.oc_chunks as u64);
        let grid = TileGrid::new(e, d);
        let total = grid.total(e, d.mb);
        let total = e.value(total);
        // `WinogradPlan::blocks_for(total)` blocks share the tiles' groups evenly.
        let blocks = e.offset(total, plan.block_tiles as i64 - 1);
        let mut blocks = e.udiv_const(blocks, plan.block_tiles as u64);
        if !plan.oc_chunks.is_multiple_of(2) {
            // One more block where there are several and an odd number of them.
            let odd = e.band_imm(blocks, 1);
            let several = e.icmp_imm(IntCC::UnsignedGreaterThan, blocks, 1);
            let several = e.zero_extend(several);
            let more = e.band(odd, several);
            blocks = e.iadd(blocks, more);
        }
        let groups = e.offset(total, GROUP_TILES as i64 - 1);
        let groups = e.udiv_const(groups, GROUP_TILES as u64);
        let first = block_start(e, block, groups, blocks);
        let next = e.offset(block, 1);
        let end = block_start(e, next, groups, blocks);
        let end = e.imin(end, total);
        let count = e.isub(end, first);
        // The scratch's tiles per block, the stride of `V` and `M` (see `stride_tiles`).
        let stride = if d.runtime.any() {
            // `block_split`'s most tiles per block: ceil(groups / blocks) whole groups.
            let most = e.iadd(groups, blocks);
            let most = e.offset(most, -1);
            let most = e.udiv(most, blocks);
            Scalar::Dyn(e.imul_imm(most, GROUP_TILES as i64))
        } else {
            Scalar::Const(plan.stride_tiles() as i64)
        };
        let tiles = BlockTiles {
            first,
            count,
            stride,
        };
        let slots = Slots {
            patch,
            in_tmp,
            out_tmp,
            info,
            wide_input: wide_input.clone(),
            wide_output: wide_output.clone(),
        };
        // A block's chunks are consecutive work items: a call that computed the block's
        // previous chunk still has its transformed inputs in its scratch.
        let first_item = e.icmp(IntCC::Equal, item, begin);
        let first_chunk = e.icmp_imm(IntCC::Equal, chunk, 0);
        let fresh = e.bor(first_item, first_chunk);
        e.if_else(
            fresh,
            |e| input_transform(e, plan, &tiles, scratch_index, &slots),
            |_| {},
        );
        gemm(e, plan, &tiles, chunk, scratch_index);
        output_transform(e, plan, &tiles, chunk, scratch_index, &slots);
        Vec::new()
    });
}

/// The first tile of block `block` of `blocks` that share `groups` groups of [`GROUP_TILES`]
/// tiles: floor(block x groups / blocks) groups. Consecutive blocks differ by at most a group,
/// every block but the call's last holds whole groups, and two threads that take half the
/// blocks each get the same number of tiles, give or take a group.
fn block_start(e: &mut Emit<'_>, block: Value, groups: Value, blocks: Value) -> Value {
    let start = e.imul(block, groups);
    let start = e.udiv(start, blocks);
    e.imul_imm(start, GROUP_TILES as i64)
}

/// A work item's block of tiles: its first tile, how many it has, and the tiles per block of
/// the scratch's layout (`V` and `M` strides, see [`WinogradPlan::stride_tiles`]).
struct BlockTiles {
    first: Value,
    count: Value,
    stride: Scalar,
}

/// The kernel's stack slots: a border tile's zeroed patch, the two transforms' intermediate
/// columns, and what the channel loops need of each tile of the block.
struct Slots {
    patch: StackSlot,
    in_tmp: StackSlot,
    out_tmp: StackSlot,
    info: StackSlot,
    /// At a wide tier, the backend's input transform, its scratch, and the zeroed copy of a
    /// run's union window where it reaches outside the input.
    wide_input: Option<(InputTransformTile, (StackSlot, StackSlot))>,
    /// At a wide tier, the backend's output transform and its scratch, where it computes
    /// every post-op.
    wide_output: Option<(OutputTransformTile, StackSlot)>,
}

/// Per tile of a block, three i64s: a byte offset, and two coordinates or extents.
const INFO_BYTES: i64 = 24;

impl Slots {
    /// Stores tile `t`'s three values.
    fn store_info(&self, e: &mut Emit<'_>, t: Value, values: [Value; 3]) {
        let info = e.stack_addr(self.info, 0);
        let at = e.scaled(info, t, INFO_BYTES, 0);
        for (k, v) in values.into_iter().enumerate() {
            e.store_i64(v, at, k as i32 * 8);
        }
    }

    /// Loads tile `t`'s three values.
    fn load_info(&self, e: &mut Emit<'_>, t: Value) -> [Value; 3] {
        let info = e.stack_addr(self.info, 0);
        let at = e.scaled(info, t, INFO_BYTES, 0);
        std::array::from_fn(|k| e.load_i64(at, k as i32 * 8))
    }
}

/// The byte offset of pixel `(y, x)` of image `n` in channel block 0 of an activation.
fn pixel_offset(e: &mut Emit<'_>, strides: &Blocked, n: Value, y: Value, x: Value) -> Value {
    let image = e.value(strides.image);
    let off = e.imul(n, image);
    let row = e.value(strides.row);
    let y_bytes = e.imul(y, row);
    let off = e.iadd(off, y_bytes);
    e.scaled(off, x, PIXEL_BYTES, 0)
}

fn tile_info_slot(e: &mut Emit<'_>, tiles: usize) -> StackSlot {
    let bytes = u32::try_from(tiles as i64 * INFO_BYTES).expect("a small slot");
    e.stack_slot(bytes, 3)
}

/// The input transform of the block's `count` tiles from tile `first` on, into
/// `V[point][channel block][tile][4]`, `stride` tiles per channel block.
///
/// Channel blocks outer, tiles inner: for one channel block, consecutive tiles read the six
/// rows of one input plane in order, six streams the hardware prefetchers follow. Tiles outer
/// interleaved the rows of every plane (96 streams at 64 channels), and the input transform
/// then cost as much as the 64-channel layers' GEMMs.
fn input_transform(
    e: &mut Emit<'_>,
    plan: &WinogradPlan,
    tiles: &BlockTiles,
    scratch_index: usize,
    slots: &Slots,
) {
    let d = &plan.desc;
    let &BlockTiles {
        first,
        count,
        stride,
    } = tiles;
    let zero = e.iconst(0);
    // Each tile's first input pixel (which may lie in the padding) and its byte offset in
    // channel block 0 of the source: computed once per block.
    e.for_range(zero, count, &[], |e, t, _| {
        let grid = TileGrid::new(e, d);
        let l = e.iadd(first, t);
        let (n, ty, tx) = grid.coords(e, l);
        let ih = e.extent_or(d.runtime.h, ExtentArg::InputH, d.ih);
        let iw = e.extent_or(d.runtime.w, ExtentArg::InputW, d.iw);
        let strides = Blocked::new(e, d.ic, ih, row_pixels(d.pitches.src, iw));
        let step = (TILE * plan.form.stride()) as i64;
        let y0 = e.imul_imm(ty, step);
        let y0 = e.offset(y0, -(d.pads.top as i64));
        let x0 = e.imul_imm(tx, step);
        let x0 = e.offset(x0, -(d.pads.left as i64));
        let off = pixel_offset(e, &strides, n, y0, x0);
        slots.store_info(e, t, [off, y0, x0]);
        Vec::new()
    });
    let ih = e.extent_or(d.runtime.h, ExtentArg::InputH, d.ih);
    let iw = e.extent_or(d.runtime.w, ExtentArg::InputW, d.iw);
    let plane = Blocked::new(e, d.ic, ih, row_pixels(d.pitches.src, iw)).block;
    let scratch = e.buffer(scratch_index);
    let v_point = plan.v_point(e, stride);
    let blocks = d.ic.div_ceil(LANES);
    let patch = plan.form.patch();
    // `V[point][channel block][tile][4]`: a channel block's tiles are consecutive vectors.
    let steps = [plane, e.mul(stride, PIXEL_BYTES)];
    let tile_pixels = (TILE * plan.form.stride()) as i64;
    let wide = slots.wide_input.as_ref();
    e.for_ptrs(
        Scalar::Const(blocks as i64),
        &[zero, scratch],
        &steps,
        |e, p| {
            let (plane_off, v_block) = (p[0], p[1]);
            let one_tile = |e: &mut Emit<'_>, t: Value| {
                let [off, y0, x0] = slots.load_info(e, t);
                let ih = e.extent_or(d.runtime.h, ExtentArg::InputH, d.ih);
                let iw = e.extent_or(d.runtime.w, ExtentArg::InputW, d.iw);
                let row = Blocked::new(e, d.ic, ih, row_pixels(d.pitches.src, iw)).row;
                let (ih, iw) = (e.value(ih), e.value(iw));
                let inside = window_inside(e, patch, y0, x0, ih, iw);
                // The pixel (y0, x0) of this channel block: an address only dereferenced at
                // offsets that land inside the input (all of the patch for an inside tile, the
                // clipped rows and columns for the others).
                let src = e.buffer(SRC);
                let src = e.iadd(src, plane_off);
                let src = e.iadd(src, off);
                let row_bytes = e.value(row);
                let vals = e.if_else_values(
                    inside,
                    |_| vec![src, row_bytes],
                    |e| {
                        let clip = [(y0, ih), (x0, iw)];
                        fill_patch(e, [patch, patch], src, row_bytes, slots.patch, clip);
                        let p = e.stack_addr(slots.patch, 0);
                        let s = e.iconst(patch as i64 * PIXEL_BYTES);
                        vec![p, s]
                    },
                );
                let v = e.scaled(v_block, t, PIXEL_BYTES, 0);
                transform_input(e, plan.form, vals[0], vals[1], slots.in_tmp, v, v_point);
            };
            let Some((tile, tmp)) = wide else {
                e.for_range(zero, count, &[], |e, t, _| {
                    one_tile(e, t);
                    Vec::new()
                });
                return;
            };
            // Tile by tile: where the `n` tiles from `t` on (one wide vector's blocks) lie in
            // one tile row, the wide transform takes them, from the input where their windows
            // lie inside it, else from a zeroed copy of their union window, and the next
            // `n - 1` trips skip; elsewhere the tile alone.
            let n = tile.tiles();
            let span = (n - 1) as i64 * tile_pixels;
            let union_cols = patch + (n - 1) * tile_pixels as usize;
            // Windows inside the input prefetch the same windows in the next channel block,
            // if any: a plane further.
            let next_plane = {
                let plane = e.value(plane);
                let last_plane = e.imul_imm(plane, blocks as i64 - 1);
                let more = e.icmp(IntCC::UnsignedLessThan, plane_off, last_plane);
                let none = e.iconst(0);
                e.select(more, plane, none)
            };
            for_runs(e, count, n, |e, t, last, whole| {
                let [off, y0, x0] = slots.load_info(e, t);
                let [off_last, y0_last, x0_last] = slots.load_info(e, last);
                let ih = e.extent_or(d.runtime.h, ExtentArg::InputH, d.ih);
                let iw = e.extent_or(d.runtime.w, ExtentArg::InputW, d.iw);
                let row = Blocked::new(e, d.ic, ih, row_pixels(d.pitches.src, iw)).row;
                let (ih, iw) = (e.value(ih), e.value(iw));
                let same_row = e.icmp(IntCC::Equal, y0, y0_last);
                // Columns `span` apart at `span` pixels' bytes: one row of one image.
                let columns = e.isub(x0_last, x0);
                let columns = e.icmp_imm(IntCC::Equal, columns, span);
                let bytes = e.isub(off_last, off);
                let bytes = e.icmp_imm(IntCC::Equal, bytes, span * PIXEL_BYTES);
                let in_row = [same_row, columns, bytes]
                    .into_iter()
                    .fold(whole, |acc, c| e.band(acc, c));
                let first_inside = window_inside(e, patch, y0, x0, ih, iw);
                let last_inside = window_inside(e, patch, y0_last, x0_last, ih, iw);
                let inside = e.band(first_inside, last_inside);
                // The pixel (y0, x0) of this channel block: dereferenced only inside
                // the input, as in `one_tile`.
                let src = e.buffer(SRC);
                let src = e.iadd(src, plane_off);
                let src = e.iadd(src, off);
                let row_bytes = e.value(row);
                // `ahead`: where the tile prefetches, 0 for none.
                let call = |e: &mut Emit<'_>, src: Value, row_bytes: Value, ahead: Value| {
                    let v = e.scaled(v_block, t, PIXEL_BYTES, 0);
                    let v_point = e.value(v_point);
                    let tmp = e.stack_addr(tmp.0, 0);
                    let args = [src, row_bytes, v, v_point, tmp, ahead];
                    e.call_tile(WideTile::WinogradInput(tile.clone()), &args);
                    vec![e.iconst(n as i64 - 1)]
                };
                e.if_else_values(
                    in_row,
                    |e| {
                        e.if_else_values(
                            inside,
                            |e| call(e, src, row_bytes, next_plane),
                            |e| {
                                let clip = [(y0, ih), (x0, iw)];
                                let window = [patch, union_cols];
                                fill_patch(e, window, src, row_bytes, tmp.1, clip);
                                let p = e.stack_addr(tmp.1, 0);
                                let s = e.iconst(union_cols as i64 * PIXEL_BYTES);
                                // The copy's windows leave the input: no prefetch.
                                let none = e.iconst(0);
                                call(e, p, s, none)
                            },
                        )
                    },
                    |e| {
                        one_tile(e, t);
                        vec![e.iconst(0)]
                    },
                )[0]
            });
        },
    );
}

/// Tile by tile over a block's `count` tiles: at tile `t`, `run(e, t, last, whole)` takes the
/// `n` tiles from `t` on together and returns `n - 1`, the trips that then skip, or takes `t`
/// alone and returns 0. `last` is the run's last tile, clamped into the block; `whole` says
/// whether the block has `n` tiles from `t` on.
fn for_runs(
    e: &mut Emit<'_>,
    count: Value,
    n: usize,
    mut run: impl FnMut(&mut Emit<'_>, Value, Value, Value) -> Value,
) {
    let zero = e.iconst(0);
    e.for_range(zero, count, &[zero], |e, t, carried| {
        let skip = carried[0];
        let skipping = e.icmp_imm(IntCC::SignedGreaterThan, skip, 0);
        e.if_else_values(
            skipping,
            |e| vec![e.offset(skip, -1)],
            |e| {
                let end = e.offset(t, n as i64);
                let whole = e.icmp(IntCC::SignedLessThanOrEqual, end, count);
                let last = e.offset(end, -1);
                let last_tile = e.offset(count, -1);
                let last = e.imin(last, last_tile);
                vec![run(e, t, last, whole)]
            },
        )
    });
}

/// Whether the `patch` x `patch` window at `(y0, x0)` lies inside an `ih` x `iw` input.
fn window_inside(
    e: &mut Emit<'_>,
    patch: usize,
    y0: Value,
    x0: Value,
    ih: Value,
    iw: Value,
) -> Value {
    let top = e.icmp_imm(IntCC::SignedGreaterThanOrEqual, y0, 0);
    let left = e.icmp_imm(IntCC::SignedGreaterThanOrEqual, x0, 0);
    let y1 = e.offset(y0, patch as i64);
    let x1 = e.offset(x0, patch as i64);
    let bottom = e.icmp(IntCC::SignedLessThanOrEqual, y1, ih);
    let right = e.icmp(IntCC::SignedLessThanOrEqual, x1, iw);
    let a = e.band(top, left);
    let b = e.band(bottom, right);
    e.band(a, b)
}

/// Zeroes the `rows` x `cols` slot and copies into it the pixels of the window at `src`
/// (row stride `row_bytes`) that lie inside the input: rows `y0 + r` in `0..ih`, columns `x0
/// + c` in `0..iw`.
fn fill_patch(
    e: &mut Emit<'_>,
    [rows, cols]: [usize; 2],
    src: Value,
    row_bytes: Value,
    slot: StackSlot,
    [(y0, ih), (x0, iw)]: [(Value, Value); 2],
) {
    // The window's rows (columns) `lo..hi` that land in `0..extent`.
    let clip = |e: &mut Emit<'_>, o: Value, extent: Value, side: usize| -> (Value, Value) {
        let zero = e.iconst(0);
        let neg = e.ineg(o);
        let lo = e.imax(neg, zero);
        let hi = e.isub(extent, o);
        let side = e.iconst(side as i64);
        (lo, e.imin(hi, side))
    };
    let base = e.stack_addr(slot, 0);
    let zero = e.splat_const(0.0);
    for i in 0..rows * cols {
        e.store_vec(zero, base, i as i64 * PIXEL_BYTES);
    }
    let (r0, r1) = clip(e, y0, ih, rows);
    let (c0, c1) = clip(e, x0, iw, cols);
    e.for_range(r0, r1, &[], |e, r, _| {
        let row = e.imul(r, row_bytes);
        let src_row = e.iadd(src, row);
        let dst_row = e.scaled(base, r, cols as i64 * PIXEL_BYTES, 0);
        e.for_range(c0, c1, &[], |e, c, _| {
            let s = e.scaled(src_row, c, PIXEL_BYTES, 0);
            let x = e.load_vec(s, 0);
            let p = e.scaled(dst_row, c, PIXEL_BYTES, 0);
            e.store_vec(x, p, 0);
            Vec::new()
        });
        Vec::new()
    });
}

/// `Bᵀ d B` of the form's patch at `ptr` (rows `stride` bytes apart) into `V`: point `k` at
/// `v + k * v_point`. Columns first through `tmp`, so that at most a dozen vectors are live.
fn transform_input(
    e: &mut Emit<'_>,
    form: Form,
    ptr: Value,
    stride: Value,
    tmp: StackSlot,
    v: Value,
    v_point: Scalar,
) {
    let patch = form.patch();
    let mut rows = vec![ptr];
    for _ in 1..patch {
        let last = *rows.last().expect("a first row");
        rows.push(e.iadd(last, stride));
    }
    let t = e.stack_addr(tmp, 0);
    for c in 0..patch {
        let col: Vec<Value> = (0..patch)
            .map(|r| e.load_vec(rows[r], c as i64 * PIXEL_BYTES))
            .collect();
        let out = input_1d_form(e, form, &col);
        for (k, x) in out.into_iter().enumerate() {
            e.store_vec(x, t, (k * patch + c) as i64 * PIXEL_BYTES);
        }
    }
    // The points in order: a runtime `v_point` moves one pointer along them.
    let mut point = v;
    for k in 0..patch {
        let row: Vec<Value> = (0..patch)
            .map(|c| e.load_vec(t, (k * patch + c) as i64 * PIXEL_BYTES))
            .collect();
        let out = input_1d_form(e, form, &row);
        for (m, x) in out.into_iter().enumerate() {
            match v_point {
                Scalar::Const(c) => e.store_vec(x, v, (k * patch + m) as i64 * c),
                Scalar::Dyn(step) => {
                    if k + m > 0 {
                        point = e.iadd(point, step);
                    }
                    e.store_vec(x, point, 0);
                }
            }
        }
    }
}

/// The GEMMs of a work item, one per point of the form: `M[point][oc]` = `Σ_ic V[point][ic] ·
/// U[weight point][ic][oc]` for each of the block's `count` tiles and the output channels of
/// `chunk`, [`GROUP_VECTORS`] output-channel vectors by a group of [`GROUP_TILES`] tiles at a
/// time (a chunk's odd last vector alone). A partial last group computes its missing tiles in
/// vain: `V` and `M` hold whole groups (see [`WinogradPlan::stride_tiles`]).
///
/// `V` is `[point][channel block][tile][4]` and `M` `[point][channel block][tile][4]`: the
/// transforms, which run channel blocks outer and tiles inner, read and write whole cache
/// lines in order (with one tile's channels together, a line was written or read a quarter at
/// a time, once per channel block, and left L1 between the quarters).
fn gemm(
    e: &mut Emit<'_>,
    plan: &WinogradPlan,
    tiles: &BlockTiles,
    chunk: Value,
    scratch_index: usize,
) {
    let d = &plan.desc;
    let &BlockTiles { count, stride, .. } = tiles;
    let f = F32_BYTES;
    let block_bytes = e.mul(stride, PIXEL_BYTES);
    let scratch = e.buffer(scratch_index);
    let v_point = plan.v_point(e, stride);
    let m = e.offset_by(scratch, v_point, plan.form.points() as i64);
    let u_point = d.ic as i64 * plan.ocp() as i64 * f;
    let m_point = plan.m_point(e, stride);
    // One output-channel vector's panel of weights: a vector per input channel.
    let u_panel = d.ic as i64 * PIXEL_BYTES;
    let weights = e.buffer(WEIGHTS);
    let chunk_bytes = e.imul_imm(chunk, plan.chunk_blocks() as i64 * u_panel);
    let u = e.iadd(weights, chunk_bytes);
    let groups = e.offset(count, GROUP_TILES as i64 - 1);
    let groups = Scalar::Dyn(e.udiv_const(groups, GROUP_TILES as u64));
    let group_bytes = Scalar::Const(GROUP_TILES as i64 * PIXEL_BYTES);
    // A register tile's blocks of output channels: a pair of vectors of its tier, or, for a
    // chunk's odd last blocks, one vector (one block at x128; a wide tier's whole vector, as
    // `ConvDesc::tier_for` keeps the keys whose chunks end in part of one at x128).
    let tile_blocks = plan.tile_blocks();
    let (vector_pairs, odd_blocks) = (
        plan.chunk_blocks() / tile_blocks,
        plan.chunk_blocks() % tile_blocks,
    );
    // From one pair of output-channel vectors to the next: their weights, and their rows of `M`.
    let pair_u_bytes = tile_blocks as i64 * u_panel;
    let pair_m_bytes = e.mul(block_bytes, tile_blocks as i64);
    // The end of the weights of every point (the bias follows them).
    let u_limit = e.offset(weights, plan.form.weight_points() as i64 * u_point);
    let prefetching = plan.prefetches() && e.prefetch_weights;
    // The bytes each group of tiles prefetches: the next panel shared among the groups.
    let slice = prefetching.then(|| {
        let groups = e.value(groups);
        PanelPrefetch::slice(e, pair_u_bytes, groups)
    });
    // One point's GEMM: `v`, `u` and `m` at its `V`, the chunk's weights and `M`.
    let point_gemm = |e: &mut Emit<'_>, v: Value, u: Value, m: Value| {
        let tile = RegisterTile {
            tiles: GROUP_TILES,
            block_bytes,
        };
        let prefetch = slice.map(|slice| PanelPrefetch::new(e, plan, u, u_limit, slice));
        // The groups of tiles of one panel (`vectors` vectors at `u`), the next panel's
        // bytes asked for a slice a group.
        let panel = |e: &mut Emit<'_>, vectors: usize, u: Value, m: Value, next: i64| {
            let Some(p) = &prefetch else {
                e.for_ptrs(groups, &[v, m], &[group_bytes, group_bytes], |e, g| {
                    tile.emit(e, plan, vectors, g[0], u, g[1]);
                });
                return;
            };
            let next = e.offset(u, next);
            let (at, left) = p.target(e, next);
            let slice = Scalar::Dyn(p.slice);
            let back = Scalar::Dyn(e.ineg(p.slice));
            e.for_ptrs(
                groups,
                &[v, m, at, left],
                &[group_bytes, group_bytes, slice, back],
                |e, g| {
                    p.emit(e, g[2], g[3]);
                    tile.emit(e, plan, vectors, g[0], u, g[1]);
                },
            );
        };
        let ends = e.for_ptrs(
            Scalar::Const(vector_pairs as i64),
            &[u, m],
            &[Scalar::Const(pair_u_bytes), pair_m_bytes],
            |e, q| panel(e, GROUP_VECTORS, q[0], q[1], pair_u_bytes),
        );
        if odd_blocks > 0 {
            panel(e, 1, ends[0], ends[1], odd_blocks as i64 * u_panel);
        }
    };
    match plan.form {
        Form::Unit => {
            e.for_ptrs(
                Scalar::Const(plan.form.points() as i64),
                &[scratch, u, m],
                &[v_point, Scalar::Const(u_point), m_point],
                |e, p| point_gemm(e, p[0], p[1], p[2]),
            );
        }
        Form::Polyphase => {
            // Weight points outer: the 1, 4 or 16 points that share one run one after the
            // other, while its panels are in cache.
            let side = plan.form.weight_side();
            let patch = plan.form.patch() as i64;
            let zero = e.iconst(0);
            let sides = e.iconst(side as i64);
            // The points of an axis that multiply by weight row `r`: `r` itself, or all from
            // the last row on.
            let axis = |e: &mut Emit<'_>, r: Value| -> (Value, Value) {
                let last = e.icmp_imm(IntCC::Equal, r, side as i64 - 1);
                let next = e.offset(r, 1);
                let end = e.iconst(patch);
                (r, e.select(last, end, next))
            };
            let step = |e: &mut Emit<'_>, base: Value, index: Value, by: Scalar| -> Value {
                let bytes = match by {
                    Scalar::Const(c) => e.imul_imm(index, c),
                    Scalar::Dyn(v) => e.imul(index, v),
                };
                e.iadd(base, bytes)
            };
            e.for_range(zero, sides, &[], |e, wr, _| {
                e.for_range(zero, sides, &[], |e, wc, _| {
                    let w = e.imul_imm(wr, side as i64);
                    let w = e.iadd(w, wc);
                    let u = step(e, u, w, Scalar::Const(u_point));
                    let (r0, r1) = axis(e, wr);
                    let (c0, c1) = axis(e, wc);
                    e.for_range(r0, r1, &[], |e, r, _| {
                        e.for_range(c0, c1, &[], |e, c, _| {
                            let point = e.imul_imm(r, patch);
                            let point = e.iadd(point, c);
                            let v = step(e, scratch, point, v_point);
                            let mp = step(e, m, point, m_point);
                            point_gemm(e, v, u, mp);
                            Vec::new()
                        });
                        Vec::new()
                    });
                    Vec::new()
                });
                Vec::new()
            });
        }
    }
}

/// Where a work item's GEMM prefetches the weights it reads next: while one panel (a pair of
/// output-channel vectors' weights for every input channel, 8 KB at 256 channels) meets the
/// block's groups of tiles, each group asks for a slice of the next panel of the same point
/// and chunk (after the chunk's last panel, of the next weight point's first).
///
/// Why: a panel is read from memory by the block's first group and from L1 by the others, so
/// without it the first group's loads wait on memory at a rate the core's share of bandwidth
/// cannot feed, and the other groups leave the memory idle; the narrow calls, whose blocks
/// have few groups, lost most. In slices, because a whole 8 KB panel asked for at once (128
/// lines) outruns the lines the core can have in flight, and then slowed layer3 down on a
/// busy host, where a slice a group sped it up (docs/decisions/008-winograd-weight-prefetch.md).
struct PanelPrefetch {
    /// The end of the point's chunk of weights.
    chunk_end: Value,
    /// The next weight point's chunk of weights, and its bytes to prefetch (0 after the last
    /// point).
    next_point: Value,
    next_point_bytes: Value,
    /// Bytes of a panel (of a pair of vectors).
    bytes: i64,
    /// Bytes a group prefetches.
    slice: Value,
}

impl PanelPrefetch {
    /// The smallest slice of a panel's `bytes` that `groups` groups cover, in whole lines,
    /// but at least [`PREFETCH_SLICE`]: fewer calls where the groups are many.
    fn slice(e: &mut Emit<'_>, bytes: i64, groups: Value) -> Value {
        let one = e.iconst(1);
        let groups = e.imax(groups, one);
        let share = e.offset(groups, bytes - 1);
        let share = e.udiv(share, groups);
        let share = e.offset(share, LINE_BYTES - 1);
        let share = e.band_imm(share, -LINE_BYTES);
        let least = e.iconst(PREFETCH_SLICE);
        e.imax(share, least)
    }

    /// For the point whose chunk of weights starts at `u`; `u_limit` is the end of the
    /// weights of every point.
    fn new(e: &mut Emit<'_>, plan: &WinogradPlan, u: Value, u_limit: Value, slice: Value) -> Self {
        let u_panel = plan.desc.ic as i64 * PIXEL_BYTES;
        let chunk_bytes = plan.chunk_blocks() as i64 * u_panel;
        let bytes = (plan.tile_blocks() as i64 * u_panel).min(chunk_bytes);
        let u_point = plan.desc.ic as i64 * plan.ocp() as i64 * F32_BYTES;
        let chunk_end = e.offset(u, chunk_bytes);
        let next_point = e.offset(u, u_point);
        // The chunk's weights at the next point lie inside the weights only if there is a
        // next point: `u` is less than a point's weights past its point's start.
        let exists = e.icmp(IntCC::UnsignedLessThan, next_point, u_limit);
        let full = e.iconst(bytes);
        let none = e.iconst(0);
        let next_point_bytes = e.select(exists, full, none);
        PanelPrefetch {
            chunk_end,
            next_point,
            next_point_bytes,
            bytes,
            slice,
        }
    }

    /// Where the panel after the one read now starts and its bytes: the panel at `next` if
    /// it is still in the point's chunk, else the next point's first panel; never a byte
    /// outside the weights.
    fn target(&self, e: &mut Emit<'_>, next: Value) -> (Value, Value) {
        let within = e.icmp(IntCC::UnsignedLessThan, next, self.chunk_end);
        let left = e.isub(self.chunk_end, next);
        let full = e.iconst(self.bytes);
        let within_bytes = e.imin(left, full);
        let start = e.select(within, next, self.next_point);
        let bytes = e.select(within, within_bytes, self.next_point_bytes);
        (start, bytes)
    }

    /// A group's slice: up to `slice` of the `left` bytes at `at`, if any are left.
    fn emit(&self, e: &mut Emit<'_>, at: Value, left: Value) {
        let more = e.icmp_imm(IntCC::SignedGreaterThan, left, 0);
        let slice = self.slice;
        e.if_else(
            more,
            |e| {
                let bytes = e.imin(left, slice);
                e.prefetch(at, bytes);
            },
            |_| {},
        );
    }
}

/// The GEMM's register tile: `tiles` tiles' sums over every input channel for one or
/// [`GROUP_VECTORS`] output-channel vectors of the key's tier (Cranelift's code at `x128`,
/// the x64 backend's [`GemmTile`] at the wide tiers).
struct RegisterTile {
    tiles: usize,
    /// Bytes from one channel block of `V` (and of `M`) to the next.
    block_bytes: Scalar,
}

impl RegisterTile {
    /// The tile's sums for `vectors` output-channel vectors: `v` points to the first tile's
    /// transformed inputs, `u` to the vectors' weights (at `x128`, `[ic][vectors][4]`; at a
    /// wide tier, a panel per vector), `m` to where the
    /// first vector's first tile goes. Per channel, one weight vector per output-channel
    /// vector, then per tile a broadcast shared by the vectors' FMAs.
    fn emit(
        &self,
        e: &mut Emit<'_>,
        plan: &WinogradPlan,
        vectors: usize,
        v: Value,
        u: Value,
        m: Value,
    ) {
        let d = &plan.desc;
        if d.isa != Isa::X128 {
            let tile = GemmTile {
                isa: d.isa,
                tiles: self.tiles,
                vectors,
                channels: d.ic,
                panel_bytes: plan.panel_blocks() as i64 * d.ic as i64 * PIXEL_BYTES,
            };
            let block_bytes = e.value(self.block_bytes);
            e.call_tile(WideTile::WinogradGemm(tile), &[v, u, m, block_bytes]);
            return;
        }
        let f = F32_BYTES;
        let (tiles, block_bytes) = (self.tiles, self.block_bytes);
        // Bytes of one input channel's weights.
        let channel_bytes = vectors as i64 * PIXEL_BYTES;
        let (full_trips, rest) = (d.ic / GEMM_UNROLL, d.ic % GEMM_UNROLL);
        // Where each channel block of a trip starts: an immediate offset from `v` for a
        // constant stride, a pointer per block (an add each) for a runtime one.
        let trip_blocks = |e: &mut Emit<'_>, v: Value| -> Vec<(Value, i64)> {
            let mut bases = Vec::with_capacity(GEMM_UNROLL / LANES);
            for j in 0..(GEMM_UNROLL / LANES) as i64 {
                bases.push(match block_bytes {
                    Scalar::Const(c) => (v, j * c),
                    Scalar::Dyn(step) if j > 0 => {
                        let (previous, _) = bases[j as usize - 1];
                        (e.iadd(previous, step), 0)
                    }
                    Scalar::Dyn(_) => (v, 0),
                });
            }
            bases
        };
        let zero = e.splat_const(0.0);
        // Accumulators vector-major: `acc[j * tiles + t]` is vector `j` of tile `t`.
        let acc = vec![zero; vectors * tiles];
        let step =
            |e: &mut Emit<'_>, bases: &[(Value, i64)], u: Value, s: i64, acc: &mut [Value]| {
                let w: Vec<Value> = (0..vectors as i64)
                    .map(|j| e.load_vec(u, s * channel_bytes + j * PIXEL_BYTES))
                    .collect();
                let (base, offset) = bases[s as usize / LANES];
                let lane = s % LANES as i64 * f;
                for tile in 0..tiles {
                    let x = e.splat_load(base, offset + tile as i64 * PIXEL_BYTES + lane);
                    for (j, &w) in w.iter().enumerate() {
                        let a = &mut acc[j * tiles + tile];
                        *a = e.fma(x, w, *a);
                    }
                }
            };
        let carried: Vec<Value> = [v, u].into_iter().chain(acc.iter().copied()).collect();
        let after = e.for_count(full_trips, &carried, |e, _, state| {
            let (v, u) = (state[0], state[1]);
            let mut acc = state[2..].to_vec();
            let bases = trip_blocks(e, v);
            for s in 0..GEMM_UNROLL as i64 {
                step(e, &bases, u, s, &mut acc);
            }
            let v = e.offset_by(v, block_bytes, (GEMM_UNROLL / LANES) as i64);
            let u = e.offset(u, GEMM_UNROLL as i64 * channel_bytes);
            [v, u].into_iter().chain(acc).collect()
        });
        let (v_rest, u_rest) = (after[0], after[1]);
        let mut acc = after[2..].to_vec();
        if rest > 0 {
            let bases = trip_blocks(e, v_rest);
            for s in 0..rest as i64 {
                step(e, &bases, u_rest, s, &mut acc);
            }
        }
        let mut m_vector = m;
        for (j, sums) in acc.chunks(tiles).enumerate() {
            if j > 0 {
                m_vector = e.offset_by(m_vector, block_bytes, 1);
            }
            for (tile, &a) in sums.iter().enumerate() {
                e.store_vec(a, m_vector, tile as i64 * PIXEL_BYTES);
            }
        }
    }
}

/// The output transform of the block's `count` tiles from tile `first` on, for the output
/// channels of `chunk`: `Aᵀ M A` per tile and channel block, plus the bias and the post-ops,
/// stored once per pixel inside the output. Channel blocks outer, tiles inner, as in
/// [`input_transform`]: consecutive tiles write (and read residuals from) four rows of one
/// plane.
fn output_transform(
    e: &mut Emit<'_>,
    plan: &WinogradPlan,
    tiles: &BlockTiles,
    chunk: Value,
    scratch_index: usize,
    slots: &Slots,
) {
    let d = &plan.desc;
    let &BlockTiles {
        first,
        count,
        stride,
    } = tiles;
    let f = F32_BYTES;
    let zero = e.iconst(0);
    // Each tile's byte offset in channel block 0 of the destination, and its rows and
    // columns inside the output (4 and 4 but at the bottom and right edges).
    e.for_range(zero, count, &[], |e, t, _| {
        let grid = TileGrid::new(e, d);
        let l = e.iadd(first, t);
        let (n, ty, tx) = grid.coords(e, l);
        let oh = e.extent_or(d.runtime.h, ExtentArg::OutputH, d.oh());
        let ow = e.extent_or(d.runtime.w, ExtentArg::OutputW, d.ow());
        let strides = Blocked::new(e, d.oc, oh, row_pixels(d.pitches.dst, ow));
        let (oh, ow) = (e.value(oh), e.value(ow));
        let oy0 = e.imul_imm(ty, TILE as i64);
        let ox0 = e.imul_imm(tx, TILE as i64);
        let four = e.iconst(TILE as i64);
        let rows_left = e.isub(oh, oy0);
        let rows = e.imin(rows_left, four);
        let cols_left = e.isub(ow, ox0);
        let cols = e.imin(cols_left, four);
        let off = pixel_offset(e, &strides, n, oy0, ox0);
        slots.store_info(e, t, [off, rows, cols]);
        Vec::new()
    });
    let oh = e.extent_or(d.runtime.h, ExtentArg::OutputH, d.oh());
    let ow = e.extent_or(d.runtime.w, ExtentArg::OutputW, d.ow());
    let plane = Blocked::new(e, d.oc, oh, row_pixels(d.pitches.dst, ow)).block;
    // The chunk's first channel block, in the destination's planes and in the bias.
    let first_block = e.imul_imm(chunk, plan.chunk_blocks() as i64);
    let plane_v = e.value(plane);
    let plane_off = e.imul(first_block, plane_v);
    let scratch = e.buffer(scratch_index);
    let v_point = plan.v_point(e, stride);
    let m = e.offset_by(scratch, v_point, plan.form.points() as i64);
    let (form, patch) = (plan.form, plan.form.patch());
    let mut ptrs = vec![plane_off, m];
    let mut steps = vec![plane, e.mul(stride, PIXEL_BYTES)];
    // The block's channel parameters: its bias, then its PReLU slopes.
    let params = d.bias || d.prelu();
    if params {
        let w = e.buffer(WEIGHTS);
        let w = e.offset(w, plan.bias_offset() as i64 * f);
        ptrs.push(e.scaled(w, first_block, PIXEL_BYTES, 0));
        steps.push(Scalar::Const(PIXEL_BYTES));
    }
    // The padding lanes of a last, partial block get +0, not zero weights times the input
    // (NaN where it is not finite), which the next convolution's zero weights would carry
    // into its real channels: the block's index rides along, last, to pick the mask.
    let real = d.oc % LANES;
    if real != 0 {
        ptrs.push(first_block);
        steps.push(Scalar::Const(1));
    }
    let m_point = plan.m_point(e, stride);
    e.for_ptrs(
        Scalar::Const(plan.chunk_blocks() as i64),
        &ptrs,
        &steps,
        |e, p| {
            let (plane_off, m_block) = (p[0], p[1]);
            // The last block when its padding lanes need the mask.
            let last_block = (real != 0).then(|| {
                let block = *p.last().expect("the block index");
                e.icmp_imm(IntCC::Equal, block, d.oc.div_ceil(LANES) as i64 - 1)
            });
            let one_tile = |e: &mut Emit<'_>, t: Value| {
                // Loaded per tile: no vector stays live across a wide tile's call.
                let bias = d.bias.then(|| e.load_vec(p[2], 0));
                let slopes = d.prelu().then(|| (p[2], plan.slopes_disp()));
                let mask = last_block.map(|last| {
                    let padded = e.lane_mask(real);
                    let whole = e.lane_mask(LANES);
                    e.select(last, padded, whole)
                });
                let [off, rows, cols] = slots.load_info(e, t);
                let full = {
                    let a = e.icmp_imm(IntCC::Equal, rows, TILE as i64);
                    let b = e.icmp_imm(IntCC::Equal, cols, TILE as i64);
                    e.band(a, b)
                };
                let tile_off = e.iadd(plane_off, off);
                let at_buffer = |e: &mut Emit<'_>, buffer: usize| {
                    let b = e.buffer(buffer);
                    e.iadd(b, tile_off)
                };
                let dst = at_buffer(e, DST);
                let residuals: Vec<Value> = (0..d.residuals())
                    .map(|r| at_buffer(e, DST + 1 + r))
                    .collect();
                let m = e.scaled(m_block, t, PIXEL_BYTES, 0);
                let tmp_addr = e.stack_addr(slots.out_tmp, 0);
                // Point `patch i + j` of column `j`: an immediate offset from `m` for a
                // constant `m_point`, a pointer moved along each column for a runtime one.
                let m_row = e.mul(m_point, patch as i64);
                let mut column = m;
                for j in 0..patch {
                    let col: Vec<Value> = match m_point {
                        Scalar::Const(c) => (0..patch)
                            .map(|i| e.load_vec(m, (i * patch + j) as i64 * c))
                            .collect(),
                        Scalar::Dyn(step) => {
                            if j > 0 {
                                column = e.iadd(column, step);
                            }
                            let row = e.value(m_row);
                            let mut at = column;
                            (0..patch)
                                .map(|i| {
                                    if i > 0 {
                                        at = e.iadd(at, row);
                                    }
                                    e.load_vec(at, 0)
                                })
                                .collect()
                        }
                    };
                    let out = output_1d_form(e, form, &col);
                    for (k, x) in out.into_iter().enumerate() {
                        e.store_vec(x, tmp_addr, (k * patch + j) as i64 * PIXEL_BYTES);
                    }
                }
                let oh = e.extent_or(d.runtime.h, ExtentArg::OutputH, d.oh());
                let ow = e.extent_or(d.runtime.w, ExtentArg::OutputW, d.ow());
                let row_bytes = Blocked::new(e, d.oc, oh, row_pixels(d.pitches.dst, ow)).row;
                let row_bytes = e.value(row_bytes);
                let store_rows = |e: &mut Emit<'_>, guard: Option<(Value, Value)>| {
                    let tmp_addr = e.stack_addr(slots.out_tmp, 0);
                    for k in 0..TILE {
                        let row: Vec<Value> = (0..patch)
                            .map(|j| e.load_vec(tmp_addr, (k * patch + j) as i64 * PIXEL_BYTES))
                            .collect();
                        let y = output_1d_form(e, form, &row);
                        let k_off = e.imul_imm(row_bytes, k as i64);
                        for (mcol, x) in y.into_iter().enumerate() {
                            let px = mcol as i64 * PIXEL_BYTES;
                            let pixel = |e: &mut Emit<'_>| {
                                let x = match bias {
                                    Some(b) => e.fadd(x, b),
                                    None => x,
                                };
                                let x = post_ops(e, d, x, slopes, &residuals, k_off, px);
                                let x = match mask {
                                    Some(m) => e.keep_lanes(x, m),
                                    None => x,
                                };
                                let at = e.iadd(dst, k_off);
                                e.store_vec(x, at, px);
                            };
                            match guard {
                                None => pixel(e),
                                Some((rows, cols)) => {
                                    let r = e.icmp_imm(IntCC::SignedGreaterThan, rows, k as i64);
                                    let c = e.icmp_imm(IntCC::SignedGreaterThan, cols, mcol as i64);
                                    let both = e.band(r, c);
                                    e.if_else(both, pixel, |_| {});
                                }
                            }
                        }
                    }
                };
                e.if_else(
                    full,
                    |e| store_rows(e, None),
                    |e| store_rows(e, Some((rows, cols))),
                );
            };
            let Some((tile, tmp)) = slots.wide_output.as_ref() else {
                e.for_range(zero, count, &[], |e, t, _| {
                    one_tile(e, t);
                    Vec::new()
                });
                return;
            };
            // Tile by tile: where the `n` tiles from `t` on (one wide vector's blocks) are whole
            // tiles of one tile row (outside the masked last block), the wide transform takes
            // them and the next `n - 1` trips skip; elsewhere the tile alone.
            let n = tile.tiles();
            for_runs(e, count, n, |e, t, last, whole| {
                let [off, rows, cols] = slots.load_info(e, t);
                let [off_last, rows_last, cols_last] = slots.load_info(e, last);
                // Whole tiles `n - 1` tiles' bytes apart lie in one tile row: tiles of
                // the next row or image start at least three rows of pixels further.
                let bytes = e.isub(off_last, off);
                let span = (n - 1) as i64 * TILE as i64 * PIXEL_BYTES;
                let adjacent = e.icmp_imm(IntCC::Equal, bytes, span);
                let mut run = e.band(whole, adjacent);
                for x in [rows, cols, rows_last, cols_last] {
                    let four = e.icmp_imm(IntCC::Equal, x, TILE as i64);
                    run = e.band(run, four);
                }
                if let Some(last_block) = last_block {
                    let unmasked = e.bxor_imm(last_block, 1);
                    run = e.band(run, unmasked);
                }
                e.if_else_values(
                    run,
                    |e| {
                        let tile_off = e.iadd(plane_off, off);
                        let at_buffer = |e: &mut Emit<'_>, buffer: usize| {
                            let b = e.buffer(buffer);
                            e.iadd(b, tile_off)
                        };
                        let m = e.scaled(m_block, t, PIXEL_BYTES, 0);
                        let m_point = e.value(m_point);
                        let dst = at_buffer(e, DST);
                        let oh = e.extent_or(d.runtime.h, ExtentArg::OutputH, d.oh());
                        let ow = e.extent_or(d.runtime.w, ExtentArg::OutputW, d.ow());
                        let row = Blocked::new(e, d.oc, oh, row_pixels(d.pitches.dst, ow)).row;
                        let row_bytes = e.value(row);
                        // Without a bias or slopes the tile reads nothing there.
                        let bias = if params { p[2] } else { m };
                        let tmp = e.stack_addr(*tmp, 0);
                        let mut args = vec![m, m_point, dst, row_bytes, bias, tmp];
                        args.extend((0..d.residuals()).map(|r| at_buffer(e, DST + 1 + r)));
                        e.call_tile(WideTile::WinogradOutput(tile.clone()), &args);
                        vec![e.iconst(n as i64 - 1)]
                    },
                    |e| {
                        one_tile(e, t);
                        vec![e.iconst(0)]
                    },
                )[0]
            });
        },
    );
}

/// The key's post-ops on one output vector; `slopes` is where its block's PReLU slopes are (a
/// base and a displacement), residual `i` is read at `residuals[i] + row + px`, the pixel's
/// own place, right before the pixel is stored.
fn post_ops(
    e: &mut Emit<'_>,
    d: &ConvDesc,
    x: Value,
    slopes: Option<(Value, i64)>,
    residuals: &[Value],
    row: Value,
    px: i64,
) -> Value {
    let slopes = |e: &mut Emit<'_>| {
        let (base, disp) = slopes.expect("a prelu block's slopes");
        e.load_vec(base, disp)
    };
    apply_post_ops(e, &d.post_ops, x, None, slopes, |e, i| {
        let at = e.iadd(residuals[i], row);
        e.load_vec(at, px)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Bᵀ` and `Aᵀ` of a form, as matrices: stride 2's are F(4, 2)'s on the even positions
    /// (points) beside the odd positions taken as they are.
    fn form_matrices(form: Form) -> (Vec<Vec<f64>>, Vec<Vec<f64>>) {
        match form {
            Form::Unit => (
                BT.iter().map(|r| r.to_vec()).collect(),
                AT.iter().map(|r| r.to_vec()).collect(),
            ),
            Form::Polyphase => {
                let mut bt = vec![vec![0.0; PATCH_S2]; PATCH_S2];
                for (i, row) in BT2.iter().enumerate() {
                    for (k, &x) in row.iter().enumerate() {
                        bt[i][2 * k] = x;
                    }
                }
                for k in 0..TILE {
                    bt[TILE + 1 + k][2 * k + 1] = 1.0;
                }
                let at = (0..TILE)
                    .map(|i| {
                        let mut row = AT2[i].to_vec();
                        row.extend((0..TILE).map(|k| if k == i { 1.0 } else { 0.0 }));
                        row
                    })
                    .collect();
                (bt, at)
            }
        }
    }

    /// `Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A` is the 4x4 correlation of a patch with a 3x3 kernel at the
    /// form's stride (6x6 at stride 1, 9x9 at stride 2), to f64 rounding: the matrices here
    /// and the weights' packing agree.
    #[test]
    fn the_transforms_compute_a_correlation() {
        let mut seed = 1u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 33) as f64 / (1u64 << 31) as f64) - 0.5
        };
        for form in [Form::Unit, Form::Polyphase] {
            let (bt, at) = form_matrices(form);
            let (n, s) = (form.patch(), form.stride());
            for _ in 0..20 {
                let dpatch: Vec<f64> = (0..n * n).map(|_| next()).collect();
                let g: Vec<f32> = (0..9).map(|_| next() as f32).collect();
                let mut d = ConvDesc::new(1, 1, [9, 9], 1, [3, 3]);
                d.strides = [s, s];
                d.algo = crate::key::ConvAlgo::WinogradF4x3;
                let plan = WinogradPlan::new(&d);
                assert_eq!(plan.form, form);
                let u = plan.pack_weights(&g, None, None);
                // V = Bᵀ d B
                let mut v = vec![vec![0.0f64; n]; n];
                for i in 0..n {
                    for j in 0..n {
                        v[i][j] = (0..n)
                            .flat_map(|a| (0..n).map(move |b| (a, b)))
                            .map(|(a, b)| bt[i][a] * dpatch[a * n + b] * bt[j][b])
                            .sum();
                    }
                }
                for y in 0..TILE {
                    for x in 0..TILE {
                        let wino: f64 = (0..n)
                            .flat_map(|a| (0..n).map(move |b| (a, b)))
                            .map(|(a, b)| {
                                let ocp = 4;
                                let w =
                                    form.weight_row(a) * form.weight_side() + form.weight_row(b);
                                at[y][a] * f64::from(u[w * ocp]) * v[a][b] * at[x][b]
                            })
                            .sum();
                        let direct: f64 = (0..3)
                            .flat_map(|a| (0..3).map(move |b| (a, b)))
                            .map(|(a, b)| {
                                dpatch[(s * y + a) * n + s * x + b] * f64::from(g[a * 3 + b])
                            })
                            .sum();
                        assert!(
                            (wino - direct).abs() < 1e-6,
                            "{form:?} ({y}, {x}): {wino} vs {direct}"
                        );
                    }
                }
            }
        }
    }

    /// The points of `V` and of `M` start in as many different sets of a 32 KiB, 8-way L1
    /// (64 sets of 64-byte lines, set = address bits 6-11) as there are sets, up to 64, for
    /// the trunk's layers, at every block a call may take (whole groups of tiles up to
    /// `block_tiles`), so that a transform's 36 (stride 2: 81) streams do not evict each
    /// other: at most two share a set.
    #[test]
    fn the_points_of_v_and_m_fall_in_different_l1_sets() {
        // The most points that start in one set.
        let crowding = |points: usize, point_floats: usize| -> usize {
            let mut per_set = [0usize; 64];
            for p in 0..points {
                per_set[p * point_floats * F32_BYTES as usize / 64 % 64] += 1;
            }
            per_set.into_iter().max().unwrap_or(0)
        };
        for (ic, oc, stride) in [
            (64, 64, 1),
            (128, 128, 1),
            (256, 256, 1),
            (64, 128, 2),
            (128, 256, 2),
        ] {
            let mut d = ConvDesc::new(1, ic, [40, 130], oc, [3, 3]);
            d.strides = [stride, stride];
            d.algo = crate::key::ConvAlgo::WinogradF4x3;
            let plan = WinogradPlan::new(&d);
            let points = plan.form.points();
            for tiles in (GROUP_TILES..=plan.block_tiles).step_by(GROUP_TILES) {
                for (what, floats) in [
                    ("V", plan.v_point_floats(tiles)),
                    ("M", plan.m_point_floats(tiles)),
                ] {
                    assert_eq!(
                        crowding(points, floats),
                        points.div_ceil(64),
                        "{ic} to {oc} channels, stride {stride}, {tiles} tiles: {what}'s \
                         points crowd a set"
                    );
                }
            }
        }
    }

    /// Two threads, each taking half of a call's work items as `Kernel::run` splits them,
    /// get the same work give or take a group of tiles per chunk, and every block holds at
    /// most `block_tiles` tiles, whole groups of them but for the call's last block.
    #[test]
    fn two_threads_get_the_same_tiles() {
        for (ic, oc) in [(64, 64), (256, 256)] {
            for rows in [1, 4, 17, 40, 80] {
                for cols in [1, 5, 16, 48, 63, 64, 250] {
                    let mut d = ConvDesc::new(1, ic, [rows, cols], oc, [3, 3]);
                    d.pads = primjit_ir::Pads::uniform(1);
                    d.algo = crate::key::ConvAlgo::WinogradF4x3;
                    let plan = WinogradPlan::new(&d);
                    let (chunks, chunk_channels) = (plan.oc_chunks, plan.m_tile_len());
                    let tiles: usize = plan.tiles().iter().product();
                    let (blocks, most) = plan.block_split();
                    assert!(most <= plan.block_tiles && most.is_multiple_of(GROUP_TILES));
                    // Tiles per work item.
                    let mut work = vec![0usize; plan.work_items()];
                    for tile in 0..tiles {
                        for chunk in 0..chunks {
                            work[plan.work_item_of(tile, chunk * chunk_channels)] += 1;
                        }
                    }
                    for b in 0..blocks {
                        let n = work[b * chunks];
                        assert!(n > 0 && n <= most, "{rows}x{cols}: block {b} has {n} tiles");
                        assert!(
                            n.is_multiple_of(GROUP_TILES) || b + 1 == blocks,
                            "{rows}x{cols}: block {b} has {n} tiles"
                        );
                    }
                    let items = work.len();
                    let (first, second) = work.split_at(items / 2);
                    let (first, second) = (first.iter().sum::<usize>(), second.iter().sum());
                    if items > 1 {
                        assert!(
                            first.abs_diff(second) <= GROUP_TILES * chunks,
                            "{ic} channels, {rows}x{cols}: {tiles} tiles in {blocks} blocks: \
                             {first} against {second}"
                        );
                    }
                }
            }
        }
    }
}
