//! `primjit run`: run a graph on tensors from .npy files and write its outputs as .npy files.
//!
//! The graph is verified, its inputs and parameters are loaded and checked against it, then it
//! is optimized (batch-norm folding, post-op fusion) and an [`Executor`] runs it, which takes
//! the parameters over: the JIT engine drops them once their packed copies exist.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use primjit_ir::{Graph, Params, Tensor, random_tensor};

use crate::algo::AlgoArgs;
use crate::executor::Executor;
use crate::io;
use crate::source::{GraphArgs, Loaded};

#[derive(Debug, clap::Args)]
#[command(group(
    clap::ArgGroup::new("param_source")
        .args(["params", "random_params"]),
))]
pub struct Args {
    #[command(flatten)]
    pub graph: GraphArgs,

    /// An input tensor (f32, C order) as NAME=FILE.npy, NAME the input's name without `%`;
    /// just FILE.npy when the graph has one input
    #[arg(long = "input", value_name = "[NAME=]FILE.npy")]
    pub inputs: Vec<String>,

    /// Draw every input uniformly from [-1, 1) with this seed instead of reading files
    #[arg(long, value_name = "SEED", conflicts_with = "inputs")]
    pub random_input: Option<u64>,

    /// Where to write an output, as NAME=FILE.npy; just FILE.npy writes the first output
    #[arg(long = "output", value_name = "[NAME=]FILE.npy", required = true)]
    pub outputs: Vec<String>,

    /// Parameter values from a safetensors or .npz file (told apart by content): F32 tensors
    /// named as the graph's parameters without `@`. For an IR graph, other tensors in the file
    /// are reported on stderr and ignored (a full model's state dict); for an ONNX model, those
    /// in the file override its initializers, and a name it has no parameter of is an error
    #[arg(long, value_name = "FILE.safetensors|FILE.npz")]
    pub params: Option<PathBuf>,

    /// Draw the parameters from this seed instead of reading them
    #[arg(long, value_name = "SEED")]
    pub random_params: Option<u64>,

    /// Run on the reference interpreter instead of JIT primitives
    #[arg(long)]
    pub reference: bool,

    #[command(flatten)]
    pub algo: AlgoArgs,

    /// The most bytes of activation buffers kept after the run: 16MiB, 0, unlimited (default:
    /// PRIMJIT_WORKSPACE_BUDGET, else the built-in default)
    #[arg(long, value_parser = primjit::Budget::parse, conflicts_with = "reference")]
    pub workspace_budget: Option<primjit::Budget>,
}

impl Args {
    fn executor(&self) -> Result<Executor> {
        Ok(if self.reference {
            Executor::Reference
        } else {
            Executor::Jit {
                conv_algo: self.algo.choice()?,
                max_isa: self.algo.max_isa()?,
                workspace_budget: self.workspace_budget,
            }
        })
    }
}

pub fn run(args: &Args) -> Result<()> {
    let mut loaded = args.graph.load()?;
    let initializers = loaded.source.take_initializers();
    let loaded = loaded;
    let graph = &loaded.graph;
    // Ranks, channels and attributes, before reading any tensor.
    loaded.shapes(graph, &loaded.bindings)?;
    let outputs = output_specs(graph, &args.outputs)?;

    let inputs = match args.random_input {
        Some(seed) => random_inputs(&loaded, seed)?,
        None => read_inputs(graph, &args.inputs)?,
    };
    let given: Vec<(&str, &[usize])> = inputs
        .iter()
        .map(|(name, t)| (name.as_str(), t.shape.as_slice()))
        .collect();
    let bindings = graph
        .bind_inputs(&given, &loaded.bindings)
        .map_err(|e| loaded.source.diagnose(e))?;
    // Extents and residual shapes under the inputs' sizes, still against the written graph.
    loaded.shapes(graph, &bindings)?;

    let params = params_of(args, graph, initializers)?;

    let mut optimized = graph.clone();
    primjit::optimize_graph(&mut optimized, args.algo.choice()?, args.algo.isa()?);
    let shapes = loaded.shapes(&optimized, &bindings)?;

    let executor = args.executor()?;
    let input_refs: Vec<(&str, &Tensor)> = inputs.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let results = executor.run(&optimized, params, &input_refs)?;

    let mut stdout = std::io::stdout().lock();
    for (name, path) in &outputs {
        let tensor = results
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t)
            .ok_or_else(|| anyhow!("the {} returned no output `{name}`", executor.name()))?;
        let value = optimized
            .outputs()
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| *v)
            .expect("output names were checked");
        if let Some(expected) = shapes.concrete(value)
            && expected != tensor.shape
        {
            bail!(
                "the {} returned output `{name}` of shape {:?} but the graph's is {expected:?}",
                executor.name(),
                tensor.shape
            );
        }
        let tensor = loaded.source.file_shape(name, tensor.clone());
        io::write_npy(path, &tensor).with_context(|| format!("output `{name}`"))?;
        writeln!(stdout, "{name}: {:?} -> {}", tensor.shape, path.display())?;
    }
    stdout.flush()?;
    Ok(())
}

