//! Activation memory: the workspace's byte budget (results do not depend on it, and its
//! statistics move as documented: `WorkspaceStats`, `CompiledGraph::run_into`), and convs
//! that write their output over their residual.

use primjit_codegen::{
    Activation, ConvAlgo, ConvAlgoChoice, ConvDesc, ConvPlan, Isa, Layout, PostOpDesc, PrimitiveKey,
};
use primjit_ir::{Pads, Params, Tensor, parse, random_tensor};
use primjit_runtime::{
    Budget, CompiledGraph, ConfigError, Engine, EngineConfig, ExecArgs, ExecError, GraphError,
    RuntimeError, ShapeMode, Streaming, TensorView, Workspace, WorkspaceConfig,
};

/// A stem and two residual blocks with 16 channels: at W=100 a tensor takes 125 KiB in
/// nChw4c, above the mapping threshold; at W=7 it stays on the heap.
const BLOCKS: &str = "
graph blocks {
  input %x: f32[1, 3, 20, W]
  param @stem.weight: f32[16, 3, 3, 3]
  param @b1.conv1.weight: f32[16, 16, 3, 3]
  param @b1.conv2.weight: f32[16, 16, 3, 3]
  param @b2.conv1.weight: f32[16, 16, 3, 3]
  param @b2.conv2.weight: f32[16, 16, 3, 3]
  %stem = conv2d(%x, @stem.weight, pads=[1, 1, 1, 1], post=[relu])
  %b1.conv1 = conv2d(%stem, @b1.conv1.weight, pads=[1, 1, 1, 1], post=[relu])
  %b1.conv2 = conv2d(%b1.conv1, @b1.conv2.weight, pads=[1, 1, 1, 1], post=[add(%stem), relu])
  %b2.conv1 = conv2d(%b1.conv2, @b2.conv1.weight, pads=[1, 1, 1, 1], post=[relu])
  %b2.conv2 = conv2d(%b2.conv1, @b2.conv2.weight, pads=[1, 1, 1, 1], post=[add(%b1.conv2), relu])
  output y = %b2.conv2
}
";

/// Wide, narrow and wide again, so that buffers grow, shrink and grow.
const WIDTHS: [usize; 5] = [100, 7, 173, 40, 100];

/// The blocks as whole tensors: these tests count the whole-tensor runner's buffers
/// (streaming has its own, in `streaming.rs`).
fn model(mode: ShapeMode) -> CompiledGraph {
    let graph = parse(BLOCKS).expect("parses");
    CompiledGraph::new(&graph, &Params::random(&graph, 3))
        .expect("prepares")
        .with_mode(mode)
        .with_streaming(Streaming::OFF)
}

fn engine(threads: usize, budget: Budget) -> Engine {
    let mut config = EngineConfig {
        threads,
        ..EngineConfig::default()
    };
    config.workspace.budget = budget;
    Engine::new(config).expect("engine")
}

