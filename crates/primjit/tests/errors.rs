//! The error catalogue (docs/errors.md): every error variant produced through the public
//! API of the `primjit` facade, with the message form the catalogue lists.
//!
//! Not produced here, as their documentation explains: `CodegenError::UnsupportedHost` (every
//! machine that runs the tests is a supported host), `CodegenError::Cranelift` and
//! `CodegenError::Relocations` (internal invariants of the code generator), and
//! `ConfigError::ThreadPool` with the `RuntimeError::Config` that wraps it (the operating system
//! would have to refuse a thread), and `GraphError::Workspace` (the operating system would have
//! to refuse an anonymous mapping of at most 8 GiB, the largest tensor a key accepts).

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use primjit::RuntimeDims;
use primjit::exec::{MmapMut, PageSource, SystemPages};
use primjit::ir::{
    Bindings, Dim, Pads, ParamError, PoolWindow, SourceLoc, VerifyError, WindowError, parse, passes,
};
use primjit::reference::{ReferenceError, run_graph};
use primjit::{
    Budget, CacheConfig, CodegenError, CompiledGraph, ConfigError, ConvDesc, ConvPlan, EltwiseDesc,
    EltwiseKind, Engine, EngineConfig, ExecArgs, ExecError, GraphError, IrError, Isa, KeyError,
    Layout, Params, PostOpDesc, PrimitiveKey, RuntimeError, Tensor,
};

/// A conv with a bias and a batch-norm: parameters to miss, and something to fold.
const TINY: &str = "graph tiny {
  input %x: f32[1, 3, 4, W]
  param @w: f32[2, 3, 3, 3]
  param @b: f32[2]
  param @s: f32[2]
  param @t: f32[2]
  param @m: f32[2]
  param @v: f32[2]
  %c = conv2d(%x, @w, bias=@b, pads=[1, 1, 1, 1])
  %n = batchnorm(%c, @s, @t, @m, @v)
  output y = %n
}
";

fn tiny() -> primjit::Graph {
    parse(TINY).expect("the tiny graph parses")
}

fn engine() -> Engine {
    Engine::new(EngineConfig {
        threads: 1,
        ..EngineConfig::default()
    })
    .expect("engine")
}

fn relu_key() -> PrimitiveKey {
    PrimitiveKey::Eltwise(EltwiseDesc {
        kind: EltwiseKind::Relu,
        shape: [1, 2, 3, 4],
        layout: Layout::Nchw,
        isa: Isa::X128,
        runtime: RuntimeDims::NONE,
    })
}

/// A conv with a residual `add` post-op: it takes weights and one extra buffer.
fn conv_key() -> PrimitiveKey {
    let mut d = ConvDesc::new(1, 2, [3, 3], 2, [1, 1]);
    d.post_ops = vec![PostOpDesc::Add];
    PrimitiveKey::Conv(d)
}

/// A page source that fails while `fail` is set.
struct FailingPages {
    fail: Arc<AtomicBool>,
}

impl PageSource for FailingPages {
    fn map(&self, len: usize) -> io::Result<MmapMut> {
        if self.fail.load(Ordering::SeqCst) {
            return Err(io::Error::other("injected map failure"));
        }
        SystemPages.map(len)
    }
}

fn failing_engine() -> (Engine, Arc<AtomicBool>) {
    let fail = Arc::new(AtomicBool::new(true));
    let engine = Engine::with_pages(
        EngineConfig {
            threads: 1,
            ..EngineConfig::default()
        },
        Box::new(FailingPages { fail: fail.clone() }),
    )
    .expect("engine");
    (engine, fail)
}

// ---------------------------------------------------------------------------------------------
// primjit::ir
// ---------------------------------------------------------------------------------------------

#[test]
fn ir_parse_error_locates_the_token() {
    let text = "graph g {\n  input %x: f32[1, 3, 4, 4]\n  %y = relu(%nope)\n  output o = %y\n}\n";
    let err = parse(text).unwrap_err();
    assert_eq!(err.loc, SourceLoc { line: 3, col: 13 });
    assert_eq!(err.to_string(), "3:13: unknown value `%nope`");
    let err = IrError::from(err);
    assert!(matches!(err, IrError::Parse(_)));
    assert_eq!(
        err.render("g.ir", text),
        "g.ir:3:13: error: unknown value `%nope`\n  %y = relu(%nope)\n            ^"
    );
}

#[test]
fn ir_verify_error_names_the_value_and_its_node() {
    let text = TINY.replace("f32[2, 3, 3, 3]", "f32[2, 4, 3, 3]");
    let err = parse(&text).unwrap().verify().unwrap_err();
    assert_eq!(err.subject, "%c");
    assert_eq!(err.loc, Some(SourceLoc { line: 9, col: 3 }));
    assert_eq!(
        err.to_string(),
        "%c: channel mismatch: the input has 3 channels but @w expects 4 (4 per group x 1 groups)"
    );
    let err = IrError::from(err);
    assert!(matches!(err, IrError::Verify(_)));
    assert!(
        err.render("tiny.ir", &text)
            .starts_with("tiny.ir:9:3: error: %c: channel mismatch"),
        "{}",
        err.render("tiny.ir", &text)
    );
}

#[test]
fn ir_verify_error_names_a_missing_input() {
    let err = tiny().bind_inputs(&[], &Bindings::new()).unwrap_err();
    assert_eq!(err.subject, "%x");
    assert_eq!(
        err.to_string(),
        "%x: no tensor was given for this input (expected shape [1, 3, 4, W])"
    );
}

#[test]
fn ir_window_error_gives_the_padded_input_and_the_window() {
    let err = Dim::Known(2).window(0, 0, 3, 1, false).unwrap_err();
    assert_eq!(
        err,
        WindowError {
            padded_input: 2,
            extent: 3
        }
    );
}

