//! `primjit sweep`: `bench` once per cache configuration and policy, each in a fresh process so
//! that every memory figure starts from the same clean state, then one table and three
//! figures, each as SVG and PNG.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use plotters::coord::Shift;
use plotters::prelude::*;
use serde::Deserialize;

use crate::workload::{self, Policy, thousands};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub workload: crate::bench::Workload,

    /// Configurations as `POLICY[:BUDGET[:CAPACITY[:WORKSPACE]]]`, e.g. exact:8MiB,
    /// exact:unlimited:128 or dynamic:::16MiB (WORKSPACE: the workspace budget) (default: exact
    /// with unlimited, 64MiB, 8MiB, 1MiB and 0; exact with capacity 128; bucket320;
    /// bucketflex; dynamic with workspace budgets 0, 16MiB and unlimited)
    #[arg(long = "config", value_name = "SPEC")]
    pub configs: Vec<String>,

    /// Where to write the JSON of every run and the figures
    #[arg(long, default_value = "target/primjit-sweep")]
    pub out_dir: PathBuf,

    #[command(flatten)]
    pub algo: crate::algo::AlgoArgs,

    /// Every run's streaming of the leading convolutions, as `bench --streaming` (default:
    /// each policy's own)
    #[arg(long, value_name = "on|off", value_parser = crate::bench::parse_streaming)]
    pub streaming: Option<primjit::Streaming>,
}

/// The part of `bench`'s JSON the sweep reads.
#[derive(Debug, Deserialize)]
struct Run {
    policy: String,
    budget: String,
    capacity: Option<usize>,
    workspace_budget: String,
    vmhwm_kb: u64,
    calls: usize,
    time_mean_s: f64,
    time_p50_s: f64,
    time_p95_s: f64,
    rss_growth_kb: i64,
    compiles: u64,
    hits: u64,
    misses: u64,
    cache_peak_bytes: usize,
    per_call: Vec<CallRss>,
}

#[derive(Debug, Deserialize)]
struct CallRss {
    rss_kb: u64,
}

#[derive(Clone, Debug)]
struct Config {
    policy: Policy,
    budget: Option<String>,
    capacity: Option<usize>,
    workspace: Option<String>,
}

impl Config {
    fn label(&self) -> String {
        let mut s = self.policy.name().to_string();
        if let Some(b) = &self.budget {
            s += &format!(" {b}");
        }
        if let Some(c) = self.capacity {
            s += &format!(" cap{c}");
        }
        if let Some(w) = &self.workspace {
            s += &format!(" workspace {w}");
        }
        s
    }
}

fn parse_config(spec: &str) -> Result<Config> {
    let mut parts = spec.split(':');
    let policy = parts.next().unwrap_or("");
    let policy = <Policy as clap::ValueEnum>::from_str(policy, true).map_err(|_| {
        anyhow::anyhow!(
            "config `{spec}`: unknown policy `{policy}` (exact, bucket320, bucketflex, dynamic)"
        )
    })?;
    let budget = parts.next().filter(|s| !s.is_empty()).map(str::to_string);
    if let Some(b) = &budget {
        primjit::Budget::parse(b).map_err(|e| anyhow::anyhow!("config `{spec}`: {e}"))?;
    }
    let capacity = parts
        .next()
        .filter(|s| !s.is_empty())
        .map(|c| {
            workload::parse_count(c).map_err(|e| anyhow::anyhow!("config `{spec}`: capacity {e}"))
        })
        .transpose()?;
    let workspace = parts.next().filter(|s| !s.is_empty()).map(str::to_string);
    if let Some(w) = &workspace {
        primjit::Budget::parse(w)
            .map_err(|e| anyhow::anyhow!("config `{spec}`: workspace budget: {e}"))?;
    }
    if parts.next().is_some() {
        bail!("config `{spec}`: expected POLICY[:BUDGET[:CAPACITY[:WORKSPACE]]]");
    }
    Ok(Config {
        policy,
        budget,
        capacity,
        workspace,
    })
}

