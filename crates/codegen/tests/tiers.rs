//! The wide tiers' code, emitted and read back on every host, whatever tier it runs: each
//! direct convolution family, the Winograd GEMM and pooling at `avx2` and `avx512` compile, their
//! register tiles hold the tier's instruction forms and no other tier's (an `avx512` tail
//! under an opmask, an `avx2` one in its low half), and every call from the Cranelift code
//! lands on a tile. (Running the code is `primjit-runtime`'s kernel tests, on the tiers the
//! host has.)

use iced_x86::{Code, Decoder, DecoderOptions, Instruction, Mnemonic, OpKind, Register};
use primjit_codegen::key::RuntimeDims;
use primjit_codegen::{
    Activation, BinaryKind, Broadcast, CodegenOptions, CompiledKernel, ConvAlgo, ConvDesc,
    ConvTransposeDesc, Dumps, EltwiseDesc, EltwiseKind, GlobalPoolDesc, Isa, Layout, PoolDesc,
    PostOpDesc, PrimitiveKey, WidePattern, compile,
};
use primjit_ir::{Pads, PoolKind, PoolWindow};

fn verified() -> CodegenOptions {
    CodegenOptions {
        verify: true,
        ..CodegenOptions::default()
    }
}

fn blocked(mut d: ConvDesc) -> ConvDesc {
    d.src_layout = Layout::Nchw4c;
    d.dst_layout = Layout::Nchw4c;
    d
}

/// One key of each direct family the wide tiers cover, with every post-op somewhere.
fn families() -> Vec<(&'static str, ConvDesc)> {
    let mut c3 = blocked(ConvDesc::new(1, 64, [9, 30], 64, [3, 3]));
    c3.pads = Pads::uniform(1);
    c3.bias = true;
    c3.post_ops = vec![PostOpDesc::Add, PostOpDesc::Relu];
    let mut c1 = blocked(ConvDesc::new(1, 64, [8, 26], 128, [1, 1]));
    c1.strides = [2, 2];
    c1.bias = true;
    let mut strided = blocked(ConvDesc::new(1, 64, [9, 31], 128, [3, 3]));
    strided.strides = [2, 2];
    strided.pads = Pads::uniform(1);
    strided.post_ops = vec![PostOpDesc::Clip { lo: 0.0, hi: 6.0 }];
    let mut stem = ConvDesc::new(1, 3, [21, 40], 64, [7, 7]);
    stem.strides = [2, 2];
    stem.pads = Pads::uniform(3);
    stem.dst_layout = Layout::Nchw4c;
    stem.bias = true;
    stem.post_ops = vec![PostOpDesc::Relu];
    stem.pool = Some(PoolWindow {
        kernel: [3, 3],
        strides: [2, 2],
        pads: Pads::uniform(1),
        dilations: [1, 1],
        ceil_mode: false,
    });
    // Weights past the L1 budget: a chunked reduction's partial-sum tiles.
    let mut chunked = blocked(ConvDesc::new(1, 256, [6, 20], 32, [3, 3]));
    chunked.pads = Pads::uniform(1);
    // Output channels of one `ymm` and a half: at avx512 a tail of two blocks.
    let odd = blocked(ConvDesc::new(1, 8, [5, 17], 24, [3, 3]));
    // 20 output channels, five blocks: at avx2 a tail of one block, at avx512 of one; its
    // PReLU slopes loaded like the bias, the tail's under its opmask.
    let mut five = blocked(ConvDesc::new(1, 12, [1, 9], 20, [3, 3]));
    five.pads = Pads::uniform(1);
    five.bias = true;
    five.post_ops = vec![PostOpDesc::PRelu, PostOpDesc::Relu];
    // Groups of 32 channels: at avx2 two tiles per group share its input channels; its elu
    // runs in the tile's registers after the relu.
    let mut grouped = blocked(ConvDesc::new(1, 64, [7, 12], 64, [3, 3]));
    grouped.groups = 2;
    grouped.pads = Pads::uniform(1);
    grouped.post_ops = vec![
        PostOpDesc::Relu,
        PostOpDesc::Act(Activation::Elu { alpha: 1.0 }),
    ];
    // Groups of 48 channels: at avx2 three tiles of two `ymm` per group, at avx512 one of
    // three `zmm` (8 pixels), each within its group.
    let mut groups_of_48 = blocked(ConvDesc::new(1, 32, [5, 30], 96, [3, 3]));
    groups_of_48.groups = 2;
    groups_of_48.pads = Pads::uniform(1);
    groups_of_48.bias = true;
    // Depthwise, lane-wise: wide vectors of consecutive pixels, with a bias, a residual, a
    // PReLU and a clip, rows of 3 wide tiles and a remainder. Its rows' 51 interior pixels
    // leave a tail of one pixel at avx2 (2 a vector) and of three at avx512 (4 a vector).
    let mut depthwise = blocked(ConvDesc::new(1, 24, [6, 53], 24, [3, 3]));
    depthwise.groups = 24;
    depthwise.pads = Pads::uniform(1);
    depthwise.bias = true;
    depthwise.post_ops = vec![
        PostOpDesc::Add,
        PostOpDesc::PRelu,
        PostOpDesc::Clip { lo: 0.0, hi: 6.0 },
    ];
    // Depthwise at stride 2, as MobileNets downsample: each wide vector's pixel blocks
    // gathered from every other source pixel; 19 interior pixels a row, a tail of one pixel
    // at avx2 and of three at avx512.
    let mut strided_depthwise = blocked(ConvDesc::new(1, 32, [9, 41], 32, [3, 3]));
    strided_depthwise.groups = 32;
    strided_depthwise.strides = [2, 2];
    strided_depthwise.pads = Pads::uniform(1);
    strided_depthwise.bias = true;
    strided_depthwise.post_ops = vec![PostOpDesc::Act(Activation::HardSwish)];
    // 116 output channels, 29 blocks: full tiles and a short last one (one block at avx2, a
    // `zmm` and one block under an opmask at avx512).
    let mut short = blocked(ConvDesc::new(1, 116, [3, 14], 116, [1, 1]));
    short.bias = true;
    short.post_ops = vec![PostOpDesc::Relu];
    vec![
        ("3x3", c3),
        ("116 channels: a short last tile", short),
        ("grouped", grouped),
        ("groups of 48", groups_of_48),
        ("depthwise", depthwise),
        ("depthwise stride 2", strided_depthwise),
        ("1x1 strided", c1),
        ("3x3 strided", strided),
        ("7x7 stem with a fused pool", stem),
        ("chunked", chunked),
        ("24 channels: a tail", odd),
        ("20 channels in one row: tails", five),
    ]
}

