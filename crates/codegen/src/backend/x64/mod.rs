//! The wide tiers' x86-64 emitter: register tiles and peak loops in AVX2 (`ymm`) or AVX-512
//! (`zmm`), assembled with iced-x86's code assembler.
//!
//! Cranelift's x64 backend has no 256- or 512-bit instructions, so the innermost part of a
//! kernel, the register tile, comes from here at those tiers, and Cranelift keeps the loop
//! nest, the borders and the runtime extents around it. A tile is a leaf function in the
//! System V convention that touches only caller-saved registers, so the Cranelift code around
//! it needs nothing but the call.

use iced_x86::BlockEncoderOptions;
use iced_x86::code_asm::registers::{xmm::*, ymm::*, zmm::*};
use iced_x86::code_asm::{
    AsmMemoryOperand, AsmRegister32, AsmRegister64, AsmRegisterXmm, AsmRegisterYmm, AsmRegisterZmm,
    CodeAssembler, CodeLabel, dword_ptr, eax, k2, ptr, qword_ptr, r8, r8d, r9, r10, r11, rax, rcx,
    rdi, rdx, rsi, rsp, xmmword_ptr,
};

use crate::key::PostOpDesc;
use crate::target::Isa;
use crate::tile::{
    GLOBAL_CHAINS, LANEWISE_STAGED, PEAK_CHAINS, PEAK_TILE_CHANNELS, WidePattern,
    lanewise_row_vectors,
};

/// A source operand: a register, or a splat from the constant pool.
#[derive(Clone, Copy)]
pub(crate) enum Src {
    Reg(usize),
    Mem(AsmMemoryOperand),
}

/// `d = a op b` for an instruction of the form `op d, a, b/m` at either wide tier.
macro_rules! three {
    ($asm:expr, $op:ident, $d:expr, $a:expr, $b:expr) => {{
        let (d, a): (usize, usize) = ($d, $a);
        let res = match ($asm.wide(), $b) {
            (true, Src::Reg(b)) => $asm.a.$op(ZMM[d], ZMM[a], ZMM[b]),
            (true, Src::Mem(m)) => $asm.a.$op(ZMM[d], ZMM[a], ptr(m)),
            (false, Src::Reg(b)) => $asm.a.$op(YMM[d], YMM[a], YMM[b]),
            (false, Src::Mem(m)) => $asm.a.$op(YMM[d], YMM[a], ptr(m)),
        };
        ok(res);
    }};
}

mod activation;
use activation::{Chain, chains_per_group};
mod eltwise;
mod micro;
use micro::MicroKernel;
mod winograd;

pub use eltwise::{EltwiseOp, EltwiseOperand, EltwiseTile};
pub use winograd::{InputTransformTile, OutputTransformTile};

/// Bytes of one block of four channels' pixel in `nChw4c`, the unit a wide vector's lanes
/// are stored in: a wide vector of output channels spans `lanes / 4` blocks.
const BLOCK_PIXEL_BYTES: i64 = 16;

/// How a tile's accumulators start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TileInit {
    Zero,
    /// From the bias (the tile's `bias` argument, vector `u` at `u * lanes` floats).
    Bias,
    /// From the partial sums a previous chunk of the reduction left in the destination.
    Partial,
}

/// How a tile ends.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum TileFinish {
    /// The post-ops in their order, then the store.
    PostOps(Vec<PostOpDesc>),
    /// The partial sums, stored for the next chunk.
    Partial,
}

/// One step of the reduction within a kernel-row trip: a weight row at `w` bytes from the
/// trip's weights, times the input at `x[p]` bytes from the trip's source for each pixel, or
/// not at all where `x[p]` is `None` (a border pixel whose window misses that kernel column).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TileUnit {
    pub w: i64,
    pub x: Vec<Option<i64>>,
}

/// A direct convolution's register tile, `pixels` x `vectors` accumulators of the tier's
/// width: the same products in the same order as the 128-bit tile of `conv::direct`, so that a
/// pixel's sum has the same bits whichever tile computes it.
///
/// The tile is called as `fn(src, weights, dst, kh_count, kh_src_step, ic_src_step,
/// dst_block_bytes, bias, residuals...)`, `bias` pointing at the tile's channel parameters:
/// its bias (read by [`TileInit::Bias`]), then `slopes_disp` bytes on, the slopes of a PReLU
/// post-op. `steps` trips of the channel loop, each of
/// `kh_count` kernel-row trips of `units`; after a kernel row the source moves by
/// `kh_src_step` bytes and the weights by `per_kh`; after a channel step the source moves
/// to `ic_src_step` bytes past where the step began and the weights to `ic_w_step`. Vector
/// `u`'s weights are `w_vecs[u]` bytes from a unit's; its lanes are stored in the
/// destination's blocks `u * lanes / 4 ..`, `dst_block_bytes` apart, a pixel `dst_pixel_bytes`
/// after the one before (16, or a multiple for a transposed convolution's phase).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DirectTile {
    pub isa: Isa,
    pub pixels: usize,
    pub w_vecs: Vec<i64>,
    /// Blocks of four output channels in the last vector when it is not full (1 to
    /// `lanes / 4 - 1`), else 0: an `avx512` tail runs under an opmask, an `avx2` one (a single
    /// block) on the low `xmm` half. It reads and writes only its blocks.
    pub tail_blocks: usize,
    pub steps: usize,
    pub units: Vec<TileUnit>,
    pub per_kh: i64,
    pub ic_w_step: i64,
    pub dst_pixel_bytes: i64,
    pub slopes_disp: i64,
    pub init: TileInit,
    pub finish: TileFinish,
}

/// A depthwise convolution's register tile at a wide tier (`ConvPlan::lanewise`): one
/// accumulator per entry of `vectors`, each up to `lanes / 4` consecutive output pixels of one
/// block of four channels, which `nChw4c` stores side by side. Each pixel's sum starts from the
/// bias (or zero) and adds its taps in the order of `units`, one fused multiply-add each, as
/// the 128-bit lane-wise tile of `conv::direct` sums it: the bits are the same at every tier.
///
/// The tile is called as `fn(src, weights, dst, kh_count, kh_src_step, bias, residuals...)`
/// (`bias`: the block's bias, read with `bias`, then `slopes_disp` bytes on its PReLU slopes):
/// `kh_count` kernel-row trips of `units`, after each of which the source moves by
/// `kh_src_step` bytes and the weights by `per_kh`. A unit's four weights at `w` bytes from
/// the trip's, repeated across the vector, multiply the input vector at `x[j]` bytes from the
/// trip's source for accumulator `j`, or not at all where `x[j]` is `None` (a border pixel
/// whose window misses that tap): its pixels' blocks `pixel_step` bytes apart, one load at
/// unit stride (16 bytes), one per block gathered into a register at a larger stride. Vector
/// `j`'s sums go to `dst + 16 * first` (its first pixel's block), its residuals' from the same
/// offset. A vector of fewer pixels (its low blocks) reads, writes and sums only those,
/// so a row's odd pixels and its border columns need no 128-bit tile of their own; the
/// partial vectors of one tile hold the same number of pixels (one opmask at `avx512`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LanewiseTile {
    pub isa: Isa,
    pub vectors: Vec<LaneVector>,
    pub units: Vec<LanewiseUnit>,
    pub pixel_step: i64,
    pub per_kh: i64,
    pub bias: bool,
    pub slopes_disp: i64,
    pub posts: Vec<PostOpDesc>,
}

/// The output pixels of one accumulator of a [`LanewiseTile`]: `pixels` (1 to `lanes / 4`)
/// from pixel `first` of the call on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LaneVector {
    pub first: usize,
    pub pixels: usize,
}

