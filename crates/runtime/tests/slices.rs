//! Values placed in a slice of another's buffer (`CompiledGraph::with_slices_in_place`):
//! concats whose inputs are written straight into their output, and blocks of channels read
//! where they lie. Runs must give the bits of runs that copy, and the reference's values;
//! what cannot be placed is copied.

use primjit_ir::{Params, Tensor, parse, random_tensor};
use primjit_runtime::{
    Budget, CompiledGraph, Engine, EngineConfig, RunStats, ShapeMode, Streaming, Workspace,
};
use proptest::prelude::*;

fn engine(threads: usize) -> Engine {
    let mut config = EngineConfig {
        threads,
        ..EngineConfig::default()
    };
    config.workspace.budget = Budget::Unlimited;
    Engine::new(config).expect("engine")
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.data.iter().map(|x| x.to_bits()).collect()
}

/// Runs `model` on `x` (input `%x`), returning its outputs and the run's statistics.
fn run(model: &CompiledGraph, engine: &Engine, x: &Tensor) -> (Vec<(String, Tensor)>, RunStats) {
    model
        .run(engine, &[("x", x)], &mut Workspace::new())
        .expect("runs")
}

/// The names of the nodes a run ran a primitive for.
fn ran(stats: &RunStats) -> Vec<&str> {
    stats.nodes.iter().map(|n| n.name.as_str()).collect()
}

/// Checks `outputs` against the reference run of `graph` on `x`: within 1e-5 of each output's
/// largest magnitude.
fn check_reference(
    graph: &primjit_ir::Graph,
    params: &Params,
    x: &Tensor,
    outputs: &[(String, Tensor)],
    case: &str,
) {
    let want = primjit_reference::run_graph(graph, params, &[("x", x)]).expect("reference");
    for ((name, w), (_, g)) in want.iter().zip(outputs) {
        assert_eq!(w.shape, g.shape, "{case}: %{name}");
        let scale = w.data.iter().fold(1e-30f32, |m, v| m.max(v.abs()));
        for (i, (a, b)) in g.data.iter().zip(&w.data).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 * scale,
                "{case}: %{name} element {i}: jit {a}, reference {b}"
            );
        }
    }
}

/// Runs `a` and `b` (the same graph, `graph` with `params`) on `x`: every output has the same
/// bits in both and the reference's values. Returns both runs' statistics.
fn run_both(
    (a, b): (&CompiledGraph, &CompiledGraph),
    (graph, params): (&primjit_ir::Graph, &Params),
    engine: &Engine,
    x: &Tensor,
    case: &str,
) -> (RunStats, RunStats) {
    let (ya, sa) = run(a, engine, x);
    let (yb, sb) = run(b, engine, x);
    for (p, q) in ya.iter().zip(&yb) {
        assert!(bits(&p.1) == bits(&q.1), "{case}: %{} differs", p.0);
    }
    check_reference(graph, params, x, &ya, case);
    (sa, sb)
}

/// A dense block as torchvision exports it: each layer reads the concat of the block's input
/// and every feature before it; the transition reads the concat of all.
const DENSE: &str = "
graph dense {
  input %x: f32[N, 3, 9, W]
  param @stem.weight: f32[8, 3, 3, 3]
  param @l1.weight: f32[4, 8, 3, 3]
  param @l2.weight: f32[4, 12, 3, 3]
  param @l3.weight: f32[5, 16, 3, 3]
  param @t.weight: f32[6, 21, 1, 1]
  %stem = conv2d(%x, @stem.weight, pads=[1, 1, 1, 1], post=[relu])
  %f1 = conv2d(%stem, @l1.weight, pads=[1, 1, 1, 1], post=[relu])
  %c1 = concat(%stem, %f1)
  %f2 = conv2d(%c1, @l2.weight, pads=[1, 1, 1, 1], post=[relu])
  %c2 = concat(%stem, %f1, %f2)
  %f3 = conv2d(%c2, @l3.weight, pads=[1, 1, 1, 1], post=[relu])
  %c3 = concat(%stem, %f1, %f2, %f3)
  %t = conv2d(%c3, @t.weight)
  output y = %t
}
";

