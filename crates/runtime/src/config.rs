//! What the runtime is configured with: byte budgets, the cache's, workspace's and engine's
//! configurations, their strict parsing from `PRIMJIT_*` environment variables, and what is
//! wrong with a value ([`ConfigError`]).
//!
//! The cache, the workspace, the engine and the errors depend on this module and it on no
//! other of the crate, so that each reads its own settings without naming another.

use std::fmt;

use primjit_codegen::{CodegenOptions, ConvAlgoChoice, Isa};

/// A bad configuration value, from the environment or the API.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A malformed `PRIMJIT_*` variable (`EngineConfig::from_env`, `CacheConfig::from_env`):
    /// `name=value` and what was expected. Malformed values are never ignored; fix or unset
    /// the variable.
    #[error("{name}={value}: {reason}")]
    Invalid {
        name: &'static str,
        value: String,
        reason: String,
    },
    /// The engine's rayon pool could not start its threads (`Engine::new`, wrapped in
    /// `RuntimeError::Config`): the operating system refused to spawn a thread (a limit on
    /// processes or memory). Lower `threads` or raise the limit. Not produced by tests: it
    /// needs the process's thread creation to fail, which would disturb the test harness.
    #[error("the thread pool could not be created: {0}")]
    ThreadPool(String),
    /// More threads than an engine runs ([`crate::Engine::MAX_THREADS`], 1,024): refused
    /// before any thread starts, where a mistyped count would otherwise start them all.
    #[error("threads {0}: expected 0 (one per core) to {max}", max = MAX_THREADS)]
    TooManyThreads(usize),
    /// An engine used in a process other than the one that created it: a child of `fork`
    /// (Python's `multiprocessing` forks by default on Linux up to 3.13) inherits the engine
    /// but not its pool's threads, and a run would wait for them forever. Runs
    /// (`Engine::execute`, `CompiledGraph::run_into`) check the process first.
    #[error(
        "this engine was created in process {created}, and a fork does not copy its threads \
         into process {current}: create a new engine in this process"
    )]
    OtherProcess { created: u32, current: u32 },
    /// `PRIMJIT_MAX_ISA` (`EngineConfig::max_isa`) names a vector tier above the host's: the
    /// message lists the tiers the host runs. Lower the cap or unset it.
    #[error(transparent)]
    Isa(#[from] primjit_codegen::IsaError),
}

/// The most threads an engine runs: the value of
/// [`Engine::MAX_THREADS`](crate::Engine::MAX_THREADS), which says why, held here so that
/// `PRIMJIT_THREADS` is checked against it without naming the engine.
pub(crate) const MAX_THREADS: usize = 1024;

/// A byte budget: a number of bytes or no limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Budget {
    Bytes(usize),
    Unlimited,
}

impl Budget {
    /// 64 MiB: room for several thousand primitives of the ResNet34 trunk (each costs a few
    /// KiB) and so for hundreds of distinct widths, while staying a hundredth of what the
    /// original report saw oneDNN grow to.
    pub const DEFAULT: Budget = Budget::Bytes(64 << 20);

    pub(crate) fn allows(self, bytes: usize) -> bool {
        match self {
            Budget::Bytes(b) => bytes <= b,
            Budget::Unlimited => true,
        }
    }

    /// Parses `64MiB`, `512KiB`, `1GiB`, `4096` (bytes), `0` or `unlimited`.
    pub fn parse(text: &str) -> Result<Budget, String> {
        let t = text.trim();
        if t.eq_ignore_ascii_case("unlimited") {
            return Ok(Budget::Unlimited);
        }
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (number, unit) = t.split_at(split);
        let n: usize = number.parse().map_err(|_| {
            "expected a number of bytes such as 64MiB, 512KiB, 0 or unlimited".to_string()
        })?;
        let scale: usize = match unit.trim() {
            "" | "B" => 1,
            "KiB" => 1 << 10,
            "MiB" => 1 << 20,
            "GiB" => 1 << 30,
            other => return Err(format!("unknown unit `{other}` (use B, KiB, MiB or GiB)")),
        };
        n.checked_mul(scale)
            .map(Budget::Bytes)
            .ok_or_else(|| "the budget overflows".to_string())
    }
}

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Budget::Unlimited => f.write_str("unlimited"),
            Budget::Bytes(b) if *b >= 1 << 20 && b % (1 << 20) == 0 => write!(f, "{}MiB", b >> 20),
            Budget::Bytes(b) if *b >= 1 << 10 && b % (1 << 10) == 0 => write!(f, "{}KiB", b >> 10),
            Budget::Bytes(b) => write!(f, "{b}"),
        }
    }
}

