//! Cranelift's half of compiling a kernel: the host ISA with the settings primjit's kernels
//! are written for, and a lowered function turned into machine code whose only relocations are
//! its calls to the wide tiles.

use cranelift_codegen::binemit::Reloc;
use cranelift_codegen::control::ControlPlane;
use cranelift_codegen::ir::{ExternalName, Function};
use cranelift_codegen::isa::OwnedTargetIsa;
use cranelift_codegen::settings::{self, Configurable};
use cranelift_codegen::{Context, FinalizedRelocTarget};

use super::{Emit, TILE_NAMESPACE, new_context};
use crate::backend::x64::WideTile;

/// The host ISA as detected once, with the settings primjit's kernels are written for.
pub struct HostIsa {
    isa: OwnedTargetIsa,
    pub has_fma: bool,
    /// The ISA flags that shape the code, for cache keys and reports, e.g. `x86_64+avx+fma`.
    pub description: String,
}

impl HostIsa {
    /// Detects the host, with Cranelift's IR verifier on or off.
    pub(crate) fn detect(verify: bool) -> Result<HostIsa, String> {
        let mut flags = settings::builder();
        // The generator schedules the code itself; Cranelift's optimizer hoists loads out of
        // the unrolled reduction and spills accumulators (measured 55-65% of peak against
        // 97-99%).
        flags.set("opt_level", "none").map_err(|e| e.to_string())?;
        flags
            .set("enable_verifier", if verify { "true" } else { "false" })
            .map_err(|e| e.to_string())?;
        flags.set("is_pic", "false").map_err(|e| e.to_string())?;
        // Block boundaries for the disassembler, so that a jump table's data inside the code
        // does not end the listing; it changes no instruction.
        flags
            .set("machine_code_cfg_info", "true")
            .map_err(|e| e.to_string())?;
        let isa_builder = cranelift_native::builder().map_err(|e| e.to_string())?;
        let isa = isa_builder
            .finish(settings::Flags::new(flags))
            .map_err(|e| e.to_string())?;
        let enabled = |name: &str| {
            isa.isa_flags()
                .iter()
                .any(|v| v.name == name && v.as_bool() == Some(true))
        };
        let has_fma = enabled("has_avx") && enabled("has_fma");
        let mut description = isa.triple().architecture.to_string();
        for name in ["has_avx", "has_avx2", "has_fma"] {
            if enabled(name) {
                description.push('+');
                description.push_str(name.trim_start_matches("has_"));
            }
        }
        Ok(HostIsa {
            isa,
            has_fma,
            description,
        })
    }
}

/// A kernel's Cranelift function, built by `body` through an [`Emit`], and the wide register
/// tiles it calls, in the order of their names ([`TILE_NAMESPACE`]).
pub(crate) struct Lowered {
    func: Function,
    pub tiles: Vec<WideTile>,
}

impl Lowered {
    pub(crate) fn build(
        host: &HostIsa,
        prefetch_weights: bool,
        body: impl FnOnce(&mut Emit<'_>),
    ) -> Lowered {
        let mut func = Function::new();
        let mut fctx = new_context();
        let mut e = Emit::new(&mut func, &mut fctx, host.has_fma, prefetch_weights);
        body(&mut e);
        let tiles = e.finish(host.isa.frontend_config());
        Lowered { func, tiles }
    }

    /// The function's Cranelift IR as text.
    pub(crate) fn clif(&self) -> String {
        self.func.display().to_string()
    }

    /// Compiles the function. Its text disassembly comes back with `disasm`.
    pub(crate) fn compile(self, host: &HostIsa, disasm: bool) -> Result<MachineCode, Failure> {
        // The tiles' names, read after compiling, while the compiled code borrows the context.
        let names = self.func.params.clone();
        let mut ctx = Context::for_function(self.func);
        let compiled = ctx
            .compile(&*host.isa, &mut ControlPlane::default())
            .map_err(|e| Failure::Compile(format!("{:?}", e.inner)))?;
        let mut tile_calls = Vec::new();
        for r in compiled.buffer.relocs() {
            let tile = match (&r.kind, &r.target) {
                (
                    Reloc::X86CallPCRel4 | Reloc::X86PCRel4,
                    FinalizedRelocTarget::ExternalName(ExternalName::User(name)),
                ) => {
                    let name = &names.user_named_funcs()[*name];
                    (name.namespace == TILE_NAMESPACE).then_some(name.index as usize)
                }
                _ => None,
            };
            let Some(tile) = tile else {
                return Err(Failure::Relocations);
            };
            tile_calls.push(TileCall {
                at: r.offset as usize,
                tile,
                addend: r.addend,
            });
        }
        let disasm = if disasm {
            let cs = host
                .isa
                .to_capstone()
                .map_err(|e| Failure::Host(e.to_string()))?;
            let text = compiled
                .disassemble(Some(&names), &cs)
                .map_err(|e| Failure::Compile(e.to_string()))?;
            Some(text)
        } else {
            None
        };
        Ok(MachineCode {
            code: compiled.code_buffer().to_vec(),
            tile_calls,
            disasm,
        })
    }
}

/// A compiled function: its bytes, the 32-bit relative calls to resolve once the tiles are
/// placed after it, and its disassembly if asked for.
pub(crate) struct MachineCode {
    pub code: Vec<u8>,
    pub tile_calls: Vec<TileCall>,
    pub disasm: Option<String>,
}

/// A call to wide tile `tile` whose 32-bit displacement at byte `at` is the tile's start plus
/// `addend` minus `at`.
pub(crate) struct TileCall {
    pub at: usize,
    pub tile: usize,
    pub addend: i64,
}

/// Why a function did not compile.
pub(crate) enum Failure {
    /// Cranelift rejected the function, or its disassembly failed.
    Compile(String),
    /// The code refers to something other than the tiles.
    Relocations,
    /// The disassembler cannot be set up on this host.
    Host(String),
}