fn placed(list: &[(&str, &str, usize)]) -> Vec<(String, String, usize)> {
    list.iter()
        .map(|(v, r, c)| (v.to_string(), r.to_string(), *c))
        .collect()
}

#[test]
fn a_dense_block_shares_its_last_concats_buffer() {
    let graph = parse(DENSE).unwrap();
    let params = Params::random(&graph, 5);
    let model = CompiledGraph::new(&graph, &params)
        .unwrap()
        .with_streaming(Streaming::OFF);
    // The last concat's inputs go into its buffer; the earlier concats are its first channels.
    assert_eq!(
        model.slices_in_place(),
        placed(&[
            ("stem", "c3", 0),
            ("f1", "c3", 8),
            ("c1", "c3", 0),
            ("f2", "c3", 12),
            ("c2", "c3", 0),
            ("f3", "c3", 16),
        ])
    );
    let apart = model.clone().with_slices_in_place(false);
    for mode in [ShapeMode::Exact, ShapeMode::Runtime] {
        let (model, apart) = (model.clone().with_mode(mode), apart.clone().with_mode(mode));
        for threads in [1, 2] {
            let engine = engine(threads);
            for w in [1, 6, 13] {
                let case = format!("{mode:?}, {threads} threads, W={w}");
                let x = random_tensor(w as u64, "x", vec![1, 3, 9, w], -1.0, 1.0);
                let (sa, sb) = run_both((&model, &apart), (&graph, &params), &engine, &x, &case);
                assert_eq!(ran(&sa), ["stem", "f1", "f2", "f3", "t"], "{case}");
                assert_eq!(
                    ran(&sb),
                    ["stem", "f1", "c1", "f2", "c2", "f3", "c3", "t"],
                    "{case}"
                );
                // Copying, c3 (24 channels with its padding) and the four values it joins
                // (8, 4, 4, 5 padded to 8) are live at once; in place, c3's buffer holds them
                // all, and the peak is c3 with t's output (8).
                let plane = 9 * w * 4;
                assert_eq!(
                    sb.peak_activation_bytes,
                    (24 + 8 + 4 + 4 + 8) * plane,
                    "{case}"
                );
                assert_eq!(sa.peak_activation_bytes, (24 + 8) * plane, "{case}");
            }
        }
    }
    // Two images: a feature's channels are no longer one run of the buffer, so every concat
    // copies.
    let x = random_tensor(9, "x", vec![2, 3, 9, 7], -1.0, 1.0);
    let engine = engine(2);
    let (sa, _) = run_both(
        (&model, &apart),
        (&graph, &params),
        &engine,
        &x,
        "two images",
    );
    assert_eq!(ran(&sa), ["stem", "f1", "c1", "f2", "c2", "f3", "c3", "t"]);
}

