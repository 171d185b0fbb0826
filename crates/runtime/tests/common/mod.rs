//! What the kernel test files share: the engine they compile with, the vector tiers they
//! draw, the runtime extents they leave, the thread pools of the partitioning checks, the
//! destination sentinel, the SplitMix64 step of their data, and a run of a blocked kernel
//! checked across thread counts.

// Each test file uses its own part of this module.
#![allow(dead_code)]

use std::sync::OnceLock;

use primjit_codegen::key::RuntimeDims;
use primjit_codegen::{CallExtents, CodegenOptions, Isa, Layout};
use primjit_reference::Tensor;
use primjit_runtime::exec::GuardedBuffer;
use primjit_runtime::layout::{to_blocked, to_nchw};
use primjit_runtime::{Engine, EngineConfig, ExecArgs, Primitive};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

/// Which extents a runtime-extent property leaves to run time: the width most often, as the
/// `dynamic` policy's variable-width inputs do.
pub fn runtime_dims() -> impl Strategy<Value = RuntimeDims> {
    prop_oneof![
        3 => Just(RuntimeDims { h: false, w: true }),
        1 => Just(RuntimeDims { h: true, w: false }),
        1 => Just(RuntimeDims { h: true, w: true }),
    ]
}

/// What an unwritten destination element holds: a NaN with a recognizable payload.
pub const SENTINEL: u32 = 0x7fc0_dead;

/// The vector tiers this host runs, which the tier-drawing tests draw from. The first call in a
/// test binary names each tier the host lacks on stderr, written past the test harness's
/// capture (which takes only `eprintln!`): on a narrower host those cases are skipped, not
/// passed, and the run says so.
pub fn host_tiers() -> Vec<Isa> {
    use std::io::Write;
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        let lacking: Vec<&str> = Isa::ALL
            .into_iter()
            .filter(|&t| t > Isa::host())
            .map(Isa::name)
            .collect();
        if !lacking.is_empty() {
            let runs: Vec<&str> = Isa::host_tiers().iter().map(|t| t.name()).collect();
            let _ = writeln!(
                std::io::stderr(),
                "skipped: the {} cases of this binary's tier-drawing tests: this host runs {} \
                 (their code is emitted and decoded in primjit-codegen's tests/tiers.rs)",
                lacking.join(" and "),
                runs.join(", ")
            );
        }
    });
    Isa::host_tiers()
}

/// One engine for the whole test binary: one thread (the pools below run the parallel
/// checks), Cranelift's verifier on.
pub fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        Engine::new(EngineConfig {
            threads: 1,
            codegen: CodegenOptions {
                verify: true,
                ..CodegenOptions::default()
            },
            ..EngineConfig::default()
        })
        .expect("engine")
    })
}

/// Rayon pools of two and three threads for the partitioning checks.
pub fn pools() -> &'static [rayon::ThreadPool; 2] {
    static POOLS: OnceLock<[rayon::ThreadPool; 2]> = OnceLock::new();
    POOLS.get_or_init(|| {
        let pool = |n| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .build()
                .expect("thread pool")
        };
        [pool(2), pool(3)]
    })
}

/// One step of SplitMix64 on `state`: deterministic test data from a seed.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Runs `once` on one thread (`None`) and on each of [`pools`], checks the runs agree to the
/// bit, and returns the one-thread result.
pub fn on_every_pool(
    p: &Primitive,
    once: impl Fn(Option<&rayon::ThreadPool>) -> Result<Vec<f32>, TestCaseError>,
) -> Result<Vec<f32>, TestCaseError> {
    let single = once(None)?;
    for pool in pools() {
        let parallel = once(Some(pool))?;
        let same = single
            .iter()
            .zip(&parallel)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        prop_assert!(
            same,
            "{} on {} threads differs",
            p.key(),
            pool.current_num_threads()
        );
    }
    Ok(single)
}

/// Runs `p` on `x` blocked (with `packed` weights, at input `extents` when it has runtime
/// extents) into a guard-page destination filled with the sentinel, on one thread and on
/// pools of two and three; checks the three agree to the bit and that the padding lanes of a
/// last, partial block are zero (the source's are), and returns the destination in NCHW.
pub fn run_blocked(
    p: &Primitive,
    x: &Tensor,
    packed: Option<&[f32]>,
    extents: Option<impl Into<CallExtents> + Copy>,
    dst_shape: [usize; 4],
) -> Result<Vec<f32>, TestCaseError> {
    let s: [usize; 4] = x.shape.clone().try_into().expect("rank 4");
    let src = GuardedBuffer::from_slice(&to_blocked(&x.data, s)).expect("a guarded buffer");
    let weights = packed.map(|w| GuardedBuffer::from_slice(w).expect("a guarded buffer"));
    let once = |pool: Option<&rayon::ThreadPool>| -> Result<Vec<f32>, TestCaseError> {
        let mut dst = GuardedBuffer::new(Layout::Nchw4c.buffer_len(dst_shape)).expect("a buffer");
        dst.as_mut_slice().fill(f32::from_bits(SENTINEL));
        let args = ExecArgs {
            src: src.as_slice(),
            weights: weights.as_ref().map(|w| w.as_slice()),
            dst: dst.as_mut_slice(),
            extra: &[],
            scratch: None,
        };
        match (pool, extents) {
            (Some(pool), e) => p.execute_parallel(args, e.map(Into::into), pool),
            (None, Some(e)) => p.execute_at(args, e),
            (None, None) => p.execute(args),
        }
        .map_err(|e| TestCaseError::fail(format!("{}: {e}", p.key())))?;
        Ok(dst.as_slice().to_vec())
    };
    let single = on_every_pool(p, once)?;
    let [n, c, h, w] = dst_shape;
    let blocks = c.div_ceil(4);
    for i in 0..n * blocks * h * w {
        for lane in 0..4 {
            if (i / (h * w)) % blocks == blocks - 1 && (blocks - 1) * 4 + lane >= c {
                prop_assert_eq!(
                    single[i * 4 + lane].to_bits(),
                    0,
                    "{}: padding lane",
                    p.key()
                );
            }
        }
    }
    Ok(to_nchw(&single, dst_shape))
}
