//! run_graph on parsed graphs, its error paths, and the folding pass checked numerically.

use primjit_ir::{Dim, Graph, Op, Params, PoolWindow, Tensor, parse, passes, random_tensor};
use proptest::prelude::*;

use super::ReferenceError;
use crate::*;

const SMALL: &str = "graph small {
  input %x: f32[1, 2, H, W]
  param @w: f32[3, 2, 3, 3]
  param @b: f32[3]
  param @bn.scale: f32[3]
  param @bn.bias: f32[3]
  param @bn.mean: f32[3]
  param @bn.var: f32[3]
  %c = conv2d(%x, @w, bias=@b, pads=[1, 1, 1, 1])
  %n = batchnorm(%c, @bn.scale, @bn.bias, @bn.mean, @bn.var, epsilon=0.001)
  %r = relu(%n)
  %p = maxpool2d(%r, kernel=[2, 2], strides=[2, 2])
  output y = %p
  output pre = %n
}
";

fn input(h: usize, w: usize) -> Tensor {
    random_tensor(9, "x", vec![1, 2, h, w], -1., 1.)
}

/// The error's message, which must name `subject` and contain every one of `parts`.
fn assert_error(result: Result<Vec<(String, Tensor)>, ReferenceError>, parts: &[&str]) {
    let message = result.expect_err("the run must fail").to_string();
    for part in parts {
        assert!(message.contains(part), "`{part}` not in: {message}");
    }
}

#[test]
fn runs_a_parsed_graph_op_by_op() {
    let g = parse(SMALL).unwrap();
    let params = Params::random(&g, 1);
    let p = |name: &str| params.get(name).unwrap();
    for (h, w) in [(4, 6), (5, 3)] {
        let x = input(h, w);
        let out = run_graph(&g, &params, &[("x", &x)]).unwrap();
        let attrs = ConvAttrs {
            pads: Pads::uniform(1),
            ..ConvAttrs::default()
        };
        let c = conv2d(&x, p("w"), Some(p("b")), &attrs, &[]);
        let n = batchnorm(
            &c,
            p("bn.scale"),
            p("bn.bias"),
            p("bn.mean"),
            p("bn.var"),
            0.001,
        );
        let y = pool2d(
            &relu(&n),
            &PoolAttrs::max(&PoolWindow {
                strides: [2, 2],
                ..PoolWindow::new([2, 2])
            }),
        );
        assert_eq!(y.shape, [1, 3, h / 2, w / 2]);
        assert_eq!(out, [("y".to_string(), y), ("pre".to_string(), n)]);
    }
}

#[test]
fn input_errors_name_the_input() {
    let g = parse(SMALL).unwrap();
    let params = Params::random(&g, 1);
    let x = input(4, 4);
    assert_error(
        run_graph(&g, &params, &[]),
        &["%x", "no tensor was given", "[1, 2, H, W]"],
    );
    assert_error(
        run_graph(&g, &params, &[("x", &x), ("z", &x)]),
        &["%z", "no such input"],
    );
    assert_error(
        run_graph(&g, &params, &[("x", &x), ("x", &x)]),
        &["%x", "twice"],
    );
    let wrong = Tensor::zeros(vec![1, 3, 4, 4]);
    assert_error(
        run_graph(&g, &params, &[("x", &wrong)]),
        &["%x", "[1, 3, 4, 4]", "[1, 2, H, W]"],
    );
    let rank3 = Tensor::zeros(vec![2, 4, 4]);
    assert_error(
        run_graph(&g, &params, &[("x", &rank3)]),
        &["%x", "[2, 4, 4]", "[1, 2, H, W]"],
    );
    let short = Tensor {
        shape: vec![1, 2, 4, 4],
        data: vec![0.; 31],
    };
    assert_error(
        run_graph(&g, &params, &[("x", &short)]),
        &["%x", "31 elements", "[1, 2, 4, 4]", "32"],
    );
    let empty = Tensor::zeros(vec![1, 2, 4, 0]);
    assert_error(
        run_graph(&g, &params, &[("x", &empty)]),
        &["%x", "[1, 2, 4, 0]", "at least 1"],
    );
    // Shapes the input declaration allows but a window does not: a 1-wide map cannot hold
    // a 2-wide pooling window.
    let narrow = input(4, 1);
    assert_error(run_graph(&g, &params, &[("x", &narrow)]), &["%p", "width"]);
}

