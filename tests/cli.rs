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

/// Every malformed file of `ir/bad` is reported by `check` at its file, line and column, with
/// the message its first line (`# error: LINE:COL: MESSAGE`) expects, then the line and a caret.
#[test]
fn check_names_the_file_line_and_column_of_every_bad_file() {
    let bad = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ir/bad");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&bad)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "ir"))
        .collect();
    files.sort();
    assert!(files.len() >= 25, "expected the bad files, found {files:?}");
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap();
        let expected = text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("# error: "))
            .unwrap_or_else(|| panic!("{}: no `# error:` line", path.display()));
        let (line, rest) = expected.split_once(':').unwrap();
        let (col, message) = rest.split_once(": ").unwrap();
        let mut args = vec!["check", s(path)];
        let dims = text.lines().find_map(|l| l.strip_prefix("# dims: "));
        if let Some(dims) = dims {
            args.extend(["--dims", dims]);
        }
        let first = format!("{}:{line}:{col}: error: {message}", path.display());
        let err = failure(&primjit(&args), 1, &[&first]);
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines[0], first, "{err}");
        let source_line = text
            .lines()
            .nth(line.parse::<usize>().unwrap() - 1)
            .unwrap();
        assert_eq!(lines[1], source_line, "{err}");
        assert_eq!(
            lines[2].len(),
            col.parse::<usize>().unwrap(),
            "caret: {err}"
        );
    }
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
    // The stem's max pool is fused into conv1, whose value the first block now reads.
    assert!(
        out.contains("post=[relu, maxpool(kernel=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])]"),
        "{out}"
    );
    assert!(!out.contains("maxpool2d("), "{out}");
    assert!(out.contains("post=[add(%conv1), relu]"), "{out}");
    let last = out.lines().last().unwrap();
    assert!(last.starts_with("# passes: 29 batchnorms folded"), "{last}");
    assert!(
        last.contains("27 relus") && last.contains("13 adds") && last.contains("1 max pools"),
        "{last}"
    );

    let with_shapes = success(&primjit(&[
        "dump", TRUNK, "--stage", "folded", "--dims", "W=1031",
    ]));
    assert!(
        with_shapes.contains("pads=[1, 1, 1, 1])])  # [1, 64, 80, 258]"),
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

    // Unnamed --input for the graph's only input, a named --output and the same seed give the
    // same values, bit for bit: the JIT engine is deterministic (every output element is
    // computed by one thread in a fixed order). The reference interpreter accumulates in f64
    // and agrees only within a tolerance: see `run_trunk_jit_agrees_with_the_reference`.
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
    ]));
    assert_eq!(read_npy(&again), (shape.clone(), values.clone()));

    // The workspace budget changes what is kept between runs, never the values.
    for budget in ["0", "unlimited"] {
        success(&primjit(&[
            "run",
            TRUNK,
            "--input",
            s(&input),
            "--output",
            s(&again),
            "--random-params",
            "7",
            "--workspace-budget",
            budget,
        ]));
        assert_eq!(
            read_npy(&again),
            (shape.clone(), values.clone()),
            "{budget}"
        );
    }
    failure(
        &primjit(&[
            "run",
            TRUNK,
            "--input",
            s(&input),
            "--output",
            s(&again),
            "--random-params",
            "7",
            "--workspace-budget",
            "16MB",
        ]),
        2,
        &["--workspace-budget", "unknown unit `MB`"],
    );
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
        1,
        &["the graph has parameters: give --params FILE.safetensors or --random-params SEED"],
    );
}

