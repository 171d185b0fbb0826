//! `primjit peak` and `primjit bench-op`: kernel speed as a fraction of this machine's FMA
//! peak at the kernel's own vector tier, measured in the same process and run.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use primjit::codegen::{Pitches, WidePattern};
use primjit::descriptor::{self, DescriptorOp};
use primjit::ir::{Tensor, random_tensor};
use primjit::{
    Budget, CacheConfig, CallExtents, CompiledGraph, ConvDesc, Engine, EngineConfig, ExecArgs,
    FmaPattern, Isa, Layout, Params, Primitive, PrimitiveKey, ShapeMode, Workspace,
    WorkspaceConfig, WorkspaceStats,
};

use crate::source::GraphArgs;

/// The median of a non-empty slice (sorts it); of an even count, the mean of the middle two
/// (with two runs, the upper one would make every ratio the worse of its pair).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The measured single-core f32x4 FMA peak: the best of several runs (other load on a shared
/// machine only ever lowers a run's rate), and their median for reference.
#[derive(Clone, Copy, Debug)]
pub struct Peak {
    pub gflops: f64,
    pub median_gflops: f64,
}

impl Peak {
    /// Implied clock at two 128-bit FMA pipes: 16 flops per cycle.
    pub fn ghz(&self) -> f64 {
        self.gflops / 16.0
    }
}

/// Runs the FMA peak kernel (12 independent chains) on `threads` threads at once: 9 runs of
/// ~40 ms each. The rate is the sum over the threads, so that where hardware threads share
/// their FMA units (SMT siblings) the peak says so.
pub fn measure_peak(engine: &Engine, threads: usize) -> Result<Peak> {
    let [peak] = measure_patterns(engine, [peak_key(Isa::X128)], threads)?;
    Ok(peak.0)
}

/// The peak and the convolutions' register tiles, the direct kernels' and Winograd's, in the
/// order `peak` and `bench-op` print them.
const PEAK_AND_TILES: [PrimitiveKey; 3] = [
    PrimitiveKey::FmaPeak(FmaPattern::Registers),
    PrimitiveKey::FmaPeak(FmaPattern::Broadcast),
    PrimitiveKey::FmaPeak(FmaPattern::SharedBroadcast),
];

/// The FMA peak kernel of a tier: Cranelift's at 128 bits, the x64 backend's wider.
fn peak_key(isa: Isa) -> PrimitiveKey {
    match isa {
        Isa::X128 => PrimitiveKey::FmaPeak(FmaPattern::Registers),
        isa => PrimitiveKey::WidePeak {
            isa,
            pattern: WidePattern::Registers,
        },
    }
}

/// Runs each pattern's FMA peak kernel on `threads` threads at once, 9 runs of ~40 ms each,
/// the patterns alternating run by run (so that each pair shares the host's moment): each
/// pattern's peak, and the median over the runs of its rate over the first pattern's.
fn measure_patterns<const N: usize>(
    engine: &Engine,
    patterns: [PrimitiveKey; N],
    threads: usize,
) -> Result<[(Peak, f64); N]> {
    let threads = threads.max(1);
    let run = |p: &Primitive, pattern: &PrimitiveKey, trips: usize| -> Result<f64> {
        let lens = pattern.buffers();
        let acc_len = lens[1].len;
        // Small values: the sums stay normal and finite for any trip count.
        let src = vec![1e-7f32; lens[0].len];
        let start = Instant::now();
        std::thread::scope(|s| {
            // Spawned fallibly: a thread count the system refuses is an error, not a panic.
            let handles = (0..threads)
                .map(|_| {
                    std::thread::Builder::new().spawn_scoped(s, || {
                        let mut acc = vec![0.0f32; acc_len];
                        p.execute_range(
                            ExecArgs {
                                src: &src,
                                weights: None,
                                dst: &mut acc,
                                extra: &[],
                                scratch: None,
                            },
                            None,
                            0..trips,
                        )
                    })
                })
                .collect::<std::io::Result<Vec<_>>>()
                .context("cannot start the peak measurement's threads")?;
            handles
                .into_iter()
                .try_for_each(|h| h.join().expect("peak thread").map_err(anyhow::Error::from))
        })?;
        let flops = pattern.flops() as f64 * (trips * threads) as f64;
        Ok(flops / start.elapsed().as_secs_f64() / 1e9)
    };
    let mut kernels = Vec::with_capacity(N);
    for pattern in patterns {
        let p = engine.compile(&pattern)?;
        // Calibrate the trip count to ~40 ms.
        let mut trips = 10_000usize;
        loop {
            let t = Instant::now();
            run(&p, &pattern, trips)?;
            let s = t.elapsed().as_secs_f64();
            if s > 0.02 || trips > 1 << 28 {
                trips = ((trips as f64) * 0.04 / s.max(1e-6)) as usize;
                break;
            }
            trips *= 4;
        }
        kernels.push((p, pattern, trips));
    }
    let mut rates = vec![Vec::with_capacity(9); N];
    for _ in 0..9 {
        for ((p, pattern, trips), r) in kernels.iter().zip(&mut rates) {
            r.push(run(p, pattern, *trips)?);
        }
    }
    let first = rates[0].clone();
    Ok(std::array::from_fn(|i| {
        let mut ratios: Vec<f64> = rates[i].iter().zip(&first).map(|(r, f)| r / f).collect();
        let best = rates[i].iter().copied().fold(0.0, f64::max);
        let peak = Peak {
            gflops: best,
            median_gflops: median(&mut rates[i]),
        };
        (peak, median(&mut ratios))
    }))
}