#[test]
fn chained_concats_and_blocks_of_channels_are_placed() {
    // A chain of concats (each the next one's first input), and selections: an aligned
    // block, a block ending at the last of 6 channels, and one starting off a block.
    let text = "
graph chained {
  input %x: f32[1, 4, 5, W]
  param @a.weight: f32[4, 4, 3, 3]
  param @b.weight: f32[8, 4, 1, 1]
  param @c.weight: f32[6, 4, 3, 3]
  param @d.weight: f32[3, 18, 1, 1]
  param @e.weight: f32[2, 4, 1, 1]
  %a = conv2d(%x, @a.weight, pads=[1, 1, 1, 1], post=[relu])
  %b = conv2d(%a, @b.weight)
  %ab = concat(%a, %b)
  %c = conv2d(%a, @c.weight, pads=[1, 1, 1, 1])
  %abc = concat(%ab, %c)
  %mid = select_channels(%abc, select=[4, 5, 6, 7, 8, 9, 10, 11])
  %tail = select_channels(%abc, select=[16, 17])
  %odd = select_channels(%abc, select=[2, 3, 4, 5])
  %d = conv2d(%abc, @d.weight)
  %e = conv2d(%mid, @e.weight, groups=2)
  %out = concat(%d, %e, %tail, %odd)
  output y = %out
}
";
    let graph = parse(text).unwrap();
    let params = Params::random(&graph, 11);
    let model = CompiledGraph::new(&graph, &params).unwrap();
    // %out's inputs: %d has 3 channels and is not its last, so it copies.
    assert_eq!(
        model.slices_in_place(),
        placed(&[
            ("a", "abc", 0),
            ("b", "abc", 4),
            ("ab", "abc", 0),
            ("c", "abc", 12),
            ("mid", "abc", 4),
            ("tail", "abc", 16),
        ])
    );
    let apart = model.clone().with_slices_in_place(false);
    let engine = engine(2);
    for w in [1, 5, 11] {
        let x = random_tensor(w as u64, "x", vec![1, 4, 5, w], -1.0, 1.0);
        let case = format!("W={w}");
        let (sa, _) = run_both((&model, &apart), (&graph, &params), &engine, &x, &case);
        assert_eq!(ran(&sa), ["a", "b", "c", "odd", "d", "e", "out"], "W={w}");
    }
}

#[test]
fn what_cannot_be_placed_is_copied() {
    let text = "
graph kept {
  input %x: f32[1, 4, 5, 6]
  param @a.weight: f32[4, 4, 3, 3]
  param @b.weight: f32[4, 4, 3, 3]
  param @c.weight: f32[4, 8, 1, 1]
  %a = conv2d(%x, @a.weight, pads=[1, 1, 1, 1])
  %b = conv2d(%a, @b.weight, pads=[1, 1, 1, 1])
  %with_input = concat(%x, %a)
  %twice = concat(%b, %b)
  %shown = concat(%a, %b)
  %c = conv2d(%shown, @c.weight, post=[add(%b)])
  %over = conv2d(%twice, @c.weight, post=[add(%a)])
  %split = select_channels(%over, select=[0, 1, 2, 3])
  %y = concat(%with_input, %c, %split)
  output y = %y
  output a = %a
}
";
    // %x is a graph input; %b is in %twice twice, and %c writes over it; %a is an output.
    // %y's inputs are %with_input (a concat that copies into its place), %c (which writes
    // there rather than over %b) and %split (copied into its place rather than a view of
    // %over).
    let graph = parse(text).unwrap();
    let params = Params::random(&graph, 2);
    let model = CompiledGraph::new(&graph, &params).unwrap();
    let listed = model.slices_in_place();
    for v in ["x", "a", "b", "twice", "shown"] {
        assert!(listed.iter().all(|(p, _, _)| p != v), "%{v}: {listed:?}");
    }
    assert_eq!(
        listed,
        placed(&[("with_input", "y", 0), ("c", "y", 8), ("split", "y", 12)])
    );
    let x = random_tensor(3, "x", vec![1, 4, 5, 6], -1.0, 1.0);
    let engine = engine(1);
    let apart = model.clone().with_slices_in_place(false);
    let (sa, _) = run_both((&model, &apart), (&graph, &params), &engine, &x, "kept");
    // %split runs: it is a concat's input, copied into place, not a view.
    assert_eq!(
        ran(&sa),
        [
            "a",
            "b",
            "with_input",
            "twice",
            "shown",
            "c",
            "over",
            "split"
        ]
    );
}