/// One kernel tap of a [`LanewiseTile`]: its weights at `w` bytes from the trip's, and each
/// vector's input at `x[j]` bytes from the trip's source, `None` where vector `j`'s pixels
/// skip the tap.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LanewiseUnit {
    pub w: i64,
    pub x: Vec<Option<i64>>,
}

impl LanewiseTile {
    /// Registers below the accumulators: the weights (the epilogue's zero), the clip
    /// bounds and a residual.
    const FIRST_ACCUMULATOR: usize = LANEWISE_STAGED;
    const WEIGHTS: usize = 0;
    /// The input vector gathered from strided pixels' blocks.
    const GATHERED: usize = 1;

    /// Pixels of the partial vectors, if any (all alike, [`Self::fits`]).
    fn partial_pixels(&self) -> Option<usize> {
        let full = self.isa.target().lanes / 4;
        self.vectors.iter().map(|v| v.pixels).find(|&p| p < full)
    }

    fn lanes(&self, j: usize) -> Lanes {
        match (
            self.vectors[j].pixels == self.isa.target().lanes / 4,
            self.isa,
        ) {
            (true, _) => Lanes::Full,
            (false, Isa::Avx512) => Lanes::Masked,
            (false, _) => Lanes::Low,
        }
    }

    /// Bytes from the call's destination to vector `j`'s.
    fn dst_offset(&self, j: usize) -> i64 {
        self.vectors[j].first as i64 * BLOCK_PIXEL_BYTES
    }

    /// Whether the tile fits the tier's registers and its offsets 32-bit displacements.
    pub fn fits(&self) -> bool {
        let full = self.isa.target().lanes / 4;
        let reach = self
            .units
            .iter()
            .flat_map(|u| u.x.iter().flatten().chain([&u.w]));
        // From a vector's first pixel block to its last.
        let span = self.pixel_step.checked_mul(full as i64 - 1);
        let gathers_fit = self
            .units
            .iter()
            .flat_map(|u| u.x.iter().flatten())
            .all(|&x| {
                span.and_then(|s| x.checked_add(s))
                    .is_some_and(|end| i32::try_from(end).is_ok())
            });
        let partial = self.partial_pixels();
        self.isa != Isa::X128
            && !self.vectors.is_empty()
            && self.vectors.iter().all(|v| (1..=full).contains(&v.pixels))
            && self
                .vectors
                .iter()
                .all(|v| v.pixels == full || Some(v.pixels) == partial)
            && (self.isa == Isa::Avx512 || partial.is_none_or(|p| p == 1))
            && self.pixel_step >= BLOCK_PIXEL_BYTES
            && gathers_fit
            && self.vectors.len() <= lanewise_row_vectors(self.isa)
            && self.units.iter().all(|u| u.x.len() == self.vectors.len())
            && reach
                .chain([&self.per_kh])
                .all(|&x| i32::try_from(x).is_ok())
            && (0..self.vectors.len()).all(|j| i32::try_from(self.dst_offset(j)).is_ok())
    }

    /// The tile's machine code, for any address.
    ///
    /// # Panics
    ///
    /// If the tile does not [`fit`](Self::fits): the lowering's to rule out.
    pub fn assemble(&self) -> TileCode {
        assert!(
            self.fits(),
            "a wide lane-wise tile that does not fit its tier: {self:?}"
        );
        let mut a = Asm::new(self.isa);
        let acc = |j: usize| Self::FIRST_ACCUMULATOR + j;
        if let Some(pixels) = self.partial_pixels()
            && self.isa == Isa::Avx512
        {
            // k1: the partial vectors' lanes, a block of four per pixel.
            use iced_x86::code_asm::k1;
            ok(a.a.mov(eax, (1u32 << (4 * pixels)) - 1));
            ok(a.a.kmovw(k1, eax));
        }
        for j in 0..self.vectors.len() {
            if self.bias {
                a.broadcast_block(acc(j), r9);
            } else {
                a.zero(acc(j));
            }
        }
        let mut kh_loop = a.a.create_label();
        let mut kh_done = a.a.create_label();
        ok(a.a.test(rcx, rcx));
        ok(a.a.jz(kh_done));
        ok(a.a.set_label(&mut kh_loop));
        for unit in &self.units {
            a.broadcast_block(Self::WEIGHTS, rsi + disp(unit.w));
            for (j, x) in unit.x.iter().enumerate() {
                let Some(x) = *x else { continue };
                if self.pixel_step == BLOCK_PIXEL_BYTES {
                    a.fma_mem(acc(j), Self::WEIGHTS, rdi + disp(x), self.lanes(j));
                } else {
                    let blocks = self.vectors[j].pixels;
                    a.gather_blocks_at(Self::GATHERED, rdi + disp(x), self.pixel_step, blocks);
                    a.fma_reg(acc(j), Self::WEIGHTS, Self::GATHERED);
                }
            }
        }
        ok(a.a.add(rdi, r8));
        ok(a.a.add(rsi, i32_of(self.per_kh)));
        ok(a.a.dec(rcx));
        ok(a.a.jnz(kh_loop));
        ok(a.a.set_label(&mut kh_done));
        // The post-ops as `DirectTile::epilogue` applies them, then the store.
        let values: Vec<usize> = (0..self.vectors.len()).map(acc).collect();
        a.grouped_post_ops(
            &values,
            &self.posts,
            |a, _, r| a.broadcast_block(r, r9 + disp(self.slopes_disp)),
            |a, j, adds, r| {
                // Residual pointers follow the return address on the stack.
                ok(a.a.mov(rax, qword_ptr(a.stack_arg(8 * (adds as i32 + 1)))));
                a.load_lanes(r, rax + disp(self.dst_offset(j)), self.lanes(j));
            },
            |a, j, r| a.store_lanes(rdx + disp(self.dst_offset(j)), r, self.lanes(j)),
        );
        ok(a.a.vzeroupper());
        ok(a.a.ret());
        a.finish()
    }
}

/// A pooling tile at a wide tier (`PoolDesc::tier_for`): `vectors` accumulators, each
/// `lanes / 4` consecutive output pixels of one block of four channels, reduced over the
/// window's taps in the order of the 128-bit tile of `lower_pool` (kernel rows, then
/// `units`), with the same instructions per lane: `max` is `vmaxps` with the running maximum
/// first, or-ed with an unordered compare so that a NaN stays NaN (`Emit::pmax_nan`); `avg`
/// adds from zero and multiplies by the divisor's reciprocal once. The bits are the same at
/// every tier.
///
/// The tile is called as `fn(src, dst, kh_count, kh_src_step, scale_bits)`: `kh_count`
/// kernel-row trips of `units` (the bytes from a trip's source to a column tap's input for
/// the first pixel), after each of which the source moves by `kh_src_step` bytes; for `avg`,
/// the low 32 bits of `scale_bits` are the f32 reciprocal. Output pixel `p`'s taps lie
/// `p * pixel_bytes` after the first's: at unit column stride (`pixel_bytes` 16, one block) a
/// vector's pixels are one load, at a larger one each block is loaded on its own into the
/// vector. Vector `j`'s results go to `dst + j * vector bytes`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PoolTile {
    pub isa: Isa,
    pub max: bool,
    pub vectors: usize,
    pub units: Vec<i64>,
    pub pixel_bytes: i64,
}

impl PoolTile {
    /// Registers below the accumulators: the loaded input, the maximum before the NaN
    /// mask, and the reciprocal.
    const INPUT: usize = 0;
    const MAX: usize = 1;
    const SCALE: usize = 2;
    const FIRST_ACCUMULATOR: usize = 3;

    /// Pixels of one vector: blocks of four channels.
    fn blocks(&self) -> usize {
        self.isa.target().lanes / 4
    }