fn default_configs() -> Vec<Config> {
    let exact = |b: &str| Config {
        policy: Policy::Exact,
        budget: Some(b.into()),
        capacity: None,
        workspace: None,
    };
    let dynamic = |w: &str| Config {
        policy: Policy::Dynamic,
        budget: None,
        capacity: None,
        workspace: Some(w.into()),
    };
    vec![
        exact("unlimited"),
        exact("64MiB"),
        exact("8MiB"),
        exact("1MiB"),
        exact("0"),
        Config {
            policy: Policy::Exact,
            budget: Some("unlimited".into()),
            capacity: Some(128),
            workspace: None,
        },
        Config {
            policy: Policy::Bucket320,
            budget: None,
            capacity: None,
            workspace: None,
        },
        Config {
            policy: Policy::Bucketflex,
            budget: None,
            capacity: None,
            workspace: None,
        },
        dynamic("0"),
        dynamic("16MiB"),
        dynamic("unlimited"),
    ]
}

pub fn run(args: &Args) -> Result<()> {
    let configs = if args.configs.is_empty() {
        default_configs()
    } else {
        args.configs
            .iter()
            .map(|s| parse_config(s))
            .collect::<Result<_>>()?
    };
    std::fs::create_dir_all(&args.out_dir)
        .with_context(|| format!("cannot create {}", args.out_dir.display()))?;
    let exe = std::env::current_exe().context("cannot find the primjit executable")?;
    let mut out = std::io::stdout().lock();
    let mut runs = Vec::new();
    for (i, config) in configs.iter().enumerate() {
        let json = args.out_dir.join(format!("run{i}.json"));
        let mut cmd = Command::new(&exe);
        // Every call is timed from cold, compiles included: the sweep compares the cache's
        // policies, and what each compiles is part of that.
        cmd.arg("bench")
            .arg("--quiet")
            .arg("--warm-up")
            .arg("0")
            .arg("--n")
            .arg(args.workload.n.to_string())
            .arg("--threads")
            .arg(args.workload.threads.to_string());
        // Every run uses the same algorithms: the flag, else this process's environment.
        cmd.arg("--conv-algo").arg(args.algo.choice()?.name());
        cmd.arg("--max-isa").arg(args.algo.isa()?.name());
        // A configuration runs what its label says: without these, a budget or capacity in
        // the environment applied to every configuration that left it out (and a capacity
        // emptied the latency figure, which plots the runs without one).
        for var in [
            "PRIMJIT_CACHE_BUDGET",
            "PRIMJIT_CACHE_CAPACITY",
            "PRIMJIT_WORKSPACE_BUDGET",
        ] {
            cmd.env_remove(var);
        }
        if let Some(s) = args.streaming {
            cmd.arg("--streaming").arg(s.name());
        }
        cmd.arg("--policy")
            .arg(config.policy.name())
            .arg("--json")
            .arg(&json);
        if let Some(f) = &args.workload.file {
            cmd.arg(f);
        }
        if let Some(w) = &args.workload.widths {
            cmd.arg("--widths").arg(w);
        }
        if let Some(b) = &config.budget {
            cmd.arg("--budget").arg(b);
        }
        if let Some(c) = config.capacity {
            cmd.arg("--capacity").arg(c.to_string());
        }
        if let Some(w) = &config.workspace {
            cmd.arg("--workspace-budget").arg(w);
        }
        writeln!(out, "# {}: {} calls...", config.label(), args.workload.n)?;
        out.flush()?;
        let output = cmd.output().context("cannot run primjit bench")?;
        if !output.status.success() {
            bail!(
                "bench for `{}` failed: {}",
                config.label(),
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        let text = std::fs::read_to_string(&json)
            .with_context(|| format!("cannot read {}", json.display()))?;
        let run: Run = serde_json::from_str(&text)
            .with_context(|| format!("cannot parse {}", json.display()))?;
        runs.push((config.clone(), run));
    }

    writeln!(
        out,
        "{:<11} {:>9} {:>8} {:>9} {:>8} {:>8} {:>8} {:>14} {:>12} {:>8} {:>8} {:>12}",
        "policy",
        "budget",
        "capacity",
        "workspace",
        "mean ms",
        "p50 ms",
        "p95 ms",
        "growth kB",
        "VmHWM kB",
        "compiles",
        "hit rate",
        "cache peak B"
    )?;
    for (_, r) in &runs {
        let lookups = (r.hits + r.misses).max(1);
        writeln!(
            out,
            "{:<11} {:>9} {:>8} {:>9} {:>8.1} {:>8.1} {:>8.1} {:>14} {:>12} {:>8} {:>7.1}% {:>12}",
            r.policy,
            r.budget,
            r.capacity.map_or("-".to_string(), |c| c.to_string()),
            r.workspace_budget,
            r.time_mean_s * 1e3,
            r.time_p50_s * 1e3,
            r.time_p95_s * 1e3,
            thousands(r.rss_growth_kb),
            thousands(r.vmhwm_kb as i64),
            r.compiles,
            100.0 * r.hits as f64 / lookups as f64,
            r.cache_peak_bytes
        )?;
    }
    let figures = [
        figure(
            &args.out_dir.join("memory_growth.svg"),
            Figure::Growth,
            &runs,
        )?,
        figure(
            &args.out_dir.join("latency_vs_budget.svg"),
            Figure::Latency,
            &runs,
        )?,
        figure(
            &args.out_dir.join("growth_vs_latency.svg"),
            Figure::Tradeoff,
            &runs,
        )?,
    ];
    let names: Vec<String> = figures
        .iter()
        .flatten()
        .map(|p| p.display().to_string())
        .collect();
    writeln!(out, "figures: {}", names.join(" "))?;
    Ok(())
}

/// Pixels of every figure, and of the legend strip at its right, outside the plot.
const SIZE: (u32, u32) = (1000, 560);
const LEGEND_WIDTH: u32 = 260;

/// Ten colours that stay apart (Tableau 10); series past the tenth take them again with
/// another marker, so that no two of 40 series look alike.
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

#[derive(Clone, Copy, Debug, PartialEq)]
enum Marker {
    Circle,
    Triangle,
    Square,
    Diamond,
}

const MARKERS: [Marker; 4] = [
    Marker::Circle,
    Marker::Triangle,
    Marker::Square,
    Marker::Diamond,
];

/// How series `i` is drawn: its colour and its marker.
#[derive(Clone, Copy, Debug, PartialEq)]
struct SeriesStyle {
    color: RGBColor,
    marker: Marker,
}

fn series_style(i: usize) -> SeriesStyle {
    SeriesStyle {
        color: PALETTE[i % PALETTE.len()],
        marker: MARKERS[(i / PALETTE.len()) % MARKERS.len()],
    }
}

/// The text face of every figure. The PNG rasterizer needs a font's outlines, and this one
/// comes from a crate (DejaVu Sans), so figures render alike on every machine, with or
/// without system fonts; the SVG names `sans-serif` and leaves the face to the viewer.
fn register_font() -> Result<()> {
    static REGISTERED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
            .is_ok()
    });
    if !ok {
        bail!("the bundled DejaVu Sans font could not be loaded");
    }
    Ok(())
}

