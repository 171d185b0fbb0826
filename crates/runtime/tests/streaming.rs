//! Width-streamed execution: results are the same to the bit as whole-tensor runs, at every
//! width (narrower than a band too), band, thread count, shape mode and convolution
//! algorithm; and the streamed layers' whole tensors never exist.

use primjit_codegen::{ConvAlgoChoice, PrimitiveKey};
use primjit_ir::{Bindings, Params, Tensor, parse, random_tensor};
use primjit_runtime::stream::PITCH_ALIGN;
use primjit_runtime::{
    Budget, CompiledGraph, Engine, EngineConfig, ShapeMode, Streaming, Workspace, node_keys_in,
    stream_band_kernels,
};

/// The trunk in small: a 7x7 stride-2 stem with a fused max pool, a residual block, a
/// stride-2 block with a 1x1 downsample, and a block after it, over 16 and 32 channels (so
/// that `auto` picks Winograd for the 3x3 convs, `%b1` in its stride-2 polyphase form).
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
  param @c1.weight: f32[32, 32, 3, 3]
  param @c2.weight: f32[32, 32, 3, 3]
  %stem = conv2d(%x, @stem.weight, bias=@stem.bias, strides=[2, 2], pads=[3, 3, 3, 3], post=[relu, maxpool(kernel=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])])
  %a1 = conv2d(%stem, @a1.weight, pads=[1, 1, 1, 1], post=[relu])
  %a2 = conv2d(%a1, @a2.weight, pads=[1, 1, 1, 1], post=[add(%stem), relu])
  %b1 = conv2d(%a2, @b1.weight, strides=[2, 2], pads=[1, 1, 1, 1], post=[relu])
  %bd = conv2d(%a2, @bd.weight, strides=[2, 2])
  %b2 = conv2d(%b1, @b2.weight, pads=[1, 1, 1, 1], post=[add(%bd), relu])
  %c1 = conv2d(%b2, @c1.weight, pads=[1, 1, 1, 1], post=[relu])
  %c2 = conv2d(%c1, @c2.weight, pads=[1, 1, 1, 1], post=[add(%b2), relu])
  output y = %c2
}
";

fn model(algo: ConvAlgoChoice, mode: ShapeMode, streaming: Streaming) -> CompiledGraph {
    let graph = parse(TRUNK).expect("parses");
    CompiledGraph::with_conv_algo(&graph, &Params::random(&graph, 11), algo)
        .expect("prepares")
        .with_mode(mode)
        .with_streaming(streaming)
}

/// The dynamic model streaming every run in bands of 8 columns, however small.
fn streamed_in_narrow_bands() -> CompiledGraph {
    model(
        ConvAlgoChoice::Auto,
        ShapeMode::Runtime,
        Streaming::with_band(8).unwrap().above(0),
    )
}

/// `text` with `algo`'s kernels and runtime widths, twice: streamed in bands of 8 columns at
/// every width, and whole.
fn streamed_and_whole(text: &str, algo: ConvAlgoChoice) -> (CompiledGraph, CompiledGraph) {
    let graph = parse(text).expect("parses");
    let params = Params::random(&graph, 3);
    let build = |streaming| {
        CompiledGraph::with_conv_algo(&graph, &params, algo)
            .expect("prepares")
            .with_mode(ShapeMode::Runtime)
            .with_streaming(streaming)
    };
    (
        build(Streaming::with_band(8).expect("a multiple of 4").above(0)),
        build(Streaming::OFF),
    )
}

fn engine(threads: usize) -> Engine {
    Engine::new(EngineConfig {
        threads,
        ..EngineConfig::default()
    })
    .expect("engine")
}

fn input(w: usize) -> Tensor {
    random_tensor(w as u64 + 5, "x", vec![1, 3, 24, w], -1.0, 1.0)
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.data.iter().map(|x| x.to_bits()).collect()
}

/// Widths from 1 pixel to many bands, with every remainder modulo the stem's 4x reduction.
const WIDTHS: [usize; 12] = [1, 3, 4, 17, 30, 61, 64, 97, 130, 203, 256, 389];

