//! Concurrency stress: eight threads share one engine with a small, changing budget and run
//! random graphs and single primitives, checking every result against the reference
//! interpreter, while a controller thread changes the budget and capacity and clears the
//! cache, and a watcher scans `/proc/self/maps` for writable and executable pages.
//!
//! The run is bounded in time: `PRIMJIT_STRESS_SECS` seconds (3 by default; longer for a
//! deep run). Afterwards every executable mapping the run created must be gone: the count and
//! the bytes of executable mappings return to their baseline.
//!
//! This file holds a single test, so no other test of the same process maps or unmaps
//! executable pages while it measures.
#![cfg(target_os = "linux")]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use primjit_codegen::key::RuntimeDims;
use primjit_codegen::{
    ConvDesc, ConvPlan, EltwiseDesc, EltwiseKind, Isa, Layout, PoolDesc, PostOpDesc, PrimitiveKey,
};
use primjit_ir::{Graph, Pads, Params, PoolKind, PoolWindow, Tensor, parse};
use primjit_reference::{ConvAttrs, PoolAttrs, Post};
use primjit_runtime::exec::GuardedBuffer;
use primjit_runtime::layout::{to_blocked, to_nchw};
use primjit_runtime::{
    Budget, CacheConfig, CompiledGraph, Engine, EngineConfig, ExecArgs, Workspace,
};

const WORKERS: usize = 8;

// ---------------------------------------------------------------------------------------------
// Data and /proc/self/maps.
// ---------------------------------------------------------------------------------------------

/// SplitMix64: every worker draws its graphs, ops and data from its own stream.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        common::splitmix64(&mut self.0)
    }

    /// A number in `lo..=hi`.
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }

    fn flag(&mut self) -> bool {
        self.next_u64() & 1 == 1
    }

    fn tensor(&mut self, shape: &[usize]) -> Tensor {
        let n = shape.iter().product();
        Tensor {
            shape: shape.to_vec(),
            data: (0..n)
                .map(|_| (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0)
                .collect(),
        }
    }
}

/// The executable mappings of the process: their count and total bytes.
fn exec_mappings() -> (usize, usize) {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("read /proc/self/maps");
    let mut count = 0;
    let mut bytes = 0;
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let range = fields.next().expect("address range");
        let perms = fields.next().expect("permissions");
        if perms.contains('x') {
            let (start, end) = range.split_once('-').expect("start-end");
            let start = usize::from_str_radix(start, 16).expect("hex start");
            let end = usize::from_str_radix(end, 16).expect("hex end");
            count += 1;
            bytes += end - start;
        }
    }
    (count, bytes)
}

/// The lines of `/proc/self/maps` that are writable and executable at once.
fn wx_mappings() -> Vec<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("read /proc/self/maps");
    maps.lines()
        .filter(|l| {
            let perms = l.split_whitespace().nth(1).unwrap_or("");
            perms.contains('w') && perms.contains('x')
        })
        .map(str::to_string)
        .collect()
}

fn abs(t: &Tensor) -> Tensor {
    Tensor {
        shape: t.shape.clone(),
        data: t.data.iter().map(|v| v.abs()).collect(),
    }
}

// ---------------------------------------------------------------------------------------------
// Random graphs.
// ---------------------------------------------------------------------------------------------

