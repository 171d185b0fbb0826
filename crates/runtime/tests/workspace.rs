//! The workspace's byte budget: results do not depend on it, and its statistics move as
//! documented (`WorkspaceStats`, `CompiledGraph::run_into`).

use primjit_ir::{Params, Tensor, parse, random_tensor};
use primjit_runtime::{
    Budget, CompiledGraph, ConfigError, Engine, EngineConfig, GraphError, ShapeMode, TensorView,
    Workspace, WorkspaceConfig,
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

fn model(mode: ShapeMode) -> CompiledGraph {
    let graph = parse(BLOCKS).expect("parses");
    CompiledGraph::new(&graph, &Params::random(&graph, 3))
        .expect("prepares")
        .with_mode(mode)
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
        for threads in [1, 2] {
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
