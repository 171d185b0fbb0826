//! Concurrent graph runs: several threads calling one model, or several models of one engine,
//! get the same outputs to the bit as the same calls made one after the other, on engines of
//! one and two threads, streamed and whole; and they all complete (a deadlock fails the test
//! after two minutes instead of hanging it).

use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use primjit_codegen::ConvAlgoChoice;
use primjit_ir::{Params, Tensor, parse, random_tensor};
use primjit_runtime::{CompiledGraph, Engine, EngineConfig, ShapeMode, Streaming, Workspace};

/// A small trunk: a stride-2 stem with a fused max pool, a residual block (Winograd under
/// `auto`), a stride-2 block with a 1x1 downsample, and global pooling at the end.
const TRUNK: &str = "
graph small_trunk {
  input %x: f32[1, 3, 24, W]
  param @stem.weight: f32[16, 3, 7, 7]
  param @stem.bias: f32[16]
  param @a1.weight: f32[16, 16, 3, 3]
  param @a2.weight: f32[16, 16, 3, 3]
  param @b1.weight: f32[32, 16, 3, 3]
  param @bd.weight: f32[32, 16, 1, 1]
  param @b2.weight: f32[32, 32, 3, 3]
  %stem = conv2d(%x, @stem.weight, bias=@stem.bias, strides=[2, 2], pads=[3, 3, 3, 3], post=[relu, maxpool(kernel=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])])
  %a1 = conv2d(%stem, @a1.weight, pads=[1, 1, 1, 1], post=[relu])
  %a2 = conv2d(%a1, @a2.weight, pads=[1, 1, 1, 1], post=[add(%stem), relu])
  %b1 = conv2d(%a2, @b1.weight, strides=[2, 2], pads=[1, 1, 1, 1], post=[relu])
  %bd = conv2d(%a2, @bd.weight, strides=[2, 2])
  %b2 = conv2d(%b1, @b2.weight, pads=[1, 1, 1, 1], post=[add(%bd), clip(0, 6)])
  %g = global_avgpool(%b2)
  output y = %b2
  output g = %g
}
";

/// The widths each thread runs, narrower and wider than the streamed models' bands.
const WIDTHS: [usize; 6] = [5, 33, 64, 97, 130, 203];

/// The threads calling at once.
const CALLERS: usize = 3;

/// Rounds of [`WIDTHS`] per caller.
const ROUNDS: usize = 3;

fn engine(threads: usize) -> Engine {
    Engine::new(EngineConfig {
        threads,
        ..EngineConfig::default()
    })
    .expect("engine")
}

/// The trunk with `algo`'s kernels, runtime widths and bands of 8 columns at every width
/// (`streamed`), or exact widths and whole tensors.
fn model(algo: ConvAlgoChoice, streamed: bool, seed: u64) -> CompiledGraph {
    let graph = parse(TRUNK).expect("parses");
    let model = CompiledGraph::with_conv_algo(&graph, &Params::random(&graph, seed), algo)
        .expect("prepares");
    if streamed {
        model
            .with_mode(ShapeMode::Runtime)
            .with_streaming(Streaming::with_band(8).expect("a multiple of 4").above(0))
    } else {
        model.with_streaming(Streaming::OFF)
    }
}

fn input(w: usize) -> Tensor {
    random_tensor(w as u64 + 7, "x", vec![1, 3, 24, w], -1.0, 1.0)
}

/// Every output's bits, in order.
fn run_bits(model: &CompiledGraph, engine: &Engine, w: usize, ws: &mut Workspace) -> Vec<u32> {
    let (outputs, _) = model
        .run(engine, &[("x", &input(w))], ws)
        .unwrap_or_else(|e| panic!("W={w}: {e}"));
    outputs
        .iter()
        .flat_map(|(_, t)| t.data.iter().map(|x| x.to_bits()))
        .collect()
}

/// Each model's outputs at every width, the calls made one after the other.
fn sequential(models: &[Arc<CompiledGraph>], engine: &Engine) -> Vec<Vec<Vec<u32>>> {
    let mut ws = Workspace::new();
    models
        .iter()
        .map(|m| {
            WIDTHS
                .iter()
                .map(|&w| run_bits(m, engine, w, &mut ws))
                .collect()
        })
        .collect()
}

/// [`CALLERS`] threads call the models at once, caller `i` the model `i % models.len()` first
/// and then the others in turn, each width of each round in its own order, on a workspace of
/// its own; every output must equal `expected`'s to the bit, and every caller must finish
/// within two minutes.
fn call_at_once(models: &[Arc<CompiledGraph>], engine: &Arc<Engine>, label: &str) {
    let expected = Arc::new(sequential(models, engine));
    let (sender, finished) = mpsc::channel();
    for caller in 0..CALLERS {
        let (models, engine, expected, sender) = (
            models.to_vec(),
            Arc::clone(engine),
            Arc::clone(&expected),
            sender.clone(),
        );
        std::thread::spawn(move || {
            let mut ws = Workspace::new();
            let mut calls = 0;
            for round in 0..ROUNDS {
                for step in 0..WIDTHS.len() {
                    let m = (caller + step) % models.len();
                    let i = (step * (caller + 1) + round) % WIDTHS.len();
                    let got = run_bits(&models[m], &engine, WIDTHS[i], &mut ws);
                    if got != expected[m][i] {
                        let _ = sender.send(Err(format!(
                            "caller {caller}, model {m}, W={}: outputs differ from the \
                             sequential run's",
                            WIDTHS[i]
                        )));
                        return;
                    }
                    calls += 1;
                }
            }
            let _ = sender.send(Ok(calls));
        });
    }
    // A caller that panics drops its sender: the wait then ends at once.
    drop(sender);
    for _ in 0..CALLERS {
        let calls = finished
            .recv_timeout(Duration::from_secs(120))
            .unwrap_or_else(|e| panic!("{label}: a caller did not finish: {e}"))
            .unwrap_or_else(|e| panic!("{label}: {e}"));
        assert_eq!(calls, ROUNDS * WIDTHS.len(), "{label}");
    }
}

#[test]
fn concurrent_calls_on_one_model_equal_sequential_calls() {
    for threads in [1, 2] {
        for (algo, streamed) in [
            (ConvAlgoChoice::Auto, true),
            (ConvAlgoChoice::Direct, false),
        ] {
            let engine = Arc::new(engine(threads));
            let models = [Arc::new(model(algo, streamed, 3))];
            call_at_once(
                &models,
                &engine,
                &format!("{threads} threads, {algo:?}, streamed {streamed}"),
            );
        }
    }
}

#[test]
fn concurrent_calls_on_two_models_of_one_engine_equal_sequential_calls() {
    for threads in [1, 2] {
        let engine = Arc::new(engine(threads));
        let models = [
            Arc::new(model(ConvAlgoChoice::Auto, true, 3)),
            Arc::new(model(ConvAlgoChoice::Direct, false, 4)),
        ];
        call_at_once(&models, &engine, &format!("{threads} threads, two models"));
    }
}
