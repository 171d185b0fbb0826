//! The primitive cache: LRU order, byte accounting, eviction under byte and count bounds,
//! counters, configuration parsing, single-flight compilation and eviction while other threads
//! execute.
//!
//! Primitive costs are never hard-coded: every test asks `Primitive::memory()` after compiling,
//! and either uses keys of one cost (all small `relu` keys cost the same) or checks the cache
//! against a model that is fed the measured costs.
//!
//! Results are checked exactly: relu selects its input, and the convolutions run on small
//! integers whose sums f32 represents exactly in any order.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, OnceLock, Weak};
use std::time::Duration;

use memmap2::MmapMut;
use primjit_codegen::key::RuntimeDims;
use primjit_codegen::{
    ConvDesc, ConvPlan, EltwiseDesc, EltwiseKind, GlobalPoolDesc, Isa, Layout, PostOpDesc,
    PrimitiveKey,
};
use primjit_ir::{Pads, PoolKind};
use primjit_runtime::exec::PageSource;
use primjit_runtime::{
    Budget, CacheConfig, ConfigError, Engine, EngineConfig, ExecArgs, Primitive, RuntimeError,
};

// ---------------------------------------------------------------------------------------------
// Keys, engines and checked executions.
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

fn add(c: usize, h: usize, w: usize) -> PrimitiveKey {
    PrimitiveKey::Eltwise(EltwiseDesc {
        kind: EltwiseKind::Add,
        shape: [1, c, h, w],
        layout: Layout::Nchw,
        isa: Isa::X128,
        runtime: RuntimeDims::NONE,
    })
}

fn global_avg(c: usize, h: usize, w: usize) -> PrimitiveKey {
    PrimitiveKey::GlobalPool(GlobalPoolDesc {
        kind: PoolKind::Avg,
        mb: 1,
        c,
        ih: h,
        iw: w,
        src_layout: Layout::Nchw,
        dst_layout: Layout::Nchw,
        runtime: RuntimeDims::NONE,
        isa: Isa::X128,
    })
}

/// A 3x3 convolution with padding 1 (output as large as the input) and a fused relu.
fn conv_desc(ic: usize, oc: usize, hw: usize) -> ConvDesc {
    let mut d = ConvDesc::new(1, ic, [hw, hw], oc, [3, 3]);
    d.pads = Pads::uniform(1);
    d.post_ops = vec![PostOpDesc::Relu];
    d
}

/// A 5x5 convolution with padding 2 whose code spans several pages.
fn big_conv_desc() -> ConvDesc {
    let mut d = ConvDesc::new(1, 5, [11, 11], 12, [5, 5]);
    d.pads = Pads::uniform(2);
    d.post_ops = vec![PostOpDesc::Relu];
    d
}

/// A key whose window does not fit the input: it fails validation in codegen.
fn invalid_conv() -> PrimitiveKey {
    PrimitiveKey::Conv(ConvDesc::new(1, 6, [4, 4], 4, [5, 5]))
}

fn engine(budget: Budget, capacity: Option<usize>) -> Engine {
    Engine::new(EngineConfig {
        cache: CacheConfig { budget, capacity },
        threads: 1,
        ..EngineConfig::default()
    })
    .expect("engine")
}

fn engine_with_pages(budget: Budget, pages: Box<dyn PageSource>) -> Engine {
    Engine::with_pages(
        EngineConfig {
            cache: CacheConfig {
                budget,
                capacity: None,
            },
            threads: 1,
            ..EngineConfig::default()
        },
        pages,
    )
    .expect("engine")
}

/// The keys of the entries, most recently used first.
fn entry_keys(engine: &Engine) -> Vec<String> {
    engine
        .cache()
        .entries()
        .into_iter()
        .map(|e| e.key)
        .collect()
}

fn names(keys: &[&PrimitiveKey]) -> Vec<String> {
    keys.iter().map(|k| k.to_string()).collect()
}

/// Runs an eltwise relu primitive on data with negatives, zeros and positives (single-threaded
/// and through the engine) and checks every element.
fn check_relu(engine: &Engine, p: &Primitive, salt: usize) {
    let PrimitiveKey::Eltwise(d) = p.key() else {
        panic!("not an eltwise key: {}", p.key());
    };
    assert_eq!(d.kind, EltwiseKind::Relu);
    let n = d.layout.buffer_len(d.shape);
    let src: Vec<f32> = (0..n)
        .map(|i| ((i * 7 + salt) % 23) as f32 - 11.0 + 0.25)
        .collect();
    // The padding lanes of a last, partial nChw4c block are written as zeros.
    let [_, c, h, w] = d.shape;
    let padding =
        |i: usize| d.layout == Layout::Nchw4c && i / (4 * h * w) == c / 4 && i % 4 >= c % 4;
    let want: Vec<f32> = src
        .iter()
        .enumerate()
        .map(|(i, x)| if padding(i) { 0.0 } else { x.max(0.0) })
        .collect();
    for parallel in [false, true] {
        let mut dst = vec![f32::NAN; n];
        let args = ExecArgs {
            src: &src,
            weights: None,
            dst: &mut dst,
            extra: &[],
            scratch: None,
        };
        if parallel {
            engine.execute(p, args).expect("execute");
        } else {
            p.execute(args).expect("execute");
        }
        assert_eq!(dst, want, "{}: wrong relu result", p.key());
    }
}

/// Runs an eltwise add primitive and checks every element.
fn check_add(p: &Primitive, salt: usize) {
    let PrimitiveKey::Eltwise(d) = p.key() else {
        panic!("not an eltwise key: {}", p.key());
    };
    assert_eq!(d.kind, EltwiseKind::Add);
    let n = d.layout.buffer_len(d.shape);
    let a: Vec<f32> = (0..n).map(|i| ((i + salt) % 17) as f32 - 8.0).collect();
    let b: Vec<f32> = (0..n).map(|i| ((i * 3 + salt) % 13) as f32 * 0.5).collect();
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    let mut dst = vec![f32::NAN; n];
    p.execute(ExecArgs {
        src: &a,
        weights: None,
        dst: &mut dst,
        extra: &[&b],
        scratch: None,
    })
    .expect("execute");
    assert_eq!(dst, want, "{}: wrong add result", p.key());
}

/// One convolution problem on small integers, with its exact expected output.
struct ConvCase {
    key: PrimitiveKey,
    src: Vec<f32>,
    packed: Vec<f32>,
    want: Vec<f32>,
}