#[test]
fn run_needs_no_parameter_source_for_a_graph_without_parameters() {
    let dir = temp_dir();
    let ir = write(
        dir.path(),
        "pool.ir",
        "graph pool {\n  input %x: f32[1, 1, 2, 3]\n  %p = maxpool2d(%x, kernel=[2, 2])\n  output y = %p\n}\n",
    );
    let x = dir.path().join("x.npy");
    write_npy_f32(&x, &[1, 1, 2, 3], &[1.0, 5.0, 2.0, 4.0, 3.0, 6.0]);
    let y = dir.path().join("y.npy");
    success(&primjit(&[
        "run",
        s(&ir),
        "--input",
        s(&x),
        "--output",
        s(&y),
    ]));
    assert_eq!(read_npy(&y), (vec![1, 1, 1, 2], vec![5.0, 6.0]));
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

// ---- dump: the per-node stages ----

/// The lines of a per-node dump that open a node: `%name: key`.
fn node_lines(out: &str) -> Vec<&str> {
    out.lines().filter(|l| l.starts_with('%')).collect()
}

#[test]
fn dump_plan_shows_tiles_and_border_runs_of_every_node() {
    let out = success(&primjit(&[
        "dump",
        TRUNK,
        "--stage",
        "plan",
        "--dims",
        "W=37",
        "--conv-algo",
        "direct",
    ]));
    let nodes = node_lines(&out);
    // After folding and fusion: 29 convolutions, the max pool fused into the first.
    assert_eq!(nodes.len(), 29, "{out}");
    assert!(
        nodes[0].starts_with("%conv1: conv mb1ic3ih320iw37oc64")
            && nodes[0].contains("+pool_max oh80ow10kh3kw3sh2sw2ph1pw1"),
        "{out}"
    );
    assert!(out.contains("fused max pool: per pooled row"), "{out}");
    assert!(out.contains("pool stage:"), "{out}");
    assert!(
        nodes[1].starts_with("%layer1.0.conv1: conv mb1ic64"),
        "{out}"
    );
    assert!(out.contains("conv tile"), "{out}");
    assert!(out.contains("row runs"), "{out}");
    assert!(out.contains("column runs"), "{out}");

    // --node restricts the dump to that node; a leading `%` is accepted.
    for node in ["layer1.0.conv1", "%layer1.0.conv1"] {
        let one = success(&primjit(&[
            "dump",
            TRUNK,
            "--stage",
            "plan",
            "--dims",
            "W=37",
            "--node",
            node,
            "--conv-algo",
            "direct",
        ]));
        let nodes = node_lines(&one);
        assert_eq!(nodes.len(), 1, "{one}");
        assert!(
            nodes[0].starts_with("%layer1.0.conv1: conv mb1ic64"),
            "{one}"
        );
        assert!(one.starts_with(nodes[0]), "{one}");
        assert!(
            one.contains("conv tile") && one.contains("row runs"),
            "{one}"
        );
        // The plan of this node is the one the full dump shows.
        let start = out.find("%layer1.0.conv1:").unwrap();
        assert!(
            out[start..].starts_with(one.trim_end()),
            "{one}\n---\n{out}"
        );
    }
}

#[test]
fn dump_asm_and_clif_of_one_node() {
    let asm = success(&primjit(&[
        "dump",
        TRUNK,
        "--stage",
        "asm",
        "--dims",
        "W=37",
        "--node",
        "layer1.0.conv1",
    ]));
    assert_eq!(node_lines(&asm).len(), 1, "{asm}");
    assert!(asm.starts_with("%layer1.0.conv1: conv mb1ic64"), "{asm}");
    // An FMA with avx+fma, a multiply and an add without.
    assert!(asm.contains("vfmadd") || asm.contains("mulps"), "{asm}");
    assert!(
        asm.lines().any(|l| l.trim_start().starts_with("ret")),
        "{asm}"
    );
    assert!(asm.contains(" bytes of code"), "{asm}");

    let clif = success(&primjit(&[
        "dump",
        TRUNK,
        "--stage",
        "clif",
        "--dims",
        "W=37",
        "--node",
        "layer1.0.conv1",
    ]));
    assert_eq!(node_lines(&clif).len(), 1, "{clif}");
    assert!(clif.starts_with("%layer1.0.conv1: conv mb1ic64"), "{clif}");
    assert!(clif.contains("function"), "{clif}");
    assert!(
        !clif.contains("vfmadd"),
        "Cranelift IR, not machine code:\n{clif}"
    );
}

#[test]
fn dump_memory_lists_every_primitive_and_totals() {
    let out = success(&primjit(&[
        "dump", TRUNK, "--stage", "memory", "--dims", "W=37",
    ]));
    let header = out.lines().next().unwrap();
    for column in ["node", "code", "mapped", "heap", "total", "compile", "key"] {
        assert!(header.contains(column), "{header}");
    }
    let rows: Vec<&str> = out.lines().filter(|l| l.starts_with('%')).collect();
    assert_eq!(rows.len(), 29, "{out}");
    // Every row's total is its mapped pages plus its heap, and code fits in the pages.
    for row in &rows {
        let f: Vec<&str> = row.split_whitespace().collect();
        let n = |i: usize| -> usize { f[i].parse().unwrap_or_else(|_| panic!("{row}")) };
        let (code, mapped, heap, total) = (n(1), n(2), n(3), n(4));
        assert!(code > 0 && code <= mapped, "{row}");
        assert_eq!(mapped % 4096, 0, "{row}");
        assert_eq!(total, mapped + heap, "{row}");
        assert!(f[5].ends_with("ms"), "{row}");
    }
    let mut tail = out.lines().rev();
    let weights = tail.next().unwrap();
    let totals = tail.next().unwrap();
    // auto: Winograd for the 3x3 layers, direct for conv1 and the downsamples.
    assert!(
        weights.starts_with("# weights (auto convolutions): ")
            && weights.contains("bytes packed for direct kernels")
            && weights.ends_with("bytes winograd-transformed"),
        "{weights}"
    );
    assert!(totals.starts_with("# 29 nodes, "), "{totals}");
    assert!(totals.contains("distinct primitives"), "{totals}");
    let distinct: usize = totals
        .trim_start_matches("# 29 nodes, ")
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    // layer1.1.conv1 has layer1.0.conv1's key, and so on: fewer primitives than nodes.
    assert!((2..29).contains(&distinct), "{totals}");

    let one = success(&primjit(&[
        "dump", TRUNK, "--stage", "memory", "--dims", "W=37", "--node", "conv1",
    ]));
    let rows: Vec<&str> = one.lines().filter(|l| l.starts_with('%')).collect();
    assert_eq!(rows.len(), 1, "{one}");
    assert!(rows[0].starts_with("%conv1 "), "{one}");
    assert!(
        one.lines()
            .rev()
            .nth(1)
            .unwrap()
            .starts_with("# 1 nodes, 1 distinct primitives"),
        "{one}"
    );
}

/// The algorithm is part of the key, `dump --stage plan` says which and why, and the weights
/// line counts Winograd's transformed weights: 36 floats per channel pair.
#[test]
fn dump_shows_the_convolution_algorithm_and_why() {
    let plan = |algo: &str| {
        success(&primjit(&[
            "dump",
            TRUNK,
            "--stage",
            "plan",
            "--dims",
            "W=37",
            "--node",
            "layer1.0.conv2",
            "--conv-algo",
            algo,
        ]))
    };
    let wino = plan("winograd");
    assert!(
        wino.lines().next().unwrap().contains(" alg:wino_f4x3 "),
        "{wino}"
    );
    assert!(
        wino.contains("algorithm: wino_f4x3 (winograd requested, and it applies)"),
        "{wino}"
    );
    assert!(
        wino.contains("6x6 input tiles with stride 4, 1 x 20 x 3 tiles"),
        "{wino}"
    );
    let direct = plan("direct");
    assert!(!direct.contains("alg:"), "{direct}");
    assert!(
        direct.contains("algorithm: direct (direct requested)"),
        "{direct}"
    );
    let auto = plan("auto");
    assert!(
        auto.contains("algorithm: wino_f4x3 (auto: winograd applies"),
        "{auto}"
    );
    // conv1 (7x7, stride 2) cannot take Winograd, whatever the choice.
    let stem = success(&primjit(&[
        "dump",
        TRUNK,
        "--stage",
        "plan",
        "--dims",
        "W=37",
        "--node",
        "conv1",
        "--conv-algo",
        "winograd",
    ]));
    assert!(
        stem.contains("algorithm: direct (winograd F(4x4, 3x3) needs a 3x3 kernel)"),
        "{stem}"
    );

    let weights = |algo: &str| -> (u64, u64) {
        let out = success(&primjit(&[
            "dump",
            TRUNK,
            "--stage",
            "memory",
            "--dims",
            "W=37",
            "--node",
            "layer1.0.conv2",
            "--conv-algo",
            algo,
        ]));
        let line = out.lines().last().unwrap();
        let numbers: Vec<u64> = line
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        (numbers[0], numbers[1])
    };
    // 64 x 64 channel pairs and a bias of 64: 9 floats a pair direct, 36 Winograd.
    assert_eq!(weights("direct"), ((64 * 64 * 9 + 64) * 4, 0));
    assert_eq!(weights("winograd"), (0, (64 * 64 * 36 + 64) * 4));
}

/// `--conv-algo` and `PRIMJIT_CONV_ALGO` are parsed strictly.
#[test]
fn conv_algo_is_parsed_strictly() {
    failure(
        &primjit(&[
            "dump",
            TRUNK,
            "--stage",
            "plan",
            "--dims",
            "W=37",
            "--conv-algo",
            "fast",
        ]),
        2,
        &["unknown convolution algorithm `fast`: expected direct, winograd or auto"],
    );
    let plan_with = |value: &str| {
        Command::new(env!("CARGO_BIN_EXE_primjit"))
            .args(["dump", TRUNK, "--stage", "plan", "--dims", "W=37"])
            .args(["--node", "layer1.0.conv2"])
            .env("PRIMJIT_CONV_ALGO", value)
            .output()
            .unwrap()
    };
    failure(
        &plan_with("wino"),
        1,
        &["PRIMJIT_CONV_ALGO=wino: expected direct, winograd or auto"],
    );
    assert!(success(&plan_with("direct")).contains("algorithm: direct (direct requested)"));
}

#[test]
fn dump_per_node_stages_report_unknown_nodes_and_unbound_symbols() {
    for stage in ["plan", "clif", "asm", "memory"] {
        let err = failure(
            &primjit(&[
                "dump", TRUNK, "--stage", stage, "--dims", "W=37", "--node", "nope",
            ]),
            1,
            &["error: ", "%nope"],
        );
        // The message lists the nodes there are.
        assert!(err.contains("layer1.0.conv1"), "{err}");
        let err = failure(
            &primjit(&["dump", TRUNK, "--stage", stage]),
            1,
            &["error: ", "--dims"],
        );
        assert!(
            err.split(|c: char| !c.is_alphanumeric()).any(|w| w == "W"),
            "the message names the unbound symbol: {err}"
        );
    }
    // A node folded away by the passes is no longer there.
    failure(
        &primjit(&[
            "dump",
            TRUNK,
            "--stage",
            "plan",
            "--dims",
            "W=37",
            "--node",
            "layer1.0.bn1",
        ]),
        1,
        &["%layer1.0.bn1", "folding"],
    );
}

// ---- run: JIT against the reference ----

/// The trunk with each convolution algorithm against the reference interpreter.
#[test]
fn run_trunk_jit_agrees_with_the_reference() {
    let dir = temp_dir();
    let reference = dir.path().join("ref.npy");
    let common = [
        "--dims",
        "W=37",
        "--random-input",
        "3",
        "--random-params",
        "5",
    ];
    let mut args = vec![
        "run",
        TRUNK,
        "--reference",
        "--output",
        // The output by name this time.
        &format!("out={}", reference.display()),
    ]
    .into_iter()
    .map(str::to_string)
    .collect::<Vec<_>>();
    args.extend(common.iter().map(|a| a.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    success(&primjit(&args));
    let (ref_shape, want) = read_npy(&reference);
    let max_ref = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    assert!(
        max_ref > 0.1,
        "a degenerate output proves nothing: {max_ref}"
    );

    for algo in ["direct", "winograd", "auto"] {
        let jit = dir.path().join(format!("{algo}.npy"));
        let mut args = vec!["run", TRUNK, "--output", s(&jit), "--conv-algo", algo];
        args.extend_from_slice(&common);
        let out = success(&primjit(&args));
        assert!(out.contains("out: [1, 256, 20, 3]"), "{out}");
        let (shape, got) = read_npy(&jit);
        assert_eq!(shape, [1, 256, 20, 3]);
        assert_eq!(shape, ref_shape);
        assert!(got.iter().all(|v| v.is_finite()));
        let max_diff = got
            .iter()
            .zip(&want)
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        // The reference accumulates in f64, the kernels in f32 (with FMA where the host has
        // it). A sum of n terms in f32 is off by at most ~n * 2^-24 relative to the sum of
        // magnitudes; the longest reductions here have 256 * 3 * 3 = 2304 terms, and the
        // error of each of the 29 convolutions propagates through the ones after it (residual
        // adds keep activations of the order of 1, batch-norm folding keeps the weights at
        // unit gain). Errors of random sign grow like sqrt(n) rather than n in practice: about
        // 1e-6 relative per layer, a few 1e-6 after the trunk (3.5e-6 observed for direct,
        // docs/decisions/005-winograd-f4x4-3x3.md gives Winograd's, about twice that). 1e-4 of the
        // output's magnitude leaves a margin of over 10x while still catching a wrong tap, a
        // missed bias or a lost residual, which are off by 1e-2 or more.
        let tolerance = 1e-4 * max_ref.max(1.0);
        assert!(
            max_diff <= tolerance,
            "{algo}: JIT and reference differ by {max_diff} (tolerance {tolerance}, max |ref| \
             {max_ref})"
        );
    }
}

// ---- bench and sweep ----

/// A small model for the benchmark verbs: a 3x3 conv with bias (relu fused into it) and a
/// 2x2 average pool (two primitives: only max pools fuse), on a 16-row input of symbolic
/// width.
const SMALL: &str = "graph small {
  input %x: f32[1, 3, 16, W]
  param @w: f32[8, 3, 3, 3]
  param @b: f32[8]
  %c = conv2d(%x, @w, bias=@b, pads=[1, 1, 1, 1])
  %r = relu(%c)
  %p = avgpool2d(%r, kernel=[2, 2], strides=[2, 2])
  output y = %p
}
";

/// A temp dir holding the small model and a widths file of 32, 40 and 33.
struct BenchFiles {
    dir: tempfile::TempDir,
    model: PathBuf,
    widths: PathBuf,
}

impl BenchFiles {
    fn new() -> Self {
        let dir = temp_dir();
        let model = write(dir.path(), "small.ir", SMALL);
        let widths = write(
            dir.path(),
            "widths.txt",
            "# three tiny widths\n32\n40\n\n33\n",
        );
        BenchFiles { dir, model, widths }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}:\n{text}"))
}

/// Checks the parts of a `bench` JSON report that do not depend on timing.
#[track_caller]
fn check_report(json: &serde_json::Value, widths: &[u64], run_widths: &[u64]) {
    assert_eq!(json["calls"], widths.len() as u64, "{json}");
    let per_call = json["per_call"].as_array().expect("per_call is an array");
    assert_eq!(per_call.len(), widths.len(), "{json}");
    for (i, call) in per_call.iter().enumerate() {
        assert_eq!(call["call"], i as u64 + 1, "{call}");
        assert_eq!(call["width"], widths[i], "{call}");
        assert_eq!(call["run_width"], run_widths[i], "{call}");
        assert!(call["seconds"].as_f64().unwrap() >= 0.0, "{call}");
        assert!(call["rss_kb"].as_u64().unwrap() > 0, "{call}");
    }
    for field in ["time_mean_s", "time_p50_s", "time_p95_s", "compile_time_s"] {
        assert!(json[field].as_f64().is_some(), "{field}: {json}");
    }
    assert_eq!(json["threads"], 1, "{json}");
    assert_eq!(json["failed_compiles"], 0, "{json}");
    assert_eq!(json["compiles"], json["misses"], "{json}");
    assert!(json["growth_every_100"].as_array().unwrap().is_empty());
}

#[test]
fn bench_small_model_prints_summary_and_writes_json() {
    let f = BenchFiles::new();
    let json_path = f.path("report.json");
    let out = success(&primjit(&[
        "bench",
        s(&f.model),
        "--widths",
        s(&f.widths),
        "--n",
        "3",
        "--quiet",
        "--json",
        s(&json_path),
        "--threads",
        "1",
        "--policy",
        "exact",
    ]));
    assert!(out.contains("time: mean="), "{out}");
    assert!(out.contains("memory (kb):"), "{out}");
    assert!(out.contains("policy=exact"), "{out}");
    assert!(!out.contains("bucket error"), "{out}");
    let json = read_json(&json_path);
    check_report(&json, &[32, 40, 33], &[32, 40, 33]);
    assert_eq!(json["policy"], "exact");
    assert_eq!(json["model"], s(&f.model));
    assert!(json["bucket_error"].is_null(), "{json}");
    // Two primitives per width (the conv with its relu, the pool), three distinct widths,
    // and the default 64 MiB budget keeps them all. The untimed warm-up call at the first
    // width compiles that width's two, which the first timed call finds.
    assert!(
        out.contains("warm-up: 1 call at W=32 in ") && out.contains("(2 compiles), not timed"),
        "{out}"
    );
    assert_eq!(json["warm_up_calls"], 1, "{json}");
    assert!(json["warm_up_s"].as_f64().unwrap() > 0.0, "{json}");
    assert_eq!(json["compiles"], 6, "{json}");
    assert_eq!(json["hits"], 2, "{json}");
    assert_eq!(json["evictions"], 0, "{json}");
    assert_eq!(json["cache_entries"], 6, "{json}");
    let compiles: Vec<u64> = json["per_call"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["compiles"].as_u64().unwrap())
        .collect();
    assert_eq!(compiles, [2, 4, 6]);

    // `--warm-up 0` times the first call cold: it compiles, and nothing hits.
    let cold_path = f.path("cold.json");
    let out = success(&primjit(&[
        "bench",
        s(&f.model),
        "--widths",
        s(&f.widths),
        "--n",
        "3",
        "--quiet",
        "--json",
        s(&cold_path),
        "--threads",
        "1",
        "--warm-up",
        "0",
        "--policy",
        "exact",
    ]));
    assert!(!out.contains("warm-up"), "{out}");
    let json = read_json(&cold_path);
    check_report(&json, &[32, 40, 33], &[32, 40, 33]);
    assert_eq!(
        (json["warm_up_calls"].as_u64(), json["warm_up_s"].as_f64()),
        (Some(0), Some(0.0))
    );
    assert_eq!(
        (json["compiles"].as_u64(), json["hits"].as_u64()),
        (Some(6), Some(0))
    );
}

/// Without `--policy`, `bench` runs `dynamic` and closes with the figures to set beside a
/// peer's; the command that runs onnxruntime on the same calls is printed only for a model the
/// peers' harness can take (the shipped trunk, or an ONNX file with its `1x3x320xW` input).
#[test]
fn bench_defaults_to_dynamic_and_closes_with_the_figures_to_compare() {
    let f = BenchFiles::new();
    let json_path = f.path("default.json");
    let out = success(&primjit(&[
        "bench",
        s(&f.model),
        "--widths",
        s(&f.widths),
        "--n",
        "3",
        "--quiet",
        "--json",
        s(&json_path),
        "--threads",
        "1",
    ]));
    assert!(out.contains("policy=dynamic"), "{out}");
    let json = read_json(&json_path);
    assert_eq!(json["policy"], "dynamic", "{json}");
    assert_eq!(json["compiles"], 2, "{json}");
    let tail: Vec<&str> = out
        .lines()
        .skip_while(|l| !l.starts_with("summary:"))
        .collect();
    assert_eq!(
        tail.first(),
        Some(&"summary: policy dynamic, 1 thread, 3 calls"),
        "{out}"
    );
    let latency = format!(
        "  latency: mean {:.3} s, p50 {:.3} s",
        json["time_mean_s"].as_f64().unwrap(),
        json["time_p50_s"].as_f64().unwrap()
    );
    assert_eq!(tail.get(1), Some(&latency.as_str()), "{out}");
    assert_eq!(tail.get(2), Some(&"  primitives compiled: 2"), "{out}");
    let memory = tail.get(3).expect("a memory line");
    assert!(
        memory.starts_with("  memory: RSS growth ")
            && memory.contains(" kb (after the warm-up), VmHWM "),
        "{out}"
    );
    // The small model's input is 1x3x16xW: no peer runs it.
    assert_eq!(tail.len(), 4, "{out}");
    assert!(!out.contains("compare:"), "{out}");

    // The shipped trunk: the peer's command, with this run's threads, calls and widths.
    let out = success(&primjit(&[
        "bench",
        "--widths",
        s(&f.widths),
        "--n",
        "1",
        "--quiet",
        "--threads",
        "1",
        "--check-calls",
        "0",
    ]));
    let compare = format!(
        "compare: python3 ../shared/peers/bench_peer.py --engine ort --threads 1 --n 1 \
         --model trunk.onnx --widths {}\n",
        f.widths.display()
    );
    assert!(out.contains(&compare), "{out}");
    assert!(out.contains("onnx_trunk.py --out trunk.onnx"), "{out}");
}

#[test]
fn bench_reports_the_workspace_and_returns_every_buffer_with_budget_zero() {
    let f = BenchFiles::new();
    for (budget, kept) in [("0", false), ("unlimited", true)] {
        let json_path = f.path(&format!("ws{budget}.json"));
        let out = success(&primjit(&[
            "bench",
            s(&f.model),
            "--widths",
            s(&f.widths),
            "--n",
            "3",
            "--quiet",
            "--json",
            s(&json_path),
            "--threads",
            "1",
            "--workspace-budget",
            budget,
        ]));
        assert!(out.contains(&format!("workspace_budget={budget}")), "{out}");
        assert!(
            out.contains(&format!("workspace (budget {budget}): ")),
            "{out}"
        );
        assert!(out.contains("VmHWM (kb): "), "{out}");
        let json = read_json(&json_path);
        assert_eq!(json["workspace_budget"], budget, "{json}");
        let peak = json["workspace_peak_bytes"].as_u64().unwrap();
        assert!(
            peak >= json["peak_activation_bytes"].as_u64().unwrap(),
            "{json}"
        );
        assert!(json["vmhwm_kb"].as_u64().unwrap() > 0, "{json}");
        let now: Vec<u64> = json["per_call"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["workspace_bytes"].as_u64().unwrap())
            .collect();
        if kept {
            assert_eq!(json["workspace_bytes"], peak, "{json}");
            assert!(now.iter().all(|&b| b > 0), "{json}");
        } else {
            assert_eq!(json["workspace_bytes"], 0, "{json}");
            assert_eq!(now, [0, 0, 0], "{json}");
            assert!(
                json["workspace_returned_bytes"].as_u64().unwrap() >= peak,
                "{json}"
            );
        }
    }
}

#[test]
fn bench_dynamic_policy_compiles_one_primitive_per_node_for_every_width() {
    let f = BenchFiles::new();
    let json_path = f.path("dynamic.json");
    let out = success(&primjit(&[
        "bench",
        s(&f.model),
        "--widths",
        s(&f.widths),
        "--n",
        "3",
        "--quiet",
        "--json",
        s(&json_path),
        "--threads",
        "1",
        "--policy",
        "dynamic",
    ]));
    // conv (with relu fused) and the pool: two node configurations for three widths.
    assert!(
        out.contains("dynamic: 2 distinct node configurations, 2 primitives compiled"),
        "{out}"
    );
    let json = read_json(&json_path);
    check_report(&json, &[32, 40, 33], &[32, 40, 33]);
    assert_eq!(json["policy"], "dynamic");
    // The warm-up compiles both; every timed call hits them.
    assert_eq!(json["compiles"], 2, "{json}");
    assert_eq!(json["hits"], 6, "{json}");
    assert_eq!(json["node_configurations"], 2, "{json}");
    // The runtime-width kernels tile like the exact ones: equal to the last bit.
    let e = &json["bucket_error"];
    assert_eq!(e["calls_checked"], 2, "{json}");
    assert_eq!(e["max_abs"].as_f64(), Some(0.0), "{json}");
}

#[test]
fn bench_pads_narrow_calls_when_the_widest_needs_no_padding() {
    // 320 is its own bucket; 33 pads to 320 (the workload's widest, 7680, is a multiple of 320
    // too, and the harness once kept no padded buffer then).
    let f = BenchFiles::new();
    let widths = write(f.dir.path(), "bucket.txt", "33\n320\n33\n");
    for policy in ["bucket320", "bucketflex"] {
        let out = success(&primjit(&[
            "bench",
            s(&f.model),
            "--widths",
            s(&widths),
            "--n",
            "3",
            "--quiet",
            "--threads",
            "1",
            "--policy",
            policy,
        ]));
        assert!(out.contains(&format!("policy={policy}")), "{out}");
    }
}

#[test]
fn bench_refuses_sizes_beyond_the_ir_before_allocating_them() {
    let f = BenchFiles::new();
    // A width whose input would take terabytes: refused when the call's shapes are bound.
    let widths = write(f.dir.path(), "huge.txt", "33\n99999999999\n");
    failure(
        &primjit(&[
            "bench",
            s(&f.model),
            "--widths",
            s(&widths),
            "--n",
            "2",
            "--quiet",
        ]),
        1,
        &["elements"],
    );
    // A parameter of 2^62 floats: the model is verified before its parameters are drawn.
    let model = write(
        f.dir.path(),
        "huge_param.ir",
        &SMALL.replace(
            "@w: f32[8, 3, 3, 3]",
            "@w: f32[8, 3, 3, 3]\n  param @big: f32[2147483648, 2147483648]",
        ),
    );
    failure(
        &primjit(&[
            "bench",
            s(&model),
            "--widths",
            s(&f.widths),
            "--n",
            "1",
            "--quiet",
        ]),
        1,
        &["@big", "elements"],
    );
}

#[test]
fn bench_names_the_check_calls_kernels_in_the_perf_map_too() {
    // The calls checked against exact shapes run on an engine of their own; it takes the
    // timed engine's settings, `PRIMJIT_PERF_MAP` among them, so that a profile of `bench`
    // names their kernels as well.
    let f = BenchFiles::new();
    let child = Command::new(env!("CARGO_BIN_EXE_primjit"))
        .args(["bench", s(&f.model), "--widths", s(&f.widths), "--n", "3"])
        .args(["--quiet", "--threads", "1", "--policy", "dynamic"])
        .env("PRIMJIT_PERF_MAP", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the primjit binary runs");
    let map = PathBuf::from(format!("/tmp/perf-{}.map", child.id()));
    let out = child.wait_with_output().unwrap();
    let text = std::fs::read_to_string(&map);
    let _ = std::fs::remove_file(&map);
    success(&out);
    let text = text.unwrap_or_else(|e| panic!("{}: {e}", map.display()));
    let keys: Vec<&str> = text
        .lines()
        .map(|l| l.splitn(3, ' ').nth(2).expect("START SIZE NAME"))
        .collect();
    // The timed run's runtime-width kernels, and the exact ones of the two checked widths.
    for key in [
        "primjit conv mb1ic3ih16iw*oc8oh16ow*",
        "primjit conv mb1ic3ih16iw32oc8oh16ow32",
        "primjit conv mb1ic3ih16iw40oc8oh16ow40",
    ] {
        assert!(
            keys.iter().any(|k| k.starts_with(key)),
            "{key} not in {keys:?}"
        );
    }
}

#[test]
fn dump_plan_refuses_a_key_the_kernels_cannot_take() {
    // Primitive keys stop at a stride of 2^29, and so does the IR's verification: a stride of
    // 2^30 is refused at its line before the plan stage, which checks keys as the stages that
    // compile do, plans anything.
    let dir = temp_dir();
    let model = write(
        dir.path(),
        "stride.ir",
        "graph g {
  input %x: f32[1, 3, 8, 8]
  param @w: f32[4, 3, 1, 1]
  %c = conv2d(%x, @w, strides=[1073741824, 1])
  output y = %c
}
",
    );
    failure(
        &primjit(&["dump", s(&model), "--stage", "plan"]),
        1,
        &[&format!(
            "{}:4:3: error: %c: strides must be at most 536870912, found [1073741824, 1]",
            model.display()
        )],
    );
}

/// `dump` shows the graph the library runs (`optimize_graph`, as `run` and the Python package
/// do): a max pool after a conv that takes Winograd stays a node of its own under `auto`, and
/// fuses into the conv under `--conv-algo direct` (decision 018). The 16x16 output is the
/// fewest Winograd tiles `auto` takes at stride 1 (decision 031).
#[test]
fn dump_keeps_a_pool_apart_after_a_winograd_conv() {
    let dir = temp_dir();
    let model = write(
        dir.path(),
        "pooled.ir",
        "graph g {
  input %x: f32[1, 3, 16, 16]
  param @w1: f32[16, 3, 1, 1]
  param @w3: f32[16, 16, 3, 3]
  %a = conv2d(%x, @w1)
  %b = conv2d(%a, @w3, pads=[1, 1, 1, 1], post=[relu])
  %p = maxpool2d(%b, kernel=[2, 2], strides=[2, 2])
  output y = %p
}
",
    );
    let plan = |algo: &str| {
        success(&primjit(&[
            "dump",
            s(&model),
            "--stage",
            "plan",
            "--conv-algo",
            algo,
        ]))
    };
    let auto = plan("auto");
    assert!(
        auto.contains("alg:wino_f4x3") && auto.contains("%p: pool"),
        "{auto}"
    );
    assert!(!auto.contains("+pool_max"), "{auto}");
    let direct = plan("direct");
    assert!(
        direct.contains("+pool_max") && !direct.contains("%p:"),
        "{direct}"
    );
}

#[test]
fn dump_dynamic_marks_runtime_fields_and_the_remainder_dispatch() {
    let f = BenchFiles::new();
    let out = success(&primjit(&[
        "dump",
        s(&f.model),
        "--dims",
        "W=37",
        "--stage",
        "plan",
        "--dynamic",
        "--max-isa",
        "x128",
    ]));
    assert!(
        out.contains(
            "%c: conv mb1ic3ih16iw*oc8oh16ow*kh3kw3sh1sw1ph1pw1 bias post=relu nchw>nChw4c"
        ),
        "{out}"
    );
    assert!(out.contains("runtime extents: w"), "{out}");
    assert!(out.contains("remainder 1..9 by jump table"), "{out}");
    assert!(
        out.contains("%p: pool_avg_np mb1ic8ih16iw*oh8ow*kh2kw2sh2sw2ph0pw0"),
        "{out}"
    );
}

#[test]
fn bench_op_runs_a_runtime_width_descriptor() {
    let out = success(&primjit(&[
        "bench-op",
        "mb1ic8ih6iw37*oc8kh3ph1",
        "--runs",
        "1",
        "--conv-algo",
        "direct",
        "--max-isa",
        "x128",
    ]));
    assert!(
        out.contains("conv mb1ic8ih6iw*oc8oh6ow*kh3kw3sh1sw1ph1pw1 bias nChw4c>nChw4c"),
        "{out}"
    );
    assert!(out.contains("runtime extents, run at ih=6 iw=37"), "{out}");
    assert!(
        out.contains("% of peak") && !out.contains("effective"),
        "{out}"
    );
}

/// A band call of a width-streamed run, alone: its rows at the window's pitches, and
/// alternated with dense rows.
#[test]
fn bench_op_runs_a_descriptor_at_row_pitches() {
    let out = success(&primjit(&[
        "bench-op",
        "mb1ic8ih6iw18*oc8oh6ow16kh3ph1pw0",
        "--pitch",
        "32,24",
        "--vs-pitch",
        "dense",
        "--runs",
        "3",
    ]));
    assert!(
        out.contains("runtime extents, run at ih=6 iw=18: conv mb1ic8ih6iw18oc8oh6ow16")
            && out.contains("pitch:src32,dst24"),
        "{out}"
    );
    assert!(
        out.contains("median ratio over 3 alternating pairs (vs / first)"),
        "{out}"
    );
    let vs = out.lines().find(|l| l.starts_with("vs conv")).expect(&out);
    assert!(!vs.contains("pitch:"), "{out}");

    // Rows wider than their pitch, a malformed pair, a zero pitch and a pool are refused.
    let err = failure(
        &primjit(&["bench-op", "mb1ic8ih6iw18oc8kh3ph1", "--pitch", "17,18"]),
        1,
        &["row pitch (17) is narrower than its rows (18)"],
    );
    assert!(err.contains("pitch:src17,dst18"), "{err}");
    failure(
        &primjit(&["bench-op", "mb1ic8ih6iw18oc8kh3ph1", "--vs-pitch", "18"]),
        2,
        &["expected `SRC,DST`"],
    );
    failure(
        &primjit(&["bench-op", "mb1ic8ih6iw18oc8kh3ph1", "--pitch", "0,18"]),
        2,
        &["`0` is not a row pitch"],
    );
    failure(
        &primjit(&[
            "bench-op",
            "mb1ic8ih6iw18oc8kh3ph1",
            "--pool",
            "--pitch",
            "32,32",
        ]),
        2,
        &["cannot be used with"],
    );
}

/// A Winograd primitive (`auto` picks it for 8 channels) reports its actual and its
/// direct-equivalent ("effective") rate.
#[test]
fn bench_op_reports_actual_and_effective_rates_for_winograd() {
    let out = success(&primjit(&[
        "bench-op",
        "mb1ic8ih6iw37*oc8kh3ph1",
        "--runs",
        "1",
        // The key's one-liner names its tier past x128, which depends on the host.
        "--max-isa",
        "x128",
    ]));
    assert!(
        out.contains(
            "conv mb1ic8ih6iw*oc8oh6ow*kh3kw3sh1sw1ph1pw1 bias alg:wino_f4x3 nChw4c>nChw4c"
        ),
        "{out}"
    );
    assert!(
        out.contains("GFLOP/s actual (") && out.contains("GFLOP/s effective ("),
        "{out}"
    );
}

#[test]
fn bench_bucket_policy_reports_its_error_against_exact() {
    let f = BenchFiles::new();
    let json_path = f.path("bucket.json");
    let out = success(&primjit(&[
        "bench",
        s(&f.model),
        "--widths",
        s(&f.widths),
        "--n",
        "3",
        "--quiet",
        "--json",
        s(&json_path),
        "--threads",
        "1",
        "--policy",
        "bucket320",
    ]));
    assert!(out.contains("bucket320 error vs exact"), "{out}");
    let json = read_json(&json_path);
    check_report(&json, &[32, 40, 33], &[320, 320, 320]);
    assert_eq!(json["policy"], "bucket320");
    // One padded width: two primitives, compiled by the warm-up and reused by every call.
    assert_eq!(json["compiles"], 2, "{json}");
    assert_eq!(json["hits"], 6, "{json}");
    let e = &json["bucket_error"];
    assert_eq!(e["calls_checked"], 2, "{json}");
    let (abs, rel) = (
        e["max_abs"].as_f64().unwrap(),
        e["max_rel"].as_f64().unwrap(),
    );
    // Zero columns to the right change no output of this model that the crop keeps.
    assert!((0.0..1e-5).contains(&abs), "{json}");
    assert!((0.0..1e-5).contains(&rel), "{json}");
}

#[test]
fn bench_default_trunk_on_three_tiny_widths() {
    let f = BenchFiles::new();
    let json_path = f.path("trunk.json");
    let out = success(&primjit(&[
        "bench",
        "--widths",
        s(&f.widths),
        "--n",
        "3",
        "--quiet",
        "--json",
        s(&json_path),
        "--threads",
        "1",
    ]));
    assert!(out.contains("model=ir/resnet34_trunk.ir"), "{out}");
    assert!(out.contains("time: mean="), "{out}");
    assert!(out.contains("memory (kb):"), "{out}");
    let json = read_json(&json_path);
    check_report(&json, &[32, 40, 33], &[32, 40, 33]);
    assert_eq!(json["model"], "ir/resnet34_trunk.ir");
    assert!(json["compiles"].as_u64().unwrap() > 0, "{json}");
    assert_eq!(json["evictions"], 0, "{json}");
    assert_eq!(json["cache_entries"], json["compiles"], "{json}");
    assert!(
        json["peak_activation_bytes"].as_u64().unwrap() > 0,
        "{json}"
    );
}

#[test]
fn bench_rejects_bad_widths_and_counts() {
    let f = BenchFiles::new();
    let bad = write(f.dir.path(), "bad.txt", "32\n40\nforty\n");
    failure(
        &primjit(&[
            "bench",
            s(&f.model),
            "--widths",
            s(&bad),
            "--n",
            "1",
            "--quiet",
        ]),
        1,
        &[&format!("{}:3:", bad.display()), "`forty`"],
    );
    let zero = write(f.dir.path(), "zero.txt", "32\n0\n");
    failure(
        &primjit(&[
            "bench",
            s(&f.model),
            "--widths",
            s(&zero),
            "--n",
            "1",
            "--quiet",
        ]),
        1,
        &[&format!("{}:2:", zero.display()), "positive width"],
    );
    failure(
        &primjit(&[
            "bench",
            s(&f.model),
            "--widths",
            "/nonexistent/widths.txt",
            "--quiet",
        ]),
        1,
        &["/nonexistent/widths.txt"],
    );
    for n in ["0", "4"] {
        failure(
            &primjit(&[
                "bench",
                s(&f.model),
                "--widths",
                s(&f.widths),
                "--n",
                n,
                "--quiet",
            ]),
            1,
            &["--n", "3 widths", &format!("found {n}")],
        );
    }
    // The benchmark varies the last dimension only.
    let fixed = write(
        f.dir.path(),
        "fixed.ir",
        &SMALL.replace("f32[1, 3, 16, W]", "f32[1, 3, 16, 16]"),
    );
    failure(
        &primjit(&[
            "bench",
            s(&fixed),
            "--widths",
            s(&f.widths),
            "--n",
            "1",
            "--quiet",
        ]),
        1,
        &["only W symbolic"],
    );
}

#[test]
fn sweep_configurations_run_what_their_labels_say_whatever_the_environment() {
    // A capacity and a budget in the environment reach no configuration that leaves them out.
    let f = BenchFiles::new();
    let out_dir = f.path("sweep_env");
    let out = Command::new(env!("CARGO_BIN_EXE_primjit"))
        .args(["sweep", "--n", "1", "--widths", s(&f.widths)])
        .args(["--config", "exact:unlimited", "--threads", "1"])
        .args(["--out-dir", s(&out_dir), s(&f.model)])
        .env("PRIMJIT_CACHE_CAPACITY", "1")
        .env("PRIMJIT_CACHE_BUDGET", "0")
        .output()
        .expect("the primjit binary runs");
    let out = success(&out);
    let row: Vec<&str> = out
        .lines()
        .skip_while(|l| !l.starts_with("policy"))
        .nth(1)
        .unwrap_or_else(|| panic!("no table row:\n{out}"))
        .split_whitespace()
        .collect();
    assert_eq!(row[..3], ["exact", "unlimited", "-"], "{out}");
}

#[test]
fn sweep_small_model_tabulates_and_plots() {
    let f = BenchFiles::new();
    let out_dir = f.path("sweep");
    let out = success(&primjit(&[
        "sweep",
        "--n",
        "2",
        "--widths",
        s(&f.widths),
        "--config",
        "exact:unlimited",
        "--config",
        "exact:0",
        "--config",
        "dynamic:::16MiB",
        "--threads",
        "1",
        "--out-dir",
        s(&out_dir),
        s(&f.model),
    ]));
    let lines: Vec<&str> = out.lines().collect();
    let header = lines
        .iter()
        .position(|l| l.starts_with("policy"))
        .unwrap_or_else(|| panic!("no table header:\n{out}"));
    assert!(lines[header].contains("hit rate"), "{out}");
    let rows: Vec<Vec<&str>> = lines[header + 1..]
        .iter()
        .take_while(|l| !l.starts_with("figures:"))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 3, "{out}");
    let default_workspace = primjit::WorkspaceConfig::DEFAULT_BUDGET.to_string();
    assert_eq!(
        rows[0][..4],
        ["exact", "unlimited", "-", default_workspace.as_str()],
        "{out}"
    );
    assert_eq!(
        rows[1][..4],
        ["exact", "0", "-", default_workspace.as_str()],
        "{out}"
    );
    assert_eq!(rows[2][..4], ["dynamic", "64MiB", "-", "16MiB"], "{out}");
    for row in &rows[..2] {
        assert!(row.iter().any(|c| c.ends_with('%')), "{out}");
        // Two distinct widths, two primitives each, whatever the budget.
        assert_eq!(row[9], "4", "compiles:\n{out}");
    }
    // One primitive per node for every width.
    assert_eq!(rows[2][9], "2", "compiles:\n{out}");
    // Nothing is cached with no budget.
    assert_eq!(*rows[1].last().unwrap(), "0", "{out}");
    for name in [
        "memory_growth.svg",
        "latency_vs_budget.svg",
        "growth_vs_latency.svg",
    ] {
        let svg =
            std::fs::read_to_string(out_dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            svg.starts_with("<svg") || svg.starts_with("<?xml"),
            "{name}: {}",
            &svg[..svg.len().min(100)]
        );
        assert!(svg.trim_end().ends_with("</svg>"), "{name}");
        // The same figure as PNG beside it, with text drawn from the bundled font.
        let png = std::fs::read(out_dir.join(name).with_extension("png"))
            .unwrap_or_else(|e| panic!("{name} as png: {e}"));
        assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "{name}");
        assert!(out.contains(&format!(
            "{}",
            out_dir.join(name).with_extension("png").display()
        )));
    }
    for run in ["run0.json", "run1.json"] {
        assert_eq!(read_json(&out_dir.join(run))["calls"], 2);
    }

    failure(
        &primjit(&[
            "sweep",
            "--n",
            "1",
            "--widths",
            s(&f.widths),
            "--config",
            "fastest:0",
            "--out-dir",
            s(&out_dir),
            s(&f.model),
        ]),
        1,
        &["`fastest:0`", "unknown policy"],
    );
}