fn at(mut d: ConvDesc, isa: Isa) -> PrimitiveKey {
    d.isa = isa;
    PrimitiveKey::Conv(d)
}

/// `d`'s kernel at the wide tier `isa`, its tiles checked by [`assert_tier_code`].
fn tier_kernel(d: ConvDesc, isa: Isa) -> (PrimitiveKey, CompiledKernel) {
    let key = at(d, isa);
    let k = compile(&key, verified(), Dumps::default()).unwrap_or_else(|e| panic!("{key}: {e}"));
    assert_tier_code(&key.to_string(), isa, &k);
    (key, k)
}

/// Whether a register is of one kind (`Register::is_ymm`, `Register::is_zmm`).
type RegisterKind = fn(Register) -> bool;

/// The kind of the wide tier `isa`'s registers, and the other wide tier's.
fn tier_registers(isa: Isa) -> (RegisterKind, RegisterKind) {
    match isa {
        Isa::Avx2 => (Register::is_ymm, Register::is_zmm),
        _ => (Register::is_zmm, Register::is_ymm),
    }
}

fn decode(code: &[u8], base: usize) -> Vec<Instruction> {
    Decoder::with_ip(64, code, base as u64, DecoderOptions::NONE)
        .into_iter()
        .collect()
}

fn uses(ins: &Instruction, pred: impl Fn(Register) -> bool) -> bool {
    (0..ins.op_count()).any(|i| ins.op_kind(i) == OpKind::Register && pred(ins.op_register(i)))
}

/// Checks a wide kernel's code: every tile decodes, ends in `ret`, branches only within
/// itself, uses the tier's registers and no other tier's, and its FMAs are the tier's (or, at
/// avx2, a one-block tail's 128-bit form); the Cranelift part's direct calls go only to tiles,
/// at their first byte. Returns whether a tile uses the opmask `k1`.
fn assert_tier_code(name: &str, isa: Isa, k: &CompiledKernel) -> bool {
    assert!(!k.tiles().is_empty(), "{name} at {isa}: no wide tile");
    let (fma, wide_reg, other_reg) = match isa {
        Isa::Avx2 => (
            Code::VEX_Vfmadd231ps_ymm_ymm_ymmm256,
            Register::is_ymm as fn(Register) -> bool,
            Register::is_zmm as fn(Register) -> bool,
        ),
        _ => (
            Code::EVEX_Vfmadd231ps_zmm_k1z_zmm_zmmm512b32_er,
            Register::is_zmm as fn(Register) -> bool,
            Register::is_ymm as fn(Register) -> bool,
        ),
    };
    let mut fmas = 0;
    let mut masked = false;
    for range in k.tiles() {
        let tile = decode(&k.code()[range.clone()], range.start);
        assert!(
            tile.iter().all(|i| !i.is_invalid()),
            "{name} at {isa}: undecodable"
        );
        assert_eq!(
            tile.last().map(|i| i.mnemonic()),
            Some(Mnemonic::Ret),
            "{name} at {isa}: a tile ends in ret"
        );
        for ins in &tile {
            assert!(
                !uses(ins, other_reg),
                "{name} at {isa}: {ins} is another tier's"
            );
            if ins.mnemonic() == Mnemonic::Vfmadd231ps {
                // An avx2 tail of one block takes the low half's 128-bit form.
                let tail = isa == Isa::Avx2 && ins.code() == Code::VEX_Vfmadd231ps_xmm_xmm_xmmm128;
                assert!(ins.code() == fma || tail, "{name} at {isa}: {ins}");
                fmas += usize::from(ins.code() == fma);
            }
            masked |= ins.op_mask() == Register::K1;
            // Every branch stays inside the tile.
            if ins.op0_kind() == OpKind::NearBranch64 {
                assert!(range.contains(&(ins.near_branch_target() as usize)));
            }
        }
        assert!(tile.iter().any(|i| uses(i, wide_reg)), "{name} at {isa}");
    }
    assert!(fmas > 0, "{name} at {isa}: no FMA of the tier");
    // The Cranelift part's direct calls go only to tiles, at their first byte (the prefetch
    // function is called through a register).
    let first = k.tiles()[0].start;
    let calls: Vec<u64> = decode(&k.code()[..first], 0)
        .iter()
        .filter(|i| i.mnemonic() == Mnemonic::Call && i.op0_kind() == OpKind::NearBranch64)
        .map(|i| i.near_branch_target())
        .collect();
    assert!(!calls.is_empty(), "{name} at {isa}: no tile call");
    for target in calls {
        assert!(
            k.tiles().iter().any(|r| r.start as u64 == target),
            "{name} at {isa}: a call to {target:#x}, no tile's start"
        );
    }
    masked
}