    /// Whether the tile fits the tier's registers and its offsets 32-bit displacements.
    pub fn fits(&self) -> bool {
        let pixels = (self.vectors * self.blocks()) as i64;
        let reach = self.pixel_bytes.checked_mul(pixels);
        self.isa != Isa::X128
            && self.vectors > 0
            && self.pixel_bytes >= BLOCK_PIXEL_BYTES
            && Self::FIRST_ACCUMULATOR + self.vectors <= self.isa.target().vector_registers
            && self.units.iter().all(|&u| {
                reach
                    .and_then(|r| u.checked_add(r))
                    .is_some_and(|end| i32::try_from(end).is_ok() && u >= i64::from(i32::MIN))
            })
    }

    /// The tile's machine code, for any address.
    ///
    /// # Panics
    ///
    /// If the tile does not [`fit`](Self::fits): the lowering's to rule out.
    pub fn assemble(&self) -> TileCode {
        assert!(
            self.fits(),
            "a wide pooling tile that does not fit its tier: {self:?}"
        );
        let mut a = Asm::new(self.isa);
        let vb = self.isa.target().vector_bytes() as i64;
        let acc = |j: usize| Self::FIRST_ACCUMULATOR + j;
        a.pool_identity(self.max, Self::FIRST_ACCUMULATOR..acc(self.vectors));
        let mut kh_loop = a.a.create_label();
        let mut kh_done = a.a.create_label();
        ok(a.a.test(rdx, rdx));
        ok(a.a.jz(kh_done));
        ok(a.a.set_label(&mut kh_loop));
        // At unit column stride a vector's pixels are one load (an operand of `avg`'s add).
        let contiguous = self.pixel_bytes == BLOCK_PIXEL_BYTES;
        let vector_step = self.pixel_bytes * self.blocks() as i64;
        for &unit in &self.units {
            for j in 0..self.vectors {
                let x = rdi + disp(unit + j as i64 * vector_step);
                if contiguous {
                    a.pool_step_mem(self.max, acc(j), [Self::INPUT, Self::MAX], x);
                } else {
                    a.gather_blocks_at(Self::INPUT, x, self.pixel_bytes, self.blocks());
                    a.pool_step(self.max, acc(j), Self::INPUT, Self::MAX);
                }
            }
        }
        ok(a.a.add(rdi, rcx));
        ok(a.a.dec(rdx));
        ok(a.a.jnz(kh_loop));
        ok(a.a.set_label(&mut kh_done));
        if !self.max {
            a.splat_gpr(Self::SCALE, r8d);
        }
        for j in 0..self.vectors {
            if !self.max {
                a.mul(acc(j), acc(j), Self::SCALE);
            }
            a.store(rsi + disp(j as i64 * vb), acc(j));
        }
        ok(a.a.vzeroupper());
        ok(a.a.ret());
        a.finish()
    }
}

/// The main loop of a global pooling at a wide tier (`GlobalPoolDesc::tier_for`): per trip
/// [`GLOBAL_CHAINS`] consecutive pixels of one block of four channels, pixel `k` of a trip
/// into partial `k`, so that a wide vector holds `lanes / 4` partials side by side. Each
/// partial takes its pixels in the order and with the instructions of the 128-bit loop of
/// `lower_pool` (as [`PoolTile`]): the same partials, so the same bits, at every tier.
///
/// The tile is called as `fn(src, trips, partials)`: `trips` trips from `src`, then the
/// partials stored in order, 16 bytes each, from `partials`. The caller adds the pixels left
/// over and sums the partials as the 128-bit kernel does.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GlobalPoolTile {
    pub isa: Isa,
    pub max: bool,
}

impl GlobalPoolTile {
    /// Registers below the accumulators, as [`PoolTile`]'s.
    const INPUT: usize = 0;
    const MAX: usize = 1;
    const FIRST_ACCUMULATOR: usize = 2;

    /// The wide vectors of one trip's partials.
    fn vectors(&self) -> usize {
        GLOBAL_CHAINS / (self.isa.target().lanes / 4)
    }

    /// The tile's machine code, for any address.
    ///
    /// # Panics
    ///
    /// At `x128`, which has no wide tile.
    pub fn assemble(&self) -> TileCode {
        assert!(self.isa != Isa::X128, "a global pooling tile at x128");
        let mut a = Asm::new(self.isa);
        let vb = self.isa.target().vector_bytes() as i64;
        let acc = |j: usize| Self::FIRST_ACCUMULATOR + j;
        a.pool_identity(self.max, Self::FIRST_ACCUMULATOR..acc(self.vectors()));
        let mut trip = a.a.create_label();
        let mut done = a.a.create_label();
        ok(a.a.test(rsi, rsi));
        ok(a.a.jz(done));
        ok(a.a.set_label(&mut trip));
        for j in 0..self.vectors() {
            let x = rdi + disp(j as i64 * vb);
            a.pool_step_mem(self.max, acc(j), [Self::INPUT, Self::MAX], x);
        }
        ok(a.a.add(rdi, self.vectors() as i32 * vb as i32));
        ok(a.a.dec(rsi));
        ok(a.a.jnz(trip));
        ok(a.a.set_label(&mut done));
        for j in 0..self.vectors() {
            a.store(rdx + disp(j as i64 * vb), acc(j));
        }
        ok(a.a.vzeroupper());
        ok(a.a.ret());
        a.finish()
    }
}

/// Any register tile of the wide tiers, as a kernel's calls name it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum WideTile {
    Direct(DirectTile),
    WinogradGemm(GemmTile),
    Lanewise(LanewiseTile),
    Pool(PoolTile),
    GlobalPool(GlobalPoolTile),
    WinogradInput(InputTransformTile),
    WinogradOutput(OutputTransformTile),
    Eltwise(EltwiseTile),
}

impl WideTile {
    /// The tile's machine code, for any address (see [`DirectTile::assemble`],
    /// [`GemmTile::assemble`], [`LanewiseTile::assemble`], [`PoolTile::assemble`],
    /// [`GlobalPoolTile::assemble`],
    /// [`InputTransformTile::assemble`], [`OutputTransformTile::assemble`] and
    /// [`EltwiseTile::assemble`]).
    pub fn assemble(&self) -> TileCode {
        match self {
            WideTile::Direct(t) => t.assemble(),
            WideTile::WinogradGemm(t) => t.assemble(),
            WideTile::Lanewise(t) => t.assemble(),
            WideTile::Pool(t) => t.assemble(),
            WideTile::GlobalPool(t) => t.assemble(),
            WideTile::WinogradInput(t) => t.assemble(),
            WideTile::WinogradOutput(t) => t.assemble(),
            WideTile::Eltwise(t) => t.assemble(),
        }
    }
}

/// The Winograd GEMM's register tile at a wide tier: `tiles` transformed tiles by `vectors`
/// (1 or 2) wide vectors of output channels, summed over `channels` input channels, each
/// product in the same order as the 128-bit tile of `conv::winograd` (from zero, channel by
/// channel), so that the results have the same bits at every tier.
///
/// The tile is called as `fn(v, u, m, block_bytes)`. `V` holds blocks of four channels,
/// `block_bytes` apart, each a row of the tiles' four floats, 16 bytes apart: channel `c` of
/// tile `t` is at `v + c / 4 * block_bytes + t * 16 + c % 4 * 4`. Vector `j`'s weights are a
/// panel `j * panel_bytes` from `u`, one full vector per channel, in order. `M` holds blocks
/// of four output channels `block_bytes` apart: vector `j`'s lanes go to its `lanes / 4`
/// blocks from block `j * lanes / 4` on, tile `t` 16 bytes after tile `t - 1`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GemmTile {
    pub isa: Isa,
    pub tiles: usize,
    pub vectors: usize,
    pub channels: usize,
    pub panel_bytes: i64,
}

impl GemmTile {
    /// The register tile: a row per transformed tile, nothing of its own below the sums.
    fn kernel(&self) -> MicroKernel {
        MicroKernel::packed(self.tiles, self.vectors)
    }