// ---- peak and bench-op ----

/// A reader that goes away (`primjit peak | head -0`) ends the command quietly: exit 0, no
/// panic on the failed write.
#[test]
fn a_closed_stdout_ends_a_command_quietly() {
    for args in [&["peak"][..], &["dump", TRUNK, "--stage", "ir"][..]] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_primjit"))
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("the primjit binary runs");
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("primjit ends");
        let err = stderr(&out);
        assert!(out.status.success(), "{args:?}: {:?}\n{err}", out.status);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

#[test]
fn peak_reports_a_rate_and_a_clock() {
    let out = success(&primjit(&["peak"]));
    assert!(out.contains("GFLOP/s"), "{out}");
    assert!(out.contains("GHz"), "{out}");
    // Each register tile's rate and its ratio to the peak: a positive number.
    for prefix in ["register tile: ", "winograd tile: "] {
        let tile = out
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} line: {out}"));
        let ratio: f64 = tile
            .split("; ")
            .last()
            .and_then(|r| r.split(' ').next())
            .and_then(|r| r.parse().ok())
            .unwrap_or_else(|| panic!("no ratio: {tile}"));
        assert!(ratio > 0.0, "{tile}");
    }
    // The widest vectors this CPU has, against the kernels' 128 bits, by the kernel's account
    // of the CPU's flags rather than cpuid's, which the command reads.
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").expect("/proc/cpuinfo is readable");
    let flags: Vec<&str> = cpuinfo
        .lines()
        .find(|l| l.starts_with("flags"))
        .and_then(|l| l.split_once(':'))
        .map_or(vec![], |(_, f)| f.split_whitespace().collect());
    let (bits, feature) = if flags.contains(&"avx512f") {
        (512, "avx512f")
    } else if flags.contains(&"avx") {
        (256, "avx")
    } else {
        (128, "sse2")
    };
    let widest = format!("widest vectors: {bits} bits on this CPU ({feature})");
    assert!(
        out.lines().any(|l| l.starts_with(&widest)),
        "{widest}: {out}"
    );
    // Each wide tier the host runs: its peak, and its register tile's rate against it.
    let tiers: &[&str] = match bits {
        512 => &["avx2", "avx512"],
        256 if flags.contains(&"avx2") && flags.contains(&"fma") => &["avx2"],
        _ => &[],
    };
    for tier in tiers {
        for line in [format!("peak {tier}: "), format!("register tile {tier}: ")] {
            assert!(out.lines().any(|l| l.starts_with(&line)), "{line}: {out}");
        }
    }
    // Under a cap, only the tiers up to it.
    let capped = success(&primjit(&["peak", "--threads", "1", "--max-isa", "x128"]));
    assert!(!capped.contains("peak avx"), "{capped}");
}