/// The figures `sweep` draws.
#[derive(Clone, Copy, Debug)]
enum Figure {
    Growth,
    Latency,
    Tradeoff,
}

impl Figure {
    fn draw<DB: DrawingBackend>(
        self,
        root: &DrawingArea<DB, Shift>,
        runs: &[(Config, Run)],
    ) -> Result<()>
    where
        DB::ErrorType: 'static,
    {
        root.fill(&WHITE)?;
        match self {
            Figure::Growth => plot_growth(root, runs),
            Figure::Latency => plot_latency(root, runs),
            Figure::Tradeoff => plot_tradeoff(root, runs),
        }
    }
}

/// Draws a figure twice: as the SVG at `svg` and as a PNG beside it. Returns both paths.
fn figure(svg: &Path, kind: Figure, runs: &[(Config, Run)]) -> Result<[PathBuf; 2]> {
    register_font()?;
    {
        let root = SVGBackend::new(svg, SIZE).into_drawing_area();
        kind.draw(&root, runs)?;
        root.present()
            .with_context(|| format!("cannot write {}", svg.display()))?;
    }
    let png = svg.with_extension("png");
    let mut pixels = vec![255u8; SIZE.0 as usize * SIZE.1 as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut pixels, SIZE).into_drawing_area();
        kind.draw(&root, runs)?;
        root.present()?;
    }
    let file =
        std::fs::File::create(&png).with_context(|| format!("cannot write {}", png.display()))?;
    let mut encoder = png::Encoder::new(std::io::BufWriter::new(file), SIZE.0, SIZE.1);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    encoder
        .write_header()
        .and_then(|mut w| w.write_image_data(&pixels))
        .with_context(|| format!("cannot write {}", png.display()))?;
    Ok([svg.to_path_buf(), png])
}