    /// Whether the tile fits the tier's registers and its offsets 32-bit displacements.
    pub fn fits(&self) -> bool {
        let vb = self.isa.target().vector_bytes() as i64;
        self.isa != Isa::X128
            && (1..=2).contains(&self.vectors)
            && self.tiles > 0
            && self.channels > 0
            && self.kernel().registers() <= self.isa.target().vector_registers
            && (self.vectors as i64 * self.panel_bytes)
                .checked_add(4 * vb)
                .is_some_and(|end| end < i64::from(i32::MAX))
            && self.tiles as i64 * BLOCK_PIXEL_BYTES < i64::from(i32::MAX)
    }

    /// The tile's machine code, for any address.
    ///
    /// # Panics
    ///
    /// If the tile does not [`fit`](Self::fits): the lowering's to rule out.
    pub fn assemble(&self) -> TileCode {
        assert!(
            self.fits(),
            "a wide GEMM tile that does not fit its tier: {self:?}"
        );
        let mut a = Asm::new(self.isa);
        let kernel = self.kernel();
        kernel.zero(&mut a);
        let vb = self.isa.target().vector_bytes() as i64;
        let (trips, rest) = (self.channels / 4, self.channels % 4);
        if trips > 0 {
            // rax counts the trips of four channels, one block of `V`.
            ok(a.a.mov(rax, trips as u64));
            let mut top = a.a.create_label();
            ok(a.a.set_label(&mut top));
            for c in 0..4 {
                self.channel(&mut a, c, c as i64 * vb);
            }
            ok(a.a.add(rdi, rcx));
            ok(a.a.add(rsi, i32_of(4 * vb)));
            ok(a.a.dec(rax));
            ok(a.a.jnz(top));
        }
        for c in 0..rest {
            self.channel(&mut a, c, c as i64 * vb);
        }
        // The sums, a block of four output channels at a time (`block_bases` reads the block
        // bytes from rax).
        ok(a.a.mov(rax, rcx));
        let blocks = self.isa.target().lanes / 4;
        for j in 0..self.vectors {
            block_bases(&mut a, j * blocks, rdx);
            for t in 0..self.tiles {
                a.store_blocks(kernel.acc(t, j), blocks, t as i64 * BLOCK_PIXEL_BYTES);
            }
        }
        ok(a.a.vzeroupper());
        ok(a.a.ret());
        a.finish()
    }

    /// One channel's products: lane `c` of `V`'s current block, weights `w` bytes into the
    /// panels.
    fn channel(&self, a: &mut Asm, c: usize, w: i64) {
        self.kernel().step(
            a,
            |j| (rsi + disp(w + j as i64 * self.panel_bytes), Lanes::Full),
            |t| Some(rdi + disp(t as i64 * BLOCK_PIXEL_BYTES + c as i64 * 4)),
        );
    }
}

/// How an operation treats a vector: all its lanes, or only a tail's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lanes {
    Full,
    /// `avx2`: the low 128 bits, one block.
    Low,
    /// `avx512`: the lanes of opmask `k1`, reading nothing past them.
    Masked,
}

/// Where the call's arguments past the sixth are, from the stack pointer at entry.
const DST_BLOCK_BYTES_ARG: i32 = 8;
const BIAS_ARG: i32 = 16;
const FIRST_RESIDUAL_ARG: i32 = 24;

impl DirectTile {
    pub fn vectors(&self) -> usize {
        self.w_vecs.len()
    }

    pub fn accumulators(&self) -> usize {
        self.pixels * self.vectors()
    }

    /// Blocks of four channels in a full vector of the tier.
    fn full_blocks(&self) -> usize {
        self.isa.target().lanes / 4
    }

    /// Blocks of four channels that vector `u` holds.
    fn blocks(&self, u: usize) -> usize {
        match self.tail_blocks {
            t if t > 0 && u + 1 == self.vectors() => t,
            _ => self.full_blocks(),
        }
    }

    fn lanes(&self, u: usize) -> Lanes {
        match (self.blocks(u) == self.full_blocks(), self.isa) {
            (true, _) => Lanes::Full,
            (false, Isa::Avx512) => Lanes::Masked,
            (false, _) => Lanes::Low,
        }
    }

    /// Whether the weight vectors of a unit sit in registers (loaded once for all pixels) or
    /// are read by each FMA from memory; the latter for tiles too wide for the registers.
    fn weights_in_registers(&self) -> bool {
        self.pixels > 1 && self.accumulators() + self.vectors() < self.isa.target().vector_registers
    }

    /// The first accumulator's register: below it the broadcast, the weights, and the
    /// epilogue's four temporaries (a zero, the clip bounds, a residual).
    fn first_accumulator(&self) -> usize {
        let staged = if self.weights_in_registers() {
            self.vectors() + 1
        } else {
            1
        };
        staged.max(4)
    }

    /// The register tile: a row per pixel, its accumulators above the broadcast, the
    /// weights and the epilogue's temporaries.
    fn kernel(&self) -> MicroKernel {
        MicroKernel {
            rows: self.pixels,
            vectors: self.vectors(),
            first: self.first_accumulator(),
        }
    }

    /// Whether the tile fits the tier's registers, and its tail the tier's forms.
    pub fn fits(&self) -> bool {
        self.isa != Isa::X128
            && self.tail_blocks < self.full_blocks()
            && (self.isa == Isa::Avx512 || self.tail_blocks <= 1)
            && self.vectors() > 0
            && self.pixels > 0
            && self.kernel().registers() <= self.isa.target().vector_registers
    }

    /// Arguments of the call, after the six in registers: block bytes, bias, residuals.
    pub fn residuals(&self) -> usize {
        match &self.finish {
            TileFinish::PostOps(posts) => posts.iter().filter(|p| **p == PostOpDesc::Add).count(),
            TileFinish::Partial => 0,
        }
    }

    /// The tile's machine code, for any address.
    ///
    /// # Panics
    ///
    /// If the tile does not [`fit`](Self::fits), or an offset does not fit an instruction's
    /// 32-bit displacement: both are the lowering's to rule out.
    pub fn assemble(&self) -> TileCode {
        assert!(
            self.fits(),
            "a wide tile that does not fit its tier: {self:?}"
        );
        let mut a = Asm::new(self.isa);
        self.emit(&mut a);
        a.finish()
    }

    fn acc(&self, p: usize, u: usize) -> usize {
        self.kernel().acc(p, u)
    }

    fn emit(&self, a: &mut Asm) {
        let vectors = self.vectors();
        if self.tail_blocks > 0 && self.isa == Isa::Avx512 {
            // k1: the tail's lanes.
            use iced_x86::code_asm::{eax, k1};
            ok(a.a.mov(eax, (1u32 << (4 * self.tail_blocks)) - 1));
            ok(a.a.kmovw(k1, eax));
        }
        match self.init {
            TileInit::Zero => self.kernel().zero(a),
            TileInit::Bias => {
                ok(a.a.mov(rax, qword_ptr(rsp + BIAS_ARG)));
                let vb = self.isa.target().vector_bytes() as i64;
                for p in 0..self.pixels {
                    for u in 0..vectors {
                        a.load_lanes(self.acc(p, u), rax + disp(u as i64 * vb), self.lanes(u));
                    }
                }
            }
            TileInit::Partial => {
                ok(a.a.mov(rax, qword_ptr(rsp + DST_BLOCK_BYTES_ARG)));
                for u in 0..vectors {
                    block_bases(a, u * self.full_blocks(), rdx);
                    for p in 0..self.pixels {
                        // Lanes past a tail's blocks start at zero and are never stored.
                        a.zero(self.acc(p, u));
                        let px = p as i64 * self.dst_pixel_bytes;
                        a.load_blocks(self.acc(p, u), self.blocks(u), px);
                    }
                }
            }
        }
        self.reduction(a);
        ok(a.a.mov(rax, qword_ptr(rsp + DST_BLOCK_BYTES_ARG)));
        match &self.finish {
            TileFinish::Partial => {
                for u in 0..vectors {
                    block_bases(a, u * self.full_blocks(), rdx);
                    for p in 0..self.pixels {
                        let px = p as i64 * self.dst_pixel_bytes;
                        a.store_blocks(self.acc(p, u), self.blocks(u), px);
                    }
                }
            }
            TileFinish::PostOps(posts) => self.epilogue(a, posts),
        }
        ok(a.a.vzeroupper());
        ok(a.a.ret());
    }

