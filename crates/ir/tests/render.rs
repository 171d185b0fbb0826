//! `IrError::render` prints `file:line:col: error: message`, the source line, and a caret
//! under the column; errors without a location print one line.

use primjit_ir::{Dim, Graph, IrError, Op, infer_shapes, parse};

fn render_err(source: &str) -> String {
    let error: IrError = match parse(source) {
        Err(e) => e.into(),
        Ok(g) => infer_shapes(&g, &Default::default())
            .expect_err("the source is invalid")
            .into(),
    };
    error.render("model.ir", source)
}

#[test]
fn parse_error_shows_the_line_and_a_caret_under_the_column() {
    let source = "graph g {\n  input %x: f32[1, 3, 8, 8]\n  %r = relu(%y)\n  output o = %r\n}\n";
    assert_eq!(
        render_err(source),
        "model.ir:3:13: error: unknown value `%y`\n  %r = relu(%y)\n            ^"
    );
}

#[test]
fn verify_error_names_its_subject_and_points_at_the_node() {
    let source = "graph g {\n  input %a: f32[1, 3, 8, 8]\n  input %b: f32[1, 3, 8, 7]\n    %s = add(%a, %b)\n  output o = %s\n}\n";
    let rendered = render_err(source);
    let lines: Vec<&str> = rendered.lines().collect();
    assert_eq!(
        lines,
        [
            "model.ir:4:5: error: %s: add needs operands of one shape: [1, 3, 8, 8] and [1, 3, 8, 7] differ",
            "    %s = add(%a, %b)",
            "    ^",
        ]
    );
}

#[test]
fn caret_keeps_tabs_and_counts_characters_not_bytes() {
    // A tab and a two-byte character precede the error: the caret line repeats the tab and
    // puts one space per character, so it lines up in a terminal.
    let source = "graph g {\n\tinput %x: f32[1, 3, 8, 8] # é\n\t%r = relu(%x) é\n}\n";
    let rendered = render_err(source);
    let lines: Vec<&str> = rendered.lines().collect();
    assert_eq!(lines[0], "model.ir:3:16: error: unexpected character `é`");
    assert_eq!(lines[1], "\t%r = relu(%x) é");
    assert_eq!(lines[2], "\t              ^");
    assert_eq!(
        lines[1].chars().nth(lines[2].chars().count() - 1),
        Some('é'),
        "the caret is under the offending character"
    );
}

#[test]
fn error_at_end_of_file_points_past_the_last_line() {
    let source = "graph g {\n  input %x: f32[1, 3, 8, 8]";
    assert_eq!(
        render_err(source),
        "model.ir:2:28: error: expected `input`, `param`, `output`, a `%value` definition or `}`, found end of file\n  input %x: f32[1, 3, 8, 8]\n                           ^"
    );
    assert_eq!(
        render_err(""),
        "model.ir:1:1: error: expected `graph`, found end of file\n\n^"
    );
}

#[test]
fn error_without_location_is_one_line() {
    // A graph built in code has no source locations. Its node reads a value that was named
    // but never defined, which verification reports instead of panicking.
    let mut g = Graph::new("built");
    let x = g
        .add_input(
            "x",
            vec![Dim::Known(1), Dim::Known(2), Dim::Known(4), Dim::Known(4)],
        )
        .unwrap();
    let dangling = g.add_value("later").unwrap();
    let sum = g
        .add_node(
            "sum",
            Op::Add {
                lhs: x,
                rhs: dangling,
            },
        )
        .unwrap();
    assert!(g.add_output("y", sum));
    let error: IrError = g.verify().expect_err("an undefined operand").into();
    assert_eq!(error.loc(), None);
    assert_eq!(
        error.render("built.ir", &g.to_string()),
        "built.ir: error: %sum: the right operand %later is used before it is defined"
    );
}