#[derive(Debug, clap::Args)]
pub struct PeakArgs {
    /// Also measure this many threads running the loop at once (0: all cores)
    #[arg(long, default_value_t = 0, value_parser = parse_peak_threads)]
    pub threads: usize,
    /// The widest tier to measure: `x128`, `avx2` or `avx512`; default: `PRIMJIT_MAX_ISA`,
    /// else the host's widest (each tier up to it is measured)
    #[arg(long = "max-isa", value_name = "TIER", value_parser = parse_isa)]
    pub max_isa: Option<Isa>,
}

fn parse_isa(text: &str) -> Result<Isa, String> {
    text.parse().map_err(|e: primjit::IsaError| e.to_string())
}

/// `peak --threads`: 0 to as many as an engine runs, refused before the one-core
/// measurement rather than after it.
fn parse_peak_threads(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if n <= Engine::MAX_THREADS => Ok(n),
        _ => Err(format!(
            "expected 0 (all cores) to {} threads, found `{text}`",
            Engine::MAX_THREADS
        )),
    }
}

/// `--runs`: from 1 to 1000 (timings are kept per run).
fn parse_runs(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n @ 1..=1000) => Ok(n),
        _ => Err(format!(
            "expected a number of runs from 1 to 1000, found `{text}`"
        )),
    }
}

pub fn run_peak(args: &PeakArgs) -> Result<()> {
    let max_isa = match args.max_isa {
        Some(t) => Some(t),
        None => EngineConfig::from_env()?.max_isa,
    };
    let engine = Engine::new(EngineConfig {
        threads: 1,
        max_isa,
        ..EngineConfig::default()
    })?;
    let [(peak, _), (tile, tile_ratio), (shared, shared_ratio)] =
        measure_patterns(&engine, PEAK_AND_TILES, 1)?;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "peak: {:.1} GFLOP/s f32x4 FMA on one core (best of 9 runs; median {:.1}), implied clock {:.2} GHz at 16 flop/cycle",
        peak.gflops,
        peak.median_gflops,
        peak.ghz()
    )?;
    writeln!(
        out,
        "register tile: {:.1} GFLOP/s with a broadcast load per FMA, the direct convolutions' pattern (best of 9 runs; median {:.1}); {:.2} of the peak, the median of runs alternated with it",
        tile.gflops, tile.median_gflops, tile_ratio
    )?;
    writeln!(
        out,
        "winograd tile: {:.1} GFLOP/s with a broadcast load per two FMAs (5 tiles x 2 vectors), the Winograd GEMM's pattern (best of 9 runs; median {:.1}); {:.2} of the peak, the median of runs alternated with it",
        shared.gflops, shared.median_gflops, shared_ratio
    )?;
    let (bits, feature) = widest_vectors();
    writeln!(
        out,
        "widest vectors: {bits} bits on this CPU ({feature}); primjit's tiers here: {} (this engine: {})",
        Isa::host_tiers()
            .iter()
            .map(|t| t.name())
            .collect::<Vec<_>>()
            .join(", "),
        engine.isa()
    )?;
    // Each wide tier up to the engine's: its own peak from the x64 backend's loop, and its
    // direct convolution's full register tile and its Winograd GEMM's tile alternated with it.
    let mut one_core = vec![(Isa::X128, peak.gflops)];
    for isa in Isa::ALL
        .into_iter()
        .filter(|&t| t != Isa::X128 && t <= engine.isa())
    {
        let tile_key = |pattern| PrimitiveKey::WidePeak { isa, pattern };
        let (direct_key, gemm_key) = (
            tile_key(WidePattern::DirectTile),
            tile_key(WidePattern::GemmTile),
        );
        let [(wide, _), (tile, ratio), (gemm, gemm_ratio)] = measure_patterns(
            &engine,
            [peak_key(isa), direct_key.clone(), gemm_key.clone()],
            1,
        )?;
        writeln!(
            out,
            "peak {isa}: {:.1} GFLOP/s {}-bit FMA on one core (best of 9 runs; median {:.1}), {:.2}x the 128-bit peak",
            wide.gflops,
            isa.target().lanes * 32,
            wide.median_gflops,
            wide.gflops / peak.gflops
        )?;
        writeln!(
            out,
            "register tile {isa}: {:.1} GFLOP/s ({direct_key}, the direct convolutions' wide tile; median {:.1}); {ratio:.2} of the {isa} peak, the median of runs alternated with it",
            tile.gflops, tile.median_gflops
        )?;
        writeln!(
            out,
            "winograd tile {isa}: {:.1} GFLOP/s ({gemm_key}, the Winograd GEMM's wide tile; median {:.1}); {gemm_ratio:.2} of the {isa} peak, the median of runs alternated with it",
            gemm.gflops, gemm.median_gflops
        )?;
        one_core.push((isa, wide.gflops));
    }
    let threads = if args.threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        args.threads
    };
    if threads > 1 {
        for (isa, one) in one_core {
            let [(all, _)] = measure_patterns(&engine, [peak_key(isa)], threads)?;
            writeln!(
                out,
                "peak {isa}: {:.1} GFLOP/s with {threads} threads at once ({:.2}x one core)",
                all.gflops,
                all.gflops / one
            )?;
        }
    }
    Ok(())
}

