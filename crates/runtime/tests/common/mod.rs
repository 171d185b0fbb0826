//! What the kernel test files share: the engine they compile with, the thread pools of the
//! partitioning checks, the destination sentinel and the SplitMix64 step of their data.

// Each test file uses its own part of this module.
#![allow(dead_code)]

use std::sync::OnceLock;

use primjit_codegen::CodegenOptions;
use primjit_runtime::{Engine, EngineConfig};

/// What an unwritten destination element holds: a NaN with a recognizable payload.
pub const SENTINEL: u32 = 0x7fc0_dead;

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
