//! Memory accounting against the process's own mappings (`/proc/self/maps`, Linux only).
//!
//! Every primitive owns exactly one read+execute mapping of `memory().mapped` bytes, so the
//! executable bytes of the process grow by exactly the mapped bytes of the primitives alive
//! (in the cache or held by callers) and shrink back when they are gone. No mapping may ever be
//! writable and executable at once.
//!
//! The tests of this file run in one process and would see each other's mappings: each takes
//! [`serial`] first. (Other test files are other processes.)
#![cfg(target_os = "linux")]

use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use memmap2::MmapMut;
use primjit_codegen::key::RuntimeDims;
use primjit_codegen::{
    ConvDesc, EltwiseDesc, EltwiseKind, GlobalPoolDesc, Isa, Layout, PrimitiveKey,
};
use primjit_ir::{Pads, PoolKind};
use primjit_runtime::exec::{PageSource, page_size};
use primjit_runtime::{
    Budget, CacheConfig, Engine, EngineConfig, ExecArgs, Primitive, RuntimeError,
};

// ---------------------------------------------------------------------------------------------
// /proc/self/maps.
// ---------------------------------------------------------------------------------------------

/// One line of `/proc/self/maps`.
struct Mapping {
    start: usize,
    end: usize,
    perms: String,
    line: String,
}

fn mappings() -> Vec<Mapping> {
    let text = std::fs::read_to_string("/proc/self/maps").expect("read /proc/self/maps");
    text.lines()
        .map(|line| {
            let mut fields = line.split_whitespace();
            let range = fields.next().expect("address range");
            let perms = fields.next().expect("permissions").to_string();
            let (start, end) = range.split_once('-').expect("start-end");
            Mapping {
                start: usize::from_str_radix(start, 16).expect("hex start"),
                end: usize::from_str_radix(end, 16).expect("hex end"),
                perms,
                line: line.to_string(),
            }
        })
        .collect()
}

/// The total size of the executable mappings of the process.
fn exec_bytes() -> usize {
    exec_bytes_of(&mappings())
}

fn exec_bytes_of(maps: &[Mapping]) -> usize {
    maps.iter()
        .filter(|m| m.perms.contains('x'))
        .map(|m| m.end - m.start)
        .sum()
}

/// The number of executable mappings of the process (adjacent ones with equal permissions may
/// be listed merged, so only a return to a baseline is meaningful, not each step).
fn exec_count() -> usize {
    mappings().iter().filter(|m| m.perms.contains('x')).count()
}

/// The mappings that are writable and executable at once.
fn wx_mappings(maps: &[Mapping]) -> Vec<String> {
    maps.iter()
        .filter(|m| m.perms.contains('w') && m.perms.contains('x'))
        .map(|m| m.line.clone())
        .collect()
}

fn assert_no_wx() {
    let wx = wx_mappings(&mappings());
    assert!(wx.is_empty(), "writable and executable mappings: {wx:#?}");
}

/// Checks that the primitive's pages are one read+execute (never writable) mapping, as listed
/// by the kernel (adjacent mappings with equal permissions may be listed merged).
fn assert_mapped_rx(p: &Primitive, maps: &[Mapping]) {
    let range = p.code_range();
    assert_eq!(range.len(), p.memory().mapped);
    let m = maps
        .iter()
        .find(|m| m.start <= range.start && range.end <= m.end)
        .unwrap_or_else(|| panic!("{}: {range:x?} is not mapped", p.key()));
    assert!(m.perms.starts_with("r-x"), "{}: {}", p.key(), m.line);
}

/// Serializes the tests of this file: they all measure the one address space.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    // A failed test poisons the lock; the others still measure correctly.
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// The executable bytes before a test, after everything a first compile loads lazily (the host
/// ISA, thread pools) is in place.
fn baseline() -> usize {
    {
        let warm = engine(Budget::Bytes(0));
        let p = warm.compile(&relu(1, 1, 1)).unwrap();
        run_relu(&warm, &p, 0);
    }
    assert_no_wx();
    exec_bytes()
}

// ---------------------------------------------------------------------------------------------
// Keys, engines, executions.
// ---------------------------------------------------------------------------------------------

fn relu(c: usize, h: usize, w: usize) -> PrimitiveKey {
    PrimitiveKey::Eltwise(EltwiseDesc {
        kind: EltwiseKind::Relu,
        shape: [1, c, h, w],
        layout: Layout::Nchw,
        isa: Isa::X128,
        runtime: RuntimeDims::NONE,
    })
}

fn engine(budget: Budget) -> Engine {
    Engine::new(EngineConfig {
        cache: CacheConfig {
            budget,
            capacity: None,
        },
        threads: 1,
        ..EngineConfig::default()
    })
    .expect("engine")
}

