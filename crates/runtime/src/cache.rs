//! The primitive cache: least-recently-used, bounded in bytes (and optionally in entries),
//! shared by all threads, with single-flight compilation and statistics.
//!
//! Every peer bounds its cache by a count of entries; this one counts what each primitive
//! really costs ([`crate::PrimitiveMemory::total`]), so the bound holds in bytes. Evicting
//! drops the cache's `Arc`: the pages are unmapped as soon as no execution still holds the
//! primitive, never under running code.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use lru::LruCache;
use primjit_codegen::{CodegenOptions, PrimitiveKey};

use crate::config::{Budget, CacheConfig};
use crate::error::RuntimeError;
use crate::primitive::{Primitive, PrimitiveMemory};

/// What makes two compiled kernels interchangeable: the key, the ISA flags and the options.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CacheKey {
    pub key: PrimitiveKey,
    pub isa: &'static str,
    pub options: CodegenOptions,
}

/// Counters of the cache since it was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub entries: usize,
    pub bytes: usize,
    pub peak_bytes: usize,
    /// The mapped pages of the entries (a part of `bytes`).
    pub mapped_bytes: usize,
    pub budget: Option<usize>,
    pub capacity: Option<usize>,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    pub evicted_bytes: u64,
    pub compiles: u64,
    /// Compiles made ahead of their first lookup, by a run on several threads that needed
    /// more than one new kernel (`Engine::prefetch`); a part of `compiles`.
    pub prefetched: u64,
    pub failed_compiles: u64,
    pub compile_time: Duration,
    pub max_compile_time: Duration,
}

/// One entry, as [`PrimitiveCache::entries`] lists it.
#[derive(Clone, Debug)]
pub struct EntryInfo {
    pub key: String,
    pub memory: PrimitiveMemory,
    pub hits: u64,
    pub idle: Duration,
    pub compile_time: Duration,
}

struct Entry {
    primitive: Arc<Primitive>,
    hits: u64,
    last_used: Instant,
    /// Compiled by [`PrimitiveCache::prefetch`] and not looked up since: its first lookup
    /// counts the miss that its compile stood for.
    prefetched: bool,
}

/// How a flight ended: its result, or `None` if the compiling thread panicked.
type Outcome = Option<Result<Arc<Primitive>, RuntimeError>>;

/// A compile in progress that other callers of the same key wait for.
#[derive(Default)]
struct Flight {
    /// `None` while compiling; `Some(None)` if the compiling thread panicked (waiters then
    /// look the key up again).
    result: Mutex<Option<Outcome>>,
    done: Condvar,
}

/// Withdraws a flight whose compile panicked, so that neither its waiters nor later callers
/// of the key wait forever; defused with `mem::forget` when the compile returns.
struct Abandon<'a> {
    cache: &'a PrimitiveCache,
    key: &'a CacheKey,
    flight: &'a Flight,
}

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        {
            let mut state = lock(&self.cache.state);
            state.in_flight.remove(self.key);
            state.stats.failed_compiles += 1;
        }
        *lock(&self.flight.result) = Some(None);
        self.flight.done.notify_all();
    }
}

struct State {
    lru: LruCache<CacheKey, Entry>,
    in_flight: HashMap<CacheKey, Arc<Flight>>,
    config: CacheConfig,
    stats: CacheStats,
}

/// How a lookup was served, for tracing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    Hit,
    /// Another caller was compiling the key; this one waited for its result.
    Joined,
    Compiled,
}

