//! Compiles a key to relocation-free machine code for the host, with optional text dumps.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::backend::cranelift::{Failure, HostIsa, Lowered, MachineCode};
use crate::backend::x64::{self, TileCode, WideTile};
use crate::conv::{direct, winograd};
use crate::key::{ConvAlgo, EltwiseKind, FmaPattern, KeyError, PrimitiveKey, ResizeMode};
use crate::plan::{ConvPlan, PoolPlan};
use crate::tile::WidePattern;
use crate::{lower_conv_transpose, lower_eltwise, lower_fused, lower_pool, lower_resize};

/// Options that change the generated code or what is kept of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CodegenOptions {
    /// Run Cranelift's IR verifier (30-45% of compile time; on in tests).
    pub verify: bool,
    /// Winograd kernels whose weights stream from memory prefetch each weight panel while
    /// they compute the one before (docs/decisions/008-winograd-weight-prefetch.md). On by
    /// default; off to measure what it gains on a host, in one process beside an engine
    /// with it on (`streaming_cost --reference-prefetch off`).
    pub prefetch_weights: bool,
}

impl Default for CodegenOptions {
    fn default() -> Self {
        CodegenOptions {
            verify: false,
            prefetch_weights: true,
        }
    }
}

/// What a caller wants back besides the machine code.
#[derive(Clone, Copy, Debug, Default)]
pub struct Dumps {
    pub clif: bool,
    pub disasm: bool,
}

/// A compiled kernel: position-independent machine code with no relocations, and the key it
/// was compiled from. Only [`compile`] makes one, so the code always implements its key.
#[derive(Clone, Debug)]
pub struct CompiledKernel {
    key: PrimitiveKey,
    code: Vec<u8>,
    /// Where the x64 backend's register tiles lie in `code`.
    tiles: Vec<std::ops::Range<usize>>,
    compile_time: Duration,
    clif: Option<String>,
    disasm: Option<String>,
}

impl CompiledKernel {
    pub fn key(&self) -> &PrimitiveKey {
        &self.key
    }

    /// The machine code; it may be placed at any page-aligned address.
    pub fn code(&self) -> &[u8] {
        &self.code
    }

    /// The byte ranges of `code` that hold the instructions of the x64 backend's wide register
    /// tiles (none at `x128`), each followed by the constants it reads, if any; a wide peak
    /// kernel is one whole range.
    pub fn tiles(&self) -> &[std::ops::Range<usize>] {
        &self.tiles
    }

    pub fn compile_time(&self) -> Duration {
        self.compile_time
    }

    /// The Cranelift IR, when [`Dumps::clif`] asked for it.
    pub fn clif(&self) -> Option<&str> {
        self.clif.as_deref()
    }

    /// The disassembly, when [`Dumps::disasm`] asked for it.
    pub fn disasm(&self) -> Option<&str> {
        self.disasm.as_deref()
    }
}

/// Why a kernel could not be compiled.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CodegenError {
    /// The key describes no valid kernel; see [`KeyError`]. The only variant a caller causes.
    #[error(transparent)]
    InvalidKey(#[from] KeyError),
    /// Cranelift cannot target this machine (`cranelift_native` detection failed: not an
    /// architecture Cranelift supports), or the disassembler cannot be set up for a `disasm`
    /// dump. Nothing to fix in the call: run on x86-64. Not produced by tests: every machine
    /// that runs them is a supported host, and detection happens once per process.
    #[error("the host is not supported: {0}")]
    UnsupportedHost(String),
    /// Cranelift rejected the generated function (with `verify`, its IR verifier did), or the
    /// disassembly of a dump failed. An internal invariant: the lowering produces valid IR for
    /// every valid key (the fuzz target `kernel_vs_reference` and the kernel tests compile with
    /// the verifier on), so this is a bug in primjit to report with the key it names.
    #[error("cranelift failed to compile {key}: {message}")]
    Cranelift { key: String, message: String },
    /// The compiled code refers to something outside itself (a libcall such as `fmaf`), which
    /// code placed in its own pages cannot reach. An internal invariant like `Cranelift`: the
    /// lowering never emits such calls; report it with the key.
    #[error("the kernel for {0} needs relocations, which primitives cannot apply")]
    Relocations(String),
}