#[test]
fn a_concat_of_placed_values_in_another_order_copies() {
    // %r places %a and %b; %q joins them the other way round, so it is no slice of %r.
    let text = "
graph swapped {
  input %x: f32[1, 4, 3, W]
  param @a.weight: f32[4, 4, 3, 3]
  param @b.weight: f32[4, 4, 1, 1]
  param @c.weight: f32[4, 8, 1, 1]
  %a = conv2d(%x, @a.weight, pads=[1, 1, 1, 1])
  %b = conv2d(%a, @b.weight)
  %q = concat(%b, %a)
  %c = conv2d(%q, @c.weight)
  %r = concat(%a, %b)
  %d = conv2d(%r, @c.weight, post=[add(%c)])
  output y = %d
}
";
    let graph = parse(text).unwrap();
    let params = Params::random(&graph, 8);
    let model = CompiledGraph::new(&graph, &params).unwrap();
    assert_eq!(
        model.slices_in_place(),
        placed(&[("a", "r", 0), ("b", "r", 4)])
    );
    let engine = engine(1);
    let x = random_tensor(6, "x", vec![1, 4, 3, 7], -1.0, 1.0);
    let apart = model.clone().with_slices_in_place(false);
    let (sa, _) = run_both((&model, &apart), (&graph, &params), &engine, &x, "swapped");
    assert_eq!(ran(&sa), ["a", "b", "q", "c", "d"]);
}

#[test]
fn values_of_a_streamed_segment_keep_their_own_buffers() {
    let text = "
graph streamed {
  input %x: f32[1, 3, 6, W]
  param @a.weight: f32[4, 3, 3, 3]
  param @b.weight: f32[4, 4, 3, 3]
  param @c.weight: f32[4, 8, 3, 3]
  %a = conv2d(%x, @a.weight, pads=[1, 1, 1, 1], post=[relu])
  %b = conv2d(%a, @b.weight, pads=[1, 1, 1, 1], post=[relu])
  %ab = concat(%a, %b)
  %c = conv2d(%ab, @c.weight, pads=[1, 1, 1, 1])
  %d = conv2d(%c, @b.weight, pads=[1, 1, 1, 1])
  %cd = concat(%c, %d)
  output y = %cd
}
";
    let graph = parse(text).unwrap();
    let params = Params::random(&graph, 4);
    let banded = CompiledGraph::new(&graph, &params)
        .unwrap()
        .with_mode(ShapeMode::Runtime)
        .with_streaming(Streaming::with_band(8).unwrap().above(0));
    let whole = banded.clone().with_streaming(Streaming::OFF);
    let engine = engine(2);
    let x = random_tensor(1, "x", vec![1, 3, 6, 70], -1.0, 1.0);
    let (sa, sb) = run_both(
        (&banded, &whole),
        (&graph, &params),
        &engine,
        &x,
        "streamed",
    );
    assert!(!sa.segments.is_empty(), "the run streams");
    // %a and %b are the segment's: %ab copies them. %c and %d run on whole tensors.
    assert!(
        ran(&sa).contains(&"ab") && !ran(&sa).contains(&"cd"),
        "{:?}",
        ran(&sa)
    );
    assert!(
        !ran(&sb).contains(&"ab") && !ran(&sb).contains(&"cd"),
        "{:?}",
        ran(&sb)
    );
}

// ---- generated graphs ----

/// One step of a generated graph, over the values made before it (indices into them).
#[derive(Clone, Debug)]
enum Step {
    /// A conv of value `from` to `channels`, 1x1 or 3x3, with a residual `add` of a value of
    /// the same channel count if `residual` picks one.
    Conv {
        from: usize,
        channels: usize,
        kernel: usize,
        residual: usize,
    },
    /// A concat of these values (repeats allowed).
    Concat(Vec<usize>),
    /// Channels `first..first + count` of value `from`, clipped to its channels.
    Select {
        from: usize,
        first: usize,
        count: usize,
    },
    /// The concat of every value so far but the graph input.
    Dense,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (any::<usize>(), prop::sample::select(vec![3, 4, 5, 8, 12]), prop::sample::select(vec![1, 3]), any::<usize>())
            .prop_map(|(from, channels, kernel, residual)| Step::Conv { from, channels, kernel, residual }),
        2 => prop::collection::vec(any::<usize>(), 2..5).prop_map(Step::Concat),
        1 => (any::<usize>(), prop::sample::select(vec![0, 1, 4, 8]), 1..9usize)
            .prop_map(|(from, first, count)| Step::Select { from, first, count }),
        1 => Just(Step::Dense),
    ]
}

