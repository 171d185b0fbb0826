//! IEEE semantics, as onnxruntime has them: NaN in, NaN out through relu, clip, max and average
//! pooling (standalone and fused into a conv), global pooling, every post-op and both
//! convolution algorithms, and infinities as IEEE arithmetic makes them; checked against the
//! reference interpreter on inputs sprinkled with NaN and ±Inf, and end to end on the trunk.
//!
//! Winograd's transforms mix a tile's pixels with coefficients of 0 too, and `NaN * 0` and
//! `Inf - Inf` are NaN: a non-finite input makes every output of the tiles whose input patch
//! holds it NaN, where a direct convolution's outputs beside its window stay finite or
//! infinite. The Winograd checks allow that, and only that: NaN where the reference has a
//! non-finite value, or a finite one next to a non-finite input.
//!
//! The convolutions between graph ops have any channel count: a conv's output block of fewer
//! real channels computes its padding lanes with zero weights, and `Inf * 0` is NaN there
//! until the conv stores +0 over it; the next conv multiplies those lanes by zero weights
//! again, so a NaN left there would reach channels where the reference has none.

use primjit_codegen::{ConvAlgo, ConvAlgoChoice, PrimitiveKey};
use primjit_ir::{Params, Tensor, parse};
use primjit_runtime::{CompiledGraph, Engine, EngineConfig, Streaming, Workspace};
use proptest::prelude::*;

fn engine() -> Engine {
    Engine::new(EngineConfig {
        threads: 1,
        ..EngineConfig::default()
    })
    .expect("engine")
}

/// Values in [-2, 2], with about one in ten NaN and one in ten ±Inf.
fn value() -> impl Strategy<Value = f32> {
    prop_oneof![
        16 => -2.0f32..2.0,
        2 => Just(f32::NAN),
        1 => Just(f32::INFINITY),
        1 => Just(f32::NEG_INFINITY),
    ]
}

/// An NCHW tensor of `[1, c, h, w]` for `c`, `h`, `w` in the ranges given, with NaN and ±Inf.
fn tensor(
    c: std::ops::RangeInclusive<usize>,
    h: std::ops::RangeInclusive<usize>,
    w: std::ops::RangeInclusive<usize>,
) -> impl Strategy<Value = Tensor> {
    (c, h, w).prop_flat_map(|(c, h, w)| {
        proptest::collection::vec(value(), c * h * w).prop_map(move |data| Tensor {
            shape: vec![1, c, h, w],
            data,
        })
    })
}

/// Runs `text` (input `%x`, one output) on `x` with `algo`'s convolutions, and the reference;
/// returns both outputs and the primitive keys the run used.
fn run_both(text: &str, x: &Tensor, algo: ConvAlgoChoice) -> (Tensor, Tensor, Vec<PrimitiveKey>) {
    let graph = parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let params = Params::random(&graph, 5);
    let want = primjit_reference::run_graph(&graph, &params, &[("x", x)])
        .unwrap_or_else(|e| panic!("reference: {e}\n{text}"))
        .remove(0)
        .1;
    let model = CompiledGraph::with_conv_algo(&graph, &params, algo)
        .unwrap_or_else(|e| panic!("{e}\n{text}"))
        .with_streaming(Streaming::OFF);
    let (mut outputs, stats) = model
        .run(&engine(), &[("x", x)], &mut Workspace::new())
        .unwrap_or_else(|e| panic!("run: {e}\n{text}"));
    let keys = stats
        .nodes
        .iter()
        .map(|n| n.primitive.key().clone())
        .collect();
    (outputs.remove(0).1, want, keys)
}

/// Compares NaN-aware: NaN exactly where the reference has NaN, the same infinity where it
/// has one, and finite values within `1e-4 * max(1, max |finite reference|)`.
fn assert_ieee_equal(got: &Tensor, want: &Tensor, what: &str) -> Result<(), TestCaseError> {
    prop_assert_eq!(&got.shape, &want.shape, "{}", what);
    let scale = want
        .data
        .iter()
        .filter(|v| v.is_finite())
        .fold(1.0f32, |m, v| m.max(v.abs()));
    for (i, (&g, &r)) in got.data.iter().zip(&want.data).enumerate() {
        let ok = if r.is_nan() {
            g.is_nan()
        } else if r.is_infinite() {
            g == r
        } else {
            g.is_finite() && (g - r).abs() <= 1e-4 * scale
        };
        prop_assert!(ok, "{}: output {}: jit {}, reference {}", what, i, g, r);
    }
    Ok(())
}

