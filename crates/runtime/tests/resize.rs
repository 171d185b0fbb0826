//! The resize kernel against the reference interpreter on nChw4c buffers that end at a guard
//! page: nearest (every rounding mode) and linear, every coordinate mode, upsampling and
//! downsampling, to sizes and by whole and fractional scale factors (which map coordinates
//! by the factor), one-pixel images, channels that do not fill their last block, and keys
//! whose input extents are left to run time, called at several extents.
//!
//! Every problem runs on one thread and on pools of two and three threads, which must agree
//! to the bit; destinations start as a NaN sentinel, so an element left unwritten fails.
//!
//! # Tolerances
//!
//! Nearest copies: results equal the reference's to the bit (NaN and infinities included).
//! Linear blends round a few times in f32 where the reference rounds once: each result is
//! within `8 * 2^-24 * max |x|` of the reference, `x` over the four pixels blended (bounded
//! here by the tensor's largest magnitude).

mod common;
use common::engine;

use std::sync::Arc;

use primjit_codegen::key::RuntimeDims;
use primjit_codegen::{
    CallExtents, CoordMode, NearestMode, PrimitiveKey, ResizeDesc, ResizeMode, ResizeOut,
    ScaleFactor,
};
use primjit_reference::Tensor;
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
    fn next_u64(&mut self) -> u64 {
        common::splitmix64(&mut self.0)
    }

    /// Uniform in `[-4, 4)`, or (with `special`) sometimes NaN, an infinity or a zero.
    fn value(&mut self, special: bool) -> f32 {
        let r = self.next_u64();
        if special && r.is_multiple_of(7) {
            return [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0][(r >> 8) as usize % 4];
        }
        (r >> 40) as f32 / (1u64 << 24) as f32 * 8.0 - 4.0
    }

    fn tensor(&mut self, shape: [usize; 4], special: bool) -> Tensor {
        Tensor {
            shape: shape.to_vec(),
            data: (0..shape.iter().product())
                .map(|_| self.value(special))
                .collect(),
        }
    }
}

/// Runs `p` on `x` ([`common::run_blocked`]).
fn run(
    p: &Primitive,
    x: &Tensor,
    extents: Option<CallExtents>,
    dst_shape: [usize; 4],
) -> Result<Vec<f32>, TestCaseError> {
    common::run_blocked(p, x, None, extents, dst_shape)
}

fn mode() -> impl Strategy<Value = ResizeMode> {
    prop_oneof![
        Just(ResizeMode::Linear),
        prop::sample::select(NearestMode::ALL.to_vec()).prop_map(ResizeMode::Nearest),
    ]
}

fn coord() -> impl Strategy<Value = CoordMode> {
    prop::sample::select(CoordMode::ALL.to_vec())
}

/// A scale factor: whole from 1 to 3, or a fraction n / 2^k below and above 1.
fn factor() -> impl Strategy<Value = ScaleFactor> {
    prop_oneof![
        (1..=3u64).prop_map(ScaleFactor::whole),
        prop::sample::select(vec![
            (1u64, 4u64),
            (1, 2),
            (3, 4),
            (3, 2),
            (5, 2),
            (3, 8),
            (7, 4)
        ])
        .prop_map(|(n, d)| ScaleFactor::new(n, d).expect("a supported fraction")),
    ]
}

fn scale_of(out: ResizeOut) -> Option<[ScaleFactor; 2]> {
    match out {
        ResizeOut::Scale(f) => Some(f),
        ResizeOut::Sizes(_) => None,
    }
}