/// Draws `style`'s marker centred at pixel `at` of `area`.
fn marker<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    at: (i32, i32),
    style: SeriesStyle,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let (x, y) = at;
    let fill = style.color.filled();
    match style.marker {
        Marker::Circle => area.draw(&Circle::new(at, 4, fill))?,
        Marker::Triangle => area.draw(&Polygon::new(
            vec![(x, y - 5), (x - 5, y + 4), (x + 5, y + 4)],
            fill,
        ))?,
        Marker::Square => area.draw(&Rectangle::new([(x - 4, y - 4), (x + 4, y + 4)], fill))?,
        Marker::Diamond => area.draw(&Polygon::new(
            vec![(x, y - 5), (x + 5, y), (x, y + 5), (x - 5, y)],
            fill,
        ))?,
    }
    Ok(())
}

/// Splits a figure into its plot and, at the right, a legend of `labels` (series `i` in
/// `series_style(i)`, with a line when `lines`), outside the plot so that it hides nothing.
fn with_legend<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    labels: &[String],
    lines: bool,
) -> Result<DrawingArea<DB, Shift>>
where
    DB::ErrorType: 'static,
{
    let (plot, legend) = root.split_horizontally(SIZE.0 - LEGEND_WIDTH);
    for (i, label) in labels.iter().enumerate() {
        let style = series_style(i);
        let y = 60 + 22 * i as i32;
        if lines {
            legend.draw(&PathElement::new(
                vec![(4, y), (34, y)],
                style.color.stroke_width(2),
            ))?;
        }
        marker(&legend, (19, y), style)?;
        legend.draw(&Text::new(
            label.clone(),
            (42, y - 7),
            ("sans-serif", 14).into_font().color(&BLACK),
        ))?;
    }
    Ok(plot)
}

fn plot_growth<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    runs: &[(Config, Run)],
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let labels: Vec<String> = runs.iter().map(|(c, _)| c.label()).collect();
    let plot = with_legend(root, &labels, true)?;
    let calls = runs.iter().map(|(_, r)| r.calls).max().unwrap_or(1).max(2);
    let growth = |r: &Run| -> Vec<(f64, f64)> {
        let first = r.per_call.first().map_or(0, |c| c.rss_kb) as f64;
        r.per_call
            .iter()
            .enumerate()
            .map(|(i, c)| ((i + 1) as f64, (c.rss_kb as f64 - first) / 1024.0))
            .collect()
    };
    let max_mib = runs
        .iter()
        .flat_map(|(_, r)| growth(r))
        .map(|(_, g)| g)
        .fold(1.0, f64::max);
    let min_mib = runs
        .iter()
        .flat_map(|(_, r)| growth(r))
        .map(|(_, g)| g)
        .fold(0.0, f64::min);
    let mut chart = ChartBuilder::on(&plot)
        .caption("RSS growth against calls", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(60)
        .build_cartesian_2d(1f64..calls as f64, min_mib..max_mib * 1.05)?;
    chart
        .configure_mesh()
        .x_desc("calls")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_desc("RSS growth since call 1 (MiB)")
        .draw()?;
    for (i, (_, run)) in runs.iter().enumerate() {
        let style = series_style(i);
        let points = growth(run);
        chart.draw_series(LineSeries::new(
            points.iter().copied(),
            style.color.stroke_width(2),
        ))?;
        // Markers at a few calls of each series, shifted per series so they do not pile up.
        let every = (points.len() / 8).max(1);
        let phase = i * every / runs.len().max(1);
        for (j, p) in points.iter().enumerate() {
            if j % every == phase % every {
                marker(&plot, chart.backend_coord(p), style)?;
            }
        }
    }
    Ok(())
}

