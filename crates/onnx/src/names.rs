//! Sanitized, unique primjit names for ONNX names, and the record that traces them back.

use std::collections::HashSet;

/// What kind of IR name a [`Rename`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NameKind {
    /// A graph input or a node's result (`%name`).
    Value,
    /// A parameter (`@name`).
    Param,
    /// A symbolic dimension (from a `dim_param`, or made up for an unnamed dimension).
    Symbol,
    /// A graph output's name.
    Output,
    /// The graph's name.
    Graph,
}

/// An IR name and the ONNX name it was made from (equal when nothing needed changing).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rename {
    pub kind: NameKind,
    pub ir: String,
    pub onnx: String,
}

/// `%value` and `@param` names: ASCII letters, digits, `_` and `.`; anything else becomes `_`.
pub(crate) fn sanitize_value(onnx: &str) -> String {
    let s: String = onnx
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() { "v".to_string() } else { s }
}

/// Identifiers (graph, output and symbol names): a letter or `_`, then letters, digits, `_`.
pub(crate) fn sanitize_ident(onnx: &str) -> String {
    let mut s: String = onnx
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if !s.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
        s.insert(0, '_');
    }
    s
}

/// Hands out unique names within one namespace and records each with its ONNX origin.
#[derive(Debug, Default)]
pub(crate) struct Namespace {
    used: HashSet<String>,
}

impl Namespace {
    /// A fresh name from `base` (already sanitized): `base`, else `base_2`, `base_3`, ...
    pub(crate) fn fresh(&mut self, base: String) -> String {
        let mut name = base.clone();
        let mut n = 1;
        while self.used.contains(&name) {
            n += 1;
            name = format!("{base}_{n}");
        }
        self.used.insert(name.clone());
        name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitizing_keeps_legal_names_and_replaces_the_rest() {
        assert_eq!(sanitize_value("layer1.0.conv1"), "layer1.0.conv1");
        assert_eq!(
            sanitize_value("/layer1/conv1/Conv_output_0"),
            "_layer1_conv1_Conv_output_0"
        );
        assert_eq!(sanitize_value("x:0"), "x_0");
        assert_eq!(sanitize_value(""), "v");
        assert_eq!(sanitize_ident("batch size"), "batch_size");
        assert_eq!(sanitize_ident("1st"), "_1st");
        assert_eq!(sanitize_ident("y.out"), "y_out");
        let mut ns = Namespace::default();
        assert_eq!(ns.fresh("a".into()), "a");
        assert_eq!(ns.fresh("a".into()), "a_2");
        assert_eq!(ns.fresh("a".into()), "a_3");
    }
}
