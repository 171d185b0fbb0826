//! The transposed-convolution kernel against the reference interpreter on nChw4c buffers that
//! end at a guard page: groups 1 and depthwise, strides 1 to 3, kernels 1 to 4, dilations,
//! pads, output padding, one-pixel images and channels that do not fill their last block, and
//! keys whose input extents are left to run time, called at several extents, which must give
//! the exact keys' bits; kernels of one tap per output pixel (a kernel the size of its
//! stride) at every host tier, which must give the x128 kernel's bits; the example graph
//! through the executor, at every host tier.
//!
//! Every problem runs on one thread and on pools of two and three threads, which must agree
//! to the bit; destinations start as a NaN sentinel, so an element left unwritten fails.
//!
//! # Tolerance
//!
//! The kernel sums each element in one f32 chain of at most `n = ic * kh * kw + 1` terms (the
//! bias first), the reference in f64 with one rounding: the error is at most
//! `(n + 1) * 2^-24 * sum |terms|`, with the sum of magnitudes computed by the reference on
//! `|x|`, `|w|` and `|b|`. The post-ops drawn (relu, clip, sigmoid, tanh) change no error by
//! more than a factor of 1 (their slopes are at most 1), and the vector sigmoid and tanh add
//! at most 8 ulps of the result.

mod common;
use common::engine;

use std::sync::Arc;

use primjit_codegen::key::RuntimeDims;
use primjit_codegen::{
    Activation, ConvTransposeDesc, Isa, PostOpDesc, PrimitiveKey, pack_conv_transpose_weights,
};
use primjit_ir::Pads;
use primjit_reference::{ConvTransposeAttrs, Post, Tensor};
use primjit_runtime::Primitive;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

fn compile(key: &PrimitiveKey) -> Arc<Primitive> {
    engine()
        .compile(key)
        .unwrap_or_else(|e| panic!("{key} does not compile: {e}"))
}

/// SplitMix64.
struct Rng(u64);