#[test]
fn every_family_emits_its_tiers_instruction_forms_on_every_host() {
    for (name, d) in families() {
        for isa in [Isa::Avx2, Isa::Avx512] {
            let key = at(d.clone(), isa);
            let k = compile(&key, verified(), Dumps::default())
                .unwrap_or_else(|e| panic!("{name} at {isa}: {e}"));
            let masked = assert_tier_code(name, isa, &k);
            // A lane-wise tile's vectors are pixels of one block: never a tail of channels,
            // but a tail of pixels where a row's run leaves one (both families' do at avx512).
            let tail = if d.lanewise() {
                true
            } else {
                !d.oc.div_ceil(4).is_multiple_of(4)
            };
            if d.lanewise() {
                // Its weights and bias: a block of four repeated across the vector.
                let repeat = match isa {
                    Isa::Avx2 => Mnemonic::Vbroadcastf128,
                    _ => Mnemonic::Vbroadcastf32x4,
                };
                let tiles = k
                    .tiles()
                    .iter()
                    .flat_map(|r| decode(&k.code()[r.clone()], 0));
                let mnemonics: Vec<Mnemonic> = tiles.map(|i| i.mnemonic()).collect();
                assert!(mnemonics.contains(&repeat), "{name} at {isa}");
                // Strided pixels' blocks gathered into a vector.
                let gather = match isa {
                    Isa::Avx2 => Mnemonic::Vinsertf128,
                    _ => Mnemonic::Vinsertf32x4,
                };
                assert_eq!(
                    mnemonics.contains(&gather),
                    d.strides[1] > 1,
                    "{name} at {isa}: gathers"
                );
            }
            if d.pool.is_some() {
                // The fused max pool's tile, at the conv's tier (its pixels gathered at the
                // stem pool's stride 2).
                let (wide_reg, _) = tier_registers(isa);
                let max = k
                    .tiles()
                    .iter()
                    .flat_map(|r| decode(&k.code()[r.clone()], 0))
                    .any(|i| i.mnemonic() == Mnemonic::Vmaxps && uses(&i, wide_reg));
                assert!(max, "{name} at {isa}: no wide pooling tile");
            }
            assert_eq!(
                masked,
                isa == Isa::Avx512 && tail,
                "{name} at {isa}: opmask use"
            );
        }
    }
}

/// Activation post-ops run in the wide tiles' registers, at both tiers, dense and lane-wise:
/// the tiles hold the activation's wide instructions, and every constant they read is a
/// RIP-relative operand into the pool after their `ret` (inside the kernel's bytes, before
/// the next tile).
#[test]
fn activation_post_ops_run_in_the_tiles_registers_on_every_host() {
    let mut dense = blocked(ConvDesc::new(1, 16, [3, 9], 32, [1, 1]));
    dense.bias = true;
    let mut depthwise = blocked(ConvDesc::new(1, 16, [4, 19], 16, [3, 3]));
    depthwise.groups = 16;
    depthwise.pads = Pads::uniform(1);
    let acts = [
        (Activation::Sigmoid, Mnemonic::Vdivps),
        (Activation::Silu, Mnemonic::Vdivps),
        (Activation::Tanh, Mnemonic::Vdivps),
        (Activation::Exp, Mnemonic::Vpslld),
        (Activation::HardSwish, Mnemonic::Vminps),
        (
            Activation::HardSigmoid {
                alpha: 0.2,
                beta: 0.5,
            },
            Mnemonic::Vminps,
        ),
        (Activation::LeakyRelu { alpha: 0.1 }, Mnemonic::Vcmpps),
        (Activation::Elu { alpha: 0.7 }, Mnemonic::Vfmadd213ps),
    ];
    for d in [dense, depthwise] {
        for (act, mnemonic) in acts {
            for isa in [Isa::Avx2, Isa::Avx512] {
                let mut d = d.clone();
                d.post_ops = vec![PostOpDesc::Act(act), PostOpDesc::Relu];
                let (key, k) = tier_kernel(d, isa);
                let (wide, _) = tier_registers(isa);
                let mut found = false;
                let mut constants = 0;
                for (i, range) in k.tiles().iter().enumerate() {
                    let pool_end = k.tiles().get(i + 1).map_or(k.code().len(), |r| r.start);
                    // The pool starts on a cache line, so that no constant splits two.
                    assert_eq!(range.end % 64, 0, "{key}: a pool at {:#x}", range.end);
                    for ins in decode(&k.code()[range.clone()], range.start) {
                        found |= ins.mnemonic() == mnemonic && uses(&ins, wide);
                        if ins.is_ip_rel_memory_operand() {
                            let at = ins.ip_rel_memory_address() as usize;
                            assert!(
                                (range.end..pool_end).contains(&at),
                                "{key}: {ins} reads {at:#x}, outside its pool"
                            );
                            constants += 1;
                        }
                    }
                }
                assert!(found, "{key}: no wide {mnemonic:?}");
                assert!(constants > 0, "{key}: no constant from the pool");
            }
        }
    }
}