#[test]
fn streamed_runs_are_bit_identical_to_whole_tensor_runs() {
    for algo in [ConvAlgoChoice::Auto, ConvAlgoChoice::Direct] {
        for mode in [ShapeMode::Exact, ShapeMode::Runtime] {
            let whole = model(algo, mode, Streaming::OFF);
            let engine1 = engine(1);
            let mut ws = Workspace::new();
            let expected: Vec<Vec<u32>> = WIDTHS
                .iter()
                .map(|&w| {
                    let (out, stats) = whole
                        .run(&engine1, &[("x", &input(w))], &mut ws)
                        .expect("runs");
                    assert!(stats.segments.is_empty());
                    bits(&out[0].1)
                })
                .collect();
            for band in [4, 8, 12, 64] {
                let streamed = model(
                    algo,
                    mode,
                    Streaming::with_band(band)
                        .expect("a multiple of 4")
                        .above(0),
                );
                for threads in [1, 2] {
                    let engine = engine(threads);
                    let mut ws = Workspace::new();
                    for (&w, expected) in WIDTHS.iter().zip(&expected) {
                        let (out, stats) = streamed
                            .run(&engine, &[("x", &input(w))], &mut ws)
                            .expect("runs");
                        let stem_width = w.div_ceil(4);
                        assert_eq!(
                            stats.segments.len(),
                            usize::from(stem_width > 4 * band),
                            "{algo} {mode:?} band {band} W={w}"
                        );
                        assert!(
                            bits(&out[0].1) == *expected,
                            "{algo} {mode:?} band {band}, {threads} threads, W={w}: streamed \
                             and whole-tensor results differ"
                        );
                    }
                }
            }
        }
    }
}

/// The streamed layers keep windows of a band and their halos: the peak activation bytes of
/// a wide run fall far below the whole-tensor run's, and the segment's report adds up.
#[test]
fn streaming_keeps_the_early_layers_out_of_whole_tensors() {
    let w = 8192;
    let engine = engine(1);
    let run = |streaming| {
        let m = model(ConvAlgoChoice::Auto, ShapeMode::Runtime, streaming);
        let mut ws = Workspace::with_budget(Budget::Unlimited);
        m.run(&engine, &[("x", &input(w))], &mut ws)
            .expect("runs")
            .1
    };
    let whole = run(Streaming::OFF);
    let streamed = run(Streaming::with_band(16).expect("a multiple of 4").above(0));
    let segment = &streamed.segments[0];
    assert_eq!(segment.first, "stem");
    assert!(segment.calls >= 8 * segment.sweeps / 2, "{segment}");
    assert!(
        streamed.peak_activation_bytes * 2 < whole.peak_activation_bytes,
        "streamed peak {} against whole-tensor peak {}",
        streamed.peak_activation_bytes,
        whole.peak_activation_bytes
    );
    assert!(segment.peak_bytes >= segment.window_bytes + segment.whole_bytes);
    assert_eq!(streamed.nodes.len(), whole.nodes.len(), "one run per node");
    // Kernels read the windows in place: every streamed node after the stem (which reads the
    // graph's input) takes its source at a window's pitch, and every one whose output stays
    // in the segment writes at its own; unstreamed nodes run dense.
    let position = |name: &str| streamed.nodes.iter().position(|n| n.name == name);
    let (first, last) = (position(&segment.first), position(&segment.last));
    let last = last.expect("the segment's last node ran");
    assert!(last >= 2, "{segment}");
    for (i, node) in streamed.nodes.iter().enumerate() {
        let PrimitiveKey::Conv(d) = &node.call_key else {
            panic!("{}: a conv", node.name)
        };
        let in_window = first.is_some_and(|f| f < i) && i <= last;
        assert_eq!(
            d.pitches.src.is_some(),
            in_window,
            "{}: {}",
            node.name,
            node.call_key
        );
        if node.name == "a1" {
            assert!(d.pitches.dst.is_some(), "{}: {}", node.name, node.call_key);
        }
        // The stem's fused pool writes its pooled rows into its window too.
        if Some(i) == first {
            assert!(
                d.pool.is_some() && d.pitches.dst.is_some(),
                "{}: {}",
                node.name,
                node.call_key
            );
        }
    }
}