impl ConvCase {
    fn new(d: ConvDesc, seed: usize) -> ConvCase {
        let [_, ic, ih, iw] = d.src_shape();
        let [oc, icg, kh, kw] = d.weight_shape();
        let [_, _, oh, ow] = d.dst_shape();
        assert_eq!(d.groups, 1);
        assert_eq!(icg, ic);
        let src: Vec<f32> = (0..ic * ih * iw)
            .map(|i| ((i * 5 + seed) % 7) as f32 - 3.0)
            .collect();
        let weights: Vec<f32> = (0..oc * ic * kh * kw)
            .map(|i| ((i * 3 + seed * 11) % 5) as f32 - 2.0)
            .collect();
        let mut want = vec![0.0f32; oc * oh * ow];
        for o in 0..oc {
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut acc = 0.0f32;
                    for i in 0..ic {
                        for ky in 0..kh {
                            for kx in 0..kw {
                                let y = (oy * d.strides[0] + ky * d.dilations[0]) as isize
                                    - d.pads.top as isize;
                                let x = (ox * d.strides[1] + kx * d.dilations[1]) as isize
                                    - d.pads.left as isize;
                                if y < 0 || x < 0 || y >= ih as isize || x >= iw as isize {
                                    continue;
                                }
                                let (y, x) = (y as usize, x as usize);
                                acc += src[(i * ih + y) * iw + x]
                                    * weights[((o * ic + i) * kh + ky) * kw + kx];
                            }
                        }
                    }
                    let relu = d.post_ops.contains(&PostOpDesc::Relu);
                    want[(o * oh + oy) * ow + ox] = if relu { acc.max(0.0) } else { acc };
                }
            }
        }
        let packed = ConvPlan::new(&d).pack_weights(&weights, None, None);
        ConvCase {
            key: PrimitiveKey::Conv(d),
            src,
            packed,
            want,
        }
    }

    fn check(&self, engine: &Engine, p: &Primitive) {
        assert_eq!(p.key(), &self.key);
        let mut dst = vec![f32::NAN; self.want.len()];
        engine
            .execute(
                p,
                ExecArgs {
                    src: &self.src,
                    weights: Some(&self.packed),
                    dst: &mut dst,
                    extra: &[],
                    scratch: None,
                },
            )
            .expect("execute");
        assert_eq!(dst, self.want, "{}: wrong conv result", self.key);
    }
}

/// Checks the invariants that hold whenever no compile is in progress.
fn check_accounting(engine: &Engine) {
    let stats = engine.cache().stats();
    let entries = engine.cache().entries();
    assert_eq!(stats.entries, entries.len());
    assert_eq!(
        stats.bytes,
        entries.iter().map(|e| e.memory.total()).sum::<usize>()
    );
    assert_eq!(
        stats.mapped_bytes,
        entries.iter().map(|e| e.memory.mapped).sum::<usize>()
    );
    assert!(stats.peak_bytes >= stats.bytes);
    if let Some(budget) = stats.budget {
        assert!(stats.bytes <= budget, "{stats:?}");
    }
    if let Some(capacity) = stats.capacity {
        assert!(stats.entries <= capacity, "{stats:?}");
    }
}

/// Holds the first page request (made by the first compile of a key) until the cache has
/// counted `misses` lookups, so that concurrent callers all find that compile in flight: the
/// overlap is certain rather than likely, with no sleep to tune.
#[derive(Clone)]
struct Gate {
    engine: Arc<OnceLock<Weak<Engine>>>,
    misses: u64,
    used: Arc<AtomicBool>,
}