/// Checks the kernel's result against the reference (see the module documentation).
fn check(
    key: &PrimitiveKey,
    mode: ResizeMode,
    x: &Tensor,
    got: &[f32],
    coord: CoordMode,
    out: [usize; 2],
) -> Result<(), TestCaseError> {
    let PrimitiveKey::Resize(d) = key else {
        unreachable!("a resize key");
    };
    let want = primjit_reference::resize(x, mode, coord, out, scale_of(d.out));
    prop_assert_eq!(got.len(), want.data.len());
    let largest = x.data.iter().fold(0f32, |m, v| m.max(v.abs()));
    for (i, (&g, &w)) in got.iter().zip(&want.data).enumerate() {
        let ok = match mode {
            ResizeMode::Nearest(_) => g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
            ResizeMode::Linear => (g - w).abs() <= 8.0 * f32::EPSILON / 2.0 * largest,
        };
        prop_assert!(ok, "{key}: element {i} is {g}, the reference {w}");
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(192))]

    #[test]
    fn fixed_resizes_match_the_reference(
        mode in mode(),
        coord in coord(),
        (n, c) in (1..=2usize, 1..=9usize),
        (ih, iw) in (1..=7usize, 1..=7usize),
        sizes in any::<bool>(),
        (oh, ow) in (1..=11usize, 1..=11usize),
        (sh, sw) in (factor(), factor()),
        seed in any::<u64>(),
    ) {
        let out = if sizes { ResizeOut::Sizes([oh, ow]) } else { ResizeOut::Scale([sh, sw]) };
        let d = ResizeDesc { mb: n, c, ih, iw, out, mode, coord, runtime: RuntimeDims::NONE };
        // A factor below 1 may leave no pixel, which validation refuses (tested below).
        prop_assume!(d.oh() > 0 && d.ow() > 0);
        let dst = d.dst_shape();
        let key = PrimitiveKey::Resize(d.clone());
        key.validate().unwrap();
        let x = Rng(seed).tensor([n, c, ih, iw], matches!(mode, ResizeMode::Nearest(_)));
        let got = run(&compile(&key), &x, None, dst)?;
        check(&key, mode, &x, &got, coord, [dst[2], dst[3]])?;
    }

    /// One kernel whose extents are runtime values, called at several extents: by scale
    /// factors its input's, to sizes its input's and output's (each call's own, the one
    /// larger or smaller than the other).
    #[test]
    fn runtime_resizes_match_the_reference(
        mode in mode(),
        coord in coord(),
        c in 1..=6usize,
        sizes in any::<bool>(),
        (sh, sw) in (factor(), factor()),
        rt in prop::sample::select(vec![(true, false), (false, true), (true, true)]),
        fixed in (1..=5usize, 1..=5usize, 1..=11usize, 1..=11usize),
        calls in prop::collection::vec((1..=9usize, 1..=9usize, 1..=13usize, 1..=13usize), 1..=3),
        seed in any::<u64>(),
    ) {
        let runtime = RuntimeDims { h: rt.0, w: rt.1 };
        // A fixed axis whose factor below 1 leaves no pixel is refused (tested below).
        let kept = |runtime: bool, s: ScaleFactor, fixed: usize| runtime || s.apply(fixed as u64) > Some(0);
        prop_assume!(sizes || (kept(rt.0, sh, fixed.0) && kept(rt.1, sw, fixed.1)));
        let out = if sizes { ResizeOut::Sizes([fixed.2, fixed.3]) } else { ResizeOut::Scale([sh, sw]) };
        let d = ResizeDesc {
            mb: 1,
            c,
            ih: fixed.0,
            iw: fixed.1,
            out,
            mode,
            coord,
            runtime: RuntimeDims::NONE,
        }
        .with_runtime(runtime);
        let key = PrimitiveKey::Resize(d.clone());
        key.validate().unwrap();
        prop_assert!(key.to_string().contains('*'), "{key}");
        let p = compile(&key);
        let mut rng = Rng(seed);
        for (h, w, oh, ow) in calls {
            let call = CallExtents { input: [h, w], output: Some([oh, ow]) };
            let at = d.at(call);
            if at.oh() == 0 || at.ow() == 0 {
                continue;
            }
            let x = rng.tensor([1, c, at.ih, at.iw], false);
            let dst = at.dst_shape();
            let got = run(&p, &x, Some(call), dst)?;
            check(&PrimitiveKey::Resize(at), mode, &x, &got, coord, [dst[2], dst[3]])?;
        }
    }
}

