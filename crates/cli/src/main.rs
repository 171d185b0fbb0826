//! The `primjit` command-line tool: check, dump and run IR graphs (or ONNX models).
//!
//! Each verb lives in its own module with its clap arguments and a `run` function; errors
//! propagate as `anyhow::Error` to [`main`], which prints them and exits with status 1 (clap's
//! own usage errors exit with status 2).
#![forbid(unsafe_code)]

mod algo;
mod bench;
mod cache;
mod check;
mod dump;
mod executor;
mod import;
mod io;
mod perf;
mod run;
mod source;
mod sweep;

// The workload is the library's, for the benches to read widths as `bench` does.
use primjit_cli::workload;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "primjit", version, about = "A JIT compiler for CNN primitives")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Parse and verify an IR file and print every node's output shape
    Check(check::Args),
    /// Print a graph at a stage of compilation
    Dump(dump::Args),
    /// Import an ONNX model: its graph as IR text, its initializers as safetensors
    Import(import::Args),
    /// Run a graph on inputs from .npy files and write its outputs as .npy files
    Run(run::Args),
    /// Run the variable-width benchmark (the original report's workload) and measure memory
    Bench(bench::Args),
    /// Run a model over the first widths of a workload and print the cache's stats and entries
    Cache(cache::Args),
    /// Run `bench` once per cache configuration, each in a fresh process, and tabulate and plot
    Sweep(sweep::Args),
    /// Measure this core's 128-bit f32 FMA peak with a generated loop
    Peak(perf::PeakArgs),
    /// Time one primitive (a benchdnn descriptor) or every node of a graph against the peak
    BenchOp(perf::BenchOpArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Check(args) => check::run(args),
        Command::Dump(args) => dump::run(args),
        Command::Import(args) => import::run(args),
        Command::Run(args) => run::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Sweep(args) => sweep::run(args),
        Command::Cache(args) => cache::run(args),
        Command::Peak(args) => perf::run_peak(args),
        Command::BenchOp(args) => perf::run_bench_op(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader of our output went away (`primjit dump ... | head`): not an error.
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            match e.downcast_ref::<source::Diagnostic>() {
                Some(diagnostic) => eprintln!("{diagnostic}"),
                None => eprintln!("error: {e:#}"),
            }
            ExitCode::FAILURE
        }
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
