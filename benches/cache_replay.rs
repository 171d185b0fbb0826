//! A small replay of the variable-width workload through the byte-budgeted cache: the ResNet34
//! trunk on the first widths of `benches/data/widths.txt` (921, 2064, 200, 200, 200), in call
//! order, once per iteration, with cache budgets of
//! - 0: no caching, every call compiles every primitive;
//! - 256 KiB: less than the 36 distinct primitives of these widths (~440 KB), so
//!   least-recently-used eviction has each width push out the others' primitives: every
//!   iteration recompiles all 36, and only the repeated 200s hit;
//! - 1 MiB: holds them all, so after the first iteration it behaves as
//! - unlimited: every lookup hits.
//!
//! The cache's counters of each budget are printed on stderr after its bench.
//!
//! One engine per budget lives across iterations, as a server's would; parameters, the compiled
//! graph and the zero inputs are prepared outside the timed closure. Slow: each iteration runs
//! the trunk several times (a few seconds per iteration, at least ten iterations per budget).
//! Run with `cargo bench -p primjit-cli --bench cache_replay`.

use std::time::Duration;

use criterion::{Criterion, SamplingMode, criterion_group, criterion_main};
use primjit::{
    Budget, CacheConfig, CompiledGraph, Engine, EngineConfig, Params, Tensor, Workspace,
};

use primjit_cli::workload::{self, TRUNK_IR};

const CALLS: usize = 5;

/// The first `n` widths of the shipped workload.
fn first_widths(n: usize) -> Vec<usize> {
    let mut widths = workload::load_widths(None).expect("the shipped widths parse");
    widths.truncate(n);
    widths
}

fn bench_cache_replay(c: &mut Criterion) {
    let graph = primjit::ir::parse(TRUNK_IR).expect("the trunk parses");
    let params = Params::random(&graph, 0);
    let model = CompiledGraph::new(&graph, &params).expect("the trunk compiles");
    let inputs: Vec<Tensor> = first_widths(CALLS)
        .into_iter()
        .map(|w| Tensor::zeros(vec![1, 3, 320, w]))
        .collect();
    assert_eq!(inputs.len(), CALLS);

    let mut group = c.benchmark_group(format!("cache_replay/{CALLS}_calls"));
    group.sampling_mode(SamplingMode::Flat);
    for budget in [
        Budget::Bytes(0),
        Budget::Bytes(256 << 10),
        Budget::Bytes(1 << 20),
        Budget::Unlimited,
    ] {
        let engine = Engine::new(EngineConfig {
            cache: CacheConfig {
                budget,
                capacity: None,
            },
            ..EngineConfig::default()
        })
        .expect("an engine");
        let mut workspace = Workspace::new();
        group.bench_function(format!("budget={budget}"), |b| {
            b.iter(|| {
                for x in &inputs {
                    let (outputs, _) = model
                        .run(&engine, &[("x", x)], &mut workspace)
                        .expect("the trunk runs");
                    drop(outputs);
                }
            })
        });
        let stats = engine.cache().stats();
        eprintln!(
            "budget={budget}: {} compiles, {} hits, {} evictions, {} bytes cached",
            stats.compiles, stats.hits, stats.evictions, stats.bytes
        );
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(30));
    targets = bench_cache_replay
}
criterion_main!(benches);