#[test]
fn ir_param_error_missing_names_the_parameter_and_its_shape() {
    let err = CompiledGraph::new(&tiny(), &Params::new()).unwrap_err();
    let GraphError::Param(ParamError::Missing { name, expected }) = &err else {
        panic!("expected a missing parameter, got {err:?}");
    };
    assert_eq!(
        (name.as_str(), expected.as_slice()),
        ("w", &[2, 3, 3, 3][..])
    );
    assert_eq!(
        err.to_string(),
        "parameter @w is missing (expected shape [2, 3, 3, 3])"
    );
}

#[test]
fn ir_param_error_shape_names_both_shapes() {
    let graph = tiny();
    let mut params = Params::random(&graph, 0);
    params.insert("w", Tensor::zeros(vec![2, 3, 1, 1]));
    let err = CompiledGraph::new(&graph, &params).unwrap_err();
    assert!(
        matches!(err, GraphError::Param(ParamError::Shape { .. })),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "parameter @w has shape [2, 3, 1, 1] but the graph declares [2, 3, 3, 3]"
    );
}

#[test]
fn ir_param_error_derived_names_the_parameter_and_the_source_at_fault() {
    // Parsed, not verified (`Graph::verify` would report it at its line): the folded weight's
    // scale has 2 channels where the weight has 4.
    let graph = parse(
        "graph g {
  input %x: f32[1, 3, 6, 6]
  param @w: f32[4, 3, 1, 1]
  param @s: f32[2]
  param @v: f32[4]
  param @w2: f32[4, 3, 1, 1] = bnfold_weight(@w, @s, @v)
  %c = conv2d(%x, @w2)
  output y = %c
}",
    )
    .unwrap();
    let mut params = Params::random(&graph, 0);
    let err = params.materialize(&graph).unwrap_err();
    assert!(matches!(err, ParamError::Derived { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "derived parameter @w2: the scale @s must have shape [4], found [2]"
    );
}

#[test]
fn ir_param_error_length_of_a_tensor() {
    let err = Tensor::new(vec![2, 3], vec![0.0; 5]).unwrap_err();
    assert!(matches!(err, ParamError::Length { .. }));
    assert_eq!(
        err.to_string(),
        "tensor data has 5 elements but shape [2, 3] needs 6"
    );
}

// ---------------------------------------------------------------------------------------------
// primjit::reference
// ---------------------------------------------------------------------------------------------

fn x(w: usize) -> Tensor {
    Tensor::zeros(vec![1, 3, 4, w])
}

#[test]
fn reference_error_verify_names_the_input() {
    let graph = tiny();
    let params = Params::random(&graph, 0);
    let wrong = Tensor::zeros(vec![1, 2, 4, 5]);
    let err = run_graph(&graph, &params, &[("x", &wrong)]).unwrap_err();
    assert!(matches!(err, ReferenceError::Verify(_)), "{err:?}");
    assert_eq!(
        err.to_string(),
        "%x: the tensor has shape [1, 2, 4, 5] but the input is declared [1, 3, 4, W]"
    );
}

#[test]
fn reference_error_param_names_the_parameter() {
    let graph = tiny();
    let err = run_graph(&graph, &Params::new(), &[("x", &x(5))]).unwrap_err();
    assert!(
        matches!(err, ReferenceError::Param(ParamError::Missing { .. })),
        "{err:?}"
    );
    assert!(err.to_string().starts_with("parameter @"), "{err}");
}

#[test]
fn reference_error_unmaterialized_names_the_derived_parameter() {
    let graph = tiny();
    let params = Params::random(&graph, 0);
    let mut folded = graph.clone();
    passes::optimize(&mut folded);
    let err = run_graph(&folded, &params, &[("x", &x(5))]).unwrap_err();
    let ReferenceError::Unmaterialized { name } = &err else {
        panic!("expected an unmaterialized parameter, got {err:?}");
    };
    assert!(folded.param_by_name(name).is_some());
    assert_eq!(
        err.to_string(),
        format!("derived parameter @{name} has no value (call Params::materialize first)")
    );
}

#[test]
fn reference_error_duplicate_input() {
    let graph = tiny();
    let params = Params::random(&graph, 0);
    let err = run_graph(&graph, &params, &[("x", &x(5)), ("x", &x(5))]).unwrap_err();
    assert_eq!(err, ReferenceError::DuplicateInput { name: "x".into() });
    assert_eq!(err.to_string(), "input %x is given twice");
}

#[test]
fn reference_error_empty_input() {
    let graph = tiny();
    let params = Params::random(&graph, 0);
    let err = run_graph(&graph, &params, &[("x", &x(0))]).unwrap_err();
    assert!(matches!(err, ReferenceError::EmptyInput { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "input %x has shape [1, 3, 4, 0], but every dimension must be at least 1"
    );
}

#[test]
fn reference_error_bad_tensor_names_the_input() {
    let graph = tiny();
    let params = Params::random(&graph, 0);
    let short = Tensor {
        shape: vec![1, 3, 4, 5],
        data: vec![0.0; 7],
    };
    let err = run_graph(&graph, &params, &[("x", &short)]).unwrap_err();
    assert!(matches!(err, ReferenceError::BadTensor { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "%x: the tensor has 7 elements but its shape [1, 3, 4, 5] needs 60"
    );
}

// ---------------------------------------------------------------------------------------------
// primjit::codegen
// ---------------------------------------------------------------------------------------------

#[test]
fn codegen_error_invalid_key_names_the_key_and_the_reason() {
    let key = PrimitiveKey::Conv(ConvDesc::new(1, 6, [4, 4], 4, [5, 5]));
    let reason = "the output would be empty: the window does not fit in the padded input";
    let want = KeyError {
        key: key.to_string(),
        reason: reason.into(),
    };
    assert_eq!(key.validate(), Err(want.clone()));
    let err = engine().compile(&key).unwrap_err();
    assert_eq!(err, RuntimeError::Codegen(CodegenError::InvalidKey(want)));
    assert_eq!(
        err.to_string(),
        format!("invalid primitive {key}: {reason}")
    );
}

// ---------------------------------------------------------------------------------------------
// primjit::runtime: configuration, mapping, execution
// ---------------------------------------------------------------------------------------------

#[test]
fn config_error_invalid_names_the_variable_and_value() {
    let err = EngineConfig::from_vars(|name| {
        (name == "PRIMJIT_CACHE_BUDGET").then(|| "lots".to_string())
    })
    .unwrap_err();
    assert!(matches!(
        err,
        ConfigError::Invalid {
            name: "PRIMJIT_CACHE_BUDGET",
            ..
        }
    ));
    assert_eq!(
        err.to_string(),
        "PRIMJIT_CACHE_BUDGET=lots: expected a number of bytes such as 64MiB, 512KiB, 0 or unlimited"
    );
}

/// `PRIMJIT_CONV_ALGO` is parsed strictly, and an unknown name given to the API says which
/// names there are.
#[test]
fn conv_algo_errors_name_the_choices() {
    let err = EngineConfig::from_vars(|name| {
        (name == "PRIMJIT_CONV_ALGO").then(|| "Winograd".to_string())
    })
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "PRIMJIT_CONV_ALGO=Winograd: expected direct, winograd or auto"
    );
    let err = "wino".parse::<primjit::ConvAlgoChoice>().unwrap_err();
    assert_eq!(
        err.to_string(),
        "unknown convolution algorithm `wino`: expected direct, winograd or auto"
    );
    let config =
        EngineConfig::from_vars(|name| (name == "PRIMJIT_CONV_ALGO").then(|| "direct".to_string()))
            .unwrap();
    assert_eq!(config.conv_algo, primjit::ConvAlgoChoice::Direct);
}

/// Says on stderr why a check was skipped, past the test harness's capture (which takes only
/// `eprintln!`), so that the line shows in every run.
fn skip(why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "skipped: {why}");
}

/// `PRIMJIT_MAX_ISA` is parsed strictly; a cap above the host's tier is an error at
/// `Engine::new` that names the tiers the host runs; a cap at or below it sets the engine's.
#[test]
fn max_isa_is_strict_and_a_cap_above_the_host_names_its_tiers() {
    for bad in ["AVX2", "avx", "avx512f", "x86"] {
        let err =
            EngineConfig::from_vars(|name| (name == "PRIMJIT_MAX_ISA").then(|| bad.to_string()))
                .unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("PRIMJIT_MAX_ISA={bad}: expected x128, avx2 or avx512")
        );
    }
    let config =
        EngineConfig::from_vars(|name| (name == "PRIMJIT_MAX_ISA").then(|| "x128".to_string()))
            .unwrap();
    assert_eq!(config.max_isa, Some(Isa::X128));
    let engine = Engine::new(EngineConfig {
        max_isa: Some(Isa::X128),
        threads: 1,
        ..EngineConfig::default()
    })
    .unwrap();
    assert_eq!(engine.isa(), Isa::X128);
    assert_eq!(
        Engine::new(EngineConfig::default()).unwrap().isa(),
        Isa::host()
    );
    match Isa::ALL.into_iter().find(|&t| t > Isa::host()) {
        None => skip(&format!(
            "no tier above this host's ({}) to refuse",
            Isa::host()
        )),
        Some(above) => {
            let Err(err) = Engine::new(EngineConfig {
                max_isa: Some(above),
                ..EngineConfig::default()
            }) else {
                panic!("a cap of {above} above the host's tier was accepted");
            };
            assert!(
                matches!(err, RuntimeError::Config(ConfigError::Isa(_))),
                "{err:?}"
            );
            let tiers: Vec<&str> = Isa::host_tiers().iter().map(|t| t.name()).collect();
            assert_eq!(
                err.to_string(),
                format!(
                    "the vector tier {above} is above this host's: it runs {}",
                    tiers.join(", ")
                )
            );
        }
    }
}

/// A graph packed for a wide tier cannot run on an engine capped below it: the error names
/// the kernel, its tier and the engine's, before any code of that tier is made.
#[test]
fn a_graph_of_a_tier_above_the_engines_is_refused() {
    let Some(wide) = Isa::host_tiers().into_iter().find(|&t| t > Isa::X128) else {
        skip("this host runs x128 only, no wider graph to refuse");
        return;
    };
    let graph = tiny();
    let params = Params::random(&graph, 0);
    let model =
        CompiledGraph::with_target(&graph, &params, primjit::ConvAlgoChoice::Auto, wide).unwrap();
    assert_eq!(model.isa(), wide);
    let narrow = Engine::new(EngineConfig {
        max_isa: Some(Isa::X128),
        threads: 1,
        ..EngineConfig::default()
    })
    .unwrap();
    let x = Tensor {
        shape: vec![1, 3, 4, 5],
        data: vec![0.5; 60],
    };
    let err = model
        .run(&narrow, &[("x", &x)], &mut primjit::Workspace::new())
        .unwrap_err();
    assert!(
        matches!(err, GraphError::Runtime(RuntimeError::Tier { tier, engine: Isa::X128, .. }) if tier == wide),
        "{err:?}"
    );
    assert!(
        err.to_string().ends_with(&format!(
            "needs the {wide} vector tier, above this engine's x128"
        )),
        "{err}"
    );
    // The same graph packed for the engine's tier runs, and matches the wide one's results
    // within the convolution's rounding.
    let x128 =
        CompiledGraph::with_target(&graph, &params, primjit::ConvAlgoChoice::Auto, Isa::X128)
            .unwrap();
    let (a, _) = x128
        .run(&narrow, &[("x", &x)], &mut primjit::Workspace::new())
        .unwrap();
    let host = Engine::new(EngineConfig {
        threads: 1,
        ..EngineConfig::default()
    })
    .unwrap();
    let (b, _) = model
        .run(&host, &[("x", &x)], &mut primjit::Workspace::new())
        .unwrap();
    for (p, q) in a[0].1.data.iter().zip(&b[0].1.data) {
        assert!((p - q).abs() <= 1e-5 * (1.0 + p.abs()), "{p} against {q}");
    }
}

/// A Winograd key for a convolution it cannot compute is an invalid key that says why.
#[test]
fn key_error_winograd_on_a_strided_convolution() {
    let mut d = primjit::ConvDesc::new(1, 8, [8, 8], 8, [3, 3]);
    d.strides = [3, 3];
    d.src_layout = primjit::Layout::Nchw4c;
    d.dst_layout = primjit::Layout::Nchw4c;
    d.algo = primjit::ConvAlgo::WinogradF4x3;
    let err = primjit::PrimitiveKey::Conv(d).validate().unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid primitive conv mb1ic8ih8iw8oc8oh2ow2kh3kw3sh3sw3ph0pw0 alg:wino_f4x3 \
         nChw4c>nChw4c: winograd F(4x4, 3x3) needs strides of 1 and 1 or of 2 and 2"
    );
}

#[test]
fn runtime_error_map_after_one_retry_names_the_key() {
    let (engine, fail) = failing_engine();
    let key = relu_key();
    let err = engine.compile(&key).unwrap_err();
    let RuntimeError::Map { key: k, message } = &err else {
        panic!("expected a mapping error, got {err:?}");
    };
    assert_eq!(k, &key.to_string());
    assert_eq!(message, "injected map failure");
    assert_eq!(
        err.to_string(),
        format!("mapping executable pages for {key} failed: injected map failure")
    );
    assert_eq!(engine.cache().stats().entries, 0);
    // Not sticky: once pages can be mapped again, the same key compiles.
    fail.store(false, Ordering::SeqCst);
    engine.compile(&key).expect("compiles once mapping works");
}

/// Runs `key`'s primitive with the given buffers through `Engine::execute`.
fn execute(
    key: &PrimitiveKey,
    src: usize,
    weights: Option<usize>,
    dst: usize,
    extra: &[usize],
) -> RuntimeError {
    let engine = engine();
    let p = engine.compile(key).unwrap();
    let src = vec![0.0; src];
    let weights = weights.map(|n| vec![0.0; n]);
    let mut dst = vec![0.0; dst];
    let extra: Vec<Vec<f32>> = extra.iter().map(|&n| vec![0.0; n]).collect();
    let extra: Vec<&[f32]> = extra.iter().map(|e| e.as_slice()).collect();
    engine
        .execute(
            &p,
            ExecArgs {
                src: &src,
                weights: weights.as_deref(),
                dst: &mut dst,
                extra: &extra,
                scratch: None,
            },
        )
        .unwrap_err()
}

#[test]
fn exec_error_buffer_length_names_the_role_and_shape() {
    let key = relu_key();
    let err = execute(&key, 24, None, 23, &[]);
    assert_eq!(
        err,
        RuntimeError::Exec(ExecError::BufferLength {
            key: key.to_string(),
            role: "dst",
            expected: 24,
            found: 23,
            shape: vec![1, 2, 3, 4],
        })
    );
    assert_eq!(
        err.to_string(),
        format!("{key}: the dst buffer holds 23 floats but shape [1, 2, 3, 4] needs 24")
    );
}

#[test]
fn exec_error_missing_weights() {
    let key = conv_key();
    let err = execute(&key, 18, None, 18, &[18]);
    assert_eq!(
        err,
        RuntimeError::Exec(ExecError::MissingBuffer {
            key: key.to_string(),
            role: "weights"
        })
    );
    assert_eq!(
        err.to_string(),
        format!("{key}: the weights buffer is missing")
    );
}

#[test]
fn exec_error_unexpected_weights() {
    let key = relu_key();
    let err = execute(&key, 24, Some(4), 24, &[]);
    assert_eq!(
        err,
        RuntimeError::Exec(ExecError::UnexpectedBuffer {
            key: key.to_string(),
            role: "weights"
        })
    );
    assert_eq!(
        err.to_string(),
        format!("{key}: this primitive takes no weights buffer")
    );
}

#[test]
fn exec_error_extra_count() {
    let key = conv_key();
    let PrimitiveKey::Conv(d) = &key else {
        unreachable!()
    };
    let packed = ConvPlan::new(d).packed_weights_len();
    let err = execute(&key, 18, Some(packed), 18, &[]);
    assert_eq!(
        err,
        RuntimeError::Exec(ExecError::ExtraCount {
            key: key.to_string(),
            expected: 1,
            found: 0
        })
    );
    assert_eq!(
        err.to_string(),
        format!("{key}: expected 1 extra buffers (residuals or second source), found 0")
    );
}

/// A conv with a fused 2x2 max pool: it takes a band of scratch per thread.
fn fused_key() -> PrimitiveKey {
    let mut d = ConvDesc::new(1, 4, [6, 6], 4, [3, 3]);
    d.pads = Pads::uniform(1);
    d.pool = Some(PoolWindow {
        kernel: [2, 2],
        strides: [2, 2],
        pads: Pads::default(),
        dilations: [1, 1],
        ceil_mode: false,
    });
    PrimitiveKey::Conv(d)
}

/// Runs `key`'s primitive with buffers of the right lengths and `scratch` floats of scratch.
fn execute_with_scratch(key: &PrimitiveKey, scratch: Option<usize>) -> Result<(), RuntimeError> {
    let engine = engine();
    let p = engine.compile(key).unwrap();
    let len = |role: &str| p.buffers().iter().find(|b| b.role == role).map(|b| b.len);
    let src = vec![0.0; len("src").unwrap()];
    let weights = len("weights").map(|n| vec![0.0; n]);
    let mut dst = vec![0.0; len("dst").unwrap()];
    let mut scratch = scratch.map(|n| vec![0.0; n]);
    engine.execute(
        &p,
        ExecArgs {
            src: &src,
            weights: weights.as_deref(),
            dst: &mut dst,
            extra: &[],
            scratch: scratch.as_deref_mut(),
        },
    )
}

#[test]
fn exec_error_scratch_missing_misfit_or_unexpected() {
    let key = fused_key();
    let PrimitiveKey::Conv(d) = &key else {
        unreachable!()
    };
    // Three rows of the 6-wide output in one block of four channels.
    let band = d.scratch_len();
    assert_eq!(band, 2 * 6 * 4);
    execute_with_scratch(&key, Some(band)).expect("one band");
    execute_with_scratch(&key, Some(3 * band)).expect("three bands");
    execute_with_scratch(&key, Some(band + 1)).expect("a band and an unused float");

    let err = execute_with_scratch(&key, None).unwrap_err();
    assert_eq!(
        err,
        RuntimeError::Exec(ExecError::MissingBuffer {
            key: key.to_string(),
            role: "scratch"
        })
    );
    assert_eq!(
        err.to_string(),
        format!("{key}: the scratch buffer is missing")
    );

    for found in [0, 1, band - 1] {
        let err = execute_with_scratch(&key, Some(found)).unwrap_err();
        assert_eq!(
            err,
            RuntimeError::Exec(ExecError::ScratchLength {
                key: key.to_string(),
                per_thread: band,
                found
            })
        );
        assert_eq!(
            err.to_string(),
            format!(
                "{key}: the scratch buffer holds {found} floats but needs at least {band} (a band \
                 per thread)"
            )
        );
    }

    let relu = relu_key();
    let err = execute_with_scratch(&relu, Some(4)).unwrap_err();
    assert_eq!(
        err,
        RuntimeError::Exec(ExecError::UnexpectedBuffer {
            key: relu.to_string(),
            role: "scratch"
        })
    );
}

#[test]
fn codegen_error_a_fused_pool_after_a_residual_add() {
    let PrimitiveKey::Conv(mut d) = fused_key() else {
        unreachable!()
    };
    d.post_ops = vec![PostOpDesc::Add];
    let key = PrimitiveKey::Conv(d);
    let err = engine().compile(&key).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "invalid primitive {key}: a fused max pool cannot follow a residual add (not supported)"
        )
    );
}

