//! What streaming and the workspace budget cost on the workload, call by call, in one process.
//!
//! A shared machine's speed moves by 10-25% from one minute to the next, more than the few
//! percent this measures, so comparing two `bench` processes says little. Here one process
//! runs each of the workload's widths twice back to back, on the trunk with `dynamic` keys:
//! once as configured (streaming on, the default workspace budget) and once as the reference
//! (streaming off, an unlimited workspace), the order alternating from call to call, after a
//! warm pass that compiles every primitive. It prints the median of the per-call time ratios,
//! over all calls and over the streamed ones, the two configurations' mean and p50 and their
//! ratios, the minor page faults each took, and where the configured run's extra time lies:
//! per group of calls by width (the streamed ones a group of their own), its calls, their
//! median ratio, their extra seconds and share of the reference's total, and the configured
//! run's page faults a call; with two passes or more, each pass's mean and p50 ratios apart
//! (their median and range), so that a claim about the pooled ratios comes with its spread.
//! `--widths FILE` runs other widths (one a line, as `primjit bench --widths`) instead of the
//! workload's.
//!
//! ```text
//! cargo bench -p primjit-cli --bench streaming_cost -- [--n 100] [--widths FILE] [--threads 2]
//!     [--passes 2] [--workspace-budget 8MiB] [--band 128] [--reference-streaming off|on]
//!     [--reference-band 128] [--reference-prefetch on|off] [--nodes] [--verbose]
//! ```
//!
//! `--reference-streaming on` keeps streaming in the reference, so that only the workspace
//! budget differs; `--workspace-budget unlimited`, so that only streaming does. With both,
//! `--reference-band N` compares two bands alone, and `--reference-prefetch off` the kernels'
//! weight prefetches alone: the reference runs on a second engine that compiles without them
//! (`CodegenOptions::prefetch_weights`). `--nodes` prints where the streamed calls' time
//! goes: per node, its kernel time summed over those calls on both sides, and their time
//! outside kernels (splits, joins, copies, bookkeeping).

use std::time::Instant;

use clap::Parser;
use primjit::{Budget, CompiledGraph, Engine, EngineConfig, Params, ShapeMode, Streaming};
use primjit::{Tensor, Workspace};
use primjit_cli::workload::{self, TRUNK_IR};

#[derive(Parser)]
struct Args {
    /// The workload's first N widths
    #[arg(long, default_value_t = 100)]
    n: usize,
    /// Widths, one per line, instead of the workload's
    #[arg(long, value_name = "PATH")]
    widths: Option<std::path::PathBuf>,
    /// Threads per primitive (0: all cores)
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Timed passes over the widths, after the warm one
    #[arg(long, default_value_t = 2)]
    passes: usize,
    /// The configured run's workspace budget (default: the engine's)
    #[arg(long, value_parser = Budget::parse)]
    workspace_budget: Option<Budget>,
    /// The configured run's band, in columns of the first streamed node's output (default:
    /// `Streaming::DEFAULT_BAND`)
    #[arg(long, value_name = "COLUMNS", value_parser = parse_band)]
    band: Option<Streaming>,
    /// Streaming in the reference run (its workspace is unlimited)
    #[arg(long, value_parser = ["off", "on"], default_value = "off")]
    reference_streaming: String,
    /// With `--reference-streaming on`, the reference run's band (default:
    /// `Streaming::DEFAULT_BAND`)
    #[arg(long, value_name = "COLUMNS", value_parser = parse_band)]
    reference_band: Option<Streaming>,
    /// The Winograd kernels' weight prefetches in the reference run (`off`: its own engine,
    /// which compiles without them)
    #[arg(long, value_parser = ["on", "off"], default_value = "on")]
    reference_prefetch: String,
    /// A line per call: its width, both times, and the configured run's minor page faults
    #[arg(long)]
    verbose: bool,
    /// Per node, the time of the streamed calls on both sides (a streamed node's time is the
    /// sum of its band calls), and the time outside kernels
    #[arg(long)]
    nodes: bool,
    /// `cargo bench` passes `--bench`
    #[arg(long, hide = true)]
    bench: bool,
}

