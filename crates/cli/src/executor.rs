//! Executors: the engines that run an optimized graph with its parameters.
//!
//! `run` picks one from its flags; a new engine is a new variant here and a flag there.

use anyhow::{Result, anyhow};
use primjit::{Budget, ConvAlgoChoice};
use primjit_ir::{Graph, Params, Tensor};

/// Which engine runs a graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Executor {
    /// JIT primitives through an engine configured from the environment, with the given
    /// convolution algorithms (the default: `auto`) and the workspace budget given, if any, in
    /// place of `PRIMJIT_WORKSPACE_BUDGET`.
    Jit {
        conv_algo: ConvAlgoChoice,
        /// The vector tier's cap (`--max-isa`), else the environment's.
        max_isa: Option<primjit::Isa>,
        workspace_budget: Option<Budget>,
    },
    /// The reference interpreter: slow, straightforward loops; the oracle.
    Reference,
}

impl Executor {
    /// The engine's name, as messages refer to it.
    pub fn name(self) -> &'static str {
        match self {
            Executor::Jit { .. } => "jit engine",
            Executor::Reference => "reference interpreter",
        }
    }

    /// Runs `graph` with `params` (its declared parameters; derived ones are computed here)
    /// on `inputs`, named without `%`, and returns every output by name. The JIT engine drops
    /// `params` once the compiled graph holds its packed weights, before anything runs.
    pub fn run(
        self,
        graph: &Graph,
        mut params: Params,
        inputs: &[(&str, &Tensor)],
    ) -> Result<Vec<(String, Tensor)>> {
        match self {
            Executor::Jit {
                conv_algo,
                max_isa,
                workspace_budget,
            } => {
                let mut config = primjit::EngineConfig::from_env()?;
                config.max_isa = max_isa.or(config.max_isa);
                if let Some(b) = workspace_budget {
                    config.workspace.budget = b;
                }
                let engine = primjit::Engine::new(config)?;
                let model =
                    primjit::CompiledGraph::with_target(graph, &params, conv_algo, engine.isa())?;
                drop(params);
                let (outputs, _) = model.run(&engine, inputs, &mut primjit::Workspace::new())?;
                Ok(outputs)
            }
            Executor::Reference => {
                params.materialize(graph)?;
                primjit_reference::run_graph(graph, &params, inputs)
                    .map_err(|e| anyhow!("{}: {e}", self.name()))
            }
        }
    }
}