impl Gate {
    fn new(misses: u64) -> Gate {
        Gate {
            engine: Arc::new(OnceLock::new()),
            misses,
            used: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Opens the gate to the engine whose page source holds it.
    fn attach(&self, engine: &Arc<Engine>) {
        self.engine
            .set(Arc::downgrade(engine))
            .expect("attached once");
    }

    fn wait(&self) {
        if self.used.swap(true, Ordering::SeqCst) {
            return;
        }
        let Some(engine) = self.engine.get().and_then(Weak::upgrade) else {
            return;
        };
        // Bounded (ten minutes): if callers never come, the test's assertions report it.
        for _ in 0..600_000 {
            if engine.cache().stats().misses >= self.misses {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// A page source that counts its calls, holds the first at its gate, and fails while its
/// `fail` counter is positive.
struct TestPages {
    calls: Arc<AtomicUsize>,
    fail: Arc<AtomicUsize>,
    gate: Gate,
}

impl TestPages {
    fn new(fail: usize, gate: Gate) -> (TestPages, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let pages = TestPages {
            calls: calls.clone(),
            fail: Arc::new(AtomicUsize::new(fail)),
            gate,
        };
        (pages, calls)
    }
}

impl PageSource for TestPages {
    fn map(&self, len: usize) -> io::Result<MmapMut> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.gate.wait();
        if self
            .fail
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(io::Error::new(
                io::ErrorKind::OutOfMemory,
                "injected failure",
            ));
        }
        MmapMut::map_anon(len)
    }
}

// ---------------------------------------------------------------------------------------------
// LRU order and accounting.
// ---------------------------------------------------------------------------------------------

#[test]
fn entries_list_most_recent_first_and_a_hit_moves_to_front() {
    let engine = engine(Budget::Unlimited, None);
    let (a, b, c) = (relu(1, 2, 3), relu(2, 2, 3), relu(3, 2, 3));
    let pa = engine.compile(&a).unwrap();
    engine.compile(&b).unwrap();
    engine.compile(&c).unwrap();
    assert_eq!(entry_keys(&engine), names(&[&c, &b, &a]));

    let pa2 = engine.compile(&a).unwrap();
    assert!(Arc::ptr_eq(&pa, &pa2), "a hit returns the cached primitive");
    assert_eq!(entry_keys(&engine), names(&[&a, &c, &b]));

    engine.compile(&b).unwrap();
    engine.compile(&b).unwrap();
    assert_eq!(entry_keys(&engine), names(&[&b, &a, &c]));
    let hits: Vec<u64> = engine.cache().entries().iter().map(|e| e.hits).collect();
    assert_eq!(hits, [2, 1, 0]);

    // A miss goes to the front as well.
    let d = add(1, 2, 3);
    engine.compile(&d).unwrap();
    assert_eq!(entry_keys(&engine), names(&[&d, &b, &a, &c]));
    check_accounting(&engine);
}

#[test]
fn bytes_mapped_and_peak_follow_the_entries() {
    let engine = engine(Budget::Unlimited, None);
    let conv = ConvCase::new(conv_desc(3, 4, 6), 1);
    let keys = [
        relu(1, 4, 4),
        add(2, 3, 5),
        global_avg(5, 3, 3),
        conv.key.clone(),
        PrimitiveKey::Eltwise(EltwiseDesc {
            kind: EltwiseKind::Relu,
            shape: [1, 5, 2, 2],
            layout: Layout::Nchw4c,
            isa: Isa::X128,
            runtime: RuntimeDims::NONE,
        }),
    ];
    let mut total = 0;
    let mut mapped = 0;
    let mut held = Vec::new();
    for key in &keys {
        let p = engine.compile(key).unwrap();
        let m = p.memory();
        assert!(m.code > 0 && m.code <= m.mapped, "{key}: {m:?}");
        assert_eq!(m.mapped % primjit_runtime::exec::page_size(), 0, "{m:?}");
        assert_eq!(p.code_range().len(), m.mapped);
        assert!(m.heap >= std::mem::size_of::<Primitive>(), "{m:?}");
        assert_eq!(m.total(), m.mapped + m.heap);
        total += m.total();
        mapped += m.mapped;
        let stats = engine.cache().stats();
        assert_eq!(stats.bytes, total);
        assert_eq!(stats.mapped_bytes, mapped);
        assert_eq!(stats.peak_bytes, total);
        check_accounting(&engine);
        held.push(p);
    }
    conv.check(&engine, &held[3]);
    let entries = engine.cache().entries();
    for (e, p) in entries.iter().rev().zip(&held) {
        assert_eq!(e.key, p.key().to_string());
        assert_eq!(e.memory, p.memory());
    }

    // Shrinking lowers bytes but not the peak; the peak is the largest `bytes` ever held.
    engine
        .cache()
        .set_budget(Budget::Bytes(held[4].memory().total()));
    let stats = engine.cache().stats();
    assert_eq!(stats.bytes, held[4].memory().total());
    assert_eq!(stats.peak_bytes, total);
    engine.cache().clear();
    assert_eq!(engine.cache().stats().peak_bytes, total);
}

#[test]
fn peak_never_exceeds_a_budget_that_was_always_in_force() {
    let probe = engine(Budget::Unlimited, None);
    let cost = probe.compile(&relu(1, 1, 1)).unwrap().memory().total();
    let engine = engine(Budget::Bytes(2 * cost), None);
    for c in 1..=6 {
        engine.compile(&relu(c, 1, 1)).unwrap();
        let stats = engine.cache().stats();
        assert!(stats.bytes <= 2 * cost);
        assert!(
            stats.peak_bytes <= 2 * cost,
            "peak {} over a budget of {} that never changed: {stats:?}",
            stats.peak_bytes,
            2 * cost
        );
    }
    assert_eq!(engine.cache().stats().peak_bytes, 2 * cost);
}

// ---------------------------------------------------------------------------------------------
// Eviction.
// ---------------------------------------------------------------------------------------------

#[test]
fn budget_evicts_exactly_the_least_recently_used() {
    let probe = engine(Budget::Unlimited, None);
    let keys: Vec<PrimitiveKey> = (1..=6).map(|c| relu(c, 3, 3)).collect();
    let costs: Vec<usize> = keys
        .iter()
        .map(|k| probe.compile(k).unwrap().memory().total())
        .collect();
    // Small relu keys differ only in their shape: same code size class and same heap.
    assert!(costs.iter().all(|&c| c == costs[0]), "{costs:?}");
    let t = costs[0];

    // A budget of exactly three primitives holds three; one byte less holds only two.
    let engine = engine(Budget::Bytes(3 * t), None);
    for k in &keys[..3] {
        let p = engine.compile(k).unwrap();
        assert_eq!(p.memory().total(), t, "costs do not depend on the engine");
    }
    assert_eq!(engine.cache().stats().evictions, 0);
    assert_eq!(entry_keys(&engine), names(&[&keys[2], &keys[1], &keys[0]]));

    engine.compile(&keys[0]).unwrap(); // hit: k0 becomes the most recent, k1 the least
    engine.compile(&keys[3]).unwrap();
    assert_eq!(entry_keys(&engine), names(&[&keys[3], &keys[0], &keys[2]]));
    let stats = engine.cache().stats();
    assert_eq!((stats.evictions, stats.evicted_bytes), (1, t as u64));
    assert_eq!(stats.bytes, 3 * t);

    engine.compile(&keys[4]).unwrap();
    assert_eq!(entry_keys(&engine), names(&[&keys[4], &keys[3], &keys[0]]));
    let stats = engine.cache().stats();
    assert_eq!((stats.evictions, stats.evicted_bytes), (2, 2 * t as u64));
    check_accounting(&engine);

    // The evicted key compiles again (a miss), and evicts the next least recent (k0).
    let compiles = stats.compiles;
    engine.compile(&keys[1]).unwrap();
    let stats = engine.cache().stats();
    assert_eq!(stats.compiles, compiles + 1);
    assert_eq!(entry_keys(&engine), names(&[&keys[1], &keys[4], &keys[3]]));
    assert_eq!(stats.evictions, 3);

    let tight = self::engine(Budget::Bytes(3 * t - 1), None);
    for k in &keys[..3] {
        tight.compile(k).unwrap();
    }
    assert_eq!(entry_keys(&tight), names(&[&keys[2], &keys[1]]));
    assert_eq!(tight.cache().stats().evictions, 1);
}

/// The cache's policy, written independently: most recent first, insert what fits the budget
/// alone, then drop from the back until the total fits.
#[derive(Default)]
struct Model {
    budget: usize,
    lru: Vec<(String, usize)>,
    hits: u64,
    misses: u64,
    evictions: u64,
    evicted_bytes: u64,
    peak: usize,
}

impl Model {
    fn bytes(&self) -> usize {
        self.lru.iter().map(|e| e.1).sum()
    }

    fn access(&mut self, key: String, cost: usize) {
        if let Some(i) = self.lru.iter().position(|e| e.0 == key) {
            let e = self.lru.remove(i);
            self.lru.insert(0, e);
            self.hits += 1;
            return;
        }
        self.misses += 1;
        if cost > self.budget {
            return;
        }
        self.lru.insert(0, (key, cost));
        while self.bytes() > self.budget {
            let (_, c) = self.lru.pop().unwrap();
            self.evictions += 1;
            self.evicted_bytes += c as u64;
        }
        self.peak = self.peak.max(self.bytes());
    }
}

#[test]
fn mixed_costs_follow_the_lru_model() {
    let conv_a = conv_desc(3, 4, 6);
    let mut conv_b = conv_desc(4, 8, 5);
    conv_b.post_ops.push(PostOpDesc::Clip { lo: 0.0, hi: 6.0 });
    let keys = vec![
        relu(1, 2, 2),
        relu(2, 5, 7),
        add(1, 2, 2),
        add(3, 4, 4),
        global_avg(4, 2, 2),
        PrimitiveKey::Conv(conv_a),
        PrimitiveKey::Conv(conv_b),
        PrimitiveKey::Conv(big_conv_desc()),
        PrimitiveKey::Eltwise(EltwiseDesc {
            kind: EltwiseKind::Add,
            shape: [1, 6, 2, 3],
            layout: Layout::Nchw4c,
            isa: Isa::X128,
            runtime: RuntimeDims::NONE,
        }),
    ];
    let probe = engine(Budget::Unlimited, None);
    let costs: Vec<usize> = keys
        .iter()
        .map(|k| probe.compile(k).unwrap().memory().total())
        .collect();
    let mut sorted = costs.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert!(
        sorted.len() >= 3,
        "expected keys of several costs: {costs:?}"
    );

    // Room for roughly three middle-sized entries, so every size both fits and evicts.
    let budget = costs.iter().sum::<usize>() * 3 / keys.len();
    assert!(costs.iter().all(|&c| c <= budget), "{costs:?} vs {budget}");
    let engine = engine(Budget::Bytes(budget), None);
    let mut model = Model {
        budget,
        ..Model::default()
    };
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    for step in 0..200 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        // Favor a few keys so that there are hits as well as evictions.
        let i = if rng.is_multiple_of(3) {
            (rng >> 8) as usize % 2
        } else {
            (rng >> 8) as usize % keys.len()
        };
        let p = engine.compile(&keys[i]).unwrap();
        assert_eq!(p.memory().total(), costs[i]);
        model.access(keys[i].to_string(), costs[i]);

        let stats = engine.cache().stats();
        let want: Vec<String> = model.lru.iter().map(|e| e.0.clone()).collect();
        assert_eq!(entry_keys(&engine), want, "step {step}");
        assert_eq!(stats.bytes, model.bytes(), "step {step}");
        assert_eq!(stats.hits, model.hits, "step {step}");
        assert_eq!(stats.misses, model.misses, "step {step}");
        assert_eq!(stats.compiles, model.misses, "step {step}");
        assert_eq!(stats.evictions, model.evictions, "step {step}");
        assert_eq!(stats.evicted_bytes, model.evicted_bytes, "step {step}");
        assert_eq!(stats.peak_bytes, model.peak, "step {step}");
        check_accounting(&engine);
    }
    assert!(model.hits > 10 && model.evictions > 10);
}

#[test]
fn budget_zero_compiles_every_time_and_the_result_still_runs() {
    let engine = engine(Budget::Bytes(0), None);
    let key = relu(3, 4, 5);
    let mut previous: Option<Arc<Primitive>> = None;
    for i in 0..5u64 {
        let p = engine.compile(&key).unwrap();
        let stats = engine.cache().stats();
        assert_eq!(stats.compiles, i + 1);
        assert_eq!(stats.misses, i + 1);
        assert_eq!(stats.hits, 0);
        assert_eq!((stats.entries, stats.bytes, stats.mapped_bytes), (0, 0, 0));
        assert_eq!(stats.peak_bytes, 0);
        assert_eq!(stats.evictions, 0, "never kept, so never evicted");
        assert!(engine.cache().entries().is_empty());
        check_relu(&engine, &p, i as usize);
        if let Some(prev) = &previous {
            assert!(!Arc::ptr_eq(prev, &p), "a fresh primitive each time");
            check_relu(&engine, prev, 3);
        }
        previous = Some(p);
    }
    // An extra reference held by the caller is the only one: the cache kept nothing.
    assert_eq!(Arc::strong_count(previous.as_ref().unwrap()), 1);
}

#[test]
fn an_entry_larger_than_the_budget_is_returned_but_not_kept() {
    let probe = engine(Budget::Unlimited, None);
    let small = relu(2, 2, 2);
    let conv = ConvCase::new(big_conv_desc(), 3);
    let small_cost = probe.compile(&small).unwrap().memory().total();
    let big = probe.compile(&conv.key).unwrap().memory();
    let big_cost = big.total();
    assert!(
        big.mapped > primjit_runtime::exec::page_size() && big_cost > small_cost,
        "the conv should span pages: {big:?} vs {small_cost}"
    );

    let engine = engine(Budget::Bytes(big_cost - 1), None);
    let ps = engine.compile(&small).unwrap();
    let pc = engine.compile(&conv.key).unwrap();
    conv.check(&engine, &pc);
    check_relu(&engine, &ps, 0);
    // The oversize entry neither stays nor pushes out what fits.
    assert_eq!(entry_keys(&engine), names(&[&small]));
    let stats = engine.cache().stats();
    assert_eq!(stats.evictions, 0);
    assert_eq!(stats.bytes, small_cost);
    assert_eq!(Arc::strong_count(&pc), 1);
    let again = engine.compile(&conv.key).unwrap();
    assert!(!Arc::ptr_eq(&pc, &again));
    assert_eq!(engine.cache().stats().compiles, 3);
    conv.check(&engine, &again);

    // Smaller than any primitive: nothing is kept at all.
    let tiny = self::engine(Budget::Bytes(small_cost - 1), None);
    let p = tiny.compile(&small).unwrap();
    check_relu(&tiny, &p, 1);
    assert!(tiny.cache().entries().is_empty());
    assert_eq!(tiny.cache().stats().bytes, 0);
}

#[test]
fn capacity_bounds_the_number_of_entries() {
    let engine = engine(Budget::Unlimited, Some(2));
    let keys: Vec<PrimitiveKey> = (1..=5).map(|w| add(1, 1, w)).collect();
    for (i, k) in keys.iter().enumerate() {
        engine.compile(k).unwrap();
        assert_eq!(engine.cache().entries().len(), (i + 1).min(2));
        check_accounting(&engine);
    }
    assert_eq!(entry_keys(&engine), names(&[&keys[4], &keys[3]]));
    assert_eq!(engine.cache().stats().evictions, 3);

    // Capacity and budget apply together: whichever is tighter wins.
    let t = engine.cache().entries()[0].memory.total();
    engine.cache().set_budget(Budget::Bytes(t));
    assert_eq!(entry_keys(&engine), names(&[&keys[4]]));

    let none = self::engine(Budget::Unlimited, Some(0));
    let p = none.compile(&relu(1, 1, 4)).unwrap();
    check_relu(&none, &p, 0);
    assert!(none.cache().entries().is_empty());
    assert_eq!(none.cache().stats().bytes, 0);
}

#[test]
fn shrinking_budget_or_capacity_evicts_at_once_and_clear_empties() {
    let engine = engine(Budget::Unlimited, None);
    let keys: Vec<PrimitiveKey> = (1..=6).map(|h| relu(1, h, 2)).collect();
    for k in &keys {
        engine.compile(k).unwrap();
    }
    let t = engine.cache().entries()[0].memory.total();
    assert_eq!(engine.cache().stats().bytes, 6 * t);

    engine.cache().set_budget(Budget::Bytes(4 * t + t / 2));
    assert_eq!(
        entry_keys(&engine),
        names(&[&keys[5], &keys[4], &keys[3], &keys[2]])
    );
    let stats = engine.cache().stats();
    assert_eq!((stats.evictions, stats.evicted_bytes), (2, 2 * t as u64));
    assert_eq!(stats.budget, Some(4 * t + t / 2));
    check_accounting(&engine);

    engine.cache().set_capacity(Some(2));
    assert_eq!(entry_keys(&engine), names(&[&keys[5], &keys[4]]));
    let stats = engine.cache().stats();
    assert_eq!((stats.evictions, stats.capacity), (4, Some(2)));
    check_accounting(&engine);

    // Growing evicts nothing and lets the cache fill again.
    engine.cache().set_capacity(None);
    engine.cache().set_budget(Budget::Unlimited);
    assert_eq!(engine.cache().entries().len(), 2);
    assert_eq!(
        engine.cache().config(),
        CacheConfig {
            budget: Budget::Unlimited,
            capacity: None
        }
    );
    engine.compile(&keys[0]).unwrap();
    assert_eq!(engine.cache().entries().len(), 3);

    let held = engine.compile(&keys[5]).unwrap();
    let evictions = engine.cache().stats().evictions;
    engine.cache().clear();
    let stats = engine.cache().stats();
    assert_eq!((stats.entries, stats.bytes, stats.mapped_bytes), (0, 0, 0));
    assert!(engine.cache().entries().is_empty());
    assert_eq!(
        stats.evictions, evictions,
        "clear() is not counted as evictions"
    );
    // A handle held across clear() still works, and the key compiles again afterwards.
    check_relu(&engine, &held, 2);
    let compiles = stats.compiles;
    let p = engine.compile(&keys[5]).unwrap();
    assert!(!Arc::ptr_eq(&p, &held));
    assert_eq!(engine.cache().stats().compiles, compiles + 1);
    check_accounting(&engine);
}

// ---------------------------------------------------------------------------------------------
// Counters.
// ---------------------------------------------------------------------------------------------

#[test]
fn hit_miss_compile_and_failure_counters() {
    let engine = engine(Budget::Unlimited, None);
    let stats = engine.cache().stats();
    assert_eq!(stats.compile_time, Duration::ZERO);
    let (a, b) = (relu(1, 3, 3), relu(1, 3, 4));
    engine.compile(&a).unwrap();
    engine.compile(&a).unwrap();
    engine.compile(&b).unwrap();
    engine.compile(&a).unwrap();
    let stats = engine.cache().stats();
    assert_eq!(
        (
            stats.hits,
            stats.misses,
            stats.compiles,
            stats.failed_compiles
        ),
        (2, 2, 2, 0)
    );
    assert!(stats.compile_time > Duration::ZERO);
    assert!(stats.max_compile_time > Duration::ZERO);
    assert!(stats.max_compile_time <= stats.compile_time);
    let entries = engine.cache().entries();
    let sum: Duration = entries.iter().map(|e| e.compile_time).sum();
    assert_eq!(stats.compile_time, sum);
    assert_eq!(
        stats.max_compile_time,
        entries.iter().map(|e| e.compile_time).max().unwrap()
    );

    let bad = invalid_conv();
    for attempt in 1..=2u64 {
        let err = engine.compile(&bad).unwrap_err();
        match &err {
            RuntimeError::Codegen(primjit_codegen::CodegenError::InvalidKey(e)) => {
                assert_eq!(e.key, bad.to_string());
                assert!(e.reason.contains("does not fit"), "{err}");
            }
            other => panic!("expected an invalid key error, got {other:?}"),
        }
        let s = engine.cache().stats();
        assert_eq!(s.failed_compiles, attempt, "a failure is not cached");
        assert_eq!(s.compiles, 2);
        assert_eq!(s.misses, 2 + attempt);
        assert_eq!(s.entries, 2);
        assert_eq!(s.compile_time, stats.compile_time);
    }
    assert!(!entry_keys(&engine).contains(&bad.to_string()));
    check_accounting(&engine);
}

// ---------------------------------------------------------------------------------------------
// Configuration.
// ---------------------------------------------------------------------------------------------

#[test]
fn budget_parsing() {
    let good = [
        ("64MiB", Budget::Bytes(64 << 20)),
        ("512KiB", Budget::Bytes(512 << 10)),
        ("1GiB", Budget::Bytes(1 << 30)),
        ("4096", Budget::Bytes(4096)),
        ("4096B", Budget::Bytes(4096)),
        ("0", Budget::Bytes(0)),
        ("unlimited", Budget::Unlimited),
        ("Unlimited", Budget::Unlimited),
        (" 8MiB ", Budget::Bytes(8 << 20)),
        ("8 MiB", Budget::Bytes(8 << 20)),
        ("0GiB", Budget::Bytes(0)),
    ];
    for (text, want) in good {
        assert_eq!(Budget::parse(text), Ok(want), "{text:?}");
    }
    let bad = [
        "12XB",
        "-1",
        "",
        "   ",
        "lots",
        "1.5GiB",
        "MiB",
        "64MiB64",
        "99999999999999999999GiB",
        "99999999999999999999",
        // Fits in a usize, overflows once scaled.
        "17179869184GiB",
    ];
    for text in bad {
        match Budget::parse(text) {
            Err(message) => assert!(!message.is_empty(), "{text:?}: empty message"),
            Ok(b) => panic!("{text:?} parsed as {b:?}"),
        }
    }
    assert!(Budget::parse("12XB").unwrap_err().contains("XB"));
    assert!(
        Budget::parse("17179869184GiB")
            .unwrap_err()
            .contains("overflow")
    );
    // Display round-trips.
    for b in [
        Budget::DEFAULT,
        Budget::Unlimited,
        Budget::Bytes(0),
        Budget::Bytes(4097),
        Budget::Bytes(3 << 10),
        Budget::Bytes(5 << 30),
    ] {
        assert_eq!(Budget::parse(&b.to_string()), Ok(b), "{b}");
    }
}

fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
    let map: HashMap<&str, &str> = pairs.iter().copied().collect();
    move |name| map.get(name).map(|v| v.to_string())
}

fn assert_invalid(result: Result<impl std::fmt::Debug, ConfigError>, var: &str, value: &str) {
    match result {
        Err(ConfigError::Invalid {
            name,
            value: found,
            reason,
        }) => {
            assert_eq!(name, var);
            assert_eq!(found, value);
            assert!(!reason.is_empty());
            let message = ConfigError::Invalid {
                name,
                value: found,
                reason,
            }
            .to_string();
            assert!(
                message.contains(var) && message.contains(value),
                "{message}"
            );
        }
        other => panic!("{var}={value:?}: expected ConfigError::Invalid, got {other:?}"),
    }
}

#[test]
fn cache_config_from_vars() {
    assert_eq!(
        CacheConfig::from_vars(vars(&[])),
        Ok(CacheConfig::default())
    );
    assert_eq!(CacheConfig::default().budget, Budget::DEFAULT);
    assert_eq!(CacheConfig::default().capacity, None);
    assert_eq!(
        CacheConfig::from_vars(vars(&[
            ("PRIMJIT_CACHE_BUDGET", "512KiB"),
            ("PRIMJIT_CACHE_CAPACITY", " 16 ")
        ])),
        Ok(CacheConfig {
            budget: Budget::Bytes(512 << 10),
            capacity: Some(16)
        })
    );
    assert_eq!(
        CacheConfig::from_vars(vars(&[("PRIMJIT_CACHE_BUDGET", "unlimited")])),
        Ok(CacheConfig {
            budget: Budget::Unlimited,
            capacity: None
        })
    );
    assert_eq!(
        CacheConfig::from_vars(vars(&[("PRIMJIT_CACHE_CAPACITY", "0")]))
            .unwrap()
            .capacity,
        Some(0)
    );
    for value in ["12XB", "-1", "", "lots", "99999999999999999999GiB"] {
        assert_invalid(
            CacheConfig::from_vars(vars(&[("PRIMJIT_CACHE_BUDGET", value)])),
            "PRIMJIT_CACHE_BUDGET",
            value,
        );
    }
    for value in ["ten", "-3", "", "1.5", "4KiB"] {
        assert_invalid(
            CacheConfig::from_vars(vars(&[("PRIMJIT_CACHE_CAPACITY", value)])),
            "PRIMJIT_CACHE_CAPACITY",
            value,
        );
    }
    // Other variables are ignored.
    assert_eq!(
        CacheConfig::from_vars(vars(&[("PRIMJIT_THREADS", "lots")])),
        Ok(CacheConfig::default())
    );
}

#[test]
fn engine_config_from_vars() {
    let c = EngineConfig::from_vars(vars(&[])).unwrap();
    assert_eq!(
        (c.cache, c.threads, c.verbose),
        (CacheConfig::default(), 0, 0)
    );

    let c = EngineConfig::from_vars(vars(&[
        ("PRIMJIT_CACHE_BUDGET", "1GiB"),
        ("PRIMJIT_CACHE_CAPACITY", "100"),
        ("PRIMJIT_VERBOSE", "2"),
        ("PRIMJIT_THREADS", "3"),
    ]))
    .unwrap();
    assert_eq!(c.cache.budget, Budget::Bytes(1 << 30));
    assert_eq!(c.cache.capacity, Some(100));
    assert_eq!((c.threads, c.verbose), (3, 2));

    for (value, want) in [("0", 0), ("1", 1), (" 1 ", 1), ("", 0)] {
        let c = EngineConfig::from_vars(vars(&[("PRIMJIT_VERBOSE", value)])).unwrap();
        assert_eq!(c.verbose, want, "{value:?}");
    }
    for value in ["3", "yes", "-1", "255"] {
        assert_invalid(
            EngineConfig::from_vars(vars(&[("PRIMJIT_VERBOSE", value)])),
            "PRIMJIT_VERBOSE",
            value,
        );
    }
    // The switches: off by default, `0` or `1` (blank is 0), anything else an error.
    type Switch = fn(&EngineConfig) -> bool;
    let switches: [(&str, Switch); 2] = [
        ("PRIMJIT_PERF_MAP", |c| c.perf_map),
        ("PRIMJIT_COMPILE_AHEAD", |c| c.compile_ahead),
    ];
    for (name, switch) in switches {
        assert!(
            !switch(&EngineConfig::from_vars(vars(&[])).unwrap()),
            "{name}"
        );
        for (value, want) in [("0", false), ("1", true), (" 1 ", true), ("", false)] {
            let c = EngineConfig::from_vars(vars(&[(name, value)])).unwrap();
            assert_eq!(switch(&c), want, "{name}={value:?}");
        }
        for value in ["2", "yes", "on", "true", "-1"] {
            assert_invalid(EngineConfig::from_vars(vars(&[(name, value)])), name, value);
        }
    }
    // Above the documented bound (Engine::MAX_THREADS): refused while parsing, before an engine
    // would start them.
    for value in ["-1", "many", "", "2.5", "1025", "65535", "1000000"] {
        assert_invalid(
            EngineConfig::from_vars(vars(&[("PRIMJIT_THREADS", value)])),
            "PRIMJIT_THREADS",
            value,
        );
    }
    // The cache's variables are checked by the engine's parser too.
    assert_invalid(
        EngineConfig::from_vars(vars(&[
            ("PRIMJIT_CACHE_BUDGET", "lots"),
            ("PRIMJIT_THREADS", "2"),
        ])),
        "PRIMJIT_CACHE_BUDGET",
        "lots",
    );
    assert_invalid(
        EngineConfig::from_vars(vars(&[("PRIMJIT_CACHE_CAPACITY", "x")])),
        "PRIMJIT_CACHE_CAPACITY",
        "x",
    );
    // A parsed configuration builds a working engine.
    let c = EngineConfig::from_vars(vars(&[
        ("PRIMJIT_CACHE_BUDGET", "0"),
        ("PRIMJIT_THREADS", "2"),
    ]))
    .unwrap();
    let engine = Engine::new(c).unwrap();
    assert_eq!(engine.threads(), 2);
    assert_eq!(engine.cache().stats().budget, Some(0));
}

#[test]
fn perf_map_names_each_compiled_primitive_at_its_address() {
    // This process's map: only this test of the binary turns it on.
    let path = format!("/tmp/perf-{}.map", std::process::id());
    let _ = std::fs::remove_file(&path);
    let engine = Engine::new(EngineConfig {
        perf_map: true,
        ..EngineConfig::default()
    })
    .unwrap();
    let keys = [relu(4, 3, 5), relu(8, 2, 2)];
    let primitives: Vec<_> = keys.iter().map(|k| engine.compile(k).unwrap()).collect();
    // A cache hit places no new code, so it adds no line.
    engine.compile(&keys[0]).unwrap();
    let map = std::fs::read_to_string(&path).expect("the engine wrote perf's map");
    for p in &primitives {
        let line = format!(
            "{:x} {:x} primjit {}",
            p.code_range().start,
            p.memory().code,
            p.key()
        );
        let count = map.lines().filter(|l| *l == line).count();
        assert_eq!(count, 1, "`{line}` in {path}:\n{map}");
    }
    // An engine without it writes nothing.
    let before = std::fs::read_to_string(&path).unwrap();
    let plain = Engine::new(EngineConfig::default()).unwrap();
    plain.compile(&relu(4, 1, 7)).unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), before);
    std::fs::remove_file(&path).unwrap();
}

