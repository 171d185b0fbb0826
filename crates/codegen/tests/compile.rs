//! Every kind of key compiles with the verifier on, to relocation-free code.

use primjit_codegen::key::RuntimeDims;
use primjit_codegen::{
    CodegenOptions, ConvAlgo, ConvDesc, Dumps, EltwiseDesc, EltwiseKind, FmaPattern,
    GlobalPoolDesc, Isa, Layout, PoolDesc, PostOpDesc, PrimitiveKey, compile,
};
use primjit_ir::{Pads, PoolKind, PoolWindow};

fn verified() -> CodegenOptions {
    CodegenOptions {
        verify: true,
        ..CodegenOptions::default()
    }
}

fn keys() -> Vec<PrimitiveKey> {
    let mut conv = ConvDesc::new(1, 64, [20, 21], 64, [3, 3]);
    conv.pads = Pads::uniform(1);
    conv.bias = true;
    conv.post_ops = vec![
        PostOpDesc::Add,
        PostOpDesc::Relu,
        PostOpDesc::Clip { lo: -1.0, hi: 6.0 },
    ];
    conv.src_layout = Layout::Nchw4c;
    conv.dst_layout = Layout::Nchw4c;
    let mut nchw = ConvDesc::new(2, 3, [9, 7], 5, [7, 7]);
    nchw.strides = [2, 2];
    nchw.dilations = [1, 2];
    nchw.pads = Pads {
        top: 3,
        left: 3,
        bottom: 2,
        right: 4,
    };
    let mut grouped = ConvDesc::new(1, 16, [5, 5], 24, [1, 1]);
    grouped.groups = 8;
    let pool = PoolDesc {
        kind: PoolKind::Avg,
        mb: 1,
        c: 6,
        ih: 7,
        iw: 9,
        window: PoolWindow {
            kernel: [3, 3],
            strides: [2, 2],
            pads: Pads::uniform(1),
            dilations: [1, 1],
            ceil_mode: true,
        },
        count_include_pad: true,
        src_layout: Layout::Nchw,
        dst_layout: Layout::Nchw4c,
        runtime: Default::default(),
        isa: Isa::X128,
    };
    vec![
        PrimitiveKey::Conv(conv),
        PrimitiveKey::Conv(nchw),
        PrimitiveKey::Conv(grouped),
        PrimitiveKey::Pool(pool.clone()),
        PrimitiveKey::Pool(PoolDesc {
            kind: PoolKind::Max,
            ..pool
        }),
        PrimitiveKey::GlobalPool(GlobalPoolDesc {
            kind: PoolKind::Avg,
            mb: 1,
            c: 5,
            ih: 3,
            iw: 3,
            src_layout: Layout::Nchw,
            dst_layout: Layout::Nchw,
            runtime: RuntimeDims::NONE,
            isa: Isa::X128,
        }),
        PrimitiveKey::Eltwise(EltwiseDesc {
            kind: EltwiseKind::Add,
            shape: [1, 3, 5, 7],
            layout: Layout::Nchw,
            isa: Isa::X128,
            runtime: RuntimeDims::NONE,
        }),
        PrimitiveKey::Eltwise(EltwiseDesc {
            kind: EltwiseKind::Relu,
            shape: [1, 3, 5, 7],
            layout: Layout::Nchw4c,
            isa: Isa::X128,
            runtime: RuntimeDims::NONE,
        }),
        PrimitiveKey::FmaPeak(FmaPattern::Registers),
        PrimitiveKey::FmaPeak(FmaPattern::Broadcast),
        PrimitiveKey::FmaPeak(FmaPattern::SharedBroadcast),
    ]
}

#[test]
fn every_kind_of_key_compiles_with_the_verifier() {
    for key in keys() {
        let k = compile(
            &key,
            verified(),
            Dumps {
                clif: true,
                disasm: true,
            },
        )
        .unwrap_or_else(|e| panic!("{key}: {e}"));
        assert!(!k.code().is_empty(), "{key}");
        assert_eq!(k.key(), &key);
        assert!(k.clif().unwrap().contains("function"), "{key}");
        assert!(k.disasm().unwrap().contains("ret"), "{key}");
    }
}

