//! The `primjit` binary driven as a user would: check, dump and run, and their error paths.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use npyz::WriterBuilder;
use safetensors::{Dtype, View};

const TRUNK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../ir/resnet34_trunk.ir");

/// Runs `primjit` with `args`.
fn primjit(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_primjit"))
        .args(args)
        .output()
        .expect("the primjit binary runs")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asserts that the command succeeded and returns its stdout.
#[track_caller]
fn success(out: &Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        stdout(out),
        stderr(out)
    );
    stdout(out)
}

/// Asserts that the command failed with `code` and that stderr holds every one of `needles`;
/// returns stderr.
#[track_caller]
fn failure(out: &Output, code: i32, needles: &[&str]) -> String {
    let err = stderr(out);
    assert_eq!(
        out.status.code(),
        Some(code),
        "stdout:\n{}\nstderr:\n{err}",
        stdout(out)
    );
    for needle in needles {
        assert!(err.contains(needle), "stderr lacks {needle:?}:\n{err}");
    }
    err
}

fn temp_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("primjit-cli-test-")
        .tempdir()
        .expect("a temporary directory")
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn s(path: &Path) -> &str {
    path.to_str().expect("utf-8 temp path")
}

fn write_npy_f32(path: &Path, shape: &[u64], data: &[f32]) {
    let mut bytes = Vec::new();
    let mut w = npyz::WriteOptions::new()
        .default_dtype()
        .shape(shape)
        .writer(&mut bytes)
        .begin_nd()
        .unwrap();
    w.extend(data.iter().copied()).unwrap();
    w.finish().unwrap();
    std::fs::write(path, bytes).unwrap();
}

fn write_npy_f64(path: &Path, shape: &[u64], data: &[f64]) {
    let mut bytes = Vec::new();
    let mut w = npyz::WriteOptions::new()
        .default_dtype()
        .shape(shape)
        .writer(&mut bytes)
        .begin_nd()
        .unwrap();
    w.extend(data.iter().copied()).unwrap();
    w.finish().unwrap();
    std::fs::write(path, bytes).unwrap();
}

/// Reads a .npy file of f32 back: its shape and data.
fn read_npy(path: &Path) -> (Vec<u64>, Vec<f32>) {
    let bytes = std::fs::read(path).unwrap();
    let npy = npyz::NpyFile::new(&bytes[..]).unwrap();
    assert_eq!(npy.order(), npyz::Order::C);
    let shape = npy.shape().to_vec();
    (shape, npy.into_vec::<f32>().unwrap())
}