impl Rng {
    /// Uniform in `[-2, 2)`.
    fn value(&mut self) -> f32 {
        let r = common::splitmix64(&mut self.0);
        (r >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
    }

    fn tensor(&mut self, shape: Vec<usize>) -> Tensor {
        Tensor {
            data: (0..shape.iter().product()).map(|_| self.value()).collect(),
            shape,
        }
    }
}

/// A problem's weights and bias, drawn for `d`.
struct Problem {
    weights: Tensor,
    bias: Option<Tensor>,
    packed: Vec<f32>,
}

impl Problem {
    fn new(d: &ConvTransposeDesc, rng: &mut Rng) -> Problem {
        let weights = rng.tensor(d.weight_shape().to_vec());
        let bias = d.bias.then(|| rng.tensor(vec![d.oc]));
        let packed =
            pack_conv_transpose_weights(d, &weights.data, bias.as_ref().map(|b| b.data.as_slice()));
        Problem {
            weights,
            bias,
            packed,
        }
    }
}

fn attrs(d: &ConvTransposeDesc) -> ConvTransposeAttrs {
    ConvTransposeAttrs {
        strides: d.strides,
        dilations: d.dilations,
        pads: d.pads,
        output_padding: d.output_padding,
        groups: d.groups,
    }
}

/// Runs `p` on `x` with `packed` weights ([`common::run_blocked`]).
fn run(
    p: &Primitive,
    x: &Tensor,
    packed: &[f32],
    extents: Option<[usize; 2]>,
    dst_shape: [usize; 4],
) -> Result<Vec<f32>, TestCaseError> {
    common::run_blocked(p, x, Some(packed), extents, dst_shape)
}

/// Checks the kernel's result against the reference (see the module documentation).
fn check(
    d: &ConvTransposeDesc,
    x: &Tensor,
    problem: &Problem,
    got: &[f32],
) -> Result<(), TestCaseError> {
    let a = attrs(d);
    let posts: Vec<Post<'_>> = d
        .post_ops
        .iter()
        .map(|p| match *p {
            PostOpDesc::Relu => Post::Relu,
            PostOpDesc::Clip { lo, hi } => Post::Clip { lo, hi },
            PostOpDesc::Act(act) => Post::Act(act),
            PostOpDesc::Add | PostOpDesc::PRelu => unreachable!("no residual, no prelu"),
        })
        .collect();
    let want =
        primjit_reference::conv_transpose(x, &problem.weights, problem.bias.as_ref(), &a, &posts);
    prop_assert_eq!(&want.shape, &d.dst_shape().to_vec());
    let abs = |t: &Tensor| Tensor {
        shape: t.shape.clone(),
        data: t.data.iter().map(|v| v.abs()).collect(),
    };
    let magnitude = primjit_reference::conv_transpose(
        &abs(x),
        &abs(&problem.weights),
        problem.bias.as_ref().map(abs).as_ref(),
        &a,
        &[],
    );
    let terms = (d.ic / d.groups * d.kh * d.kw + 2) as f32;
    prop_assert_eq!(got.len(), want.data.len());
    for (i, ((&g, &w), &m)) in got.iter().zip(&want.data).zip(&magnitude.data).enumerate() {
        let bound =
            terms * f32::EPSILON / 2.0 * m + 8.0 * f32::EPSILON * w.abs() + f32::MIN_POSITIVE;
        prop_assert!(
            (g - w).abs() <= bound,
            "{}: element {i} is {g}, the reference {w} (bound {bound})",
            PrimitiveKey::ConvTranspose(d.clone())
        );
    }
    Ok(())
}

/// Post-ops a transposed conv takes: none, relu, clip, an activation, two.
fn post_ops() -> impl Strategy<Value = Vec<PostOpDesc>> {
    prop_oneof![
        2 => Just(Vec::new()),
        1 => Just(vec![PostOpDesc::Relu]),
        1 => Just(vec![PostOpDesc::Clip { lo: -1.0, hi: 1.5 }]),
        1 => Just(vec![PostOpDesc::Act(Activation::Sigmoid)]),
        1 => Just(vec![PostOpDesc::Relu, PostOpDesc::Act(Activation::Tanh)]),
    ]
}

/// The largest total of pads that leaves an output of at least 1 along an axis.
fn max_pads(input: usize, k: usize, s: usize, d: usize, op: usize) -> usize {
    (input - 1) * s + d * (k - 1) + op
}

prop_compose! {
    /// A valid key: groups 1 or depthwise, every attribute within the ranges above, pads cut
    /// down to what leaves an output.
    fn desc()(
        n in 1..=2usize,
        depthwise in any::<bool>(),
        (ic, oc) in (1..=9usize, 1..=9usize),
        (ih, iw) in (1..=6usize, 1..=6usize),
        (kh, kw) in (1..=4usize, 1..=4usize),
        strides in (1..=3usize, 1..=3usize),
        dilations in (1..=2usize, 1..=2usize),
        pads in (0..=3usize, 0..=3usize, 0..=3usize, 0..=3usize),
        op in (0..3usize, 0..3usize),
        bias in any::<bool>(),
        post_ops in post_ops(),
    ) -> ConvTransposeDesc {
        let strides = [strides.0, strides.1];
        let dilations = [dilations.0, dilations.1];
        let op = [
            op.0 % strides[0].max(dilations[0]),
            op.1 % strides[1].max(dilations[1]),
        ];
        let fit = |input, k, axis: usize, (b, e): (usize, usize)| {
            let most = max_pads(input, k, strides[axis], dilations[axis], op[axis]);
            let b = b.min(most);
            (b, e.min(most - b))
        };
        let (top, bottom) = fit(ih, kh, 0, (pads.0, pads.2));
        let (left, right) = fit(iw, kw, 1, (pads.1, pads.3));
        let oc = if depthwise { ic } else { oc };
        ConvTransposeDesc {
            mb: n,
            ic,
            ih,
            iw,
            oc,
            kh,
            kw,
            strides,
            dilations,
            pads: Pads { top, left, bottom, right },
            output_padding: op,
            // Depthwise needs two channels at least to be other than groups 1.
            groups: if depthwise && ic > 1 { ic } else { 1 },
            bias,
            post_ops,
            runtime: RuntimeDims::NONE,
            isa: Isa::X128,
        }
    }
}

prop_compose! {
    /// A key of one tap per output pixel (`ConvTransposeDesc::one_tap_per_pixel`) at a tier
    /// the host runs: whole blocks of input channels, output channels over one to three tiles
    /// of four blocks (a partial last one, and at the wide tiers a tail vector), widths of
    /// under one wide tile to several and a rest.
    fn one_tap_desc()(
        n in 1..=2usize,
        ic in prop::sample::select(&[4usize, 8, 12, 20, 32][..]),
        oc in 1..=40usize,
        (ih, iw) in (1..=4usize, prop_oneof![1..=8usize, 9..=60usize]),
        (sh, sw) in (1..=3usize, 1..=3usize),
        bias in any::<bool>(),
        post_ops in post_ops(),
        isa in prop::sample::select(common::host_tiers()),
    ) -> ConvTransposeDesc {
        ConvTransposeDesc {
            mb: n,
            ic,
            ih,
            iw,
            oc,
            kh: sh,
            kw: sw,
            strides: [sh, sw],
            bias,
            post_ops,
            ..base()
        }
        .at_tier(isa)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(192))]