/// A thread-safe LRU cache of primitives bounded in bytes.
pub struct PrimitiveCache {
    state: Mutex<State>,
    trace: Option<fn(&str)>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves consistent data here (every update is a few
    // assignments), so a poisoned lock is still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl PrimitiveCache {
    pub fn new(config: CacheConfig) -> Self {
        let stats = CacheStats {
            budget: budget_bytes(config.budget),
            capacity: config.capacity,
            ..CacheStats::default()
        };
        PrimitiveCache {
            state: Mutex::new(State {
                lru: LruCache::unbounded(),
                in_flight: HashMap::new(),
                config,
                stats,
            }),
            trace: None,
        }
    }

    /// Sends one line per eviction to `trace` (the engine's verbose output).
    pub(crate) fn with_trace(mut self, trace: Option<fn(&str)>) -> Self {
        self.trace = trace;
        self
    }

    /// Returns the cached primitive of `key`, or compiles it with `compile` (once, however
    /// many threads ask at the same time) and keeps it if it fits the budget.
    pub fn get_or_compile(
        &self,
        key: &CacheKey,
        compile: impl FnOnce() -> Result<Primitive, RuntimeError>,
    ) -> (Result<Arc<Primitive>, RuntimeError>, Lookup) {
        let flight = loop {
            let mut state = lock(&self.state);
            if let Some(entry) = state.lru.get_mut(key) {
                entry.last_used = Instant::now();
                let p = entry.primitive.clone();
                if std::mem::take(&mut entry.prefetched) {
                    state.stats.misses += 1;
                    return (Ok(p), Lookup::Compiled);
                }
                entry.hits += 1;
                state.stats.hits += 1;
                return (Ok(p), Lookup::Hit);
            }
            state.stats.misses += 1;
            if let Some(f) = state.in_flight.get(key) {
                let f = f.clone();
                drop(state);
                let mut result_slot = lock(&f.result);
                while result_slot.is_none() {
                    result_slot = f.done.wait(result_slot).unwrap_or_else(|p| p.into_inner());
                }
                match result_slot.clone().expect("set before notify") {
                    Some(result) => {
                        drop(result_slot);
                        // This lookup counted the miss that a prefetch's compile stood for.
                        if let Some(entry) = lock(&self.state).lru.peek_mut(key) {
                            entry.prefetched = false;
                        }
                        return (result, Lookup::Joined);
                    }
                    // The compiling thread panicked: look again (and compile if need be).
                    None => continue,
                }
            }
            let f = Arc::new(Flight::default());
            state.in_flight.insert(key.clone(), f.clone());
            break f;
        };

        let result = self.fly(key, &flight, compile, false);
        (result, Lookup::Compiled)
    }

    /// Whether the cache holds `key`, or is compiling it; neither counts as a lookup nor
    /// touches the entry's recency.
    pub(crate) fn holds(&self, key: &CacheKey) -> bool {
        let state = lock(&self.state);
        state.lru.contains(key) || state.in_flight.contains_key(key)
    }

    /// Whether `count` more entries of at most `bytes_each` would fit the budget and the
    /// capacity without evicting anything.
    pub(crate) fn has_room(&self, count: usize, bytes_each: usize) -> bool {
        let state = lock(&self.state);
        let bytes = state
            .stats
            .bytes
            .saturating_add(count.saturating_mul(bytes_each));
        state.config.budget.allows(bytes)
            && state
                .config
                .capacity
                .is_none_or(|c| state.lru.len() + count <= c)
    }

    /// Compiles `key` ahead of its first lookup, unless the cache holds it or another caller
    /// is compiling it. The statistics stay those of the lookups alone: the compile is
    /// counted, and its entry's first lookup counts the miss; a failed compile is not kept or
    /// counted (the lookup compiles again and reports it).
    pub(crate) fn prefetch(
        &self,
        key: &CacheKey,
        compile: impl FnOnce() -> Result<Primitive, RuntimeError>,
    ) {
        let flight = {
            let mut state = lock(&self.state);
            if state.lru.contains(key) || state.in_flight.contains_key(key) {
                return;
            }
            let f = Arc::new(Flight::default());
            state.in_flight.insert(key.clone(), f.clone());
            f
        };
        let _ = self.fly(key, &flight, compile, true);
    }

    /// Compiles the key of `flight` (registered in `in_flight` by the caller), keeps the
    /// primitive if it fits, and hands the result to the flight's waiters.
    fn fly(
        &self,
        key: &CacheKey,
        flight: &Flight,
        compile: impl FnOnce() -> Result<Primitive, RuntimeError>,
        prefetched: bool,
    ) -> Result<Arc<Primitive>, RuntimeError> {
        let abandon = Abandon {
            cache: self,
            key,
            flight,
        };
        let result = compile().map(Arc::new);
        std::mem::forget(abandon);

        let mut evicted = Vec::new();
        {
            let mut state = lock(&self.state);
            state.in_flight.remove(key);
            match &result {
                Ok(p) => {
                    state.stats.compiles += 1;
                    state.stats.prefetched += u64::from(prefetched);
                    state.stats.compile_time += p.compile_time();
                    state.stats.max_compile_time =
                        state.stats.max_compile_time.max(p.compile_time());
                    let cost = p.memory().total();
                    let fits = state.config.budget.allows(cost) && state.config.capacity != Some(0);
                    if fits {
                        state.lru.put(
                            key.clone(),
                            Entry {
                                primitive: p.clone(),
                                hits: 0,
                                last_used: Instant::now(),
                                prefetched,
                            },
                        );
                        state.stats.bytes += cost;
                        state.stats.mapped_bytes += p.memory().mapped;
                        evicted = Self::shrink(&mut state);
                        // After shrinking: the peak is the most the cache ever held, which
                        // never exceeds a budget that was in force all along.
                        state.stats.peak_bytes = state.stats.peak_bytes.max(state.stats.bytes);
                    }
                    state.stats.entries = state.lru.len();
                }
                Err(_) if prefetched => {}
                Err(_) => state.stats.failed_compiles += 1,
            }
        }
        *lock(&flight.result) = Some(Some(result.clone()));
        flight.done.notify_all();
        self.trace_evictions(&evicted);
        // The evicted primitives are dropped here, outside the lock: their pages are unmapped
        // now, or later by whoever still executes them.
        drop(evicted);
        result
    }

    /// Evicts least-recently-used entries until the cache is within its bounds; returns them
    /// with how long each had been idle.
    fn shrink(state: &mut State) -> Vec<(Arc<Primitive>, Duration)> {
        let mut evicted = Vec::new();
        while !state.config.budget.allows(state.stats.bytes)
            || state.config.capacity.is_some_and(|c| state.lru.len() > c)
        {
            let Some((_, entry)) = state.lru.pop_lru() else {
                break;
            };
            let mem = entry.primitive.memory();
            state.stats.bytes -= mem.total();
            state.stats.mapped_bytes -= mem.mapped;
            state.stats.evictions += 1;
            state.stats.evicted_bytes += mem.total() as u64;
            evicted.push((entry.primitive, entry.last_used.elapsed()));
        }
        state.stats.entries = state.lru.len();
        evicted
    }

    /// One `evict` line per evicted primitive; its milliseconds are how long it had been idle.
    fn trace_evictions(&self, evicted: &[(Arc<Primitive>, Duration)]) {
        if let Some(trace) = self.trace {
            for (p, idle) in evicted {
                trace(&format!(
                    "evict,{},{},{:.3}",
                    p.key(),
                    p.memory().total(),
                    idle.as_secs_f64() * 1e3
                ));
            }
        }
    }

    /// Changes the byte budget, evicting at once what no longer fits.
    pub fn set_budget(&self, budget: Budget) {
        let evicted = {
            let mut state = lock(&self.state);
            state.config.budget = budget;
            state.stats.budget = budget_bytes(budget);
            Self::shrink(&mut state)
        };
        self.trace_evictions(&evicted);
    }

    /// Changes the entry-count capacity, evicting at once what no longer fits.
    pub fn set_capacity(&self, capacity: Option<usize>) {
        let evicted = {
            let mut state = lock(&self.state);
            state.config.capacity = capacity;
            state.stats.capacity = capacity;
            Self::shrink(&mut state)
        };
        self.trace_evictions(&evicted);
    }

    /// Drops every entry (not counted as evictions).
    pub fn clear(&self) {
        let dropped: Vec<Entry> = {
            let mut state = lock(&self.state);
            let dropped = std::iter::from_fn(|| state.lru.pop_lru().map(|(_, e)| e)).collect();
            state.stats.bytes = 0;
            state.stats.mapped_bytes = 0;
            state.stats.entries = 0;
            dropped
        };
        drop(dropped);
    }

    pub fn stats(&self) -> CacheStats {
        lock(&self.state).stats
    }

    pub fn config(&self) -> CacheConfig {
        lock(&self.state).config
    }

    /// The entries, most recently used first.
    pub fn entries(&self) -> Vec<EntryInfo> {
        let state = lock(&self.state);
        let now = Instant::now();
        state
            .lru
            .iter()
            .map(|(_, e)| EntryInfo {
                key: e.primitive.key().to_string(),
                memory: e.primitive.memory(),
                hits: e.hits,
                idle: now.duration_since(e.last_used),
                compile_time: e.primitive.compile_time(),
            })
            .collect()
    }
}

fn budget_bytes(b: Budget) -> Option<usize> {
    match b {
        Budget::Bytes(n) => Some(n),
        Budget::Unlimited => None,
    }
}
