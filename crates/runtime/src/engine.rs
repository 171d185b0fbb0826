//! The engine: compiles keys through its cache, owns the thread pool, and traces.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use primjit_codegen::{CallExtents, CodegenOptions, Dumps, Isa, PrimitiveKey, compile, host_isa};

use crate::cache::{CacheKey, Lookup, PrimitiveCache};
use crate::config::{self, ConfigError, EngineConfig, WorkspaceConfig};
use crate::error::RuntimeError;
use crate::exec::ExecArgs;
use crate::exec::{PageSource, SystemPages};
use crate::perf_map::PerfMap;
use crate::primitive::Primitive;

/// What [`Engine::prefetch`] assumes a kernel may cost the cache: the trunk's largest, conv1
/// with its fused pool at runtime widths, takes 78 KB (76 KB of code), its Winograd kernels
/// 25-30 KB.
const PREFETCH_ENTRY_BYTES: usize = 256 << 10;

fn trace_line(line: &str) {
    eprintln!("primjit_verbose,{line}");
}

/// Where the workers of one hot run ([`Engine::run_hot`]) start, so that no two share a CPU.
///
/// Why: the run's caller wakes every worker at once, and the scheduler often puts two of
/// them on one CPU while another sits idle. The worker running the graph and a busily waiting
/// one then took turns on that CPU a scheduler tick at a time (4 ms at 250 Hz) until the load
/// balancer moved one: the second worker started 1.4-5.4 ms into the run instead of 16-65 µs,
/// and a run of the trunk at W=200 took 4-9 ms (12-26%) longer
/// (docs/decisions/012-worker-check-in.md).
/// Each worker now records its CPU, waits for the others (yielding its CPU, so that a worker
/// queued behind it can record its own), and one that shares its CPU with a worker of a lower
/// index moves to one no worker is on.
struct CheckIn {
    /// Each worker's CPU when it arrived ([`UNKNOWN_CPU`] if the system did not tell).
    cpus: Vec<AtomicUsize>,
    arrived: AtomicUsize,
}

const UNKNOWN_CPU: usize = usize::MAX;

impl CheckIn {
    fn new(workers: usize) -> Self {
        CheckIn {
            cpus: (0..workers)
                .map(|_| AtomicUsize::new(UNKNOWN_CPU))
                .collect(),
            arrived: AtomicUsize::new(0),
        }
    }

    /// Records worker `index`'s CPU, waits until every worker has, then moves it to a CPU of
    /// its own where it shares one ([`spare_cpu`]). Moving is best effort: where the system
    /// refuses, the worker stays and the scheduler balances as before.
    fn arrive(&self, index: usize) {
        let cpu = crate::exec::current_cpu().unwrap_or(UNKNOWN_CPU);
        self.cpus[index].store(cpu, Ordering::Relaxed);
        self.arrived.fetch_add(1, Ordering::AcqRel);
        while self.arrived.load(Ordering::Acquire) < self.cpus.len() {
            // A worker queued on this CPU runs only when this one stops: yield the CPU, not
            // only to rayon's jobs.
            if rayon::yield_now() != Some(rayon::Yield::Executed) {
                std::thread::yield_now();
            }
        }
        let cpus: Vec<usize> = self
            .cpus
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        let target = spare_cpu(index, &cpus, || {
            crate::exec::allowed_cpus().unwrap_or_default()
        });
        if let Some(target) = target {
            let _ = crate::exec::move_current_thread(target);
        }
    }
}

/// The CPU worker `index` should move to, given the CPU each worker started on: none if no
/// worker of a lower index started on its CPU (or its CPU is unknown); else, if it is the
/// k-th such worker, the k-th of the `allowed` CPUs (ascending) that no worker started on, if
/// there is one. `allowed` is asked only for a worker that moves.
fn spare_cpu(index: usize, cpus: &[usize], allowed: impl FnOnce() -> Vec<usize>) -> Option<usize> {
    let shares = |i: usize| cpus[i] != UNKNOWN_CPU && cpus[..i].contains(&cpus[i]);
    if !shares(index) {
        return None;
    }
    let rank = (0..index).filter(|&i| shares(i)).count();
    allowed()
        .into_iter()
        .filter(|cpu| !cpus.contains(cpu))
        .nth(rank)
}

thread_local! {
    /// The engine (by address) whose graph run this thread drives alone, outside the engine's
    /// pool ([`Engine::run_hot`]), or 0: the run's kernels and copies then run on this thread.
    static SOLO_RUN: Cell<usize> = const { Cell::new(0) };
}

