//! Execution time of every layer (node) of the optimized ResNet34 trunk, one primitive at a
//! time on one thread, at W=320 and at W=1031 (the workload's mean width).
//!
//! Everything is prepared outside the timed closure: the engine (one thread, an unlimited
//! cache), each node's primitive, a random source, the packed weights of convolutions
//! (`ConvPlan::pack_weights` of random OIHW weights and bias), the destination and, for
//! convolutions with an `add` post-op, the residual. Only `Engine::execute` is timed.
//!
//! Benches are grouped per width and named after the node: `layers/W=320/layer2.0.conv1`.
//! Run with `cargo bench -p primjit-cli --bench layers` (about two minutes: 60 benches, flat
//! sampling, no HTML plots, which would take longer than the measurements; add
//! `-- --plotting-backend plotters` for them).

use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, SamplingMode, criterion_group, criterion_main};
use primjit::ir::random_tensor;
use primjit::{
    Budget, CacheConfig, ConvPlan, Engine, EngineConfig, ExecArgs, Primitive, PrimitiveKey,
};
use primjit_cli::workload::TRUNK_IR;

const WIDTHS: [usize; 2] = [320, 1031];

/// One node ready to run: its primitive and every buffer it takes.
struct Layer {
    name: String,
    primitive: Arc<Primitive>,
    src: Vec<f32>,
    weights: Option<Vec<f32>>,
    dst: Vec<f32>,
    extra: Vec<Vec<f32>>,
}

fn random(len: usize, seed: u64, role: &str) -> Vec<f32> {
    random_tensor(seed, role, vec![len], -1.0, 1.0).data
}

fn prepare(engine: &Engine, width: usize) -> Vec<Layer> {
    let mut graph = primjit::ir::parse(TRUNK_IR).expect("the trunk parses");
    primjit::ir::passes::optimize(&mut graph);
    let bindings = primjit::ir::parse_bindings(&format!("W={width}")).expect("valid dims");
    let keys = primjit::node_keys(&graph, &bindings).expect("keys of the trunk");
    keys.into_iter()
        .enumerate()
        .map(|(i, (name, key))| {
            let seed = i as u64;
            let primitive = engine.compile(&key).expect("the trunk's keys compile");
            let buffers = key.buffers();
            let weights = match &key {
                PrimitiveKey::Conv(d) => {
                    let w = random(d.weight_shape().iter().product(), seed, "weights");
                    let bias = d.bias.then(|| random(d.oc, seed, "bias"));
                    Some(ConvPlan::new(d).pack_weights(&w, bias.as_deref(), None))
                }
                _ => None,
            };
            let len = |role: &str| {
                buffers
                    .iter()
                    .find(|b| b.role == role)
                    .unwrap_or_else(|| panic!("{key} has a {role} buffer"))
                    .len
            };
            let extra = buffers
                .iter()
                .filter(|b| matches!(b.role, "residual" | "src2"))
                .map(|b| random(b.len, seed, b.role))
                .collect();
            Layer {
                name,
                primitive,
                src: random(buffers[0].len, seed, "src"),
                weights,
                dst: vec![0.0; len("dst")],
                extra,
            }
        })
        .collect()
}

fn bench_layers(c: &mut Criterion) {
    let engine = Engine::new(EngineConfig {
        threads: 1,
        cache: CacheConfig {
            budget: Budget::Unlimited,
            capacity: None,
        },
        ..EngineConfig::default()
    })
    .expect("an engine");
    for width in WIDTHS {
        let mut layers = prepare(&engine, width);
        let mut group = c.benchmark_group(format!("layers/W={width}"));
        // The slowest layers take tens of milliseconds: the same number of executions per
        // sample keeps the whole file to a few minutes.
        group.sampling_mode(SamplingMode::Flat);
        for layer in &mut layers {
            let extra: Vec<&[f32]> = layer.extra.iter().map(Vec::as_slice).collect();
            let (primitive, src, weights) =
                (&layer.primitive, &layer.src, layer.weights.as_deref());
            let dst = &mut layer.dst;
            group.bench_function(layer.name.as_str(), |b| {
                b.iter(|| {
                    engine
                        .execute(
                            primitive,
                            ExecArgs {
                                src,
                                weights,
                                dst: &mut *dst,
                                extra: &extra,
                                scratch: None,
                            },
                        )
                        .expect("buffers match the key")
                })
            });
        }
        group.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_secs(1))
        .without_plots();
    targets = bench_layers
}
criterion_main!(benches);