/// Keys whose wide tiles end in the post-ops: a dense 1x1 conv of `dense_oc` output channels
/// with a bias, a depthwise 3x3 and a Winograd 3x3 (its output transform's tile).
fn epilogue_hosts(dense_oc: usize) -> [ConvDesc; 3] {
    let mut dense = blocked(ConvDesc::new(1, 16, [3, 9], dense_oc, [1, 1]));
    dense.bias = true;
    let mut depthwise = blocked(ConvDesc::new(1, 16, [4, 19], 16, [3, 3]));
    depthwise.groups = 16;
    depthwise.pads = Pads::uniform(1);
    let mut winograd = blocked(ConvDesc::new(1, 16, [9, 13], 32, [3, 3]));
    winograd.pads = Pads::uniform(1);
    winograd.algo = ConvAlgo::WinogradF4x3;
    [dense, depthwise, winograd]
}

/// A PReLU post-op runs in the wide tiles' registers, dense, lane-wise and in Winograd's
/// output transform, at both tiers: each tile that applies it multiplies by a slope vector
/// it reads from the channel parameters (a wide `vmulps` with a register operand, the
/// slopes loaded beside the bias, never a constant of the pool) and selects the negative
/// lanes by a compare.
#[test]
fn prelu_post_ops_run_in_the_tiles_registers_on_every_host() {
    for d in epilogue_hosts(20) {
        for isa in [Isa::Avx2, Isa::Avx512] {
            let mut d = d.clone();
            d.post_ops = vec![PostOpDesc::PRelu, PostOpDesc::Relu];
            let (key, k) = tier_kernel(d, isa);
            let (wide, _) = tier_registers(isa);
            let (mut products, mut compares) = (0, 0);
            for range in k.tiles() {
                for ins in decode(&k.code()[range.clone()], range.start) {
                    let by_register = ins.op_count() == 3 && ins.op2_kind() == OpKind::Register;
                    products += usize::from(
                        ins.mnemonic() == Mnemonic::Vmulps && uses(&ins, wide) && by_register,
                    );
                    compares += usize::from(ins.mnemonic() == Mnemonic::Vcmpps);
                }
            }
            assert!(products > 0, "{key}: no wide product by a slope register");
            assert!(compares > 0, "{key}: no compare picking the negative lanes");
        }
    }
}

/// Winograd keys the wide GEMM tile and transforms cover: stride 1 with a residual, the
/// polyphase stride 2, weights streamed in two chunks with prefetches, and 24 output channels
/// (at avx2 one pair of `ymm` and a last single one; avx512 keeps it at x128).
fn winograd_families() -> Vec<(&'static str, ConvDesc)> {
    let w3 = |ic: usize, hw: [usize; 2], oc: usize| {
        let mut d = blocked(ConvDesc::new(1, ic, hw, oc, [3, 3]));
        d.pads = Pads::uniform(1);
        d.bias = true;
        d.algo = ConvAlgo::WinogradF4x3;
        d
    };
    let mut residual = w3(64, [9, 30], 64);
    residual.post_ops = vec![PostOpDesc::Add, PostOpDesc::Relu];
    let mut s2 = w3(64, [17, 26], 128);
    s2.strides = [2, 2];
    s2.post_ops = vec![PostOpDesc::PRelu, PostOpDesc::Relu];
    vec![
        ("winograd 3x3", residual),
        ("winograd stride 2", s2),
        ("winograd streamed", w3(256, [6, 40], 256)),
        ("winograd 24 channels", w3(8, [5, 9], 24)),
    ]
}

/// A lone clip post-op loads its two bounds once per tile, not once per value: in a dense, a
/// depthwise and a Winograd output tile, at both tiers, every tile that clips loads exactly two
/// constants from its pool into registers.
#[test]
fn a_lone_clip_loads_its_bounds_once_per_tile() {
    for d in epilogue_hosts(32) {
        for isa in [Isa::Avx2, Isa::Avx512] {
            let mut d = d.clone();
            d.post_ops = vec![PostOpDesc::Add, PostOpDesc::Clip { lo: 0.0, hi: 6.0 }];
            let (key, k) = tier_kernel(d, isa);
            let (wide, _) = tier_registers(isa);
            let mut clipping_tiles = 0;
            for range in k.tiles() {
                let tile = decode(&k.code()[range.clone()], range.start);
                let clips = tile
                    .iter()
                    .filter(|i| i.mnemonic() == Mnemonic::Vminps && uses(i, wide))
                    .count();
                if clips == 0 {
                    continue;
                }
                clipping_tiles += 1;
                // Loads of constants into registers (the Winograd transform's own constants
                // are memory operands of its arithmetic).
                let loads = tile
                    .iter()
                    .filter(|i| i.mnemonic() == Mnemonic::Vmovups && i.is_ip_rel_memory_operand())
                    .count();
                assert_eq!(loads, 2, "{key}: a tile of {clips} clips");
            }
            assert!(clipping_tiles > 0, "{key}: no tile clips");
        }
    }
}