#[test]
fn keys_print_their_modes_and_runtime_extents() {
    let d = ResizeDesc {
        mb: 1,
        c: 5,
        ih: 7,
        iw: 9,
        out: ResizeOut::Scale([ScaleFactor::whole(2), ScaleFactor::whole(3)]),
        mode: ResizeMode::Nearest(NearestMode::Floor),
        coord: CoordMode::Asymmetric,
        runtime: RuntimeDims::NONE,
    };
    assert_eq!(
        PrimitiveKey::Resize(d.clone()).to_string(),
        "resize_nearest:floor mb1ic5ih7iw9oh14ow27 scale2x3 asymmetric nChw4c"
    );
    let rt = d.clone().with_runtime(RuntimeDims { h: true, w: true });
    assert_eq!(
        PrimitiveKey::Resize(rt).to_string(),
        "resize_nearest:floor mb1ic5ih*iw*oh*ow* scale2x3 asymmetric nChw4c"
    );
    let fraction = ResizeDesc {
        out: ResizeOut::Scale([
            ScaleFactor::new(3, 2).unwrap(),
            ScaleFactor::new(1, 4).unwrap(),
        ]),
        ..d.clone()
    };
    assert_eq!(
        PrimitiveKey::Resize(fraction).to_string(),
        "resize_nearest:floor mb1ic5ih7iw9oh10ow2 scale1.5x0.25 asymmetric nChw4c"
    );
    let sizes = ResizeDesc {
        out: ResizeOut::Sizes([3, 4]),
        mode: ResizeMode::Linear,
        coord: CoordMode::HalfPixel,
        ..d
    };
    // Sizes leave the output's extents to run time with the input's.
    let rt = sizes
        .clone()
        .with_runtime(RuntimeDims { h: false, w: true });
    assert_eq!(
        PrimitiveKey::Resize(rt).to_string(),
        "resize_linear mb1ic5ih7iw*oh3ow* half_pixel nChw4c"
    );
    assert_eq!(
        PrimitiveKey::Resize(sizes).to_string(),
        "resize_linear mb1ic5ih7iw9oh3ow4 half_pixel nChw4c"
    );
}

#[test]
fn invalid_resize_keys_are_refused() {
    let base = ResizeDesc {
        mb: 1,
        c: 3,
        ih: 4,
        iw: 4,
        out: ResizeOut::Scale([ScaleFactor::whole(2); 2]),
        mode: ResizeMode::Linear,
        coord: CoordMode::HalfPixel,
        runtime: RuntimeDims::NONE,
    };
    let eighth = ScaleFactor::new(1, 8).unwrap();
    for (d, reason) in [
        (
            ResizeDesc {
                out: ResizeOut::Scale([ScaleFactor::whole(0), ScaleFactor::whole(2)]),
                ..base.clone()
            },
            "scale factors must be at least 1",
        ),
        (
            ResizeDesc {
                out: ResizeOut::Scale([ScaleFactor::whole(0), ScaleFactor::whole(2)]),
                runtime: RuntimeDims { h: true, w: false },
                ih: 0,
                ..base.clone()
            },
            "scale factors must be at least 1",
        ),
        (
            ResizeDesc {
                out: ResizeOut::Scale([eighth, ScaleFactor::whole(2)]),
                ..base.clone()
            },
            "output extents must be at least 1",
        ),
        (
            ResizeDesc {
                out: ResizeOut::Sizes([3, 0]),
                ..base.clone()
            },
            "output extents must be at least 1",
        ),
        (
            ResizeDesc {
                ih: 0,
                ..base.clone()
            },
            "extents must be at least 1",
        ),
        (
            ResizeDesc {
                ih: 1 << 20,
                out: ResizeOut::Scale([ScaleFactor::whole(1 << 20), ScaleFactor::whole(1)]),
                ..base.clone()
            },
            "elements",
        ),
    ] {
        let err = PrimitiveKey::Resize(d).validate().unwrap_err();
        assert!(err.reason.contains(reason), "{err}");
    }
}

