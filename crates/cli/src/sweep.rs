//! `primjit sweep`: `bench` once per cache configuration and policy, each in a fresh process so
//! that every memory figure starts from the same clean state, then one table and two figures.

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};
use plotters::prelude::*;
use serde::Deserialize;

use crate::workload::{Policy, thousands};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub workload: crate::bench::Workload,

    /// Configurations as POLICY[:BUDGET[:CAPACITY]], e.g. exact:8MiB or exact:unlimited:128
    /// (default: exact with unlimited, 64MiB, 8MiB, 1MiB and 0; exact with capacity 128;
    /// bucket320; bucketflex; dynamic)
    #[arg(long = "config", value_name = "SPEC")]
    pub configs: Vec<String>,

    /// Where to write the JSON of every run and the figures
    #[arg(long, default_value = "target/primjit-sweep")]
    pub out_dir: PathBuf,

    #[command(flatten)]
    pub algo: crate::algo::AlgoArgs,
}

/// The part of `bench`'s JSON the sweep reads.
#[derive(Debug, Deserialize)]
struct Run {
    policy: String,
    budget: String,
    capacity: Option<usize>,
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
        .map(|c| {
            c.parse()
                .with_context(|| format!("config `{spec}`: capacity `{c}` is not a number"))
        })
        .transpose()?;
    if parts.next().is_some() {
        bail!("config `{spec}`: expected POLICY[:BUDGET[:CAPACITY]]");
    }
    Ok(Config {
        policy,
        budget,
        capacity,
    })
}

fn default_configs() -> Vec<Config> {
    let exact = |b: &str| Config {
        policy: Policy::Exact,
        budget: Some(b.into()),
        capacity: None,
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
        },
        Config {
            policy: Policy::Bucket320,
            budget: None,
            capacity: None,
        },
        Config {
            policy: Policy::Bucketflex,
            budget: None,
            capacity: None,
        },
        Config {
            policy: Policy::Dynamic,
            budget: None,
            capacity: None,
        },
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
        cmd.arg("bench")
            .arg("--quiet")
            .arg("--n")
            .arg(args.workload.n.to_string())
            .arg("--threads")
            .arg(args.workload.threads.to_string());
        // Every run uses the same algorithms: the flag, else this process's environment.
        cmd.arg("--conv-algo").arg(args.algo.choice()?.name());
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
        "{:<11} {:>9} {:>8} {:>8} {:>8} {:>8} {:>14} {:>8} {:>8} {:>12}",
        "policy",
        "budget",
        "capacity",
        "mean ms",
        "p50 ms",
        "p95 ms",
        "growth kB",
        "compiles",
        "hit rate",
        "cache peak B"
    )?;
    for (_, r) in &runs {
        let lookups = (r.hits + r.misses).max(1);
        writeln!(
            out,
            "{:<11} {:>9} {:>8} {:>8.1} {:>8.1} {:>8.1} {:>14} {:>8} {:>7.1}% {:>12}",
            r.policy,
            r.budget,
            r.capacity.map_or("-".to_string(), |c| c.to_string()),
            r.time_mean_s * 1e3,
            r.time_p50_s * 1e3,
            r.time_p95_s * 1e3,
            thousands(r.rss_growth_kb),
            r.compiles,
            100.0 * r.hits as f64 / lookups as f64,
            r.cache_peak_bytes
        )?;
    }
    let growth = args.out_dir.join("memory_growth.svg");
    let latency = args.out_dir.join("latency_vs_budget.svg");
    plot_growth(&runs, &growth)?;
    plot_latency(&runs, &latency)?;
    writeln!(out, "figures: {} {}", growth.display(), latency.display())?;
    Ok(())
}

const COLORS: [RGBColor; 8] = [
    RED,
    BLUE,
    GREEN,
    MAGENTA,
    CYAN,
    BLACK,
    RGBColor(255, 140, 0),
    RGBColor(128, 128, 128),
];

fn plot_growth(runs: &[(Config, Run)], path: &std::path::Path) -> Result<()> {
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let calls = runs.iter().map(|(_, r)| r.calls).max().unwrap_or(1);
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
    let mut chart = ChartBuilder::on(&root)
        .caption("RSS growth against calls", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(60)
        .build_cartesian_2d(1f64..calls as f64, min_mib..max_mib * 1.05)?;
    chart
        .configure_mesh()
        .x_desc("calls")
        .y_desc("RSS growth since call 1 (MiB)")
        .draw()?;
    for (i, (config, run)) in runs.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(growth(run), color.stroke_width(2)))?
            .label(config.label())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

fn plot_latency(runs: &[(Config, Run)], path: &std::path::Path) -> Result<()> {
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    // Exact-policy runs by budget; unlimited is drawn at the largest cache peak seen.
    let max_peak = runs
        .iter()
        .map(|(_, r)| r.cache_peak_bytes)
        .max()
        .unwrap_or(1) as f64
        / (1 << 20) as f64;
    let mut points: Vec<(f64, f64, String)> = runs
        .iter()
        .filter(|(c, r)| c.policy == Policy::Exact && r.capacity.is_none())
        .map(|(_, r)| {
            let mib = match primjit::Budget::parse(&r.budget) {
                Ok(primjit::Budget::Bytes(b)) => b as f64 / (1 << 20) as f64,
                _ => max_peak,
            };
            (mib, r.time_mean_s * 1e3, r.budget.clone())
        })
        .collect();
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    let max_x = points.iter().map(|p| p.0).fold(1.0, f64::max) * 1.1;
    let max_y = points.iter().map(|p| p.1).fold(1.0, f64::max) * 1.2;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "mean latency against cache budget (exact policy)",
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..max_x, 0f64..max_y)?;
    chart
        .configure_mesh()
        .x_desc("budget (MiB; unlimited at the largest cache peak)")
        .y_desc("mean ms per call")
        .draw()?;
    chart.draw_series(LineSeries::new(
        points.iter().map(|p| (p.0, p.1)),
        BLUE.stroke_width(2),
    ))?;
    chart.draw_series(
        points
            .iter()
            .map(|p| Circle::new((p.0, p.1), 4, BLUE.filled())),
    )?;
    chart.draw_series(
        points
            .iter()
            .map(|p| Text::new(p.2.clone(), (p.0, p.1), ("sans-serif", 14))),
    )?;
    root.present()?;
    Ok(())
}
