//! The register tiles' shapes per tier: the one micro-kernel spec that the keys, the plans
//! and both emitters (Cranelift's 128-bit tiles, the x64 backend's wide ones) read.
//!
//! Data only, below the keys: a key's buffers and flops, a plan's tiling and an emitter's
//! register use all follow from these shapes, so keeping them here lets the pipeline run one
//! way (target and tile <- key <- plan <- code), with no module importing one above it.

use crate::target::Isa;

/// Channels in one block of the blocked activation layout `nChw4c`, which every tier uses,
/// and the f32 lanes of a 128-bit vector. A wide vector spans `lanes / LANES` blocks.
pub const LANES: usize = 4;

/// The full direct tile of a tier, `(pixels, vectors)`: 12 accumulators in 16 `ymm`, 24 in 32
/// `zmm`, two weight vectors each; the plans tile output channels and pixels so (see
/// `ConvPlan::new`).
pub fn full_tile(isa: Isa) -> (usize, usize) {
    match isa {
        Isa::X128 | Isa::Avx2 => (6, 2),
        Isa::Avx512 => (12, 2),
    }
}

/// Independent partials of a global pooling, pixel `p` in partial `p % GLOBAL_CHAINS` at every
/// tier: enough to cover an add's latency on two pipes, which one chain left 3-4 cycles per
/// pixel (the SE blocks of MobileNetV3 and EfficientNet pool whole 112x112 maps). A wide
/// vector holds `lanes / 4` of them, one per pixel of a block of four channels.
pub const GLOBAL_CHAINS: usize = 8;

/// Accumulators of a full lane-wise (depthwise) tile: 8 chains of FMAs keep two FMA ports of
/// 4 cycles' latency busy.
pub const LANEWISE_VECTORS: usize = 8;

/// The most output pixels of one row that a wide lane-wise tile's call covers: the avx512
/// tile's ([`LANEWISE_VECTORS`] vectors of 4 pixels). `ConvDesc::tier_for` checks that their
/// inputs are within a 32-bit displacement.
pub const LANEWISE_CALL_PIXELS: usize = 4 * LANEWISE_VECTORS;

/// Vector registers below a wide lane-wise tile's accumulators: its weights, a gathered input
/// and the epilogue's temporaries.
pub const LANEWISE_STAGED: usize = 4;

/// The most vectors a wide lane-wise tile holds, one accumulator each: a row tile
/// (`ConvPlan::lanewise_row`) takes a whole row up to this many.
pub fn lanewise_row_vectors(isa: Isa) -> usize {
    isa.target().vector_registers - LANEWISE_STAGED
}

/// Tiles of the Winograd GEMM's register tile, which computes them for [`GROUP_VECTORS`]
/// output-channel vectors at once: 10 accumulators, two weight vectors, a broadcast and its
/// copy, 14 of the 16 xmm registers.
///
/// Each broadcast feeds two FMAs, so a channel takes 7 loads for 10 FMAs, where the tile of 12
/// tiles by one vector took 13 for 12. That tile's load and broadcast per FMA held it to
/// 0.88-0.92 of the FMA peak (`primjit peak`), and Cranelift cannot keep a third operand of an
/// FMA in memory. Six tiles by two vectors (12 accumulators) left too few registers, and
/// regalloc2 spilled. So did a broadcast load per FMA (which x64 folds into `vbroadcastss
/// m32`, where a shared one takes a scalar load and a register broadcast): 6 to 8 stack
/// accesses a trip, and the peak's tile fell from 0.74 to 0.63-0.77 (Zen3, 2026-12).
///
/// A block's tiles come in groups of this many; a call's last group may be partial, and the
/// GEMM then computes its missing tiles in vain (at most 4 a call) from whatever the scratch
/// holds there, and the output transform never reads them.
pub const GROUP_TILES: usize = 5;

/// Output-channel vectors of the Winograd GEMM's register tile. A chunk with an odd number of
/// vectors runs its last vector with a tile of [`GROUP_TILES`] tiles by one vector.
pub const GROUP_VECTORS: usize = 2;

/// Input channels per trip of a Winograd GEMM's reduction loop. Every FMA leaves its sum in a
/// multiplicand's register, so the accumulators move from register to register from channel to
/// channel, and a trip's end must bring them back: with 12 channels a trip (120 FMAs of the
/// 5 x 2 tile) regalloc2 keeps 2 to 6 stack accesses a trip in the trunk's kernels, with 8 (80
/// FMAs) 12 (`dump --stage asm`). The tile of 12 tiles by one vector before it spilled with 4
/// and 8 channels a trip and needed neither spills nor moves with 12.
pub const GEMM_UNROLL: usize = 12;
const _: () = assert!(
    GEMM_UNROLL.is_multiple_of(LANES),
    "a trip covers whole channel blocks"
);

/// Independent FMA chains of the wide register peak: enough to cover the FMA latency on two
/// ports.
pub const PEAK_CHAINS: usize = 12;

/// Channels per trip of the wide tile peak.
pub const PEAK_TILE_CHANNELS: usize = 12;

/// What a wide peak kernel runs (`backend::x64::peak_kernel`): the tier's FMA peak, or one of
/// its register tiles' instruction patterns, whose rate `primjit peak` reports as a fraction
/// of that peak.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WidePattern {
    /// [`PEAK_CHAINS`] independent FMA chains on registers.
    Registers,
    /// The direct convolutions' full register tile ([`full_tile`]).
    DirectTile,
    /// The Winograd GEMM's register tile, [`GROUP_TILES`] tiles by [`GROUP_VECTORS`] vectors.
    GemmTile,
}

impl WidePattern {
    /// The register tile's `(pixels, vectors)` at tier `isa`; none for the register peak.
    /// Either tile takes per channel a weight-vector load per vector, then per pixel a
    /// broadcast load shared by the vectors' FMAs.
    pub fn tile(self, isa: Isa) -> Option<(usize, usize)> {
        match self {
            WidePattern::Registers => None,
            WidePattern::DirectTile => Some(full_tile(isa)),
            WidePattern::GemmTile => Some((GROUP_TILES, GROUP_VECTORS)),
        }
    }

    /// The flops of one work item (loop trip).
    pub fn flops_per_item(self, isa: Isa) -> u64 {
        let fmas = match self.tile(isa) {
            Some((pixels, vectors)) => PEAK_TILE_CHANNELS * pixels * vectors,
            None => 8 * PEAK_CHAINS,
        };
        (fmas * isa.target().lanes * 2) as u64
    }

    /// Floats of the source and destination buffers.
    pub fn buffer_lens(self, isa: Isa) -> (usize, usize) {
        let lanes = isa.target().lanes;
        match self.tile(isa) {
            Some((pixels, vectors)) => (
                PEAK_TILE_CHANNELS * (vectors * lanes + pixels),
                pixels * vectors * lanes,
            ),
            None => (2 * lanes, PEAK_CHAINS * lanes),
        }
    }
}