/// A resize whose sizes are runtime values refuses a call without its output's extents, and
/// a key that claims runtime sizes but holds them.
#[test]
fn runtime_sizes_need_the_calls_output_extents() {
    let d = ResizeDesc {
        mb: 1,
        c: 3,
        ih: 4,
        iw: 6,
        out: ResizeOut::Sizes([8, 12]),
        mode: ResizeMode::Linear,
        coord: CoordMode::HalfPixel,
        runtime: RuntimeDims::NONE,
    };
    let held = PrimitiveKey::Resize(ResizeDesc {
        runtime: RuntimeDims { h: false, w: true },
        iw: 0,
        ..d.clone()
    });
    let err = held.validate().unwrap_err();
    assert!(err.reason.contains("must hold 0"), "{err}");
    let key = PrimitiveKey::Resize(d.with_runtime(RuntimeDims { h: false, w: true }));
    let p = compile(&key);
    let src = vec![0.0; 4 * 4 * 6];
    let mut dst = vec![0.0; 4 * 8 * 12];
    let args = primjit_runtime::ExecArgs {
        src: &src,
        weights: None,
        dst: &mut dst,
        extra: &[],
        scratch: None,
    };
    match p.execute_at(args, [4, 6]) {
        Err(primjit_runtime::ExecError::Extents { reason, .. }) => {
            assert!(reason.contains("output extents"), "{reason}")
        }
        other => panic!("{key}: expected an extents error, got {other:?}"),
    }
}

/// `ir/examples/resize.ir` (every mode, whole and fractional scale factors over a symbolic
/// downsampled extent, fixed sizes, and the input's own extents) through the graph executor against the
/// reference, at fixed shapes and with one runtime-shape graph at several sizes: within 1e-5
/// of each output's largest magnitude.
#[test]
fn the_resize_example_runs_as_the_reference_does() {
    use primjit_runtime::{CompiledGraph, ShapeMode, Workspace};
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../ir/examples/resize.ir");
    let graph = primjit_ir::parse(&std::fs::read_to_string(path).unwrap()).unwrap();
    let params = primjit_ir::Params::random(&graph, 11);
    // At runtime shapes, resizes by scale factors of symbolic extents leave them to run time,
    // and so do those to sizes where their input's or their output's extents are symbolic:
    // another value's, a symbolic map to fixed sizes, a 1x1 context to a map's; those from
    // fixed extents to fixed sizes keep fixed keys.
    let bindings = primjit_ir::parse_bindings("H=5,W=8").unwrap();
    let keys = primjit_runtime::node_keys_in(
        &graph,
        &bindings,
        ShapeMode::Runtime,
        primjit_codegen::ConvAlgoChoice::Direct,
        primjit_codegen::Isa::X128,
    )
    .unwrap();
    let runtime: Vec<&str> = keys
        .iter()
        .filter(|(_, k)| matches!(k, PrimitiveKey::Resize(_)) && k.runtime_dims().any())
        .map(|(name, _)| name.as_str())
        .collect();
    assert_eq!(
        runtime,
        [
            "up", "back", "corners", "ceil", "halves", "fraction", "spread"
        ]
    );
    for mode in [ShapeMode::Exact, ShapeMode::Runtime] {
        let compiled = CompiledGraph::new(&graph, &params).unwrap().with_mode(mode);
        for (h, w) in [(1, 1), (5, 8), (9, 3)] {
            let x = Rng((h * 16 + w) as u64).tensor([1, 3, h, w], false);
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
