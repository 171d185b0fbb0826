//! `primjit bench`: the variable-width benchmark of the original report, on JIT primitives.
//!
//! Each call runs the model at batch 1 on a `1x3x320xW` input with the call's width from the
//! workload, under a shape policy, through one engine whose cache and workspace are bounded as
//! asked. Memory is measured as the report did: `VmRSS` after each call minus `VmRSS` after the
//! first call; the harness allocates nothing per call (`workload::Inputs`, `run_into`), so the
//! growth is the library's.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use primjit::{
    Budget, CacheConfig, CompiledGraph, ConvAlgoChoice, Engine, EngineConfig, Params, PrimitiveKey,
    RunStats, SegmentRun, ShapeMode, Streaming, Tensor, TensorView, Workspace, WorkspaceStats,
};
use serde::Serialize;

use crate::algo::AlgoArgs;
use crate::source::Source;
use crate::workload::{self, Inputs, Policy, crop_width, hwm_kb, percentile, rss_kb, thousands};

/// What `bench` and `sweep` run: a model over the first widths of a workload.
#[derive(Debug, clap::Args)]
pub struct Workload {
    /// The model (default: the shipped ResNet34 trunk, ir/resnet34_trunk.ir)
    #[arg(value_name = "FILE.ir")]
    pub file: Option<PathBuf>,

    /// Widths, one per line (default: the shipped workload, benches/data/widths.txt)
    #[arg(long, value_name = "PATH")]
    pub widths: Option<PathBuf>,

    /// How many calls, from the start of the widths (the full workload is 1000)
    #[arg(long, default_value_t = 100, value_parser = workload::parse_calls)]
    pub n: usize,

    /// Threads per primitive (default: all cores)
    #[arg(long, default_value_t = 0, value_parser = workload::parse_count)]
    pub threads: usize,
}

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub workload: Workload,

    /// How a call's width becomes the width the model runs at (default `dynamic`, one primitive
    /// per node for every width; `exact` compiles one per node and width, the report's regime)
    #[arg(long, value_enum, default_value_t = Policy::Dynamic)]
    pub policy: Policy,

    /// The cache's byte budget: 64MiB, 512KiB, 0 (no caching) or unlimited (default 64MiB, or
    /// PRIMJIT_CACHE_BUDGET)
    #[arg(long, value_parser = Budget::parse)]
    pub budget: Option<Budget>,

    /// An entry-count bound applied with the budget, as oneDNN's cache capacity
    #[arg(long, value_parser = workload::parse_count)]
    pub capacity: Option<usize>,

    /// The most bytes of activation buffers kept between calls: 16MiB, 0 (none) or unlimited
    /// (default: PRIMJIT_WORKSPACE_BUDGET, else the built-in default)
    #[arg(long, value_parser = Budget::parse)]
    pub workspace_budget: Option<Budget>,

    /// Write the summary and every call's record as JSON (see docs/cli.md)
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,

    /// No progress bar
    #[arg(long)]
    pub quiet: bool,

    /// Seed of the parameters and inputs
    #[arg(long, default_value_t = 0)]
    pub seed: u64,

    /// Untimed calls at the first width before the timed ones, as the peers' harness
    /// (`../shared/peers/bench_peer.py`) makes one; 0 times the first call cold, compiles
    /// included
    #[arg(long, value_name = "CALLS", default_value_t = 1)]
    pub warm_up: usize,

    /// With a bucket or the dynamic policy, how many of the first calls to compare against
    /// `exact` after the timed run
    #[arg(long, default_value_t = 2)]
    pub check_calls: usize,

    #[command(flatten)]
    pub algo: AlgoArgs,

    /// Run the leading convolutions in column bands (`on`) or as whole tensors (`off`); the
    /// results are the same to the bit. Default: on with `dynamic`, off with the policies that
    /// specialize on widths, where each band's width and borders would be one more primitive
    #[arg(long, value_name = "on|off", value_parser = parse_streaming)]
    pub streaming: Option<Streaming>,

    /// The band width with streaming on (help: [`stream_band_help`])
    #[arg(long, value_name = "COLUMNS", help = stream_band_help())]
    pub stream_band: Option<usize>,

    /// The streaming threshold with streaming on (help: [`stream_above_help`])
    #[arg(long, value_name = "BYTES", value_parser = Budget::parse, help = stream_above_help())]
    pub stream_above: Option<Budget>,
}