/// `--band`: a positive multiple of `stream::COLUMN_ALIGN` columns.
fn parse_band(s: &str) -> Result<Streaming, String> {
    let columns = s
        .parse()
        .map_err(|_| format!("`{s}`: expected a number of columns"))?;
    Streaming::with_band(columns).map_err(|e| e.to_string())
}

/// One configuration: a model, its workspace, its times and page faults.
struct Side {
    model: CompiledGraph,
    workspace: Workspace,
    seconds: Vec<f64>,
    /// Minor page faults of each timed call.
    faults: Vec<u64>,
    /// Per node, its kernel seconds in each timed call, and the names.
    node_seconds: Vec<Vec<f64>>,
    node_names: Vec<String>,
}

impl Side {
    /// Runs the trunk on `x`: its time, whether it streamed, and its minor page faults.
    fn run(&mut self, engine: &Engine, x: &Tensor, timed: bool) -> Result<(f64, bool, u64), Error> {
        let before = minor_faults();
        let start = Instant::now();
        let (_, stats) = self.model.run(engine, &[("x", x)], &mut self.workspace)?;
        let seconds = start.elapsed().as_secs_f64();
        let faults = minor_faults().saturating_sub(before);
        if timed {
            self.seconds.push(seconds);
            self.faults.push(faults);
            self.node_seconds
                .push(stats.nodes.iter().map(|n| n.seconds).collect());
            if self.node_names.is_empty() {
                self.node_names = stats.nodes.iter().map(|n| n.name.clone()).collect();
            }
        }
        Ok((seconds, !stats.segments.is_empty(), faults))
    }
}

/// The process's minor page faults so far (`/proc/self/stat`, field 10), 0 where unreadable.
fn minor_faults() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The command name (field 2) may hold spaces; the fields after it are plain.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(7))
        .and_then(|f| f.parse().ok())
        .unwrap_or(0)
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len() as f64
}

type Error = Box<dyn std::error::Error>;