/// The widest vectors this CPU's instruction set has, in bits, and the feature that gives
/// them. A peer library free to use them is measured against that width, so `peak` says how
/// far above its 128-bit peak such code may go. (The instruction set is not the datapath: Zen4
/// runs AVX-512 on 256-bit units, two halves a 512-bit FMA.)
#[cfg(target_arch = "x86_64")]
fn widest_vectors() -> (u32, &'static str) {
    if std::arch::is_x86_feature_detected!("avx512f") {
        (512, "avx512f")
    } else if std::arch::is_x86_feature_detected!("avx") {
        (256, "avx")
    } else {
        (128, "sse2")
    }
}

/// Elsewhere, the 128 bits the kernels have.
#[cfg(not(target_arch = "x86_64"))]
fn widest_vectors() -> (u32, &'static str) {
    (128, "its baseline")
}

#[derive(Debug, clap::Args)]
pub struct BenchOpArgs {
    /// A benchdnn problem descriptor, e.g. mb1ic64ih80iw80oc64oh80ow80kh3kw3sh1sw1ph1pw1
    #[arg(value_name = "DESCRIPTOR", required_unless_present = "model")]
    pub descriptor: Option<String>,

    /// Time every node of a graph instead (with --dims for its symbols)
    #[arg(long, value_name = "FILE.ir", conflicts_with = "descriptor")]
    pub model: Option<PathBuf>,

    /// Values for the model's symbols, e.g. W=1031
    // `requires = "model"` is not enforced when the descriptor, which conflicts with the model,
    // is given (clap drops requirements on conflicting arguments): model-only flags conflict
    // with the descriptor instead.
    #[arg(long, value_name = "NAME=N,...", conflicts_with = "descriptor")]
    pub dims: Option<String>,

    /// The descriptor is a pooling problem
    #[arg(long)]
    pub pool: bool,

    /// Pooling algorithm: max, avg_np (padding excluded) or avg_p (padding counted)
    #[arg(long = "alg", default_value = "max", value_parser = ["max", "avg_np", "avg_p"])]
    pub alg: String,

    /// Activation layout of the single-op problem
    #[arg(long, default_value = "nchw4c", value_parser = ["nchw", "nchw4c"])]
    pub layout: String,

    /// Threads per execution
    #[arg(long, default_value_t = 1)]
    pub threads: usize,

    /// Timed executions (after one warm-up), 1 to 1000
    #[arg(long, default_value_t = 20, value_parser = parse_runs)]
    pub runs: usize,

    /// With --model: also run the graph with runtime extents for its symbols (the `dynamic`
    /// policy), alternating with exact runs, and print both side by side; `dyn/ex` is the
    /// median over runs of each run's ratio
    #[arg(long, conflicts_with = "descriptor")]
    pub dynamic: bool,