#[test]
fn exec_error_work_items_outside_the_rows() {
    let key = relu_key();
    let p = engine().compile(&key).unwrap();
    let src = vec![0.0; 24];
    let mut dst = vec![0.0; 24];
    let err = p
        .execute_range(
            ExecArgs {
                src: &src,
                weights: None,
                dst: &mut dst,
                extra: &[],
                scratch: None,
            },
            None,
            2..5,
        )
        .unwrap_err();
    assert_eq!(
        err,
        ExecError::WorkItems {
            key: key.to_string(),
            start: 2,
            end: 5,
            limit: 3
        }
    );
    assert_eq!(
        err.to_string(),
        format!("{key}: work items 2..5 are not within 0..3")
    );
}

// ---------------------------------------------------------------------------------------------
// primjit::runtime: graphs
// ---------------------------------------------------------------------------------------------

fn model() -> CompiledGraph {
    let graph = tiny();
    CompiledGraph::new(&graph, &Params::random(&graph, 0)).expect("the tiny graph compiles")
}

#[test]
fn graph_error_verify_names_an_input_given_twice() {
    let err = model()
        .run(
            &engine(),
            &[("x", &x(5)), ("x", &x(6))],
            &mut primjit::Workspace::new(),
        )
        .unwrap_err();
    assert_eq!(err.to_string(), "%x: the input is given twice");
}