    /// The channel loop (`steps` trips, counted in `rax`) around the kernel-row loop
    /// (`kh_count` trips, counted in `r10`).
    fn reduction(&self, a: &mut Asm) {
        // r9: from where a channel step's kernel rows leave the source to the next step;
        // r11: the same for the weights.
        ok(a.a.mov(rax, rcx));
        ok(a.a.imul_2(rax, r8));
        ok(a.a.sub(r9, rax));
        ok(a.a.imul_3(r11, rcx, i32_of(-self.per_kh)));
        ok(a.a.add(r11, i32_of(self.ic_w_step)));
        ok(a.a.mov(rax, self.steps as u64));
        let mut ic_loop = a.a.create_label();
        let mut kh_loop = a.a.create_label();
        let mut kh_done = a.a.create_label();
        ok(a.a.set_label(&mut ic_loop));
        ok(a.a.mov(r10, rcx));
        ok(a.a.test(r10, r10));
        ok(a.a.jz(kh_done));
        ok(a.a.set_label(&mut kh_loop));
        for unit in &self.units {
            self.unit(a, unit);
        }
        ok(a.a.add(rdi, r8));
        ok(a.a.add(rsi, i32_of(self.per_kh)));
        ok(a.a.dec(r10));
        ok(a.a.jnz(kh_loop));
        ok(a.a.set_label(&mut kh_done));
        ok(a.a.add(rdi, r9));
        ok(a.a.add(rsi, r11));
        ok(a.a.dec(rax));
        ok(a.a.jnz(ic_loop));
    }

    fn unit(&self, a: &mut Asm, unit: &TileUnit) {
        let weights = |u: usize| (rsi + disp(unit.w + self.w_vecs[u]), self.lanes(u));
        let input = |p: usize| unit.x[p].map(|x| rdi + disp(x));
        if self.weights_in_registers() {
            self.kernel().step(a, weights, input);
        } else {
            self.kernel().step_weights_in_memory(a, weights, input);
        }
    }

    /// The post-ops on each accumulator ([`Asm::grouped_post_ops`]), then its store as
    /// blocks.
    fn epilogue(&self, a: &mut Asm, posts: &[PostOpDesc]) {
        let vectors = self.vectors();
        let values: Vec<usize> = (0..vectors)
            .flat_map(|u| (0..self.pixels).map(move |p| (p, u)))
            .map(|(p, u)| self.acc(p, u))
            .collect();
        let at = |i: usize| {
            let (u, p) = (i / self.pixels, i % self.pixels);
            (
                u * self.full_blocks(),
                p as i64 * self.dst_pixel_bytes,
                self.blocks(u),
            )
        };
        // The destination's block bases (r10, r11) are set once per vector; a residual's
        // load moves them, and the next store sets them again.
        let bases = std::cell::Cell::new(None);
        let vb = self.isa.target().vector_bytes() as i64;
        a.grouped_post_ops(
            &values,
            posts,
            |a, i, r| {
                let u = i / self.pixels;
                ok(a.a.mov(rcx, qword_ptr(a.stack_arg(BIAS_ARG))));
                let at = rcx + disp(self.slopes_disp + u as i64 * vb);
                a.load_lanes(r, at, self.lanes(u));
            },
            |a, i, adds, r| {
                let (first, px, blocks) = at(i);
                let arg = FIRST_RESIDUAL_ARG + 8 * adds as i32;
                ok(a.a.mov(rcx, qword_ptr(a.stack_arg(arg))));
                block_bases(a, first, rcx);
                a.load_blocks(r, blocks, px);
                bases.set(None);
            },
            |a, i, r| {
                let (first, px, blocks) = at(i);
                if bases.get() != Some(first) {
                    block_bases(a, first, rdx);
                    bases.set(Some(first));
                }
                a.store_blocks(r, blocks, px);
            },
        );
    }
}

/// The temporaries of a chain's post-ops ([`Chain::t`]): a zero for relu, the clip bounds, a
/// residual.
const EPILOGUE_ZERO: usize = 0;
const EPILOGUE_LO: usize = 1;
const EPILOGUE_HI: usize = 2;
const EPILOGUE_RESIDUAL: usize = 3;

/// Whether an activation's chain of dependent instructions is long enough (an `exp`, a
/// division: 60 to 80 cycles) that values in a row do not overlap in the out-of-order
/// window, so the grouped epilogue ([`Asm::grouped_post_ops`]) interleaves several.
fn long_chain(posts: &[PostOpDesc]) -> bool {
    use crate::key::Activation;
    posts.iter().any(|p| {
        matches!(
            p,
            PostOpDesc::Act(
                Activation::Sigmoid | Activation::Silu | Activation::Tanh | Activation::Exp
            )
        )
    })
}

impl Asm {
    /// A wide tile's post-ops on each chain's value, in their order, as
    /// `conv::apply_post_ops` applies them, the chains' instructions interleaved (activations
    /// are [`Asm::activation`], which the lowering leaves out where [`DirectTile::supports`]
    /// says so). `slopes(a, i, r)` loads chain `i`'s PReLU slopes into register `r`;
    /// `residual(a, i, adds, r)` loads the `adds`-th residual of chain `i`'s value
    /// into register `r`. `max(b, x)` and `min(b, x)` return their second operand `x` when
    /// either is NaN or both are zeros, so relu and clip are `x < 0 ? 0 : x` and
    /// `x < lo ? lo : x`. With `zero_set`, the chains' zero registers hold zero already
    /// ([`Self::hoisted_zero`]); with `clip_set`, their clip registers the bounds of the one
    /// clip ([`Self::hoisted_clip`]).
    fn post_ops(
        &mut self,
        chains: &[Chain],
        posts: &[PostOpDesc],
        (mut zero_set, clip_set): (bool, bool),
        mut slopes: impl FnMut(&mut Asm, usize, usize),
        mut residual: impl FnMut(&mut Asm, usize, usize, usize),
    ) {
        let mut adds = 0;
        // An activation uses the temporaries: a relu after one sets its zero again.
        for post in posts {
            match *post {
                PostOpDesc::Relu => {
                    for c in chains {
                        if !zero_set {
                            self.zero(c.t[EPILOGUE_ZERO]);
                        }
                        self.max(c.x, c.t[EPILOGUE_ZERO], c.x);
                    }
                    zero_set = true;
                }
                PostOpDesc::Act(act) => {
                    self.activation(chains, act);
                    zero_set = false;
                }
                PostOpDesc::PRelu => {
                    for (i, c) in chains.iter().enumerate() {
                        slopes(self, i, c.t[EPILOGUE_RESIDUAL]);
                    }
                    self.prelu(chains, |c| Src::Reg(c.t[EPILOGUE_RESIDUAL]));
                    zero_set = false;
                }
                PostOpDesc::Clip { lo, hi } => {
                    let (lo, hi) = (self.constant(lo.to_bits()), self.constant(hi.to_bits()));
                    for c in chains {
                        if !clip_set {
                            self.load(c.t[EPILOGUE_LO], lo);
                            self.load(c.t[EPILOGUE_HI], hi);
                        }
                        self.max(c.x, c.t[EPILOGUE_LO], c.x);
                        self.min(c.x, c.t[EPILOGUE_HI], c.x);
                    }
                }
                PostOpDesc::Add => {
                    for (i, c) in chains.iter().enumerate() {
                        residual(self, i, adds, c.t[EPILOGUE_RESIDUAL]);
                    }
                    for c in chains {
                        self.add(c.x, c.x, c.t[EPILOGUE_RESIDUAL]);
                    }
                    adds += 1;
                }
            }
        }
    }

