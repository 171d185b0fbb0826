//! The trunk's Winograd keys: which nodes take Winograd under each choice, bounded scratch at
//! the workload's widest input, and the `dynamic` policy's one primitive per node
//! configuration.

use primjit_codegen::{ConvAlgo, ConvAlgoChoice, PrimitiveKey};
use primjit_ir::{Bindings, parse, parse_bindings};
use primjit_runtime::{ShapeMode, node_keys_in};

const TRUNK: &str = include_str!("../../../ir/resnet34_trunk.ir");

fn keys(w: usize, mode: ShapeMode, choice: ConvAlgoChoice) -> Vec<(String, PrimitiveKey)> {
    let graph = {
        let mut g = parse(TRUNK).expect("the trunk parses");
        primjit_ir::passes::optimize(&mut g);
        g
    };
    let bindings: Bindings = parse_bindings(&format!("W={w}")).expect("bindings");
    node_keys_in(&graph, &bindings, mode, choice, primjit_codegen::Isa::X128)
        .expect("keys of the trunk")
}

fn algo(key: &PrimitiveKey) -> Option<ConvAlgo> {
    match key {
        PrimitiveKey::Conv(d) => Some(d.algo),
        _ => None,
    }
}

/// `auto` and `winograd` give the trunk's 24 3x3 stride-1 convolutions and its two 3x3
/// stride-2 ones (the polyphase form) to Winograd, and keep conv1 (7x7) and the 1x1
/// downsamples direct.
#[test]
fn winograd_takes_exactly_the_3x3_convolutions() {
    for choice in [ConvAlgoChoice::Auto, ConvAlgoChoice::Winograd] {
        let keys = keys(320, ShapeMode::Exact, choice);
        let wino: Vec<&str> = keys
            .iter()
            .filter(|(_, k)| algo(k) == Some(ConvAlgo::WinogradF4x3))
            .map(|(n, _)| n.as_str())
            .collect();
        assert_eq!(wino.len(), 6 + 7 + 11 + 2, "{choice}: {wino:?}");
        for (name, key) in &keys {
            let PrimitiveKey::Conv(d) = key else { continue };
            assert_eq!(
                d.algo == ConvAlgo::WinogradF4x3,
                d.kh == 3,
                "{choice}: {name}: {key}"
            );
        }
    }
    let direct = keys(320, ShapeMode::Exact, ConvAlgoChoice::Direct);
    assert!(
        direct
            .iter()
            .all(|(_, k)| algo(k) != Some(ConvAlgo::WinogradF4x3))
    );
}

/// Winograd's scratch does not grow with the image: at most 4 MiB per thread for every layer
/// of the trunk at the workload's widest input (W=7680), with fixed and runtime extents. A
/// narrow image takes no more, and a call whose blocks hold fewer tiles than `block_tiles`
/// (layer3's stride-1 convs at W=200: 20 tiles in one block of at most 50) takes less: its call
/// key's scratch is its own blocks'. (layer3.0.conv1, at stride 2, makes two blocks of 10, the
/// most a block takes there.)
#[test]
fn winograd_scratch_is_at_most_4_mib_per_thread_at_w_7680() {
    for mode in [ShapeMode::Exact, ShapeMode::Runtime] {
        for (name, key) in keys(7680, mode, ConvAlgoChoice::Winograd) {
            let PrimitiveKey::Conv(d) = &key else {
                continue;
            };
            if d.algo != ConvAlgo::WinogradF4x3 {
                continue;
            }
            let bytes = d.scratch_len() * 4;
            assert!(
                bytes > 0 && bytes <= 4 << 20,
                "{name}: {bytes} bytes: {key}"
            );
            let at_200 = keys(200, mode, ConvAlgoChoice::Winograd)
                .into_iter()
                .find(|(n, _)| *n == name)
                .expect("same nodes");
            let PrimitiveKey::Conv(small) = at_200.1 else {
                unreachable!("a conv")
            };
            // The call's own key: runtime extents filled in with the layer's input at W=200
            // (a stage's first conv, at stride 2, reads the stage before it).
            let input = match (&name[..6], name.ends_with(".0.conv1")) {
                ("layer1", _) | ("layer2", true) => [80, 50],
                ("layer2", false) | ("layer3", true) => [40, 25],
                _ => [20, 13],
            };
            let call = small.at(input);
            assert!(call.scratch_len() <= d.scratch_len(), "{name}");
            if name.starts_with("layer3") && name != "layer3.0.conv1" {
                assert!(call.scratch_len() < d.scratch_len(), "{name}");
            }
        }
    }
}

