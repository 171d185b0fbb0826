//! `auto_pad` SAME_UPPER and SAME_LOWER over symbolic extents: one graph runs at every input
//! size with its padding resolved per bound shape, as the reference computes it; exact keys,
//! runtime extents and width-streamed runs give the same bits.

mod common;
use common::engine;

use primjit_codegen::{ConvAlgoChoice, PrimitiveKey};
use primjit_ir::{Bindings, Graph, Params, Tensor, parse, random_tensor};
use primjit_runtime::{
    CompiledGraph, Engine, EngineConfig, ShapeMode, Streaming, Workspace, node_keys_in,
};

/// `ir/examples/auto_pad.ir`: a 3x3/2 SAME_UPPER conv, a 1x1/2 conv adding it, a 3x3/2
/// SAME_LOWER max pool, a dilated 3x3 conv at strides 3 and 2 SAME_LOWER, and a 2x3/2
/// SAME_UPPER average pool that counts its padding.
fn example() -> Graph {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../ir/examples/auto_pad.ir");
    parse(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Odd and even heights and widths, one pixel, and inputs smaller than the windows.
const SIZES: [(usize, usize); 8] = [
    (7, 9),
    (8, 8),
    (9, 12),
    (1, 1),
    (2, 3),
    (12, 7),
    (5, 16),
    (3, 2),
];

fn bits(t: &Tensor) -> Vec<u32> {
    t.data.iter().map(|x| x.to_bits()).collect()
}

fn run(m: &CompiledGraph, engine: &Engine, x: &Tensor) -> Vec<(String, Tensor)> {
    m.run(engine, &[("x", x)], &mut Workspace::new())
        .unwrap_or_else(|e| panic!("{:?}: {e}", x.shape))
        .0
}

#[test]
fn the_auto_pad_example_runs_as_the_reference_does_at_every_size() {
    let graph = example();
    let params = Params::random(&graph, 5);
    let exact = CompiledGraph::new(&graph, &params).unwrap();
    let dynamic = CompiledGraph::new(&graph, &params)
        .unwrap()
        .with_mode(ShapeMode::Runtime);
    for (h, w) in SIZES {
        let x = random_tensor((h * 31 + w) as u64, "x", vec![1, 3, h, w], -1.0, 1.0);
        let want = primjit_reference::run_graph(&graph, &params, &[("x", &x)]).unwrap();
        let got = run(&exact, engine(), &x);
        let got_dynamic = run(&dynamic, engine(), &x);
        // Each stage is ceil(in / stride) whatever the padding: strides 2, 2, then 3 and 2,
        // then 2.
        let (ph, pw) = (h.div_ceil(2).div_ceil(2), w.div_ceil(2).div_ceil(2));
        let y = [1, 4, ph.div_ceil(3).div_ceil(2), pw.div_ceil(2).div_ceil(2)];
        assert_eq!(want[0].1.shape, y, "{h}x{w}");
        assert_eq!(want[1].1.shape, [1, 4, ph, pw], "{h}x{w}");
        for ((name, want), ((_, got), (_, dynamic))) in
            want.iter().zip(got.iter().zip(&got_dynamic))
        {
            assert_eq!(want.shape, got.shape, "{h}x{w} {name}");
            let scale = want.data.iter().fold(1f32, |m, v| m.max(v.abs()));
            for (i, (g, r)) in got.data.iter().zip(&want.data).enumerate() {
                assert!(
                    (g - r).abs() <= 1e-5 * scale,
                    "{h}x{w} {name}: element {i}: jit {g}, reference {r}"
                );
            }
            assert!(
                bits(got) == bits(dynamic),
                "{h}x{w} {name}: runtime extents differ from exact keys"
            );
        }
    }
}

/// Under runtime extents a SAME conv's key fixes the padding its input's extents give: the
/// stem (3x3/2 SAME_UPPER) has one key per parity of the height and width, the 1x1 conv one
/// key for all.
#[test]
fn runtime_keys_differ_only_by_the_residue_of_the_extents() {
    let graph = example();
    let keys = |h: u64, w: u64| -> Vec<(String, PrimitiveKey)> {
        let bindings: Bindings = [("H".to_string(), h), ("W".to_string(), w)].into();
        node_keys_in(
            &graph,
            &bindings,
            ShapeMode::Runtime,
            ConvAlgoChoice::Direct,
            primjit_codegen::Isa::X128,
        )
        .unwrap()
    };
    let stem = |h, w| keys(h, w)[0].1.clone();
    let down = |h, w| keys(h, w)[1].1.clone();
    assert_eq!(stem(8, 10), stem(12, 30), "even extents share a key");
    assert_eq!(stem(7, 9), stem(21, 5), "odd extents share a key");
    assert_ne!(stem(8, 10), stem(8, 11));
    assert_ne!(stem(8, 10), stem(9, 10));
    assert_eq!(down(8, 10), down(9, 11));
    let PrimitiveKey::Conv(even) = stem(8, 10) else {
        panic!("a conv")
    };
    let PrimitiveKey::Conv(odd) = stem(9, 11) else {
        panic!("a conv")
    };
    // SAME_UPPER 3x3/2: an even extent pads one cell at the end, an odd one on each side.
    assert_eq!(
        [
            even.pads.top,
            even.pads.left,
            even.pads.bottom,
            even.pads.right
        ],
        [0, 0, 1, 1]
    );
    assert_eq!(
        [odd.pads.top, odd.pads.left, odd.pads.bottom, odd.pads.right],
        [1, 1, 1, 1]
    );
}

/// Leading SAME convs at strides 2 whose left padding follows the width, 16 channels so that
/// `auto` takes Winograd's stride-2 form for the second, and a residual conv after them.
const STRIDED: &str = "
graph strided_same {
  input %x: f32[1, 3, 10, W]
  param @stem.weight: f32[16, 3, 3, 3]
  param @stem.bias: f32[16]
  param @a.weight: f32[16, 16, 3, 3]
  param @b.weight: f32[16, 16, 3, 3]
  %stem = conv2d(%x, @stem.weight, bias=@stem.bias, strides=[2, 2], auto_pad=same_upper, post=[relu])
  %a = conv2d(%stem, @a.weight, strides=[2, 2], auto_pad=same_lower, post=[relu])
  %b = conv2d(%a, @b.weight, pads=[1, 1, 1, 1], post=[add(%a)])
  output y = %b
}
";

/// Widths of every residue modulo 4 (the two strides), from one pixel to many bands.
const WIDTHS: [usize; 10] = [1, 2, 3, 17, 40, 41, 66, 67, 130, 131];

#[test]
fn streamed_and_runtime_extent_runs_of_same_convs_are_bit_identical() {
    let graph = parse(STRIDED).unwrap();
    let params = Params::random(&graph, 9);
    let engines = [1, 2].map(|threads| {
        Engine::new(EngineConfig {
            threads,
            ..EngineConfig::default()
        })
        .unwrap()
    });
    for algo in [ConvAlgoChoice::Auto, ConvAlgoChoice::Direct] {
        let build = |mode, streaming| {
            CompiledGraph::with_conv_algo(&graph, &params, algo)
                .unwrap()
                .with_mode(mode)
                .with_streaming(streaming)
        };
        let whole = build(ShapeMode::Exact, Streaming::OFF);
        for &w in &WIDTHS {
            let x = random_tensor(w as u64, "x", vec![1, 3, 10, w], -1.0, 1.0);
            let want = primjit_reference::run_graph(&graph, &params, &[("x", &x)]).unwrap();
            let expected = run(&whole, &engines[0], &x);
            assert_eq!(expected[0].1.shape, [1, 16, 3, w.div_ceil(4)]);
            let scale = want[0].1.data.iter().fold(1f32, |m, v| m.max(v.abs()));
            for (g, r) in expected[0].1.data.iter().zip(&want[0].1.data) {
                assert!(
                    (g - r).abs() <= 1e-4 * scale,
                    "{algo} W={w}: jit {g}, reference {r}"
                );
            }
            for mode in [ShapeMode::Exact, ShapeMode::Runtime] {
                for band in [4, 8] {
                    let streamed = build(mode, Streaming::with_band(band).unwrap().above(0));
                    for engine in &engines {
                        let (out, stats) = streamed
                            .run(engine, &[("x", &x)], &mut Workspace::new())
                            .unwrap();
                        // The stem's output is ceil(W / 2) columns: it streams once that is more
                        // than four bands, from the stem on.
                        let streams = w.div_ceil(2) > 4 * band;
                        assert_eq!(stats.segments.len(), usize::from(streams), "W={w}");
                        if let Some(segment) = stats.segments.first() {
                            assert_eq!(segment.first, "stem", "{segment}");
                        }
                        assert!(
                            bits(&out[0].1) == bits(&expected[0].1),
                            "{algo} {mode:?} band {band}, {} threads, W={w}: differs from \
                             the whole-tensor run",
                            engine.threads()
                        );
                    }
                }
            }
        }
    }
}
