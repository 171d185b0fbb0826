//! The throughput of one model called from several threads at once, against one thread.
//!
//! One engine (1 thread by default, as a server running a request per core would use) and one
//! compiled trunk (`dynamic` keys, random parameters) serve every caller; each caller has its
//! own workspace and makes `--calls` calls at the widths given, cycling through them. A round
//! times one caller alone, then `--callers` callers at once, and prints both throughputs (calls
//! a second) and their ratio; after `--rounds` rounds, the median ratio. A warm-up pass
//! compiles every primitive first, so that only running is timed.
//!
//! Each half also prints the process's CPU time over its wall time (`cpu`): about 1 for one
//! caller of a 1-thread engine, and about the number of callers when their calls run at once
//! (about 1 again if they were queued one behind the other). On a machine that other work
//! shares, the throughput ratio falls with the cores it leaves, while `cpu` still shows
//! whether the calls overlapped.
//!
//! ```text
//! cargo bench -p primjit-cli --bench concurrent_calls -- [--engine-threads 1] [--callers 2]
//!     [--widths 232,200,300] [--calls 12] [--rounds 3]
//! ```

use std::sync::Barrier;
use std::time::Instant;

use clap::Parser;
use primjit::{CompiledGraph, Engine, EngineConfig, Params, ShapeMode, Tensor, Workspace};
use primjit_cli::workload::TRUNK_IR;

#[derive(Parser)]
struct Args {
    /// Threads of the one engine every caller shares
    #[arg(long, default_value_t = 1)]
    engine_threads: usize,
    /// Threads calling the model at once in the concurrent half of a round
    #[arg(long, default_value_t = 2)]
    callers: usize,
    /// Input widths, cycled through by every caller (the workload's median is 232)
    #[arg(long, value_delimiter = ',', default_value = "232,200,300")]
    widths: Vec<usize>,
    /// Calls per caller in each half of a round
    #[arg(long, default_value_t = 12)]
    calls: usize,
    /// Rounds of one caller alone, then the callers at once
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// `cargo bench` passes `--bench`
    #[arg(long, hide = true)]
    bench: bool,
}

type Error = Box<dyn std::error::Error>;

/// The process's user and system CPU seconds so far (`/proc/self/stat`, fields 14 and 15, in
/// the kernel's 100 ticks a second), 0 where unreadable.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The command name (field 2) may hold spaces; the fields after it are plain.
    let ticks: u64 = stat
        .rsplit_once(')')
        .map(|(_, rest)| {
            rest.split_whitespace()
                .skip(11)
                .take(2)
                .filter_map(|f| f.parse::<u64>().ok())
                .sum()
        })
        .unwrap_or(0);
    ticks as f64 / 100.0
}

/// `callers` threads each make `calls` calls at once on `model`; returns the calls a second
/// over all of them, from the moment all have started to the moment the last ends, and the
/// process's CPU seconds over those wall seconds.
fn throughput(
    engine: &Engine,
    model: &CompiledGraph,
    inputs: &[Tensor],
    callers: usize,
    calls: usize,
) -> Result<(f64, f64), Error> {
    let start_line = Barrier::new(callers + 1);
    let mut cpu_start = 0.0;
    let seconds = std::thread::scope(|s| -> Result<f64, Error> {
        let handles: Vec<_> = (0..callers)
            .map(|caller| {
                let start_line = &start_line;
                s.spawn(move || -> Result<(), String> {
                    let mut ws = Workspace::new();
                    start_line.wait();
                    for i in 0..calls {
                        let x = &inputs[(caller + i) % inputs.len()];
                        model
                            .run(engine, &[("x", x)], &mut ws)
                            .map_err(|e| e.to_string())?;
                    }
                    Ok(())
                })
            })
            .collect();
        start_line.wait();
        cpu_start = cpu_seconds();
        let start = Instant::now();
        for h in handles {
            h.join().map_err(|_| "a caller panicked")??;
        }
        Ok(start.elapsed().as_secs_f64())
    })?;
    let cpu = (cpu_seconds() - cpu_start) / seconds;
    Ok(((callers * calls) as f64 / seconds, cpu))
}

fn main() -> Result<(), Error> {
    let args = Args::parse();
    if args.widths.is_empty() || args.calls == 0 || args.rounds == 0 || args.callers == 0 {
        return Err("--widths, --calls, --rounds and --callers must be at least 1".into());
    }
    let graph = primjit::ir::parse(TRUNK_IR)?;
    let params = Params::random(&graph, 0);
    let model = CompiledGraph::new(&graph, &params)?.with_mode(ShapeMode::Runtime);
    drop(params);
    let engine = Engine::new(EngineConfig {
        threads: args.engine_threads,
        ..EngineConfig::from_env()?
    })?;
    let inputs: Vec<Tensor> = args
        .widths
        .iter()
        .map(|&w| primjit::ir::random_tensor(w as u64, "x", vec![1, 3, 320, w], -1.0, 1.0))
        .collect();
    // Compile every primitive before anything is timed.
    throughput(&engine, &model, &inputs, 1, inputs.len())?;
    println!(
        "trunk (dynamic), engine of {} thread{}, widths {:?}, {} calls per caller, {} cores",
        engine.threads(),
        if engine.threads() == 1 { "" } else { "s" },
        args.widths,
        args.calls,
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    let mut ratios = Vec::with_capacity(args.rounds);
    for round in 1..=args.rounds {
        let (one, one_cpu) = throughput(&engine, &model, &inputs, 1, args.calls)?;
        let (many, many_cpu) = throughput(&engine, &model, &inputs, args.callers, args.calls)?;
        println!(
            "round {round}: 1 caller {one:.2} calls/s (cpu {one_cpu:.2}), {} callers {many:.2} \
             calls/s (cpu {many_cpu:.2}), ratio {:.2}x",
            args.callers,
            many / one
        );
        ratios.push(many / one);
    }
    ratios.sort_by(f64::total_cmp);
    println!(
        "median ratio over {} rounds: {:.2}x (range {:.2}-{:.2})",
        ratios.len(),
        ratios[ratios.len() / 2],
        ratios[0],
        ratios[ratios.len() - 1]
    );
    Ok(())
}