/// Runs a relu primitive and checks every element.
fn run_relu(engine: &Engine, p: &Primitive, salt: usize) {
    let PrimitiveKey::Eltwise(d) = p.key() else {
        panic!("not an eltwise key: {}", p.key());
    };
    let n = d.layout.buffer_len(d.shape);
    let src: Vec<f32> = (0..n).map(|i| ((i * 5 + salt) % 19) as f32 - 9.5).collect();
    let mut dst = vec![f32::NAN; n];
    engine
        .execute(
            p,
            ExecArgs {
                src: &src,
                weights: None,
                dst: &mut dst,
                extra: &[],
                scratch: None,
            },
        )
        .expect("execute");
    let want: Vec<f32> = src.iter().map(|x| x.max(0.0)).collect();
    assert_eq!(dst, want, "{}", p.key());
}

/// The mapped bytes of the primitives only the caller holds (the cache's own are in its
/// statistics): a handle whose `Arc` has no other owner is not in the cache.
fn mapped_held_outside_cache(held: &[Arc<Primitive>]) -> usize {
    held.iter()
        .filter(|p| Arc::strong_count(p) == 1)
        .map(|p| p.memory().mapped)
        .sum()
}

/// A page source that fails while `fail` is positive and counts its calls.
#[derive(Clone)]
struct FaultyPages {
    fail: Arc<AtomicUsize>,
    calls: Arc<AtomicUsize>,
}

impl FaultyPages {
    fn new(fail: usize) -> FaultyPages {
        FaultyPages {
            fail: Arc::new(AtomicUsize::new(fail)),
            calls: Arc::new(AtomicUsize::new(0)),
        }
    }
}

impl PageSource for FaultyPages {
    fn map(&self, len: usize) -> io::Result<MmapMut> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self
            .fail
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(io::Error::other("injected: out of map areas"));
        }
        MmapMut::map_anon(len)
    }
}

fn faulty_engine(budget: Budget, pages: &FaultyPages) -> Engine {
    Engine::with_pages(
        EngineConfig {
            cache: CacheConfig {
                budget,
                capacity: None,
            },
            threads: 1,
            ..EngineConfig::default()
        },
        Box::new(pages.clone()),
    )
    .expect("engine")
}

// ---------------------------------------------------------------------------------------------
// Tests.
// ---------------------------------------------------------------------------------------------

#[test]
fn executable_bytes_grow_by_exactly_the_mapped_bytes() {
    let _serial = serial();
    let base = baseline();
    let engine = engine(Budget::Unlimited);
    let mut keys: Vec<PrimitiveKey> = (1..=12).map(|c| relu(c, 2, 3)).collect();
    // Larger kernels, some spanning several pages.
    for (ic, oc, hw, k, pad) in [(3, 4, 6, 3, 0), (5, 12, 11, 5, 2), (64, 64, 20, 3, 1)] {
        let mut d = ConvDesc::new(1, ic, [hw, hw], oc, [k, k]);
        d.pads = Pads::uniform(pad);
        keys.push(PrimitiveKey::Conv(d));
    }
    keys.push(PrimitiveKey::GlobalPool(GlobalPoolDesc {
        kind: PoolKind::Max,
        mb: 1,
        c: 6,
        ih: 3,
        iw: 3,
        src_layout: Layout::Nchw,
        dst_layout: Layout::Nchw,
        runtime: RuntimeDims::NONE,
        isa: Isa::X128,
    }));
    let mut held = Vec::new();
    let mut sum = 0;
    for key in &keys {
        let p = engine.compile(key).unwrap();
        assert_eq!(p.memory().mapped % page_size(), 0);
        sum += p.memory().mapped;
        held.push(p);
        assert_eq!(exec_bytes() - base, sum, "after {key}");
    }
    assert!(
        held.iter().any(|p| p.memory().mapped > page_size()),
        "expected a kernel of several pages"
    );
    let maps = mappings();
    assert_eq!(exec_bytes_of(&maps) - base, sum);
    assert!(wx_mappings(&maps).is_empty());
    for p in &held {
        assert_mapped_rx(p, &maps);
    }
    assert_eq!(engine.cache().stats().mapped_bytes, sum);

    // Hits map nothing.
    for key in &keys {
        engine.compile(key).unwrap();
    }
    assert_eq!(exec_bytes() - base, sum);

    // The cache's and the callers' references both keep pages alive; dropping both frees them.
    engine.cache().clear();
    assert_eq!(
        exec_bytes() - base,
        sum,
        "callers still hold every primitive"
    );
    held.truncate(4);
    let kept: usize = held.iter().map(|p| p.memory().mapped).sum();
    assert_eq!(exec_bytes() - base, kept);
    drop(held);
    assert_eq!(exec_bytes(), base);
    drop(engine);
    assert_eq!(exec_bytes(), base);
    assert_no_wx();
}