/// `--stream-band`'s help, with the library's default band, so that it cannot go stale.
fn stream_band_help() -> String {
    format!(
        "With streaming on, the band width in columns of the first streamed layer's output (a \
         multiple of 4; default {})",
        Streaming::DEFAULT_BAND
    )
}

/// `--stream-above`'s help, with the library's default threshold.
fn stream_above_help() -> String {
    format!(
        "With streaming on, stream only calls whose whole tensors would take more than this \
         (`{}`, the default; `0`: every call more than four bands wide)",
        Budget::Bytes(Streaming::DEFAULT_ABOVE)
    )
}

impl Args {
    /// `--streaming`, `--stream-band` and `--stream-above` applied to the graph's own choice
    /// (`default`), or `None` when none is given.
    fn stream_settings(&self, default: Streaming) -> Result<Option<Streaming>> {
        streaming_from_flags(default, self.streaming, self.stream_band, self.stream_above)
    }
}

/// The streaming that `--streaming`, `--stream-band` and `--stream-above` ask for over
/// `default`, or `None` when no flag is given.
pub fn streaming_from_flags(
    default: Streaming,
    streaming: Option<Streaming>,
    band: Option<usize>,
    above: Option<Budget>,
) -> Result<Option<Streaming>> {
    if streaming.is_none() && band.is_none() && above.is_none() {
        return Ok(None);
    }
    // A malformed band is an error even where streaming is off.
    let band = band.map(Streaming::with_band).transpose()?;
    let mut s = streaming.unwrap_or(default);
    if s.band().is_none() {
        return Ok(Some(s));
    }
    if let Some(b) = band {
        s = b.above(s.threshold());
    }
    if let Some(a) = above {
        s = s.above(match a {
            Budget::Bytes(b) => b,
            Budget::Unlimited => usize::MAX,
        });
    }
    Ok(Some(s))
}

pub fn parse_streaming(text: &str) -> Result<Streaming, String> {
    text.parse()
        .map_err(|e: primjit::stream::UnknownStreaming| e.to_string())
}

/// A streamed segment of one call (`primjit::SegmentRun`), as the report records it.
#[derive(Debug, Serialize)]
pub struct SegmentReport {
    /// The names of its first and last nodes.
    pub first: String,
    pub last: String,
    pub sweeps: usize,
    pub calls: usize,
    pub window_bytes: usize,
    pub whole_bytes: usize,
    pub peak_bytes: usize,
}

impl From<&SegmentRun> for SegmentReport {
    fn from(s: &SegmentRun) -> Self {
        SegmentReport {
            first: s.first.clone(),
            last: s.last.clone(),
            sweeps: s.sweeps,
            calls: s.calls,
            window_bytes: s.window_bytes,
            whole_bytes: s.whole_bytes,
            peak_bytes: s.peak_bytes,
        }
    }
}

/// Compile times of one convolution algorithm's primitives (`other`: pooling and the rest).
#[derive(Debug, Serialize)]
pub struct AlgoCompile {
    pub algo: &'static str,
    pub primitives: usize,
    pub total_s: f64,
    pub max_s: f64,
}

/// One call of the benchmark.
#[derive(Debug, Serialize)]
pub struct CallRecord {
    pub call: usize,
    pub width: usize,
    pub run_width: usize,
    pub seconds: f64,
    pub cache_bytes: usize,
    pub rss_kb: u64,
    pub compiles: u64,
    /// Bytes the workspace holds after the call.
    pub workspace_bytes: usize,
}

/// How far a bucket policy's cropped outputs (or the dynamic policy's outputs) are from
/// `exact`: the largest absolute difference, and that difference relative to the largest
/// magnitude of the exact output.
#[derive(Debug, Serialize)]
pub struct BucketError {
    pub calls_checked: usize,
    pub max_abs: f64,
    pub max_rel: f64,
}

