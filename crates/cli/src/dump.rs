//! `primjit dump`: print a graph at one stage of compilation.

use std::io::Write;

use anyhow::Result;
use primjit_ir::{Graph, Shapes, passes};

use crate::source::GraphArgs;

/// A stage of compilation that `dump` can print.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Stage {
    /// The canonical text of the parsed graph
    Ir,
    /// The canonical text with each node's output shape as a trailing comment
    Shapes,
    /// The graph after batch-norm folding and post-op fusion (with shapes when --dims is given)
    Folded,
}

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub graph: GraphArgs,

    /// What to print
    #[arg(long, value_enum)]
    pub stage: Stage,
}

pub fn run(args: &Args) -> Result<()> {
    let loaded = args.graph.load()?;
    let text = match args.stage {
        Stage::Ir => loaded.graph.to_string(),
        Stage::Shapes => {
            let shapes = loaded.shapes(&loaded.graph, &loaded.bindings)?;
            annotated(&loaded.graph, &shapes)
        }
        Stage::Folded => {
            // Passes expect a valid graph.
            loaded.shapes(&loaded.graph, &loaded.bindings)?;
            let mut graph = loaded.graph.clone();
            let report = passes::optimize(&mut graph);
            let mut text = if args.graph.dims.is_some() {
                let shapes = loaded.shapes(&graph, &loaded.bindings)?;
                annotated(&graph, &shapes)
            } else {
                graph.to_string()
            };
            text.push_str(&format!(
                "# passes: {} batchnorms folded, {} relus and {} adds fused into convs\n",
                report.folded_batchnorms, report.fused_relus, report.fused_adds
            ));
            text
        }
    };
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}

/// The graph's text with each node's output shape as a trailing comment.
fn annotated(graph: &Graph, shapes: &Shapes) -> String {
    graph
        .display_annotated(|node| Some(shapes.describe(graph.node(node).result)))
        .to_string()
}
