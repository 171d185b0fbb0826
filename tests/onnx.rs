//! Imported ONNX models against their expected outputs.
//!
//! Conformance: the ONNX project's backend node tests for the supported ops
//! (`tests/onnx/node`, gathered by `tests/onnx/gather_node_tests.py`), each run through the
//! importer, the JIT and the reference interpreter and compared with its expected outputs.
//! Cases the importer rejects are listed with its reason. The cases that pass are listed in
//! `tests/onnx/node_passing.txt`: a listed case that fails, or a case that passes unlisted,
//! fails the test, so the list says exactly what primjit runs.
//!
//! Families: small ResNet, VGG, MobileNetV2 and DeepLab-like models at batch 2 with symbolic
//! height and width (`tests/onnx/families`, made by `tests/onnx/make_families.py` with
//! onnxruntime's outputs), run on the JIT and held to 1e-4 relative.

use std::path::{Path, PathBuf};

use primjit::{CompiledGraph, Engine, EngineConfig, Tensor, Workspace};
use primjit_onnx::proto::{ModelProto, TensorProto};
use primjit_onnx::{NameKind, decode_tensor, import_file, import_model};
use prost::Message;

/// The tolerance of the ONNX backend test runner (`onnx.backend.test.runner`): the expected
/// outputs of some cases are rounded to four decimals.
const RTOL: f32 = 1e-3;
const ATOL: f32 = 1e-7;

fn node_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/onnx/node")
}

/// The largest `|got - want| / (atol + rtol * |want|)`: at most 1 passes.
fn excess(got: &Tensor, want: &Tensor, atol: f32, rtol: f32) -> Result<f32, String> {
    // A classifier's [N, K] output is [N, K, 1, 1] in the IR, and a flattened [N, C, H, W]
    // stays [N, C, H, W], whose NCHW data is the [N, C H W] matrix's.
    let flat_match = got.shape.len() == 4
        && want.shape.len() == 2
        && got.shape[0] == want.shape[0]
        && got.shape[1..].iter().product::<usize>() == want.shape[1];
    if got.shape != want.shape && !flat_match {
        return Err(format!("shape {:?}, expected {:?}", got.shape, want.shape));
    }
    Ok(got
        .data
        .iter()
        .zip(&want.data)
        .map(|(&g, &w)| {
            if g.is_nan() != w.is_nan() {
                f32::INFINITY
            } else if g == w || g.is_nan() {
                0.0
            } else {
                (g - w).abs() / (atol + rtol * w.abs())
            }
        })
        .fold(0.0, f32::max))
}

/// Whether graph input `name` is read as an activation (the first input of a node, either
/// operand of a binary op, any input of a `Concat`); the others are weights, biases,
/// statistics, slopes, axes or bounds.
fn is_activation(model: &ModelProto, name: &str) -> bool {
    let graph = model.graph.as_ref().expect("a graph");
    graph.node.iter().any(|n| {
        let all = matches!(n.op_type.as_str(), "Concat");
        let binary = matches!(n.op_type.as_str(), "Add" | "Sub" | "Mul" | "Div");
        n.input.first().is_some_and(|i| i == name)
            || (binary && n.input.get(1).is_some_and(|i| i == name))
            || (all && n.input.iter().any(|i| i == name))
    })
}

