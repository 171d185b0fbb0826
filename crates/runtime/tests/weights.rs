//! Model weights: a `CompiledGraph` keeps its packed weights and nothing of the parameters it
//! was built from, so a caller may drop them; derived parameters (folded batch-norms) are
//! computed from the declared ones while packing, never read from the caller's values.

use primjit_codegen::{ConvAlgoChoice, PrimitiveKey};
use primjit_ir::{Bindings, Graph, Params, Tensor, parse, passes, random_tensor};
use primjit_runtime::{CompiledGraph, Engine, EngineConfig, WeightBytes, Workspace};

/// A batch-norm of the input (run as a depthwise 1x1 conv of its own), a conv with a bias and
/// two batch-norms after it (the second fold reads the first's derived weight and bias), and a
/// residual conv with a folded batch-norm.
const FOLDS: &str = "
graph folds {
  input %x: f32[1, 8, 10, W]
  param @in.weight: f32[8]
  param @in.bias: f32[8]
  param @in.running_mean: f32[8]
  param @in.running_var: f32[8]
  param @c1.weight: f32[16, 8, 3, 3]
  param @c1.bias: f32[16]
  param @bn1.weight: f32[16]
  param @bn1.bias: f32[16]
  param @bn1.running_mean: f32[16]
  param @bn1.running_var: f32[16]
  param @bn2.weight: f32[16]
  param @bn2.bias: f32[16]
  param @bn2.running_mean: f32[16]
  param @bn2.running_var: f32[16]
  param @c2.weight: f32[16, 16, 3, 3]
  param @bn3.weight: f32[16]
  param @bn3.bias: f32[16]
  param @bn3.running_mean: f32[16]
  param @bn3.running_var: f32[16]
  %n = batchnorm(%x, @in.weight, @in.bias, @in.running_mean, @in.running_var)
  %c1 = conv2d(%n, @c1.weight, bias=@c1.bias, pads=[1, 1, 1, 1])
  %b1 = batchnorm(%c1, @bn1.weight, @bn1.bias, @bn1.running_mean, @bn1.running_var)
  %b2 = batchnorm(%b1, @bn2.weight, @bn2.bias, @bn2.running_mean, @bn2.running_var)
  %r1 = relu(%b2)
  %c2 = conv2d(%r1, @c2.weight, pads=[1, 1, 1, 1])
  %b3 = batchnorm(%c2, @bn3.weight, @bn3.bias, @bn3.running_mean, @bn3.running_var)
  %s = add(%b3, %r1)
  %y = relu(%s)
  output y = %y
}
";

const WIDTH: usize = 13;

fn graph() -> Graph {
    parse(FOLDS).expect("parses")
}

fn input() -> Tensor {
    random_tensor(1, "x", vec![1, 8, 10, WIDTH], -1.0, 1.0)
}

fn run(model: &CompiledGraph, engine: &Engine) -> Tensor {
    let (mut outputs, _) = model
        .run(engine, &[("x", &input())], &mut Workspace::new())
        .expect("runs");
    outputs.remove(0).1
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.data.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn a_compiled_graph_runs_bit_identically_after_its_parameters_are_dropped() {
    let graph = graph();
    let params = Params::random(&graph, 7);
    let engine = Engine::new(EngineConfig::default()).expect("engine");

    let mut optimized = graph.clone();
    passes::optimize(&mut optimized);
    let derived: Vec<(String, Vec<usize>)> = optimized
        .params()
        .filter(|(_, p)| p.derived.is_some())
        .map(|(_, p)| (p.name.clone(), p.shape.clone()))
        .collect();
    // Three folds, the second of them into the first's derived parameters, and the input's
    // batch-norm made a conv of derived parameters.
    assert_eq!(derived.len(), 8, "{optimized}");
    // Values under the derived parameters' names are stale by definition: never read.
    let mut stale = params.clone();
    for (name, shape) in &derived {
        stale.insert(
            name.clone(),
            random_tensor(99, name, shape.clone(), 5.0, 6.0),
        );
    }
    // The reference runs on every derived value stored (`Params::materialize`).
    let mut materialized = params.clone();
    materialized.materialize(&optimized).expect("materializes");
    let want = primjit_reference::run_graph(&optimized, &materialized, &[("x", &input())])
        .expect("reference runs")
        .remove(0)
        .1;

    for algo in [ConvAlgoChoice::Direct, ConvAlgoChoice::Winograd] {
        let kept = CompiledGraph::with_conv_algo(&graph, &params, algo).expect("compiles");
        let alone = {
            let own = params.clone();
            CompiledGraph::with_conv_algo(&graph, &own, algo).expect("compiles")
            // `own` is dropped here: the graph borrows nothing from it.
        };
        let from_stale = CompiledGraph::with_conv_algo(&graph, &stale, algo).expect("compiles");
        assert_eq!(alone.weight_bytes(), kept.weight_bytes(), "{algo}");

        let got = run(&kept, &engine);
        // Compared whole, not printed: hundreds of values.
        assert!(bits(&run(&alone, &engine)) == bits(&got), "{algo}: dropped");
        assert!(
            bits(&run(&from_stale, &engine)) == bits(&got),
            "{algo}: stale"
        );

        assert_eq!(got.shape, want.shape, "{algo}");
        let scale = want.data.iter().fold(1.0f32, |m, x| m.max(x.abs()));
        let err = got
            .data
            .iter()
            .zip(&want.data)
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(err <= 1e-4 * scale, "{algo}: max error {err} of {scale}");
    }
}

#[test]
fn weight_bytes_are_one_packing_per_convolution_for_its_algorithm() {
    let graph = graph();
    let params = Params::random(&graph, 7);
    let bindings = graph
        .bind_inputs(&[("x", &[1, 8, 10, WIDTH][..])], &Bindings::new())
        .expect("binds");
    for algo in [ConvAlgoChoice::Direct, ConvAlgoChoice::Winograd] {
        let model = CompiledGraph::with_conv_algo(&graph, &params, algo).expect("compiles");
        let mut want = WeightBytes::default();
        let mut convs = 0;
        for (_, key) in model.keys(&bindings).expect("keys") {
            let PrimitiveKey::Conv(d) = key else {
                continue;
            };
            let [oc, icg, kh, kw] = d.weight_shape();
            let bias = d.bias.then(|| vec![0.0; oc]);
            let packed = d.pack_weights(&vec![0.0; oc * icg * kh * kw], bias.as_deref(), None);
            let bytes = std::mem::size_of_val(packed.as_slice());
            match d.algo {
                primjit_codegen::ConvAlgo::Direct => want.direct += bytes,
                primjit_codegen::ConvAlgo::WinogradF4x3 => want.winograd += bytes,
            }
            convs += 1;
        }
        // The input's batch-norm and the two convs with their folds.
        assert_eq!(convs, 3, "{algo}");
        assert_eq!(model.weight_bytes(), want, "{algo}");
        match algo {
            ConvAlgoChoice::Winograd => assert!(want.winograd > 0),
            _ => assert_eq!(want.winograd, 0),
        }
    }
}