/// `--max-isa` is parsed strictly on every verb that compiles; a tier above the host's names
/// the host's tiers; the tier shows in the plan's one-liners.
#[test]
fn max_isa_caps_the_tier_of_every_compiling_verb() {
    let f = BenchFiles::new();
    failure(
        &primjit(&[
            "dump",
            s(&f.model),
            "--dims",
            "W=37",
            "--stage",
            "plan",
            "--max-isa",
            "AVX2",
        ]),
        2,
        &["unknown vector tier `AVX2`: expected x128, avx2 or avx512"],
    );
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let has = |flag: &str| {
        cpuinfo
            .lines()
            .find(|l| l.starts_with("flags"))
            .is_some_and(|l| l.split_whitespace().any(|f| f == flag))
    };
    let plan = |tier: &str| {
        primjit(&[
            "dump",
            s(&f.model),
            "--dims",
            "W=37",
            "--stage",
            "plan",
            "--max-isa",
            tier,
        ])
    };
    if has("avx2") && has("fma") {
        let out = success(&plan("avx2"));
        assert!(out.contains(" isa:avx2 "), "{out}");
    }
    if !has("avx512f") {
        failure(
            &plan("avx512"),
            1,
            &["the vector tier avx512 is above this host's: it runs x128"],
        );
    }
    let out = success(&plan("x128"));
    assert!(!out.contains(" isa:"), "{out}");
}

