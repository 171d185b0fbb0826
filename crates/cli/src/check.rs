//! `primjit check`: parse and verify an IR file, then print every node's output shape.

use std::io::Write;

use anyhow::Result;

use crate::source::GraphArgs;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub graph: GraphArgs,
}

pub fn run(args: &Args) -> Result<()> {
    let loaded = args.graph.load()?;
    let graph = &loaded.graph;
    let shapes = loaded.shapes(graph, &loaded.bindings)?;
    let mut out = std::io::stdout().lock();
    for (_, node) in graph.nodes() {
        writeln!(
            out,
            "%{} = {}: {}",
            graph.value_name(node.result),
            node.op.kind(),
            shapes.describe(node.result)
        )?;
    }
    out.flush()?;
    Ok(())
}