/// The host ISA with or without the verifier, detected on first use.
pub fn host_isa(verify: bool) -> Result<&'static HostIsa, CodegenError> {
    static PLAIN: OnceLock<Result<HostIsa, String>> = OnceLock::new();
    static VERIFIED: OnceLock<Result<HostIsa, String>> = OnceLock::new();
    let cell = if verify { &VERIFIED } else { &PLAIN };
    cell.get_or_init(|| HostIsa::detect(verify))
        .as_ref()
        .map_err(|e| CodegenError::UnsupportedHost(e.clone()))
}

/// The tiling plan of a key, as `dump --stage plan` prints it.
///
/// # Panics
///
/// If `key` is not valid ([`PrimitiveKey::validate`], which [`compile`] calls first): a plan
/// divides by its strides and groups.
pub fn describe_plan(key: &PrimitiveKey) -> String {
    match key {
        PrimitiveKey::Conv(d) if d.pool.is_some() => {
            let plan = lower_fused::FusedPlan::new(d);
            let width = if d.runtime.w {
                "ow".to_string()
            } else {
                d.ow().to_string()
            };
            format!(
                "  fused max pool: per pooled row, the conv computes the {rows} rows of its window \
                 into a scratch band ({rows} x {width} pixels x {channels} channels per thread), \
                 rows shared with the next window are copied down, then the pool reads the band\n  \
                 conv stage:\n{}  pool stage:\n{}",
                plan.conv,
                plan.pool,
                rows = d.pool_band_rows(),
                channels = d.oc.div_ceil(4) * 4,
            )
        }
        PrimitiveKey::Conv(d) if d.algo == ConvAlgo::WinogradF4x3 => {
            winograd::WinogradPlan::new(d).to_string()
        }
        PrimitiveKey::Conv(d) => ConvPlan::new(d).to_string(),
        PrimitiveKey::Pool(d) => PoolPlan::new(d).to_string(),
        PrimitiveKey::GlobalPool(_) => {
            "  global pool: one channel vector per image, pixels in a loop\n".to_string()
        }
        PrimitiveKey::Eltwise(d) if matches!(d.kind, EltwiseKind::Act(_)) => {
            "  element-wise: four floats at a time over each plane's span of rows, exp and tanh by \
             range-reduced polynomials\n"
                .to_string()
        }
        PrimitiveKey::Eltwise(_) => {
            "  element-wise: four floats at a time over each plane's span of rows\n".to_string()
        }
        PrimitiveKey::SelectChannels(_) => "  select channels: per destination block, a vector \
             copy per pixel where four source channels line up, lane by lane elsewhere\n"
            .to_string(),
        PrimitiveKey::Resize(d) => match d.mode {
            ResizeMode::Linear => "  resize: per output row, its two source rows and weight; per \
                 column, its two source columns and weight stepped from the last column's without \
                 a division; per channel block, a blend of four vectors\n"
                .to_string(),
            ResizeMode::Nearest(_) => "  resize: per output row, its source row; per column, its \
                 source column stepped from the last column's without a division; per channel \
                 block, a vector copy\n"
                .to_string(),
        },
        PrimitiveKey::ConvTranspose(d) => format!(
            "  deconv: per output row and tile of {} output-channel vectors, per pixel the bias \
             plus the taps whose input row and column are whole and inside the input ({}), {}\n",
            d.oc.div_ceil(4).min(4),
            match d.dilations {
                [1, 1] => "the kernel's phase of the pixel, its row range once per row",
                [1, _] => "rows by the row's phase, columns tested per tap (dilated)",
                [_, 1] => "rows tested per tap (dilated), columns by the pixel's phase",
                _ => "tested per tap (dilated)",
            },
            if d.depthwise() {
                "per tap a vector FMA per block (depthwise)"
            } else {
                "per tap a source vector per four input channels, each lane broadcast into the tile"
            }
        ),
        PrimitiveKey::Concat(_) => "  concat: each input's channel blocks copied to their place \
             in the result, a vector per pixel where the blocks line up, lane by lane elsewhere\n"
            .to_string(),
        PrimitiveKey::FmaPeak(FmaPattern::Registers) => {
            "  12 independent f32x4 FMA chains, 8 steps per loop trip\n".to_string()
        }
        PrimitiveKey::FmaPeak(FmaPattern::Broadcast) => {
            "  12 f32x4 FMA chains, 12 channels per loop trip: per channel a weight-vector load, \
             then a broadcast load per FMA\n"
                .to_string()
        }
        PrimitiveKey::FmaPeak(FmaPattern::SharedBroadcast) => {
            "  10 f32x4 FMA chains (5 tiles x 2 vectors), 12 channels per loop trip: per channel \
             two weight-vector loads, then per tile a broadcast load shared by two FMAs\n"
                .to_string()
        }
        PrimitiveKey::WidePeak {
            isa,
            pattern: WidePattern::Registers,
        } => format!(
            "  {} independent {isa} FMA chains, 8 steps per loop trip (x64 backend)\n",
            crate::tile::PEAK_CHAINS
        ),
        PrimitiveKey::WidePeak { isa, pattern } => {
            let (p, v) = pattern.tile(*isa).unwrap_or_default();
            let tile = match pattern {
                WidePattern::GemmTile => "the Winograd GEMM's",
                _ => "the direct convolution's full",
            };
            format!(
                "  {tile} {isa} tile, {p} pixels x {v} vectors, {} channels per loop trip: per \
                 channel {v} weight-vector loads, then per pixel a broadcast load shared by {v} \
                 FMAs (x64 backend)\n",
                crate::tile::PEAK_TILE_CHANNELS
            )
        }
    }
}