    /// With --model: also run the graph with this convolution algorithm choice (direct,
    /// winograd or auto), alternating with the first, and print both side by side; the ratio
    /// column is the median over runs of each run's ratio (second / first)
    #[arg(long, value_name = "ALGO", conflicts_with_all = ["descriptor", "dynamic"],
          value_parser = |s: &str| s.parse::<primjit::ConvAlgoChoice>().map_err(|e| e.to_string()))]
    pub vs_algo: Option<primjit::ConvAlgoChoice>,

    /// Row pitches of the descriptor's source and destination, in pixels (`SRC,DST`): its rows
    /// lie this far apart inside wider buffers, as in a width-streamed run's band calls
    /// (`pitch:src96,dst80` in a key's one-liner)
    #[arg(long, value_name = "SRC,DST", conflicts_with_all = ["model", "pool"],
          value_parser = parse_pitches)]
    pub pitch: Option<Pitches>,

    /// Also run the descriptor with these row pitches (`SRC,DST`, or `dense`), alternating with
    /// the first run by run, and print both and the median over pairs of their ratio
    /// (second / first)
    #[arg(long, value_name = "SRC,DST", conflicts_with_all = ["model", "pool"],
          value_parser = parse_pitches)]
    pub vs_pitch: Option<Pitches>,

    /// With --model: the most bytes of activation buffers kept from one run to the next:
    /// 16MiB, 0, unlimited (default: the built-in 8MiB). A network whose activations exceed it
    /// faults the rest in again on every run, as a server with that budget would
    #[arg(long, value_name = "BYTES", conflicts_with = "descriptor", value_parser = Budget::parse)]
    pub workspace_budget: Option<Budget>,

    #[command(flatten)]
    pub algo: crate::algo::AlgoArgs,
}

/// `SRC,DST` row pitches in pixels, or `dense` for rows as wide as the tensors.
fn parse_pitches(text: &str) -> Result<Pitches, String> {
    if text == "dense" {
        return Ok(Pitches::DENSE);
    }
    let pitch = |part: &str| {
        part.trim()
            .parse::<usize>()
            .ok()
            .filter(|&p| p > 0)
            .ok_or_else(|| format!("`{part}` is not a row pitch (a positive number of pixels)"))
    };
    match text.split_once(',') {
        Some((src, dst)) => Ok(Pitches {
            src: Some(pitch(src)?),
            dst: Some(pitch(dst)?),
        }),
        None => Err(format!(
            "expected `SRC,DST` (two row pitches in pixels) or `dense`, found `{text}`"
        )),
    }
}

/// `key` with its convolution's rows at `pitches`, validated.
fn with_pitches(key: &PrimitiveKey, pitches: Pitches) -> Result<PrimitiveKey> {
    let PrimitiveKey::Conv(d) = key else {
        bail!("row pitches apply to convolutions only");
    };
    let key = PrimitiveKey::Conv(ConvDesc {
        pitches,
        ..d.clone()
    });
    key.validate()?;
    Ok(key)
}

/// One `bench-op` problem ready to time: its compiled primitive and buffers of random data.
struct OpProblem {
    primitive: std::sync::Arc<Primitive>,
    extents: Option<CallExtents>,
    src: Vec<f32>,
    weights: Option<Vec<f32>>,
    dst: Vec<f32>,
    /// A conv that needs scratch (Winograd's tiles) gets one band per thread, of the call's
    /// own key (a small image's blocks take less than a runtime key's largest); empty if none.
    scratch: Vec<f32>,
}

impl OpProblem {
    /// Compiles `compiled_key` and fills buffers for a call of `key` (its extents).
    fn new(engine: &Engine, key: &PrimitiveKey, compiled_key: &PrimitiveKey) -> Result<Self> {
        let primitive = engine.compile(compiled_key)?;
        let extents = compiled_key.runtime_dims().any().then(|| {
            let [_, _, oh, ow, _, _] = key.extent_args().map(|e| e as usize);
            CallExtents {
                input: key.input_extents(),
                output: Some([oh, ow]),
            }
        });
        let bufs = key.buffers();
        let src = guarded_random(bufs[0].len, 1);
        let (weights, dst, scratch_len) = match key {
            PrimitiveKey::Conv(d) => {
                let w = guarded_random(d.weight_shape().iter().product(), 2);
                let b = guarded_random(d.oc, 3);
                let slopes = d.prelu().then(|| guarded_random(d.oc, 4));
                let weights = d.pack_weights(&w, Some(&b), slopes.as_deref());
                (Some(weights), vec![0.0; bufs[2].len], d.scratch_len())
            }
            _ => (None, vec![0.0; bufs[1].len], 0),
        };
        Ok(Self {
            primitive,
            extents,
            src,
            weights,
            dst,
            scratch: vec![0.0; scratch_len * engine.threads()],
        })
    }

