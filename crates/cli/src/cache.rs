//! `primjit cache`: runs a model over the first widths of a workload and prints what the
//! primitive cache holds: its statistics and its entries, most recently used first.

use std::io::Write;

use anyhow::Result;

use crate::bench;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub bench: bench::Args,

    /// How many entries to list (most recently used first); all with 0
    #[arg(long, default_value_t = 20, value_parser = crate::workload::parse_count)]
    pub entries: usize,
}

pub fn run(args: &Args) -> Result<()> {
    let (_, engine) = bench::bench(&args.bench)?;
    let stats = engine.cache().stats();
    let mut out = std::io::stdout().lock();
    let budget = stats
        .budget
        .map_or("unlimited".to_string(), |b| b.to_string());
    writeln!(out, "cache stats:")?;
    writeln!(
        out,
        "  entries {}, bytes {} (mapped {}), peak {}, budget {budget}, capacity {}",
        stats.entries,
        stats.bytes,
        stats.mapped_bytes,
        stats.peak_bytes,
        stats.capacity.map_or("none".to_string(), |c| c.to_string())
    )?;
    writeln!(
        out,
        "  hits {}, misses {}, compiles {} ({} failed), evictions {} ({} bytes freed)",
        stats.hits,
        stats.misses,
        stats.compiles,
        stats.failed_compiles,
        stats.evictions,
        stats.evicted_bytes
    )?;
    writeln!(
        out,
        "  compile time {:.3} s total, {:.3} ms max",
        stats.compile_time.as_secs_f64(),
        stats.max_compile_time.as_secs_f64() * 1e3
    )?;
    let entries = engine.cache().entries();
    let shown = if args.entries == 0 {
        entries.len()
    } else {
        args.entries.min(entries.len())
    };
    writeln!(
        out,
        "entries (most recently used first; {shown} of {}):",
        entries.len()
    )?;
    writeln!(
        out,
        "  {:>6} {:>6} {:>6} {:>6} {:>5} {:>9} {:>10}  key",
        "code", "mapped", "heap", "total", "hits", "idle ms", "compile ms"
    )?;
    for e in entries.iter().take(shown) {
        writeln!(
            out,
            "  {:>6} {:>6} {:>6} {:>6} {:>5} {:>9.1} {:>10.3}  {}",
            e.memory.code,
            e.memory.mapped,
            e.memory.heap,
            e.memory.total(),
            e.hits,
            e.idle.as_secs_f64() * 1e3,
            e.compile_time.as_secs_f64() * 1e3,
            e.key
        )?;
    }
    Ok(())
}