/// A block's second conv writes its output over its residual's window, as over its whole
/// tensor in an unstreamed run: the same bits as with a window of its own, in fewer bytes.
#[test]
fn residual_blocks_write_over_their_inputs_windows() {
    let w = 2048;
    let streaming = Streaming::with_band(16).expect("a multiple of 4").above(0);
    let in_place = model(ConvAlgoChoice::Auto, ShapeMode::Runtime, streaming);
    let mut b = Bindings::new();
    b.insert("W".to_string(), w as u64);
    let (segment, schedule) = in_place.stream_plan(&b).expect("plans").expect("streams");
    let index = |name: &str| {
        segment
            .nodes
            .iter()
            .position(|n| in_place.graph().value_name(n.output) == name)
            .unwrap_or_else(|| panic!("%{name} streams"))
    };
    // %a2 adds %stem, %b2 adds %bd; %c2 is the graph's output, written whole.
    assert_eq!(schedule.overwrites[index("a2")], Some(index("stem")));
    assert_eq!(schedule.home(index("a2")), index("stem"));
    assert_eq!(schedule.home(index("b2")), index("bd"));
    assert!(
        segment
            .overwrites
            .iter()
            .zip(&segment.whole)
            .all(|(o, &whole)| !whole || o.is_none())
    );

    let apart =
        model(ConvAlgoChoice::Auto, ShapeMode::Runtime, streaming).with_residual_in_place(false);
    let (_, apart_schedule) = apart.stream_plan(&b).expect("plans").expect("streams");
    assert!(apart_schedule.overwrites.iter().all(Option::is_none));
    for threads in [1, 2] {
        let engine = engine(threads);
        let run = |m: &CompiledGraph| {
            let mut ws = Workspace::with_budget(Budget::Unlimited);
            m.run(&engine, &[("x", &input(w))], &mut ws).expect("runs")
        };
        let (out, stats) = run(&in_place);
        let (apart_out, apart_stats) = run(&apart);
        assert!(
            bits(&out[0].1) == bits(&apart_out[0].1),
            "{threads} threads"
        );
        let (held, apart_held) = (&stats.segments[0], &apart_stats.segments[0]);
        assert!(
            held.window_bytes < apart_held.window_bytes,
            "windows: {} bytes written over residuals, {} apart",
            held.window_bytes,
            apart_held.window_bytes
        );
        assert!(held.peak_bytes < apart_held.peak_bytes);
    }
}

/// A conv whose residual another node still reads behind its calls' columns cannot write
/// over the residual's window: the schedule gives it a window of its own, and the results
/// stay those of an unstreamed run.
#[test]
fn an_overwrite_the_schedule_cannot_honour_gets_a_window_of_its_own() {
    // %late reads %r (as its input) only as far as %q3 allows, three 3x3 convs behind %r;
    // %i, the last reader of %r, adds it and gets ahead of %late through %u.
    let text = "
graph lagging_reader {
  input %x: f32[1, 4, 6, W]
  param @r.weight: f32[4, 4, 1, 1]
  param @q1.weight: f32[4, 4, 3, 3]
  param @q2.weight: f32[4, 4, 3, 3]
  param @q3.weight: f32[4, 4, 3, 3]
  param @late.weight: f32[4, 4, 1, 1]
  param @u.weight: f32[4, 4, 1, 1]
  param @i.weight: f32[4, 4, 1, 1]
  param @z.weight: f32[4, 4, 1, 1]
  %r = conv2d(%x, @r.weight)
  %q1 = conv2d(%r, @q1.weight, pads=[1, 1, 1, 1])
  %q2 = conv2d(%q1, @q2.weight, pads=[1, 1, 1, 1])
  %q3 = conv2d(%q2, @q3.weight, pads=[1, 1, 1, 1])
  %late = conv2d(%r, @late.weight, post=[add(%q3)])
  %u = conv2d(%r, @u.weight)
  %i = conv2d(%u, @i.weight, post=[add(%r), relu])
  %z = conv2d(%i, @z.weight, post=[add(%late)])
  output y = %z
}
";
    let (streamed, whole) = streamed_and_whole(text, ConvAlgoChoice::Direct);
    let w = 203;
    let mut b = Bindings::new();
    b.insert("W".to_string(), w as u64);
    let (segment, schedule) = streamed.stream_plan(&b).expect("plans").expect("streams");
    let name = |j: usize| streamed.graph().value_name(segment.nodes[j].output);
    let i = (0..segment.nodes.len())
        .find(|&j| name(j) == "i")
        .expect("%i streams");
    assert_eq!(
        segment.overwrites[i].map(name),
        Some("r"),
        "liveness allows it"
    );
    assert_eq!(schedule.overwrites[i], None, "the schedule does not");
    assert_eq!(schedule.home(i), i);
    assert!(schedule.window_pitch[i] > 0);

    let x = random_tensor(9, "x", vec![1, 4, 6, w], -1.0, 1.0);
    let engine = engine(2);
    let mut ws = Workspace::new();
    let (expected, _) = whole.run(&engine, &[("x", &x)], &mut ws).expect("runs");
    let (out, stats) = streamed.run(&engine, &[("x", &x)], &mut ws).expect("runs");
    assert_eq!(stats.segments.len(), 1);
    assert!(bits(&out[0].1) == bits(&expected[0].1));
}