/// Where a budget sits on a logarithmic axis of MiB: `0` one decade left of the smallest
/// nonzero budget, `unlimited` one decade right of the largest, each apart from the numbers.
/// As a plotters coordinate, its ticks are the budgets given and its labels their names.
struct BudgetAxis {
    zero: f64,
    unlimited: f64,
    range: std::ops::Range<f64>,
    ticks: Vec<f64>,
}

impl Ranged for BudgetAxis {
    type FormatOption = plotters::coord::ranged1d::NoDefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let span = self.range.end - self.range.start;
        let t = (value - self.range.start) / span;
        limit.0 + (t * (limit.1 - limit.0) as f64).round() as i32
    }

    fn key_points<Hint: plotters::coord::ranged1d::KeyPointHint>(&self, _: Hint) -> Vec<f64> {
        self.ticks.clone()
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.range.clone()
    }
}

impl plotters::coord::ranged1d::ValueFormatter<f64> for BudgetAxis {
    fn format_ext(&self, value: &f64) -> String {
        self.label(*value)
    }
}

impl BudgetAxis {
    fn new(budgets: &[primjit::Budget]) -> BudgetAxis {
        let logs: Vec<f64> = budgets
            .iter()
            .filter_map(|b| match b {
                primjit::Budget::Bytes(n) if *n > 0 => Some(mib(*n).log10()),
                _ => None,
            })
            .collect();
        let lo = logs.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = logs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let (lo, hi) = if logs.is_empty() {
            (0.0, 0.0)
        } else {
            (lo, hi)
        };
        let zero = lo.floor() - 1.0;
        let unlimited = hi.ceil() + 1.0;
        let mut axis = BudgetAxis {
            zero,
            unlimited,
            range: zero - 0.5..unlimited + 0.5,
            ticks: Vec::new(),
        };
        let mut ticks: Vec<f64> = budgets.iter().map(|&b| axis.position(b)).collect();
        ticks.extend([zero, unlimited]);
        ticks.sort_by(f64::total_cmp);
        ticks.dedup();
        axis.ticks = ticks;
        axis
    }

    fn position(&self, b: primjit::Budget) -> f64 {
        match b {
            primjit::Budget::Unlimited => self.unlimited,
            primjit::Budget::Bytes(0) => self.zero,
            primjit::Budget::Bytes(n) => mib(n).log10(),
        }
    }