/// More threads than an engine runs are refused up front: `peak` would otherwise measure one
/// core first and then fail to spawn them, the other commands' pools would quietly start fewer.
#[test]
fn more_threads_than_an_engine_runs_are_refused() {
    failure(
        &primjit(&["peak", "--threads", "1025"]),
        2,
        &["expected 0 (all cores) to 1024 threads, found `1025`"],
    );
    failure(
        &primjit(&[
            "bench-op",
            "mb1ic8ih8iw8oc8oh8ow8kh3kw3sh1sw1ph1pw1",
            "--threads",
            "18446744073709551615",
        ]),
        1,
        &["threads 18446744073709551615: expected 0 (one per core) to 1024"],
    );
}

#[test]
fn bench_op_times_one_primitive() {
    let desc = "mb1ic8ih10iw10oc8oh10ow10kh3kw3sh1sw1ph1pw1";
    let conv = success(&primjit(&["bench-op", desc, "--runs", "2"]));
    assert!(conv.contains(&format!("conv {desc} bias")), "{conv}");
    assert!(conv.contains("GFLOP/s"), "{conv}");
    assert!(conv.contains("% of peak"), "{conv}");
    assert!(
        conv.contains("register tile (a broadcast load per FMA)"),
        "{conv}"
    );
    assert!(
        conv.contains("winograd tile (a broadcast load per two FMAs)"),
        "{conv}"
    );

    let pool = success(&primjit(&[
        "bench-op", desc, "--runs", "2", "--pool", "--alg", "avg_p",
    ]));
    assert!(pool.contains("pool_avg_p mb1ic8ih10iw10"), "{pool}");
    assert!(pool.contains("% of copy"), "{pool}");

    let err = failure(
        &primjit(&["bench-op", "ic8x3", "--runs", "1"]),
        1,
        &["ic8x3", "`x`"],
    );
    assert!(err.contains("unknown entry"), "{err}");
    // clap rejects an unknown algorithm, and run counts outside 1..=1000 (which were kept
    // per run, up to a capacity overflow).
    failure(
        &primjit(&["bench-op", desc, "--pool", "--alg", "median"]),
        2,
        &["median"],
    );
    for runs in ["0", "1001", "18446744073709551615"] {
        failure(
            &primjit(&["bench-op", desc, "--runs", runs]),
            2,
            &["expected a number of runs from 1 to 1000", runs],
        );
    }
}

#[test]
fn bench_op_times_every_node_of_a_model() {
    let out = success(&primjit(&[
        "bench-op", "--model", TRUNK, "--dims", "W=37", "--runs", "1",
    ]));
    assert!(out.contains("graph: median"), "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("conv1 ") && l.contains("+pool_max")),
        "the stem's pool is fused into conv1:\n{out}"
    );
    for node in ["conv1 ", "layer2.0.downsample.0 ", "layer3.5.conv2 "] {
        assert!(
            out.lines().any(|l| l.starts_with(node)),
            "no row for {node}:\n{out}"
        );
    }
}