/// How the cache is bounded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheConfig {
    pub budget: Budget,
    /// An optional bound on the number of entries, applied with the byte budget, as oneDNN's
    /// `ONEDNN_PRIMITIVE_CACHE_CAPACITY` does alone.
    pub capacity: Option<usize>,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            budget: Budget::DEFAULT,
            capacity: None,
        }
    }
}

impl CacheConfig {
    /// Reads `PRIMJIT_CACHE_BUDGET` and `PRIMJIT_CACHE_CAPACITY`, defaulting what is unset.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_vars(env_var)
    }

    /// As [`CacheConfig::from_env`], reading variables through `var`.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let mut config = CacheConfig::default();
        if let Some(v) = var("PRIMJIT_CACHE_BUDGET") {
            config.budget = Budget::parse(&v).map_err(|reason| ConfigError::Invalid {
                name: "PRIMJIT_CACHE_BUDGET",
                value: v,
                reason,
            })?;
        }
        if let Some(v) = var("PRIMJIT_CACHE_CAPACITY") {
            let n = v
                .trim()
                .parse::<usize>()
                .map_err(|_| ConfigError::Invalid {
                    name: "PRIMJIT_CACHE_CAPACITY",
                    value: v.clone(),
                    reason: "expected a whole number of entries".into(),
                })?;
            config.capacity = Some(n);
        }
        Ok(config)
    }
}

/// How a workspace is bounded (`EngineConfig::workspace`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkspaceConfig {
    /// The most bytes of free buffers a workspace keeps after a run (`PRIMJIT_WORKSPACE_BUDGET`).
    pub budget: Budget,
}

impl WorkspaceConfig {
    /// 8 MiB: the smallest budget whose latency on the benchmark workload stayed within 2% of
    /// an unlimited workspace, by the median of per-call ratios (about 1.5%; 4 MiB: 4-5%;
    /// docs/decisions/014-workspace-budget.md). It holds the buffers of the trunk's calls up
    /// to about 300 columns wide (59 of the workload's first 100 calls; its median width is 232);
    /// after a wider call, the buffers kept take the sizes that the calls within it needed,
    /// which the narrower calls then reuse as they are.
    pub const DEFAULT_BUDGET: Budget = Budget::Bytes(8 << 20);

    /// Reads `PRIMJIT_WORKSPACE_BUDGET` (`64MiB`, `512KiB`, a number of bytes, `0`, `unlimited`),
    /// defaulting what is unset; a malformed value is an error.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let mut config = WorkspaceConfig::default();
        if let Some(v) = var("PRIMJIT_WORKSPACE_BUDGET") {
            config.budget = Budget::parse(&v).map_err(|reason| ConfigError::Invalid {
                name: "PRIMJIT_WORKSPACE_BUDGET",
                value: v,
                reason,
            })?;
        }
        Ok(config)
    }
}

impl Default for WorkspaceConfig {
    fn default() -> Self {
        WorkspaceConfig {
            budget: Self::DEFAULT_BUDGET,
        }
    }
}

/// Everything an [`Engine`](crate::Engine) is configured with.
#[derive(Clone, Debug, Default)]
pub struct EngineConfig {
    pub cache: CacheConfig,
    /// What a graph run's [`crate::Workspace`] keeps between runs, unless it has a budget of its
    /// own.
    pub workspace: WorkspaceConfig,
    /// Threads per execution; 0 means one per available core.
    pub threads: usize,
    pub codegen: CodegenOptions,
    /// `PRIMJIT_VERBOSE`: 0 silent, 1 a line per primitive creation and eviction, 2 also a
    /// line per execution.
    pub verbose: u8,
    /// `PRIMJIT_CONV_ALGO`: the convolution algorithms of graphs compiled for this engine
    /// (`direct`, `winograd` or `auto`). A graph packs its weights for its algorithms, so the
    /// choice is made when it is compiled: pass it to `CompiledGraph::with_conv_algo`.
    pub conv_algo: ConvAlgoChoice,
    /// `PRIMJIT_PERF_MAP`: `1` writes a line per primitive placed in executable pages to
    /// `/tmp/perf-<pid>.map`, where Linux `perf report` finds the kernels' names.
    pub perf_map: bool,
    /// `PRIMJIT_COMPILE_AHEAD`: `1` lets a graph run on more than one thread compile the
    /// kernels it lacks at once, before its first call (`Engine::prefetch`): a cold call
    /// waits for its longest compile rather than for their sum, and the process's peak RSS
    /// grows by a second compiler's working memory (the main job's `VmHWM` by 5-10 MB). Off by
    /// default: a server compiles each of its few dozen kernels once in its life, and keeps
    /// the peak.
    pub compile_ahead: bool,
    /// `PRIMJIT_MAX_ISA`: the widest vector tier the engine's kernels use (`x128`, `avx2` or
    /// `avx512`), as oneDNN's `ONEDNN_MAX_CPU_ISA`; `None` is the host's widest. A cap above
    /// the host's tier is an error ([`ConfigError::Isa`]) that names the tiers it has.
    pub max_isa: Option<Isa>,
}

