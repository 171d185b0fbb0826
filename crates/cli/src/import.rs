//! `primjit import`: an ONNX model to canonical IR text, and its initializers to safetensors.
//!
//! The text starts with comments that trace every name the importer changed back to its ONNX
//! name, so that the IR file and the parameter file can be read against the model.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use primjit_onnx::NameKind;

use crate::io;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The ONNX model (external data files are read beside it)
    #[arg(value_name = "MODEL.onnx")]
    pub model: PathBuf,

    /// Where to write the IR text (default: standard output)
    #[arg(short = 'o', long = "output", value_name = "MODEL.ir")]
    pub output: Option<PathBuf>,

    /// Where to write the initializers, as F32 tensors named as the IR's parameters
    #[arg(long, value_name = "PARAMS.safetensors")]
    pub params_out: Option<PathBuf>,
}

/// The IR text of an imported model, with its provenance and renames as comments.
pub fn ir_text(model: &str, imported: &primjit_onnx::Imported) -> String {
    let mut text = format!(
        "# imported by `primjit import` from {model} (ai.onnx opset {})\n",
        imported.opset
    );
    let changed: Vec<_> = imported
        .changed_names()
        .filter(|r| r.kind != NameKind::Graph)
        .collect();
    if !changed.is_empty() {
        text.push_str("# names changed from the model's (IR <- ONNX):\n");
        for r in changed {
            let ir = match r.kind {
                NameKind::Value => format!("%{}", r.ir),
                NameKind::Param => format!("@{}", r.ir),
                NameKind::Symbol => format!("symbol {}", r.ir),
                NameKind::Output => format!("output {}", r.ir),
                NameKind::Graph => format!("graph {}", r.ir),
            };
            text.push_str(&format!("#   {ir} <- {:?}\n", r.onnx));
        }
    }
    if !imported.flattened_outputs.is_empty() {
        text.push_str(&format!(
            "# outputs that the model gives as [N, K] and this graph as [N, K, 1, 1]: {}\n",
            imported.flattened_outputs.join(", ")
        ));
    }
    text.push_str(&imported.graph.to_string());
    text
}

pub fn run(args: &Args) -> Result<()> {
    let imported = primjit_onnx::import_file(&args.model)?;
    let text = ir_text(&args.model.display().to_string(), &imported);
    match &args.output {
        Some(path) => std::fs::write(path, &text)
            .with_context(|| format!("cannot write `{}`", path.display()))?,
        None => {
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes())?;
            out.flush()?;
        }
    }
    if let Some(path) = &args.params_out {
        io::write_safetensors_params(path, &imported.params)?;
    }
    let mut err = std::io::stderr().lock();
    writeln!(
        err,
        "{}: {} nodes, {} parameters ({} values)",
        args.model.display(),
        imported.graph.node_count(),
        imported.params.iter().count(),
        imported.params.iter().map(|(_, t)| t.len()).sum::<usize>()
    )?;
    Ok(())
}
