//! The `--conv-algo` option of the verbs that compile convolutions.

use anyhow::Result;
use primjit::{ConvAlgoChoice, EngineConfig};

/// Which convolution algorithm the graph's or descriptor's convolutions use.
#[derive(Clone, Debug, clap::Args)]
pub struct AlgoArgs {
    /// Convolution algorithm: `direct`, `winograd` (wherever it applies: 3x3, stride 1 or 2,
    /// no groups) or `auto` (Winograd where it is faster); default: `PRIMJIT_CONV_ALGO`, else
    /// `auto`
    #[arg(long = "conv-algo", value_name = "ALGO", value_parser = parse_algo)]
    pub conv_algo: Option<ConvAlgoChoice>,
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
}
