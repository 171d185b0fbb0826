//! `primjit dump`: print a graph at one stage of compilation.

use std::io::Write;

use anyhow::{Result, bail};
use primjit::codegen::{CodegenOptions, Dumps, PrimitiveKey, compile, describe_plan};
use primjit::{Budget, CacheConfig, Engine, EngineConfig};
use primjit_ir::{Graph, Shapes};

use crate::algo::AlgoArgs;
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
    /// Per node: the primitive key and its tiling plan (needs every symbol bound)
    Plan,
    /// Per node: the key and its Cranelift IR
    Clif,
    /// Per node: the key and its machine code, disassembled
    Asm,
    /// Per node: the key, its memory (code, mapped, heap bytes) and compile time, then totals
    Memory,
}

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub graph: GraphArgs,

    /// What to print
    #[arg(long, value_enum)]
    pub stage: Stage,

    /// Only this node (its value name without `%`), for the per-node stages
    #[arg(long, value_name = "NAME")]
    pub node: Option<String>,

    /// Per-node stages: the keys of the `dynamic` policy, whose convolutions and pooling take
    /// the extents that depend on a symbol (`*` in the key) at run time
    #[arg(long)]
    pub dynamic: bool,

    #[command(flatten)]
    pub algo: AlgoArgs,

    /// Stage plan: after the nodes, the segment a streamed run computes in column bands, with
    /// its windows and halos (`on`, the default, as `bench --policy dynamic` runs; `off`
    /// leaves it out)
    #[arg(long, value_name = "on|off", value_parser = crate::bench::parse_streaming, default_value = "on")]
    pub streaming: primjit::Streaming,

    /// Stage plan: the band width in columns of the first streamed layer's output, as `bench
    /// --stream-band`
    #[arg(long, value_name = "COLUMNS")]
    pub stream_band: Option<usize>,

    /// Stage plan: the whole-tensor bytes above which a run streams, as `bench --stream-above`
    #[arg(long, value_name = "BYTES", value_parser = primjit::Budget::parse)]
    pub stream_above: Option<primjit::Budget>,

    /// Per-node stages: for the nodes of the streamed segment, the kernels a streamed run calls
    /// instead of the node's own (each distinct band kernel once: its width, padding and the
    /// row pitches of the windows it reads and writes, with the calls it serves), as
    /// `PRIMJIT_PERF_MAP` names them; the other nodes as without it. An error where nothing
    /// streams at these dims
    #[arg(long)]
    pub bands: bool,
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
            let report = primjit::optimize_graph(&mut graph, args.algo.choice()?, args.algo.isa()?);
            let mut text = if args.graph.dims.is_some() {
                let shapes = loaded.shapes(&graph, &loaded.bindings)?;
                annotated(&graph, &shapes)
            } else {
                graph.to_string()
            };
            text.push_str(&format!(
                "# passes: {} batchnorms folded, {} made depthwise convs, {} relus, {} adds and {} max pools fused into convs, {} channel selections composed into others\n",
                report.folded_batchnorms,
                report.batchnorm_convs,
                report.fused_relus,
                report.fused_adds,
                report.fused_pools,
                report.composed_selections
            ));
            text
        }
        Stage::Plan | Stage::Clif | Stage::Asm | Stage::Memory => per_node(&loaded, args)?,
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