/// The vector tier of an engine made from the environment: the host's, capped by
/// `PRIMJIT_MAX_ISA`. What a graph packs its weights for unless told a tier.
pub fn env_isa() -> Result<Isa, ConfigError> {
    let cap = max_isa_from(env_var)?;
    Ok(Isa::capped(Isa::host(), cap)?)
}

/// `PRIMJIT_MAX_ISA` from `var`, strictly parsed.
fn max_isa_from(var: impl Fn(&str) -> Option<String>) -> Result<Option<Isa>, ConfigError> {
    var("PRIMJIT_MAX_ISA")
        .map(|v| {
            v.trim().parse().map_err(|_| ConfigError::Invalid {
                name: "PRIMJIT_MAX_ISA",
                value: v.clone(),
                reason: "expected x128, avx2 or avx512".into(),
            })
        })
        .transpose()
}

/// The value of the environment variable `name`; a value that is not UTF-8 comes back with
/// replacement characters, so that the strict parsers report it as malformed instead of
/// treating it as unset.
pub(crate) fn env_var(name: &str) -> Option<String> {
    std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
}

impl EngineConfig {
    /// The defaults, overridden by `PRIMJIT_CACHE_BUDGET`, `PRIMJIT_CACHE_CAPACITY`,
    /// `PRIMJIT_WORKSPACE_BUDGET`, `PRIMJIT_VERBOSE`, `PRIMJIT_THREADS`, `PRIMJIT_CONV_ALGO`,
    /// `PRIMJIT_PERF_MAP`, `PRIMJIT_COMPILE_AHEAD` and `PRIMJIT_MAX_ISA`; a malformed value is
    /// an error.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_vars(env_var)
    }

    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let mut config = EngineConfig {
            cache: CacheConfig::from_vars(&var)?,
            workspace: WorkspaceConfig::from_vars(&var)?,
            ..EngineConfig::default()
        };
        if let Some(v) = var("PRIMJIT_VERBOSE") {
            config.verbose = level("PRIMJIT_VERBOSE", v, 2, "expected 0, 1 or 2")?;
        }
        if let Some(v) = var("PRIMJIT_THREADS") {
            config.threads = v.trim().parse().map_err(|_| ConfigError::Invalid {
                name: "PRIMJIT_THREADS",
                value: v.clone(),
                reason: "expected a whole number of threads (0 for all cores)".into(),
            })?;
            if config.threads > MAX_THREADS {
                return Err(ConfigError::Invalid {
                    name: "PRIMJIT_THREADS",
                    value: v.clone(),
                    reason: format!("expected 0 (all cores) to {} threads", MAX_THREADS),
                });
            }
        }
        if let Some(v) = var("PRIMJIT_CONV_ALGO") {
            config.conv_algo = v.trim().parse().map_err(|_| ConfigError::Invalid {
                name: "PRIMJIT_CONV_ALGO",
                value: v.clone(),
                reason: "expected direct, winograd or auto".into(),
            })?;
        }
        if let Some(v) = var("PRIMJIT_PERF_MAP") {
            config.perf_map = level("PRIMJIT_PERF_MAP", v, 1, "expected 0 or 1")? == 1;
        }
        if let Some(v) = var("PRIMJIT_COMPILE_AHEAD") {
            config.compile_ahead = level("PRIMJIT_COMPILE_AHEAD", v, 1, "expected 0 or 1")? == 1;
        }
        config.max_isa = max_isa_from(&var)?;
        Ok(config)
    }
}

/// A variable that takes a level from 0 to `max`, written as one digit (blank is 0).
fn level(name: &'static str, value: String, max: u8, expected: &str) -> Result<u8, ConfigError> {
    match value.trim() {
        "" => Ok(0),
        t => (0..=max)
            .find(|l| t == l.to_string())
            .ok_or_else(|| ConfigError::Invalid {
                name,
                value,
                reason: expected.into(),
            }),
    }
}