/// With runtime widths, the Winograd keys do not depend on the width: one primitive per node
/// configuration serves every call, as for direct kernels.
#[test]
fn dynamic_winograd_keys_do_not_depend_on_the_width() {
    let at = |w| keys(w, ShapeMode::Runtime, ConvAlgoChoice::Auto);
    let (a, b) = (at(203), at(7680));
    for ((name, ka), (_, kb)) in a.iter().zip(&b) {
        if matches!(ka, PrimitiveKey::Conv(_)) {
            assert_eq!(ka, kb, "{name}");
        }
    }
    let distinct: std::collections::HashSet<_> = a
        .iter()
        .filter(|(_, k)| matches!(k, PrimitiveKey::Conv(_)))
        .map(|(_, k)| k)
        .collect();
    // conv1, layer1's two 3x3 convs, and per later stage: the stride-2 conv, the downsample,
    // conv2 of the first block (with a residual from the downsample), and the two convs of the
    // other blocks; the same count as with direct kernels.
    let direct = keys(203, ShapeMode::Runtime, ConvAlgoChoice::Direct);
    let distinct_direct: std::collections::HashSet<_> = direct
        .iter()
        .filter(|(_, k)| matches!(k, PrimitiveKey::Conv(_)))
        .map(|(_, k)| k)
        .collect();
    assert_eq!(distinct.len(), distinct_direct.len());
}

/// A 3x3 conv that takes Winograd keeps the max pool after it a node of its own (Winograd
/// fuses no pool, and gains more than the fusion would); under `direct` the pool fuses.
/// Both runs match the reference. (A 16x14 output is 16 Winograd tiles, the fewest `auto`
/// takes at fixed extents: decision 031.)
#[test]
fn a_winograd_conv_keeps_its_max_pool_apart() {
    use primjit_ir::{Params, Tensor};
    use primjit_runtime::{CompiledGraph, Engine, EngineConfig, Workspace};
    let text = "graph g {
  input %x: f32[1, 3, 16, 14]
  param @w1: f32[16, 3, 1, 1]
  param @w3: f32[16, 16, 3, 3]
  %a = conv2d(%x, @w1)
  %b = conv2d(%a, @w3, pads=[1, 1, 1, 1], post=[relu])
  %p = maxpool2d(%b, kernel=[2, 2], strides=[2, 2])
  output y = %p
}
";
    let graph = parse(text).expect("parses");
    let params = Params::random(&graph, 3);
    let x = Tensor {
        shape: vec![1, 3, 16, 14],
        data: (0..3 * 16 * 14)
            .map(|i| (i % 17) as f32 / 8.0 - 1.0)
            .collect(),
    };
    let want = primjit_reference::run_graph(&graph, &params, &[("x", &x)])
        .expect("reference")
        .remove(0)
        .1;
    let engine = Engine::new(EngineConfig {
        threads: 1,
        ..EngineConfig::default()
    })
    .expect("engine");
    for (choice, algos) in [
        (
            ConvAlgoChoice::Auto,
            vec![Some(ConvAlgo::Direct), Some(ConvAlgo::WinogradF4x3), None],
        ),
        (
            ConvAlgoChoice::Direct,
            vec![Some(ConvAlgo::Direct), Some(ConvAlgo::Direct)],
        ),
    ] {
        let model = CompiledGraph::with_conv_algo(&graph, &params, choice).expect("compiles");
        let (mut out, stats) = model
            .run(&engine, &[("x", &x)], &mut Workspace::new())
            .expect("runs");
        let keys: Vec<&PrimitiveKey> = stats.nodes.iter().map(|n| n.primitive.key()).collect();
        assert_eq!(
            keys.iter().map(|k| algo(k)).collect::<Vec<_>>(),
            algos,
            "{choice}"
        );
        let fused = keys
            .iter()
            .any(|k| matches!(k, PrimitiveKey::Conv(d) if d.pool.is_some()));
        assert_eq!(fused, choice == ConvAlgoChoice::Direct, "{choice}");
        let got = out.remove(0).1;
        assert_eq!(got.shape, want.shape);
        for (g, w) in got.data.iter().zip(&want.data) {
            assert!(
                (g - w).abs() <= 1e-4 * w.abs().max(1.0),
                "{choice}: {g} against {w}"
            );
        }
    }
}