/// The Winograd form of [`assert_ieee_equal`]: where the reference is non-finite the output
/// is too (an infinity may come out NaN); where the output is finite it equals the
/// reference's; and where it is NaN with the reference finite, a non-finite input lies in the
/// input patch of its tile (`near_non_finite`).
fn assert_winograd_ieee(
    got: &Tensor,
    want: &Tensor,
    near_non_finite: impl Fn(usize, usize) -> bool,
    what: &str,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(&got.shape, &want.shape, "{}", what);
    let [_, _, oh, ow] = [got.shape[0], got.shape[1], got.shape[2], got.shape[3]];
    let scale = want
        .data
        .iter()
        .filter(|v| v.is_finite())
        .fold(1.0f32, |m, v| m.max(v.abs()));
    for (i, (&g, &r)) in got.data.iter().zip(&want.data).enumerate() {
        let (y, x) = ((i / ow) % oh, i % ow);
        let ok = if r.is_nan() {
            g.is_nan()
        } else if r.is_infinite() {
            g == r || g.is_nan()
        } else if g.is_finite() {
            (g - r).abs() <= 1e-4 * scale
        } else {
            g.is_nan() && near_non_finite(y, x)
        };
        prop_assert!(
            ok,
            "{}: output {} ({}, {}): jit {}, reference {}",
            what,
            i,
            y,
            x,
            g,
            r
        );
    }
    Ok(())
}

/// Whether `x` holds a non-finite value in any channel within the rows and columns given
/// (clamped to the tensor).
fn non_finite_within(x: &Tensor, rows: (isize, isize), cols: (isize, isize)) -> bool {
    let [c, h, w] = [x.shape[1], x.shape[2], x.shape[3]];
    let clamp = |(a, b): (isize, isize), n: usize| (a.max(0) as usize, (b.min(n as isize - 1)));
    let ((r0, r1), (c0, c1)) = (clamp(rows, h), clamp(cols, w));
    (0..c).any(|ch| {
        (r0 as isize..=r1).any(|y| {
            (c0 as isize..=c1)
                .any(|xx| !x.data[(ch * h + y as usize) * w + xx as usize].is_finite())
        })
    })
}

/// The post-op lists the convolutions are tested with (`add(%a)` at stride 1 only).
const POSTS: [&[&str]; 11] = [
    &[],
    &["relu"],
    &["clip(-0.5, 0.5)"],
    &["add(%a)"],
    &["add(%a)", "relu"],
    &["silu"],
    &["sigmoid", "relu"],
    &["tanh"],
    &["hardswish", "add(%a)"],
    &["leakyrelu(alpha=0.1)", "exp"],
    &["hardsigmoid(alpha=0.3, beta=0.4)", "elu(alpha=0.5)"],
];

/// The post-ops of `POSTS[i]` that a conv of stride `s` can take: a residual needs stride 1.
fn posts(i: usize, s: usize) -> Vec<&'static str> {
    match POSTS[i] {
        p if s > 1 && p.iter().any(|o| o.starts_with("add")) => Vec::new(),
        p => p.to_vec(),
    }
}

/// A 1x1 conv (so that the 3x3 conv reads `nChw4c`, which Winograd needs) and a 3x3 conv of
/// stride `s` with a bias and `posts`, on an input of `[1, c, h, w]`.
fn conv_graph(x: &Tensor, k: usize, s: usize, posts: &[&str]) -> String {
    let [c, h, w] = [x.shape[1], x.shape[2], x.shape[3]];
    let post = match posts {
        [] => String::new(),
        p => format!(", post=[{}]", p.join(", ")),
    };
    format!(
        "graph g {{
  input %x: f32[1, {c}, {h}, {w}]
  param @w1: f32[{k}, {c}, 1, 1]
  param @w3: f32[{k}, {k}, 3, 3]
  param @b3: f32[{k}]
  %a = conv2d(%x, @w1)
  %b = conv2d(%a, @w3, bias=@b3, strides=[{s}, {s}], pads=[1, 1, 1, 1]{post})
  output y = %b
}}
"
    )
}