/// A random graph of up to six nodes over a small input, in IR text: convolutions (grouped,
/// strided, padded, with bias and fused post-ops), pooling, relu, add, batch-norm and a final
/// global pooling. Each candidate node is kept only if the graph still verifies, so the
/// generator needs to track channels only.
fn random_graph(rng: &mut Rng, id: usize) -> (Graph, [usize; 4]) {
    let shape = [
        rng.range(1, 2),
        rng.range(1, 8),
        rng.range(1, 10),
        rng.range(1, 12),
    ];
    let input = format!(
        "  input %x: f32[{}, {}, {}, {}]\n",
        shape[0], shape[1], shape[2], shape[3]
    );
    let mut params = String::new();
    let mut nodes = String::new();
    // Values so far with their channel counts; the last is the current one.
    let mut values: Vec<(String, usize)> = vec![("x".into(), shape[1])];
    let text = |params: &str, nodes: &str, out: &str| {
        format!("graph g{id} {{\n{input}{params}{nodes}  output y = %{out}\n}}\n")
    };
    let mut graph = parse(&text("", "", "x")).expect("the bare input parses");
    let target = rng.range(1, 6);
    let mut attempts = 0;
    while values.len() <= target && attempts < 40 {
        attempts += 1;
        let n = values.len();
        let (prev, c) = values[n - 1].clone();
        let other = values[rng.range(0, n - 1)].0.clone();
        let name = format!("v{n}");
        let pad = rng.range(0, 1);
        let (mut new_params, node, channels) = match rng.range(0, 9) {
            0..=2 => {
                let g = if c % 2 == 0 && rng.flag() { 2 } else { 1 };
                let oc = g * rng.range(1, 4);
                let k = rng.range(1, 3);
                let s = rng.range(1, 2);
                let mut p = format!("  param @{name}.w: f32[{oc}, {}, {k}, {k}]\n", c / g);
                let mut attrs =
                    format!("groups={g}, strides=[{s}, {s}], pads=[{pad}, {pad}, {pad}, {pad}]");
                if rng.flag() {
                    p += &format!("  param @{name}.b: f32[{oc}]\n");
                    attrs += &format!(", bias=@{name}.b");
                }
                match rng.range(0, 3) {
                    0 => attrs += ", post=[relu]",
                    1 => attrs += &format!(", post=[add(%{other}), relu]"),
                    2 => attrs += ", post=[clip(-0.5, 0.5)]",
                    _ => {}
                }
                (p, format!("conv2d(%{prev}, @{name}.w, {attrs})"), oc)
            }
            3 => {
                let k = rng.range(2, 3);
                let s = rng.range(1, 2);
                (
                    String::new(),
                    format!(
                        "maxpool2d(%{prev}, kernel=[{k}, {k}], strides=[{s}, {s}], pads=[{pad}, {pad}, {pad}, {pad}])"
                    ),
                    c,
                )
            }
            4 => {
                let k = rng.range(2, 3);
                (
                    String::new(),
                    format!(
                        "avgpool2d(%{prev}, kernel=[{k}, {k}], strides=[2, 2], pads=[{pad}, {pad}, {pad}, {pad}], ceil_mode={}, count_include_pad={})",
                        rng.flag(),
                        rng.flag()
                    ),
                    c,
                )
            }
            5 => (String::new(), format!("relu(%{prev})"), c),
            6 | 7 => (String::new(), format!("add(%{prev}, %{other})"), c),
            8 => {
                let p: String = ["s", "b", "m", "v"]
                    .iter()
                    .map(|s| format!("  param @{name}.{s}: f32[{c}]\n"))
                    .collect();
                (
                    p,
                    format!("batchnorm(%{prev}, @{name}.s, @{name}.b, @{name}.m, @{name}.v)"),
                    c,
                )
            }
            _ => {
                let kind = if rng.flag() { "avg" } else { "max" };
                (String::new(), format!("global_{kind}pool(%{prev})"), c)
            }
        };
        new_params.insert_str(0, &params);
        let new_nodes = format!("{nodes}  %{name} = {node}\n");
        let candidate = text(&new_params, &new_nodes, &name);
        let g = parse(&candidate).unwrap_or_else(|e| panic!("{e}\n{candidate}"));
        if g.verify().is_ok() {
            graph = g;
            params = new_params;
            nodes = new_nodes;
            values.push((name, channels));
        }
    }
    (graph, shape)
}

/// A graph made ready once, with its input and the reference interpreter's output.
struct GraphCase {
    text: String,
    model: CompiledGraph,
    input: Tensor,
    want: Tensor,
}

impl GraphCase {
    fn new(rng: &mut Rng, id: usize) -> GraphCase {
        let (graph, shape) = random_graph(rng, id);
        let params = Params::random(&graph, id as u64);
        let input = rng.tensor(&shape);
        let want = primjit_reference::run_graph(&graph, &params, &[("x", &input)])
            .unwrap_or_else(|e| panic!("reference: {e}\n{graph}"))
            .remove(0)
            .1;
        let model = CompiledGraph::new(&graph, &params).unwrap_or_else(|e| panic!("{e}\n{graph}"));
        GraphCase {
            text: graph.to_string(),
            model,
            input,
            want,
        }
    }

