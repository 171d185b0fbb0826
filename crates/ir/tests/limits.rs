//! The bounds verification holds graphs to, each at its limit and one past it: strides,
//! dilations and pads of windows (code generation's `MAX_STEP`), and numbers too large to
//! parse, which are said to be too large rather than malformed.

use primjit_ir::{IrError, MAX_STEP, parse, parse_bindings};

/// Parses and verifies `text`, giving the error as `check` prints its first line (without
/// the file name).
fn check(text: &str) -> Result<(), String> {
    let first_line = |e: IrError| {
        let rendered = e.render("g.ir", text);
        rendered.lines().next().unwrap_or("").to_string()
    };
    let graph = parse(text).map_err(|e| first_line(e.into()))?;
    graph.verify().map(|_| ()).map_err(|e| first_line(e.into()))
}

fn conv(attrs: &str) -> String {
    format!(
        "graph g {{
  input %x: f32[1, 2, 8, 8]
  param @w: f32[2, 2, 1, 1]
  %c = conv2d(%x, @w, {attrs})
  output y = %c
}}
"
    )
}

fn maxpool(attrs: &str) -> String {
    format!(
        "graph g {{
  input %x: f32[1, 2, 8, 8]
  %p = maxpool2d(%x, kernel=[1, 1], {attrs})
  output y = %p
}}
"
    )
}

fn conv_then_pool(pool_attrs: &str) -> String {
    format!(
        "graph g {{
  input %x: f32[1, 2, 8, 8]
  param @w: f32[2, 2, 1, 1]
  %c = conv2d(%x, @w, post=[maxpool(kernel=[1, 1], {pool_attrs})])
  output y = %c
}}
"
    )
}

#[test]
fn window_steps_stop_at_the_kernels_bound_at_the_node() {
    assert_eq!(MAX_STEP, 1 << 29);
    let at = MAX_STEP;
    let past = MAX_STEP + 1;
    for (make, line, prefix) in [
        (conv as fn(&str) -> String, 4, "%c: "),
        (maxpool, 3, "%p: "),
        (conv_then_pool, 4, "%c: maxpool post-op: "),
    ] {
        for (attrs, message) in [
            (
                format!("strides=[{past}, 1]"),
                format!("strides must be at most {MAX_STEP}, found [{past}, 1]"),
            ),
            (
                format!("dilations=[1, {past}]"),
                format!("dilations must be at most {MAX_STEP}, found [1, {past}]"),
            ),
            (
                format!("pads=[0, 0, {past}, 0]"),
                format!("pads must be at most {MAX_STEP}, found [0, 0, {past}, 0]"),
            ),
        ] {
            let text = make(&attrs);
            assert_eq!(
                check(&text),
                Err(format!("g.ir:{line}:3: error: {prefix}{message}")),
                "{text}"
            );
        }
        for attrs in [format!("strides=[{at}, 1]"), format!("dilations=[1, {at}]")] {
            let text = make(&attrs);
            assert_eq!(check(&text), Ok(()), "{text}");
        }
    }
}

#[test]
fn numbers_past_64_bits_are_too_large_not_malformed() {
    let huge = "99999999999999999999";
    assert_eq!(
        parse_bindings(&format!("W={huge}")),
        Err(format!(
            "the value of `W`, `{huge}`, is too large: at most 18446744073709551615"
        ))
    );
    assert_eq!(
        parse_bindings("W=-3"),
        Err("the value of `W` is not a non-negative integer: `-3`".to_string())
    );
    assert_eq!(
        check(&conv(&format!("strides=[{huge}, 1]"))),
        Err(format!(
            "g.ir:4:32: error: `strides` value `{huge}` is too large: at most 18446744073709551615"
        ))
    );
    let text = format!(
        "graph g {{\n  input %x: f32[1, 2, {huge}, 8]\n  %r = relu(%x)\n  output y = %r\n}}\n"
    );
    assert_eq!(
        check(&text),
        Err(format!(
            "g.ir:2:23: error: the dimension `{huge}` is too large: at most 18446744073709551615"
        ))
    );
}