// ---------------------------------------------------------------------------------------------
// Concurrency.
// ---------------------------------------------------------------------------------------------

const THREADS: usize = 8;

#[test]
fn concurrent_misses_on_one_key_compile_once() {
    // The first compile waits in its page request until every thread has looked the key up:
    // without single flight every thread would compile (and map) on its own.
    let gate = Gate::new(THREADS as u64);
    let (pages, calls) = TestPages::new(0, gate.clone());
    let engine = Arc::new(engine_with_pages(Budget::Unlimited, Box::new(pages)));
    gate.attach(&engine);
    let conv = ConvCase::new(conv_desc(3, 4, 6), 7);
    let barrier = Barrier::new(THREADS);
    let results: Vec<Arc<Primitive>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    engine.compile(&conv.key).unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let stats = engine.cache().stats();
    assert_eq!(stats.compiles, 1, "{stats:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "pages mapped once");
    assert_eq!((stats.hits, stats.misses), (0, THREADS as u64));
    assert_eq!(stats.entries, 1);
    for p in &results {
        assert!(Arc::ptr_eq(p, &results[0]));
    }
    conv.check(&engine, &results[0]);
}

#[test]
fn concurrent_callers_share_one_failure_and_nothing_is_cached() {
    // Pages that always fail, once every caller waits for the compile: every caller gets the
    // one typed error.
    let gate = Gate::new(THREADS as u64);
    let (pages, calls) = TestPages::new(usize::MAX, gate.clone());
    let engine = Arc::new(engine_with_pages(Budget::Unlimited, Box::new(pages)));
    gate.attach(&engine);
    let key = relu(2, 3, 4);
    let barrier = Barrier::new(THREADS);
    let errors: Vec<RuntimeError> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    engine.compile(&key).unwrap_err()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for e in &errors {
        assert!(
            matches!(e, RuntimeError::Map { key: k, .. } if *k == key.to_string()),
            "{e:?}"
        );
        assert_eq!(e, &errors[0]);
    }
    let stats = engine.cache().stats();
    assert_eq!(stats.failed_compiles, 1, "{stats:?}");
    assert_eq!(stats.compiles, 0);
    assert_eq!(stats.entries, 0);
    // The first try and the one retry after freeing the cache.
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    // Not cached: the next call tries again.
    assert!(engine.compile(&key).is_err());
    assert_eq!(engine.cache().stats().failed_compiles, 2);
    assert_eq!(calls.load(Ordering::SeqCst), 4);
}

/// Pages whose first request panics once every caller waits for the compile; later requests
/// succeed.
struct PanickingPages {
    panicked: AtomicBool,
    gate: Gate,
}

impl PageSource for PanickingPages {
    fn map(&self, len: usize) -> io::Result<MmapMut> {
        if !self.panicked.swap(true, Ordering::SeqCst) {
            self.gate.wait();
            panic!("injected panic while mapping pages");
        }
        MmapMut::map_anon(len)
    }
}

#[test]
fn a_panicking_compile_blocks_neither_its_waiters_nor_later_callers() {
    let gate = Gate::new(THREADS as u64);
    let engine = Arc::new(engine_with_pages(
        Budget::Unlimited,
        Box::new(PanickingPages {
            panicked: AtomicBool::new(false),
            gate: gate.clone(),
        }),
    ));
    gate.attach(&engine);
    let key = relu(3, 3, 3);
    let barrier = Arc::new(Barrier::new(THREADS));
    let (tx, rx) = std::sync::mpsc::channel();
    for _ in 0..THREADS {
        let (engine, key, barrier, tx) = (engine.clone(), key.clone(), barrier.clone(), tx.clone());
        // Detached threads: if one hangs, the watchdog below fails the test instead of the
        // test hanging with it.
        std::thread::spawn(move || {
            barrier.wait();
            let outcome =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| engine.compile(&key)));
            let _ = tx.send(outcome.map(|r| r.expect("compile")).ok());
        });
    }
    // A deadlock watchdog, not a timing assertion: each caller returns within well under a
    // second, and one stuck waiting for the panicked compile would never return.
    let outcomes: Vec<Option<Arc<Primitive>>> = (0..THREADS)
        .map(|i| {
            rx.recv_timeout(Duration::from_secs(120))
                .unwrap_or_else(|_| panic!("{i} callers returned; the others are stuck"))
        })
        .collect();
    let ok: Vec<&Arc<Primitive>> = outcomes.iter().flatten().collect();
    assert_eq!(ok.len(), THREADS - 1, "exactly the first caller panics");
    for p in &ok {
        assert!(Arc::ptr_eq(p, ok[0]), "the others share one compile");
    }
    check_relu(&engine, ok[0], 0);
    let again = engine.compile(&key).unwrap();
    assert!(Arc::ptr_eq(&again, ok[0]));
    let stats = engine.cache().stats();
    assert_eq!((stats.compiles, stats.failed_compiles), (1, 1), "{stats:?}");
    assert_eq!(stats.entries, 1);
}