/// A depthwise 5x5 conv over 7-pixel rows, pads of 2: each row is one call of one lane-wise
/// tile (`ConvPlan::lanewise_row`), whose border pixels are vectors of their own that skip the
/// taps their windows miss. Columns 0, 1, 5 and 6 take 3, 4, 4 and 3 of the 5 kernel
/// columns, the interior's 2, 3, 4 all 5. At avx2 that is a `ymm` of pixels 2 and 3 and five
/// one-pixel `xmm` vectors: 5 full FMAs and 19 of the low half a kernel row; at avx512 seven
/// one-pixel vectors under the opmask, 29 FMAs.
#[test]
fn a_small_depthwise_row_is_one_tile_whose_border_pixels_skip_their_missing_taps() {
    let mut d = blocked(ConvDesc::new(1, 16, [5, 7], 16, [5, 5]));
    d.groups = 16;
    d.pads = Pads::uniform(2);
    d.bias = true;
    for (isa, full, partial) in [(Isa::Avx2, 5, 19), (Isa::Avx512, 0, 29)] {
        let (key, k) = tier_kernel(d.clone(), isa);
        assert_eq!(k.tiles().len(), 1, "{key}: one tile for the row");
        let tile = decode(&k.code()[k.tiles()[0].clone()], 0);
        let fmas = tile
            .iter()
            .filter(|i| i.mnemonic() == Mnemonic::Vfmadd231ps);
        let (wide, _) = tier_registers(isa);
        let masked = |i: &Instruction| i.op_mask() == Register::K1;
        let low = |i: &Instruction| i.code() == Code::VEX_Vfmadd231ps_xmm_xmm_xmmm128;
        let count = |f: &dyn Fn(&Instruction) -> bool| fmas.clone().filter(|i| f(i)).count();
        assert_eq!(
            count(&|i| uses(i, wide) && !masked(i)),
            full,
            "{key}: full vectors"
        );
        assert_eq!(
            count(&|i| masked(i) || low(i)),
            partial,
            "{key}: one-pixel vectors"
        );
        // The only call from the Cranelift code: the row loop's.
        let first = k.tiles()[0].start;
        let calls = decode(&k.code()[..first], 0)
            .iter()
            .filter(|i| i.mnemonic() == Mnemonic::Call && i.op0_kind() == OpKind::NearBranch64)
            .count();
        assert_eq!(calls, 1, "{key}: one call site");
    }
}

#[test]
fn winograd_tiles_emit_their_tiers_forms_on_every_host() {
    for (name, d) in winograd_families() {
        for isa in [Isa::Avx2, Isa::Avx512] {
            let covered = !(d.oc == 24 && isa == Isa::Avx512);
            assert_eq!(d.tier_for(isa) == isa, covered, "{name} at {isa}");
            let key = at(d.clone(), isa);
            if !covered {
                let err = compile(&key, verified(), Dumps::default()).unwrap_err();
                assert!(err.to_string().contains("does not cover"), "{err}");
                continue;
            }
            let k = compile(&key, verified(), Dumps::default())
                .unwrap_or_else(|e| panic!("{name} at {isa}: {e}"));
            assert!(!assert_tier_code(name, isa, &k), "{name} at {isa}: opmask");
            // The input and output transforms, one GEMM tile for the pairs of vectors, one
            // more for a chunk's single last vector.
            let single = d.oc == 24;
            assert_eq!(k.tiles().len(), 3 + usize::from(single), "{name} at {isa}");
        }
    }
}

#[test]
fn x128_keys_have_no_wide_code() {
    for (name, d) in families() {
        let k = compile(&at(d, Isa::X128), verified(), Dumps::default()).unwrap();
        assert!(k.tiles().is_empty(), "{name}");
        for ins in decode(k.code(), 0) {
            assert!(
                !uses(&ins, |r| r.is_ymm() || r.is_zmm()),
                "{name}: {ins} is wider than x128"
            );
        }
    }
}

#[test]
fn the_tier_is_in_the_one_liner_and_the_disassembly() {
    let (_, d) = families().remove(0);
    let key = at(d, Isa::Avx512);
    assert!(key.to_string().contains(" isa:avx512 "), "{key}");
    let dumps = Dumps {
        clif: false,
        disasm: true,
    };
    let k = compile(&key, verified(), dumps).unwrap();
    let text = k.disasm().expect("asked for");
    assert!(text.contains("x64 backend"), "{text}");
    assert!(text.contains("vfmadd231ps zmm"), "{text}");
}