/// A conv padded by its whole window has columns that read only padding: the segment ends
/// before it (the band calls' input ranges ran backwards and wrapped), and results match.
#[test]
fn a_conv_padded_past_its_window_ends_the_segment() {
    let text = "
graph wide_pads {
  input %x: f32[1, 4, 6, W]
  param @a.weight: f32[4, 4, 3, 3]
  param @b.weight: f32[4, 4, 1, 1]
  param @c.weight: f32[4, 4, 3, 3]
  %a = conv2d(%x, @a.weight, pads=[1, 1, 1, 1])
  %b = conv2d(%a, @b.weight, pads=[0, 65, 0, 68])
  %c = conv2d(%b, @c.weight, pads=[1, 1, 1, 1])
  output y = %c
}
";
    let (streamed, whole) = streamed_and_whole(text, ConvAlgoChoice::Direct);
    let engine = engine(2);
    let mut ws = Workspace::new();
    for w in [40, 203] {
        let mut b = Bindings::new();
        b.insert("W".to_string(), w as u64);
        let (segment, _) = streamed.stream_plan(&b).expect("plans").expect("streams");
        assert_eq!(segment.nodes.len(), 1, "only %a streams");
        let x = random_tensor(9, "x", vec![1, 4, 6, w], -1.0, 1.0);
        let (expected, _) = whole.run(&engine, &[("x", &x)], &mut ws).expect("runs");
        let (out, _) = streamed.run(&engine, &[("x", &x)], &mut ws).expect("runs");
        assert_eq!(out[0].1.shape, [1, 4, 6, w + 133]);
        assert!(bits(&out[0].1) == bits(&expected[0].1), "W={w}");
    }
}

/// A Winograd conv whose transformed weights stream from memory once per block of tiles
/// (256 channels: 9.4 MB) ends the segment where a band call's few tiles would read them far
/// more often per flop than a whole call; the same graph over 32 channels (weights that stay
/// in cache) streams through. Both run bit-identical to whole tensors.
#[test]
fn a_conv_whose_band_calls_reread_its_weights_ends_the_segment() {
    let graph = |c: usize| {
        format!(
            "
graph heavy {{
  input %x: f32[1, 8, 8, W]
  param @a.weight: f32[{c}, 8, 3, 3]
  param @b.weight: f32[{c}, {c}, 3, 3]
  %a = conv2d(%x, @a.weight, pads=[1, 1, 1, 1], post=[relu])
  %b = conv2d(%a, @b.weight, pads=[1, 1, 1, 1])
  output y = %b
}}
"
        )
    };
    let engine = engine(2);
    let mut ws = Workspace::new();
    let mut b = Bindings::new();
    b.insert("W".to_string(), 400);
    let x = random_tensor(5, "x", vec![1, 8, 8, 400], -1.0, 1.0);
    for (channels, streamed_nodes) in [(256, 1), (32, 2)] {
        let (streamed, whole) = streamed_and_whole(&graph(channels), ConvAlgoChoice::Winograd);
        let (segment, _) = streamed.stream_plan(&b).expect("plans").expect("streams");
        assert_eq!(segment.nodes.len(), streamed_nodes, "{channels} channels");
        match segment.ends_before {
            // 4 tiles a band call in one block, against 4 blocks of 200 tiles whole.
            Some((node, reads)) => {
                assert_eq!((channels, node), (256, 1));
                assert!((reads - 12.5).abs() < 1e-9, "{reads}");
            }
            None => assert_eq!(channels, 32),
        }
        let (expected, _) = whole.run(&engine, &[("x", &x)], &mut ws).expect("runs");
        let (out, _) = streamed.run(&engine, &[("x", &x)], &mut ws).expect("runs");
        assert!(
            bits(&out[0].1) == bits(&expected[0].1),
            "{channels} channels"
        );
    }
}

