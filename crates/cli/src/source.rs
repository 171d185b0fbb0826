//! Reading a model (an IR file, or an ONNX file through the importer), binding its symbolic
//! dimensions, and rendering IR errors against it.
//!
//! Every verb that takes a model flattens [`GraphArgs`] and calls [`GraphArgs::load`], or reads
//! it with [`Source::read`]: this is the one place that knows the two formats. IR errors come
//! back as a [`Diagnostic`], which `main` prints as it is: `file:line:col: error: message`, the
//! source line, and a caret under the column (an imported graph has no lines: `file: error:
//! message`).

use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::{Result, bail};
use primjit_ir::{Bindings, Graph, IrError, Params, Shapes, Tensor, infer_shapes, parse_bindings};

/// The IR file argument and the `--dims` bindings shared by every verb.
#[derive(Debug, clap::Args)]
pub struct GraphArgs {
    /// The model: an IR file, or an ONNX file (told apart by content, whatever the name)
    #[arg(value_name = "FILE.ir|FILE.onnx")]
    pub file: PathBuf,

    /// Values for the graph's symbolic dimensions, e.g. `W=1031,H=2`
    #[arg(long, value_name = "NAME=N,...", value_parser = parse_dims)]
    pub dims: Option<Bindings>,
}

fn parse_dims(text: &str) -> Result<Bindings, String> {
    parse_bindings(text)
}

impl GraphArgs {
    /// Reads and parses the file, and checks that `--dims` only binds symbols of the graph.
    pub fn load(&self) -> Result<Loaded> {
        let source = Source::read(&self.file)?;
        let graph = source.parse()?;
        let bindings = self.dims.clone().unwrap_or_default();
        check_symbols(&graph, &bindings)?;
        Ok(Loaded {
            source,
            graph,
            bindings,
        })
    }
}

/// Fails when `--dims` binds a symbol that no input shape of the graph mentions.
fn check_symbols(graph: &Graph, bindings: &Bindings) -> Result<()> {
    let symbols = graph.symbols();
    for name in bindings.keys() {
        if !symbols.contains(name) {
            let known = if symbols.is_empty() {
                "it has none".to_string()
            } else {
                format!("its symbols: {}", symbols.join(", "))
            };
            bail!("--dims binds `{name}`, which is not a symbol of the graph ({known})");
        }
    }
    Ok(())
}

/// A model's IR text, with the name it is reported under; for an ONNX file, the imported
/// graph (whose text is its printed form) and its initializers.
#[derive(Debug)]
pub struct Source {
    pub path: String,
    pub text: String,
    pub onnx: Option<primjit_onnx::Imported>,
}

impl Source {
    /// IR text under a name.
    pub fn ir(path: impl Into<String>, text: impl Into<String>) -> Self {
        Source {
            path: path.into(),
            text: text.into(),
            onnx: None,
        }
    }

    /// Reads an IR file, or imports an ONNX file (every unsupported node is listed), told
    /// apart by content ([`primjit::model_file`]), whatever the file's name.
    pub fn read(path: &Path) -> Result<Self> {
        let source = primjit::model_file::ModelSource::read(path)?;
        Ok(Source {
            path: source.origin,
            text: source.text,
            onnx: source.onnx,
        })
    }

    pub fn parse(&self) -> Result<Graph, Diagnostic> {
        match &self.onnx {
            Some(imported) => Ok(imported.graph.clone()),
            None => primjit_ir::parse(&self.text).map_err(|e| self.diagnose(e)),
        }
    }

    /// Moves out the parameter values the model carries, an ONNX model's initializers, for a
    /// caller that makes them its parameters (or their fallback): the source keeps none, so
    /// that the weights are not held twice.
    pub fn take_initializers(&mut self) -> Option<Params> {
        self.onnx.as_mut().map(|i| std::mem::take(&mut i.params))
    }

    /// `tensor`, an output named `name`, in the shape the model file gives it: an ONNX
    /// classifier's `[N, K]` output, which the IR computes as `[N, K, 1, 1]`, is reshaped back.
    pub fn file_shape(&self, name: &str, mut tensor: Tensor) -> Tensor {
        if let Some(i) = &self.onnx
            && i.flattened_outputs.iter().any(|o| o == name)
            && tensor.shape.len() == 4
        {
            tensor.shape.truncate(2);
        }
        tensor
    }

    /// Renders an IR error against this file.
    pub fn diagnose(&self, error: impl Into<IrError>) -> Diagnostic {
        let error = error.into();
        if self.onnx.is_some() {
            // The imported graph's nodes have no location in any text the user has.
            return Diagnostic(format!("{}: error: {error}", self.path));
        }
        Diagnostic(error.render(&self.path, &self.text))
    }
}

/// A parsed graph with the source it came from and the `--dims` bindings.
#[derive(Debug)]
pub struct Loaded {
    pub source: Source,
    pub graph: Graph,
    pub bindings: Bindings,
}

impl Loaded {
    /// Infers the shapes of `graph` (this one or a rewrite of it) under `bindings`.
    pub fn shapes(&self, graph: &Graph, bindings: &Bindings) -> Result<Shapes, Diagnostic> {
        infer_shapes(graph, bindings).map_err(|e| self.source.diagnose(e))
    }
}

/// An error already rendered against the source, printed without an `error:` prefix.
#[derive(Debug)]
pub struct Diagnostic(String);

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Diagnostic {}