/// Builds the Cranelift function of a key, with the wide register tiles it calls.
///
/// # Panics
///
/// If `key` is not valid ([`PrimitiveKey::validate`], which [`compile`] calls first), or is a
/// [`PrimitiveKey::WidePeak`], which the x64 backend emits whole.
fn lower(key: &PrimitiveKey, host: &HostIsa, options: CodegenOptions) -> Lowered {
    Lowered::build(host, options.prefetch_weights, |e| match key {
        PrimitiveKey::Conv(d) if d.pool.is_some() => lower_fused::lower(e, d),
        PrimitiveKey::Conv(d) if d.algo == ConvAlgo::WinogradF4x3 => {
            winograd::lower(e, &winograd::WinogradPlan::new(d))
        }
        PrimitiveKey::Conv(d) => direct::lower(e, &ConvPlan::new(d)),
        PrimitiveKey::Pool(d) => lower_pool::lower_pool(e, &PoolPlan::new(d)),
        PrimitiveKey::GlobalPool(d) => lower_pool::lower_global_pool(e, d),
        PrimitiveKey::Eltwise(d) => lower_eltwise::lower(e, d),
        PrimitiveKey::Concat(d) => lower_eltwise::lower_concat(e, d),
        PrimitiveKey::SelectChannels(d) => lower_eltwise::lower_select(e, d),
        PrimitiveKey::Resize(d) => lower_resize::lower_resize(e, d),
        PrimitiveKey::ConvTranspose(d) => lower_conv_transpose::lower(e, d),
        PrimitiveKey::FmaPeak(pattern) => lower_pool::lower_fma_peak(e, *pattern),
        PrimitiveKey::WidePeak { .. } => unreachable!("the x64 backend emits wide peaks whole"),
    })
}