    /// The post-ops of the values in registers `values` ([`Self::post_ops`]), each stored by
    /// `store(a, i, r)` from register `r`. With a [`long_chain`] activation the values go to a
    /// stack frame first and come back [`chains_per_group`] at a time, their chains
    /// interleaved over the whole register file; otherwise one at a time, each with registers
    /// 0 to 3. Stack arguments are at [`Self::stack_arg`] meanwhile.
    fn grouped_post_ops(
        &mut self,
        values: &[usize],
        posts: &[PostOpDesc],
        mut slopes: impl FnMut(&mut Asm, usize, usize),
        mut residual: impl FnMut(&mut Asm, usize, usize, usize),
        mut store: impl FnMut(&mut Asm, usize, usize),
    ) {
        let group = chains_per_group(self.isa.target().vector_registers);
        if values.len() < 2 || !long_chain(posts) {
            let hoisted = (self.hoisted_zero(posts), self.hoisted_clip(posts));
            for (i, &x) in values.iter().enumerate() {
                self.post_ops(
                    &[Chain::single(x)],
                    posts,
                    hoisted,
                    |a, _, r| slopes(a, i, r),
                    |a, _, adds, r| residual(a, i, adds, r),
                );
                store(self, i, x);
            }
            return;
        }
        let vb = self.isa.target().vector_bytes() as i64;
        let frame = i32_of(values.len() as i64 * vb);
        ok(self.a.sub(rsp, frame));
        self.frame += frame;
        for (i, &x) in values.iter().enumerate() {
            self.store(rsp + disp(i as i64 * vb), x);
        }
        for first in (0..values.len()).step_by(group) {
            let n = group.min(values.len() - first);
            let chains: Vec<Chain> = (0..n).map(Chain::owned).collect();
            for (k, c) in chains.iter().enumerate() {
                self.load(c.x, rsp + disp((first + k) as i64 * vb));
            }
            self.post_ops(
                &chains,
                posts,
                (false, false),
                |a, k, r| slopes(a, first + k, r),
                |a, k, adds, r| residual(a, first + k, adds, r),
            );
            for (k, c) in chains.iter().enumerate() {
                store(self, first + k, c.x);
            }
        }
        ok(self.a.add(rsp, frame));
        self.frame -= frame;
    }

    /// Zeroes register 0, the single-value chains' relu zero, once for all their post-ops
    /// where they have a relu and no activation or PReLU (which would use the register):
    /// whether it did.
    fn hoisted_zero(&mut self, posts: &[PostOpDesc]) -> bool {
        let hoist = posts.contains(&PostOpDesc::Relu)
            && !posts
                .iter()
                .any(|p| matches!(p, PostOpDesc::Act(_) | PostOpDesc::PRelu));
        if hoist {
            self.zero(Chain::single(0).t[EPILOGUE_ZERO]);
        }
        hoist
    }

    /// Loads the bounds of the one clip into registers 1 and 2, the single-value chains' clip
    /// registers, once for all their post-ops where they have one clip and no activation or
    /// PReLU (which would use the registers): whether it did. Each value's clip then takes
    /// two instructions, not four (two of them loads).
    fn hoisted_clip(&mut self, posts: &[PostOpDesc]) -> bool {
        let clips: Vec<(f32, f32)> = posts
            .iter()
            .filter_map(|p| match *p {
                PostOpDesc::Clip { lo, hi } => Some((lo, hi)),
                _ => None,
            })
            .collect();
        let hoist = clips.len() == 1
            && !posts
                .iter()
                .any(|p| matches!(p, PostOpDesc::Act(_) | PostOpDesc::PRelu));
        if hoist {
            let (lo, hi) = clips[0];
            let t = Chain::single(0).t;
            let (lo, hi) = (self.constant(lo.to_bits()), self.constant(hi.to_bits()));
            self.load(t[EPILOGUE_LO], lo);
            self.load(t[EPILOGUE_HI], hi);
        }
        hoist
    }

    /// The stack argument `offset` bytes above the return address's slot, wherever the
    /// stack pointer is now.
    fn stack_arg(&self, offset: i32) -> AsmMemoryOperand {
        rsp + (offset + self.frame)
    }
}

/// Sets `r10` to `base + first * rax` and `r11` to `r10 + 2 * rax`: the blocks of one wide
/// vector are then `r10`, `r10 + rax`, `r11`, `r11 + rax` (`rax` holding the block bytes).
fn block_bases(a: &mut Asm, first: usize, base: AsmRegister64) {
    ok(a.a.imul_3(r10, rax, i32_of(first as i64)));
    ok(a.a.add(r10, base));
    ok(a.a.lea(r11, ptr(r10 + rax * 2)));
}

/// The address of block `j` (0 to 3) of the vector whose bases `block_bases` set, plus `px`.
fn block_addr(j: usize, px: i64) -> AsmMemoryOperand {
    let d = disp(px);
    match j {
        0 => xmmword_ptr(r10 + d),
        1 => xmmword_ptr(r10 + rax + d),
        2 => xmmword_ptr(r11 + d),
        _ => xmmword_ptr(r11 + rax + d),
    }
}

/// Unwraps an instruction's operand check: the emitter only asks for forms that exist.
fn ok(r: Result<(), iced_x86::IcedError>) {
    r.expect("an encodable instruction");
}

fn i32_of(x: i64) -> i32 {
    i32::try_from(x).expect("an offset within a 32-bit displacement")
}

fn disp(x: i64) -> i32 {
    i32_of(x)
}

const YMM: [AsmRegisterYmm; 16] = [
    ymm0, ymm1, ymm2, ymm3, ymm4, ymm5, ymm6, ymm7, ymm8, ymm9, ymm10, ymm11, ymm12, ymm13, ymm14,
    ymm15,
];
const ZMM: [AsmRegisterZmm; 32] = [
    zmm0, zmm1, zmm2, zmm3, zmm4, zmm5, zmm6, zmm7, zmm8, zmm9, zmm10, zmm11, zmm12, zmm13, zmm14,
    zmm15, zmm16, zmm17, zmm18, zmm19, zmm20, zmm21, zmm22, zmm23, zmm24, zmm25, zmm26, zmm27,
    zmm28, zmm29, zmm30, zmm31,
];
const XMM: [AsmRegisterXmm; 16] = [
    xmm0, xmm1, xmm2, xmm3, xmm4, xmm5, xmm6, xmm7, xmm8, xmm9, xmm10, xmm11, xmm12, xmm13, xmm14,
    xmm15,
];

/// A tile's bytes: its instructions, then the constants they read (`bytes[instructions..]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TileCode {
    pub bytes: Vec<u8>,
    /// Where the instructions end and the constant pool, if any, begins.
    pub instructions: usize,
}

/// The code assembler at one tier: vector registers by index, `ymm` or `zmm`.
pub(crate) struct Asm {
    pub(crate) a: CodeAssembler,
    isa: Isa,
    /// Each constant's bits and the label of its splat in the pool after the code.
    constants: Vec<(u32, CodeLabel)>,
    /// Bytes the tile has pushed below its return address ([`Self::stack_arg`]).
    frame: i32,
}

impl Asm {
    pub(crate) fn new(isa: Isa) -> Self {
        let mut a = CodeAssembler::new(64).expect("64-bit mode exists");
        // VEX where it encodes (AVX2), EVEX only where a zmm register or opmask needs it.
        a.set_prefer_vex(true);
        Asm {
            a,
            isa,
            constants: Vec::new(),
            frame: 0,
        }
    }

