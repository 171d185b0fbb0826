//! Compile time of every distinct convolution primitive of the ResNet34 trunk at W=1031 (the
//! workload's mean width): validation, lowering to Cranelift IR and Cranelift's compilation to
//! machine code, without placing the bytes in pages (`primjit::codegen::compile`).
//!
//! Each bench is named after the first node of the optimized trunk whose key it is, e.g.
//! `compile/W=1031/layer2.0.conv1`; later nodes with the same key (`layer1.1.conv1`, ...) share
//! it. Run with `cargo bench -p primjit-cli --bench compile`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use primjit::PrimitiveKey;
use primjit::codegen::{CodegenOptions, Dumps, compile};
use primjit_cli::workload::TRUNK_IR;

const DIMS: &str = "W=1031";

/// The distinct convolution keys of the optimized trunk at `dims`, each with the name of the
/// first node that uses it, in graph order.
fn distinct_conv_keys(dims: &str) -> Vec<(String, PrimitiveKey)> {
    let mut graph = primjit::ir::parse(TRUNK_IR).expect("the trunk parses");
    primjit::ir::passes::optimize(&mut graph);
    let bindings = primjit::ir::parse_bindings(dims).expect("valid dims");
    let mut out: Vec<(String, PrimitiveKey)> = Vec::new();
    for (name, key) in primjit::node_keys(&graph, &bindings).expect("keys of the trunk") {
        if matches!(key, PrimitiveKey::Conv(_)) && !out.iter().any(|(_, k)| *k == key) {
            out.push((name, key));
        }
    }
    out
}

fn bench_compile(c: &mut Criterion) {
    let keys = distinct_conv_keys(DIMS);
    assert!(
        keys.len() > 5,
        "the trunk has a dozen distinct convolutions"
    );
    let mut group = c.benchmark_group(format!("compile/{DIMS}"));
    for (name, key) in &keys {
        group.bench_function(name.as_str(), |b| {
            b.iter(|| {
                compile(black_box(key), CodegenOptions::default(), Dumps::default())
                    .expect("the trunk's keys compile")
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = bench_compile
}
criterion_main!(benches);