/// Everything `bench` measures; the JSON output is this struct.
#[derive(Debug, Serialize)]
pub struct BenchReport {
    pub model: String,
    pub policy: Policy,
    pub budget: String,
    pub capacity: Option<usize>,
    pub threads: usize,
    pub calls: usize,
    pub time_mean_s: f64,
    pub time_p50_s: f64,
    pub time_p95_s: f64,
    /// Untimed calls at the first width before the timed ones, and their total seconds.
    pub warm_up_calls: usize,
    pub warm_up_s: f64,
    pub rss_initial_kb: u64,
    pub rss_growth_kb: i64,
    /// `(calls, growth kB)` every 100 calls.
    pub growth_every_100: Vec<(usize, i64)>,
    pub compiles: u64,
    pub failed_compiles: u64,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub evicted_bytes: u64,
    pub cache_entries: usize,
    pub cache_bytes: usize,
    pub cache_peak_bytes: usize,
    pub peak_activation_bytes: usize,
    /// `on` or `off`, and the band width in columns (0 when off).
    pub streaming: String,
    pub stream_band: usize,
    /// The streamed segments of the call with the largest peak activation bytes.
    pub peak_call_segments: Vec<SegmentReport>,
    pub workspace_budget: String,
    /// Bytes of activation buffers the workspace holds after the last call.
    pub workspace_bytes: usize,
    pub workspace_peak_bytes: usize,
    /// Bytes of activation buffers returned to the operating system over the run.
    pub workspace_returned_bytes: u64,
    /// The process's peak resident set size (`VmHWM`) at the end of the timed calls.
    pub vmhwm_kb: u64,
    pub compile_time_s: f64,
    pub max_compile_time_s: f64,
    pub bucket_error: Option<BucketError>,
    /// Distinct primitive keys over the graph's nodes for the widths run (after the policy's
    /// padding): for `dynamic`, its node configurations.
    pub node_configurations: usize,
    /// The convolution algorithm choice (`direct`, `winograd`, `auto`).
    pub conv_algo: String,
    /// Bytes of weights packed for direct kernels, and of Winograd-transformed weights.
    pub weight_bytes_direct: usize,
    pub weight_bytes_winograd: usize,
    /// Per algorithm, the compile time of the distinct primitives the run used: total and
    /// largest seconds, and their count.
    pub compile_by_algo: Vec<AlgoCompile>,
    pub per_call: Vec<CallRecord>,
    /// The command that runs onnxruntime on the same workload, where the peers' harness can
    /// take the model (`peer_command`); printed, not written to the JSON.
    #[serde(skip)]
    pub peer_command: Option<String>,
}

/// The model's text and the name it is reported under.
pub fn model_source(file: Option<&PathBuf>) -> Result<Source> {
    match file {
        Some(p) => Source::read(p),
        None => Ok(Source::ir("ir/resnet34_trunk.ir", workload::TRUNK_IR)),
    }
}

/// The graph's single input and its fixed dimensions; its width must be a symbol.
fn width_symbol(graph: &primjit_ir::Graph) -> Result<(String, [usize; 3])> {
    let [input] = graph.inputs() else {
        bail!("the benchmark needs a graph with exactly one input")
    };
    let name = graph.value_name(input.value).to_string();
    let dims = &input.shape;
    let fixed: Option<Vec<usize>> = dims[..dims.len().saturating_sub(1)]
        .iter()
        .map(|d| d.known().map(|n| n as usize))
        .collect();
    match (dims.len(), dims.last(), fixed) {
        (4, Some(primjit_ir::Dim::Sym(_)), Some(f)) => Ok((name, [f[0], f[1], f[2]])),
        _ => bail!(
            "the benchmark varies the width: the input must be f32[N, C, H, W] with only W symbolic"
        ),
    }
}

pub fn run(args: &Args) -> Result<()> {
    let (report, _) = bench(args)?;
    print_summary(&mut std::io::stdout().lock(), &report)?;
    if let Some(path) = &args.json {
        let file = std::fs::File::create(path)
            .with_context(|| format!("cannot write {}", path.display()))?;
        serde_json::to_writer_pretty(std::io::BufWriter::new(file), &report)?;
    }
    Ok(())
}

/// Runs the benchmark; returns its report and the engine, whose cache holds what the run left.
pub fn bench(args: &Args) -> Result<(BenchReport, Engine)> {
    let setup = Setup::new(args)?;
    let mut out = std::io::stdout().lock();
    setup.print_header(&mut out, args)?;
    let timed = time_calls(&mut out, args, &setup)?;
    let report = setup.report(args, timed)?;
    print_report(&mut out, args, &report)?;
    Ok((report, setup.engine))
}

/// What a benchmark runs: the model compiled for its engine, at the workload's widths.
struct Setup {
    source: Source,
    /// The input's name and its dimensions other than the width.
    input_name: String,
    input: [usize; 3],
    /// The widths of the calls, the first `--n` of the workload.
    widths: Vec<usize>,
    config: EngineConfig,
    engine: Engine,
    model: CompiledGraph,
    conv_algo: ConvAlgoChoice,
}

