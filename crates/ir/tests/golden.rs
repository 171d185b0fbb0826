//! Golden tests over the IR files of the repository's `ir/` directory, in the style of
//! Cranelift's filetests: one test per directory, which runs every file and reports all
//! failures together.
//!
//! - Every `.ir` file under `ir/` (recursively, except `ir/bad/`) round-trips: printing the
//!   parsed graph gives text that parses to the same graph and prints identically.
//! - Every `ir/examples/*.ir` file ends with the expected output of `check`, one comment line
//!   per node such as `# check: %conv1 = conv2d: [1, 8, 6, 6]`. Symbols are bound by a
//!   `# dims: H=9,W=11` comment line when the file has one, and stay symbolic otherwise.
//! - Every `ir/bad/*.ir` file is a graph that must fail to parse or verify (with its `# dims:`
//!   bindings, if any). Its first line is the expected error, `# error: LINE:COL: message`,
//!   or `# error: message` for an error without a location.
//!
//! Re-blessing: run `PRIMJIT_BLESS=1 cargo test -p primjit-ir --test golden` to rewrite the
//! expectations (the `# check:` lines and the `# error:` line) from what the IR crate does
//! now, instead of comparing; then review the diff.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use primjit_ir::{Bindings, Graph, IrError, Shapes, infer_shapes, parse, parse_bindings};

const CHECK_PREFIX: &str = "# check: ";
const ERROR_PREFIX: &str = "# error: ";
const DIMS_PREFIX: &str = "# dims:";

fn ir_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ir")
}

fn blessing() -> bool {
    std::env::var("PRIMJIT_BLESS").is_ok_and(|v| v == "1")
}

/// The `.ir` files under `dir`, sorted; recursing into subdirectories other than `skip`.
fn ir_files(dir: &Path, recursive: bool, skip: Option<&Path>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {dir:?}: {e}"));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            if recursive && skip.is_none_or(|s| !same_path(&path, s)) {
                out.extend(ir_files(&path, recursive, skip));
            }
        } else if path.extension().is_some_and(|e| e == "ir") {
            out.push(path);
        }
    }
    out.sort();
    out
}

fn same_path(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

fn display_name(path: &Path) -> String {
    path.strip_prefix(ir_dir())
        .map(|p| format!("ir/{}", p.display()))
        .unwrap_or_else(|_| path.display().to_string())
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path:?}: {e}"))
}

/// The bindings of the file's `# dims:` line, or none.
fn dims_header(text: &str) -> Result<Bindings, String> {
    match text
        .lines()
        .find_map(|l| l.trim().strip_prefix(DIMS_PREFIX))
    {
        None => Ok(Bindings::new()),
        Some(dims) => parse_bindings(dims).map_err(|e| format!("bad `# dims:` line: {e}")),
    }
}

/// What `check` prints: one line per node, `%name = op: [shape]`.
fn check_lines(graph: &Graph, shapes: &Shapes) -> Vec<String> {
    graph
        .nodes()
        .map(|(_, node)| {
            format!(
                "%{} = {}: {}",
                graph.value_name(node.result),
                node.op.kind(),
                shapes.describe(node.result)
            )
        })
        .collect()
}

/// An error as `LINE:COL: message`, or `message` without a location, taken from the first
/// line of [`IrError::render`].
fn error_line(error: &IrError, source: &str) -> String {
    const FILE: &str = "input.ir";
    let rendered = error.render(FILE, source);
    let first = rendered.lines().next().unwrap_or("");
    let rest = first.strip_prefix(FILE).unwrap_or(first);
    match rest.strip_prefix(": error: ") {
        Some(message) => message.to_string(),
        None => rest.trim_start_matches(':').replacen(": error: ", ": ", 1),
    }
}