    /// A vector of the tier whose every lane holds the f32 of `bits`, as a RIP-relative
    /// operand into the constant pool that [`Self::finish`] places after the code: one load
    /// (or an instruction's memory operand) where a splat through a general register takes
    /// three.
    pub(crate) fn constant(&mut self, bits: u32) -> AsmMemoryOperand {
        let label = match self.constants.iter().find(|(b, _)| *b == bits) {
            Some(&(_, label)) => label,
            None => {
                let label = self.a.create_label();
                self.constants.push((bits, label));
                label
            }
        };
        AsmMemoryOperand::from(label)
    }

    /// Assembles at address 0; every branch and constant is relative, so the code runs
    /// anywhere.
    pub(crate) fn finish(mut self) -> TileCode {
        if self.constants.is_empty() {
            let bytes = self
                .a
                .assemble(0)
                .expect("the emitter only writes encodable instructions");
            let instructions = bytes.len();
            return TileCode {
                bytes,
                instructions,
            };
        }
        let lanes = self.isa.target().lanes;
        let mut pool = None;
        for (bits, mut label) in std::mem::take(&mut self.constants) {
            // `set_label` marks its copy of the label: the pool starts at the first.
            ok(self.a.set_label(&mut label));
            pool.get_or_insert(label);
            ok(self.a.dd(&vec![bits; lanes]));
        }
        let pool = pool.expect("a constant");
        let out = self
            .a
            .assemble_options(0, BlockEncoderOptions::RETURN_NEW_INSTRUCTION_OFFSETS)
            .expect("the emitter only writes encodable instructions");
        let instructions = out.label_ip(&pool).expect("the pool's label is set") as usize;
        TileCode {
            bytes: out.inner.code_buffer,
            instructions,
        }
    }

    fn wide(&self) -> bool {
        self.isa == Isa::Avx512
    }

    pub(crate) fn zero(&mut self, r: usize) {
        let res = if self.wide() {
            self.a.vpxord(ZMM[r], ZMM[r], ZMM[r])
        } else {
            self.a.vxorps(YMM[r], YMM[r], YMM[r])
        };
        ok(res);
    }

    pub(crate) fn load(&mut self, r: usize, m: impl Into<AsmMemoryOperand>) {
        let m = m.into();
        let res = if self.wide() {
            self.a.vmovups(ZMM[r], ptr(m))
        } else {
            self.a.vmovups(YMM[r], ptr(m))
        };
        ok(res);
    }

    /// `load`, of a tail's lanes only: the rest are zero, and no byte past them is read.
    pub(crate) fn load_lanes(&mut self, r: usize, m: impl Into<AsmMemoryOperand>, lanes: Lanes) {
        let m = m.into();
        match lanes {
            Lanes::Full => self.load(r, m),
            Lanes::Low => ok(self.a.vmovups(XMM[r], xmmword_ptr(m))),
            Lanes::Masked => ok(self.a.vmovups(ZMM[r].k1().z(), ptr(m))),
        }
    }

    /// `store`, of a tail's lanes only: no byte past them is written.
    pub(crate) fn store_lanes(&mut self, m: impl Into<AsmMemoryOperand>, r: usize, lanes: Lanes) {
        let m = m.into();
        match lanes {
            Lanes::Full => self.store(m, r),
            Lanes::Low => ok(self.a.vmovups(xmmword_ptr(m), XMM[r])),
            Lanes::Masked => ok(self.a.vmovups(ptr(m).k1(), ZMM[r])),
        }
    }

    pub(crate) fn store(&mut self, m: impl Into<AsmMemoryOperand>, r: usize) {
        let m = m.into();
        let res = if self.wide() {
            self.a.vmovups(ptr(m), ZMM[r])
        } else {
            self.a.vmovups(ptr(m), YMM[r])
        };
        ok(res);
    }

    pub(crate) fn broadcast(&mut self, r: usize, m: impl Into<AsmMemoryOperand>) {
        let m = dword_ptr(m.into());
        let res = if self.wide() {
            self.a.vbroadcastss(ZMM[r], m)
        } else {
            self.a.vbroadcastss(YMM[r], m)
        };
        ok(res);
    }

    /// Four floats at `m` repeated across register `r`: a block's weights or bias for a
    /// vector of consecutive pixels.
    pub(crate) fn broadcast_block(&mut self, r: usize, m: impl Into<AsmMemoryOperand>) {
        let m = xmmword_ptr(m.into());
        let res = if self.wide() {
            self.a.vbroadcastf32x4(ZMM[r], m)
        } else {
            self.a.vbroadcastf128(YMM[r], m)
        };
        ok(res);
    }

    /// `acc += w * b`, all registers.
    pub(crate) fn fma_reg(&mut self, acc: usize, w: usize, b: usize) {
        let res = if self.wide() {
            self.a.vfmadd231ps(ZMM[acc], ZMM[w], ZMM[b])
        } else {
            self.a.vfmadd231ps(YMM[acc], YMM[w], YMM[b])
        };
        ok(res);
    }

    /// `acc += b * [m]`, over `lanes`: a tail reads only its own lanes (a 128-bit FMA, or
    /// one under `k1`, whose masked-off lanes neither load nor fault).
    pub(crate) fn fma_mem(
        &mut self,
        acc: usize,
        b: usize,
        m: impl Into<AsmMemoryOperand>,
        lanes: Lanes,
    ) {
        let m = ptr(m.into());
        let res = match (lanes, self.wide()) {
            (Lanes::Full, true) => self.a.vfmadd231ps(ZMM[acc], ZMM[b], m),
            (Lanes::Full, false) => self.a.vfmadd231ps(YMM[acc], YMM[b], m),
            (Lanes::Low, _) => self.a.vfmadd231ps(XMM[acc], XMM[b], m),
            (Lanes::Masked, _) => self.a.vfmadd231ps(ZMM[acc].k1(), ZMM[b], m),
        };
        ok(res);
    }

    pub(crate) fn max(&mut self, d: usize, a: usize, b: usize) {
        let res = if self.wide() {
            self.a.vmaxps(ZMM[d], ZMM[a], ZMM[b])
        } else {
            self.a.vmaxps(YMM[d], YMM[a], YMM[b])
        };
        ok(res);
    }

    pub(crate) fn min(&mut self, d: usize, a: usize, b: usize) {
        let res = if self.wide() {
            self.a.vminps(ZMM[d], ZMM[a], ZMM[b])
        } else {
            self.a.vminps(YMM[d], YMM[a], YMM[b])
        };
        ok(res);
    }

    pub(crate) fn add(&mut self, d: usize, a: usize, b: usize) {
        let res = if self.wide() {
            self.a.vaddps(ZMM[d], ZMM[a], ZMM[b])
        } else {
            self.a.vaddps(YMM[d], YMM[a], YMM[b])
        };
        ok(res);
    }

    /// Every lane of register `r` (one of the first 16) set to the f32 whose bits `gpr` holds.
    fn splat_gpr(&mut self, r: usize, gpr: AsmRegister32) {
        ok(self.a.vmovd(XMM[r], gpr));
        let res = if self.wide() {
            self.a.vbroadcastss(ZMM[r], XMM[r])
        } else {
            self.a.vbroadcastss(YMM[r], XMM[r])
        };
        ok(res);
    }

    fn copy(&mut self, d: usize, s: usize) {
        let res = if self.wide() {
            self.a.vmovaps(ZMM[d], ZMM[s])
        } else {
            self.a.vmovaps(YMM[d], YMM[s])
        };
        ok(res);
    }