/// What the calls of a benchmark measured, warm-up included.
struct Timed {
    records: Vec<CallRecord>,
    /// The RSS growth after every 100 calls.
    growth: Vec<(usize, i64)>,
    /// The RSS after the warm-up, or after the first call when there is none.
    rss_first: u64,
    peak_activation: usize,
    /// The streamed segments of the call with the most activation bytes.
    peak_segments: Vec<SegmentReport>,
    /// The workspace after the last call.
    workspace: WorkspaceStats,
    warm_up_seconds: f64,
    total_seconds: f64,
    /// The compile time of each distinct primitive the calls ran.
    configurations: HashMap<PrimitiveKey, Duration>,
    vmhwm_kb: u64,
    /// The calls' inputs, for the check against exact runs.
    inputs: Inputs,
}

impl Setup {
    /// Loads and verifies the model, reads the workload, and compiles the model for an engine
    /// configured from the environment and `args`.
    fn new(args: &Args) -> Result<Self> {
        let mut source = model_source(args.workload.file.as_ref())?;
        let graph = source.parse()?;
        // Verified before parameters are drawn for it: verification bounds every parameter's
        // size, which `Params::random` allocates as declared.
        graph.verify().map_err(|e| source.diagnose(e))?;
        let (input_name, [n, c, h]) = width_symbol(&graph)?;
        let mut widths = workload::load_widths(args.workload.widths.as_deref())?;
        if args.workload.n == 0 || args.workload.n > widths.len() {
            bail!(
                "--n must be between 1 and the {} widths of the workload, found {}",
                widths.len(),
                args.workload.n
            );
        }
        widths.truncate(args.workload.n);

        let mut config = EngineConfig::from_env()?;
        config.cache = CacheConfig {
            budget: args.budget.unwrap_or(config.cache.budget),
            capacity: args.capacity.or(config.cache.capacity),
        };
        if let Some(b) = args.workspace_budget {
            config.workspace.budget = b;
        }
        config.threads = args.workload.threads;
        config.max_isa = args.algo.max_isa()?;
        let engine = Engine::new(config.clone())?;
        // An ONNX model runs with its own weights; an IR file with seeded ones. Once packed they
        // are dropped: the model's packed weights are the only copy the timed calls see.
        let params = source
            .take_initializers()
            .unwrap_or_else(|| Params::random(&graph, args.seed));
        let conv_algo = args.algo.conv_algo.unwrap_or(config.conv_algo);
        let model = CompiledGraph::with_target(&graph, &params, conv_algo, engine.isa())
            .map_err(|e| anyhow::anyhow!("{}: {e}", source.path))?;
        drop(params);
        let model = match args.policy {
            Policy::Dynamic => model.with_mode(ShapeMode::Runtime),
            _ => model,
        };
        // `--streaming` overrides the graph's choice (on for `dynamic`, whose keys take widths at
        // run time; off for the policies that specialize on widths).
        let model = match args.stream_settings(model.streaming())? {
            Some(s) => model.with_streaming(s),
            None => model,
        };

        Ok(Setup {
            source,
            input_name,
            input: [n, c, h],
            widths,
            config,
            engine,
            model,
            conv_algo,
        })
    }

    /// The lines before the calls: the workload's widths and what runs them.
    fn print_header(&self, out: &mut impl Write, args: &Args) -> Result<()> {
        let (widths, source, config, engine) =
            (&self.widths, &self.source, &self.config, &self.engine);
        let sorted = {
            let mut s: Vec<f64> = widths.iter().map(|&w| w as f64).collect();
            s.sort_by(f64::total_cmp);
            s
        };
        writeln!(
            out,
            "widths: mean={:.0}, p50={} p95={} max={}",
            sorted.iter().sum::<f64>() / sorted.len() as f64,
            percentile(&sorted, 50.0),
            percentile(&sorted, 95.0),
            sorted.last().copied().unwrap_or(0.0)
        )?;
        writeln!(
            out,
            "model={} policy={} budget={} capacity={} workspace_budget={} threads={}",
            source.path,
            args.policy.name(),
            config.cache.budget,
            config
                .cache
                .capacity
                .map_or("none".to_string(), |c| c.to_string()),
            config.workspace.budget,
            engine.threads()
        )?;
        Ok(())
    }