/// The peak kernels run the instructions they stand for: FMAs on registers alone, a broadcast
/// load from memory per FMA, or (the Winograd tile) a scalar load, a register broadcast and a
/// copy per two FMAs; no other register copied (Cranelift ties an FMA's result to a
/// multiplicand, which must then be dead) and nothing spilled to the stack.
#[test]
fn the_peak_kernels_run_their_pattern_and_nothing_else() {
    let dumps = Dumps {
        clif: false,
        disasm: true,
    };
    for (pattern, fmas) in [
        (FmaPattern::Registers, 96),
        (FmaPattern::Broadcast, 144),
        (FmaPattern::SharedBroadcast, 120),
    ] {
        let k = compile(&PrimitiveKey::FmaPeak(pattern), verified(), dumps).expect("compile");
        let asm = k.disasm().expect("disassembly");
        let count = |f: &dyn Fn(&str) -> bool| asm.lines().filter(|l| f(l.trim())).count();
        assert_eq!(
            count(&|l| l.starts_with("vfmadd")),
            fmas,
            "{pattern:?}: {asm}"
        );
        let broadcasts = count(&|l| l.starts_with("vbroadcastss") && l.contains('('));
        let want = if pattern == FmaPattern::Broadcast {
            fmas
        } else {
            0
        };
        assert_eq!(broadcasts, want, "{pattern:?}: {asm}");
        // The shared broadcast: a scalar load, a broadcast from a register, and a copy for
        // its second FMA.
        let shared = if pattern == FmaPattern::SharedBroadcast {
            fmas / 2
        } else {
            0
        };
        let scalar_loads = count(&|l| l.starts_with("vmovss") && l.contains('('));
        let register_broadcasts =
            count(&|l| l.starts_with("vbroadcastss") && l.matches("%xmm").count() == 2);
        assert_eq!(scalar_loads, shared, "{pattern:?}: {asm}");
        assert_eq!(register_broadcasts, shared, "{pattern:?}: {asm}");
        // A copy between registers: `movdqa %xmm1, %xmm2` and the like.
        let copies = count(&|l| l.starts_with("mov") && l.matches("%xmm").count() == 2);
        assert_eq!(copies, shared, "{pattern:?}: {asm}");
        let spills = count(&|l| l.contains("rsp") && l.contains("xmm"));
        assert_eq!(spills, 0, "{pattern:?}: {asm}");
    }
}

/// A stride-1 Winograd conv whose transformed weights stream from beyond L2 (128 channels:
/// 2.4 MB) asks the runtime to prefetch its weight panels: one indirect call, in the loop over
/// panels; one whose weights stay in L2 (64 channels: 0.6 MB), a stride-2 one, and the
/// streamed one compiled without prefetches (`CodegenOptions::prefetch_weights`) call
/// nothing.
#[test]
fn only_streamed_stride_1_winograd_kernels_prefetch() {
    let winograd = |channels: usize, stride: usize| {
        let mut d = ConvDesc::new(1, channels, [20, 24], channels, [3, 3]);
        d.strides = [stride, stride];
        d.pads = Pads::uniform(1);
        d.bias = true;
        d.src_layout = Layout::Nchw4c;
        d.dst_layout = Layout::Nchw4c;
        d.algo = ConvAlgo::WinogradF4x3;
        PrimitiveKey::Conv(d)
    };
    let without = CodegenOptions {
        prefetch_weights: false,
        ..verified()
    };
    for (key, options, calls) in [
        (winograd(128, 1), verified(), 1),
        (winograd(64, 1), verified(), 0),
        (winograd(256, 2), verified(), 0),
        (winograd(128, 1), without, 0),
    ] {
        let k = compile(
            &key,
            options,
            Dumps {
                clif: false,
                disasm: true,
            },
        )
        .unwrap_or_else(|e| panic!("{key}: {e}"));
        let asm = k.disasm().expect("disassembly");
        let found = asm.lines().filter(|l| l.trim().starts_with("call")).count();
        assert_eq!(found, calls, "{key}: {asm}");
    }
}

#[test]
fn invalid_keys_are_errors_not_panics() {
    let bad = PrimitiveKey::Conv(ConvDesc::new(1, 3, [2, 2], 4, [3, 3]));
    let err = compile(&bad, verified(), Dumps::default()).unwrap_err();
    assert!(err.to_string().contains("does not fit"), "{err}");
}

/// Fuzzing finding (engine_api, a libFuzzer timeout): a pooling key 2.7 billion columns wide
/// was scanned window by window for padding-only windows before its size was checked, so
/// validating it took minutes. The size is now checked first.
#[test]
fn oversized_pool_key_is_rejected_for_its_size_before_any_window_scan() {
    let key = PrimitiveKey::Pool(PoolDesc {
        kind: PoolKind::Max,
        mb: 1,
        c: 1,
        ih: 1,
        iw: 2_734_686_207,
        window: PoolWindow {
            kernel: [3, 3],
            strides: [1, 1],
            pads: Pads {
                top: 2,
                left: 2,
                bottom: 0,
                right: 0,
            },
            dilations: [1, 3],
            ceil_mode: false,
        },
        count_include_pad: true,
        src_layout: Layout::Nchw,
        dst_layout: Layout::Nchw,
        runtime: Default::default(),
        isa: Isa::X128,
    });
    let err = key.validate().unwrap_err();
    assert!(
        err.reason.contains("the input") && err.reason.contains("more than"),
        "{err}"
    );
    assert!(compile(&key, verified(), Dumps::default()).is_err());
}