#[test]
fn graph_error_verify_names_the_input() {
    let err = model()
        .run(&engine(), &[("z", &x(5))], &mut primjit::Workspace::new())
        .unwrap_err();
    assert!(
        matches!(err, GraphError::Verify(VerifyError { .. })),
        "{err:?}"
    );
    assert_eq!(err.to_string(), "%z: the graph has no such input");
}

/// A child of `fork` inherits the engine but not its pool's threads: a run there returns
/// `ConfigError::OtherProcess` at once instead of waiting for them forever. The child only
/// compares plain values and exits, allocating nothing, since another test's thread may hold
/// the allocator's lock at the fork.
#[test]
fn config_error_other_process_after_a_fork() {
    let engine = Engine::new(EngineConfig {
        threads: 2,
        ..EngineConfig::default()
    })
    .expect("engine");
    let model = model();
    let input = x(5);
    let inputs = [("x", primjit::TensorView::from(&input))];
    let mut outputs = vec![Tensor::zeros(vec![0])];
    let mut workspace = primjit::Workspace::new();
    model
        .run_into(&engine, &inputs, &mut outputs, &mut workspace)
        .expect("runs in its own process");
    let parent = std::process::id();
    // SAFETY: the child calls only `run_into`, which returns before it allocates, compares
    // integers, and leaves with `_exit`, which runs no destructors and no atexit handlers.
    let child = unsafe { libc::fork() };
    assert!(child >= 0, "fork failed");
    if child == 0 {
        let current = std::process::id();
        let result = model.run_into(&engine, &inputs, &mut outputs, &mut workspace);
        let code = match result {
            Err(GraphError::Runtime(RuntimeError::Config(ConfigError::OtherProcess {
                created,
                current: reported,
            }))) if created == parent && reported == current => 0,
            Err(_) => 2,
            Ok(_) => 3,
        };
        // SAFETY: ends the child without unwinding into the test harness's state.
        unsafe { libc::_exit(code) };
    }
    // A child that hangs (the bug this guards against) is killed after 60 s.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut status = 0;
    loop {
        // SAFETY: polls the child forked above; `status` is a valid out-pointer.
        let waited = unsafe { libc::waitpid(child, &mut status, libc::WNOHANG) };
        assert!(waited == 0 || waited == child, "waitpid failed");
        if waited == child {
            break;
        }
        if std::time::Instant::now() > deadline {
            // SAFETY: kills and reaps the child forked above, which has hung.
            unsafe {
                libc::kill(child, libc::SIGKILL);
                libc::waitpid(child, &mut status, 0);
            }
            panic!("the forked child's run hung");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child's run did not return OtherProcess (status {status})"
    );
    let err = ConfigError::OtherProcess {
        created: parent,
        current: child as u32,
    };
    assert_eq!(
        err.to_string(),
        format!(
            "this engine was created in process {parent}, and a fork does not copy its threads \
             into process {child}: create a new engine in this process"
        )
    );
    // The engine still runs in its own process.
    model
        .run_into(&engine, &inputs, &mut outputs, &mut workspace)
        .expect("runs in its own process");
}

#[test]
fn graph_error_param_names_the_parameter() {
    let err = CompiledGraph::new(&tiny(), &Params::new()).unwrap_err();
    assert!(matches!(err, GraphError::Param(_)), "{err:?}");
    assert!(err.to_string().starts_with("parameter @"), "{err}");
}

#[test]
fn graph_error_runtime_when_pages_cannot_be_mapped() {
    let (engine, _fail) = failing_engine();
    let err = model()
        .run(&engine, &[("x", &x(5))], &mut primjit::Workspace::new())
        .unwrap_err();
    let GraphError::Runtime(RuntimeError::Map { key, .. }) = &err else {
        panic!("expected a mapping error, got {err:?}");
    };
    assert!(key.starts_with("conv "), "{key}");
    assert!(
        err.to_string()
            .starts_with("mapping executable pages for conv "),
        "{err}"
    );
    assert_eq!(engine.cache().stats().entries, 0);
}

#[test]
fn graph_error_input_data_names_the_input() {
    let short = Tensor {
        shape: vec![1, 3, 4, 5],
        data: vec![0.0; 59],
    };
    let err = model()
        .run(&engine(), &[("x", &short)], &mut primjit::Workspace::new())
        .unwrap_err();
    assert_eq!(
        err,
        GraphError::InputData {
            name: "x".into(),
            shape: vec![1, 3, 4, 5],
            expected: 60,
            found: 59
        }
    );
    assert_eq!(
        err.to_string(),
        "input %x: the tensor has 59 values but its shape [1, 3, 4, 5] needs 60"
    );
    // A shape whose element count overflows: the same error, not a wrapped product.
    let huge = Tensor {
        shape: vec![1, 3, 4, 1 << 62],
        data: vec![],
    };
    let err = model()
        .run(&engine(), &[("x", &huge)], &mut primjit::Workspace::new())
        .unwrap_err();
    assert_eq!(
        err,
        GraphError::InputData {
            name: "x".into(),
            shape: vec![1, 3, 4, 1 << 62],
            expected: usize::MAX,
            found: 0
        }
    );
}

#[test]
fn graph_error_output_count_of_run_into() {
    let x = x(5);
    let err = model()
        .run_into(
            &engine(),
            &[("x", primjit::TensorView::from(&x))],
            &mut [],
            &mut primjit::Workspace::new(),
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
fn exec_error_in_place_for_a_primitive_without_a_residual() {
    let engine = engine();
    let key = relu_key();
    let p = engine.compile(&key).unwrap();
    let src = vec![0.0; 24];
    let mut dst = vec![0.0; 24];
    let err = engine
        .execute_over_residual(
            &p,
            ExecArgs {
                src: &src,
                weights: None,
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

#[test]
fn graph_error_unbound_names_the_value_and_its_symbolic_shape() {
    let err = model().keys(&Bindings::new()).unwrap_err();
    let GraphError::Unbound { value, shape } = &err else {
        panic!("expected an unbound symbol, got {err:?}");
    };
    assert_eq!((value.as_str(), shape.as_str()), ("x", "[1, 3, 4, W]"));
    assert_eq!(
        err.to_string(),
        "%x: symbol values are missing, the shape is [1, 3, 4, W]"
    );
}

/// `Budget` and `CacheConfig` appear in the catalogue through `ConfigError::Invalid`; the
/// capacity variable has its own message.
#[test]
fn config_error_invalid_capacity() {
    let err =
        CacheConfig::from_vars(|name| (name == "PRIMJIT_CACHE_CAPACITY").then(|| "-1".to_string()))
            .unwrap_err();
    assert_eq!(
        err.to_string(),
        "PRIMJIT_CACHE_CAPACITY=-1: expected a whole number of entries"
    );
    assert_eq!(
        Budget::parse("12 parsecs").map_err(|e| e.contains("parsecs")),
        Err(true)
    );
}

#[test]
fn exec_error_extents_of_a_runtime_width_primitive() {
    use primjit::RuntimeDims;
    let mut d = ConvDesc::new(1, 4, [5, 5], 4, [3, 3]);
    d.src_layout = Layout::Nchw4c;
    d.dst_layout = Layout::Nchw4c;
    let key = PrimitiveKey::Conv(d.with_runtime(RuntimeDims { h: false, w: true }));
    let p = engine().compile(&key).unwrap();
    let weights = vec![0.0; p.buffers()[1].len];
    let src = vec![0.0; 4 * 5 * 2];
    let mut dst = vec![0.0; 4];
    // Without extents, and at a width the 3x3 window does not fit.
    let err = p
        .execute(ExecArgs {
            src: &src,
            weights: Some(&weights),
            dst: &mut dst,
            extra: &[],
            scratch: None,
        })
        .unwrap_err();
    assert!(
        matches!(&err, ExecError::Extents { reason, .. } if reason.contains("pass the call's extents")),
        "{err}"
    );
    let err = p
        .execute_at(
            ExecArgs {
                src: &src,
                weights: Some(&weights),
                dst: &mut dst,
                extra: &[],
                scratch: None,
            },
            [5, 2],
        )
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{key}: extents [5, 2] are not valid for this primitive: \
             the output would be empty: the window does not fit in the padded input"
        )
    );
}

// ---- descriptors and parameter files (the facade's own) ----

#[test]
fn descriptor_errors_name_the_entry_or_the_problem() {
    use primjit::descriptor::{DescriptorError, DescriptorOp, parse};
    let err = parse("ic64x3").unwrap_err();
    assert!(matches!(err, DescriptorError::Syntax { .. }));
    assert_eq!(err.to_string(), "descriptor `ic64x3`: unknown entry `x`");
    let err = parse("ic4oc4kh3").unwrap().conv(Layout::Nchw).unwrap_err();
    assert_eq!(err, DescriptorError::Missing("ih".into()));
    assert_eq!(err.to_string(), "the descriptor needs `ih`");
    let err = parse("ic4oc4ih2kh3")
        .unwrap()
        .conv(Layout::Nchw)
        .unwrap_err();
    assert!(matches!(err, DescriptorError::Problem(_)));
    assert_eq!(
        err.to_string(),
        "the descriptor's output along `h` would be empty"
    );
    // Numbers at the ends of `usize`: an error each, never an overflow (`oh0` without a
    // padding, a dilation of `usize::MAX`, a padding that overflows the padded input, an
    // output whose windows span more than `usize` can count).
    let max = usize::MAX;
    for (descriptor, message) in [
        (
            "ic4oc4ih8kh3oh0".to_string(),
            "the descriptor's output along `h` would be empty",
        ),
        (
            format!("ic4oc4ih8kh3dh{max}"),
            "the descriptor's extents along `h` are too large",
        ),
        (
            format!("ic4oc4ih8kh3ph{}", max / 2 + 1),
            "the descriptor's extents along `h` are too large",
        ),
        (
            format!("ic4oc4ih8kh3sh2oh{max}"),
            "the descriptor's extents along `h` are too large",
        ),
        // An output that no padding reaches: refused, not replaced by the input's 8.
        (
            "ic1oc1ih10kh3oh2".to_string(),
            "the descriptor's output along `h` is 2, but its input and padding give 8",
        ),
    ] {
        let err = parse(&descriptor).unwrap().conv(Layout::Nchw).unwrap_err();
        assert_eq!(
            err,
            DescriptorError::Problem(message.into()),
            "{descriptor}"
        );
    }
    let conv = DescriptorOp::Conv(primjit::ConvAlgoChoice::Direct);
    let err = parse("mb1g3ic8ih10oc8kh3")
        .unwrap()
        .keys(conv, Layout::Nchw)
        .unwrap_err();
    assert!(
        matches!(&err, DescriptorError::Key(k) if k.reason.contains("group")),
        "{err}"
    );
    assert!(
        err.to_string().starts_with("invalid primitive conv "),
        "{err}"
    );
}

/// A safetensors file of F32 tensors (and one F64 when `f64_name` names it).
fn safetensors_bytes(tensors: &[(&str, Vec<usize>)], f64_name: Option<&str>) -> Vec<u8> {
    use safetensors::tensor::TensorView;
    let data: Vec<(String, Vec<usize>, Vec<u8>, safetensors::Dtype)> = tensors
        .iter()
        .map(|(name, shape)| {
            let n: usize = shape.iter().product();
            if Some(*name) == f64_name {
                (
                    name.to_string(),
                    shape.clone(),
                    vec![0u8; n * 8],
                    safetensors::Dtype::F64,
                )
            } else {
                (
                    name.to_string(),
                    shape.clone(),
                    vec![0u8; n * 4],
                    safetensors::Dtype::F32,
                )
            }
        })
        .collect();
    let views: Vec<(String, TensorView<'_>)> = data
        .iter()
        .map(|(name, shape, bytes, dtype)| {
            (
                name.clone(),
                TensorView::new(*dtype, shape.clone(), bytes).unwrap(),
            )
        })
        .collect();
    safetensors::serialize(views, None).unwrap()
}

#[test]
fn param_file_errors_name_the_file_and_the_parameter() {
    use primjit::params_file::{ParamFileError, read_safetensors, safetensors_params};
    let graph = tiny();
    let all = [
        ("w", vec![2, 3, 3, 3]),
        ("b", vec![2]),
        ("s", vec![2]),
        ("t", vec![2]),
        ("m", vec![2]),
        ("v", vec![2]),
    ];
    let params = safetensors_params(
        &safetensors_bytes(&all, None),
        "p.safetensors",
        &graph,
        None,
    );
    assert_eq!(params.unwrap().get("w").unwrap().shape, vec![2, 3, 3, 3]);

    let err = read_safetensors(
        std::path::Path::new("/nonexistent/p.safetensors"),
        &graph,
        None,
    )
    .unwrap_err();
    assert!(
        matches!(&err, ParamFileError::Read { source, .. } if source.kind() == io::ErrorKind::NotFound)
    );
    assert_eq!(err.to_string(), "cannot read `/nonexistent/p.safetensors`");

    let err = safetensors_params(b"not safetensors", "x.bin", &graph, None).unwrap_err();
    assert!(matches!(err, ParamFileError::Format { .. }));
    assert!(
        err.to_string()
            .starts_with("`x.bin` is not a safetensors file: "),
        "{err}"
    );

    let err =
        safetensors_params(&safetensors_bytes(&all[..5], None), "p.st", &graph, None).unwrap_err();
    assert_eq!(
        err.to_string(),
        "parameter @v is missing from `p.st` (expected shape [2])"
    );

    let err =
        safetensors_params(&safetensors_bytes(&all, Some("s")), "p.st", &graph, None).unwrap_err();
    assert_eq!(
        err.to_string(),
        "parameter @s in `p.st` has dtype F64; only F32 is supported"
    );

    let mut wrong = all.to_vec();
    wrong[0].1 = vec![2, 3, 1, 1];
    let err =
        safetensors_params(&safetensors_bytes(&wrong, None), "p.st", &graph, None).unwrap_err();
    assert_eq!(
        err.to_string(),
        "parameter @w has shape [2, 3, 1, 1] in `p.st` but the graph declares [2, 3, 3, 3]"
    );
}

/// A FIFO of this test process under the temporary directory, removed when dropped.
struct Fifo(std::path::PathBuf);

impl Fifo {
    fn new(name: &str) -> Self {
        let path =
            std::env::temp_dir().join(format!("primjit-errors-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: `c_path` is a NUL-terminated path that outlives the call.
        assert_eq!(
            unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) },
            0,
            "mkfifo failed"
        );
        Fifo(path)
    }

    /// Lets an `open` for reading that blocks on the FIFO go: a writer that comes and leaves.
    fn release_a_reader(&self) {
        use std::os::unix::fs::OpenOptionsExt;
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&self.0);
    }
}

impl Drop for Fifo {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `f`'s result, from a thread: a call that has not returned after 60 s (the blocking `open`
/// of a FIFO that this guards against) fails the test instead of hanging it, after
/// `release` has let it go.
fn within_a_minute<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
    release: impl FnOnce(),
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(std::time::Duration::from_secs(60)) {
        Ok(result) => result,
        Err(_) => {
            release();
            panic!("the call blocked");
        }
    }
}

/// The I/O error at the source of a refused file, and what the file was.
fn refusal(source: &io::Error) -> Option<primjit::file::NotRegularFile> {
    assert_eq!(source.kind(), io::ErrorKind::InvalidInput, "{source}");
    primjit::file::NotRegularFile::in_error(source)
}

/// A parameter file that is not a regular file is refused before it is opened or mapped: a
/// FIFO would block the open until a writer came, `/dev/zero` would map as nothing.
#[test]
fn param_file_error_read_of_a_file_that_is_not_regular() {
    use primjit::file::NotRegularFile;
    use primjit::params_file::{ParamFileError, read_safetensors};
    let fifo = Fifo::new("params.safetensors");
    let link = std::env::temp_dir().join(format!(
        "primjit-errors-{}-zero.safetensors",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
    for (path, what) in [
        (fifo.0.clone(), NotRegularFile::Fifo),
        ("/dev/zero".into(), NotRegularFile::CharDevice),
        (link.clone(), NotRegularFile::CharDevice),
        (std::env::temp_dir(), NotRegularFile::Directory),
    ] {
        let p = path.clone();
        let err = within_a_minute(
            move || read_safetensors(&p, &tiny(), None),
            || fifo.release_a_reader(),
        )
        .unwrap_err();
        let ParamFileError::Read { origin, source } = &err else {
            panic!("{path:?}: not a read error: {err}");
        };
        assert_eq!(origin, &path.display().to_string());
        assert_eq!(refusal(source), Some(what), "{path:?}");
        assert_eq!(
            format!("{err}: {source}"),
            format!("cannot read `{}`: {what}", path.display())
        );
    }
    let _ = std::fs::remove_file(&link);
    assert_eq!(
        NotRegularFile::Fifo.to_string(),
        "it is a FIFO, not a regular file"
    );
    assert_eq!(
        NotRegularFile::CharDevice.to_string(),
        "it is a character device, not a regular file"
    );
}

/// IR text is read only from a regular file (`file::read_regular_to_string`), and
/// `file::open_regular` refuses a device before anything reads it.
#[test]
fn ir_text_is_read_only_from_a_regular_file() {
    use primjit::file::{NotRegularFile, open_regular, read_regular_to_string};
    let fifo = Fifo::new("graph.ir");
    let p = fifo.0.clone();
    let err = within_a_minute(
        move || read_regular_to_string(&p),
        || fifo.release_a_reader(),
    )
    .unwrap_err();
    assert_eq!(refusal(&err), Some(NotRegularFile::Fifo));
    assert_eq!(err.to_string(), "it is a FIFO, not a regular file");
    let err = open_regular(std::path::Path::new("/dev/zero")).unwrap_err();
    assert_eq!(refusal(&err), Some(NotRegularFile::CharDevice));
    let err = read_regular_to_string(&std::env::temp_dir()).unwrap_err();
    assert_eq!(refusal(&err), Some(NotRegularFile::Directory));
    // A missing file is the operating system's error, not a refusal.
    let err = read_regular_to_string(std::path::Path::new("/nonexistent/g.ir")).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::NotFound);
    assert_eq!(NotRegularFile::in_error(&err), None);
    // A regular file reads.
    let text = read_regular_to_string(std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../ir/examples/pooling.ir"
    )))
    .unwrap();
    assert!(text.contains("graph"), "{text}");
}