fn read_file(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Runs one case; `Err("unsupported: ...")` when the importer rejects it (with its reason),
/// another `Err` when it imports but gives wrong results or fails to run.
///
/// The node tests pass weights as graph inputs with values in the data set; as an exporter
/// writes them, those become initializers (the JIT specializes on weights being constant).
fn run_case(dir: &Path, engine: &Engine) -> Result<(), String> {
    let model = ModelProto::decode(read_file(&dir.join("model.onnx")).as_slice())
        .map_err(|e| e.to_string())?;
    let mut sets: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    sets.sort();
    for set in sets {
        let mut model = model.clone();
        let mut inputs = Vec::new();
        let graph_inputs = model.graph.as_ref().unwrap().input.clone();
        for (j, info) in graph_inputs.iter().enumerate() {
            let bytes = read_file(&set.join(format!("input_{j}.pb")));
            if is_activation(&model, &info.name) {
                inputs.push((info.name.clone(), bytes));
            } else {
                let mut t = TensorProto::decode(bytes.as_slice()).map_err(|e| e.to_string())?;
                t.name = info.name.clone();
                let graph = model.graph.as_mut().unwrap();
                graph.input.retain(|i| i.name != info.name);
                graph.initializer.push(t);
            }
        }
        let imported = import_model(&model, "model.onnx", None).map_err(|e| {
            let first = e.to_string().lines().next().unwrap_or("").to_string();
            format!("unsupported: {}", first.trim_start_matches("model.onnx: "))
        })?;
        let inputs: Vec<(String, Tensor)> = inputs
            .into_iter()
            .map(|(name, bytes)| {
                let (_, t) = decode_tensor(&bytes, "input").expect("a float input");
                let ir = imported.ir_name(NameKind::Value, &name).expect("an input");
                (ir.to_string(), t)
            })
            .collect();
        let compiled = CompiledGraph::new(&imported.graph, &imported.params)
            .map_err(|e| format!("compiling: {e}"))?;
        let refs: Vec<(&str, &Tensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let (jit, _) = compiled
            .run(engine, &refs, &mut Workspace::new())
            .map_err(|e| format!("jit: {e}"))?;
        let reference = primjit::reference::run_graph(&imported.graph, &imported.params, &refs)
            .map_err(|e| format!("reference: {e}"))?;
        let graph_outputs = model.graph.as_ref().unwrap().output.clone();
        for (j, info) in graph_outputs.iter().enumerate() {
            let bytes = read_file(&set.join(format!("output_{j}.pb")));
            let (_, want) = decode_tensor(&bytes, "output").map_err(|e| e.to_string())?;
            let name = imported
                .ir_name(NameKind::Output, &info.name)
                .expect("an output");
            let find = |results: &[(String, Tensor)]| -> Result<Tensor, String> {
                results
                    .iter()
                    .find(|(n, _)| n == name)
                    .map(|(_, t)| t.clone())
                    .ok_or_else(|| format!("no output {name}"))
            };
            let (jit, reference) = (find(&jit)?, find(&reference)?);
            for (engine_name, got) in [("jit", &jit), ("reference", &reference)] {
                let e = excess(got, &want, ATOL, RTOL)
                    .map_err(|m| format!("{engine_name} {name}: {m}"))?;
                if e > 1.0 {
                    return Err(format!(
                        "{engine_name} {name}: off by {e:.1} times the tolerance ({ATOL} + {RTOL} |expected|)"
                    ));
                }
            }
            // The JIT against the reference, more tightly than against rounded expectations.
            let scale = reference.data.iter().fold(0f32, |m, x| m.max(x.abs()));
            let e = excess(&jit, &reference, 1e-5 * scale, 1e-5)?;
            if e > 1.0 {
                return Err(format!(
                    "jit {name}: {e:.1} times 1e-5 away from the reference"
                ));
            }
        }
    }
    Ok(())
}

#[test]
fn onnx_backend_node_tests_of_the_supported_ops() {
    let engine = Engine::new(EngineConfig::default()).unwrap();
    let mut cases: Vec<PathBuf> = std::fs::read_dir(node_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("model.onnx").exists())
        .collect();
    cases.sort();
    assert!(
        cases.len() > 50,
        "the fixtures are missing: {}",
        cases.len()
    );
    let mut passing = Vec::new();
    let mut unsupported = Vec::new();
    let mut wrong = Vec::new();
    for dir in &cases {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        match run_case(dir, &engine) {
            Ok(()) => passing.push(name),
            Err(m) if m.starts_with("unsupported: ") => unsupported.push((name, m)),
            Err(m) => wrong.push((name, m)),
        }
    }
    for (name, reason) in &unsupported {
        eprintln!("{name}: {reason}");
    }
    eprintln!(
        "{} cases: {} pass, {} unsupported, {} wrong",
        cases.len(),
        passing.len(),
        unsupported.len(),
        wrong.len()
    );
    assert!(wrong.is_empty(), "cases that import but fail: {wrong:#?}");
    let listed_path = node_dir().join("../node_passing.txt");
    let listed: Vec<String> = std::fs::read_to_string(&listed_path)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect();
    let missing: Vec<_> = listed.iter().filter(|l| !passing.contains(l)).collect();
    let unlisted: Vec<_> = passing.iter().filter(|p| !listed.contains(p)).collect();
    assert!(
        missing.is_empty() && unlisted.is_empty(),
        "{}: listed but not passing: {missing:?}; passing but not listed: {unlisted:?}",
        listed_path.display()
    );
}

fn read_npy(path: &Path) -> Tensor {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let npy = npyz::NpyFile::new(bytes.as_slice()).unwrap();
    let shape = npy.shape().iter().map(|&d| d as usize).collect();
    Tensor::new(shape, npy.into_vec::<f32>().unwrap()).unwrap()
}

/// The largest absolute difference over the largest magnitude of the expected output.
fn relative_error(got: &Tensor, want: &Tensor) -> f32 {
    assert_eq!(got.data.len(), want.data.len());
    let scale = want.data.iter().fold(0f32, |m, x| m.max(x.abs()));
    let diff = got
        .data
        .iter()
        .zip(&want.data)
        .fold(0f32, |m, (g, w)| m.max((g - w).abs()));
    diff / scale
}

#[test]
fn model_families_match_onnxruntime() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/onnx/families");
    let engine = Engine::new(EngineConfig::default()).unwrap();
    for family in ["resnet", "vgg", "mobilenet", "deeplab"] {
        let imported = import_file(&dir.join(format!("{family}.onnx")))
            .unwrap_or_else(|e| panic!("{family}: {e}"));
        assert_eq!(imported.graph.symbols(), vec!["H", "W"], "{family}");
        // Every Clip follows a conv (and batch-norm): none needs an identity conv of its own.
        assert!(
            imported
                .graph
                .params()
                .all(|(_, p)| !p.name.ends_with(".identity")),
            "{family}: {}",
            imported.graph
        );
        let x = read_npy(&dir.join(format!("{family}.input.npy")));
        let want = read_npy(&dir.join(format!("{family}.expected.npy")));
        assert_eq!(x.shape[0], 2, "{family}: batch 2");
        let compiled = CompiledGraph::new(&imported.graph, &imported.params).unwrap();
        let (outputs, _) = compiled
            .run(&engine, &[("x", &x)], &mut Workspace::new())
            .unwrap_or_else(|e| panic!("{family}: {e}"));
        let [(_, got)] = outputs.as_slice() else {
            panic!("{family}: one output expected")
        };
        let n: usize = want.shape.iter().product();
        assert_eq!(got.shape.iter().product::<usize>(), n, "{family}");
        assert_eq!(got.shape[..2], want.shape[..2], "{family}");
        let rel = relative_error(got, &want);
        eprintln!(
            "{family}: output {:?}, max relative error {rel:.2e}",
            want.shape
        );
        assert!(rel <= 1e-4, "{family}: relative error {rel}");
    }
}

/// The blocks of issue 55's zoo (`tests/onnx/zoo`, made by `tests/onnx/make_zoo.py` with
/// onnxruntime's outputs): MobileNetV3 with SE and HardSwish behind an input normalization,
/// EfficientNet's MBConv with SiLU and SE, a DenseNet dense block and transition, a
/// SqueezeNet fire module, a VGG classifier head over a 3x3 image, the other activations, a
/// ShuffleNetV2 unit (split, channel shuffle, slice), an Inception block, and a
/// 32xW line recognizer at three widths from one import, an FCN/DeepLab head resized to its
/// input's size, an FPN top-down step, torchvision's LR-ASPP head and a DBNet-style detector
/// (FPN, ConvTranspose head, Sigmoid), each at three sizes from one import, and SAME_UPPER and
/// SAME_LOWER convs and pools at stride 2 over symbolic extents at six sizes (also streamed in
/// narrow bands). Each runs with exact keys and with runtime extents (`dynamic`), within 1e-4
/// of the largest output of onnxruntime's.
#[test]
fn zoo_blocks_match_onnxruntime() {
    use primjit::{ShapeMode, Streaming};
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/onnx/zoo");
    let engine = Engine::new(EngineConfig::default()).unwrap();
    let cases: &[(&str, &[&str])] = &[
        ("mbv3", &[""]),
        ("mbconv", &[""]),
        ("densenet", &[""]),
        ("fire", &[""]),
        ("vgg_head", &[""]),
        ("acts", &[""]),
        ("shufflenet", &[""]),
        ("inception", &[""]),
        ("recognizer", &[".w64", ".w100", ".w160"]),
        ("fcn", &[".16x20", ".13x9", ".32x24"]),
        ("fpn", &[".16x24", ".20x12", ".8x8"]),
        ("lraspp", &[".32x48", ".40x24", ".27x37"]),
        ("dbnet", &[".32x32", ".24x40", ".19x30"]),
        (
            "same",
            &[".7x9", ".8x8", ".9x12", ".1x1", ".22x31", ".13x150"],
        ),
    ];
    for (block, runs) in cases {
        let imported = import_file(&dir.join(format!("{block}.onnx")))
            .unwrap_or_else(|e| panic!("{block}: {e}"));
        let text = imported.graph.to_string();
        match *block {
            // Sigmoid + Mul pairs are one SiLU.
            "mbconv" => assert_eq!(text.matches(" = silu(").count(), 4, "{text}"),
            // Sub and Div by constants are one depthwise 1x1 conv.
            "mbv3" => assert!(
                text.contains("groups=3)") && !text.contains("div("),
                "{text}"
            ),
            // Sizes computed from Shape fold into the input's symbolic extents.
            "fcn" => {
                assert_eq!(imported.graph.symbols(), ["H", "W"], "{text}");
                assert!(
                    text.contains(", %x, mode=linear, coord=pytorch_half_pixel)"),
                    "{text}"
                );
            }
            "fpn" => {
                assert_eq!(imported.graph.symbols(), ["H", "W"], "{text}");
                assert!(
                    text.contains(", nearest=floor, coord=asymmetric, scale=[2, 2])"),
                    "{text}"
                );
                assert_eq!(text.matches("mode=linear").count(), 2, "{text}");
            }
            // The gate's Mul broadcasts a [N, C, 1, 1] value; both resizes take their sizes
            // from the symbolic extents.
            "lraspp" => {
                assert_eq!(imported.graph.symbols(), ["H", "W"], "{text}");
                assert_eq!(text.matches("mode=linear").count(), 2, "{text}");
                assert!(text.contains("global_avgpool("), "{text}");
            }
            // Both transposed convolutions of the head, the second depthwise, over the
            // symbolic extents.
            "dbnet" => {
                assert_eq!(imported.graph.symbols(), ["H", "W"], "{text}");
                assert_eq!(text.matches(" = conv_transpose(").count(), 2, "{text}");
                assert!(
                    text.contains("pads=[1, 1, 1, 1], output_padding=[1, 1], groups=6)"),
                    "{text}"
                );
            }
            // SAME over symbolic extents at stride 2 stays auto_pad in the IR; at stride 1 it
            // is plain pads.
            "same" => {
                assert_eq!(imported.graph.symbols(), ["H", "W"], "{text}");
                assert_eq!(text.matches("auto_pad=same_upper").count(), 1, "{text}");
                assert_eq!(text.matches("auto_pad=same_lower").count(), 2, "{text}");
                assert!(text.contains("kernel=[2, 3], pads=[0, 1, 1, 1])"), "{text}");
            }
            _ => {}
        }
        // `same` also runs its leading convs in bands of 4 columns, however narrow.
        let mut configs = vec![(ShapeMode::Exact, None), (ShapeMode::Runtime, None)];
        if *block == "same" {
            let narrow = Streaming::with_band(4).unwrap().above(0);
            configs.extend([ShapeMode::Exact, ShapeMode::Runtime].map(|m| (m, Some(narrow))));
        }
        for (mode, streaming) in configs {
            let mut compiled = CompiledGraph::new(&imported.graph, &imported.params)
                .unwrap()
                .with_mode(mode);
            if let Some(streaming) = streaming {
                compiled = compiled.with_streaming(streaming);
            }
            for run in *runs {
                let x = read_npy(&dir.join(format!("{block}{run}.input.npy")));
                let want = read_npy(&dir.join(format!("{block}{run}.expected.npy")));
                let (outputs, stats) = compiled
                    .run(&engine, &[("x", &x)], &mut Workspace::new())
                    .unwrap_or_else(|e| panic!("{block}{run}: {e}"));
                if streaming.is_some() && *run == ".13x150" {
                    assert_eq!(stats.segments.len(), 1, "{block}{run} {mode:?}: streams");
                }
                let [(_, got)] = outputs.as_slice() else {
                    panic!("{block}: one output expected")
                };
                assert_eq!(got.shape[0], want.shape[0], "{block}{run}");
                assert_eq!(got.shape[1], want.shape[1], "{block}{run}");
                if matches!(*block, "dbnet" | "same") {
                    assert_eq!(got.shape, want.shape, "{block}{run}");
                }
                let rel = relative_error(got, &want);
                eprintln!(
                    "{block}{run} {mode:?} {streaming:?}: output {:?}, max relative error {rel:.2e}",
                    want.shape
                );
                assert!(
                    rel <= 1e-4,
                    "{block}{run} {mode:?} {streaming:?}: relative error {rel}"
                );
            }
        }
    }
}

/// The `same` zoo block (SAME_UPPER and SAME_LOWER at stride 2 over symbolic H and W),
/// imported once: at odd and even sizes, one pixel, and sizes no fixture has, the JIT with
/// exact keys matches the reference interpreter, and runtime extents (`dynamic`) give the
/// exact keys' bits, with at most one key per residue of H and W modulo 2 per auto_pad node.
#[test]
fn an_auto_pad_model_imported_once_runs_at_every_size() {
    use primjit::ShapeMode;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/onnx/zoo");
    let imported = import_file(&dir.join("same.onnx")).unwrap();
    let engine = Engine::new(EngineConfig::default()).unwrap();
    let exact = CompiledGraph::new(&imported.graph, &imported.params).unwrap();
    let dynamic = CompiledGraph::new(&imported.graph, &imported.params)
        .unwrap()
        .with_mode(ShapeMode::Runtime);
    let compiles = |m: &CompiledGraph, x: &Tensor| {
        let (out, _) = m
            .run(&engine, &[("x", x)], &mut Workspace::new())
            .unwrap_or_else(|e| panic!("{:?}: {e}", x.shape));
        out.into_iter().next().unwrap().1
    };
    let mut auto_keys: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        Default::default();
    for (h, w) in [
        (7, 9),
        (8, 8),
        (9, 12),
        (1, 1),
        (2, 5),
        (16, 33),
        (31, 18),
        (12, 7),
    ] {
        let x = primjit::ir::random_tensor((h * 100 + w) as u64, "x", vec![2, 3, h, w], -1.0, 1.0);
        let want =
            primjit::reference::run_graph(&imported.graph, &imported.params, &[("x", &x)]).unwrap();
        let got = compiles(&exact, &x);
        assert_eq!(got.shape, want[0].1.shape, "{h}x{w}");
        let rel = relative_error(&got, &want[0].1);
        assert!(
            rel <= 1e-5,
            "{h}x{w}: relative error {rel} against the reference"
        );
        let bits = |t: &Tensor| t.data.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert!(
            bits(&compiles(&dynamic, &x)) == bits(&got),
            "{h}x{w}: runtime extents differ from exact keys"
        );
        let bindings = [("H".to_string(), h as u64), ("W".to_string(), w as u64)].into();
        for (name, key) in dynamic.keys(&bindings).unwrap() {
            if ["stem_1", "pool_3", "down_4"].contains(&name.as_str()) {
                auto_keys.entry(name).or_default().insert(key.to_string());
            }
        }
    }
    // Each auto_pad node has at most a key per parity of its input's height and width; the
    // stem's input takes all four.
    assert_eq!(auto_keys.len(), 3, "{auto_keys:#?}");
    assert!(auto_keys.values().all(|k| k.len() <= 4), "{auto_keys:#?}");
    assert_eq!(auto_keys["stem_1"].len(), 4, "{auto_keys:#?}");
}

/// The `onnx_import` fuzz target's seeds of the new ops (`fuzz/seeds/onnx_import`, a mode byte
/// then a model): each imports, and passes the target's own checks (it verifies, prints as IR
/// text that parses back to the same text, and its parameters fill its declarations).
#[test]
fn fuzz_seeds_of_the_new_ops_import() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/onnx_import");
    let mut seeds: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    seeds.sort();
    assert!(seeds.len() >= 14, "{seeds:?}");
    for path in seeds {
        let bytes = read_file(&path);
        assert_eq!(bytes[0] & 1, 1, "{}: the mode byte", path.display());
        let imported = primjit_onnx::import_bytes(&bytes[1..], "seed.onnx", None)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        imported.graph.verify().unwrap();
        let text = imported.graph.to_string();
        assert_eq!(primjit::ir::parse(&text).unwrap().to_string(), text);
        let mut params = imported.params.clone();
        params.materialize(&imported.graph).unwrap();
    }
}