/// The per-node stages: every node's primitive key at the bound shapes, and what the stage
/// shows of it.
fn per_node(loaded: &crate::source::Loaded, args: &Args) -> Result<String> {
    let graph = bound_graph(loaded, args)?;
    let mode = if args.dynamic {
        primjit::ShapeMode::Runtime
    } else {
        primjit::ShapeMode::Exact
    };
    let conv_algo = args.algo.choice()?;
    let isa = args.algo.isa()?;
    let mut keys = primjit::node_keys_in(&graph, &loaded.bindings, mode, conv_algo, isa)?;
    if let Some(name) = &args.node {
        let name = name.trim_start_matches('%');
        keys.retain(|(n, _)| n == name);
        if keys.is_empty() {
            let names: Vec<String> = primjit::node_keys(&graph, &loaded.bindings)?
                .into_iter()
                .map(|(n, _)| n)
                .collect();
            bail!(
                "no node %{name} after folding and fusion (nodes: {})",
                names.join(", ")
            );
        }
    }
    let streaming = crate::bench::streaming_from_flags(
        args.streaming,
        None,
        args.stream_band,
        args.stream_above,
    )?
    .unwrap_or(args.streaming);
    // What each entry shows: a node and its key, or a band kernel of a streamed node.
    let shown: Vec<(String, PrimitiveKey)> = if args.bands {
        let Some(bands) = primjit::stream_band_kernels(
            &graph,
            &loaded.bindings,
            mode,
            conv_algo,
            isa,
            streaming,
        )?
        else {
            bail!(
                "--bands: nothing streams at these dims (a run streams where its whole tensors \
                 would pass --stream-above, 32MiB by default, and its first convolution's output \
                 is more than four bands wide)"
            );
        };
        with_band_kernels(&keys, &bands)
    } else {
        keys.clone()
    };
    Ok(match args.stage {
        Stage::Plan | Stage::Clif | Stage::Asm => {
            let mut text = describe_keys(&shown, args.stage, conv_algo)?;
            if args.stage == Stage::Plan
                && let Some(plan) = primjit::describe_stream_plan(
                    &graph,
                    &loaded.bindings,
                    conv_algo,
                    isa,
                    streaming,
                )?
            {
                text.push_str(&plan);
            }
            text
        }
        _ => memory_table(&shown, &keys, isa, conv_algo)?,
    })
}

/// The loaded graph after folding and fusion, where `--dims` binds every symbol.
fn bound_graph(loaded: &crate::source::Loaded, args: &Args) -> Result<Graph> {
    loaded.shapes(&loaded.graph, &loaded.bindings)?;
    let mut graph = loaded.graph.clone();
    primjit::optimize_graph(&mut graph, args.algo.choice()?, args.algo.isa()?);
    let unbound: Vec<String> = graph
        .symbols()
        .into_iter()
        .filter(|s| !loaded.bindings.contains_key(s))
        .collect();
    if !unbound.is_empty() {
        bail!(
            "stage {} needs concrete shapes: bind {} with --dims",
            clap::ValueEnum::to_possible_value(&args.stage)
                .expect("no skipped stages")
                .get_name(),
            unbound.join(", ")
        );
    }
    Ok(graph)
}

/// `keys` with each streamed node's entry replaced by its band kernels (`bands`), labelled
/// with the calls they serve.
fn with_band_kernels(
    keys: &[(String, PrimitiveKey)],
    bands: &[primjit::BandKernel],
) -> Vec<(String, PrimitiveKey)> {
    keys.iter()
        .flat_map(|(name, key)| {
            let own: Vec<(String, PrimitiveKey)> = bands
                .iter()
                .filter(|b| b.node == *name)
                .map(|b| {
                    let [x0, x1] = b.first_columns;
                    let label = match b.calls {
                        1 => format!("{name} [band kernel of 1 call, on columns {x0}..{x1}]"),
                        n => format!(
                            "{name} [band kernel of {n} calls, the first on columns {x0}..{x1}]"
                        ),
                    };
                    (label, b.key.clone())
                })
                .collect();
            if own.is_empty() {
                vec![(name.clone(), key.clone())]
            } else {
                own
            }
        })
        .collect()
}