fn wino(key: &PrimitiveKey) -> bool {
    matches!(key, PrimitiveKey::Conv(d) if d.algo == ConvAlgo::WinogradF4x3)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// relu alone (vector body and scalar tail), max pooling and average pooling alone, and
    /// global max and average pooling, on NCHW inputs.
    #[test]
    fn standalone_ops_propagate_nan_and_inf(
        x in tensor(1..=6, 1..=9, 1..=13),
        k in 1usize..=3,
        s in 1usize..=2,
        pad in 0usize..=1,
        ceil in any::<bool>(),
        include_pad in any::<bool>(),
    ) {
        let [c, h, w] = [x.shape[1], x.shape[2], x.shape[3]];
        let header = format!("graph g {{\n  input %x: f32[1, {c}, {h}, {w}]\n");
        let pad = if k > pad { pad } else { 0 };
        let window = format!(
            "kernel=[{k}, {k}], strides=[{s}, {s}], pads=[{pad}, {pad}, {pad}, {pad}], ceil_mode={ceil}"
        );
        let mut ops = vec![
            "relu(%x)".to_string(),
            "global_maxpool(%x)".to_string(),
            "global_avgpool(%x)".to_string(),
        ];
        if h + 2 * pad >= k && w + 2 * pad >= k {
            ops.push(format!("maxpool2d(%x, {window})"));
            ops.push(format!("avgpool2d(%x, {window}, count_include_pad={include_pad})"));
        }
        for op in ops {
            let text = format!("{header}  %y = {op}\n  output y = %y\n}}\n");
            let (got, want, _) = run_both(&text, &x, ConvAlgoChoice::Direct);
            assert_ieee_equal(&got, &want, &text)?;
        }
    }

    /// Direct convolutions, dense, grouped (groups of any width, whose vectors may span
    /// groups) and depthwise, with every post-op, a fused max pool, and global pools of their
    /// (`nChw4c`) output. A grouped conv's NaN stays in its group, a depthwise one's in its
    /// channel.
    #[test]
    fn direct_convolutions_propagate_nan_and_inf(
        x in tensor(1..=6, 2..=8, 2..=11),
        k in 1usize..=9,
        s in 1usize..=2,
        post in 0usize..POSTS.len(),
        group_pick in any::<prop::sample::Index>(),
    ) {
        let posts = posts(post, s);
        // Groups: one of `k`'s divisors, 1 (dense) and `k` (depthwise) included.
        let divisors: Vec<usize> = (1..=k).filter(|g| k % g == 0).collect();
        let groups = divisors[group_pick.index(divisors.len())];
        let conv_graph = |x: &Tensor, k, s, posts: &[&str]| {
            let text = conv_graph(x, k, s, posts);
            if groups > 1 {
                let icg = k / groups;
                text.replace(&format!("f32[{k}, {k}, 3, 3]"), &format!("f32[{k}, {icg}, 3, 3]"))
                    .replace("pads=[1, 1, 1, 1]", &format!("pads=[1, 1, 1, 1], groups={groups}"))
            } else {
                text
            }
        };
        let text = conv_graph(&x, k, s, &posts);
        let (got, want, keys) = run_both(&text, &x, ConvAlgoChoice::Direct);
        prop_assert!(!keys.iter().any(wino));
        assert_ieee_equal(&got, &want, &text)?;

        let mut pool = posts.clone();
        pool.push("maxpool(kernel=[2, 2], strides=[2, 2])");
        let pooled = conv_graph(&x, k, s, &pool);
        // The conv's output is at least 2x2; a fused pool cannot follow a residual add.
        let fusable = !posts.iter().any(|p| p.starts_with("add"));
        if fusable && x.shape[2].div_ceil(s) >= 2 && x.shape[3].div_ceil(s) >= 2 {
            let (got, want, keys) = run_both(&pooled, &x, ConvAlgoChoice::Direct);
            prop_assert_eq!(keys.len(), 2, "the pool is fused: {:?}", keys);
            assert_ieee_equal(&got, &want, &pooled)?;
        }
        for pool in ["global_maxpool", "global_avgpool"] {
            let global = text.replace(
                "  output y = %b",
                &format!("  %g = {pool}(%b)\n  output y = %g"),
            );
            let (got, want, _) = run_both(&global, &x, ConvAlgoChoice::Direct);
            assert_ieee_equal(&got, &want, &global)?;
        }
    }

    /// Winograd convolutions (stride 1, and 2 in polyphase form) with every post-op.
    #[test]
    fn winograd_convolutions_propagate_nan_and_inf(
        x in tensor(1..=6, 2..=10, 2..=13),
        k in 1usize..=9,
        s in 1usize..=2,
        post in 0usize..POSTS.len(),
    ) {
        let text = conv_graph(&x, k, s, &posts(post, s));
        let (got, want, keys) = run_both(&text, &x, ConvAlgoChoice::Winograd);
        prop_assert!(keys.iter().any(wino), "{:?}", keys);
        // Output (y, x) of stride `s` lies in the tile of 4x4 outputs from (y/4*4, x/4*4),
        // whose input patch spans input rows s*y0 - 1 to s*(y0 + 3) + 1 (3x3, padding 1).
        let s = s as isize;
        let near = |y: usize, xx: usize| {
            let (y0, x0) = ((y / 4 * 4) as isize, (xx / 4 * 4) as isize);
            non_finite_within(
                &x,
                (s * y0 - 1, s * (y0 + 3) + 1),
                (s * x0 - 1, s * (x0 + 3) + 1),
            )
        };
        assert_winograd_ieee(&got, &want, near, &text)?;
    }
}