fn input(w: usize) -> Tensor {
    random_tensor(w as u64, "x", vec![1, 3, 20, w], -1.0, 1.0)
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.data.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn results_are_bit_identical_across_workspace_budgets_and_threads() {
    for mode in [ShapeMode::Exact, ShapeMode::Runtime] {
        let model = model(mode);
        let mut expected: Vec<Vec<u32>> = Vec::new();
        // More threads than cores: the run's waiting threads sleep instead of spinning.
        let oversubscribed = 4 * std::thread::available_parallelism().map_or(1, |n| n.get());
        for threads in [1, 2, oversubscribed] {
            for budget in [
                Budget::Unlimited,
                Budget::Bytes(0),
                Budget::Bytes(200 << 10),
            ] {
                let engine = engine(threads, budget);
                let mut ws = Workspace::new();
                for (i, &w) in WIDTHS.iter().enumerate() {
                    let (out, _) = model
                        .run(&engine, &[("x", &input(w))], &mut ws)
                        .expect("runs");
                    let got = bits(&out[0].1);
                    match expected.get(i) {
                        None => expected.push(got),
                        Some(e) => assert!(
                            *e == got,
                            "{mode:?}, W={w}, {threads} threads, budget {budget}: results differ"
                        ),
                    }
                }
            }
        }
    }
}

#[test]
fn workspace_stats_follow_the_budget() {
    let model = model(ShapeMode::Exact);
    let x = input(100);

    // Unlimited: the workspace keeps everything; a second run at the same width maps nothing.
    let unlimited = engine(1, Budget::Unlimited);
    let mut ws = Workspace::new();
    let (_, first) = model.run(&unlimited, &[("x", &x)], &mut ws).unwrap();
    let kept = first.workspace;
    assert!(kept.bytes > 0);
    assert_eq!(kept.bytes, kept.peak_bytes);
    assert_eq!(kept.returned_bytes, 0);
    assert!(kept.bytes >= first.peak_activation_bytes);
    let (_, second) = model.run(&unlimited, &[("x", &x)], &mut ws).unwrap();
    assert_eq!(second.workspace, kept, "a repeated width maps nothing");

    // Budget 0: nothing stays after a run, and everything mapped is returned, every run.
    let engine0 = engine(1, Budget::Bytes(0));
    let mut ws0 = Workspace::new();
    let (_, a) = model.run(&engine0, &[("x", &x)], &mut ws0).unwrap();
    assert_eq!(a.workspace.bytes, 0);
    assert_eq!(a.workspace.peak_bytes, kept.peak_bytes);
    assert_eq!(a.workspace.returned_bytes, kept.peak_bytes as u64);
    let (_, b) = model.run(&engine0, &[("x", &x)], &mut ws0).unwrap();
    assert_eq!(b.workspace.bytes, 0);
    assert_eq!(b.workspace.returned_bytes, 2 * kept.peak_bytes as u64);
    assert_eq!(b.workspace.allocations, 2 * a.workspace.allocations);

    // A workspace's own budget overrides the engine's: between the two, it keeps what fits.
    let budget = kept.peak_bytes / 2;
    let mut small = Workspace::with_budget(Budget::Bytes(budget));
    for &w in &WIDTHS {
        let (_, s) = model
            .run(&unlimited, &[("x", &input(w))], &mut small)
            .unwrap();
        assert!(
            s.workspace.bytes <= budget,
            "W={w}: {} > {budget}",
            s.workspace.bytes
        );
        assert!(s.workspace.peak_bytes >= s.peak_activation_bytes);
    }
    assert!(small.stats().bytes > 0, "buffers that fit are kept");
    assert!(small.stats().returned_bytes > 0);
}

#[test]
fn run_into_writes_outputs_in_place_and_matches_run() {
    let model = model(ShapeMode::Runtime);
    let engine = engine(2, Budget::Bytes(0));
    // Inputs are views of one buffer allocated at the widest width.
    let widest = *WIDTHS.iter().max().unwrap();
    let source = input(widest);
    let mut outputs = vec![Tensor {
        shape: Vec::new(),
        data: Vec::with_capacity(16 * 20 * widest),
    }];
    let data_at = outputs[0].data.as_ptr();
    let mut ws = Workspace::new();
    for &w in &WIDTHS {
        let shape = [1, 3, 20, w];
        let view = TensorView {
            shape: &shape,
            data: &source.data[..3 * 20 * w],
        };
        model
            .run_into(&engine, &[("x", view)], &mut outputs, &mut ws)
            .unwrap();
        let owned = Tensor {
            shape: shape.to_vec(),
            data: view.data.to_vec(),
        };
        let (expected, _) = model.run(&engine, &[("x", &owned)], &mut ws).unwrap();
        assert_eq!(outputs[0].shape, vec![1, 16, 20, w]);
        assert_eq!(bits(&outputs[0]), bits(&expected[0].1), "W={w}");
        assert_eq!(
            outputs[0].data.as_ptr(),
            data_at,
            "the output is not reallocated"
        );
    }
    let err = model
        .run_into(
            &engine,
            &[("x", TensorView::from(&source))],
            &mut [],
            &mut ws,
        )
        .unwrap_err();
    assert_eq!(
        err,
        GraphError::OutputCount {
            expected: 1,
            found: 0
        }
    );
    assert_eq!(
        err.to_string(),
        "the graph has 1 outputs but 0 output tensors were given"
    );
}

#[test]
fn workspace_budget_variable_is_parsed_strictly() {
    let config = |value: &str| {
        EngineConfig::from_vars(|name| (name == "PRIMJIT_WORKSPACE_BUDGET").then(|| value.into()))
    };
    assert_eq!(
        config("16MiB").unwrap().workspace.budget,
        Budget::Bytes(16 << 20)
    );
    assert_eq!(config("0").unwrap().workspace.budget, Budget::Bytes(0));
    assert_eq!(
        config("unlimited").unwrap().workspace.budget,
        Budget::Unlimited
    );
    assert_eq!(
        EngineConfig::from_vars(|_| None).unwrap().workspace,
        WorkspaceConfig::default()
    );
    for bad in ["16MB", "-1", "lots", ""] {
        let err = config(bad).unwrap_err();
        assert!(
            matches!(
                &err,
                ConfigError::Invalid {
                    name: "PRIMJIT_WORKSPACE_BUDGET",
                    ..
                }
            ),
            "{bad}: {err:?}"
        );
        assert!(
            err.to_string()
                .starts_with(&format!("PRIMJIT_WORKSPACE_BUDGET={bad}: ")),
            "{err}"
        );
    }
}

// ---- in-place residuals ----

/// Bytes of one 16-channel tensor of `BLOCKS` at width `w` in nChw4c.
fn tensor_bytes(w: usize) -> usize {
    16 * 20 * w * 4
}

#[test]
fn residual_blocks_write_over_their_input_bit_identically_with_two_tensors_live() {
    assert_eq!(
        model(ShapeMode::Exact).residual_overwrites(),
        vec![
            ("b1.conv2".to_string(), "stem".to_string()),
            ("b2.conv2".to_string(), "b1.conv2".to_string())
        ]
    );
    let graph = parse(BLOCKS).unwrap();
    let params = Params::random(&graph, 3);
    for algo in [ConvAlgoChoice::Direct, ConvAlgoChoice::Winograd] {
        for mode in [ShapeMode::Exact, ShapeMode::Runtime] {
            let in_place = CompiledGraph::with_conv_algo(&graph, &params, algo)
                .unwrap()
                .with_mode(mode)
                .with_streaming(Streaming::OFF);
            let apart = in_place.clone().with_residual_in_place(false);
            for threads in [1, 2] {
                let engine = engine(threads, Budget::Unlimited);
                let mut ws = Workspace::new();
                for &w in &WIDTHS {
                    let x = input(w);
                    let (a, sa) = in_place.run(&engine, &[("x", &x)], &mut ws).unwrap();
                    let (b, sb) = apart.run(&engine, &[("x", &x)], &mut ws).unwrap();
                    let case = format!("{algo:?}, {mode:?}, W={w}, {threads} threads");
                    assert!(bits(&a[0].1) == bits(&b[0].1), "{case}: in place differs");
                    // A block's input, conv1's output and conv2's output were live at once;
                    // now conv2's output takes its input's place. (Winograd adds its
                    // transformed tiles, the same in both.)
                    assert_eq!(
                        sb.peak_activation_bytes - sa.peak_activation_bytes,
                        tensor_bytes(w),
                        "{case}"
                    );
                    if algo == ConvAlgoChoice::Direct {
                        assert_eq!(sb.peak_activation_bytes, 3 * tensor_bytes(w), "{case}");
                        assert_eq!(sa.peak_activation_bytes, 2 * tensor_bytes(w), "{case}");
                    }
                }
            }
        }
    }
}

#[test]
fn a_residual_read_later_or_by_the_conv_itself_is_not_overwritten() {
    let text = "
graph kept {
  input %x: f32[1, 4, 5, 6]
  param @a.weight: f32[4, 4, 3, 3]
  param @b.weight: f32[4, 4, 3, 3]
  param @c.weight: f32[4, 4, 3, 3]
  %a = conv2d(%x, @a.weight, pads=[1, 1, 1, 1])
  %b = conv2d(%a, @b.weight, pads=[1, 1, 1, 1], post=[add(%a)])
  %c = conv2d(%b, @c.weight, pads=[1, 1, 1, 1], post=[add(%a)])
  %d = conv2d(%c, @c.weight, pads=[1, 1, 1, 1], post=[add(%b)])
  output y = %d
  output z = %b
}
";
    let graph = parse(text).unwrap();
    let model = CompiledGraph::new(&graph, &Params::random(&graph, 1)).unwrap();
    // %b reads %a as its input too; %c is %a's last reader; %b is an output.
    assert_eq!(
        model.residual_overwrites(),
        vec![("c".to_string(), "a".to_string())]
    );
    let engine = engine(2, Budget::Bytes(0));
    let x = random_tensor(1, "x", vec![1, 4, 5, 6], -1.0, 1.0);
    let mut ws = Workspace::new();
    let (a, _) = model.run(&engine, &[("x", &x)], &mut ws).unwrap();
    let (b, _) = model
        .clone()
        .with_residual_in_place(false)
        .run(&engine, &[("x", &x)], &mut ws)
        .unwrap();
    for ((_, a), (_, b)) in a.iter().zip(&b) {
        assert!(bits(a) == bits(b));
    }
}

fn residual_conv(channels: usize) -> ConvDesc {
    let mut d = ConvDesc::new(1, channels, [5, 9], channels, [3, 3]);
    d.pads = Pads::uniform(1);
    d.bias = true;
    d.post_ops = vec![PostOpDesc::Add, PostOpDesc::Relu];
    d.src_layout = Layout::Nchw4c;
    d.dst_layout = Layout::Nchw4c;
    d
}

#[test]
fn only_kernels_that_read_each_residual_element_right_before_writing_it_run_over_it() {
    let engine = engine(2, Budget::Unlimited);
    let d = residual_conv(16);
    assert!(ConvPlan::new(&d).residual_in_place());
    let key = PrimitiveKey::Conv(d.clone());
    let p = engine.compile(&key).unwrap();
    assert!(p.residual_in_place());
    let specs = key.buffers();
    let data = |i: usize, len: usize| random_tensor(i as u64, "b", vec![len], -1.0, 1.0).data;
    let src = data(0, specs[0].len);
    let weights = data(1, specs[1].len);
    let residual = data(2, specs[3].len);
    let mut apart = vec![0.0; specs[2].len];
    engine
        .execute(
            &p,
            ExecArgs {
                src: &src,
                weights: Some(&weights),
                dst: &mut apart,
                extra: &[&residual],
                scratch: None,
            },
        )
        .unwrap();
    let mut over = residual.clone();
    engine
        .execute_over_residual(
            &p,
            ExecArgs {
                src: &src,
                weights: Some(&weights),
                dst: &mut over,
                extra: &[],
                scratch: None,
            },
            None,
        )
        .unwrap();
    assert!(
        apart
            .iter()
            .map(|x| x.to_bits())
            .eq(over.iter().map(|x| x.to_bits()))
    );

    // Winograd's output transform reads each residual element right before storing the
    // output element at the same place: in place too.
    let mut wino = residual_conv(16);
    wino.algo = ConvAlgo::WinogradF4x3;
    let key = PrimitiveKey::Conv(wino.clone());
    let p = engine.compile(&key).unwrap();
    assert!(p.residual_in_place());
    let specs = key.buffers();
    let weights = data(1, specs[1].len);
    let mut scratch = vec![0.0; wino.scratch_len() * engine.threads()];
    let mut apart = vec![0.0; specs[2].len];
    engine
        .execute(
            &p,
            ExecArgs {
                src: &src,
                weights: Some(&weights),
                dst: &mut apart,
                extra: &[&residual],
                scratch: Some(&mut scratch),
            },
        )
        .unwrap();
    let mut over = residual.clone();
    engine
        .execute_over_residual(
            &p,
            ExecArgs {
                src: &src,
                weights: Some(&weights),
                dst: &mut over,
                extra: &[],
                scratch: Some(&mut scratch),
            },
            None,
        )
        .unwrap();
    assert!(
        apart
            .iter()
            .map(|x| x.to_bits())
            .eq(over.iter().map(|x| x.to_bits()))
    );

    // Every activation runs in a wide tile's registers, before or after the `add`: each
    // residual element is still read right before its destination element is written, so
    // the kernel runs in place at every tier.
    let elu = PostOpDesc::Act(Activation::Elu { alpha: 1.0 });
    let hardswish = PostOpDesc::Act(Activation::HardSwish);
    for posts in [
        vec![elu, PostOpDesc::Add],
        vec![PostOpDesc::Add, elu],
        vec![hardswish, PostOpDesc::Add],
    ] {
        for isa in Isa::ALL {
            let mut d = residual_conv(16);
            d.post_ops = posts.clone();
            d.isa = d.tier_for(isa);
            assert!(
                ConvPlan::new(&d).residual_in_place(),
                "{posts:?} at {}",
                d.isa
            );
            if !Isa::host_tiers().contains(&isa) {
                continue;
            }
            // Over the residual, the bits of a separate destination.
            let key = PrimitiveKey::Conv(d.clone());
            let p = engine.compile(&key).unwrap();
            let specs = key.buffers();
            let (src, weights) = (data(0, specs[0].len), data(1, specs[1].len));
            let residual = data(2, specs[3].len);
            let mut apart = vec![0.0; specs[2].len];
            let args = |dst, extra| ExecArgs {
                src: &src,
                weights: Some(&weights),
                dst,
                extra,
                scratch: None,
            };
            let extra = [residual.as_slice()];
            engine.execute(&p, args(&mut apart, &extra)).unwrap();
            let mut over = residual.clone();
            engine
                .execute_over_residual(&p, args(&mut over, &[]), None)
                .unwrap();
            let same = apart
                .iter()
                .zip(&over)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{key}");
        }
    }

    // A chunked reduction keeps partial sums in the destination: not in place.
    let wide = residual_conv(256);
    assert!(ConvPlan::new(&wide).chunks() > 1);
    let mut no_residual = residual_conv(16);
    no_residual.post_ops = vec![PostOpDesc::Relu];
    for d in [wide, no_residual] {
        assert!(!ConvPlan::new(&d).residual_in_place());
        let key = PrimitiveKey::Conv(d);
        let p = engine.compile(&key).unwrap();
        assert!(!p.residual_in_place());
        let specs = key.buffers();
        let src = vec![0.0; specs[0].len];
        let weights = vec![0.0; specs[1].len];
        let mut dst = vec![0.0; specs[2].len];
        let err = engine
            .execute_over_residual(
                &p,
                ExecArgs {
                    src: &src,
                    weights: Some(&weights),
                    dst: &mut dst,
                    extra: &[],
                    scratch: None,
                },
                None,
            )
            .unwrap_err();
        assert_eq!(
            err,
            RuntimeError::Exec(ExecError::InPlace {
                key: key.to_string()
            })
        );
        assert_eq!(
            err.to_string(),
            format!("{key}: this primitive cannot write its output over its residual")
        );
    }
}