/// The cache line of a kernel's wide tiles: after the Cranelift code and after one another,
/// each tile's constant pool starts on a 64-byte boundary, or the tile itself where it has no
/// pool (a line is where the decoders fetch from).
const TILE_ALIGN: usize = 64;

/// The Cranelift code followed by its tiles, with every call to a tile resolved: the bytes
/// stay position-independent.
fn join_tiles(
    key: &PrimitiveKey,
    machine: &MachineCode,
    tiles: &[TileCode],
) -> Result<(Vec<u8>, Vec<usize>), CodegenError> {
    let mut out = machine.code.clone();
    let mut starts = Vec::with_capacity(tiles.len());
    for tile in tiles {
        // A tile's constant pool starts on a cache line, where its vectors, read by most of an
        // activation's operations, split none (a tile without one starts on a line itself).
        let start = match tile.bytes.len() - tile.instructions {
            0 => out.len().next_multiple_of(TILE_ALIGN),
            _ => (out.len() + tile.instructions).next_multiple_of(TILE_ALIGN) - tile.instructions,
        };
        out.resize(start, 0xcc);
        starts.push(out.len());
        out.extend_from_slice(&tile.bytes);
    }
    for call in &machine.tile_calls {
        let Some(&target) = starts.get(call.tile) else {
            return Err(CodegenError::Relocations(key.to_string()));
        };
        let rel = i32::try_from(target as i64 + call.addend - call.at as i64)
            .map_err(|_| CodegenError::Relocations(key.to_string()))?;
        out[call.at..call.at + 4].copy_from_slice(&rel.to_le_bytes());
    }
    Ok((out, starts))
}

/// Validates `key` and compiles its kernel for the host.
pub fn compile(
    key: &PrimitiveKey,
    options: CodegenOptions,
    dumps: Dumps,
) -> Result<CompiledKernel, CodegenError> {
    let start = Instant::now();
    key.validate()?;
    if let PrimitiveKey::WidePeak { isa, pattern } = *key {
        let code = x64::peak_kernel(isa, pattern);
        let disasm = dumps.disasm.then(|| x64::disassemble(&code, 0));
        return Ok(CompiledKernel {
            key: key.clone(),
            tiles: std::iter::once(0..code.len()).collect(),
            code,
            compile_time: start.elapsed(),
            clif: None,
            disasm,
        });
    }
    let host = host_isa(options.verify)?;
    let lowered = lower(key, host, options);
    let tiles: Vec<TileCode> = lowered.tiles.iter().map(WideTile::assemble).collect();
    let clif = dumps.clif.then(|| lowered.clif());
    let machine = lowered
        .compile(host, dumps.disasm)
        .map_err(|failure| match failure {
            Failure::Compile(message) => CodegenError::Cranelift {
                key: key.to_string(),
                message,
            },
            Failure::Relocations => CodegenError::Relocations(key.to_string()),
            Failure::Host(message) => CodegenError::UnsupportedHost(message),
        })?;
    let (code, starts) = join_tiles(key, &machine, &tiles)?;
    let disasm = machine.disasm.map(|mut text| {
        for (i, (tile, &at)) in tiles.iter().zip(&starts).enumerate() {
            let pool = tile.bytes.len() - tile.instructions;
            text.push_str(&format!(
                "tile{i} ({} bytes, x64 backend; then {pool} bytes of constants):\n",
                tile.instructions
            ));
            text.push_str(&x64::disassemble(
                &tile.bytes[..tile.instructions],
                at as u64,
            ));
        }
        text
    });
    Ok(CompiledKernel {
        key: key.clone(),
        tiles: starts
            .iter()
            .zip(&tiles)
            .map(|(&at, t)| at..at + t.instructions)
            .collect(),
        code,
        compile_time: start.elapsed(),
        clif,
        disasm,
    })
}