#[test]
fn cache_and_caller_bytes_account_for_the_growth_under_eviction() {
    let _serial = serial();
    let base = baseline();
    let probe = engine(Budget::Unlimited);
    let t = probe.compile(&relu(1, 1, 1)).unwrap().memory().total();
    drop(probe);
    assert_eq!(exec_bytes(), base);

    // Room for three small primitives; a few larger ones do not fit at all.
    let engine = engine(Budget::Bytes(3 * t));
    let mut keys: Vec<PrimitiveKey> = (1..=9).map(|c| relu(c, 3, 2)).collect();
    keys.push(PrimitiveKey::Conv(ConvDesc::new(1, 8, [6, 6], 16, [3, 3])));
    let mut held: Vec<Arc<Primitive>> = Vec::new();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    for step in 0..300 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let key = &keys[(rng >> 5) as usize % keys.len()];
        let p = engine.compile(key).unwrap();
        // Hold some handles (one per primitive), drop others now and then.
        if rng.is_multiple_of(4) && !held.iter().any(|h| Arc::ptr_eq(h, &p)) {
            held.push(p);
        } else {
            drop(p);
        }
        if rng.is_multiple_of(11) && !held.is_empty() {
            held.swap_remove((rng >> 20) as usize % held.len());
        }
        if step % 97 == 96 {
            engine.cache().clear();
        }
        let stats = engine.cache().stats();
        let growth = exec_bytes() - base;
        assert_eq!(
            growth,
            stats.mapped_bytes + mapped_held_outside_cache(&held),
            "step {step}: cache {stats:?}, {} handles",
            held.len()
        );
        assert!(stats.bytes <= 3 * t);
    }
    let stats = engine.cache().stats();
    assert!(stats.evictions > 50, "{stats:?}");
    assert!(stats.hits > 10, "{stats:?}");
    assert!(held.len() > 2, "the sequence should keep some handles");

    let maps = mappings();
    for p in &held {
        assert_mapped_rx(p, &maps);
    }
    assert!(wx_mappings(&maps).is_empty());

    engine.cache().clear();
    assert_eq!(engine.cache().stats().mapped_bytes, 0);
    assert_eq!(exec_bytes() - base, mapped_held_outside_cache(&held));
    drop(held);
    assert_eq!(exec_bytes(), base);
}

#[test]
fn ten_thousand_compile_evict_cycles_leave_nothing_behind() {
    let _serial = serial();
    let base = baseline();
    let base_count = exec_count();
    // Tiny eltwise kernels compile in well under a millisecond even in debug builds (the
    // tests' profile keeps opt-level 1): 10,000 cycles take a few seconds in both profiles.
    let cycles: usize = 10_000;

    // A watcher scans the mappings for W+X pages the whole time, so that a window in which
    // pages were writable and executable would be caught while it is open, not only at checks.
    let stop = AtomicBool::new(false);
    let scans = AtomicUsize::new(0);
    std::thread::scope(|s| {
        let watcher = s.spawn(|| {
            let mut seen = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                seen.extend(wx_mappings(&mappings()));
                scans.fetch_add(1, Ordering::SeqCst);
                std::thread::yield_now();
            }
            seen
        });

        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // Half the cycles with budget 0 (never kept: dropped right after use), half with a
            // budget of two entries and sixteen keys in turn (every compile evicts).
            let zero = engine(Budget::Bytes(0));
            let t = zero.compile(&relu(1, 1, 1)).unwrap().memory().total();
            let tiny = engine(Budget::Bytes(2 * t));
            let keys: Vec<PrimitiveKey> = (1..=16).map(|c| relu(c, 2, 2)).collect();
            let half = cycles / 2;
            for i in 0..cycles {
                let (engine, key) = if i < half {
                    (&zero, &keys[i % 3])
                } else {
                    (&tiny, &keys[i % keys.len()])
                };
                let p = engine.compile(key).unwrap();
                if i % 16 == 0 {
                    run_relu(engine, &p, i);
                }
                if i % 250 == 0 {
                    let maps = mappings();
                    let wx = wx_mappings(&maps);
                    assert!(wx.is_empty(), "cycle {i}: {wx:#?}");
                    assert_mapped_rx(&p, &maps);
                    let held = if Arc::strong_count(&p) == 1 {
                        p.memory().mapped
                    } else {
                        0
                    };
                    let cached =
                        zero.cache().stats().mapped_bytes + tiny.cache().stats().mapped_bytes;
                    assert_eq!(exec_bytes_of(&maps) - base, cached + held, "cycle {i}");
                }
            }
            let z = zero.cache().stats();
            assert_eq!(z.compiles, half as u64 + 1);
            assert_eq!((z.entries, z.mapped_bytes, z.hits), (0, 0, 0));
            let s = tiny.cache().stats();
            assert_eq!(s.compiles, (cycles - half) as u64, "every lookup missed");
            assert_eq!(s.entries, 2);
            assert_eq!(s.evictions, s.compiles - 2);
            assert_eq!(exec_bytes() - base, s.mapped_bytes);
            drop(tiny);
            assert_eq!(exec_bytes(), base, "dropping the engine frees its cache");
        }));
        stop.store(true, Ordering::SeqCst);
        let seen = watcher.join().unwrap();
        if let Err(panic) = result {
            std::panic::resume_unwind(panic);
        }
        assert!(seen.is_empty(), "W+X mappings observed: {seen:#?}");
        assert!(scans.load(Ordering::SeqCst) > 0);
    });
    assert_eq!(exec_bytes(), base);
    assert_eq!(
        exec_count(),
        base_count,
        "executable mappings after the churn"
    );
    assert_no_wx();
}