/// The plan names the streamed nodes, and a run at most four bands wide streams nothing.
#[test]
fn the_stream_plan_covers_the_wide_layers() {
    let m = model(
        ConvAlgoChoice::Auto,
        ShapeMode::Runtime,
        Streaming::ON.above(0),
    );
    let bind = |w: u64| {
        let mut b = Bindings::new();
        b.insert("W".to_string(), w);
        b
    };
    assert!(m.stream_plan(&bind(1024)).expect("plans").is_none());
    let (segment, schedule) = m.stream_plan(&bind(4000)).expect("plans").expect("streams");
    assert!(segment.nodes.len() >= 3, "the stem and the first block");
    // Every node's calls cover its output once, left to right, from multiples of 4, and a
    // windowed output's window (its home's), at its pitch, holds each call's columns and
    // those still read.
    for (i, node) in segment.nodes.iter().enumerate() {
        let home = schedule.home(i);
        let pitch = schedule.window_pitch[home];
        assert_eq!(pitch == 0, segment.whole[i], "{i}: pitch {pitch}");
        assert_eq!(pitch % PITCH_ALIGN, 0);
        assert!(pitch >= schedule.window_columns[home]);
        // Only a value written over its residual lies in another node's window.
        assert_eq!(home != i, schedule.overwrites[i].is_some(), "{i}");
        assert!(home <= i);
        let mut next = 0;
        for c in schedule.calls.iter().filter(|c| c.node == i) {
            assert_eq!(c.x0, next);
            assert_eq!(c.x0 % 4, 0);
            assert!(c.keep_from <= c.x0);
            if !segment.whole[i] {
                assert!(c.x1 - c.keep_from <= pitch, "{i}: {c:?} in rows of {pitch}");
            }
            next = c.x1;
        }
        assert_eq!(next, node.out_width());
    }
}

/// The band kernels that `stream_band_kernels` lists (`dump --bands`) are the primitives a
/// streamed run compiles for its segment, and their calls add up to the schedule's.
#[test]
fn the_listed_band_kernels_are_the_ones_a_run_compiles() {
    let mut graph = parse(TRUNK).expect("parses");
    primjit_ir::passes::optimize(&mut graph);
    let streaming = Streaming::with_band(8).unwrap().above(0);
    for mode in [ShapeMode::Exact, ShapeMode::Runtime] {
        for w in [203, 389] {
            let mut bindings = Bindings::new();
            bindings.insert("W".to_string(), w as u64);
            let m = model(ConvAlgoChoice::Auto, mode, streaming);
            let (segment, schedule) = m.stream_plan(&bindings).unwrap().expect("streams");
            let bands = stream_band_kernels(
                &graph,
                &bindings,
                mode,
                ConvAlgoChoice::Auto,
                m.isa(),
                streaming,
            )
            .unwrap()
            .expect("streams");
            let nodes =
                node_keys_in(&graph, &bindings, mode, ConvAlgoChoice::Auto, m.isa()).unwrap();
            for (i, s) in segment.nodes.iter().enumerate() {
                let name = &nodes[s.node].0;
                let listed: usize = bands
                    .iter()
                    .filter(|b| b.node == *name)
                    .map(|b| b.calls)
                    .sum();
                let scheduled = schedule.calls.iter().filter(|c| c.node == i).count();
                assert_eq!(listed, scheduled, "{mode:?}, W={w}: %{name}");
            }
            let mut expected: Vec<PrimitiveKey> = Vec::new();
            let in_segment = |n: usize| segment.nodes.iter().any(|s| s.node == n);
            let rest = nodes.iter().enumerate().filter(|(n, _)| !in_segment(*n));
            for key in bands
                .iter()
                .map(|b| &b.key)
                .chain(rest.map(|(_, (_, k))| k))
            {
                if !expected.contains(key) {
                    expected.push(key.clone());
                }
            }
            let engine = engine(1);
            m.run(&engine, &[("x", &input(w))], &mut Workspace::new())
                .expect("runs");
            let mut compiled: Vec<String> = engine
                .cache()
                .entries()
                .into_iter()
                .map(|e| e.key)
                .collect();
            let mut listed: Vec<String> = expected.iter().map(|k| k.to_string()).collect();
            compiled.sort();
            listed.sort();
            assert_eq!(compiled, listed, "{mode:?}, W={w}");
        }
    }
}