    /// The report of the calls `timed` measured, with the error against exact runs where the
    /// policy pads.
    fn report(&self, args: &Args, timed: Timed) -> Result<BenchReport> {
        let Setup {
            source,
            input_name,
            input,
            widths,
            config,
            engine,
            model,
            conv_algo,
        } = self;
        let Timed {
            records,
            growth,
            rss_first,
            peak_activation,
            peak_segments,
            workspace,
            warm_up_seconds,
            total_seconds,
            configurations,
            vmhwm_kb,
            mut inputs,
        } = timed;
        let mut times: Vec<f64> = records.iter().map(|r| r.seconds).collect();
        times.sort_by(f64::total_cmp);
        let rss_last = records.last().map_or(0, |r| r.rss_kb);
        let stats = engine.cache().stats();
        let bucket_error = if args.policy != Policy::Exact && args.check_calls > 0 {
            Some(bucket_error(
                model,
                input_name,
                args,
                widths,
                &mut inputs,
                config,
            )?)
        } else {
            None
        };
        let report = BenchReport {
            model: source.path.clone(),
            policy: args.policy,
            budget: config.cache.budget.to_string(),
            capacity: config.cache.capacity,
            threads: engine.threads(),
            calls: widths.len(),
            time_mean_s: total_seconds / widths.len() as f64,
            time_p50_s: percentile(&times, 50.0),
            time_p95_s: percentile(&times, 95.0),
            warm_up_calls: args.warm_up,
            warm_up_s: warm_up_seconds,
            rss_initial_kb: rss_first,
            rss_growth_kb: rss_last as i64 - rss_first as i64,
            growth_every_100: growth,
            compiles: stats.compiles,
            failed_compiles: stats.failed_compiles,
            hits: stats.hits,
            misses: stats.misses,
            evictions: stats.evictions,
            evicted_bytes: stats.evicted_bytes,
            cache_entries: stats.entries,
            cache_bytes: stats.bytes,
            cache_peak_bytes: stats.peak_bytes,
            peak_activation_bytes: peak_activation,
            streaming: model.streaming().name().to_string(),
            stream_band: model.streaming().band().unwrap_or(0),
            peak_call_segments: peak_segments,
            workspace_budget: config.workspace.budget.to_string(),
            workspace_bytes: workspace.bytes,
            workspace_peak_bytes: workspace.peak_bytes,
            workspace_returned_bytes: workspace.returned_bytes,
            vmhwm_kb,
            compile_time_s: stats.compile_time.as_secs_f64(),
            max_compile_time_s: stats.max_compile_time.as_secs_f64(),
            bucket_error,
            node_configurations: configurations.len(),
            conv_algo: conv_algo.to_string(),
            weight_bytes_direct: model.weight_bytes().direct,
            weight_bytes_winograd: model.weight_bytes().winograd,
            compile_by_algo: compile_by_algo(&configurations),
            per_call: records,
            peer_command: peer_command(args, source, *input, engine.threads()),
        };
        Ok(report)
    }
}

