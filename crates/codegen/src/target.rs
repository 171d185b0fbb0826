//! Vector tiers: what each ISA tier gives a kernel (lanes, registers), the host's tier, and the cap.
//!
//! One source of truth per tier, as oneDNN's `cpu_isa_traits`: the plans take their lane
//! counts and register budgets from a [`Target`], never from a literal. The tier of a host is
//! read once from CPUID and the OS's support for the register state (XCR0, through
//! `is_x86_feature_detected!`), and a cap (`PRIMJIT_MAX_ISA`, like `ONEDNN_MAX_CPU_ISA`)
//! lowers it.

use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

/// An instruction-set tier, in increasing order of width.
///
/// `X128` is the Cranelift code every x86-64 host runs (SSE, or AVX+FMA where present, on
/// 128-bit vectors). `Avx2` adds 256-bit `ymm` registers and FMA3; `Avx512` adds 512-bit `zmm`
/// registers, 32 of them, and opmasks (AVX-512F).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    #[default]
    X128,
    Avx2,
    Avx512,
}

impl Isa {
    /// Every tier, narrowest first.
    pub const ALL: [Isa; 3] = [Isa::X128, Isa::Avx2, Isa::Avx512];

    pub fn name(self) -> &'static str {
        match self {
            Isa::X128 => "x128",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// The widest tier this host runs, detected on first use.
    pub fn host() -> Isa {
        static HOST: OnceLock<Isa> = OnceLock::new();
        *HOST.get_or_init(detect)
    }

    /// The tiers this host runs, narrowest first.
    pub fn host_tiers() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|&t| t <= Isa::host()).collect()
    }

    /// The tier a host of tier `host` runs under `cap`: the cap itself, or an error naming
    /// the host's tiers when the cap is above the host (as oneDNN refuses an ISA the CPU
    /// lacks, rather than silently running a narrower one the user did not ask for).
    pub fn capped(host: Isa, cap: Option<Isa>) -> Result<Isa, IsaError> {
        match cap {
            None => Ok(host),
            Some(cap) if cap <= host => Ok(cap),
            Some(cap) => Err(IsaError::AboveHost {
                cap,
                host: Isa::ALL.into_iter().filter(|&t| t <= host).collect(),
            }),
        }
    }

    /// The tier's vector geometry and register budget.
    pub fn target(self) -> Target {
        match self {
            Isa::X128 => Target {
                isa: self,
                lanes: 4,
                vector_registers: 16,
            },
            Isa::Avx2 => Target {
                isa: self,
                lanes: 8,
                vector_registers: 16,
            },
            Isa::Avx512 => Target {
                isa: self,
                lanes: 16,
                vector_registers: 32,
            },
        }
    }
}

/// What a kernel of one tier works with: f32 lanes per vector and vector registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    pub isa: Isa,
    /// f32 lanes of one vector register.
    pub lanes: usize,
    /// Architectural vector registers (16 `xmm`/`ymm`, 32 `zmm`).
    pub vector_registers: usize,
}

impl Target {
    /// Vector bytes.
    pub fn vector_bytes(self) -> usize {
        self.lanes * std::mem::size_of::<f32>()
    }
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Isa {
    // `is_x86_feature_detected!` checks CPUID and that the OS saves the wider register state
    // (XCR0's AVX and AVX-512 bits), so a tier reported here can run.
    let avx2 = std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma");
    if avx2 && std::is_x86_feature_detected!("avx512f") {
        Isa::Avx512
    } else if avx2 {
        Isa::Avx2
    } else {
        Isa::X128
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> Isa {
    Isa::X128
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A tier name that is not one of `x128`, `avx2`, `avx512`, or a cap the host cannot honour.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IsaError {
    #[error("unknown vector tier `{0}`: expected x128, avx2 or avx512")]
    Unknown(String),
    #[error(
        "the vector tier {cap} is above this host's: it runs {}",
        tier_list(host)
    )]
    AboveHost { cap: Isa, host: Vec<Isa> },
}

fn tier_list(tiers: &[Isa]) -> String {
    tiers
        .iter()
        .map(|t| t.name())
        .collect::<Vec<_>>()
        .join(", ")
}

impl FromStr for Isa {
    type Err = IsaError;

    /// Strict: exactly one of the tier names, in lower case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Isa::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| IsaError::Unknown(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_strictly() {
        for t in Isa::ALL {
            assert_eq!(t.name().parse::<Isa>(), Ok(t));
        }
        for bad in ["", "AVX2", "avx", "avx-512", " avx2", "avx512f", "sse"] {
            assert_eq!(
                bad.parse::<Isa>(),
                Err(IsaError::Unknown(bad.into())),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_cap_lowers_the_tier_and_one_above_the_host_names_its_tiers() {
        assert_eq!(Isa::capped(Isa::Avx512, None), Ok(Isa::Avx512));
        assert_eq!(Isa::capped(Isa::Avx512, Some(Isa::X128)), Ok(Isa::X128));
        assert_eq!(Isa::capped(Isa::Avx2, Some(Isa::Avx2)), Ok(Isa::Avx2));
        let err = Isa::capped(Isa::Avx2, Some(Isa::Avx512)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the vector tier avx512 is above this host's: it runs x128, avx2"
        );
    }

    #[test]
    fn tiers_order_by_width() {
        let lanes: Vec<usize> = Isa::ALL.iter().map(|t| t.target().lanes).collect();
        assert_eq!(lanes, [4, 8, 16]);
        assert!(Isa::X128 < Isa::Avx2 && Isa::Avx2 < Isa::Avx512);
        assert_eq!(Isa::Avx512.target().vector_registers, 32);
        assert!(Isa::host_tiers().contains(&Isa::X128));
    }
}