/// Reports every failure of a directory's files together.
fn report(what: &str, files: usize, failures: &[String]) {
    assert!(
        failures.is_empty(),
        "{} of {files} {what} failed:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

/// The graph's structure without source locations, for comparing a parsed graph with its
/// printed and re-parsed form.
fn structure(g: &Graph) -> String {
    let mut out = String::new();
    writeln!(out, "name {:?}", g.name()).unwrap();
    for input in g.inputs() {
        writeln!(out, "input {:?} {:?}", input.value, input.shape).unwrap();
    }
    for (p, data) in g.params() {
        writeln!(
            out,
            "param {p:?} {:?} {:?} {:?}",
            data.name, data.shape, data.derived
        )
        .unwrap();
    }
    for (_, node) in g.nodes() {
        writeln!(
            out,
            "node {:?} {:?} {:?}",
            node.result,
            g.value_name(node.result),
            node.op
        )
        .unwrap();
    }
    for (name, v) in g.outputs() {
        writeln!(out, "output {name:?} {v:?}").unwrap();
    }
    out
}

fn round_trip(text: &str) -> Result<(), String> {
    let graph = parse(text).map_err(|e| format!("does not parse: {e}"))?;
    let printed = graph.to_string();
    let again =
        parse(&printed).map_err(|e| format!("the printed graph does not parse: {e}\n{printed}"))?;
    let reprinted = again.to_string();
    if reprinted != printed {
        return Err(format!(
            "printing is not stable:\n--- first print\n{printed}--- second print\n{reprinted}"
        ));
    }
    if structure(&again) != structure(&graph) {
        return Err(format!(
            "the printed graph reads back differently:\n--- parsed\n{}--- printed and parsed\n{}",
            structure(&graph),
            structure(&again)
        ));
    }
    Ok(())
}

#[test]
fn every_ir_file_round_trips() {
    let bad = ir_dir().join("bad");
    let files = ir_files(&ir_dir(), true, Some(&bad));
    assert!(
        files.iter().any(|f| f.ends_with("resnet34_trunk.ir")),
        "the trunk is among the round-tripped files: {files:?}"
    );
    assert!(
        files.len() >= 6,
        "expected the trunk and the examples, found {files:?}"
    );
    let failures: Vec<String> = files
        .iter()
        .filter_map(|path| {
            round_trip(&read(path))
                .err()
                .map(|e| format!("{}: {e}", display_name(path)))
        })
        .collect();
    report("files", files.len(), &failures);
}

/// The file with its `# check:` lines replaced by `lines`.
fn with_check_lines(text: &str, lines: &[String]) -> String {
    let mut out: String = text
        .lines()
        .filter(|l| !l.starts_with(CHECK_PREFIX.trim_end()))
        .map(|l| format!("{l}\n"))
        .collect();
    out.truncate(out.trim_end().len());
    out.push('\n');
    for line in lines {
        writeln!(out, "{CHECK_PREFIX}{line}").unwrap();
    }
    out
}

fn check_example(path: &Path, bless: bool) -> Result<(), String> {
    let text = read(path);
    let bindings = dims_header(&text)?;
    let graph = parse(&text).map_err(|e| format!("does not parse: {e}"))?;
    let shapes = infer_shapes(&graph, &bindings).map_err(|e| format!("does not verify: {e}"))?;
    let actual = check_lines(&graph, &shapes);
    if bless {
        let blessed = with_check_lines(&text, &actual);
        if blessed != text {
            std::fs::write(path, blessed).map_err(|e| format!("cannot bless: {e}"))?;
        }
        return Ok(());
    }
    let expected: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix(CHECK_PREFIX))
        .collect();
    if expected != actual {
        let mut diff = String::from("the check output differs (- expected, + actual):\n");
        for line in &expected {
            if !actual.iter().any(|a| a == line) {
                writeln!(diff, "- {line}").unwrap();
            }
        }
        for line in &actual {
            if !expected.contains(&line.as_str()) {
                writeln!(diff, "+ {line}").unwrap();
            }
        }
        writeln!(diff, "actual output:").unwrap();
        for line in &actual {
            writeln!(diff, "  {line}").unwrap();
        }
        return Err(diff);
    }
    Ok(())
}

#[test]
fn examples_match_their_check_lines() {
    let files = ir_files(&ir_dir().join("examples"), false, None);
    assert!(files.len() >= 5, "expected the examples, found {files:?}");
    let bless = blessing();
    let failures: Vec<String> = files
        .iter()
        .filter_map(|path| {
            check_example(path, bless)
                .err()
                .map(|e| format!("{}: {e}", display_name(path)))
        })
        .collect();
    report("examples", files.len(), &failures);
}

/// The error that parsing and verifying the file gives, or `None` if it is valid.
fn first_error(text: &str, bindings: &Bindings) -> Option<IrError> {
    match parse(text) {
        Err(e) => Some(e.into()),
        Ok(graph) => infer_shapes(&graph, bindings).err().map(IrError::from),
    }
}

fn check_bad_file(path: &Path, bless: bool) -> Result<(), String> {
    let text = read(path);
    let bindings = dims_header(&text)?;
    let Some(error) = first_error(&text, &bindings) else {
        return Err("expected an error, but the file parses and verifies".to_string());
    };
    let actual = error_line(&error, &text);
    let first = text.lines().next().unwrap_or("");
    if bless {
        let blessed = match first.strip_prefix(ERROR_PREFIX.trim_end()) {
            Some(_) => {
                let rest = text.split_once('\n').map_or("", |(_, rest)| rest);
                format!("{ERROR_PREFIX}{actual}\n{rest}")
            }
            None => format!("{ERROR_PREFIX}{actual}\n{text}"),
        };
        if blessed != text {
            std::fs::write(path, blessed).map_err(|e| format!("cannot bless: {e}"))?;
        }
        return Ok(());
    }
    let Some(expected) = first.strip_prefix(ERROR_PREFIX) else {
        return Err(format!(
            "the first line must be `{ERROR_PREFIX}...`; the error is:\n  {actual}"
        ));
    };
    if expected != actual {
        return Err(format!(
            "wrong error:\n  expected: {expected}\n  actual:   {actual}"
        ));
    }
    Ok(())
}

#[test]
fn bad_files_report_their_errors() {
    let files = ir_files(&ir_dir().join("bad"), false, None);
    assert!(files.len() >= 25, "expected the bad files, found {files:?}");
    let bless = blessing();
    let failures: Vec<String> = files
        .iter()
        .filter_map(|path| {
            check_bad_file(path, bless)
                .err()
                .map(|e| format!("{}: {e}", display_name(path)))
        })
        .collect();
    report("bad files", files.len(), &failures);
}

/// An input declared through the API with a window for a dimension (which the text format
/// cannot write) is refused: `bind_inputs` could not check a given tensor's extent against it.
#[test]
fn an_input_dimension_that_is_a_window_is_an_error() {
    use primjit_ir::Dim;
    let mut g = Graph::new("g");
    let w = Dim::Sym("W".into()).window(0, 0, 5, 1, false).unwrap();
    let x = g
        .add_input("x", vec![Dim::Known(1), Dim::Known(3), Dim::Known(8), w])
        .unwrap();
    assert!(g.add_output("y", x));
    let e = g.verify().unwrap_err();
    assert_eq!(e.subject, "%x");
    assert!(
        e.message
            .starts_with("a graph input's dimensions must be numbers or symbols"),
        "{e}"
    );
    let mut bindings = Bindings::new();
    bindings.insert("W".into(), 3);
    assert_eq!(infer_shapes(&g, &bindings).unwrap_err(), e);
}