/// The trunk (`ir/resnet34_trunk.ir`, random parameters) at W=64: one NaN pixel gives NaN in
/// the outputs it reaches, as the reference computes them (with direct convolutions, exactly
/// those; with Winograd's, at least those); an all-Inf input gives no finite output.
#[test]
fn a_nan_pixel_reaches_the_trunk_outputs_it_reaches_in_the_reference() {
    let text = include_str!("../../../ir/resnet34_trunk.ir");
    let graph = parse(text).expect("the trunk parses");
    let params = Params::random(&graph, 1);
    let (h, w) = (320, 64);
    let mut x = primjit_ir::random_tensor(2, "x", vec![1, 3, h, w], -1.0, 1.0);
    // A pixel of the second channel, near the top left corner.
    x.data[h * w + 3 * w + 5] = f32::NAN;
    let want = primjit_reference::run_graph(&graph, &params, &[("x", &x)])
        .expect("the reference runs")
        .remove(0)
        .1;
    let nan_reference = want.data.iter().filter(|v| v.is_nan()).count();
    // Its receptive field at the trunk's end spans hundreds of pixels: onnxruntime gives every
    // output of the trunk NaN at W=1031.
    assert!(nan_reference > 0, "no reference output is NaN");
    let engine = engine();
    for algo in [ConvAlgoChoice::Direct, ConvAlgoChoice::Auto] {
        let model = CompiledGraph::with_conv_algo(&graph, &params, algo).expect("prepares");
        let (out, _) = model
            .run(&engine, &[("x", &x)], &mut Workspace::new())
            .expect("runs");
        let got = &out[0].1;
        assert_eq!(got.shape, want.shape);
        for (i, (g, r)) in got.data.iter().zip(&want.data).enumerate() {
            match algo {
                ConvAlgoChoice::Direct => {
                    assert_eq!(g.is_nan(), r.is_nan(), "{algo:?}: output {i}: {g} vs {r}")
                }
                _ => assert!(
                    !r.is_nan() || g.is_nan(),
                    "{algo:?}: output {i}: {g} vs {r}"
                ),
            }
        }

        let inf = Tensor {
            shape: x.shape.clone(),
            data: vec![f32::INFINITY; x.data.len()],
        };
        let (out, _) = model
            .run(&engine, &[("x", &inf)], &mut Workspace::new())
            .expect("runs");
        assert!(
            out[0].1.data.iter().all(|v| !v.is_finite()),
            "{algo:?}: an all-Inf input gave finite outputs"
        );
    }
}