#[test]
fn eviction_while_other_threads_execute() {
    let engine = engine(Budget::Unlimited, None);
    let t = engine.compile(&relu(1, 1, 1)).unwrap().memory().total();
    let mut convs: Vec<ConvCase> = [(3, 4, 6), (2, 8, 5), (5, 4, 4)]
        .into_iter()
        .enumerate()
        .map(|(i, (ic, oc, hw))| ConvCase::new(conv_desc(ic, oc, hw), i))
        .collect();
    convs.push(ConvCase::new(big_conv_desc(), 9));
    let relus: Vec<PrimitiveKey> = (1..=6).map(|c| relu(c, 3, 5)).collect();
    let workers = 4;
    let iterations = if cfg!(debug_assertions) { 150 } else { 600 };
    let done = AtomicUsize::new(0);
    let executed = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        for w in 0..workers {
            let (engine, convs, relus, done, executed) =
                (&engine, &convs, &relus, &done, &executed);
            s.spawn(move || {
                for i in 0..iterations {
                    let pick = (i * 7 + w * 3) % (relus.len() + convs.len());
                    if pick < relus.len() {
                        let p = engine.compile(&relus[pick]).unwrap();
                        assert_eq!(p.key(), &relus[pick]);
                        check_relu(engine, &p, i + w);
                    } else {
                        let case = &convs[pick - relus.len()];
                        let p = engine.compile(&case.key).unwrap();
                        case.check(engine, &p);
                    }
                    executed.fetch_add(1, Ordering::Relaxed);
                }
                done.fetch_add(1, Ordering::SeqCst);
            });
        }
        let (engine, done, stop) = (&engine, &done, &stop);
        s.spawn(move || {
            let mut round = 0usize;
            // Bounded: the workers finish after a fixed number of iterations.
            while done.load(Ordering::SeqCst) < workers && !stop.load(Ordering::SeqCst) {
                let cache = engine.cache();
                match round % 6 {
                    0 => cache.set_budget(Budget::Bytes(0)),
                    1 => cache.set_budget(Budget::Unlimited),
                    2 => cache.clear(),
                    3 => cache.set_budget(Budget::Bytes(2 * t)),
                    4 => cache.set_capacity(Some(1)),
                    _ => {
                        cache.set_capacity(None);
                        cache.set_budget(Budget::Unlimited);
                    }
                }
                round += 1;
                std::thread::yield_now();
            }
        });
    });
    stop.store(true, Ordering::SeqCst);
    assert_eq!(executed.load(Ordering::Relaxed), workers * iterations);
    check_accounting(&engine);
    let stats = engine.cache().stats();
    assert_eq!(stats.failed_compiles, 0);
    assert_eq!(stats.hits + stats.misses, (workers * iterations + 1) as u64);
    engine.cache().clear();
    assert_eq!(engine.cache().stats().bytes, 0);
}