/// A streamed segment looks each of its band kernels up once, however many calls it serves:
/// with a cache that keeps nothing (budget 0), a run compiles as many kernels as a run with a
/// cache does, not one per call.
#[test]
fn a_run_without_a_cache_compiles_each_kernel_once() {
    let m = streamed_in_narrow_bands();
    let x = input(389);
    let with_budget = |budget: Budget| {
        Engine::new(EngineConfig {
            threads: 2,
            cache: primjit_runtime::CacheConfig {
                budget,
                capacity: None,
            },
            ..EngineConfig::default()
        })
        .expect("engine")
    };
    let mut runs = Vec::new();
    for budget in [Budget::DEFAULT, Budget::Bytes(0)] {
        let engine = with_budget(budget);
        let (y, stats) = m
            .run(&engine, &[("x", &x)], &mut Workspace::new())
            .expect("runs");
        let calls = stats.segments.iter().map(|s| s.calls).sum::<usize>();
        runs.push((bits(&y[0].1), engine.cache().stats(), calls));
    }
    let [(cached, with_cache, calls), (uncached, without, _)] = &runs[..] else {
        unreachable!("two runs")
    };
    assert_eq!(cached, uncached);
    assert_eq!(without.entries, 0, "{without:?}");
    assert!(
        *calls > with_cache.compiles as usize,
        "{calls} band calls of {} kernels",
        with_cache.compiles
    );
    assert_eq!(without.compiles, with_cache.compiles, "{without:?}");
}

/// Streamed runs reuse the workspace's buffers: once settled, runs at one width, or
/// alternating between two, map at most one small buffer each (a halo's size class moving
/// up), and the bytes held stay put.
#[test]
fn repeated_streamed_runs_reuse_their_buffers() {
    let m = streamed_in_narrow_bands();
    let engine = engine(2);
    let mut ws = Workspace::with_budget(Budget::Unlimited);
    for widths in [[300, 300], [300, 160]] {
        for _ in 0..3 {
            for w in widths {
                m.run(&engine, &[("x", &input(w))], &mut ws).expect("runs");
            }
        }
        let settled = ws.stats();
        let rounds = 5;
        for _ in 0..rounds {
            for w in widths {
                let (_, stats) = m.run(&engine, &[("x", &input(w))], &mut ws).expect("runs");
                assert_eq!(stats.segments.len(), 1);
            }
        }
        let now = ws.stats();
        assert!(
            now.allocations - settled.allocations <= 2 * rounds as u64,
            "{widths:?}: {settled:?} then {now:?}"
        );
        assert!(
            now.bytes <= settled.bytes + settled.bytes / 50,
            "{widths:?}: {settled:?} then {now:?}"
        );
    }
}

/// Without a choice a graph streams where its keys take widths at run time; a band must be a
/// positive multiple of 4, and `on`/`off` parse strictly.
#[test]
fn streaming_defaults_follow_the_shape_mode_and_bands_are_checked() {
    let graph = parse(TRUNK).expect("parses");
    let m = CompiledGraph::new(&graph, &Params::random(&graph, 1)).expect("prepares");
    assert_eq!(m.streaming(), Streaming::OFF);
    let m = m.with_mode(ShapeMode::Runtime);
    assert_eq!(m.streaming(), Streaming::ON);
    assert_eq!(m.with_streaming(Streaming::OFF).streaming(), Streaming::OFF);
    for bad in [0, 6, 30, (1 << 31) + 4, 1 << 62] {
        let e = Streaming::with_band(bad).expect_err("not a multiple of 4 up to 2^31");
        assert_eq!(
            e.to_string(),
            format!("a band of {bad} columns: expected a positive multiple of 4 up to 2147483648")
        );
    }
    assert_eq!(Streaming::with_band(32).unwrap().band(), Some(32));
    assert_eq!(Streaming::with_band(1 << 31).unwrap().band(), Some(1 << 31));
    assert_eq!(Streaming::ON.threshold(), 32 << 20);
    // Below the threshold a run keeps its whole tensors: this graph's are small.
    let small = CompiledGraph::new(&graph, &Params::random(&graph, 1))
        .expect("prepares")
        .with_mode(ShapeMode::Runtime);
    let mut b = Bindings::new();
    b.insert("W".to_string(), 4000);
    assert!(small.stream_plan(&b).expect("plans").is_none());
    let forced = small.with_streaming(Streaming::ON.above(0));
    assert!(forced.stream_plan(&b).expect("plans").is_some());
    assert_eq!("on".parse::<Streaming>(), Ok(Streaming::ON));
    assert_eq!("off".parse::<Streaming>(), Ok(Streaming::OFF));
    assert_eq!(
        "yes".parse::<Streaming>().unwrap_err().to_string(),
        "unknown streaming setting `yes`: expected on or off"
    );
}