#[test]
fn param_errors_name_the_param() {
    let g = parse(SMALL).unwrap();
    let full = Params::random(&g, 1);
    let x = input(4, 4);
    let mut missing = Params::new();
    for (name, t) in full.iter().filter(|(n, _)| *n != "bn.var") {
        missing.insert(name, t.clone());
    }
    assert_error(
        run_graph(&g, &missing, &[("x", &x)]),
        &["@bn.var", "missing", "[3]"],
    );
    let mut wrong = full.clone();
    wrong.insert("w", Tensor::zeros(vec![3, 2, 1, 1]));
    assert_error(
        run_graph(&g, &wrong, &[("x", &x)]),
        &["@w", "[3, 2, 1, 1]", "[3, 2, 3, 3]"],
    );
    let mut short = full.clone();
    short.insert(
        "b",
        Tensor {
            shape: vec![3],
            data: vec![0.; 2],
        },
    );
    assert_error(
        run_graph(&g, &short, &[("x", &x)]),
        &["@b", "2 elements", "[3]"],
    );
}

#[test]
fn derived_params_must_be_materialized() {
    let mut g = parse(SMALL.replace("  output pre = %n\n", "").as_str()).unwrap();
    let mut params = Params::random(&g, 1);
    assert_eq!(passes::optimize(&mut g).folded_batchnorms, 1);
    let x = input(4, 4);
    assert_error(
        run_graph(&g, &params, &[("x", &x)]),
        &["@w.bnfold", "materialize"],
    );
    params.materialize(&g).unwrap();
    run_graph(&g, &params, &[("x", &x)]).unwrap();
}

#[test]
fn malformed_graphs_are_errors_not_panics() {
    let x = Tensor::zeros(vec![1, 1, 2, 2]);
    let shape = vec![Dim::Known(1), Dim::Known(1), Dim::Known(2), Dim::Known(2)];
    // A node reading a value nothing defines.
    let mut g = Graph::new("g");
    g.add_input("x", shape.clone()).unwrap();
    let ghost = g.add_value("ghost").unwrap();
    let r = g.add_node("r", Op::Relu { input: ghost }).unwrap();
    g.add_output("y", r);
    assert_error(
        run_graph(&g, &Params::new(), &[("x", &x)]),
        &["%r", "%ghost"],
    );
    // An output reading a value nothing defines.
    let mut g = Graph::new("g");
    g.add_input("x", shape).unwrap();
    let ghost = g.add_value("ghost").unwrap();
    g.add_output("y", ghost);
    assert_error(
        run_graph(&g, &Params::new(), &[("x", &x)]),
        &["output y", "%ghost"],
    );
}

/// A residual block with every op, written as an exporter would: batch-norm separate.
const BLOCK: &str = "graph block {
  input %x: f32[1, 4, H, W]
  param @c1.weight: f32[4, 4, 3, 3]
  param @bn1.weight: f32[4]
  param @bn1.bias: f32[4]
  param @bn1.running_mean: f32[4]
  param @bn1.running_var: f32[4]
  param @c2.weight: f32[4, 2, 3, 3]
  param @c2.bias: f32[4]
  param @bn2.weight: f32[4]
  param @bn2.bias: f32[4]
  param @bn2.running_mean: f32[4]
  param @bn2.running_var: f32[4]
  %c1 = conv2d(%x, @c1.weight, pads=[1, 1, 1, 1])
  %b1 = batchnorm(%c1, @bn1.weight, @bn1.bias, @bn1.running_mean, @bn1.running_var)
  %r1 = relu(%b1)
  %c2 = conv2d(%r1, @c2.weight, bias=@c2.bias, pads=[3, 1, 1, 1], dilations=[2, 1], groups=2)
  %b2 = batchnorm(%c2, @bn2.weight, @bn2.bias, @bn2.running_mean, @bn2.running_var, epsilon=0.01)
  %s = add(%x, %b2)
  %o = relu(%s)
  %p = avgpool2d(%o, kernel=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=true, count_include_pad=true)
  %m = maxpool2d(%p, kernel=[2, 2], ceil_mode=true)
  %b3 = batchnorm(%m, @bn2.weight, @bn2.bias, @bn2.running_mean, @bn2.running_var)
  %r3 = relu(%b3)
  %g = global_avgpool(%r3)
  output y = %o
  output z = %g
}
";

/// Each element of `b` within `rel` of `a`, relative to `a`'s largest magnitude.
fn assert_close(a: &Tensor, b: &Tensor, rel: f32) {
    assert_eq!(a.shape, b.shape);
    let scale = a.data.iter().fold(0f32, |m, v| m.max(v.abs()));
    for (i, (x, y)) in a.data.iter().zip(&b.data).enumerate() {
        assert!(
            (x - y).abs() <= rel * scale,
            "element {i}: {x} vs {y} (scale {scale})"
        );
    }
}

