//! Structured kernels: a small op built from arbitrary bytes (conv with groups, dilations,
//! pads and post-ops, max and average pooling, global pooling, relu, add; NCHW and nChw4c) is
//! compiled and executed on buffers that end at a `PROT_NONE` guard page, then compared with
//! the reference interpreter.
//!
//! Checked: an invalid key is an `InvalidKey` error from the engine, never a panic; a valid
//! key compiles; its result is within the tolerance of `crates/runtime/tests/kernels.rs`;
//! every destination element is written (padding lanes included: the graph executor reuses
//! buffers without clearing them); the multi-threaded run is bit-identical to the
//! single-threaded one; garbage in the nChw4c padding lanes of the inputs changes no real
//! output.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use primjit::{
    Budget, CacheConfig, CodegenError, CodegenOptions, Engine, EngineConfig, ExecArgs,
    GuardedBuffer, Layout, Primitive, PrimitiveKey, RuntimeError,
};
use primjit_fuzz::{OpSpec, Problem, from_layout};

/// What an unwritten destination element holds: a NaN with a recognizable payload.
const SENTINEL: u32 = 0x7fc0_dead;

/// One engine for the whole run, with a small budget so that the cache evicts as it goes,
/// the IR verifier on, and three threads for the parallel run.
fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        Engine::new(EngineConfig {
            cache: CacheConfig {
                budget: Budget::Bytes(1 << 20),
                capacity: None,
            },
            threads: 3,
            codegen: CodegenOptions {
                verify: true,
                ..CodegenOptions::default()
            },
            ..EngineConfig::default()
        })
        .expect("engine")
    })
}

fn guarded(data: &[f32]) -> GuardedBuffer {
    GuardedBuffer::from_slice(data).expect("map a guarded buffer")
}

/// Sets the nChw4c padding lanes of `buf` (a tensor of `shape`) to large finite garbage.
fn garbage_lanes(buf: &mut [f32], layout: Layout, [_, c, h, w]: [usize; 4]) {
    if layout != Layout::Nchw4c {
        return;
    }
    for (i, v) in buf.iter_mut().enumerate() {
        let channel = i / (4 * h * w) % c.div_ceil(4) * 4 + i % 4;
        if channel >= c {
            *v = 1000.0 + (i % 7) as f32;
        }
    }
}

/// Runs `p` on guarded copies of the problem's buffers into a sentinel-filled guarded
/// destination; on the engine's threads when `parallel`. Returns the raw destination.
fn execute(
    p: &Primitive,
    src: &[f32],
    weights: Option<&[f32]>,
    extra: &[Vec<f32>],
    dst_len: usize,
    parallel: bool,
) -> Vec<f32> {
    let src = guarded(src);
    let weights = weights.map(guarded);
    let extra: Vec<GuardedBuffer> = extra.iter().map(|e| guarded(e)).collect();
    let extra_slices: Vec<&[f32]> = extra.iter().map(|e| e.as_slice()).collect();
    let mut dst = GuardedBuffer::new(dst_len).expect("map a guarded buffer");
    dst.as_mut_slice().fill(f32::from_bits(SENTINEL));
    let args = ExecArgs {
        src: src.as_slice(),
        weights: weights.as_ref().map(|w| w.as_slice()),
        dst: dst.as_mut_slice(),
        extra: &extra_slices,
        // The fuzzed keys have no fused pool; the kernel tests cover it.
        scratch: None,
    };
    let result = if parallel {
        engine().execute(p, args)
    } else {
        p.execute(args).map_err(RuntimeError::from)
    };
    if let Err(e) = result {
        panic!("{}: execution failed: {e}", p.key());
    }
    dst.as_slice().to_vec()
}

fuzz_target!(|spec: OpSpec| {
    let key = spec.key();
    let engine = engine();
    if let Err(invalid) = key.validate() {
        match engine.compile(&key) {
            Err(RuntimeError::Codegen(CodegenError::InvalidKey(e))) => assert_eq!(e, invalid),
            other => panic!("{key} is invalid ({invalid}) but compile gave {other:?}"),
        }
        return;
    }
    let p = match engine.compile(&key) {
        Ok(p) => p,
        Err(e) => panic!("{key} is valid but does not compile: {e}"),
    };
    assert_eq!(p.key(), &key);
    let problem = Problem::new(&key, spec.seed);
    let dst_len = problem.dst_layout.buffer_len(problem.dst_shape);
    let weights = problem.weights.as_deref();

    let single = execute(&p, &problem.src, weights, &problem.extra, dst_len, false);
    if let Some(i) = single.iter().position(|v| v.to_bits() == SENTINEL) {
        panic!("{key}: destination element {i} of {dst_len} is never written");
    }
    let got = from_layout(&single, problem.dst_layout, problem.dst_shape);
    if let Err(e) = problem.check(&got) {
        panic!("{e}");
    }

    let parallel = execute(&p, &problem.src, weights, &problem.extra, dst_len, true);
    if let Some(i) = (0..dst_len).find(|&i| single[i].to_bits() != parallel[i].to_bits()) {
        panic!(
            "{key}: element {i} is {:?} on {} threads, {:?} on one",
            parallel[i],
            engine.threads(),
            single[i]
        );
    }

    // Padding lanes are scratch: garbage there must not reach a real output.
    let (src_layout, src_shape) = match &key {
        PrimitiveKey::Conv(d) => (d.src_layout, d.src_shape()),
        PrimitiveKey::Pool(d) => (d.src_layout, d.src_shape()),
        PrimitiveKey::GlobalPool(d) => (d.src_layout, [d.mb, d.c, d.ih, d.iw]),
        PrimitiveKey::Eltwise(d) => (d.layout, d.shape),
        PrimitiveKey::Concat(_)
        | PrimitiveKey::SelectChannels(_)
        | PrimitiveKey::Resize(_)
        | PrimitiveKey::ConvTranspose(_)
        | PrimitiveKey::FmaPeak(_)
        | PrimitiveKey::WidePeak { .. } => unreachable!("not generated"),
    };
    let dirty_input = src_layout == Layout::Nchw4c
        || (problem.dst_layout == Layout::Nchw4c && !problem.extra.is_empty());
    if dirty_input {
        let mut src = problem.src.clone();
        garbage_lanes(&mut src, src_layout, src_shape);
        let mut extra = problem.extra.clone();
        for e in &mut extra {
            // Residuals and a second source have the destination's (or the source's) shape
            // and layout.
            match &key {
                PrimitiveKey::Eltwise(d) => garbage_lanes(e, d.layout, d.shape),
                _ => garbage_lanes(e, problem.dst_layout, problem.dst_shape),
            }
        }
        let dirty = execute(&p, &src, weights, &extra, dst_len, false);
        let dirty = from_layout(&dirty, problem.dst_layout, problem.dst_shape);
        if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != dirty[i].to_bits()) {
            panic!(
                "{key}: padding-lane garbage changed output {i} from {:?} to {:?}",
                got[i], dirty[i]
            );
        }
    }
});