/// Stages plan, clif and asm: each shown key with its runtime extents, and its plan or code.
fn describe_keys(
    shown: &[(String, PrimitiveKey)],
    stage: Stage,
    conv_algo: primjit::ConvAlgoChoice,
) -> Result<String> {
    let mut text = String::new();
    let dumps = Dumps {
        clif: stage == Stage::Clif,
        disasm: stage == Stage::Asm,
    };
    for (name, key) in shown {
        text.push_str(&format!("%{name}: {key}\n"));
        let runtime = key.runtime_dims();
        if runtime.any() {
            let fused = matches!(key, PrimitiveKey::Conv(d) if d.pool.is_some());
            let read = if fused {
                "[ih, iw, oh, ow, ph, pw]"
            } else {
                "[ih, iw, oh, ow]"
            };
            text.push_str(&format!(
                "  runtime extents: {runtime} (`*` fields; the kernel reads {read} from its extents argument)\n"
            ));
        }
        match stage {
            Stage::Plan => {
                // As `compile` does for the other stages: a plan takes a valid key.
                key.validate()?;
                if let PrimitiveKey::Conv(d) = key {
                    // The key's extents, where they decided the algorithm (the graph fixes
                    // them); else the choice the channels made.
                    let output = Some([d.oh(), d.ow()])
                        .filter(|&o| conv_algo.pick(d, Some(o)) != conv_algo.pick(d, None))
                        .filter(|&o| conv_algo.pick(d, Some(o)) == d.algo);
                    let why = conv_algo.explain(d, output);
                    text.push_str(&format!("  algorithm: {why}\n"));
                }
                text.push_str(&describe_plan(key))
            }
            _ => {
                let kernel = compile(key, CodegenOptions::default(), dumps)?;
                text.push_str(kernel.clif().or(kernel.disasm()).unwrap_or_default());
                text.push_str(&format!("; {} bytes of code\n", kernel.code().len()));
            }
        }
        text.push('\n');
    }
    Ok(text)
}

/// Stage memory: each shown key's code, mapped and heap bytes and compile time on an engine of
/// its own, then the totals and the weights that `keys`' convolutions hold.
fn memory_table(
    shown: &[(String, PrimitiveKey)],
    keys: &[(String, PrimitiveKey)],
    isa: primjit::Isa,
    conv_algo: primjit::ConvAlgoChoice,
) -> Result<String> {
    let mut text = String::new();
    // An engine of its own with no budget limit: every distinct primitive once.
    let config = EngineConfig {
        cache: CacheConfig {
            budget: Budget::Unlimited,
            capacity: None,
        },
        max_isa: Some(isa),
        ..EngineConfig::default()
    };
    let engine = Engine::new(config)?;
    text.push_str(&format!(
        "{:<28} {:>7} {:>7} {:>6} {:>8} {:>9}  key\n",
        "node", "code", "mapped", "heap", "total", "compile"
    ));
    for (name, key) in shown {
        let p = engine.compile(key)?;
        let m = p.memory();
        text.push_str(&format!(
            "{:<28} {:>7} {:>7} {:>6} {:>8} {:>7.3}ms  {key}\n",
            format!("%{name}"),
            m.code,
            m.mapped,
            m.heap,
            m.total(),
            p.compile_time().as_secs_f64() * 1e3
        ));
    }
    let stats = engine.cache().stats();
    text.push_str(&format!(
        "# {} nodes, {} distinct primitives, {} bytes ({} mapped), compiled in {:.1} ms\n",
        keys.len(),
        stats.entries,
        stats.bytes,
        stats.mapped_bytes,
        stats.compile_time.as_secs_f64() * 1e3
    ));
    // Each convolution node holds its own packed weights, whatever its key shares.
    let (mut direct, mut winograd) = (0, 0);
    for (_, key) in keys {
        if let PrimitiveKey::Conv(d) = key {
            match d.algo {
                primjit::ConvAlgo::Direct => direct += d.packed_weights_len() * 4,
                primjit::ConvAlgo::WinogradF4x3 => winograd += d.packed_weights_len() * 4,
            }
        }
    }
    text.push_str(&format!(
        "# weights ({conv_algo} convolutions): {direct} bytes packed for direct kernels, \
         {winograd} bytes winograd-transformed\n"
    ));
    Ok(text)
}