    /// Runs the graph and compares with the reference, as the CLI's trunk test does: within
    /// `1e-4 * max(1, max |ref|)`.
    fn check(&self, engine: &Engine, workspace: &mut Workspace) {
        let (outputs, _) = self
            .model
            .run(engine, &[("x", &self.input)], workspace)
            .unwrap_or_else(|e| panic!("run: {e}\n{}", self.text));
        let got = &outputs[0].1;
        assert_eq!(got.shape, self.want.shape, "{}", self.text);
        let max_ref = self.want.data.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let tolerance = 1e-4 * max_ref.max(1.0);
        for (i, (a, b)) in got.data.iter().zip(&self.want.data).enumerate() {
            assert!(
                (a - b).abs() <= tolerance,
                "output {i}: jit {a}, reference {b}, tolerance {tolerance}\n{}",
                self.text
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Single primitives.
// ---------------------------------------------------------------------------------------------

/// A random small conv, pool or element-wise key with valid shapes.
fn random_key(rng: &mut Rng) -> PrimitiveKey {
    let layout = |rng: &mut Rng| {
        if rng.flag() {
            Layout::Nchw4c
        } else {
            Layout::Nchw
        }
    };
    let pads = |rng: &mut Rng| {
        let p = rng.range(0, 1);
        Pads::uniform(p)
    };
    loop {
        let key = match rng.range(0, 3) {
            0 => {
                let ic = rng.range(1, 8);
                let oc = rng.range(1, 8);
                let k = rng.range(1, 3);
                let mut d = ConvDesc::new(1, ic, [rng.range(1, 8), rng.range(1, 14)], oc, [k, k]);
                d.pads = pads(rng);
                d.strides = [rng.range(1, 2), rng.range(1, 2)];
                d.bias = rng.flag();
                if rng.flag() {
                    d.post_ops = vec![PostOpDesc::Relu];
                }
                d.src_layout = layout(rng);
                d.dst_layout = layout(rng);
                PrimitiveKey::Conv(d)
            }
            1 => {
                let k = rng.range(1, 3);
                PrimitiveKey::Pool(PoolDesc {
                    kind: if rng.flag() {
                        PoolKind::Max
                    } else {
                        PoolKind::Avg
                    },
                    mb: 1,
                    c: rng.range(1, 8),
                    ih: rng.range(1, 8),
                    iw: rng.range(1, 12),
                    window: PoolWindow {
                        kernel: [k, k],
                        strides: [rng.range(1, 2), rng.range(1, 2)],
                        pads: pads(rng),
                        dilations: [1, 1],
                        ceil_mode: rng.flag(),
                    },
                    count_include_pad: rng.flag(),
                    src_layout: layout(rng),
                    dst_layout: layout(rng),
                    runtime: Default::default(),
                    isa: primjit_codegen::Isa::X128,
                })
            }
            _ => PrimitiveKey::Eltwise(EltwiseDesc {
                kind: if rng.flag() {
                    EltwiseKind::Relu
                } else {
                    EltwiseKind::Add
                },
                shape: [1, rng.range(1, 8), rng.range(1, 6), rng.range(1, 9)],
                layout: layout(rng),
                isa: Isa::X128,
                runtime: RuntimeDims::NONE,
            }),
        };
        if key.validate().is_ok() {
            return key;
        }
    }
}

fn in_layout(t: &Tensor, layout: Layout) -> Vec<f32> {
    match layout {
        Layout::Nchw => t.data.clone(),
        Layout::Nchw4c => to_blocked(&t.data, t.shape.clone().try_into().expect("rank 4")),
    }
}

/// Compiles `key` through the shared engine, runs it on guarded buffers and compares with the
/// reference, with the tolerances of `kernels.rs`.
fn check_single(engine: &Engine, key: &PrimitiveKey, rng: &mut Rng) {
    let p = engine.compile(key).unwrap_or_else(|e| panic!("{key}: {e}"));
    assert_eq!(p.key(), key);
    let guarded = |d: &[f32]| GuardedBuffer::from_slice(d).expect("guarded buffer");
    let eps = f32::EPSILON as f64;
    // (src, weights, extra, dst layout and shape, reference, magnitude and K for a tolerance)
    let (src, weights, extra, dst_layout, dst_shape, want, tol) = match key {
        PrimitiveKey::Conv(d) => {
            let x = rng.tensor(&d.src_shape());
            let w = rng.tensor(&d.weight_shape());
            let b = d.bias.then(|| rng.tensor(&[d.oc]));
            let attrs = ConvAttrs {
                strides: d.strides,
                dilations: d.dilations,
                pads: d.pads,
                groups: d.groups,
            };
            let posts: Vec<Post<'_>> = d.post_ops.iter().map(|_| Post::Relu).collect();
            let want = primjit_reference::conv2d(&x, &w, b.as_ref(), &attrs, &posts);
            let m = primjit_reference::conv2d(
                &abs(&x),
                &abs(&w),
                b.as_ref().map(abs).as_ref(),
                &attrs,
                &[],
            );
            let [_, icg, kh, kw] = d.weight_shape();
            let k = (icg * kh * kw + 1) as f64;
            let packed =
                ConvPlan::new(d).pack_weights(&w.data, b.as_ref().map(|b| &b.data[..]), None);
            (
                in_layout(&x, d.src_layout),
                Some(packed),
                Vec::new(),
                d.dst_layout,
                d.dst_shape(),
                want,
                Some((m, k)),
            )
        }
        PrimitiveKey::Pool(d) => {
            let x = rng.tensor(&d.src_shape());
            let attrs = PoolAttrs {
                kind: d.kind,
                window: d.window,
                count_include_pad: d.count_include_pad,
            };
            let want = primjit_reference::pool2d(&x, &attrs);
            let tol = (d.kind == PoolKind::Avg).then(|| {
                (
                    primjit_reference::pool2d(&abs(&x), &attrs),
                    (d.window.kernel[0] * d.window.kernel[1]) as f64,
                )
            });
            (
                in_layout(&x, d.src_layout),
                None,
                Vec::new(),
                d.dst_layout,
                d.dst_shape(),
                want,
                tol,
            )
        }
        PrimitiveKey::Eltwise(d) => {
            let a = rng.tensor(&d.shape);
            let b = rng.tensor(&d.shape);
            let (want, extra) = match d.kind {
                EltwiseKind::Relu => (primjit_reference::relu(&a), Vec::new()),
                EltwiseKind::Add => (
                    primjit_reference::add(&a, &b),
                    vec![in_layout(&b, d.layout)],
                ),
                _ => unreachable!("the stress keys are relus and adds"),
            };
            (
                in_layout(&a, d.layout),
                None,
                extra,
                d.layout,
                d.shape,
                want,
                None,
            )
        }
        other => panic!("not generated: {other}"),
    };
    let src = guarded(&src);
    let weights = weights.as_deref().map(guarded);
    let extra: Vec<GuardedBuffer> = extra.iter().map(|e| guarded(e)).collect();
    let extra_slices: Vec<&[f32]> = extra.iter().map(|e| e.as_slice()).collect();
    let mut dst = GuardedBuffer::new(dst_layout.buffer_len(dst_shape)).expect("guarded buffer");
    dst.as_mut_slice().fill(f32::NAN);
    engine
        .execute(
            &p,
            ExecArgs {
                src: src.as_slice(),
                weights: weights.as_ref().map(|w| w.as_slice()),
                dst: dst.as_mut_slice(),
                extra: &extra_slices,
                scratch: None,
            },
        )
        .unwrap_or_else(|e| panic!("{key}: {e}"));
    let got = match dst_layout {
        Layout::Nchw => dst.as_slice().to_vec(),
        Layout::Nchw4c => to_nchw(dst.as_slice(), dst_shape),
    };
    assert_eq!(got.len(), want.data.len(), "{key}");
    for (i, (&a, &b)) in got.iter().zip(&want.data).enumerate() {
        let ok = match &tol {
            None => a == b,
            Some((m, k)) => {
                ((a as f64) - (b as f64)).abs() <= (k + 4.0) * eps * m.data[i] as f64 + 1e-30
            }
        };
        assert!(ok, "{key}: output {i}: jit {a}, reference {b}");
    }
}

// ---------------------------------------------------------------------------------------------
// The test.
// ---------------------------------------------------------------------------------------------

fn engine(budget: Budget, threads: usize) -> Engine {
    Engine::new(EngineConfig {
        cache: CacheConfig {
            budget,
            capacity: None,
        },
        threads,
        ..EngineConfig::default()
    })
    .expect("engine")
}

#[test]
fn eight_threads_share_an_engine_while_its_budget_changes() {
    let seconds: f64 = std::env::var("PRIMJIT_STRESS_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3.0);
    let duration = Duration::from_secs_f64(seconds);

    // The baseline, once everything a first compile loads lazily (the host ISA) is in place.
    {
        let warm = engine(Budget::Bytes(0), 1);
        let mut rng = Rng(1);
        check_single(&warm, &random_key(&mut rng), &mut rng);
    }
    let baseline = exec_mappings();
    assert!(wx_mappings().is_empty());

    // Graphs are made ready once (as a server would) and shared by all workers.
    let mut rng = Rng(0x5eed);
    let graphs: Vec<GraphCase> = (0..24).map(|i| GraphCase::new(&mut rng, i)).collect();
    assert!(
        graphs.iter().any(|g| g.model.graph().node_count() >= 3),
        "the generator should make some graphs of several nodes"
    );

    let small = 64 << 10;
    let shared = Arc::new(engine(Budget::Bytes(small), 2));
    let stop = AtomicBool::new(false);
    let graph_runs = AtomicUsize::new(0);
    let single_runs = AtomicUsize::new(0);
    let controls = AtomicUsize::new(0);
    let scans = AtomicUsize::new(0);
    let start = Instant::now();
    let wx_seen = std::thread::scope(|s| {
        let workers: Vec<_> = (0..WORKERS)
            .map(|w| {
                let (engine, graphs, stop, graph_runs, single_runs) =
                    (&*shared, &graphs, &stop, &graph_runs, &single_runs);
                s.spawn(move || {
                    let mut rng = Rng(w as u64 * 7919 + 11);
                    let mut workspace = Workspace::new();
                    while !stop.load(Ordering::Relaxed) {
                        if rng.flag() {
                            let g = &graphs[rng.range(0, graphs.len() - 1)];
                            g.check(engine, &mut workspace);
                            graph_runs.fetch_add(1, Ordering::Relaxed);
                        } else {
                            let key = random_key(&mut rng);
                            check_single(engine, &key, &mut rng);
                            single_runs.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        let controller = {
            let (engine, stop, controls) = (&*shared, &stop, &controls);
            s.spawn(move || {
                let mut rng = Rng(99);
                while !stop.load(Ordering::Relaxed) {
                    let cache = engine.cache();
                    match rng.range(0, 5) {
                        0 => cache.set_budget(Budget::Bytes(0)),
                        1 => cache.set_budget(Budget::Bytes(small / 4)),
                        2 => cache.set_budget(Budget::Bytes(small)),
                        3 => cache.set_budget(Budget::Unlimited),
                        4 => cache.clear(),
                        _ => cache.set_capacity(if rng.flag() {
                            Some(rng.range(1, 8))
                        } else {
                            None
                        }),
                    }
                    controls.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(2));
                }
            })
        };
        let watcher = {
            let (stop, scans) = (&stop, &scans);
            s.spawn(move || {
                let mut seen = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    seen.extend(wx_mappings());
                    scans.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(1));
                }
                seen
            })
        };
        // Bounded: stop after the duration, or as soon as a worker has failed.
        while start.elapsed() < duration && workers.iter().all(|w| !w.is_finished()) {
            std::thread::sleep(Duration::from_millis(20));
        }
        stop.store(true, Ordering::Relaxed);
        let mut failure = None;
        for w in workers {
            if let Err(panic) = w.join() {
                failure.get_or_insert(panic);
            }
        }
        controller.join().expect("controller");
        let seen = watcher.join().expect("watcher");
        if let Some(panic) = failure {
            std::panic::resume_unwind(panic);
        }
        seen
    });
    assert!(
        wx_seen.is_empty(),
        "writable and executable mappings: {wx_seen:#?}"
    );
    let (graph_runs, single_runs) = (graph_runs.into_inner(), single_runs.into_inner());
    assert!(
        graph_runs > 0 && single_runs > 0,
        "{graph_runs} graph runs, {single_runs} single ops"
    );
    assert!(controls.into_inner() > 0 && scans.into_inner() > 0);
    let stats = shared.cache().stats();
    assert!(
        stats.evictions > 0,
        "the small budget should evict: {stats:?}"
    );
    assert_eq!(stats.failed_compiles, 0, "{stats:?}");
    eprintln!(
        "stress: {seconds} s, {graph_runs} graph runs, {single_runs} single ops, {} compiles, {} evictions",
        stats.compiles, stats.evictions
    );

    // Everything the run mapped is unmapped once the engine and the graphs are gone.
    drop(shared);
    drop(graphs);
    assert_eq!(
        exec_mappings(),
        baseline,
        "executable mappings (count, bytes) after the run"
    );
    assert!(wx_mappings().is_empty());
}