    #[test]
    fn fixed_conv_transposes_match_the_reference(d in desc(), seed in any::<u64>()) {
        let key = PrimitiveKey::ConvTranspose(d.clone());
        key.validate().unwrap();
        let mut rng = Rng(seed);
        let problem = Problem::new(&d, &mut rng);
        let x = rng.tensor(d.src_shape().to_vec());
        let got = run(&compile(&key), &x, &problem.packed, None, d.dst_shape())?;
        check(&d, &x, &problem, &got)?;
    }

    /// One kernel whose input extents are runtime values, called at several extents: the
    /// exact key's bits at each, and so the reference's result within the bound.
    #[test]
    fn runtime_conv_transposes_match_exact_keys(
        d in desc(),
        rt in prop::sample::select(vec![(true, false), (false, true), (true, true)]),
        calls in prop::collection::vec((1..=8usize, 1..=8usize), 1..=3),
        seed in any::<u64>(),
    ) {
        let runtime = RuntimeDims { h: rt.0, w: rt.1 };
        let rt_desc = d.clone().with_runtime(runtime);
        let key = PrimitiveKey::ConvTranspose(rt_desc.clone());
        key.validate().unwrap();
        let p = compile(&key);
        let mut rng = Rng(seed);
        let problem = Problem::new(&d, &mut rng);
        for (h, w) in calls {
            let at = rt_desc.at([h, w]);
            // Pads that empty the output at this extent make no valid call.
            if PrimitiveKey::ConvTranspose(at.clone()).validate().is_err() {
                prop_assert!(at.oh() == 0 || at.ow() == 0);
                continue;
            }
            let x = rng.tensor(at.src_shape().to_vec());
            let got = run(&p, &x, &problem.packed, Some([h, w]), at.dst_shape())?;
            let exact = compile(&PrimitiveKey::ConvTranspose(at.clone()));
            let want = run(&exact, &x, &problem.packed, None, at.dst_shape())?;
            let same = got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
            prop_assert!(same, "{} at {h}x{w} differs from {}", key, exact.key());
            check(&at, &x, &problem, &got)?;
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// At a wide tier each column phase runs the direct convolution's wide tile: the x128
    /// kernel's bits, fixed and at runtime extents, and the reference within the bound.
    #[test]
    fn one_tap_conv_transposes_match_their_x128_kernels(
        d in one_tap_desc(),
        calls in prop::collection::vec((1..=4usize, 1..=40usize), 1..=2),
        seed in any::<u64>(),
    ) {
        let key = PrimitiveKey::ConvTranspose(d.clone());
        key.validate().unwrap();
        prop_assert_eq!(d.tier_for(d.isa), d.isa);
        let mut rng = Rng(seed);
        let problem = Problem::new(&d, &mut rng);
        let narrow = |d: &ConvTransposeDesc| ConvTransposeDesc { isa: Isa::X128, ..d.clone() };
        let x = rng.tensor(d.src_shape().to_vec());
        let got = run(&compile(&key), &x, &problem.packed, None, d.dst_shape())?;
        let x128 = compile(&PrimitiveKey::ConvTranspose(narrow(&d)));
        let want = run(&x128, &x, &problem.packed, None, d.dst_shape())?;
        let same = got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
        prop_assert!(same, "{} differs from its x128 kernel", key);
        check(&d, &x, &problem, &got)?;
        let runtime = d.clone().with_runtime(RuntimeDims { h: true, w: true });
        let p = compile(&PrimitiveKey::ConvTranspose(runtime.clone()));
        for (h, w) in calls {
            let at = runtime.at([h, w]);
            let x = rng.tensor(at.src_shape().to_vec());
            let got = run(&p, &x, &problem.packed, Some([h, w]), at.dst_shape())?;
            let x128 = compile(&PrimitiveKey::ConvTranspose(narrow(&at)));
            let want = run(&x128, &x, &problem.packed, None, at.dst_shape())?;
            let same = got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
            prop_assert!(same, "{} at {h}x{w} differs from its x128 kernel", p.key());
        }
    }
}

/// The wide tiers take the kernels of one tap per output pixel with whole blocks of input
/// channels, and name it in the one-liner; the others stay x128, and a key that claims a wide
/// tier for them is refused.
#[test]
fn only_one_tap_kernels_take_a_wide_tier() {
    let b = ConvTransposeDesc { ic: 16, ..base() };
    for isa in [Isa::Avx2, Isa::Avx512] {
        let wide = b.clone().at_tier(isa);
        assert_eq!(wide.isa, isa);
        assert!(
            PrimitiveKey::ConvTranspose(wide)
                .to_string()
                .contains(&format!("isa:{isa}"))
        );
    }
    for other in [
        ConvTransposeDesc { ic: 6, ..b.clone() },
        ConvTransposeDesc { kh: 3, ..b.clone() },
        ConvTransposeDesc {
            pads: Pads::uniform(1),
            kh: 4,
            kw: 4,
            ..b.clone()
        },
        ConvTransposeDesc {
            output_padding: [1, 0],
            ..b.clone()
        },
        ConvTransposeDesc {
            dilations: [1, 2],
            ..b.clone()
        },
        ConvTransposeDesc {
            groups: 16,
            oc: 16,
            ..b.clone()
        },
    ] {
        assert_eq!(other.tier_for(Isa::Avx2), Isa::X128, "{other:?}");
        let key = PrimitiveKey::ConvTranspose(ConvTransposeDesc {
            isa: Isa::Avx2,
            ..other
        });
        let err = key.validate().unwrap_err();
        assert!(
            err.reason
                .contains("does not cover this transposed convolution"),
            "{err}"
        );
    }
}

fn base() -> ConvTransposeDesc {
    ConvTransposeDesc {
        mb: 1,
        ic: 8,
        ih: 5,
        iw: 7,
        oc: 4,
        kh: 2,
        kw: 2,
        strides: [2, 2],
        dilations: [1, 1],
        pads: Pads::default(),
        output_padding: [0, 0],
        groups: 1,
        bias: true,
        post_ops: Vec::new(),
        runtime: RuntimeDims::NONE,
        isa: Isa::X128,
    }
}

#[test]
fn keys_print_as_deconvolutions() {
    let d = base();
    assert_eq!(
        PrimitiveKey::ConvTranspose(d.clone()).to_string(),
        "deconv mb1ic8ih5iw7oc4oh10ow14kh2kw2sh2sw2ph0pw0 bias nChw4c"
    );
    let rt = d.clone().with_runtime(RuntimeDims { h: true, w: true });
    assert_eq!(
        PrimitiveKey::ConvTranspose(rt.clone()).to_string(),
        "deconv mb1ic8ih*iw*oc4oh*ow*kh2kw2sh2sw2ph0pw0 bias nChw4c"
    );
    assert_eq!(
        PrimitiveKey::ConvTranspose(rt).isa(),
        primjit_codegen::Isa::X128
    );
    let odd = ConvTransposeDesc {
        ic: 4,
        groups: 4,
        kh: 3,
        kw: 3,
        pads: Pads {
            top: 1,
            left: 1,
            bottom: 0,
            right: 1,
        },
        output_padding: [1, 0],
        bias: false,
        ..d
    };
    assert_eq!(
        PrimitiveKey::ConvTranspose(odd).to_string(),
        "deconv mb1g4ic4ih5iw7oc4oh11ow13kh3kw3sh2sw2ph1pw1 pads:0x1 opad1x0 nChw4c"
    );
}

#[test]
fn invalid_conv_transpose_keys_are_refused() {
    let b = base();
    for (d, reason) in [
        (
            ConvTransposeDesc {
                groups: 2,
                ..b.clone()
            },
            "supports groups 1 and depthwise",
        ),
        (
            ConvTransposeDesc {
                output_padding: [2, 0],
                ..b.clone()
            },
            "output_padding [2, 0] must be less than the stride",
        ),
        (
            ConvTransposeDesc {
                ih: 1,
                kh: 1,
                strides: [1, 1],
                output_padding: [0, 0],
                pads: Pads::uniform(1),
                ..b.clone()
            },
            "the output would be empty",
        ),
        (
            ConvTransposeDesc {
                strides: [0, 2],
                ..b.clone()
            },
            "strides must be at least 1",
        ),
        (
            ConvTransposeDesc { iw: 0, ..b.clone() },
            "extents must be at least 1",
        ),
    ] {
        let err = PrimitiveKey::ConvTranspose(d).validate().unwrap_err();
        assert!(err.reason.contains(reason), "{err}");
    }
}

/// `ir/examples/conv_transpose.ir` (strides, pads, output padding, dilations and a depthwise
/// one over symbolic extents) through the graph executor against the reference, at fixed
/// shapes and with one runtime-shape graph at several sizes: within 1e-5 of each output's
/// largest magnitude.
#[test]
fn the_conv_transpose_example_runs_as_the_reference_does() {
    use primjit_runtime::{CompiledGraph, ShapeMode, Workspace};
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../ir/examples/conv_transpose.ir"
    );
    let graph = primjit_ir::parse(&std::fs::read_to_string(path).unwrap()).unwrap();
    let params = primjit_ir::Params::random(&graph, 5);
    let bindings = primjit_ir::parse_bindings("H=3,W=4").unwrap();
    let keys = primjit_runtime::node_keys_in(
        &graph,
        &bindings,
        ShapeMode::Runtime,
        primjit_codegen::ConvAlgoChoice::Direct,
        primjit_codegen::Isa::X128,
    )
    .unwrap();
    assert!(
        keys.iter()
            .all(|(_, k)| matches!(k, PrimitiveKey::ConvTranspose(_)) && k.runtime_dims().any()),
        "every transposed convolution of a symbolic input leaves it to run time"
    );
    for mode in [ShapeMode::Exact, ShapeMode::Runtime] {
        let compiled = CompiledGraph::new(&graph, &params).unwrap().with_mode(mode);
        for (h, w) in [(1, 1), (3, 4), (5, 2)] {
            let x = Rng((h * 16 + w) as u64).tensor(vec![1, 3, h, w]);
            let want = primjit_reference::run_graph(&graph, &params, &[("x", &x)]).unwrap();
            let (got, _) = compiled
                .run(engine(), &[("x", &x)], &mut Workspace::new())
                .unwrap();
            assert_eq!(want.len(), got.len());
            for ((name, want), (_, got)) in want.iter().zip(&got) {
                assert_eq!(want.shape, got.shape, "{name}");
                let scale = want.data.iter().fold(0f32, |m, v| m.max(v.abs()));
                for (i, (g, r)) in got.data.iter().zip(&want.data).enumerate() {
                    assert!(
                        (g - r).abs() <= 1e-5 * scale,
                        "{h}x{w} {mode:?} {name}: element {i}: jit {g}, reference {r}"
                    );
                }
            }
        }
    }
}

/// The example compiled for each of the host's tiers, on an engine capped there, gives the
/// same bits: its one-tap-per-pixel kernel (`%up2`) takes the tier, the others stay x128.
#[test]
fn every_tier_runs_the_same_x128_kernels() {
    use primjit_codegen::Isa;
    use primjit_runtime::{CompiledGraph, Engine, EngineConfig, Workspace};
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../ir/examples/conv_transpose.ir"
    );
    let graph = primjit_ir::parse(&std::fs::read_to_string(path).unwrap()).unwrap();
    let params = primjit_ir::Params::random(&graph, 9);
    let x = Rng(3).tensor(vec![1, 3, 4, 5]);
    let mut first: Option<Vec<Vec<u32>>> = None;
    for isa in common::host_tiers() {
        let engine = Engine::new(EngineConfig {
            threads: 1,
            max_isa: Some(isa),
            ..EngineConfig::default()
        })
        .unwrap();
        let compiled =
            CompiledGraph::with_target(&graph, &params, primjit_codegen::ConvAlgoChoice::Auto, isa)
                .unwrap();
        let (got, stats) = compiled
            .run(&engine, &[("x", &x)], &mut Workspace::new())
            .unwrap();
        for n in &stats.nodes {
            let want = if n.name == "up2" { isa } else { Isa::X128 };
            assert_eq!(n.primitive.key().isa(), want, "{} at {isa}", n.name);
        }
        let bits: Vec<Vec<u32>> = got
            .iter()
            .map(|(_, t)| t.data.iter().map(|v| v.to_bits()).collect())
            .collect();
        match &first {
            None => first = Some(bits),
            Some(f) => assert_eq!(*f, bits, "{isa} differs from x128"),
        }
    }
}