    /// A tick's label: `0`, `unlimited`, or the budget as the CLI writes it.
    fn label(&self, x: f64) -> String {
        if (x - self.zero).abs() < 1e-9 {
            "0".into()
        } else if (x - self.unlimited).abs() < 1e-9 {
            "unlimited".into()
        } else {
            let bytes = (10f64.powf(x) * (1u64 << 20) as f64).round() as usize;
            primjit::Budget::Bytes(bytes).to_string()
        }
    }
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

fn plot_latency<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    runs: &[(Config, Run)],
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    // Exact-policy runs without a capacity, by cache budget.
    let mut points: Vec<(primjit::Budget, f64)> = runs
        .iter()
        .filter(|(c, r)| c.policy == Policy::Exact && r.capacity.is_none())
        .filter_map(|(_, r)| {
            primjit::Budget::parse(&r.budget)
                .ok()
                .map(|b| (b, r.time_mean_s * 1e3))
        })
        .collect();
    let axis = BudgetAxis::new(&points.iter().map(|p| p.0).collect::<Vec<_>>());
    points.sort_by(|a, b| axis.position(a.0).total_cmp(&axis.position(b.0)));
    let plot = with_legend(root, &["exact, mean latency".to_string()], true)?;
    let max_y = points.iter().map(|p| p.1).fold(1.0, f64::max) * 1.2;
    let (zero, unlimited) = (axis.zero, axis.unlimited);
    let position = |b| axis.position(b);
    let points: Vec<(f64, f64, bool)> = points
        .iter()
        .map(|&(b, ms)| {
            (
                position(b),
                ms,
                matches!(b, primjit::Budget::Bytes(n) if n > 0),
            )
        })
        .collect();
    let mut chart = ChartBuilder::on(&plot)
        .caption(
            "mean latency against cache budget (exact policy)",
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(60)
        .build_cartesian_2d(axis, 0f64..max_y)?;
    chart
        .configure_mesh()
        .x_desc("cache budget (logarithmic; 0 and unlimited set apart)")
        .y_desc("mean ms per call")
        .draw()?;
    // Breaks between `0`, the numbers and `unlimited`.
    for x in [zero + 0.5, unlimited - 0.5] {
        chart.draw_series(DashedLineSeries::new(
            [(x, 0.0), (x, max_y)],
            6,
            4,
            BLACK.mix(0.4).stroke_width(1),
        ))?;
    }
    let style = series_style(0);
    // The line joins the numeric budgets only; `0` and `unlimited` stand apart.
    let numeric = points.iter().filter(|p| p.2).map(|p| (p.0, p.1));
    chart.draw_series(LineSeries::new(numeric, style.color.stroke_width(2)))?;
    for p in &points {
        marker(&plot, chart.backend_coord(&(p.0, p.1)), style)?;
    }
    Ok(())
}

/// RSS growth at the last call against mean latency, one point per run: what each policy and
/// workspace budget trades.
fn plot_tradeoff<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    runs: &[(Config, Run)],
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let labels: Vec<String> = runs.iter().map(|(c, _)| c.label()).collect();
    let plot = with_legend(root, &labels, false)?;
    let points: Vec<(f64, f64)> = runs
        .iter()
        .map(|(_, r)| (r.time_mean_s * 1e3, r.rss_growth_kb as f64 / 1024.0))
        .collect();
    let max_x = points.iter().map(|p| p.0).fold(1.0, f64::max) * 1.1;
    let max_y = points.iter().map(|p| p.1).fold(1.0, f64::max) * 1.1;
    let min_y = points.iter().map(|p| p.1).fold(0.0, f64::min) * 1.1;
    let mut chart = ChartBuilder::on(&plot)
        .caption("RSS growth against mean latency", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..max_x, min_y..max_y)?;
    chart
        .configure_mesh()
        .x_desc("mean ms per call")
        .y_desc("RSS growth at the last call (MiB)")
        .draw()?;
    for (i, p) in points.iter().enumerate() {
        marker(&plot, chart.backend_coord(p), series_style(i))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_two_of_forty_series_share_a_style_and_ten_differ_by_colour() {
        let styles: Vec<SeriesStyle> = (0..40).map(series_style).collect();
        for (i, a) in styles.iter().enumerate() {
            assert!(styles[i + 1..].iter().all(|b| b != a), "series {i}");
        }
        for (i, a) in styles[..10].iter().enumerate() {
            assert!(styles[i + 1..10].iter().all(|b| b.color != a.color));
        }
    }

    #[test]
    fn the_budget_axis_is_logarithmic_with_zero_and_unlimited_apart() {
        use primjit::Budget;
        let budgets = [
            Budget::Bytes(0),
            Budget::Bytes(1 << 20),
            Budget::Bytes(8 << 20),
            Budget::Bytes(64 << 20),
            Budget::Unlimited,
        ];
        let axis = BudgetAxis::new(&budgets);
        let x: Vec<f64> = budgets.iter().map(|&b| axis.position(b)).collect();
        assert!(x.windows(2).all(|w| w[0] < w[1]), "{x:?}");
        // Equal ratios, equal distances.
        assert!(((x[2] - x[1]) - (x[3] - x[2])).abs() < 1e-9, "{x:?}");
        // `0` and `unlimited` are a decade or more from the nearest number.
        assert!(x[1] - x[0] >= 1.0 && x[4] - x[3] >= 1.0, "{x:?}");
        assert_eq!(axis.label(x[0]), "0");
        assert_eq!(axis.label(x[2]), "8MiB");
        assert_eq!(axis.label(x[4]), "unlimited");
        assert!(axis.range.contains(&x[0]) && axis.range.contains(&x[4]));
    }
}