/// A tensor to serialize into a safetensors file.
struct StTensor {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl StTensor {
    fn f32(shape: &[usize], data: &[f32]) -> Self {
        assert_eq!(shape.iter().product::<usize>(), data.len());
        StTensor {
            dtype: Dtype::F32,
            shape: shape.to_vec(),
            bytes: data.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }

    fn f64(shape: &[usize], data: &[f64]) -> Self {
        StTensor {
            dtype: Dtype::F64,
            shape: shape.to_vec(),
            bytes: data.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }
}

impl View for &StTensor {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

fn write_safetensors(path: &Path, tensors: &[(&str, StTensor)]) {
    let bytes = safetensors::serialize(tensors.iter().map(|(n, t)| (*n, t)), None).unwrap();
    std::fs::write(path, bytes).unwrap();
}

// ---- check ----

#[test]
fn check_trunk_with_dims_prints_every_node_shape() {
    let out = success(&primjit(&["check", TRUNK, "--dims", "W=1031"]));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "%conv1 = conv2d: [1, 64, 160, 516]");
    assert!(
        lines.contains(&"%maxpool = maxpool2d: [1, 64, 80, 258]"),
        "{out}"
    );
    assert!(lines.last().unwrap().ends_with("[1, 256, 20, 65]"), "{out}");
    assert_eq!(
        *lines.last().unwrap(),
        "%layer3.5.relu2 = relu: [1, 256, 20, 65]"
    );
    // One line per node: 29 convs, 29 batch-norms, 1 + 26 relus, 1 max-pool, 13 adds.
    assert_eq!(lines.len(), 29 + 29 + 27 + 1 + 13);
}

#[test]
fn check_trunk_without_dims_prints_symbolic_shapes() {
    let out = success(&primjit(&["check", TRUNK]));
    let first = out.lines().next().unwrap();
    assert_eq!(first, "%conv1 = conv2d: [1, 64, 160, (W - 1) / 2 + 1]");
    let last = out.lines().last().unwrap();
    assert!(
        last.starts_with("%layer3.5.relu2 = relu: [1, 256, 20, "),
        "{last}"
    );
    assert!(last.contains('W'), "{last}");
}

#[test]
fn check_malformed_file_reports_location_and_caret() {
    let dir = temp_dir();
    let path = write(
        dir.path(),
        "bad.ir",
        "graph bad {\n  input %x: f32[1, 3, 4, 4]\n  %y = relu(%nope)\n  output o = %y\n}\n",
    );
    let err = failure(
        &primjit(&["check", s(&path)]),
        1,
        &[&format!("{}:3:", path.display()), ": error: "],
    );
    let lines: Vec<&str> = err.lines().collect();
    assert!(
        lines[0].starts_with(&format!("{}:3:", path.display())),
        "{err}"
    );
    assert!(lines[0].contains("nope"), "{err}");
    assert_eq!(lines[1], "  %y = relu(%nope)");
    assert_eq!(lines[2].trim(), "^", "{err}");
    // The caret sits under the column the first line names.
    let col: usize = lines[0]
        .strip_prefix(&format!("{}:3:", path.display()))
        .unwrap()
        .split(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(lines[2].len(), col, "{err}");
    assert!(stdout(&primjit(&["check", s(&path)])).is_empty());
}

#[test]
fn check_invalid_graph_reports_location() {
    let dir = temp_dir();
    // The conv expects 4 input channels but gets 3.
    let path = write(
        dir.path(),
        "invalid.ir",
        "graph invalid {\n  input %x: f32[1, 3, 8, 8]\n  param @w: f32[8, 4, 3, 3]\n  %c = conv2d(%x, @w)\n  output o = %c\n}\n",
    );
    let err = failure(
        &primjit(&["check", s(&path)]),
        1,
        &[&format!("{}:4:", path.display()), ": error: "],
    );
    assert!(err.contains("%c") || err.contains("@w"), "{err}");
    assert!(err.lines().any(|l| l.trim() == "^"), "{err}");
}

#[test]
fn check_rejects_bad_dims_naming_the_item() {
    failure(
        &primjit(&["check", TRUNK, "--dims", "W"]),
        2,
        &["`W`", "NAME=VALUE"],
    );
    failure(
        &primjit(&["check", TRUNK, "--dims", "W=wide"]),
        2,
        &["`W`", "wide"],
    );
    failure(
        &primjit(&["check", TRUNK, "--dims", "W=0"]),
        2,
        &["`W`", "at least 1"],
    );
    failure(
        &primjit(&["check", TRUNK, "--dims", "W=40,Q=3"]),
        1,
        &["error: ", "`Q`", "not a symbol of the graph", "W"],
    );
}

#[test]
fn check_reports_a_missing_file() {
    failure(
        &primjit(&["check", "/nonexistent/graph.ir"]),
        1,
        &["error: cannot read `/nonexistent/graph.ir`"],
    );
}

#[test]
fn check_reports_a_window_that_does_not_fit() {
    // W=1 keeps every window in bounds for the trunk; a 3x3 unpadded conv on a 2-wide input
    // does not fit.
    let dir = temp_dir();
    let path = write(
        dir.path(),
        "narrow.ir",
        "graph narrow {\n  input %x: f32[1, 1, 4, W]\n  param @w: f32[1, 1, 3, 3]\n  %c = conv2d(%x, @w)\n  output o = %c\n}\n",
    );
    success(&primjit(&["check", s(&path)]));
    failure(
        &primjit(&["check", s(&path), "--dims", "W=2"]),
        1,
        &[&format!("{}:4:", path.display()), ": error: "],
    );
}

// ---- dump ----

#[test]
fn dump_ir_prints_canonical_text() {
    let out = success(&primjit(&["dump", TRUNK, "--stage", "ir"]));
    assert!(
        out.starts_with("graph resnet34_trunk {\n  input %x: f32[1, 3, 320, W]\n"),
        "{out}"
    );
    assert!(
        out.contains("  %conv1 = conv2d(%x, @conv1.weight, strides=[2, 2], pads=[3, 3, 3, 3])\n")
    );
    assert!(
        out.ends_with("  output out = %layer3.5.relu2\n}\n"),
        "{out}"
    );
    assert!(!out.contains('#'), "no comments in canonical text");
    // Canonical text reads back to itself.
    let dir = temp_dir();
    let path = write(dir.path(), "canonical.ir", &out);
    let again = success(&primjit(&["dump", s(&path), "--stage", "ir"]));
    assert_eq!(again, out);
}

#[test]
fn dump_shapes_annotates_every_node() {
    let out = success(&primjit(&[
        "dump", TRUNK, "--stage", "shapes", "--dims", "W=1031",
    ]));
    assert!(out.contains(
        "  %conv1 = conv2d(%x, @conv1.weight, strides=[2, 2], pads=[3, 3, 3, 3])  # [1, 64, 160, 516]\n"
    ));
    assert!(out.contains("%layer3.5.relu2 = relu(%layer3.5.add)  # [1, 256, 20, 65]\n"));
    let node_lines = out.lines().filter(|l| l.starts_with("  %")).count();
    let annotated = out
        .lines()
        .filter(|l| l.starts_with("  %") && l.contains("  # ["))
        .count();
    assert_eq!(node_lines, annotated);

    let symbolic = success(&primjit(&["dump", TRUNK, "--stage", "shapes"]));
    assert!(
        symbolic.contains("  # [1, 64, 160, (W - 1) / 2 + 1]"),
        "{symbolic}"
    );
}

#[test]
fn dump_folded_shows_fused_convs_and_a_pass_summary() {
    let out = success(&primjit(&["dump", TRUNK, "--stage", "folded"]));
    assert!(out.contains("post=["), "{out}");
    assert!(out.contains("bnfold"), "{out}");
    assert!(!out.contains("batchnorm("), "{out}");
    assert!(
        out.contains("@layer1.0.conv2.weight.bnfold, bias=@layer1.0.conv2.weight.bnfold_bias"),
        "{out}"
    );
    assert!(out.contains("post=[add(%maxpool), relu]"), "{out}");
    let last = out.lines().last().unwrap();
    assert!(last.starts_with("# passes: 29 batchnorms folded"), "{last}");
    assert!(
        last.contains("27 relus") && last.contains("13 adds"),
        "{last}"
    );

    let with_shapes = success(&primjit(&[
        "dump", TRUNK, "--stage", "folded", "--dims", "W=1031",
    ]));
    assert!(
        with_shapes.contains("post=[relu])  # [1, 64, 160, 516]"),
        "{with_shapes}"
    );

    // The folded graph (less its summary comment) is itself valid IR.
    let dir = temp_dir();
    let path = write(dir.path(), "folded.ir", &out);
    let checked = success(&primjit(&["check", s(&path), "--dims", "W=1031"]));
    assert!(
        checked.trim_end().ends_with("[1, 256, 20, 65]"),
        "{checked}"
    );
}

#[test]
fn dump_rejects_an_unknown_stage() {
    failure(
        &primjit(&["dump", TRUNK, "--stage", "llvm"]),
        2,
        &["invalid value 'llvm'", "ir", "shapes", "folded"],
    );
    failure(&primjit(&["dump", TRUNK]), 2, &["--stage"]);
}

#[test]
fn dump_reports_ir_errors_with_location() {
    let dir = temp_dir();
    let path = write(dir.path(), "bad.ir", "graph bad {\n  input %x f32[1]\n}\n");
    failure(
        &primjit(&["dump", s(&path), "--stage", "ir"]),
        1,
        &[&format!("{}:2:", path.display()), ": error: "],
    );
}

// ---- run: the trunk ----

#[test]
fn run_trunk_with_random_params_writes_the_output_shape() {
    let dir = temp_dir();
    let input = dir.path().join("x.npy");
    let n = 3 * 320 * 40;
    let data: Vec<f32> = (0..n).map(|i| ((i % 17) as f32 - 8.0) / 8.0).collect();
    write_npy_f32(&input, &[1, 3, 320, 40], &data);
    let output = dir.path().join("y.npy");
    let out = success(&primjit(&[
        "run",
        TRUNK,
        "--input",
        &format!("x={}", input.display()),
        "--output",
        s(&output),
        "--random-params",
        "7",
    ]));
    assert!(out.contains("out: [1, 256, 20, 3]"), "{out}");
    let (shape, values) = read_npy(&output);
    assert_eq!(shape, [1, 256, 20, 3]);
    assert_eq!(values.len(), 256 * 20 * 3);
    assert!(
        values.iter().all(|v| v.is_finite() && *v >= 0.0),
        "relu output"
    );
    assert!(values.iter().any(|v| *v > 0.0));

    // Unnamed --input for the graph's only input, --reference, and the same seed agree.
    let again = dir.path().join("y2.npy");
    success(&primjit(&[
        "run",
        TRUNK,
        "--input",
        s(&input),
        "--output",
        &format!("out={}", again.display()),
        "--random-params",
        "7",
        "--reference",
    ]));
    assert_eq!(read_npy(&again), (shape, values));
}

#[test]
fn run_trunk_with_random_input_needs_dims() {
    let dir = temp_dir();
    let output = dir.path().join("y.npy");
    failure(
        &primjit(&[
            "run",
            TRUNK,
            "--random-input",
            "1",
            "--output",
            s(&output),
            "--random-params",
            "1",
        ]),
        1,
        &["--random-input", "%x", "[1, 3, 320, W]", "--dims"],
    );
    assert!(!output.exists());

    let out = success(&primjit(&[
        "run",
        TRUNK,
        "--dims",
        "W=8",
        "--random-input",
        "1",
        "--output",
        s(&output),
        "--random-params",
        "1",
    ]));
    assert!(out.contains("out: [1, 256, 20, 1]"), "{out}");
    assert_eq!(read_npy(&output).0, [1, 256, 20, 1]);
}

// ---- run: a tiny graph with known values ----

const TINY: &str = "graph tiny {
  input %x: f32[1, 1, 2, W]
  param @w: f32[2, 1, 1, 1]
  param @bn.weight: f32[2]
  param @bn.bias: f32[2]
  param @bn.running_mean: f32[2]
  param @bn.running_var: f32[2]
  %c = conv2d(%x, @w)
  %bn = batchnorm(%c, @bn.weight, @bn.bias, @bn.running_mean, @bn.running_var, epsilon=0.0)
  %y = relu(%bn)
  output y = %y
  output pre = %bn
}
";

/// Parameters of `TINY`: channel 0 is `relu(2x + 1)`, channel 1 is `relu(-x * 0.5 - 1)`
/// (`((-x - 1) / 4) * 2 - 0.5 = -x/2 - 1`).
fn tiny_params() -> Vec<(&'static str, StTensor)> {
    vec![
        ("w", StTensor::f32(&[2, 1, 1, 1], &[2.0, -1.0])),
        ("bn.weight", StTensor::f32(&[2], &[1.0, 2.0])),
        ("bn.bias", StTensor::f32(&[2], &[1.0, -0.5])),
        ("bn.running_mean", StTensor::f32(&[2], &[0.0, 1.0])),
        ("bn.running_var", StTensor::f32(&[2], &[1.0, 16.0])),
        // Tensors the graph does not use are ignored, whatever their dtype.
        ("bn.num_batches_tracked", StTensor::f64(&[], &[0.0])),
    ]
}

struct Tiny {
    dir: tempfile::TempDir,
    ir: PathBuf,
    params: PathBuf,
    input: PathBuf,
}

impl Tiny {
    fn new() -> Self {
        let dir = temp_dir();
        let ir = write(dir.path(), "tiny.ir", TINY);
        let params = dir.path().join("tiny.safetensors");
        write_safetensors(&params, &tiny_params());
        let input = dir.path().join("x.npy");
        write_npy_f32(&input, &[1, 1, 2, 3], &[-2.0, -1.0, 0.0, 1.0, 2.0, 0.5]);
        Tiny {
            dir,
            ir,
            params,
            input,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

#[test]
fn run_tiny_graph_with_safetensors_params_computes_known_values() {
    let t = Tiny::new();
    let y = t.path("y.npy");
    let pre = t.path("pre.npy");
    let out = success(&primjit(&[
        "run",
        s(&t.ir),
        "--input",
        s(&t.input),
        "--params",
        s(&t.params),
        "--output",
        &format!("pre={}", pre.display()),
        "--output",
        &format!("y={}", y.display()),
    ]));
    assert!(out.contains("y: [1, 2, 2, 3]"), "{out}");
    assert!(out.contains("pre: [1, 2, 2, 3]"), "{out}");
    let x = [-2.0f32, -1.0, 0.0, 1.0, 2.0, 0.5];
    let expect_pre: Vec<f32> = x
        .iter()
        .map(|v| 2.0 * v + 1.0)
        .chain(x.iter().map(|v| -v / 2.0 - 1.0))
        .collect();
    let (shape, got_pre) = read_npy(&pre);
    assert_eq!(shape, [1, 2, 2, 3]);
    let (shape, got_y) = read_npy(&y);
    assert_eq!(shape, [1, 2, 2, 3]);
    for i in 0..12 {
        assert!((got_pre[i] - expect_pre[i]).abs() < 1e-6, "{got_pre:?}");
        assert!(
            (got_y[i] - expect_pre[i].max(0.0)).abs() < 1e-6,
            "{got_y:?}"
        );
    }

    // An unnamed --output is the first output.
    let first = t.path("first.npy");
    success(&primjit(&[
        "run",
        s(&t.ir),
        "--input",
        &format!("x={}", t.input.display()),
        "--params",
        s(&t.params),
        "--output",
        s(&first),
    ]));
    assert_eq!(read_npy(&first).1, got_y);
}

// ---- run: error paths ----

/// Runs the tiny graph with `extra` arguments after the IR file.
fn run_tiny(t: &Tiny, extra: &[&str]) -> Output {
    let mut args = vec!["run", s(&t.ir)];
    args.extend_from_slice(extra);
    primjit(&args)
}

#[test]
fn run_reports_a_parameter_missing_from_the_file() {
    let t = Tiny::new();
    let params = t.path("partial.safetensors");
    let mut tensors = tiny_params();
    tensors.retain(|(n, _)| *n != "bn.running_var");
    write_safetensors(&params, &tensors);
    let out = t.path("y.npy");
    failure(
        &run_tiny(
            &t,
            &[
                "--input",
                s(&t.input),
                "--params",
                s(&params),
                "--output",
                s(&out),
            ],
        ),
        1,
        &[
            "error: ",
            "@bn.running_var",
            "missing",
            "[2]",
            "partial.safetensors",
        ],
    );
    assert!(!out.exists());
}

#[test]
fn run_reports_a_parameter_of_the_wrong_shape() {
    let t = Tiny::new();
    let params = t.path("wrong.safetensors");
    let mut tensors = tiny_params();
    tensors[0] = ("w", StTensor::f32(&[2, 1, 3, 3], &[0.0; 18]));
    write_safetensors(&params, &tensors);
    failure(
        &run_tiny(
            &t,
            &[
                "--input",
                s(&t.input),
                "--params",
                s(&params),
                "--output",
                s(&t.path("y.npy")),
            ],
        ),
        1,
        &["@w", "[2, 1, 3, 3]", "[2, 1, 1, 1]"],
    );
}

#[test]
fn run_reports_a_parameter_of_the_wrong_dtype() {
    let t = Tiny::new();
    let params = t.path("f64.safetensors");
    let mut tensors = tiny_params();
    tensors[1] = ("bn.weight", StTensor::f64(&[2], &[1.0, 2.0]));
    write_safetensors(&params, &tensors);
    failure(
        &run_tiny(
            &t,
            &[
                "--input",
                s(&t.input),
                "--params",
                s(&params),
                "--output",
                s(&t.path("y.npy")),
            ],
        ),
        1,
        &["@bn.weight", "F64", "F32"],
    );
}

#[test]
fn run_reports_an_input_of_the_wrong_shape() {
    let t = Tiny::new();
    let input = t.path("x3.npy");
    write_npy_f32(&input, &[1, 3, 2, 2], &[0.0; 12]);
    failure(
        &run_tiny(
            &t,
            &[
                "--input",
                s(&input),
                "--params",
                s(&t.params),
                "--output",
                s(&t.path("y.npy")),
            ],
        ),
        1,
        &[
            &format!("{}:2:", t.ir.display()),
            "%x",
            "[1, 3, 2, 2]",
            "[1, 1, 2, W]",
        ],
    );
    // The trunk's input height is fixed at 320.
    let small = t.path("small.npy");
    write_npy_f32(&small, &[1, 3, 32, 8], &vec![0.0; 3 * 32 * 8]);
    failure(
        &primjit(&[
            "run",
            TRUNK,
            "--input",
            s(&small),
            "--random-params",
            "1",
            "--output",
            s(&t.path("y.npy")),
        ]),
        1,
        &["%x", "[1, 3, 32, 8]", "[1, 3, 320, W]"],
    );
}

#[test]
fn run_reports_an_input_of_the_wrong_dtype() {
    let t = Tiny::new();
    let input = t.path("x64.npy");
    write_npy_f64(&input, &[1, 1, 2, 3], &[0.0; 6]);
    failure(
        &run_tiny(
            &t,
            &[
                "--input",
                s(&input),
                "--params",
                s(&t.params),
                "--output",
                s(&t.path("y.npy")),
            ],
        ),
        1,
        &["input %x", "x64.npy", "f8", "only f32"],
    );
}

#[test]
fn run_reports_missing_files() {
    let t = Tiny::new();
    let y = t.path("y.npy");
    failure(
        &run_tiny(
            &t,
            &[
                "--input",
                "/nonexistent/x.npy",
                "--params",
                s(&t.params),
                "--output",
                s(&y),
            ],
        ),
        1,
        &["error: input %x: cannot open `/nonexistent/x.npy`"],
    );
    failure(
        &run_tiny(
            &t,
            &[
                "--input",
                s(&t.input),
                "--params",
                "/nonexistent/p.safetensors",
                "--output",
                s(&y),
            ],
        ),
        1,
        &["error: cannot read `/nonexistent/p.safetensors`"],
    );
    failure(
        &primjit(&[
            "run",
            "/nonexistent/g.ir",
            "--random-input",
            "1",
            "--random-params",
            "1",
            "--output",
            s(&y),
        ]),
        1,
        &["error: cannot read `/nonexistent/g.ir`"],
    );
    // Not a safetensors file.
    failure(
        &run_tiny(
            &t,
            &[
                "--input",
                s(&t.input),
                "--params",
                s(&t.input),
                "--output",
                s(&y),
            ],
        ),
        1,
        &["is not a safetensors file"],
    );
    // An output in a directory that does not exist.
    failure(
        &run_tiny(
            &t,
            &[
                "--input",
                s(&t.input),
                "--params",
                s(&t.params),
                "--output",
                "/nonexistent/y.npy",
            ],
        ),
        1,
        &["output `y`", "cannot write `/nonexistent/y.npy`"],
    );
}

#[test]
fn run_needs_exactly_one_parameter_source() {
    let t = Tiny::new();
    let y = t.path("y.npy");
    failure(
        &run_tiny(
            &t,
            &[
                "--input",
                s(&t.input),
                "--params",
                s(&t.params),
                "--random-params",
                "1",
                "--output",
                s(&y),
            ],
        ),
        2,
        &["--params", "cannot be used with", "--random-params"],
    );
    failure(
        &run_tiny(&t, &["--input", s(&t.input), "--output", s(&y)]),
        2,
        &["required", "--params", "--random-params"],
    );
}

#[test]
fn run_checks_input_and_output_names() {
    let t = Tiny::new();
    let y = t.path("y.npy");
    failure(
        &run_tiny(
            &t,
            &[
                "--input",
                &format!("z={}", t.input.display()),
                "--random-params",
                "1",
                "--output",
                s(&y),
            ],
        ),
        1,
        &["the graph has no input %z", "%x"],
    );
    failure(
        &run_tiny(
            &t,
            &[
                "--input",
                s(&t.input),
                "--random-params",
                "1",
                "--output",
                &format!("logits={}", y.display()),
            ],
        ),
        1,
        &["the graph has no output logits", "y, pre"],
    );
    failure(
        &run_tiny(
            &t,
            &[
                "--input",
                s(&t.input),
                "--input",
                &format!("x={}", t.input.display()),
                "--random-params",
                "1",
                "--output",
                s(&y),
            ],
        ),
        1,
        &["input %x is given twice"],
    );
    failure(
        &run_tiny(&t, &["--random-params", "1", "--output", s(&y)]),
        1,
        &["--input", "--random-input", "%x"],
    );
    failure(
        &run_tiny(&t, &["--input", s(&t.input), "--random-params", "1"]),
        2,
        &["--output"],
    );
    failure(
        &run_tiny(
            &t,
            &[
                "--input",
                s(&t.input),
                "--random-input",
                "3",
                "--random-params",
                "1",
                "--output",
                s(&y),
            ],
        ),
        2,
        &["cannot be used with"],
    );
}