/// `--workspace-budget` bounds what the model's runs keep: with 0 every run returns its
/// buffers, unlimited keeps them; it and the other model-only flags are refused beside a
/// descriptor, and a malformed budget is refused.
#[test]
fn bench_op_model_runs_take_a_workspace_budget() {
    let returned = |budget: &str| -> u64 {
        let out = success(&primjit(&[
            "bench-op",
            "--model",
            TRUNK,
            "--dims",
            "W=37",
            "--runs",
            "2",
            "--workspace-budget",
            budget,
        ]));
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("workspace: budget {budget},")))
            .unwrap_or_else(|| panic!("no workspace line for {budget}:\n{out}"));
        let words: Vec<&str> = line.split_whitespace().collect();
        let at = words
            .iter()
            .position(|w| *w == "returned")
            .expect("returned bytes");
        words[at - 2].parse().expect("a byte count")
    };
    // Unlimited, only small heap buffers outgrown by a later use go back.
    let (kept, none_kept) = (returned("unlimited"), returned("0"));
    assert!(kept < 64 << 10, "{kept}");
    assert!(none_kept > 1 << 20, "{none_kept}");
    for model_only in [
        &["--workspace-budget", "0"][..],
        &["--dynamic"],
        &["--vs-algo", "direct"],
        &["--dims", "W=3"],
    ] {
        let mut args = vec!["bench-op", "mb1ic8ih6iw18oc8kh3ph1"];
        args.extend(model_only);
        failure(&primjit(&args), 2, &[model_only[0], "DESCRIPTOR"]);
    }
    failure(
        &primjit(&[
            "bench-op",
            "--model",
            TRUNK,
            "--dims",
            "W=37",
            "--workspace-budget",
            "8 apples",
        ]),
        2,
        &["--workspace-budget"],
    );
}

// ---- PRIMJIT_* variables ----

/// Runs the small model at W=9 with `vars` set (and every other PRIMJIT_ variable unset).
fn run_small_with_env(vars: &[(&str, &str)]) -> Output {
    let vars: Vec<(&str, &std::ffi::OsStr)> = vars.iter().map(|&(n, v)| (n, v.as_ref())).collect();
    run_small_with_os_env(&vars)
}

/// As [`run_small_with_env`], with values that need not be UTF-8.
fn run_small_with_os_env(vars: &[(&str, &std::ffi::OsStr)]) -> Output {
    let f = BenchFiles::new();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_primjit"));
    cmd.args([
        "run",
        s(&f.model),
        "--dims",
        "W=9",
        "--random-input",
        "1",
        "--random-params",
        "1",
        "--output",
        s(&f.path("y.npy")),
    ]);
    for (name, _) in std::env::vars() {
        if name.starts_with("PRIMJIT_") {
            cmd.env_remove(name);
        }
    }
    cmd.envs(vars.iter().copied());
    cmd.output().expect("the primjit binary runs")
}

/// The verbose lines of stderr, split into fields; checks that each has the documented five
/// and that the last two are bytes and milliseconds.
#[track_caller]
fn verbose_lines(err: &str) -> Vec<Vec<String>> {
    err.lines()
        .filter(|l| l.starts_with("primjit_verbose,"))
        .map(|l| {
            let f: Vec<String> = l.split(',').map(str::to_string).collect();
            assert_eq!(f.len(), 5, "{l}");
            let bytes: u64 = f[3].parse().unwrap_or_else(|_| panic!("bytes: {l}"));
            assert!(bytes > 0, "{l}");
            let ms: f64 = f[4].parse().unwrap_or_else(|_| panic!("milliseconds: {l}"));
            assert!(ms >= 0.0, "{l}");
            f
        })
        .collect()
}

#[test]
fn verbose_lines_follow_the_documented_format() {
    let quiet = run_small_with_env(&[]);
    success(&quiet);
    assert!(
        !stderr(&quiet).contains("primjit_verbose"),
        "{}",
        stderr(&quiet)
    );

    let out = run_small_with_env(&[("PRIMJIT_VERBOSE", "1")]);
    success(&out);
    let lines = verbose_lines(&stderr(&out));
    let events: Vec<&str> = lines.iter().map(|f| f[1].as_str()).collect();
    // One creation per node (the conv with its fused relu, the pool), no executions.
    assert_eq!(
        events,
        ["create:cache_miss", "create:cache_miss"],
        "{lines:?}"
    );
    assert!(
        lines[0][2].starts_with("conv mb1ic3ih16iw9oc8"),
        "{lines:?}"
    );
    assert!(
        lines[1][2].starts_with("pool_avg_np mb1ic8ih16iw9"),
        "{lines:?}"
    );

    let out = run_small_with_env(&[("PRIMJIT_VERBOSE", "2")]);
    success(&out);
    let lines = verbose_lines(&stderr(&out));
    let execs: Vec<&Vec<String>> = lines.iter().filter(|f| f[1] == "exec").collect();
    assert_eq!(execs.len(), 2, "{lines:?}");
    assert!(
        lines.iter().filter(|f| f[1] == "create:cache_miss").count() == 2,
        "{lines:?}"
    );
    // Each execution follows its primitive's creation and names the same key and bytes.
    for exec in execs {
        let created = lines
            .iter()
            .find(|f| f[1] == "create:cache_miss" && f[2] == exec[2])
            .unwrap_or_else(|| panic!("no creation of {}", exec[2]));
        assert_eq!(created[3], exec[3]);
    }
}

#[test]
fn malformed_primjit_variables_are_errors() {
    failure(
        &run_small_with_env(&[("PRIMJIT_VERBOSE", "7")]),
        1,
        &["PRIMJIT_VERBOSE", "7"],
    );
    failure(
        &run_small_with_env(&[("PRIMJIT_CACHE_BUDGET", "lots")]),
        1,
        &["PRIMJIT_CACHE_BUDGET", "lots"],
    );
    failure(
        &run_small_with_env(&[("PRIMJIT_THREADS", "many")]),
        1,
        &["PRIMJIT_THREADS", "many"],
    );
    // A value that is not UTF-8 is malformed, not unset.
    use std::os::unix::ffi::OsStrExt;
    failure(
        &run_small_with_os_env(&[("PRIMJIT_THREADS", std::ffi::OsStr::from_bytes(b"2\xff"))]),
        1,
        &["PRIMJIT_THREADS", "2\u{fffd}"],
    );
    // Well-formed values run.
    success(&run_small_with_env(&[
        ("PRIMJIT_CACHE_BUDGET", "0"),
        ("PRIMJIT_THREADS", "1"),
    ]));
}

// ---- onnx ----

const FAMILIES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/onnx/families");

fn family(name: &str) -> String {
    format!("{FAMILIES}/{name}")
}

/// The largest absolute difference over the largest magnitude of `want`.
fn relative_error(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
    let diff = got
        .iter()
        .zip(want)
        .fold(0f32, |m, (g, w)| m.max((g - w).abs()));
    diff / scale
}

#[test]
fn import_writes_ir_and_params_that_run_as_the_model_does() {
    let dir = temp_dir();
    let ir = dir.path().join("resnet.ir");
    let params = dir.path().join("resnet.safetensors");
    let out = primjit(&[
        "import",
        &family("resnet.onnx"),
        "-o",
        s(&ir),
        "--params-out",
        s(&params),
    ]);
    success(&out);
    assert!(
        stderr(&out).contains("22 nodes, 32 parameters (22202 values)"),
        "{}",
        stderr(&out)
    );
    let text = std::fs::read_to_string(&ir).unwrap();
    assert!(
        text.starts_with("# imported by `primjit import` from "),
        "{text}"
    );
    assert!(
        text.contains(
            "# outputs that the model gives as [N, K] and this graph as [N, K, 1, 1]: fc_23"
        ),
        "{text}"
    );
    assert!(text.contains("input %x: f32[2, 3, H, W]"), "{text}");
    let (want_shape, want) = read_npy(Path::new(&family("resnet.expected.npy")));
    let input = format!("x={}", family("resnet.input.npy"));
    // The IR file with the written parameters: [N, K, 1, 1].
    let y_ir = dir.path().join("y_ir.npy");
    success(&primjit(&[
        "run",
        s(&ir),
        "--input",
        &input,
        "--params",
        s(&params),
        "--output",
        s(&y_ir),
    ]));
    let (shape, got_ir) = read_npy(&y_ir);
    assert_eq!(shape, vec![2, 10, 1, 1]);
    // The ONNX file directly, with its initializers: [N, K], as onnxruntime gives it.
    let y = dir.path().join("y.npy");
    let out = success(&primjit(&[
        "run",
        &family("resnet.onnx"),
        "--input",
        &input,
        "--output",
        s(&y),
    ]));
    assert!(out.contains("fc_23: [2, 10] -> "), "{out}");
    let (shape, got) = read_npy(&y);
    assert_eq!(shape, want_shape);
    assert_eq!(got, got_ir);
    assert!(relative_error(&got, &want) <= 1e-4);
}

#[test]
fn every_verb_reading_a_graph_accepts_an_onnx_file() {
    let deeplab = family("deeplab.onnx");
    let out = success(&primjit(&["check", &deeplab, "--dims", "H=26,W=35"]));
    assert!(
        out.contains("%classifier_10 = conv2d: [2, 4, 14, 17]"),
        "{out}"
    );
    let out = success(&primjit(&["dump", &deeplab, "--stage", "folded"]));
    assert!(out.contains("post=[relu]"), "{out}");
    let out = success(&primjit(&[
        "dump",
        &deeplab,
        "--stage",
        "plan",
        "--dims",
        "H=26,W=35",
        "--node",
        "stem_1",
    ]));
    assert!(out.starts_with("%stem_1: conv mb2ic3ih26iw35oc8"), "{out}");
    let out = success(&primjit(&[
        "run",
        &deeplab,
        "--random-input",
        "3",
        "--dims",
        "H=9,W=9",
        "--reference",
        "--output",
        "/dev/null",
    ]));
    assert!(
        out.contains("classifier_10: [2, 4, 5, 4] -> /dev/null"),
        "{out}"
    );
}

#[test]
fn run_params_override_an_onnx_models_initializers() {
    let dir = temp_dir();
    let params = dir.path().join("fc.safetensors");
    let bias: Vec<f32> = (0..10).map(|i| i as f32).collect();
    write_safetensors(
        &params,
        &[
            ("fc.weight", StTensor::f32(&[10, 32, 1, 1], &[0.0; 320])),
            ("fc.bias", StTensor::f32(&[10], &bias)),
        ],
    );
    let y = dir.path().join("y.npy");
    success(&primjit(&[
        "run",
        &family("resnet.onnx"),
        "--input",
        &format!("x={}", family("resnet.input.npy")),
        "--params",
        s(&params),
        "--output",
        s(&y),
    ]));
    let (shape, got) = read_npy(&y);
    assert_eq!(shape, vec![2, 10]);
    assert_eq!(got, [bias.clone(), bias].concat());
}