#[test]
fn always_failing_pages_give_a_typed_error_and_leak_nothing() {
    let _serial = serial();
    let base = baseline();
    let base_count = exec_count();
    let pages = FaultyPages::new(usize::MAX);
    let engine = faulty_engine(Budget::Unlimited, &pages);
    let key = relu(3, 3, 3);
    for attempt in 1..=3usize {
        let err = engine.compile(&key).unwrap_err();
        match &err {
            RuntimeError::Map { key: k, message } => {
                assert_eq!(k, &key.to_string());
                assert!(message.contains("injected"), "{message}");
            }
            other => panic!("expected RuntimeError::Map, got {other:?}"),
        }
        assert!(err.to_string().contains(&key.to_string()), "{err}");
        // The first try and one retry after freeing the cache, no more.
        assert_eq!(pages.calls.load(Ordering::SeqCst), 2 * attempt);
        let stats = engine.cache().stats();
        assert_eq!(stats.failed_compiles, attempt as u64);
        assert_eq!((stats.compiles, stats.entries, stats.bytes), (0, 0, 0));
        assert_eq!(exec_bytes(), base);
        assert_eq!(exec_count(), base_count);
    }
    assert_no_wx();
}

#[test]
fn failing_pages_free_the_cache_and_retry_once() {
    let _serial = serial();
    let base = baseline();
    let base_count = exec_count();
    let pages = FaultyPages::new(0);
    let engine = faulty_engine(Budget::Unlimited, &pages);
    let warm: Vec<PrimitiveKey> = (1..=5).map(|c| relu(c, 1, 4)).collect();
    let held = engine.compile(&warm[0]).unwrap();
    for k in &warm[1..] {
        engine.compile(k).unwrap();
    }
    let cached = engine.cache().stats().mapped_bytes;
    assert_eq!(exec_bytes() - base, cached);

    // One failure: the engine frees its cache and the retry succeeds.
    pages.fail.store(1, Ordering::SeqCst);
    let calls = pages.calls.load(Ordering::SeqCst);
    let key = relu(7, 2, 2);
    let p = engine.compile(&key).unwrap();
    assert_eq!(pages.calls.load(Ordering::SeqCst), calls + 2);
    run_relu(&engine, &p, 3);
    let stats = engine.cache().stats();
    assert_eq!(stats.entries, 1, "the cache was emptied before the retry");
    assert_eq!(stats.mapped_bytes, p.memory().mapped);
    assert_eq!(stats.failed_compiles, 0);
    // The handle the caller kept survives the cache being emptied.
    run_relu(&engine, &held, 1);
    assert_eq!(
        exec_bytes() - base,
        stats.mapped_bytes + held.memory().mapped
    );

    // Two failures in a row: a typed error, and the next call succeeds again.
    pages.fail.store(2, Ordering::SeqCst);
    let other = relu(8, 2, 2);
    match engine.compile(&other) {
        Err(RuntimeError::Map { key, .. }) => assert_eq!(key, other.to_string()),
        other => panic!("expected RuntimeError::Map, got {other:?}"),
    }
    assert_eq!(engine.cache().stats().failed_compiles, 1);
    assert_eq!(engine.cache().stats().entries, 0);
    assert_eq!(
        exec_bytes() - base,
        p.memory().mapped + held.memory().mapped
    );
    let q = engine.compile(&other).unwrap();
    run_relu(&engine, &q, 2);
    drop((p, q, held));
    engine.cache().clear();
    assert_eq!(exec_bytes(), base);
    assert_eq!(exec_count(), base_count);
    assert_no_wx();
}