/// Marks this thread as driving a solo run of one engine until dropped (also on a panic),
/// restoring what it marked before.
struct SoloRun<'a> {
    previous: usize,
    solo_runs: &'a AtomicUsize,
}

impl<'a> SoloRun<'a> {
    fn enter(engine: &'a Engine) -> Self {
        engine.solo_runs.fetch_add(1, Ordering::AcqRel);
        SoloRun {
            previous: SOLO_RUN.replace(engine.address()),
            solo_runs: &engine.solo_runs,
        }
    }
}

impl Drop for SoloRun<'_> {
    fn drop(&mut self) {
        SOLO_RUN.set(self.previous);
        self.solo_runs.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Compiles primitives through a byte-budgeted cache and runs them on a thread pool.
///
/// An engine is `Send + Sync`: share one (in an `Arc`) between all the threads of a server.
/// Graph runs of several threads, on one model or on several models of the engine, run at
/// once: the first takes the pool, the others each run on their calling thread
/// (`Engine::run_hot`); all share the primitive cache.
pub struct Engine {
    cache: PrimitiveCache,
    pool: rayon::ThreadPool,
    codegen: CodegenOptions,
    pages: Box<dyn PageSource>,
    verbose: u8,
    workspace: WorkspaceConfig,
    perf_map: Option<PerfMap>,
    compile_ahead: bool,
    /// The process that created the engine, the only one where its pool's threads run.
    process: u32,
    /// Whether a graph run's waiting threads spin ([`Engine::run_hot`]): only where each can
    /// have a core of its own.
    spin_waits: bool,
    /// The widest vector tier of the kernels this engine compiles.
    isa: Isa,
    /// Whether a graph run holds the pool ([`Engine::run_hot`]).
    pool_busy: AtomicBool,
    /// Graph runs on their callers' threads at the moment ([`SoloRun`]): while there are any,
    /// the pool's waiting threads yield their CPUs instead of spinning.
    solo_runs: AtomicUsize,
}

impl Engine {
    /// The most threads an engine runs: 1,024, above the hardware threads of today's largest
    /// two-socket hosts (768), so that no real machine is refused, while a typo (`10**6`,
    /// 65,535) fails at once instead of starting every OS thread up front (31 s at 8,000) with
    /// nothing to run on them. rayon's own limit is 65,535.
    pub const MAX_THREADS: usize = config::MAX_THREADS;

    pub fn new(config: EngineConfig) -> Result<Self, RuntimeError> {
        Self::with_pages(config, Box::new(SystemPages))
    }

    /// An engine whose executable pages come from `pages` (for fault injection).
    pub fn with_pages(
        config: EngineConfig,
        pages: Box<dyn PageSource>,
    ) -> Result<Self, RuntimeError> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = if config.threads == 0 {
            cores
        } else {
            config.threads
        };
        if threads > Self::MAX_THREADS {
            return Err(ConfigError::TooManyThreads(threads).into());
        }
        let isa = Isa::capped(Isa::host(), config.max_isa).map_err(ConfigError::from)?;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("primjit-{i}"))
            .build()
            .map_err(|e| ConfigError::ThreadPool(e.to_string()))?;
        let trace = (config.verbose >= 1).then_some(trace_line as fn(&str));
        let perf_map = config.perf_map.then(PerfMap::open).transpose()?;
        Ok(Engine {
            cache: PrimitiveCache::new(config.cache).with_trace(trace),
            pool,
            codegen: config.codegen,
            pages,
            verbose: config.verbose,
            workspace: config.workspace,
            perf_map,
            compile_ahead: config.compile_ahead,
            process: std::process::id(),
            spin_waits: threads <= cores,
            isa,
            pool_busy: AtomicBool::new(false),
            solo_runs: AtomicUsize::new(0),
        })
    }

    /// Whether this is the process that created the engine. A child of `fork` inherits the
    /// engine but not its pool's threads, so that a run there would wait for them forever;
    /// runs call this first and return [`ConfigError::OtherProcess`] instead.
    pub fn check_process(&self) -> Result<(), ConfigError> {
        let current = std::process::id();
        if current == self.process {
            Ok(())
        } else {
            Err(ConfigError::OtherProcess {
                created: self.process,
                current,
            })
        }
    }

    pub fn cache(&self) -> &PrimitiveCache {
        &self.cache
    }

    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// The widest vector tier of this engine's kernels: the host's, or the cap's.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// The engine's address, which [`SOLO_RUN`] records.
    fn address(&self) -> usize {
        std::ptr::from_ref(self) as usize
    }

    /// Whether work started on this thread may use the pool: not on a one-thread engine, nor
    /// in a graph run that this thread drives alone ([`Engine::run_hot`]).
    pub(crate) fn uses_pool(&self) -> bool {
        self.pool.current_num_threads() > 1 && SOLO_RUN.get() != self.address()
    }

    /// What a graph run keeps of a workspace that has no budget of its own.
    pub fn workspace_config(&self) -> WorkspaceConfig {
        self.workspace
    }

    pub fn codegen_options(&self) -> CodegenOptions {
        self.codegen
    }

    /// Returns the primitive of `key`, from the cache or freshly compiled.
    ///
    /// A key of a tier above the engine's is refused ([`RuntimeError::Tier`]): its code could
    /// use instructions this host lacks, or that the cap rules out.
    pub fn compile(&self, key: &PrimitiveKey) -> Result<Arc<Primitive>, RuntimeError> {
        let start = Instant::now();
        if key.isa() > self.isa {
            return Err(RuntimeError::Tier {
                key: key.to_string(),
                tier: key.isa(),
                engine: self.isa,
            });
        }
        let host = host_isa(self.codegen.verify)?;
        let cache_key = CacheKey {
            key: key.clone(),
            isa: host.description.as_str(),
            options: self.codegen,
        };
        let (result, lookup) = self.cache.get_or_compile(&cache_key, || self.build(key));
        if self.verbose >= 1
            && let Ok(p) = &result
        {
            // A miss reports the compile's time, also for a kernel compiled ahead of this
            // lookup (`prefetch`); a hit, the lookup's.
            let (event, seconds) = match lookup {
                Lookup::Hit | Lookup::Joined => ("create:cache_hit", start.elapsed()),
                Lookup::Compiled => ("create:cache_miss", p.compile_time()),
            };
            trace_line(&format!(
                "{event},{key},{},{:.3}",
                p.memory().total(),
                seconds.as_secs_f64() * 1e3
            ));
        }
        result
    }

    /// With `EngineConfig::compile_ahead`, compiles the kernels of `keys` that the cache lacks,
    /// at once on the engine's threads, so that a run which needs several new kernels waits
    /// for the longest rather than for their sum (a streamed call's first run at a new width
    /// compiles two dozen). The statistics stay those of the run's own lookups
    /// ([`PrimitiveCache::prefetch`]). Nothing happens on one thread, for fewer than two
    /// missing kernels, or where they might not all fit the cache's bounds (at
    /// [`PREFETCH_ENTRY_BYTES`] each), since evicting one before its use would compile it
    /// twice. Compile errors surface at the lookups.
    pub(crate) fn prefetch<'k>(&self, keys: impl IntoIterator<Item = &'k PrimitiveKey>) {
        if !self.compile_ahead || !self.uses_pool() {
            return;
        }
        let Ok(host) = host_isa(self.codegen.verify) else {
            return;
        };
        // A streamed run lists hundreds of calls of a few dozen kernels: each distinct key is
        // looked for in the cache once.
        let mut seen = std::collections::HashSet::new();
        let missing: Vec<CacheKey> = keys
            .into_iter()
            .filter(|key| seen.insert(*key))
            .map(|key| CacheKey {
                key: key.clone(),
                isa: host.description.as_str(),
                options: self.codegen,
            })
            .filter(|cache_key| !self.cache.holds(cache_key))
            .collect();
        if missing.len() < 2 || !self.cache.has_room(missing.len(), PREFETCH_ENTRY_BYTES) {
            return;
        }
        self.pool.scope(|s| {
            for cache_key in &missing {
                s.spawn(move |_| {
                    self.cache
                        .prefetch(cache_key, || self.build(&cache_key.key))
                });
            }
        });
        // The compiles freed megabytes in every thread's malloc arena, which glibc keeps
        // resident: returned now, before the run's activations take their pages, they add less
        // to the process's peak (the main job's `VmHWM` 229.8-234.3 MB against 237.7 without,
        // 224.4-224.9 MB with one compile at a time).
        crate::exec::return_free_heap();
    }

    /// Compiles `key` and places it in fresh pages; when mapping fails (for example at
    /// `vm.max_map_count`), frees the cache's pages and tries once more.
    fn build(&self, key: &PrimitiveKey) -> Result<Primitive, RuntimeError> {
        let kernel = compile(key, self.codegen, Dumps::default())?;
        let primitive = match Primitive::new(&kernel, &*self.pages) {
            Ok(p) => p,
            Err(_) => {
                self.cache.clear();
                Primitive::new(&kernel, &*self.pages).map_err(|e| RuntimeError::Map {
                    key: key.to_string(),
                    message: e.to_string(),
                })?
            }
        };
        if let Some(map) = &self.perf_map {
            map.record(&primitive)?;
        }
        Ok(primitive)
    }

    /// Runs `f` on the engine's thread pool (for its own data-parallel work, such as copies);
    /// callers check [`Engine::uses_pool`] first.
    pub(crate) fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
    }

    /// Runs `f` (a graph run: a sequence of parallel kernel calls with serial work between
    /// them) on the engine's first thread while every other thread waits for its calls' work
    /// items busily, taking each as soon as it is posted, instead of going to sleep between
    /// calls (as OpenMP's active wait policy does, and onnxruntime's spinning pool).
    ///
    /// Without it, a thread that slept between two calls was woken by the next one too late
    /// for the call's few work items: on the trunk at W=232 (2 threads), a kernel with two
    /// work items often ran both on the calling thread. The waiting threads spin only while
    /// `f` runs; between runs they sleep as usual. `f` always runs on the same thread, so
    /// what it allocates (compiled code, small buffers) stays in one malloc arena: with the
    /// run on whichever thread was free, glibc kept arenas of both, 8 MB more after the
    /// workload's widest call.
    ///
    /// With more threads than the process has cores, spinning threads take the cores from
    /// the ones with work (a tiny conv on 4,096 threads of 2 cores took 157 s a run): the run
    /// then goes to the pool as any job, and its waiting threads sleep.
    ///
    /// One run holds the pool at a time. A run that finds it held (another thread's run, on
    /// this model or another of the engine's), and every run of a one-thread engine, runs on
    /// its calling thread alone instead of waiting: its kernels and copies run on that
    /// thread, and the pool's waiting threads yield their CPUs to it rather than spin.
    /// Queued behind the pool, two threads calling one model of a one-thread engine on two
    /// cores had 0.97-1.00x the throughput of one.
    pub(crate) fn run_hot<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        if self.pool.current_num_threads() <= 1
            || self
                .pool_busy
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
        {
            let _solo = SoloRun::enter(self);
            return f();
        }
        let _release = ClearOnDrop(&self.pool_busy);
        if !self.spin_waits {
            return self.pool.install(f);
        }
        let done = AtomicBool::new(false);
        let job = Mutex::new(Some(f));
        let check_in = CheckIn::new(self.pool.current_num_threads());
        let mut results = self.pool.broadcast(|ctx| {
            check_in.arrive(ctx.index());
            if ctx.index() != 0 {
                while !done.load(Ordering::Acquire) {
                    if rayon::yield_now() != Some(rayon::Yield::Executed) {
                        if self.solo_runs.load(Ordering::Relaxed) > 0 {
                            std::thread::yield_now();
                        } else {
                            std::hint::spin_loop();
                        }
                    }
                }
                return None;
            }
            let f = job.lock().unwrap_or_else(PoisonError::into_inner).take()?;
            // Also when `f` panics: the waiting threads must stop for the broadcast to end.
            let _stop = SetOnDrop(&done);
            Some(f())
        });
        results
            .swap_remove(0)
            .expect("the first thread runs the job once")
    }

    /// Runs `primitive` with its rows split across the engine's threads.
    pub fn execute(&self, primitive: &Primitive, args: ExecArgs<'_>) -> Result<(), RuntimeError> {
        self.run_as(primitive, args, None, false)
    }

    /// Runs a primitive with runtime extents for input extents `[ih, iw]` (or a
    /// `CallExtents`, which a resize to runtime sizes needs), its rows split across the
    /// engine's threads.
    pub fn execute_at(
        &self,
        primitive: &Primitive,
        args: ExecArgs<'_>,
        extents: impl Into<CallExtents>,
    ) -> Result<(), RuntimeError> {
        self.run_as(primitive, args, Some(extents.into()), false)
    }

    /// Runs a conv whose destination holds its residual on entry, writing its output over it
    /// (see [`Primitive::execute_over_residual`]), its rows split across the engine's threads;
    /// `extents` for a primitive with runtime extents.
    pub fn execute_over_residual(
        &self,
        primitive: &Primitive,
        args: ExecArgs<'_>,
        extents: Option<[usize; 2]>,
    ) -> Result<(), RuntimeError> {
        self.run_as(primitive, args, extents.map(CallExtents::from), true)
    }

    fn run_as(
        &self,
        primitive: &Primitive,
        args: ExecArgs<'_>,
        extents: Option<CallExtents>,
        over_residual: bool,
    ) -> Result<(), RuntimeError> {
        self.check_process()?;
        let start = Instant::now();
        let pool = self.uses_pool().then_some(&self.pool);
        if over_residual {
            // Only convolutions write over a residual: their extents are their input's.
            primitive.execute_over_residual(args, extents.map(|e| e.input), pool)?;
        } else if let Some(pool) = pool {
            primitive.execute_parallel(args, extents, pool)?;
        } else {
            match extents {
                None => primitive.execute(args)?,
                Some(e) => primitive.execute_at(args, e)?,
            }
        }
        if self.verbose >= 2 {
            trace_line(&format!(
                "exec,{},{},{:.3}",
                primitive.key(),
                primitive.memory().total(),
                start.elapsed().as_secs_f64() * 1e3
            ));
        }
        Ok(())
    }
}