/// Overrides of an ONNX model's initializers must name its parameters: a typo is an error that
/// lists every unknown name, not a silently ignored tensor.
#[test]
fn run_overrides_naming_no_parameter_are_an_error() {
    let dir = temp_dir();
    let params = dir.path().join("typo.safetensors");
    write_safetensors(
        &params,
        &[
            ("fc.bias", StTensor::f32(&[10], &[0.0; 10])),
            ("fc.bais", StTensor::f32(&[10], &[0.0; 10])),
            ("fc.wieght", StTensor::f32(&[1], &[0.0])),
        ],
    );
    let y = dir.path().join("y.npy");
    failure(
        &primjit(&[
            "run",
            &family("resnet.onnx"),
            "--input",
            &format!("x={}", family("resnet.input.npy")),
            "--params",
            s(&params),
            "--output",
            s(&y),
        ]),
        1,
        &[
            "typo.safetensors names parameters the graph does not have: @fc.bais, @fc.wieght; its parameters: @",
        ],
    );
    assert!(!y.exists());
}

/// The model's format is told from its content: an ONNX model without the `.onnx` suffix
/// runs, and IR text named `.onnx` parses as IR.
#[test]
fn models_are_told_apart_by_content_not_name() {
    let dir = temp_dir();
    let model = dir.path().join("resnet-model");
    std::fs::copy(family("resnet.onnx"), &model).unwrap();
    let y = dir.path().join("y.npy");
    let out = success(&primjit(&[
        "run",
        s(&model),
        "--input",
        &format!("x={}", family("resnet.input.npy")),
        "--output",
        s(&y),
    ]));
    assert!(out.contains("[2, 10]"), "{out}");
    let text = dir.path().join("graph.onnx");
    std::fs::write(
        &text,
        "graph g {\n  input %x: f32[1, 3, 4, 4]\n  %r = relu(%x)\n  output y = %r\n}\n",
    )
    .unwrap();
    success(&primjit(&["check", s(&text)]));
}