fn check_optimize_agrees(h: usize, w: usize, seed: u64) {
    let original = parse(BLOCK).unwrap();
    let mut optimized = original.clone();
    let report = passes::optimize(&mut optimized);
    assert_eq!(
        (
            report.folded_batchnorms,
            report.batchnorm_convs,
            report.fused_relus,
            report.fused_adds,
            report.fused_pools
        ),
        (2, 1, 3, 1, 0)
    );
    // %b3 follows a pool: a depthwise conv with its relu fused.
    assert!(
        optimized
            .to_string()
            .contains("%b3 = conv2d(%m, @b3.bn_scale, bias=@b3.bn_shift, groups=4, post=[relu])"),
        "{optimized}"
    );
    let params = Params::random(&original, seed);
    let mut folded = params.clone();
    folded.materialize(&optimized).unwrap();
    let x = random_tensor(seed, "input", vec![1, 4, h, w], -1., 1.);
    let a = run_graph(&original, &params, &[("x", &x)]).unwrap();
    let b = run_graph(&optimized, &folded, &[("x", &x)]).unwrap();
    for ((na, ta), (nb, tb)) in a.iter().zip(&b) {
        assert_eq!(na, nb);
        assert_close(ta, tb, 1e-5);
    }
}

#[test]
fn optimized_graph_agrees_with_the_original() {
    check_optimize_agrees(7, 9, 0);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]
    #[test]
    fn optimized_graph_agrees_for_any_shape_and_seed(h in 2usize..12, w in 2usize..12, seed in any::<u64>()) {
        check_optimize_agrees(h, w, seed);
    }
}

/// The same conv twice over one input: once followed by a `maxpool2d` op, once with the pool
/// fused as its last post-op.
const FUSED_POOL: &str = "graph fused_pool {
  input %x: f32[1, 3, H, W]
  param @w: f32[4, 3, 3, 3]
  param @b: f32[4]
  %c = conv2d(%x, @w, bias=@b, strides=[2, 2], pads=[1, 1, 1, 1], post=[relu])
  %p = maxpool2d(%c, kernel=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=true)
  %fused = conv2d(%x, @w, bias=@b, strides=[2, 2], pads=[1, 1, 1, 1], post=[relu, maxpool(kernel=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=true)])
  output unfused = %p
  output fused = %fused
}
";

#[test]
fn fused_maxpool_post_op_matches_a_separate_maxpool2d() {
    let g = parse(FUSED_POOL).unwrap();
    let params = Params::random(&g, 4);
    // Input height, width, and the pooled height ceil((conv_h - 1) / 2) + 1 of the ceil-mode
    // pool, where the conv's output height conv_h is (h - 1) / 2 + 1.
    for (h, w, pooled_h) in [(5, 5, 2), (6, 9, 2), (7, 12, 3), (12, 13, 4)] {
        let x = random_tensor(h as u64, "x", vec![1, 3, h, w], -1., 1.);
        let out = run_graph(&g, &params, &[("x", &x)]).unwrap();
        let [(_, unfused), (_, fused)] = &out[..] else {
            panic!("two outputs: {out:?}");
        };
        assert_eq!(fused.shape[2], pooled_h, "{h}x{w}");
        assert_eq!(fused, unfused, "{h}x{w}");
    }
}

/// ResNet's stem as an exporter writes it; the passes fold it into one conv.
const STEM: &str = "graph stem {
  input %x: f32[1, 3, H, W]
  param @conv1.weight: f32[8, 3, 7, 7]
  param @bn1.weight: f32[8]
  param @bn1.bias: f32[8]
  param @bn1.running_mean: f32[8]
  param @bn1.running_var: f32[8]
  %conv1 = conv2d(%x, @conv1.weight, strides=[2, 2], pads=[3, 3, 3, 3])
  %bn1 = batchnorm(%conv1, @bn1.weight, @bn1.bias, @bn1.running_mean, @bn1.running_var)
  %relu = relu(%bn1)
  %maxpool = maxpool2d(%relu, kernel=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
  output y = %maxpool
}
";

#[test]
fn optimized_stem_agrees_with_the_original() {
    let original = parse(STEM).unwrap();
    let mut optimized = original.clone();
    let report = passes::optimize(&mut optimized);
    assert_eq!(report.fused_pools, 1);
    assert_eq!(optimized.node_count(), 1);
    let params = Params::random(&original, 5);
    let mut folded = params.clone();
    folded.materialize(&optimized).unwrap();
    for (h, w) in [(9, 9), (12, 17), (16, 10)] {
        let x = random_tensor(w as u64, "x", vec![1, 3, h, w], -1., 1.);
        let a = run_graph(&original, &params, &[("x", &x)]).unwrap();
        let b = run_graph(&optimized, &folded, &[("x", &x)]).unwrap();
        assert_eq!(a[0].0, b[0].0);
        assert_close(&a[0].1, &b[0].1, 1e-5);
    }
}