/// The graph's parameters as the flags give them: read from `--params` (an ONNX model's
/// `initializers` filling in those the file leaves out), drawn from `--random-params`, or the
/// initializers themselves. Takes the initializers so that they are dropped here unless they
/// are the parameters.
fn params_of(args: &Args, graph: &Graph, initializers: Option<Params>) -> Result<Params> {
    Ok(match (&args.params, args.random_params) {
        (Some(path), None) => {
            let bound = primjit::params_file::read_params(path, graph, initializers)?;
            if !bound.unused.is_empty() {
                eprintln!("{}", unused_line(path, &bound.unused));
            }
            bound.params
        }
        (None, Some(seed)) => Params::random(graph, seed),
        (None, None) => match initializers {
            Some(params) => params,
            None if graph.params().next().is_none() => Params::new(),
            None => bail!(
                "the graph has parameters: give --params FILE.safetensors or --random-params SEED"
            ),
        },
        _ => bail!("give at most one of --params FILE.safetensors and --random-params SEED"),
    })
}

/// The stderr line for tensors of a parameter file that the graph does not use.
fn unused_line(path: &Path, unused: &[String]) -> String {
    let shown: Vec<&str> = unused.iter().take(10).map(String::as_str).collect();
    let more = match unused.len().saturating_sub(shown.len()) {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    format!(
        "note: `{}`: {} tensors the graph does not use, ignored: {}{more}",
        path.display(),
        unused.len(),
        shown.join(", ")
    )
}

/// Splits `NAME=PATH` when NAME is one of `names`. A prefix before `=` that names nothing is an
/// error unless it holds a path separator; `./a=b.npy` reads a file with `=` in its name.
fn split_spec<'a>(
    spec: &'a str,
    names: &[&str],
    what: &str,
) -> Result<(Option<&'a str>, &'a Path)> {
    let (name, path) = match spec.split_once('=') {
        Some((name, path)) if names.contains(&name) => (Some(name), path),
        Some((name, _)) if !name.contains(['/', '\\']) => {
            let sigil = if what == "input" { "%" } else { "" };
            let list: Vec<String> = names.iter().map(|n| format!("{sigil}{n}")).collect();
            let list = if list.is_empty() {
                format!("it has no {what}s")
            } else {
                format!("its {what}s: {}", list.join(", "))
            };
            bail!("the graph has no {what} {sigil}{name} ({list})");
        }
        _ => (None, spec),
    };
    if path.is_empty() {
        bail!("--{what} `{spec}` names no file");
    }
    Ok((name, Path::new(path)))
}

/// The output names and files that `--output` asks for, checked against the graph.
fn output_specs(graph: &Graph, specs: &[String]) -> Result<Vec<(String, PathBuf)>> {
    let names: Vec<&str> = graph.outputs().iter().map(|(n, _)| n.as_str()).collect();
    let mut out = Vec::new();
    for spec in specs {
        let (name, path) = split_spec(spec, &names, "output")?;
        let name = match name {
            Some(name) => name,
            None => *names
                .first()
                .ok_or_else(|| anyhow!("the graph has no outputs"))?,
        };
        out.push((name.to_string(), path.to_path_buf()));
    }
    Ok(out)
}

/// The graph's input names, without `%`.
fn input_names(graph: &Graph) -> Vec<&str> {
    graph
        .inputs()
        .iter()
        .map(|i| graph.value_name(i.value))
        .collect()
}

/// Reads the `--input` files, by input name.
fn read_inputs(graph: &Graph, specs: &[String]) -> Result<Vec<(String, Tensor)>> {
    let names = input_names(graph);
    if specs.is_empty() && !names.is_empty() {
        bail!(
            "the graph has inputs ({}): give --input [NAME=]FILE.npy or --random-input SEED",
            names
                .iter()
                .map(|n| format!("%{n}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let mut out: Vec<(String, Tensor)> = Vec::new();
    for spec in specs {
        let (name, path) = split_spec(spec, &names, "input")?;
        let name = match (name, names.as_slice()) {
            (Some(name), _) => name,
            (None, [only]) => only,
            (None, _) => bail!(
                "--input `{spec}`: the graph has {} inputs; give it as NAME=FILE.npy",
                names.len()
            ),
        };
        if out.iter().any(|(n, _)| n == name) {
            bail!("input %{name} is given twice");
        }
        let tensor = io::read_npy(path).with_context(|| format!("input %{name}"))?;
        out.push((name.to_string(), tensor));
    }
    Ok(out)
}

/// Draws every input uniformly from `[-1, 1)`; symbolic dimensions must be bound by `--dims`.
fn random_inputs(loaded: &Loaded, seed: u64) -> Result<Vec<(String, Tensor)>> {
    let graph = &loaded.graph;
    let mut out = Vec::new();
    for input in graph.inputs() {
        let name = graph.value_name(input.value);
        let mut shape = Vec::new();
        let mut unbound = Vec::new();
        for dim in &input.shape {
            match dim.resolve(&loaded.bindings).ok().and_then(|d| d.known()) {
                Some(n) => shape.push(n as usize),
                None => unbound.push(dim.to_string()),
            }
        }
        if !unbound.is_empty() {
            let declared: Vec<String> = input.shape.iter().map(|d| d.to_string()).collect();
            bail!(
                "--random-input cannot draw input %{name} of shape [{}]: bind {} with --dims",
                declared.join(", "),
                unbound.join(", ")
            );
        }
        out.push((
            name.to_string(),
            random_tensor(seed, name, shape, -1.0, 1.0),
        ));
    }
    Ok(out)
}