    /// One execution.
    fn execute(&mut self, engine: &Engine) -> Result<()> {
        let args = ExecArgs {
            src: &self.src,
            weights: self.weights.as_deref(),
            dst: &mut self.dst,
            extra: &[],
            scratch: (!self.scratch.is_empty()).then_some(self.scratch.as_mut_slice()),
        };
        match self.extents {
            Some(e) => engine.execute_at(&self.primitive, args, e)?,
            None => engine.execute(&self.primitive, args)?,
        }
        Ok(())
    }

    /// Seconds of `runs` executions after a warm-up, sorted.
    fn time(&mut self, engine: &Engine, runs: usize) -> Result<Vec<f64>> {
        self.execute(engine)?;
        let mut t = Vec::with_capacity(runs);
        for _ in 0..runs {
            let start = Instant::now();
            self.execute(engine)?;
            t.push(start.elapsed().as_secs_f64());
        }
        t.sort_by(f64::total_cmp);
        Ok(t)
    }
}

fn guarded_random(len: usize, seed: u64) -> Vec<f32> {
    random_tensor(seed, "bench", vec![len], -1.0, 1.0).data
}

/// The key of a `bench-op` descriptor at its extents (validated), the key to compile (with
/// the extents the descriptor marks `*` left to run time), and the descriptor's label.
fn descriptor_key(args: &BenchOpArgs) -> Result<(PrimitiveKey, PrimitiveKey, Option<String>)> {
    let text = args
        .descriptor
        .as_deref()
        .expect("clap requires a descriptor without --model");
    let desc = descriptor::parse(text)?;
    let layout = if args.layout == "nchw" {
        Layout::Nchw
    } else {
        Layout::Nchw4c
    };
    let op = if args.pool {
        DescriptorOp::pool(&args.alg).expect("clap checks the algorithm")
    } else {
        DescriptorOp::Conv(args.algo.choice()?)
    };
    let (key, compiled) = desc.keys(op, layout)?;
    let isa = args.algo.isa()?;
    let (key, compiled) = (at_tier(key, isa), at_tier(compiled, isa));
    match args.pitch {
        Some(p) => Ok((
            with_pitches(&key, p)?,
            with_pitches(&compiled, p)?,
            desc.name,
        )),
        None => Ok((key, compiled, desc.name)),
    }
}

/// A convolution or pooling key at the tier its kernel takes on an engine of tier `isa`.
fn at_tier(key: PrimitiveKey, isa: primjit::Isa) -> PrimitiveKey {
    match key {
        PrimitiveKey::Conv(mut d) => {
            d.isa = d.tier_for(isa);
            PrimitiveKey::Conv(d)
        }
        PrimitiveKey::Pool(d) => PrimitiveKey::Pool(d.at_tier(isa)),
        other => other,
    }
}