fn main() -> Result<(), Error> {
    let args = Args::parse();
    // Read as `primjit bench --widths` reads them, with the same errors.
    let mut widths = workload::load_widths(args.widths.as_deref()).map_err(|e| format!("{e:#}"))?;
    widths.truncate(args.n);
    if widths.is_empty() || args.passes == 0 {
        return Err("--n and --passes must be at least 1".into());
    }
    let graph = primjit::ir::parse(TRUNK_IR)?;
    let params = Params::random(&graph, 0);
    let mut config = EngineConfig::from_env()?;
    config.threads = args.threads;
    let engine = Engine::new(config.clone())?;
    let reference_engine = match args.reference_prefetch.as_str() {
        "off" => {
            config.codegen.prefetch_weights = false;
            Some(Engine::new(config)?)
        }
        _ => None,
    };
    let reference_engine = reference_engine.as_ref().unwrap_or(&engine);
    let model = CompiledGraph::new(&graph, &params)?.with_mode(ShapeMode::Runtime);
    let reference_streaming = match (args.reference_streaming.as_str(), args.reference_band) {
        ("on", band) => band.unwrap_or(Streaming::ON),
        (_, None) => Streaming::OFF,
        (_, Some(_)) => return Err("--reference-band needs --reference-streaming on".into()),
    };
    let mut configured = Side {
        model: model
            .clone()
            .with_streaming(args.band.unwrap_or(Streaming::ON)),
        workspace: args
            .workspace_budget
            .map_or_else(Workspace::new, Workspace::with_budget),
        seconds: Vec::new(),
        faults: Vec::new(),
        node_seconds: Vec::new(),
        node_names: Vec::new(),
    };
    let mut reference = Side {
        model: model.with_streaming(reference_streaming),
        workspace: Workspace::with_budget(Budget::Unlimited),
        seconds: Vec::new(),
        faults: Vec::new(),
        node_seconds: Vec::new(),
        node_names: Vec::new(),
    };
    let mut streamed = Vec::new();
    let mut timed_widths = Vec::new();
    for pass in 0..=args.passes {
        for (i, &w) in widths.iter().enumerate() {
            let data = (0..3 * 320 * w)
                .map(|k| ((k * 7919) % 1000) as f32 / 1000.0)
                .collect();
            let x = Tensor::new(vec![1, 3, 320, w], data)?;
            let timed = pass > 0;
            let ((a, was_streamed, faults), (b, _, _)) = if (i + pass) % 2 == 0 {
                let a = configured.run(&engine, &x, timed)?;
                (a, reference.run(reference_engine, &x, timed)?)
            } else {
                let b = reference.run(reference_engine, &x, timed)?;
                (configured.run(&engine, &x, timed)?, b)
            };
            if timed {
                streamed.push(was_streamed);
                timed_widths.push(w);
                if args.verbose {
                    println!(
                        "W={w}: {a:.4} s against {b:.4} s, ratio {:.3}, {faults} page faults",
                        a / b
                    );
                }
            }
        }
    }
    let ratios: Vec<f64> = configured
        .seconds
        .iter()
        .zip(&reference.seconds)
        .map(|(a, b)| a / b)
        .collect();
    let streamed_ratios: Vec<f64> = ratios
        .iter()
        .zip(&streamed)
        .filter(|(_, s)| **s)
        .map(|(r, _)| *r)
        .collect();
    let (a, b) = (&configured.seconds, &reference.seconds);
    println!(
        "{} calls ({} streamed), {} threads; reference: streaming {}, unlimited workspace, \
         weight prefetches {}",
        ratios.len(),
        streamed_ratios.len(),
        engine.threads(),
        match reference_streaming.band() {
            Some(band) => format!("on (bands of {band} columns)"),
            None => "off".to_string(),
        },
        args.reference_prefetch
    );
    let streamed_median = match streamed_ratios.is_empty() {
        true => "no call streamed".to_string(),
        false => format!("{:.4} over the streamed ones", median(&streamed_ratios)),
    };
    println!(
        "median ratio per call: {:.4} over all calls, {streamed_median}",
        median(&ratios),
    );
    println!(
        "mean {:.4} s against {:.4} s: {:.4}; p50 {:.4} s against {:.4} s: {:.4}",
        mean(a),
        mean(b),
        mean(a) / mean(b),
        median(a),
        median(b),
        median(a) / median(b)
    );
    println!(
        "minor page faults: {} against {}",
        configured.faults.iter().sum::<u64>(),
        reference.faults.iter().sum::<u64>()
    );
    print_passes(a, b, widths.len());
    print_groups(&configured, &reference, &timed_widths, &streamed);
    if args.nodes {
        print_nodes(&configured, &reference, &streamed)?;
    }
    Ok(())
}

/// The mean and p50 ratios of each timed pass apart: their median and range. One pass's mean
/// ratio moves by a point or two with the host, its p50 ratio by several, so a claim about the
/// pooled ratios needs their spread (an A/A run, `--reference-streaming on --workspace-budget
/// unlimited`, shows the floor).
fn print_passes(configured: &[f64], reference: &[f64], calls_per_pass: usize) {
    if configured.len() < 2 * calls_per_pass {
        return;
    }
    let (means, p50s): (Vec<f64>, Vec<f64>) = configured
        .chunks(calls_per_pass)
        .zip(reference.chunks(calls_per_pass))
        .map(|(a, b)| (mean(a) / mean(b), median(a) / median(b)))
        .unzip();
    let spread = |v: &[f64]| {
        let mut sorted = v.to_vec();
        sorted.sort_by(f64::total_cmp);
        let mid = sorted.len() / 2;
        // Few passes: an even count's median is the mean of its middle two.
        let middle = match sorted.len() % 2 {
            0 => (sorted[mid - 1] + sorted[mid]) / 2.0,
            _ => sorted[mid],
        };
        format!(
            "median {middle:.4} (from {:.4} to {:.4})",
            sorted[0],
            sorted[sorted.len() - 1]
        )
    };
    println!(
        "per pass ({} of {calls_per_pass} calls): mean ratio {}; p50 ratio {}",
        means.len(),
        spread(&means),
        spread(&p50s)
    );
}