/// A 2x2 max pooling of 3 channels of 5x5, NCHW, that the fuzzing regressions below vary.
fn small_max_pool() -> PoolDesc {
    PoolDesc {
        kind: PoolKind::Max,
        mb: 1,
        c: 3,
        ih: 5,
        iw: 5,
        window: PoolWindow {
            kernel: [2, 2],
            strides: [1, 1],
            pads: Pads::default(),
            dilations: [1, 1],
            ceil_mode: false,
        },
        count_include_pad: false,
        src_layout: Layout::Nchw,
        dst_layout: Layout::Nchw,
        runtime: Default::default(),
        isa: Isa::X128,
    }
}

/// Fuzzing finding (engine_api with overflow checks): a key with dilation 0 printed its
/// benchdnn gap as `dilation - 1`, which overflows: validating it panicked in a debug build
/// (the error message names the key) and printed `dh18446744073709551615` in a release build.
/// The gap is now signed.
#[test]
fn key_with_zero_dilation_is_an_error_whose_key_prints_a_gap_of_minus_one() {
    let mut pool = small_max_pool();
    pool.window.dilations = [0, 1];
    let pool = PrimitiveKey::Pool(pool);
    let mut conv = ConvDesc::new(1, 3, [5, 5], 4, [3, 3]);
    conv.dilations = [1, 0];
    for key in [pool, PrimitiveKey::Conv(conv)] {
        let err = key.validate().unwrap_err();
        assert!(err.reason.contains("dilations must be at least 1"), "{err}");
        let gaps = if matches!(key, PrimitiveKey::Pool(_)) {
            "dh-1dw0"
        } else {
            "dh0dw-1"
        };
        assert!(err.key.contains(gaps), "{err}");
        assert!(compile(&key, verified(), Dumps::default()).is_err());
    }
}

/// Channel counts next to `usize::MAX` rounded up to whole vectors wrapped to 0, so that a
/// pool of 2^64 - 1 channels validated as an empty tensor, its buffers had no floats, and its
/// kernel wrote past them; an input extent that large wrapped the padded input's sum.
#[test]
fn channels_or_extents_next_to_the_largest_integer_are_invalid_keys() {
    for c in [usize::MAX, usize::MAX - 2] {
        let mut pool = PoolDesc {
            src_layout: Layout::Nchw4c,
            dst_layout: Layout::Nchw4c,
            ..small_max_pool()
        };
        pool.c = c;
        let err = PrimitiveKey::Pool(pool).validate().unwrap_err();
        assert!(err.reason.contains("elements"), "{err}");
        let conv = ConvDesc::new(1, 4, [10, 11], c, [3, 3]);
        assert!(PrimitiveKey::Conv(conv).validate().is_err());
        let conv = ConvDesc::new(1, c, [10, 11], 4, [3, 3]);
        assert!(PrimitiveKey::Conv(conv).validate().is_err());
    }
    let mut wide = ConvDesc::new(1, 4, [10, usize::MAX], 4, [3, 3]);
    wide.pads = primjit_ir::Pads::uniform(1);
    assert!(PrimitiveKey::Conv(wide).validate().is_err());
}

/// Fuzzing finding (engine_api with overflow checks): a conv whose stride was 2^63 had one
/// output row, so it validated, and its lowering overflowed computing the row stride in bytes
/// (a panic with overflow checks). Strides, dilations and pads are now bounded by `MAX_STEP`,
/// which keeps every such byte offset within i64.
#[test]
fn huge_stride_dilation_or_pad_is_an_invalid_key_not_an_overflow() {
    let base = ConvDesc::new(1, 3, [10, 11], 4, [5, 3]);
    let mut stride = base.clone();
    stride.strides = [11_684_205_100_810_827_259, 1];
    let mut dilation = base.clone();
    dilation.dilations = [1, usize::MAX];
    let mut pad = base.clone();
    pad.pads.right = usize::MAX;
    let mut pool = PoolDesc {
        src_layout: Layout::Nchw4c,
        dst_layout: Layout::Nchw4c,
        ..small_max_pool()
    };
    pool.window.strides = [1, primjit_codegen::MAX_STEP + 1];
    let pool = PrimitiveKey::Pool(pool);
    for key in [
        PrimitiveKey::Conv(stride),
        PrimitiveKey::Conv(dilation),
        PrimitiveKey::Conv(pad),
        pool,
    ] {
        let err = key.validate().unwrap_err();
        assert!(err.reason.contains("must be at most 536870912"), "{err}");
        assert!(compile(&key, verified(), Dumps::default()).is_err());
    }
    // The bound itself is valid.
    let mut largest = base;
    largest.strides = [primjit_codegen::MAX_STEP, 1];
    assert_eq!(PrimitiveKey::Conv(largest).validate(), Ok(()));
}