pub fn run_bench_op(args: &BenchOpArgs) -> Result<()> {
    // Every primitive stays cached, so that each code address keeps one name in perf's map
    // (`PRIMJIT_PERF_MAP`, the one variable read here).
    let engine = Engine::new(EngineConfig {
        threads: args.threads,
        cache: CacheConfig {
            budget: Budget::Unlimited,
            capacity: None,
        },
        perf_map: EngineConfig::from_env()?.perf_map,
        max_isa: args.algo.max_isa()?,
        workspace: WorkspaceConfig {
            budget: args
                .workspace_budget
                .unwrap_or(WorkspaceConfig::DEFAULT_BUDGET),
        },
        ..EngineConfig::default()
    })?;
    // The problem first, so that a bad descriptor fails before anything is measured.
    let problem = match &args.model {
        Some(_) => None,
        None => Some(descriptor_key(args)?),
    };
    // The peak of as many threads as the engine runs, all running at once, and the direct and
    // Winograd convolutions' register tiles alternated with it: how much of the peak their
    // instruction patterns reach on this host at this moment.
    let [(peak, _), (tile, tile_ratio), (shared, shared_ratio)] =
        measure_patterns(&engine, PEAK_AND_TILES, engine.threads())?;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "peak: {:.1} GFLOP/s with {} thread(s) at once; register tile (a broadcast load per FMA): {:.1} GFLOP/s, {:.2} of the peak; winograd tile (a broadcast load per two FMAs): {:.1} GFLOP/s, {:.2}",
        peak.gflops,
        engine.threads(),
        tile.gflops,
        tile_ratio,
        shared.gflops,
        shared_ratio
    )?;
    let peak_before = TierPeaks::measure(&engine, peak.gflops)?;
    if engine.isa() != Isa::X128 {
        writeln!(out, "tier peaks: {} GFLOP/s", peak_before.describe())?;
    }
    let Some((key, compiled_key, name)) = problem else {
        let model = args.model.as_ref().expect("no descriptor means a model");
        return bench_model(&engine, model, args, &peak_before, &mut out);
    };
    let mut first = OpProblem::new(&engine, &key, &compiled_key)?;
    let mut second = match args.vs_pitch {
        Some(pitches) => {
            let (k, c) = (
                with_pitches(&key, pitches)?,
                with_pitches(&compiled_key, pitches)?,
            );
            Some((OpProblem::new(&engine, &k, &c)?, c))
        }
        None => None,
    };
    let (mut times, mut vs_times) = match &mut second {
        None => (first.time(&engine, args.runs)?, Vec::new()),
        // Run by run, so that a change of the host's load meets both alike; each timed run
        // after a warm-up of its own, as the other problem's run has just taken the caches.
        Some((other, _)) => {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            for _ in 0..args.runs {
                a.push(first.time(&engine, 1)?[0]);
                b.push(other.time(&engine, 1)?[0]);
            }
            (a, b)
        }
    };
    let mut ratios: Vec<f64> = vs_times.iter().zip(&times).map(|(b, a)| b / a).collect();
    let (med, min) = (median(&mut times), times[0]);
    let machine_peak = peak_after(&engine, &peak_before, &mut out)?.of(compiled_key.isa());
    let label = name.map(|n| format!(" ({n})")).unwrap_or_default();
    writeln!(out, "{compiled_key}{label}")?;
    if let Some(CallExtents {
        input: [ih, iw], ..
    }) = first.extents
    {
        writeln!(out, "runtime extents, run at ih={ih} iw={iw}: {key}")?;
    }
    let p = &first.primitive;
    writeln!(
        out,
        "compile {:.3} ms, {} bytes of code; median {:.3} ms, min {:.3} ms",
        p.compile_time().as_secs_f64() * 1e3,
        p.memory().code,
        med * 1e3,
        min * 1e3
    )?;
    if let Some((_, vs_key)) = &second {
        let (vs_med, ratio) = (median(&mut vs_times), median(&mut ratios));
        writeln!(
            out,
            "vs {vs_key}: median {:.3} ms, min {:.3} ms; median ratio over {} alternating \
             pairs (vs / first) {ratio:.3}",
            vs_med * 1e3,
            vs_times[0] * 1e3,
            ratios.len()
        )?;
    }
    match &key {
        PrimitiveKey::Conv(d) => {
            let gflops = key.flops() as f64 / med / 1e9;
            if d.algo == primjit::ConvAlgo::Direct {
                writeln!(
                    out,
                    "{gflops:.1} GFLOP/s, {:.1}% of peak",
                    100.0 * gflops / machine_peak
                )?;
            } else {
                // What the kernel computes (its GEMMs), and the direct convolution's flops
                // over the same time: the speed a direct kernel would need to match it.
                let actual = d.algo_flops() as f64 / med / 1e9;
                writeln!(
                    out,
                    "{actual:.1} GFLOP/s actual ({:.1}% of peak, GEMMs only), {gflops:.1} GFLOP/s \
                     effective ({:.1}% of peak, direct-equivalent flops)",
                    100.0 * actual / machine_peak,
                    100.0 * gflops / machine_peak
                )?;
            }
        }
        _ => {
            // Pooling is bound by memory: compare with a plain copy of the same bytes.
            let bytes = key.activation_bytes() as f64;
            let mut a = vec![0.0f32; first.src.len() + first.dst.len()];
            let b = guarded_random(a.len(), 4);
            let mut copies: Vec<f64> = (0..args.runs)
                .map(|_| {
                    let t = Instant::now();
                    a.copy_from_slice(std::hint::black_box(&b));
                    t.elapsed().as_secs_f64()
                })
                .collect();
            let copy = median(&mut copies);
            let (bw, copy_bw) = (bytes / med / 1e9, 2.0 * bytes / copy / 1e9);
            writeln!(
                out,
                "{bw:.1} GB/s; a copy of the same bytes: {copy_bw:.1} GB/s; {:.1}% of copy",
                100.0 * bw / copy_bw
            )?;
        }
    }
    Ok(())
}

/// Each tier's FMA peak, up to the engine's tier, on the engine's threads at once: a kernel's
/// percentage is of its own tier's peak.
#[derive(Clone, Debug)]
struct TierPeaks(Vec<(Isa, f64)>);

impl TierPeaks {
    /// The wide tiers' peaks, beside the 128-bit one already measured.
    fn measure(engine: &Engine, x128: f64) -> Result<Self> {
        let mut peaks = vec![(Isa::X128, x128)];
        for isa in Isa::ALL
            .into_iter()
            .filter(|&t| t != Isa::X128 && t <= engine.isa())
        {
            let [(p, _)] = measure_patterns(engine, [peak_key(isa)], engine.threads())?;
            peaks.push((isa, p.gflops));
        }
        Ok(TierPeaks(peaks))
    }