/// A model as bytes: `x` [1, 3, 8, W] through the given nodes to `y`.
fn onnx_model(
    nodes: Vec<primjit_onnx::proto::NodeProto>,
    inits: Vec<primjit_onnx::proto::TensorProto>,
) -> Vec<u8> {
    use primjit_onnx::proto::*;
    use prost::Message;
    let dim =
        |d: tensor_shape_proto::dimension::Value| tensor_shape_proto::Dimension { value: Some(d) };
    use tensor_shape_proto::dimension::Value::{DimParam, DimValue};
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
        graph: Some(GraphProto {
            name: "m".into(),
            node: nodes,
            initializer: inits,
            input: vec![ValueInfoProto {
                name: "x".into(),
                r#type: Some(TypeProto {
                    value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                        elem_type: data_type::FLOAT,
                        shape: Some(TensorShapeProto {
                            dim: vec![
                                dim(DimValue(1)),
                                dim(DimValue(3)),
                                dim(DimValue(8)),
                                dim(DimParam("W".into())),
                            ],
                        }),
                    })),
                }),
            }],
            output: vec![ValueInfoProto {
                name: "y".into(),
                r#type: None,
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

fn onnx_node(
    op: &str,
    name: &str,
    inputs: &[&str],
    output: &str,
) -> primjit_onnx::proto::NodeProto {
    primjit_onnx::proto::NodeProto {
        op_type: op.into(),
        name: name.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![output.into()],
        ..Default::default()
    }
}

#[test]
fn bench_runs_an_onnx_model_with_its_weights() {
    let dir = temp_dir();
    let model = dir.path().join("conv.onnx");
    let w = primjit_onnx::proto::TensorProto {
        name: "w".into(),
        dims: vec![4, 3, 1, 1],
        data_type: primjit_onnx::proto::data_type::FLOAT,
        float_data: vec![0.5; 12],
        ..Default::default()
    };
    std::fs::write(
        &model,
        onnx_model(
            vec![
                onnx_node("Conv", "c", &["x", "w"], "c"),
                onnx_node("Relu", "r", &["c"], "y"),
            ],
            vec![w],
        ),
    )
    .unwrap();
    let out = success(&primjit(&["bench", s(&model), "--n", "2", "--quiet"]));
    assert!(out.contains(&format!("model={}", model.display())), "{out}");
}

#[test]
fn onnx_errors_list_every_unsupported_node_and_reject_malformed_files() {
    let dir = temp_dir();
    let model = dir.path().join("bad.onnx");
    std::fs::write(
        &model,
        onnx_model(
            vec![
                onnx_node("LRN", "LRN_42", &["x"], "r"),
                onnx_node("Softplus", "sig", &["x"], "s"),
                onnx_node("Add", "sum", &["r", "s"], "y"),
            ],
            vec![],
        ),
    )
    .unwrap();
    let m = s(&model);
    for verb in [
        vec!["import", m],
        vec!["check", m],
        vec![
            "run",
            m,
            "--random-input",
            "1",
            "--dims",
            "W=4",
            "--output",
            "/dev/null",
        ],
    ] {
        let err = failure(&primjit(&verb), 1, &[]);
        assert_eq!(
            err,
            format!(
                "error: {m}: node \"LRN_42\" (LRN, opset 17): unsupported op\n{m}: node \"sig\" (Softplus, opset 17): unsupported op\n"
            ),
            "{verb:?}"
        );
    }
    let junk = write(dir.path(), "junk.onnx", "not a model\n");
    let err = failure(
        &primjit(&["import", s(&junk)]),
        1,
        &["junk.onnx: not a valid ONNX model: "],
    );
    // The decoder's reason is printed once (it was the message's and its source's).
    assert_eq!(err.matches("failed to decode").count(), 1, "{err}");
    let err = failure(
        &primjit(&["check", "/nonexistent/model.onnx"]),
        1,
        &["cannot read `/nonexistent/model.onnx`"],
    );
    assert_eq!(
        err,
        "error: cannot read `/nonexistent/model.onnx`: No such file or directory (os error 2)\n"
    );
}

/// `bench --policy dynamic` streams wide calls (its default) and reports the segment; its
/// outputs equal the unstreamed `exact` ones to the last bit; `--streaming off` and a bad
/// setting behave as documented.
#[test]
fn bench_dynamic_streams_wide_calls_bit_identically_to_exact() {
    let f = BenchFiles::new();
    let widths = write(f.dir.path(), "wide.txt", "300\n257\n");
    let run = |extra: &[&str]| {
        let json_path = f.path("wide.json");
        let mut args = vec![
            "bench",
            s(&f.model),
            "--widths",
            s(&widths),
            "--n",
            "2",
            "--quiet",
            "--threads",
            "2",
            "--policy",
            "dynamic",
            "--json",
            s(&json_path),
            // The small model's tensors are far below the default 32MiB; the band is given
            // so that the figures below hold whatever the default.
            "--stream-above",
            "0",
            "--stream-band",
            "64",
        ];
        args.extend_from_slice(extra);
        let out = success(&primjit(&args));
        (out, read_json(&json_path))
    };
    let (out, json) = run(&[]);
    assert_eq!(json["streaming"], "on", "{json}");
    assert_eq!(json["stream_band"], 64, "{json}");
    let segment = &json["peak_call_segments"][0];
    assert_eq!(segment["first"], "c", "{json}");
    assert!(segment["calls"].as_u64().unwrap() >= 5, "{json}");
    assert!(out.contains("streaming: on, bands of 64 columns"), "{out}");
    assert!(out.contains("at the peak call: streamed %c..%c"), "{out}");
    let e = &json["bucket_error"];
    assert_eq!(e["calls_checked"], 2, "{json}");
    assert_eq!(e["max_abs"].as_f64(), Some(0.0), "{json}");

    let (out, json) = run(&["--streaming", "off"]);
    assert_eq!(json["streaming"], "off", "{json}");
    assert_eq!(json["peak_call_segments"].as_array().map(Vec::len), Some(0));
    assert!(out.contains("streaming: off\n"), "{out}");

    failure(
        &primjit(&["bench", s(&f.model), "--streaming", "maybe"]),
        2,
        &["unknown streaming setting `maybe`: expected on or off"],
    );
    failure(
        &primjit(&[
            "bench",
            s(&f.model),
            "--stream-band",
            "30",
            "--n",
            "1",
            "--quiet",
        ]),
        1,
        &["a band of 30 columns: expected a positive multiple of 4 up to 2147483648"],
    );
}

/// `bench --help` gives the library's own defaults for the band and the streaming threshold
/// (it said 64 for a while after the default band had changed).
#[test]
fn bench_help_names_the_library_streaming_defaults() {
    let out = success(&primjit(&["bench", "--help"]));
    let band = format!("default {})", primjit::Streaming::DEFAULT_BAND);
    assert!(out.contains(&band), "{out}");
    let above = format!(
        "(`{}`, the default;",
        primjit::Budget::Bytes(primjit::Streaming::DEFAULT_ABOVE)
    );
    assert!(out.contains(&above), "{out}");
}

/// `dump --bands` shows, for each node of the streamed segment, the band kernels a streamed
/// run calls (with their windows' row pitches) and the calls each serves, adding up to the
/// plan's; the nodes after the segment keep their own keys; where nothing streams it says so.
/// Bands of 64 columns (`--stream-band`; the default is 128), whose segment ends before
/// `%layer3.0.conv2`.
#[test]
fn dump_bands_lists_the_kernels_of_a_streamed_run() {
    let dump = |w: &str, stage: &str| {
        primjit(&[
            "dump",
            TRUNK,
            "--stage",
            stage,
            "--dims",
            w,
            "--dynamic",
            "--bands",
            "--stream-band",
            "64",
        ])
    };
    let out = success(&dump("W=7680", "plan"));
    let bands: Vec<&str> = node_lines(&out)
        .into_iter()
        .filter(|l| l.starts_with("%layer1.0.conv1 "))
        .collect();
    assert_eq!(bands.len(), 3, "first, inner and last bands:\n{out}");
    let calls: usize = bands
        .iter()
        .map(|l| {
            let n = l.split("band kernel of ").nth(1).expect("a count");
            n.split(' ')
                .next()
                .unwrap()
                .parse::<usize>()
                .expect("a number")
        })
        .sum();
    assert!(
        out.contains(&format!("%layer1.0.conv1: 1920 columns in {calls} calls")),
        "the plan's calls:\n{out}"
    );
    // %conv1's window also holds layer1's residual stream, written over it block by block.
    assert!(
        bands.iter().all(|l| l.contains("pitch:src96,dst80")),
        "{bands:?}"
    );
    assert!(
        out.contains("%layer1.2.conv2: 1920 columns in 31 calls, written over %layer1.1.conv2 in the window of %conv1"),
        "the plan's shared windows:\n{out}"
    );
    assert!(
        out.contains("%layer3.1.conv1: conv mb1ic256ih20iw*"),
        "after the segment, the node's own key:\n{out}"
    );
    let node_asm = |node: &str| {
        success(&primjit(&[
            "dump",
            TRUNK,
            "--stage",
            "asm",
            "--dims",
            "W=7680",
            "--dynamic",
            "--bands",
            "--stream-band",
            "64",
            "--node",
            node,
        ]))
    };
    // The segment's last conv: a band kernel for its left border, one for the rest.
    let asm = node_asm("layer3.0.conv1");
    assert_eq!(node_lines(&asm).len(), 2, "{asm}");
    assert!(
        node_lines(&asm)
            .iter()
            .all(|l| l.contains("[band kernel of ")),
        "{asm}"
    );
    assert!(asm.contains(" bytes of code"), "{asm}");
    // The node after it runs whole: its own key.
    let asm = node_asm("layer3.0.conv2");
    assert_eq!(node_lines(&asm).len(), 1, "{asm}");
    assert!(
        node_lines(&asm)[0].starts_with("%layer3.0.conv2: conv "),
        "{asm}"
    );
    failure(
        &dump("W=200", "plan"),
        1,
        &["--bands: nothing streams at these dims"],
    );
}

/// `dump --stage plan` ends with the streamed segment, its windows and halos, at a width
/// wider than a band; not at a narrow one, nor with `--streaming off`.
#[test]
fn dump_plan_shows_the_streamed_segment() {
    let f = BenchFiles::new();
    let plan = |dims: &str, extra: &[&str]| {
        let mut args = vec![
            "dump",
            s(&f.model),
            "--stage",
            "plan",
            "--dims",
            dims,
            "--dynamic",
            // The small model's tensors are far below the default 32MiB; the figures below
            // are those of bands of 64 columns.
            "--stream-above",
            "0",
            "--stream-band",
            "64",
        ];
        args.extend_from_slice(extra);
        success(&primjit(&args))
    };
    let out = plan("W=300", &[]);
    assert!(
        out.contains("streamed segment %c..%c: bands of 64 columns of %c, 5 sweeps, 5 calls"),
        "{out}"
    );
    assert!(
        out.contains("%c: 300 columns in 5 calls, whole tensor"),
        "{out}"
    );
    assert!(!plan("W=60", &[]).contains("streamed segment"));
    assert!(!plan("W=300", &["--streaming", "off"]).contains("streamed segment"));
    let trunk_plan = |extra: &[&str]| {
        let mut args = vec![
            "dump",
            TRUNK,
            "--stage",
            "plan",
            "--dims",
            "W=7680",
            "--dynamic",
        ];
        args.extend_from_slice(extra);
        success(&primjit(&args))
    };
    // With the default bands of 128 columns, or 112 (`--stream-band`), the trunk's segment
    // runs through layer3.0.conv2, whose bands are then 32 or 28 columns wide.
    let trunk = trunk_plan(&[]);
    assert!(
        trunk.contains(
            "streamed segment %conv1..%layer3.0.conv2: bands of 128 columns of %conv1, 16 sweeps"
        ),
        "{trunk}"
    );
    assert!(!trunk.contains("ends before"), "{trunk}");
    let trunk = trunk_plan(&["--stream-band", "112"]);
    assert!(
        trunk.contains(
            "streamed segment %conv1..%layer3.0.conv2: bands of 112 columns of %conv1, 18 sweeps"
        ),
        "{trunk}"
    );
    assert!(!trunk.contains("ends before"), "{trunk}");
    // With 64 it stops before layer3.0.conv2, whose 9.4 MB of transformed weights its bands
    // of 16 columns would read 2.5 times as often per flop, and says so.
    let trunk = trunk_plan(&["--stream-band", "64"]);
    assert!(
        trunk.contains(
            "streamed segment %conv1..%layer3.0.downsample.0: bands of 64 columns of %conv1"
        ),
        "{trunk}"
    );
    assert!(
        trunk.contains(
            "  ends before %layer3.0.conv2: its band calls would read its weights from memory \
             2.50 times as often per flop as a whole call (more than 1.5)"
        ),
        "{trunk}"
    );
}

/// Runs `primjit` with `args`, killing it if it has not ended after a minute: what a reader
/// blocked on a FIFO or reading `/dev/zero` without end (the bugs guarded here) would do.
fn primjit_or_kill(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_primjit"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the primjit binary runs");
    for _ in 0..600 {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    child.kill().unwrap();
    let out = child.wait_with_output().unwrap();
    panic!("primjit {args:?} did not end:\n{}", stderr(&out));
}

/// Models, parameters, inputs and widths that are not regular files (a device, also through
/// a symlink, a FIFO, a directory) are refused, naming the path and what it is: `/dev/zero`
/// was read without end and a FIFO blocked.
#[test]
fn files_that_are_not_regular_are_refused_naming_the_path() {
    let t = Tiny::new();
    let dir = t.dir.path();
    let link = |name: &str| {
        let path = dir.join(name);
        std::os::unix::fs::symlink("/dev/zero", &path).unwrap();
        path
    };
    let zero_ir = link("zero.ir");
    let zero_onnx = link("zero.onnx");
    let zero_params = link("zero.safetensors");
    let zero_npy = link("zero.npy");
    let fifo = dir.join("fifo.ir");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let folder = dir.join("folder.onnx");
    std::fs::create_dir(&folder).unwrap();
    let device = "it is a character device, not a regular file";
    for (path, what) in [
        (Path::new("/dev/zero"), device),
        (zero_ir.as_path(), device),
        (zero_onnx.as_path(), device),
        (fifo.as_path(), "it is a FIFO, not a regular file"),
        (folder.as_path(), "it is a directory, not a regular file"),
    ] {
        let err = failure(&primjit_or_kill(&["check", s(path)]), 1, &[]);
        // One line, the reason once (a directory's OS error was printed twice).
        assert_eq!(
            err,
            format!("error: cannot read `{}`: {what}\n", path.display())
        );
    }
    let y = t.path("y.npy");
    let err = failure(
        &primjit_or_kill(&[
            "run",
            s(&t.ir),
            "--input",
            s(&t.input),
            "--params",
            s(&zero_params),
            "--output",
            s(&y),
        ]),
        1,
        &[],
    );
    assert_eq!(
        err,
        format!("error: cannot read `{}`: {device}\n", zero_params.display())
    );
    let err = failure(
        &primjit_or_kill(&[
            "run",
            s(&t.ir),
            "--input",
            s(&zero_npy),
            "--params",
            s(&t.params),
            "--output",
            s(&y),
        ]),
        1,
        &[],
    );
    assert_eq!(
        err,
        format!(
            "error: input %x: cannot open `{}`: {device}\n",
            zero_npy.display()
        )
    );
    let f = BenchFiles::new();
    for widths in [Path::new("/dev/zero"), fifo.as_path()] {
        failure(
            &primjit_or_kill(&["bench", s(&f.model), "--widths", s(widths), "--quiet"]),
            1,
            &[&format!(
                "error: cannot read `{}`: it is a ",
                widths.display()
            )],
        );
    }
}

/// Numbers past what their option holds are said to be too large, with the limit, not
/// malformed.
#[test]
fn numbers_that_overflow_are_too_large_with_the_limit() {
    let huge = "99999999999999999999";
    let f = BenchFiles::new();
    failure(
        &primjit(&["bench", s(&f.model), "--n", huge, "--quiet"]),
        2,
        &[&format!(
            "`{huge}` is too large: at most the number of widths (the `--widths` file's, else the shipped workload's 1000)"
        )],
    );
    failure(
        &primjit(&["bench", s(&f.model), "--capacity", huge, "--quiet"]),
        2,
        &[&format!(
            "`{huge}` is too large: at most 18446744073709551615"
        )],
    );
    failure(
        &primjit(&["bench", s(&f.model), "--threads", "many", "--quiet"]),
        2,
        &["`many` is not a non-negative integer"],
    );
    let widths = write(f.dir.path(), "huge.txt", &format!("32\n{huge}\n"));
    failure(
        &primjit(&[
            "bench",
            s(&f.model),
            "--widths",
            s(&widths),
            "--n",
            "1",
            "--quiet",
        ]),
        1,
        &[&format!(
            "{}:2: the width `{huge}` is too large: at most 18446744073709551615",
            widths.display()
        )],
    );
    failure(
        &primjit(&["check", s(&f.model), "--dims", &format!("W={huge}")]),
        2,
        &[&format!(
            "the value of `W`, `{huge}`, is too large: at most 18446744073709551615"
        )],
    );
    failure(
        &primjit(&[
            "sweep",
            "--n",
            "1",
            "--config",
            &format!("exact:64MiB:{huge}"),
        ]),
        1,
        &[&format!(
            "config `exact:64MiB:{huge}`: capacity `{huge}` is too large: at most 18446744073709551615"
        )],
    );
}

/// `check` refuses a stride over the kernels' bound at its line, as `run` would only have
/// refused it when compiling (naming a key, not the node); at the bound, both run.
#[test]
fn check_refuses_a_stride_the_kernels_cannot_take_and_run_takes_the_largest() {
    assert_eq!(primjit_ir::MAX_STEP, primjit::codegen::MAX_STEP);
    let dir = temp_dir();
    let graph = |stride: usize| {
        format!(
            "graph g {{
  input %x: f32[1, 2, 8, 8]
  param @w: f32[2, 2, 1, 1]
  %c = conv2d(%x, @w, strides=[{stride}, 1], dilations=[1, 1])
  %p = maxpool2d(%c, kernel=[1, 1], dilations=[{stride}, 1])
  output y = %p
}}
"
        )
    };
    let past = write(dir.path(), "past.ir", &graph(primjit_ir::MAX_STEP + 1));
    let err = failure(&primjit(&["check", s(&past)]), 1, &[]);
    assert_eq!(
        err.lines().next().unwrap(),
        format!(
            "{}:4:3: error: %c: strides must be at most 536870912, found [536870913, 1]",
            past.display()
        )
    );
    let at = write(dir.path(), "at.ir", &graph(primjit_ir::MAX_STEP));
    assert_eq!(
        success(&primjit(&["check", s(&at)])),
        "%c = conv2d: [1, 2, 1, 8]\n%p = maxpool2d: [1, 2, 1, 8]\n"
    );
    let y = dir.path().join("y.npy");
    success(&primjit(&[
        "run",
        s(&at),
        "--random-input",
        "1",
        "--random-params",
        "1",
        "--output",
        s(&y),
    ]));
    assert_eq!(read_npy(&y).0, [1, 2, 1, 8]);
}