/// The DBNet-style detector at three page sizes and the recognizer at three line widths,
/// each under `dynamic` from one import on one engine. Every key over the input's extents
/// leaves them to run time (convolutions, the detector's two transposed convolutions and its
/// resizes to a lateral's size, the element-wise ops, the concatenations, the
/// squeeze-excitation's pooling and scaling), so a new size compiles nothing; the exact
/// policy compiles every key again. Both policies give the same bits.
#[test]
fn a_new_size_compiles_nothing_under_dynamic() {
    use primjit::ShapeMode;
    use std::collections::BTreeSet;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/onnx/zoo");
    let models: [(&str, [&str; 3], &[&str]); 2] = [
        (
            "dbnet",
            [".32x32", ".24x40", ".19x30"],
            &["deconv", "eltwise_", "concat", "conv", "resize_"],
        ),
        (
            "recognizer",
            [".w64", ".w100", ".w160"],
            &["eltwise_", "global_pool", "conv"],
        ),
    ];
    for (model, sizes, runtime_kinds) in models {
        let imported = import_file(&dir.join(format!("{model}.onnx"))).unwrap();
        let mut compiles = Vec::new();
        let mut outputs: Vec<Vec<Vec<u32>>> = Vec::new();
        for mode in [ShapeMode::Exact, ShapeMode::Runtime] {
            let engine = Engine::new(EngineConfig::default()).unwrap();
            let compiled = CompiledGraph::new(&imported.graph, &imported.params)
                .unwrap()
                .with_mode(mode);
            let mut keys: Vec<BTreeSet<String>> = Vec::new();
            let mut bits = Vec::new();
            for size in sizes {
                let x = read_npy(&dir.join(format!("{model}{size}.input.npy")));
                let (out, stats) = compiled
                    .run(&engine, &[("x", &x)], &mut Workspace::new())
                    .unwrap();
                bits.push(out[0].1.data.iter().map(|v| v.to_bits()).collect());
                keys.push(
                    stats
                        .nodes
                        .iter()
                        .map(|n| n.primitive.key().to_string())
                        .collect(),
                );
            }
            if mode == ShapeMode::Runtime {
                for (size, k) in sizes.iter().zip(&keys).skip(1) {
                    let new: Vec<&String> = k.difference(&keys[0]).collect();
                    assert!(new.is_empty(), "{model}{size} compiles {new:#?}");
                }
                let runtime = |p: &str| keys[0].iter().any(|k| k.starts_with(p) && k.contains('*'));
                for kind in runtime_kinds {
                    assert!(
                        runtime(kind),
                        "{model}: no runtime {kind} key: {:#?}",
                        keys[0]
                    );
                }
            }
            compiles.push(engine.cache().stats().compiles);
            outputs.push(bits);
        }
        assert!(
            outputs[0] == outputs[1],
            "{model}: runtime extents change the bits"
        );
        eprintln!(
            "{model}: compiles over three sizes: exact {}, dynamic {}",
            compiles[0], compiles[1]
        );
        assert!(compiles[1] < compiles[0], "{model}: {compiles:?}");
    }
}