#[test]
fn wide_peaks_are_emitted_whole_for_each_wide_tier() {
    for isa in [Isa::Avx2, Isa::Avx512] {
        for pattern in [
            WidePattern::Registers,
            WidePattern::DirectTile,
            WidePattern::GemmTile,
        ] {
            let key = PrimitiveKey::WidePeak { isa, pattern };
            let k = compile(&key, verified(), Dumps::default()).unwrap();
            assert_eq!(k.tiles().len(), 1, "{key}");
            assert_eq!(k.tiles()[0], 0..k.code().len(), "{key}");
            let code = decode(k.code(), 0);
            let fmas = code
                .iter()
                .filter(|i| i.mnemonic() == Mnemonic::Vfmadd231ps)
                .count();
            assert!(fmas >= 12, "{key}: {fmas} FMAs");
        }
    }
    let err = compile(
        &PrimitiveKey::WidePeak {
            isa: Isa::X128,
            pattern: WidePattern::Registers,
        },
        verified(),
        Dumps::default(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("needs a wide tier"), "{err}");
}

/// Keys whose tiles could not address their weights with 32-bit displacements keep x128
/// code, as do the families the wide tiles do not cover yet.
#[test]
fn tier_for_keeps_what_a_wide_tile_cannot_address_at_x128() {
    let plain = ConvDesc::new(1, 64, [9, 9], 64, [3, 3]);
    assert_eq!(plain.tier_for(Isa::Avx512), Isa::Avx512);
    let huge = ConvDesc::new(1, 4096, [2048, 2048], 64, [2048, 2048]);
    assert_eq!(huge.tier_for(Isa::Avx2), Isa::X128);
    // Groups of 16 output channels are whole `ymm` and `zmm`; groups of 8 whole `ymm` only,
    // groups of 4 neither.
    let mut grouped = plain.clone();
    grouped.groups = 4;
    assert_eq!(grouped.tier_for(Isa::Avx2), Isa::Avx2);
    assert_eq!(grouped.tier_for(Isa::Avx512), Isa::Avx512);
    grouped.groups = 8;
    assert_eq!(grouped.tier_for(Isa::Avx2), Isa::Avx2);
    assert_eq!(grouped.tier_for(Isa::Avx512), Isa::X128);
    // A depthwise conv takes the lane-wise tile at any stride along rows (gathering its
    // pixels' blocks past 1), but only into an `nChw4c` destination.
    let mut depthwise = blocked(plain.clone());
    depthwise.groups = 64;
    assert_eq!(depthwise.tier_for(Isa::Avx512), Isa::Avx512);
    depthwise.strides = [1, 2];
    assert_eq!(depthwise.tier_for(Isa::Avx2), Isa::Avx2);
    depthwise.dst_layout = Layout::Nchw;
    assert_eq!(depthwise.tier_for(Isa::Avx2), Isa::X128);
    depthwise.dst_layout = Layout::Nchw4c;
    // A dilation whose last tap lies 2^31 bytes past a lane-wise tile's last vector of four
    // pixels keeps x128 code, whose offsets are 64-bit.
    depthwise.strides = [1, 1];
    depthwise.kw = 2;
    depthwise.dilations = [1, 134_217_700];
    assert_eq!(depthwise.tier_for(Isa::Avx512), Isa::X128);
    grouped.groups = 16;
    assert_eq!(grouped.tier_for(Isa::Avx2), Isa::X128);
    // A key forced to a tier that does not cover it is refused, not miscompiled.
    grouped.isa = Isa::Avx2;
    let err = PrimitiveKey::Conv(grouped).validate().unwrap_err();
    assert!(
        err.to_string().contains("the avx2 tier does not cover"),
        "{err}"
    );
}

/// Max and average pooling at column strides 1 and 2, fixed and runtime extents: each wide
/// tier's tiles decode, end in `ret`, use its registers only, and carry its maximum with the
/// NaN compare (and, at avx512, the opmask's all-ones fill) or its sum and reciprocal, a
/// strided one's pixels inserted block by block; a pooling the tiles cannot cover (an NCHW
/// side) stays x128 code.
#[test]
fn pooling_tiles_emit_their_tiers_forms_on_every_host() {
    let pool = |kind, count_include_pad| PoolDesc {
        kind,
        mb: 1,
        c: 8,
        ih: 9,
        iw: 37,
        window: PoolWindow {
            kernel: [5, 5],
            strides: [1, 1],
            pads: Pads::uniform(2),
            dilations: [1, 1],
            ceil_mode: false,
        },
        count_include_pad,
        src_layout: Layout::Nchw4c,
        dst_layout: Layout::Nchw4c,
        runtime: RuntimeDims::NONE,
        isa: Isa::X128,
    };
    let runtime = RuntimeDims { h: true, w: true };
    let strided = |mut d: PoolDesc| {
        d.window.strides = [2, 2];
        d
    };
    for d in [pool(PoolKind::Max, false), pool(PoolKind::Avg, true)] {
        for d in [d.clone(), d.clone().with_runtime(runtime), strided(d)] {
            for isa in [Isa::Avx2, Isa::Avx512] {
                let key = PrimitiveKey::Pool(d.clone().at_tier(isa));
                assert!(key.to_string().contains(&format!("isa:{isa}")), "{key}");
                let k = compile(&key, verified(), Dumps::default())
                    .unwrap_or_else(|e| panic!("{key}: {e}"));
                assert!(!k.tiles().is_empty(), "{key}: no wide tile");
                let (wide_reg, other_reg) = tier_registers(isa);
                let mut mnemonics = Vec::new();
                for range in k.tiles() {
                    let tile = decode(&k.code()[range.clone()], range.start);
                    assert!(tile.iter().all(|i| !i.is_invalid()), "{key}: undecodable");
                    assert_eq!(tile.last().map(|i| i.mnemonic()), Some(Mnemonic::Ret));
                    for ins in &tile {
                        assert!(!uses(ins, other_reg), "{key}: {ins} is another tier's");
                        if uses(ins, wide_reg) {
                            mnemonics.push(ins.mnemonic());
                        }
                    }
                }
                let expected: &[Mnemonic] = match (d.kind, isa) {
                    (PoolKind::Max, Isa::Avx2) => &[Mnemonic::Vmaxps, Mnemonic::Vcmpps],
                    (PoolKind::Max, _) => {
                        &[Mnemonic::Vmaxps, Mnemonic::Vcmpps, Mnemonic::Vpternlogd]
                    }
                    (PoolKind::Avg, _) => &[Mnemonic::Vaddps, Mnemonic::Vmulps],
                };
                for m in expected {
                    assert!(mnemonics.contains(m), "{key}: no wide {m:?}");
                }
                let insert = match isa {
                    Isa::Avx2 => Mnemonic::Vinsertf128,
                    _ => Mnemonic::Vinsertf32x4,
                };
                assert_eq!(
                    mnemonics.contains(&insert),
                    d.window.strides[1] > 1,
                    "{key}: blocks inserted one by one only at a column stride past 1"
                );
            }
        }
    }
    let mut nchw = pool(PoolKind::Avg, false);
    nchw.src_layout = Layout::Nchw;
    let mut nchw_dst = strided(pool(PoolKind::Max, false));
    nchw_dst.dst_layout = Layout::Nchw;
    for d in [nchw, nchw_dst] {
        assert_eq!(d.tier_for(Isa::Avx2), Isa::X128, "{d:?}");
        let key = PrimitiveKey::Pool(PoolDesc {
            isa: Isa::Avx2,
            ..d
        });
        let err = compile(&key, verified(), Dumps::default()).unwrap_err();
        assert!(
            err.to_string().contains("does not cover this pooling"),
            "{err}"
        );
    }
}

/// Transposed convolutions of one tap per output pixel (kernel 2x2 stride 2 with a relu, and
/// 2x3 stride 2x3 with 36 output channels and a sigmoid: a partial tile of output-channel
/// blocks, at avx512 under an opmask), fixed and runtime extents: each wide tier's direct
/// tiles, with its FMAs and registers only, every call to a tile's start, the sigmoid's
/// division in the tile.
#[test]
fn one_tap_conv_transposes_emit_their_tiers_forms_on_every_host() {
    let up = ConvTransposeDesc {
        mb: 1,
        ic: 16,
        ih: 5,
        iw: 31,
        oc: 32,
        kh: 2,
        kw: 2,
        strides: [2, 2],
        dilations: [1, 1],
        pads: Pads::default(),
        output_padding: [0, 0],
        groups: 1,
        bias: true,
        post_ops: vec![PostOpDesc::Relu],
        runtime: RuntimeDims::NONE,
        isa: Isa::X128,
    };
    let odd = ConvTransposeDesc {
        oc: 36,
        kw: 3,
        strides: [2, 3],
        post_ops: vec![PostOpDesc::Act(Activation::Sigmoid)],
        ..up.clone()
    };
    let runtime = RuntimeDims { h: true, w: true };
    for d in [
        up.clone(),
        odd.clone(),
        up.with_runtime(runtime),
        odd.with_runtime(runtime),
    ] {
        for isa in [Isa::Avx2, Isa::Avx512] {
            let key = PrimitiveKey::ConvTranspose(d.clone().at_tier(isa));
            assert!(key.to_string().contains(&format!("isa:{isa}")), "{key}");
            let k = compile(&key, verified(), Dumps::default())
                .unwrap_or_else(|e| panic!("{key}: {e}"));
            let masked = assert_tier_code(&key.to_string(), isa, &k);
            // 36 channels leave one block past two tiles of four: a tail under `k1`.
            assert_eq!(masked, isa == Isa::Avx512 && d.oc == 36, "{key}");
            let (wide_reg, _) = tier_registers(isa);
            let divides = k
                .tiles()
                .iter()
                .flat_map(|r| decode(&k.code()[r.clone()], 0))
                .any(|i| i.mnemonic() == Mnemonic::Vdivps && uses(&i, wide_reg));
            assert_eq!(divides, d.oc == 36, "{key}: the sigmoid in the tile");
        }
    }
}

/// Global max and average pooling of an `nChw4c` source, fixed and runtime extents: each wide
/// tier's tile decodes, ends in `ret`, uses its registers only and carries the maximum with
/// its NaN compare or the sum; an NCHW source stays x128 code, and a key that claims a wide
/// tier for it is refused.
#[test]
fn global_pooling_tiles_emit_their_tiers_forms_on_every_host() {
    let global = |kind| GlobalPoolDesc {
        kind,
        mb: 2,
        c: 12,
        ih: 7,
        iw: 9,
        src_layout: Layout::Nchw4c,
        dst_layout: Layout::Nchw,
        runtime: RuntimeDims::NONE,
        isa: Isa::X128,
    };
    let runtime = RuntimeDims { h: true, w: true };
    for d in [global(PoolKind::Max), global(PoolKind::Avg)] {
        for d in [d.clone(), d.clone().with_runtime(runtime)] {
            for isa in [Isa::Avx2, Isa::Avx512] {
                let key = PrimitiveKey::GlobalPool(d.clone().at_tier(isa));
                assert!(key.to_string().contains(&format!("isa:{isa}")), "{key}");
                let k = compile(&key, verified(), Dumps::default())
                    .unwrap_or_else(|e| panic!("{key}: {e}"));
                assert_eq!(k.tiles().len(), 1, "{key}: one tile for every block");
                let (wide_reg, other_reg) = tier_registers(isa);
                let range = k.tiles()[0].clone();
                let tile = decode(&k.code()[range.clone()], range.start);
                assert!(tile.iter().all(|i| !i.is_invalid()), "{key}: undecodable");
                assert_eq!(tile.last().map(|i| i.mnemonic()), Some(Mnemonic::Ret));
                assert!(
                    tile.iter().all(|i| !uses(i, other_reg)),
                    "{key}: another tier's"
                );
                let wide: Vec<Mnemonic> = tile
                    .iter()
                    .filter(|i| uses(i, wide_reg))
                    .map(|i| i.mnemonic())
                    .collect();
                let expected: &[Mnemonic] = match d.kind {
                    PoolKind::Max => &[Mnemonic::Vmaxps, Mnemonic::Vcmpps],
                    PoolKind::Avg => &[Mnemonic::Vaddps],
                };
                for m in expected {
                    assert!(wide.contains(m), "{key}: no wide {m:?}");
                }
            }
        }
    }
    let nchw = GlobalPoolDesc {
        src_layout: Layout::Nchw,
        ..global(PoolKind::Avg)
    };
    assert_eq!(nchw.tier_for(Isa::Avx2), Isa::X128);
    let key = PrimitiveKey::GlobalPool(GlobalPoolDesc {
        isa: Isa::Avx2,
        ..nchw
    });
    let err = compile(&key, verified(), Dumps::default()).unwrap_err();
    assert!(
        err.to_string()
            .contains("does not cover this global pooling"),
        "{err}"
    );
}

/// Element-wise keys at the wide tiers: an activation, PReLU and each binary op with each
/// broadcast, in both layouts, call a tile of the tier's registers only, with the op's wide
/// instruction; `relu` and `add` stay x128, and a key that claims a wide tier for them is
/// refused.
#[test]
fn eltwise_tiles_emit_their_tiers_forms_on_every_host() {
    let binary = |op, rhs| EltwiseKind::Binary { op, rhs };
    let cases = [
        (EltwiseKind::Act(Activation::Silu), Mnemonic::Vdivps),
        (EltwiseKind::Act(Activation::HardSwish), Mnemonic::Vminps),
        (
            EltwiseKind::Act(Activation::Elu { alpha: 1.0 }),
            Mnemonic::Vfmadd213ps,
        ),
        (EltwiseKind::PRelu, Mnemonic::Vmulps),
        (binary(BinaryKind::Add, Broadcast::Full), Mnemonic::Vaddps),
        (
            binary(BinaryKind::Sub, Broadcast::PerChannel),
            Mnemonic::Vsubps,
        ),
        (
            binary(BinaryKind::Mul, Broadcast::PerImageChannel),
            Mnemonic::Vmulps,
        ),
        (binary(BinaryKind::Div, Broadcast::Full), Mnemonic::Vdivps),
    ];
    for (kind, op) in cases {
        for layout in [Layout::Nchw, Layout::Nchw4c] {
            for isa in [Isa::Avx2, Isa::Avx512] {
                let d = EltwiseDesc {
                    kind,
                    shape: [2, 7, 5, 9],
                    layout,
                    isa: Isa::X128,
                    runtime: RuntimeDims::NONE,
                };
                let key = PrimitiveKey::Eltwise(d.at_tier(isa));
                assert!(key.to_string().contains(&format!("isa:{isa}")), "{key}");
                let k = compile(&key, verified(), Dumps::default())
                    .unwrap_or_else(|e| panic!("{key}: {e}"));
                assert_eq!(k.tiles().len(), 1, "{key}");
                let (wide_reg, other_reg) = tier_registers(isa);
                let range = k.tiles()[0].clone();
                let tile = decode(&k.code()[range.clone()], range.start);
                assert!(tile.iter().all(|i| !i.is_invalid()), "{key}: undecodable");
                assert_eq!(tile.last().map(|i| i.mnemonic()), Some(Mnemonic::Ret));
                assert!(tile.iter().all(|i| !uses(i, other_reg)), "{key}");
                let wide_op = tile.iter().any(|i| i.mnemonic() == op && uses(i, wide_reg));
                assert!(wide_op, "{key}: no wide {op:?}");
            }
        }
    }
    for kind in [EltwiseKind::Relu, EltwiseKind::Add] {
        let d = EltwiseDesc {
            kind,
            shape: [1, 8, 4, 4],
            layout: Layout::Nchw4c,
            isa: Isa::Avx2,
            runtime: RuntimeDims::NONE,
        };
        assert_eq!(d.tier_for(Isa::Avx2), Isa::X128, "{d:?}");
        let err = compile(&PrimitiveKey::Eltwise(d), verified(), Dumps::default()).unwrap_err();
        assert!(
            err.to_string()
                .contains("does not cover this element-wise op"),
            "{err}"
        );
    }
}