    fn of(&self, isa: Isa) -> f64 {
        self.0
            .iter()
            .find(|(t, _)| *t == isa)
            .map_or(f64::NAN, |(_, g)| *g)
    }

    /// The widest tier's peak: what a whole graph is measured against.
    fn widest(&self) -> f64 {
        self.0.last().map_or(f64::NAN, |(_, g)| *g)
    }

    fn describe(&self) -> String {
        self.0
            .iter()
            .map(|(t, g)| format!("{t} {g:.1}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Measures the peaks again after the timed runs and keeps the higher of each pair: on a
/// shared machine a peak measured in one slow moment would inflate every percentage.
fn peak_after(engine: &Engine, before: &TierPeaks, out: &mut impl Write) -> Result<TierPeaks> {
    let x128 = measure_peak(engine, engine.threads())?.gflops;
    let after = TierPeaks::measure(engine, x128)?;
    let best = TierPeaks(
        before
            .0
            .iter()
            .zip(&after.0)
            .map(|(&(t, b), &(_, a))| (t, b.max(a)))
            .collect(),
    );
    writeln!(
        out,
        "peaks after the runs: {} GFLOP/s; percentages use the higher of each tier's two, {}, \
         a kernel's of its own tier",
        after.describe(),
        best.describe()
    )?;
    Ok(best)
}

/// `bench-op --model`: the model's nodes timed run by run, alone or beside a second form of
/// the model (its dynamic keys, or another convolution algorithm), against the machine's peaks.
fn bench_model(
    engine: &Engine,
    path: &std::path::Path,
    args: &BenchOpArgs,
    peak_before: &TierPeaks,
    out: &mut impl Write,
) -> Result<()> {
    let Compared {
        models,
        second,
        input,
        x,
    } = compared_models(path, args)?;
    let runs = args.runs;
    let Timings {
        firsts,
        mut per_node,
        mut totals,
        workspace,
    } = time_models(engine, &models, (&input, &x), runs)?;
    let peaks = peak_after(engine, peak_before, out)?;
    let machine_peak = peaks.widest();
    if let Some(label) = &second {
        writeln!(
            out,
            "{:<22} {:>9} {:>9} {:>7} {:>7} {:>10}  key ({label})",
            "node",
            "first ms",
            format!("{label} ms"),
            "ratio",
            "% peak",
            "compile ms"
        )?;
    } else {
        writeln!(
            out,
            "{:<22} {:>9} {:>9} {:>7} {:>10}  key",
            "node", "ms", "GFLOP/s", "% peak", "compile ms"
        )?;
    }
    let mut conv_time = vec![0.0; models.len()];
    for (i, node) in firsts[0].nodes.iter().enumerate() {
        // The ratio of run r's dynamic time to run r's exact time: the two ran next to each
        // other, so a slow moment of a shared machine cancels out of the pair.
        let mut ratios: Vec<f64> = per_node
            .get(1)
            .map(|dynamic| {
                dynamic[i]
                    .iter()
                    .zip(&per_node[0][i])
                    .map(|(d, x)| d / x)
                    .collect()
            })
            .unwrap_or_default();
        let meds: Vec<f64> = per_node.iter_mut().map(|m| median(&mut m[i])).collect();
        let key = &node.call_key;
        let gflops = key.flops() as f64 / meds[0] / 1e9;
        let pct = if matches!(key, PrimitiveKey::Conv(_)) {
            for (t, m) in conv_time.iter_mut().zip(&meds) {
                *t += m;
            }
            format!("{:.1}", 100.0 * gflops / peaks.of(key.isa()))
        } else {
            "-".into()
        };
        if second.is_some() {
            let dynamic = &firsts[1].nodes[i];
            writeln!(
                out,
                "{:<22} {:>9.3} {:>9.3} {:>7.3} {:>7} {:>10.3}  {}",
                node.name,
                meds[0] * 1e3,
                meds[1] * 1e3,
                median(&mut ratios),
                pct,
                dynamic.primitive.compile_time().as_secs_f64() * 1e3,
                dynamic.primitive.key()
            )?;
        } else {
            writeln!(
                out,
                "{:<22} {:>9.3} {:>9.1} {:>7} {:>10.3}  {key}",
                node.name,
                meds[0] * 1e3,
                gflops,
                pct,
                node.primitive.compile_time().as_secs_f64() * 1e3
            )?;
        }
    }
    let flops: u64 = firsts[0].nodes.iter().map(|n| n.call_key.flops()).sum();
    let labels = [
        "graph".to_string(),
        format!("graph ({})", second.as_deref().unwrap_or_default()),
    ];
    for (m, label) in labels.iter().enumerate().take(models.len()) {
        let total = median(&mut totals[m]);
        writeln!(
            out,
            "{label}: median {:.3} ms over {runs} runs ({:.1} GFLOP/s, {:.1}% of the widest tier's peak); convolutions {:.3} ms",
            total * 1e3,
            flops as f64 / total / 1e9,
            100.0 * flops as f64 / total / 1e9 / machine_peak,
            conv_time[m] * 1e3
        )?;
    }
    // What the runs' workspace kept and gave back: bytes returned run after run are buffers
    // faulted in again on the next (`--workspace-budget`).
    writeln!(
        out,
        "workspace: budget {}, {} bytes held after the runs (at most {} at once), {} bytes returned to the system over them",
        engine.workspace_config().budget,
        workspace.bytes,
        workspace.peak_bytes,
        workspace.returned_bytes
    )?;
    Ok(())
}

/// The models `bench-op --model` times: the model with its exact keys and, with `--dynamic`
/// or `--vs-algo`, a second form of it, with its column label; and their input.
struct Compared {
    models: Vec<CompiledGraph>,
    second: Option<String>,
    /// The input's name and a random tensor for it.
    input: String,
    x: Tensor,
}

/// Loads the model at `path` with random parameters and compiles what `args` compares.
fn compared_models(path: &std::path::Path, args: &BenchOpArgs) -> Result<Compared> {
    let dims = args
        .dims
        .as_deref()
        .map(primjit::ir::parse_bindings)
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let loaded = GraphArgs {
        file: path.to_path_buf(),
        dims,
    }
    .load()?;
    let graph = &loaded.graph;
    let [input] = graph.inputs() else {
        bail!("bench-op --model needs a graph with one input")
    };
    let shapes = loaded.shapes(graph, &loaded.bindings)?;
    let Some(shape) = shapes.concrete(input.value) else {
        bail!("bind every symbol of the input with --dims")
    };
    let params = Params::random(graph, 0);
    let isa = args.algo.isa()?;
    let exact = CompiledGraph::with_target(graph, &params, args.algo.choice()?, isa)?;
    let mut models = vec![exact.clone()];
    // The second model and its column label.
    let second = if args.dynamic {
        // Whole tensors, as the exact model runs: the columns compare kernels, node by node.
        models.push(
            exact
                .with_mode(ShapeMode::Runtime)
                .with_streaming(primjit::Streaming::OFF),
        );
        Some("dyn".to_string())
    } else if let Some(algo) = args.vs_algo {
        models.push(CompiledGraph::with_target(graph, &params, algo, isa)?);
        Some(algo.to_string())
    } else {
        None
    };
    let x: Tensor = random_tensor(1, "x", shape, -1.0, 1.0);
    let input = graph.value_name(input.value).to_string();
    Ok(Compared {
        models,
        second,
        input,
        x,
    })
}

/// What [`time_models`] measured: each model's first run, and its seconds per node and in
/// total, run by run.
struct Timings {
    firsts: Vec<primjit::RunStats>,
    /// `[model][node][run]`.
    per_node: Vec<Vec<Vec<f64>>>,
    /// `[model][run]`.
    totals: Vec<Vec<f64>>,
    /// The runs' workspace after the last.
    workspace: WorkspaceStats,
}

/// Runs each model once, then `runs` times more, the models alternating run by run so that
/// they see the same machine.
fn time_models(
    engine: &Engine,
    models: &[CompiledGraph],
    (name, x): (&str, &Tensor),
    runs: usize,
) -> Result<Timings> {
    let mut ws = Workspace::new();
    let mut firsts = Vec::new();
    for model in models {
        firsts.push(model.run(engine, &[(name, x)], &mut ws)?.1);
    }
    // [model][node][run]; the models alternate run by run, so they see the same machine.
    let mut per_node: Vec<Vec<Vec<f64>>> =
        vec![vec![Vec::new(); firsts[0].nodes.len()]; models.len()];
    let mut totals: Vec<Vec<f64>> = vec![Vec::new(); models.len()];
    for run in 0..runs {
        // ABBA order, so that neither model always runs right after the other.
        let order: Vec<usize> = if run % 2 == 0 {
            (0..models.len()).collect()
        } else {
            (0..models.len()).rev().collect()
        };
        for m in order {
            let model = &models[m];
            let t = Instant::now();
            let (_, stats) = model.run(engine, &[(name, x)], &mut ws)?;
            totals[m].push(t.elapsed().as_secs_f64());
            for (i, n) in stats.nodes.iter().enumerate() {
                per_node[m][i].push(n.seconds);
            }
        }
    }
    Ok(Timings {
        firsts,
        per_node,
        totals,
        workspace: ws.stats(),
    })
}
