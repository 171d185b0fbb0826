//! Reading an IR file, binding its symbolic dimensions, and rendering IR errors against it.
//!
//! Every verb that takes an IR file flattens [`GraphArgs`] and calls [`GraphArgs::load`]; IR
//! errors come back as a [`Diagnostic`], which `main` prints as it is:
//! `file:line:col: error: message`, the source line, and a caret under the column.

use std::fmt;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use primjit_ir::{Bindings, Graph, IrError, Shapes, infer_shapes, parse_bindings};

/// The IR file argument and the `--dims` bindings shared by every verb.
#[derive(Debug, clap::Args)]
pub struct GraphArgs {
    /// The IR file
    #[arg(value_name = "FILE.ir")]
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

/// An IR file's text, with the name it is reported under.
#[derive(Debug)]
pub struct Source {
    pub path: String,
    pub text: String,
}

impl Source {
    pub fn read(path: &std::path::Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read `{}`", path.display()))?;
        Ok(Source {
            path: path.display().to_string(),
            text,
        })
    }

    pub fn parse(&self) -> Result<Graph, Diagnostic> {
        primjit_ir::parse(&self.text).map_err(|e| self.diagnose(e))
    }

    /// Renders an IR error against this file.
    pub fn diagnose(&self, error: impl Into<IrError>) -> Diagnostic {
        Diagnostic(error.into().render(&self.path, &self.text))
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