/// The calls of each width group (the streamed ones apart): how many, their median ratio,
/// their extra seconds and its share of the reference's total, and the configured run's page
/// faults a call. The mean's ratio is the groups' shares summed, plus one.
fn print_groups(configured: &Side, reference: &Side, widths: &[usize], streamed: &[bool]) {
    const BOUNDS: [(usize, usize); 4] = [(0, 299), (300, 699), (700, 1499), (1500, usize::MAX)];
    let total: f64 = reference.seconds.iter().sum();
    let groups = BOUNDS
        .iter()
        .map(|&(lo, hi)| {
            let label = match (lo, hi) {
                (0, _) => format!("W<={hi}, unstreamed"),
                (_, usize::MAX) => format!("W>={lo}, unstreamed"),
                _ => format!("W={lo}-{hi}, unstreamed"),
            };
            let calls: Vec<usize> = (0..widths.len())
                .filter(|&c| !streamed[c] && (lo..=hi).contains(&widths[c]))
                .collect();
            (label, calls)
        })
        .chain(std::iter::once((
            "streamed".to_string(),
            (0..widths.len()).filter(|&c| streamed[c]).collect(),
        )));
    println!(
        "by width: group, calls, median ratio, extra s (share of the reference's total), faults a call"
    );
    for (label, calls) in groups {
        if calls.is_empty() {
            continue;
        }
        let ratios: Vec<f64> = calls
            .iter()
            .map(|&c| configured.seconds[c] / reference.seconds[c])
            .collect();
        let extra: f64 = calls
            .iter()
            .map(|&c| configured.seconds[c] - reference.seconds[c])
            .sum();
        let faults: u64 = calls.iter().map(|&c| configured.faults[c]).sum();
        println!(
            "{label:<24} {:>4} {:>7.3} {extra:>+8.3} ({:+.2}%) {:>7}",
            calls.len(),
            median(&ratios),
            100.0 * extra / total,
            faults / calls.len() as u64
        );
    }
}

/// Per node, the summed kernel time of the streamed calls on both sides, then the time of
/// those calls outside their kernels.
fn print_nodes(configured: &Side, reference: &Side, streamed: &[bool]) -> Result<(), Error> {
    if configured.node_names != reference.node_names {
        return Err("the two runs report different nodes".into());
    }
    if !streamed.contains(&true) {
        println!("no call streamed: no per-node times");
        return Ok(());
    }
    let sum = |side: &Side, node: Option<usize>| -> f64 {
        (0..streamed.len())
            .filter(|&c| streamed[c])
            .map(|c| match node {
                Some(n) => side.node_seconds[c][n],
                None => side.seconds[c] - side.node_seconds[c].iter().sum::<f64>(),
            })
            .sum()
    };
    println!("streamed calls, seconds in all: node, configured, reference, ratio");
    for (n, name) in configured.node_names.iter().enumerate() {
        let (a, b) = (sum(configured, Some(n)), sum(reference, Some(n)));
        println!("{name:<22} {a:8.4} {b:8.4} {:6.3}", a / b);
    }
    let (a, b) = (sum(configured, None), sum(reference, None));
    println!("{:<22} {a:8.4} {b:8.4} {:6.3}", "outside kernels", a / b);
    Ok(())
}
