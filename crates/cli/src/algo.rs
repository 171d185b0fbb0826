//! The `--conv-algo` and `--max-isa` options of the verbs that compile kernels.

use anyhow::Result;
use primjit::{ConvAlgoChoice, EngineConfig, Isa};

/// Which convolution algorithm the graph's or descriptor's convolutions use.
#[derive(Clone, Debug, clap::Args)]
pub struct AlgoArgs {
    /// Convolution algorithm: `direct`, `winograd` (wherever it applies: 3x3, stride 1 or 2,
    /// no groups) or `auto` (Winograd where it is faster); default: `PRIMJIT_CONV_ALGO`, else
    /// `auto`
    #[arg(long = "conv-algo", value_name = "ALGO", value_parser = parse_algo)]
    pub conv_algo: Option<ConvAlgoChoice>,
    /// The widest vector tier of the kernels: `x128`, `avx2` or `avx512` (as oneDNN's
    /// `ONEDNN_MAX_CPU_ISA`); default: `PRIMJIT_MAX_ISA`, else the host's widest. A tier above
    /// the host's is an error that names the host's tiers
    #[arg(long = "max-isa", value_name = "TIER", value_parser = parse_isa)]
    pub max_isa: Option<Isa>,
}

fn parse_isa(text: &str) -> Result<Isa, String> {
    text.parse().map_err(|e: primjit::IsaError| e.to_string())
}

fn parse_algo(text: &str) -> Result<ConvAlgoChoice, String> {
    text.parse()
        .map_err(|e: primjit::codegen::UnknownConvAlgo| e.to_string())
}

impl AlgoArgs {
    /// The flag, else `PRIMJIT_CONV_ALGO` (an error when malformed), else `auto`.
    pub fn choice(&self) -> Result<ConvAlgoChoice> {
        match self.conv_algo {
            Some(c) => Ok(c),
            None => Ok(EngineConfig::from_env()?.conv_algo),
        }
    }

    /// The cap: the flag, else `PRIMJIT_MAX_ISA` (an error when malformed), else none.
    pub fn max_isa(&self) -> Result<Option<Isa>> {
        match self.max_isa {
            Some(t) => Ok(Some(t)),
            None => Ok(EngineConfig::from_env()?.max_isa),
        }
    }

    /// The tier kernels are compiled for: the host's under the cap (an error naming the
    /// host's tiers when the cap is above them).
    pub fn isa(&self) -> Result<Isa> {
        Ok(Isa::capped(Isa::host(), self.max_isa()?)?)
    }
}