/// The IR text of a graph of `steps` over a stem conv of `%x` (3 channels, `[batch, 3, 4, w]`)
/// and its parameters' shapes; the last value and one more (`extra`) are its outputs.
fn graph_text(steps: &[Step], batch: usize, w: usize, extra: usize) -> String {
    let mut params = vec!["  param @stem.weight: f32[4, 3, 3, 3]".to_string()];
    let mut body =
        vec!["  %v0 = conv2d(%x, @stem.weight, pads=[1, 1, 1, 1], post=[relu])".to_string()];
    let mut channels = vec![4usize];
    for (i, s) in steps.iter().enumerate() {
        let n = channels.len();
        let name = format!("%v{n}");
        match s {
            Step::Conv {
                from,
                channels: c,
                kernel,
                residual,
            } => {
                let from = from % n;
                params.push(format!(
                    "  param @p{i}.weight: f32[{c}, {}, {kernel}, {kernel}]",
                    channels[from]
                ));
                let pads = if *kernel == 3 {
                    ", pads=[1, 1, 1, 1]"
                } else {
                    ""
                };
                let same: Vec<usize> = (0..n).filter(|&v| channels[v] == *c).collect();
                let post = match same.len() {
                    0 => "post=[relu]".to_string(),
                    k => format!("post=[add(%v{}), relu]", same[residual % k]),
                };
                body.push(format!(
                    "  {name} = conv2d(%v{from}, @p{i}.weight{pads}, {post})"
                ));
                channels.push(*c);
            }
            Step::Concat(of) => {
                let of: Vec<usize> = of.iter().map(|v| v % n).collect();
                let list: Vec<String> = of.iter().map(|v| format!("%v{v}")).collect();
                body.push(format!("  {name} = concat({})", list.join(", ")));
                channels.push(of.iter().map(|&v| channels[v]).sum());
            }
            Step::Select { from, first, count } => {
                let from = from % n;
                let first = (*first).min(channels[from] - 1);
                let end = (first + count).min(channels[from]);
                let list: Vec<String> = (first..end).map(|c| c.to_string()).collect();
                body.push(format!(
                    "  {name} = select_channels(%v{from}, select=[{}])",
                    list.join(", ")
                ));
                channels.push(end - first);
            }
            Step::Dense => {
                let list: Vec<String> = (0..n).map(|v| format!("%v{v}")).collect();
                body.push(format!("  {name} = concat({})", list.join(", ")));
                channels.push(channels.iter().sum());
            }
        }
    }
    let last = channels.len() - 1;
    let extra = extra % channels.len();
    let outputs = if extra == last {
        format!("  output y = %v{last}")
    } else {
        format!("  output y = %v{last}\n  output z = %v{extra}")
    };
    format!(
        "graph generated {{\n  input %x: f32[{batch}, 3, 4, {w}]\n{}\n{}\n{outputs}\n}}\n",
        params.join("\n"),
        body.join("\n")
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Generated graphs of convs (with residuals), concats (repeats, chains, dense ones) and
    /// selections: in place, every output has the bits of the copying run and the reference's
    /// values, on one image and on two, at fixed and runtime widths.
    #[test]
    fn generated_graphs_run_as_they_do_copying(
        steps in prop::collection::vec(step(), 1..9),
        batch in prop::sample::select(vec![1, 1, 1, 2]),
        w in 1..9usize,
        extra in any::<usize>(),
        runtime in any::<bool>(),
        threads in 1..3usize,
    ) {
        let text = graph_text(&steps, batch, w, extra);
        let graph = parse(&text).expect("the generated graph parses");
        let params = Params::random(&graph, w as u64);
        let mode = if runtime { ShapeMode::Runtime } else { ShapeMode::Exact };
        let model = CompiledGraph::new(&graph, &params).unwrap().with_mode(mode);
        let apart = model.clone().with_slices_in_place(false);
        let engine = engine(threads);
        let x = random_tensor(w as u64, "x", vec![batch, 3, 4, w], -1.0, 1.0);
        run_both((&model, &apart), (&graph, &params), &engine, &x, &text);
    }
}