    /// `d = m | (a unordered b)`: all bits set in the lanes where `a` or `b` is NaN (at
    /// `avx512` through opmask `k2`, a compare's only destination there).
    fn or_unordered(&mut self, d: usize, m: usize, a: usize, b: usize) {
        const UNORDERED: u32 = 3;
        if self.wide() {
            ok(self.a.vcmpps(k2, ZMM[a], ZMM[b], UNORDERED));
            if d != m {
                ok(self.a.vmovaps(ZMM[d], ZMM[m]));
            }
            // All ones where k2 is set: a ternary function whose table is 0xff.
            ok(self.a.vpternlogd(ZMM[d].k2(), ZMM[d], ZMM[d], 0xff));
        } else {
            ok(self.a.vcmpps(YMM[b], YMM[a], YMM[b], UNORDERED));
            ok(self.a.vorps(YMM[d], YMM[m], YMM[b]));
        }
    }

    /// `d += [m]`, as `addps d, [m]`: the running sum is the first operand.
    fn add_mem(&mut self, d: usize, m: impl Into<AsmMemoryOperand>) {
        let m = ptr(m.into());
        let res = if self.wide() {
            self.a.vaddps(ZMM[d], ZMM[d], m)
        } else {
            self.a.vaddps(YMM[d], YMM[d], m)
        };
        ok(res);
    }

    fn mul(&mut self, d: usize, a: usize, b: usize) {
        let res = if self.wide() {
            self.a.vmulps(ZMM[d], ZMM[a], ZMM[b])
        } else {
            self.a.vmulps(YMM[d], YMM[a], YMM[b])
        };
        ok(res);
    }

    /// Register `r`'s lanes from `blocks` blocks of four floats (see [`block_bases`]).
    fn load_blocks(&mut self, r: usize, blocks: usize, px: i64) {
        for j in 0..blocks {
            let m = block_addr(j, px);
            let res = if self.wide() {
                self.a.vinsertf32x4(ZMM[r], ZMM[r], m, j as u32)
            } else if j == 0 {
                self.a.vmovups(XMM[r], m)
            } else {
                self.a.vinsertf128(YMM[r], YMM[r], m, j as u32)
            };
            ok(res);
        }
    }

    /// Pooling accumulators `accs` at their reduction's start: -inf for a maximum (through
    /// `eax`), +0 for a sum.
    fn pool_identity(&mut self, max: bool, mut accs: std::ops::Range<usize>) {
        if !max {
            accs.for_each(|r| self.zero(r));
            return;
        }
        let first = accs.next().expect("an accumulator");
        ok(self.a.mov(eax, f32::NEG_INFINITY.to_bits()));
        self.splat_gpr(first, eax);
        accs.for_each(|r| self.copy(r, first));
    }

    /// One pooling step of `acc` with register `x`, as `lower_pool::combine`: the maximum
    /// with the running one first, or-ed with an unordered compare so that a NaN stays NaN
    /// (`m` a scratch register), or the sum.
    fn pool_step(&mut self, max: bool, acc: usize, x: usize, m: usize) {
        if max {
            self.max(m, acc, x);
            self.or_unordered(acc, m, acc, x);
        } else {
            self.add(acc, acc, x);
        }
    }

    /// [`Self::pool_step`] with the vector at `at`: loaded into `x` for a maximum, a memory
    /// operand of the sum.
    fn pool_step_mem(&mut self, max: bool, acc: usize, [x, m]: [usize; 2], at: AsmMemoryOperand) {
        if max {
            self.load(x, at);
            self.pool_step(true, acc, x, m);
        } else {
            self.add_mem(acc, at);
        }
    }

    /// Register `r`'s low `blocks` blocks of four floats from `at`, `at + step`, ...: the
    /// source blocks of a strided vector's pixels (the lanes above are zero).
    fn gather_blocks_at(&mut self, r: usize, at: AsmMemoryOperand, step: i64, blocks: usize) {
        for j in 0..blocks {
            let m = xmmword_ptr(at + disp(j as i64 * step));
            // The first block's load clears the rest: no wait for the register's last value.
            let res = if j == 0 {
                self.a.vmovups(XMM[r], m)
            } else if self.wide() {
                self.a.vinsertf32x4(ZMM[r], ZMM[r], m, j as u32)
            } else {
                self.a.vinsertf128(YMM[r], YMM[r], m, j as u32)
            };
            ok(res);
        }
    }

    /// Register `r`'s lanes to `blocks` blocks of four floats.
    fn store_blocks(&mut self, r: usize, blocks: usize, px: i64) {
        for j in 0..blocks {
            let m = block_addr(j, px);
            let res = if self.wide() {
                self.a.vextractf32x4(m, ZMM[r], j as u32)
            } else if j == 0 {
                self.a.vmovups(m, XMM[r])
            } else {
                self.a.vextractf128(m, YMM[r], j as u32)
            };
            ok(res);
        }
    }
}

/// A whole peak kernel in the tier's vectors, with the kernel ABI (`fn(buffers, begin, end,
/// extents, prefetch)`): `end - begin` trips of 8 steps of 12 independent FMA chains, which
/// start from and end in the destination (buffer 2), `x <- x * b + a` with `a` and `b` the
/// source's first two vectors (buffer 0). For a tile's pattern, a trip is instead 12 channels
/// of that register tile, its broadcasts and weights read from the source (which stays in L1).
pub fn peak_kernel(isa: Isa, pattern: WidePattern) -> Vec<u8> {
    let mut a = Asm::new(isa);
    let vb = isa.target().vector_bytes() as i64;
    let tile = pattern.tile(isa);
    let (pixels, vectors) = tile.unwrap_or((PEAK_CHAINS, 1));
    let chains = pixels * vectors;
    // The kernels' tile, with a direct tile's epilogue temporaries below the sums.
    let first = 4;
    let kernel = MicroKernel {
        rows: pixels,
        vectors,
        first,
    };
    ok(a.a.mov(r8, qword_ptr(rdi)));
    ok(a.a.mov(r9, qword_ptr(rdi + 16)));
    for k in 0..chains {
        a.load(first + k, r9 + disp(k as i64 * vb));
    }
    ok(a.a.mov(rcx, rdx));
    ok(a.a.sub(rcx, rsi));
    let mut done = a.a.create_label();
    let mut top = a.a.create_label();
    ok(a.a.test(rcx, rcx));
    ok(a.a.jle(done));
    if tile.is_none() {
        a.load(0, r8);
        a.load(1, r8 + disp(vb));
    }
    ok(a.a.set_label(&mut top));
    if tile.is_some() {
        let scalars = PEAK_TILE_CHANNELS as i64 * vectors as i64 * vb;
        for c in 0..PEAK_TILE_CHANNELS as i64 {
            kernel.step(
                &mut a,
                |u| (r8 + disp((c * vectors as i64 + u as i64) * vb), Lanes::Full),
                |p| Some(r8 + disp(scalars + 4 * (c * pixels as i64 + p as i64))),
            );
        }
    } else {
        for _ in 0..8 {
            for k in 0..chains {
                a.fma_reg(first + k, 1, 0);
            }
        }
    }
    ok(a.a.dec(rcx));
    ok(a.a.jnz(top));
    ok(a.a.set_label(&mut done));
    for k in 0..chains {
        a.store(r9 + disp(k as i64 * vb), first + k);
    }
    ok(a.a.vzeroupper());
    ok(a.a.ret());
    a.finish().bytes
}

/// The instructions of `code`, one per line in Intel syntax with offsets from `base`.
pub fn disassemble(code: &[u8], base: u64) -> String {
    use iced_x86::{Decoder, DecoderOptions, Formatter, IntelFormatter};
    let mut decoder = Decoder::with_ip(64, code, base, DecoderOptions::NONE);
    let mut formatter = IntelFormatter::new();
    let mut out = String::new();
    let mut text = String::new();
    for ins in &mut decoder {
        text.clear();
        formatter.format(&ins, &mut text);
        out.push_str(&format!("  {:6x}: {text}\n", ins.ip()));
    }
    out
}