/// Runs the warm-up calls and then the timed calls, with a progress bar on stderr and the RSS
/// growth every 100 calls on `out`.
fn time_calls(out: &mut impl Write, args: &Args, setup: &Setup) -> Result<Timed> {
    let Setup {
        input_name,
        input,
        widths,
        engine,
        model,
        ..
    } = setup;
    let [n, c, h] = *input;
    let input_name = input_name.as_str();
    let bar = if args.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::with_draw_target(Some(widths.len() as u64), ProgressDrawTarget::stderr())
    };
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} calls  {msg}").expect("valid template"),
    );

    let widest = widths.iter().copied().max().unwrap_or(1);
    let widest_padded = args.policy.padded_width(widest);
    // The outputs first: binding the widest call's shape checks that its tensors are of a
    // size the IR accepts before the inputs are allocated for it.
    let outputs = output_tensors(model, input_name, [n, c, h, widest_padded])?;
    let pads = widths.iter().any(|&w| args.policy.padded_width(w) != w);
    let mut caller = Caller {
        setup,
        policy: args.policy,
        inputs: Inputs::new(args.seed, [n, c, h], widest, widest_padded, pads),
        outputs,
        ws: Workspace::new(),
        configurations: HashMap::new(),
    };
    let mut records = Vec::with_capacity(widths.len());
    let mut growth = Vec::new();
    let mut rss_first = 0;
    let mut peak_activation = 0;
    let mut peak_segments = Vec::new();
    let mut workspace = primjit::WorkspaceStats::default();
    // As the peers' harness does, the growth is counted from the RSS after the warm-up (or
    // after the first call, when there is none), and the warm-up's time is not the workload's.
    let mut warm_up_seconds = 0.0;
    for _ in 0..args.warm_up {
        warm_up_seconds += caller.call(widths[0])?.1;
        rss_first = rss_kb()?;
    }
    if args.warm_up > 0 {
        bar.suspend(|| {
            writeln!(
                out,
                "warm-up: {} call{} at W={} in {:.3} s ({} compiles), not timed",
                args.warm_up,
                if args.warm_up == 1 { "" } else { "s" },
                widths[0],
                warm_up_seconds,
                engine.cache().stats().compiles
            )
        })?;
    }
    let mut total_seconds = 0.0;
    for (i, &w) in widths.iter().enumerate() {
        let run_width = args.policy.padded_width(w);
        let (stats, seconds) = caller.call(w)?;
        total_seconds += seconds;
        if stats.peak_activation_bytes > peak_activation {
            peak_activation = stats.peak_activation_bytes;
            peak_segments = stats.segments.iter().map(SegmentReport::from).collect();
        }
        workspace = stats.workspace;
        let rss = rss_kb()?;
        if i == 0 && args.warm_up == 0 {
            rss_first = rss;
        }
        let cache = engine.cache().stats();
        records.push(CallRecord {
            call: i + 1,
            width: w,
            run_width,
            seconds,
            cache_bytes: cache.bytes,
            rss_kb: rss,
            compiles: cache.compiles,
            workspace_bytes: workspace.bytes,
        });
        bar.set_message(format!(
            "mean {:.3} s, cache {} KiB",
            total_seconds / (i + 1) as f64,
            cache.bytes >> 10
        ));
        bar.inc(1);
        if (i + 1) % 100 == 0 {
            let g = rss as i64 - rss_first as i64;
            growth.push((i + 1, g));
            bar.suspend(|| writeln!(out, "n={} memory growth (kb): {}", i + 1, thousands(g)))?;
        }
    }
    bar.finish_and_clear();
    let vmhwm_kb = hwm_kb()?;

    Ok(Timed {
        records,
        growth,
        rss_first,
        peak_activation,
        peak_segments,
        workspace,
        warm_up_seconds,
        total_seconds,
        configurations: caller.configurations,
        vmhwm_kb,
        inputs: caller.inputs,
    })
}

/// Benchmark calls, one after another on the same buffers, noting the primitives they ran.
struct Caller<'a> {
    setup: &'a Setup,
    policy: Policy,
    inputs: Inputs,
    outputs: Vec<Tensor>,
    ws: Workspace,
    /// The compile time of each distinct primitive the calls ran.
    configurations: HashMap<PrimitiveKey, Duration>,
}

impl Caller<'_> {
    /// Runs the model on an input of width `w`, padded as the policy says; returns the run's
    /// statistics and its time in seconds.
    fn call(&mut self, w: usize) -> Result<(RunStats, f64)> {
        let (shape, data) = self.inputs.view(w, self.policy.padded_width(w));
        let x = TensorView {
            shape: &shape,
            data,
        };
        let Setup {
            input_name,
            engine,
            model,
            ..
        } = self.setup;
        let start = Instant::now();
        let stats = model.run_into(
            engine,
            &[(input_name.as_str(), x)],
            &mut self.outputs,
            &mut self.ws,
        )?;
        let seconds = start.elapsed().as_secs_f64();
        for node in &stats.nodes {
            self.configurations
                .entry(node.primitive.key().clone())
                .or_insert_with(|| node.primitive.compile_time());
        }
        Ok((stats, seconds))
    }
}