/// `Engine` must be shareable between threads; this fails to compile if it stops being so.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Engine>();
    assert_send_sync::<Primitive>();
};

/// Sets its flag when dropped: the end of a hot run, however it ends.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Clears its flag when dropped: the pool's release at the end of a run that held it.
struct ClearOnDrop<'a>(&'a AtomicBool);

impl Drop for ClearOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    fn engine(threads: usize) -> Engine {
        Engine::new(EngineConfig {
            threads,
            ..EngineConfig::default()
        })
        .expect("an engine")
    }

    /// Work posted inside a hot run is all done, on any thread count, and the run's value comes
    /// back.
    #[test]
    fn a_hot_run_completes_its_parallel_work() {
        for threads in [1, 2, 3] {
            let e = engine(threads);
            let done = AtomicUsize::new(0);
            let value = e.run_hot(|| {
                for _ in 0..10 {
                    rayon::scope(|s| {
                        for _ in 0..7 {
                            s.spawn(|_| {
                                done.fetch_add(1, Ordering::Relaxed);
                            });
                        }
                    });
                }
                42
            });
            assert_eq!((value, done.load(Ordering::Relaxed)), (42, 70), "{threads}");
        }
    }

    /// rayon would start fewer threads than asked beyond its limit; the engine refuses them.
    #[test]
    fn more_threads_than_the_pool_runs_are_a_config_error() {
        assert!(Engine::MAX_THREADS <= rayon::max_num_threads());
        for threads in [Engine::MAX_THREADS + 1, usize::MAX] {
            let config = EngineConfig {
                threads,
                ..EngineConfig::default()
            };
            let err = Engine::new(config).err().expect("too many threads");
            assert_eq!(
                err,
                RuntimeError::Config(ConfigError::TooManyThreads(threads))
            );
            assert!(
                err.to_string()
                    .starts_with(&format!("threads {threads}: expected 0"))
            );
        }
    }

    /// A run that panics still releases the waiting threads (else the run would never return):
    /// the panic reaches the caller, and the engine runs again.
    #[test]
    fn a_panicking_hot_run_releases_the_waiting_threads() {
        let e = engine(2);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            e.run_hot(|| panic!("a kernel's caller failed"))
        }));
        assert!(caught.is_err());
        assert_eq!(e.run_hot(|| 7), 7);
    }

    /// Workers that start on distinct CPUs, or on CPUs the system did not tell, stay; the
    /// second, third... worker on a CPU already taken moves to the first, second... CPU that no
    /// worker is on, in the allowed order, while there is one; the allowed CPUs are asked only
    /// of a worker that moves.
    #[test]
    fn only_workers_sharing_a_cpu_move_and_each_to_its_own_spare_cpu() {
        let u = UNKNOWN_CPU;
        let never = || -> Vec<usize> { panic!("asked for the allowed cpus") };
        for cpus in [&[0, 1][..], &[3, 1, 2], &[u, u], &[5]] {
            for index in 0..cpus.len() {
                assert_eq!(spare_cpu(index, cpus, never), None, "{cpus:?} {index}");
            }
        }
        let allowed = || vec![0, 1, 2, 3, 4];
        let cpus = [1, 1, 3, 1, 3, u, 0];
        let moves: Vec<_> = (0..cpus.len())
            .map(|i| spare_cpu(i, &cpus, allowed))
            .collect();
        assert_eq!(moves, [None, Some(2), None, Some(4), None, None, None]);
        // More sharing workers than spare CPUs: the last ones stay.
        let cpus = [0, 0, 0];
        let moves: Vec<_> = (0..3).map(|i| spare_cpu(i, &cpus, || vec![0, 1])).collect();
        assert_eq!(moves, [None, Some(1), None]);
        assert_eq!(spare_cpu(1, &[2, 2], Vec::new), None);
    }

    /// Hot runs of one engine from several threads at once all complete, each with all its
    /// work, although each run's workers wait for one another at its check-in. A deadlock
    /// fails the test after two minutes instead of hanging it.
    #[test]
    fn hot_runs_from_several_threads_at_once_complete() {
        let e = Arc::new(engine(2));
        let (sender, finished) = std::sync::mpsc::channel();
        for _ in 0..3 {
            let (e, sender) = (Arc::clone(&e), sender.clone());
            std::thread::spawn(move || {
                let done = AtomicUsize::new(0);
                for _ in 0..50 {
                    let value = e.run_hot(|| {
                        rayon::scope(|s| {
                            for _ in 0..4 {
                                s.spawn(|_| {
                                    done.fetch_add(1, Ordering::Relaxed);
                                });
                            }
                        });
                        5
                    });
                    assert_eq!(value, 5);
                }
                sender.send(done.into_inner()).unwrap();
            });
        }
        // A thread that panics drops its sender: then the wait ends at once.
        drop(sender);
        for _ in 0..3 {
            let done = finished
                .recv_timeout(std::time::Duration::from_secs(120))
                .expect("every thread's hot runs end");
            assert_eq!(done, 50 * 4);
        }
    }

    /// A run that finds the pool held by another thread's run runs on its own thread, without
    /// waiting for the other to end; so does every run of a one-thread engine. A deadlock
    /// fails the test after two minutes instead of hanging it.
    #[test]
    fn a_run_that_finds_the_pool_held_runs_on_its_caller_at_once() {
        let one = engine(1);
        assert_eq!(one.run_hot(rayon::current_thread_index), None);
        let e = Arc::new(engine(2));
        let (started, holding) = std::sync::mpsc::channel();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let holder = {
            let e = Arc::clone(&e);
            std::thread::spawn(move || {
                e.run_hot(move || {
                    started.send(()).unwrap();
                    // Held until the second run below has ended (or the test gave up).
                    let _ = released.recv_timeout(std::time::Duration::from_secs(120));
                    rayon::current_thread_index()
                })
            })
        };
        holding
            .recv_timeout(std::time::Duration::from_secs(120))
            .expect("the first run starts");
        let (sender, second) = std::sync::mpsc::channel();
        {
            let e = Arc::clone(&e);
            std::thread::spawn(move || {
                let ran_on = e.run_hot(|| (rayon::current_thread_index(), e.uses_pool()));
                sender.send(ran_on).unwrap();
            });
        }
        let ran_on = second
            .recv_timeout(std::time::Duration::from_secs(120))
            .expect("the second run ends while the first holds the pool");
        // On its caller, which no pool thread is, and its kernels keep off the pool.
        assert_eq!(ran_on, (None, false));
        release.send(()).unwrap();
        assert_eq!(holder.join().unwrap(), Some(0));
        // The pool is free again: the next run takes it.
        assert_eq!(e.run_hot(rayon::current_thread_index), Some(0));
        assert!(e.uses_pool());
    }

    /// Every hot run of an engine with at most a thread per core runs on the pool's first
    /// thread, so that its allocations stay in one malloc arena; one with more threads than
    /// cores runs it as an ordinary job (its waiting threads would spin on others' cores).
    #[test]
    fn hot_runs_run_on_the_first_thread() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        for threads in [2, 3].into_iter().filter(|&t| t <= cores) {
            let e = engine(threads);
            for _ in 0..5 {
                assert_eq!(e.run_hot(rayon::current_thread_index), Some(0));
            }
        }
        let e = engine(cores + 1);
        assert!(!e.spin_waits);
        for _ in 0..5 {
            assert!(
                e.run_hot(rayon::current_thread_index)
                    .is_some_and(|i| i <= cores)
            );
        }
    }
}