/// Under a byte budget, the band buffers a streamed segment leaves free are returned before the
/// whole tensors after it are mapped, instead of staying under them: the workspace's peak is
/// lower than with an unlimited budget, and the results are the same bits.
#[test]
fn a_budget_returns_the_segments_bands_before_the_whole_tensors() {
    let m = streamed_in_narrow_bands();
    let engine = engine(2);
    let x = input(300);
    let run = |budget: Budget| {
        let mut ws = Workspace::with_budget(budget);
        let (out, stats) = m.run(&engine, &[("x", &x)], &mut ws).expect("runs");
        assert_eq!(stats.segments.len(), 1);
        (bits(&out[0].1), ws.stats().peak_bytes)
    };
    let (kept, kept_peak) = run(Budget::Unlimited);
    let (returned, returned_peak) = run(Budget::Bytes(0));
    assert_eq!(kept, returned);
    assert!(
        returned_peak < kept_peak,
        "{returned_peak} bytes at the peak with the bands returned, {kept_peak} kept"
    );
}

/// With `compile_ahead`, a run on two threads compiles the kernels it lacks (band kernels and
/// whole nodes') at once, ahead of their first use, and the cache's statistics come out as a
/// one-thread run's; a run whose new kernels might not fit the cache compiles them one by one,
/// as they come, and so does every run by default.
#[test]
fn a_run_on_two_threads_compiles_its_new_kernels_ahead_with_the_same_statistics() {
    let m = streamed_in_narrow_bands();
    let x = input(203);
    let with = |threads: usize, budget: Budget, compile_ahead: bool| {
        Engine::new(EngineConfig {
            threads,
            cache: primjit_runtime::CacheConfig {
                budget,
                capacity: None,
            },
            compile_ahead,
            ..EngineConfig::default()
        })
        .expect("engine")
    };
    for (budget, compile_ahead) in [
        (Budget::DEFAULT, true),
        (Budget::Bytes(1 << 20), true),
        (Budget::DEFAULT, false),
    ] {
        let one = with(1, budget, compile_ahead);
        let two = with(2, budget, compile_ahead);
        let mut outputs = Vec::new();
        for engine in [&one, &two] {
            let mut ws = Workspace::new();
            for _ in 0..2 {
                let (y, _) = m.run(engine, &[("x", &x)], &mut ws).expect("runs");
                outputs.push(bits(&y[0].1));
            }
        }
        assert!(outputs.windows(2).all(|p| p[0] == p[1]), "{budget}");
        let (s1, s2) = (one.cache().stats(), two.cache().stats());
        assert_eq!(s1.prefetched, 0, "{budget}");
        assert!(s1.compiles >= 5, "{s1:?}");
        if budget == Budget::DEFAULT && compile_ahead {
            // Every kernel of the run was compiled ahead: the list the run prefetches is the
            // list it looks up.
            assert_eq!(s2.prefetched, s2.compiles, "{s2:?}");
        } else {
            assert_eq!(s2.prefetched, 0, "{s2:?}");
        }
        let counts = |s: &primjit_runtime::CacheStats| {
            (
                s.compiles,
                s.hits,
                s.misses,
                s.failed_compiles,
                s.entries,
                s.evictions,
            )
        };
        assert_eq!(counts(&s1), counts(&s2), "{budget}");
    }
}