/// The report's lines after the calls.
fn print_report(out: &mut impl Write, args: &Args, report: &BenchReport) -> Result<()> {
    writeln!(
        out,
        "time: mean={:.3} s, p50={:.3} s, p95={:.3} s",
        report.time_mean_s, report.time_p50_s, report.time_p95_s
    )?;
    writeln!(
        out,
        "memory (kb): {} initial, {} growth",
        thousands(report.rss_initial_kb as i64),
        thousands(report.rss_growth_kb)
    )?;
    writeln!(
        out,
        "primitives: {} compiles ({} failed), {} hits, {} misses, {} evictions ({} bytes freed)",
        report.compiles,
        report.failed_compiles,
        report.hits,
        report.misses,
        report.evictions,
        report.evicted_bytes
    )?;
    writeln!(
        out,
        "cache: {} entries, {} bytes now, {} bytes peak",
        report.cache_entries, report.cache_bytes, report.cache_peak_bytes
    )?;
    writeln!(
        out,
        "peak activation bytes: {}",
        report.peak_activation_bytes
    )?;
    writeln!(
        out,
        "streaming: {}{}",
        report.streaming,
        match report.stream_band {
            0 => String::new(),
            b => format!(", bands of {b} columns"),
        }
    )?;
    for s in &report.peak_call_segments {
        writeln!(
            out,
            "  at the peak call: streamed %{}..%{}, {} sweeps, {} calls, windows {} bytes, \
             whole tensors {} bytes, peak {} bytes",
            s.first, s.last, s.sweeps, s.calls, s.window_bytes, s.whole_bytes, s.peak_bytes
        )?;
    }
    writeln!(
        out,
        "workspace (budget {}): {} bytes now, {} bytes peak, {} bytes returned",
        report.workspace_budget,
        report.workspace_bytes,
        report.workspace_peak_bytes,
        report.workspace_returned_bytes
    )?;
    writeln!(out, "VmHWM (kb): {}", thousands(report.vmhwm_kb as i64))?;
    writeln!(
        out,
        "compile time: {:.3} s total, {:.2} ms max",
        report.compile_time_s,
        report.max_compile_time_s * 1e3
    )?;
    for a in &report.compile_by_algo {
        writeln!(
            out,
            "compile time, {}: {} primitives, {:.3} s total, {:.2} ms max",
            a.algo,
            a.primitives,
            a.total_s,
            a.max_s * 1e3
        )?;
    }
    writeln!(
        out,
        "weights ({} convolutions): {} bytes packed for direct kernels, {} bytes winograd-transformed",
        report.conv_algo, report.weight_bytes_direct, report.weight_bytes_winograd
    )?;
    if args.policy == Policy::Dynamic {
        writeln!(
            out,
            "dynamic: {} distinct node configurations, {} primitives compiled",
            report.node_configurations, report.compiles
        )?;
    }
    if let Some(e) = &report.bucket_error {
        writeln!(
            out,
            "{} error vs exact over the first {} calls: max abs {:.3e}, max rel {:.3e}",
            args.policy.name(),
            e.calls_checked,
            e.max_abs,
            e.max_rel
        )?;
    }
    Ok(())
}

/// The closing lines of `bench`: the figures to set beside a peer's, and how to run the peer.
fn print_summary(out: &mut impl Write, report: &BenchReport) -> Result<()> {
    writeln!(
        out,
        "summary: policy {}, {} thread{}, {} calls",
        report.policy.name(),
        report.threads,
        if report.threads == 1 { "" } else { "s" },
        report.calls
    )?;
    writeln!(
        out,
        "  latency: mean {:.3} s, p50 {:.3} s",
        report.time_mean_s, report.time_p50_s
    )?;
    writeln!(out, "  primitives compiled: {}", report.compiles)?;
    writeln!(
        out,
        "  memory: RSS growth {} kb (after the {}), VmHWM {} kb",
        thousands(report.rss_growth_kb),
        if report.warm_up_calls > 0 {
            "warm-up"
        } else {
            "first call"
        },
        thousands(report.vmhwm_kb as i64)
    )?;
    if let Some(command) = &report.peer_command {
        writeln!(out, "compare: {command}")?;
    }
    Ok(())
}

/// The command that runs onnxruntime on the same widths with `../shared/peers/bench_peer.py`
/// (see its README), when the harness can take the model: an ONNX file, or the shipped trunk
/// as `onnx_trunk.py` exports it, with the peers' `1x3x320xW` input.
fn peer_command(args: &Args, source: &Source, input: [usize; 3], threads: usize) -> Option<String> {
    if input != [1, 3, 320] {
        return None;
    }
    let model = match &args.workload.file {
        None => "trunk.onnx".to_string(),
        Some(_) if source.onnx.is_some() => source.path.clone(),
        Some(_) => return None,
    };
    let widths = args.workload.widths.as_ref().map_or_else(
        || "benches/data/widths.txt".to_string(),
        |p| p.display().to_string(),
    );
    let bin = match args.policy {
        Policy::Bucket320 => " --bin 320",
        _ => "",
    };
    let exported = if args.workload.file.is_none() {
        "\n  (trunk.onnx is the trunk that `python3 ../shared/peers/onnx_trunk.py --out trunk.onnx` \
         exports; see ../shared/peers/README.md)"
    } else {
        ""
    };
    Some(format!(
        "python3 ../shared/peers/bench_peer.py --engine ort --threads {threads} --n {}{bin} \
         --model {model} --widths {widths}{exported}",
        args.workload.n
    ))
}