// ---------------------------------------------------------------------------------------------
// Keys.
// ---------------------------------------------------------------------------------------------

#[test]
fn whole_keys_are_compared_never_confused() {
    let engine = engine(Budget::Unlimited, None);
    let base = conv_desc(3, 4, 6);
    let mut clip_pos = base.clone();
    clip_pos.post_ops = vec![PostOpDesc::Clip { lo: 0.0, hi: 6.0 }];
    let mut clip_neg = base.clone();
    clip_neg.post_ops = vec![PostOpDesc::Clip { lo: -0.0, hi: 6.0 }];
    let mut no_relu = base.clone();
    no_relu.post_ops.clear();
    let mut strided = base.clone();
    strided.strides = [2, 2];
    let mut blocked = base.clone();
    blocked.dst_layout = Layout::Nchw4c;
    let mut keys = vec![
        PrimitiveKey::Conv(base.clone()),
        PrimitiveKey::Conv(clip_pos),
        PrimitiveKey::Conv(clip_neg),
        PrimitiveKey::Conv(no_relu.clone()),
        PrimitiveKey::Conv(strided),
        PrimitiveKey::Conv(blocked),
        relu(2, 3, 4),
        relu(2, 4, 3),
        relu(3, 2, 4),
        relu(24, 1, 1),
        add(2, 3, 4),
        PrimitiveKey::Eltwise(EltwiseDesc {
            kind: EltwiseKind::Relu,
            shape: [1, 2, 3, 4],
            layout: Layout::Nchw4c,
            isa: Isa::X128,
            runtime: RuntimeDims::NONE,
        }),
        PrimitiveKey::Eltwise(EltwiseDesc {
            kind: EltwiseKind::Relu,
            shape: [2, 1, 3, 4],
            layout: Layout::Nchw,
            isa: Isa::X128,
            runtime: RuntimeDims::NONE,
        }),
        global_avg(2, 3, 4),
        PrimitiveKey::GlobalPool(GlobalPoolDesc {
            kind: PoolKind::Max,
            mb: 1,
            c: 2,
            ih: 3,
            iw: 4,
            src_layout: Layout::Nchw,
            dst_layout: Layout::Nchw,
            runtime: RuntimeDims::NONE,
            isa: Isa::X128,
        }),
    ];
    // Many shapes of one kind, which is where a hash-only comparison would collide first.
    for c in 1..=8 {
        for h in 1..=8 {
            keys.push(relu(c, h, 9 - h));
        }
    }
    for (i, k) in keys.iter().enumerate() {
        assert!(!keys[..i].contains(k), "the test lists {k} twice");
    }
    let prims: Vec<Arc<Primitive>> = keys.iter().map(|k| engine.compile(k).unwrap()).collect();
    assert_eq!(engine.cache().stats().compiles, keys.len() as u64);
    assert_eq!(engine.cache().entries().len(), keys.len());
    for (i, (k, p)) in keys.iter().zip(&prims).enumerate() {
        assert_eq!(p.key(), k);
        for q in &prims[..i] {
            assert!(
                !Arc::ptr_eq(p, q),
                "{} and {} share a primitive",
                k,
                q.key()
            );
        }
        // Looking a key up again returns its own primitive.
        let again = engine.compile(k).unwrap();
        assert!(Arc::ptr_eq(p, &again), "{k}");
    }
    for (i, p) in prims.iter().enumerate() {
        if let PrimitiveKey::Eltwise(d) = p.key()
            && d.kind == EltwiseKind::Relu
        {
            check_relu(&engine, p, i);
        }
    }
    check_add(&prims[10], 4);
    ConvCase::new(base.clone(), 5).check(&engine, &prims[0]);
    ConvCase::new(no_relu.clone(), 5).check(&engine, &prims[3]);

    // Equal keys built separately (a post-op vector with a different capacity) are one entry.
    let mut rebuilt = no_relu.clone();
    rebuilt.post_ops = Vec::with_capacity(16);
    let p = engine.compile(&PrimitiveKey::Conv(rebuilt)).unwrap();
    assert!(Arc::ptr_eq(&p, &prims[3]));
    assert_eq!(engine.cache().stats().compiles, keys.len() as u64);
}