/// Compile times of the distinct primitives a run used, by convolution algorithm.
fn compile_by_algo(
    primitives: &std::collections::HashMap<primjit::PrimitiveKey, std::time::Duration>,
) -> Vec<AlgoCompile> {
    let algo_of = |key: &primjit::PrimitiveKey| match key {
        primjit::PrimitiveKey::Conv(d) => d.algo.name(),
        _ => "other",
    };
    ["direct", "wino_f4x3", "other"]
        .into_iter()
        .filter_map(|algo| {
            let times: Vec<f64> = primitives
                .iter()
                .filter(|(k, _)| algo_of(k) == algo)
                .map(|(_, t)| t.as_secs_f64())
                .collect();
            (!times.is_empty()).then(|| AlgoCompile {
                algo,
                primitives: times.len(),
                total_s: times.iter().sum(),
                max_s: times.iter().copied().fold(0.0, f64::max),
            })
        })
        .collect()
}

/// One tensor per output of `model`, with room for its output at input shape `widest` (its
/// pages touched now: `workload::touched_zeros`), for `run_into` to write every call's outputs
/// into.
fn output_tensors(model: &CompiledGraph, input: &str, widest: [usize; 4]) -> Result<Vec<Tensor>> {
    let graph = model.graph();
    let bindings = graph.bind_inputs(&[(input, &widest[..])], &primjit_ir::Bindings::new())?;
    let shapes = primjit_ir::infer_shapes(graph, &bindings)?;
    graph
        .outputs()
        .iter()
        .map(|(name, v)| {
            let len = shapes
                .concrete(*v)
                .with_context(|| format!("output {name} has no concrete shape"))?
                .iter()
                .product();
            Ok(Tensor {
                shape: Vec::new(),
                data: workload::touched_zeros(len),
            })
        })
        .collect()
}

/// Runs the first calls again both under the policy and exact, on an engine of their own so
/// that the timed run's cache and memory are untouched, and compares the cropped outputs.
///
/// The engine takes the timed one's `config` (codegen options, `PRIMJIT_PERF_MAP`, verbosity):
/// with the defaults instead, a `perf` profile of `bench` left the check calls' kernels
/// unnamed, a third of the samples of a W=7680 run.
fn bucket_error(
    model: &CompiledGraph,
    input: &str,
    args: &Args,
    widths: &[usize],
    inputs: &mut Inputs,
    config: &EngineConfig,
) -> Result<BucketError> {
    let engine = Engine::new(config.clone())?;
    let mut ws = Workspace::new();
    let exact_model = model.clone().with_mode(ShapeMode::Exact);
    let (mut max_abs, mut max_ref) = (0.0f64, 0.0f64);
    let checked = args.check_calls.min(widths.len());
    for &w in widths.iter().take(checked) {
        let (shape, x) = inputs.view(w, w);
        let x = Tensor::new(shape.to_vec(), x.to_vec())?;
        let (exact, _) = exact_model.run(&engine, &[(input, &x)], &mut ws)?;
        let (shape, padded) = inputs.view(w, args.policy.padded_width(w));
        let padded = Tensor::new(shape.to_vec(), padded.to_vec())?;
        let (bucketed, _) = model.run(&engine, &[(input, &padded)], &mut ws)?;
        for ((_, e), (_, b)) in exact.iter().zip(&bucketed) {
            let b: Tensor = crop_width(b, *e.shape.last().expect("rank 4"));
            for (&x, &y) in e.data.iter().zip(&b.data) {
                // A NaN on one side only is an infinite error (`f64::max` would drop it).
                let diff = match (x.is_nan(), y.is_nan()) {
                    (false, false) => (x as f64 - y as f64).abs(),
                    (true, true) => 0.0,
                    _ => f64::INFINITY,
                };
                max_abs = max_abs.max(diff);
                max_ref = max_ref.max((x as f64).abs());
            }
        }
    }
    Ok(BucketError {
        calls_checked: checked,
        max_abs,
        max_rel: if max_ref > 0.0 {
            max_abs / max_ref
        } else {
            0.0
        },
    })
}
