//! The engine API with arbitrary, often wrong, arguments: keys with extreme fields (any
//! `usize` in any one field), buffers of the wrong lengths, missing or unexpected weights, the
//! wrong number of extra buffers, and work-item ranges outside the rows.
//!
//! Checked: nothing panics; an invalid key is an `InvalidKey` error; a valid key's
//! descriptions (`Display`, `buffers`, `flops`, `work_items`) are computed without overflow;
//! executing with wrong arguments gives exactly the typed `ExecError` that the checks'
//! documented order names (work items, source, weights, destination, extra count, extras)
//! and runs no code; with right arguments the run succeeds on buffers that end at a guard
//! page, and for unwidened keys matches the reference interpreter.
#![no_main]

use std::ops::Range;
use std::sync::OnceLock;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use primjit::{
    Budget, CacheConfig, CodegenError, Engine, EngineConfig, ExecArgs, ExecError, GuardedBuffer,
    PrimitiveKey, RuntimeError,
};
use primjit_fuzz::{OpSpec, Problem, from_layout};

/// Keys whose buffers hold more floats than this are described but not compiled or run.
const MAX_RUN_FLOATS: usize = 1 << 18;

fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        Engine::new(EngineConfig {
            cache: CacheConfig {
                budget: Budget::Bytes(64 << 10),
                capacity: None,
            },
            threads: 2,
            ..EngineConfig::default()
        })
        .expect("engine")
    })
}

/// One field of the key replaced by an arbitrary value.
#[derive(Arbitrary, Debug)]
struct Widen {
    field: u8,
    value: u64,
}

#[derive(Arbitrary, Debug)]
struct ApiCase {
    op: OpSpec,
    widen: Option<Widen>,
    /// Per buffer of the key (src, weights, dst, extras): how far its length is off.
    deltas: Vec<i8>,
    /// Weights for a key that takes none, or none for a conv.
    flip_weights: bool,
    extra_count_delta: i8,
    /// Work items to run (`execute_range`) instead of all of them.
    range: Option<(u16, u16)>,
    parallel: bool,
}

/// Replaces the field numbered `w.field` of `key` by `w.value`.
fn widen(key: &mut PrimitiveKey, w: &Widen) {
    let v = w.value as usize;
    match key {
        PrimitiveKey::Conv(d) => {
            let [sh, sw] = &mut d.strides;
            let [dh, dw] = &mut d.dilations;
            let fields: [&mut usize; 16] = [
                &mut d.mb,
                &mut d.ic,
                &mut d.ih,
                &mut d.iw,
                &mut d.oc,
                &mut d.kh,
                &mut d.kw,
                sh,
                sw,
                dh,
                dw,
                &mut d.pads.top,
                &mut d.pads.left,
                &mut d.pads.bottom,
                &mut d.pads.right,
                &mut d.groups,
            ];
            let n = fields.len();
            *fields
                .into_iter()
                .nth(w.field as usize % n)
                .expect("in range") = v;
        }
        PrimitiveKey::Pool(d) => {
            let [kh, kw] = &mut d.window.kernel;
            let [sh, sw] = &mut d.window.strides;
            let [dh, dw] = &mut d.window.dilations;
            let fields: [&mut usize; 14] = [
                &mut d.mb,
                &mut d.c,
                &mut d.ih,
                &mut d.iw,
                kh,
                kw,
                sh,
                sw,
                dh,
                dw,
                &mut d.window.pads.top,
                &mut d.window.pads.left,
                &mut d.window.pads.bottom,
                &mut d.window.pads.right,
            ];
            let n = fields.len();
            *fields
                .into_iter()
                .nth(w.field as usize % n)
                .expect("in range") = v;
        }
        PrimitiveKey::GlobalPool(d) => {
            let fields: [&mut usize; 4] = [&mut d.mb, &mut d.c, &mut d.ih, &mut d.iw];
            *fields
                .into_iter()
                .nth(w.field as usize % 4)
                .expect("in range") = v;
        }
        PrimitiveKey::Eltwise(d) => d.shape[w.field as usize % 4] = v,
        PrimitiveKey::Resize(d) => {
            let fields: [&mut usize; 4] = [&mut d.mb, &mut d.c, &mut d.ih, &mut d.iw];
            *fields
                .into_iter()
                .nth(w.field as usize % 4)
                .expect("in range") = v;
        }
        PrimitiveKey::ConvTranspose(d) => {
            let fields: [&mut usize; 4] = [&mut d.mb, &mut d.ic, &mut d.ih, &mut d.iw];
            *fields
                .into_iter()
                .nth(w.field as usize % 4)
                .expect("in range") = v;
        }
        PrimitiveKey::Concat(_)
        | PrimitiveKey::SelectChannels(_)
        | PrimitiveKey::FmaPeak(_)
        | PrimitiveKey::WidePeak { .. } => {}
    }
}

fn guarded_zeros(len: usize) -> GuardedBuffer {
    GuardedBuffer::new(len).expect("map a guarded buffer")
}

fn guarded(data: &[f32]) -> GuardedBuffer {
    GuardedBuffer::from_slice(data).expect("map a guarded buffer")
}

/// The error the documented checks give first, or `None` when the arguments are right.
fn expected_error(
    key: &PrimitiveKey,
    items: &Range<usize>,
    lens: &[usize],
    has_weights: bool,
    extras: usize,
) -> Option<ExecError> {
    let name = key.to_string();
    let limit = key.work_items();
    if items.start > items.end || items.end > limit {
        return Some(ExecError::WorkItems {
            key: name,
            start: items.start,
            end: items.end,
            limit,
        });
    }
    let specs = key.buffers();
    let mismatch = |i: usize, found: usize| ExecError::BufferLength {
        key: name.clone(),
        role: specs[i].role,
        expected: specs[i].len,
        found,
        shape: specs[i].shape.clone(),
    };
    let conv = matches!(key, PrimitiveKey::Conv(_));
    if lens[0] != specs[0].len {
        return Some(mismatch(0, lens[0]));
    }
    let mut next = 1;
    if conv {
        if !has_weights {
            return Some(ExecError::MissingBuffer {
                key: name,
                role: "weights",
            });
        }
        if lens[1] != specs[1].len {
            return Some(mismatch(1, lens[1]));
        }
        next = 2;
    } else if has_weights {
        return Some(ExecError::UnexpectedBuffer {
            key: name,
            role: "weights",
        });
    }
    if lens[next] != specs[next].len {
        return Some(mismatch(next, lens[next]));
    }
    let wanted = specs.len() - next - 1;
    if extras != wanted {
        return Some(ExecError::ExtraCount {
            key: name,
            expected: wanted,
            found: extras,
        });
    }
    for i in next + 1..specs.len() {
        if lens[i] != specs[i].len {
            return Some(mismatch(i, lens[i]));
        }
    }
    None
}

fuzz_target!(|case: ApiCase| {
    let engine = engine();
    let mut key = case.op.key();
    if let Some(w) = &case.widen {
        widen(&mut key, w);
    }
    // Describing any key, valid or not, never panics.
    let name = key.to_string();
    if let Err(invalid) = key.validate() {
        match engine.compile(&key) {
            Err(RuntimeError::Codegen(CodegenError::InvalidKey(e))) => assert_eq!(e, invalid),
            other => panic!("{name} is invalid ({invalid}) but compile gave {other:?}"),
        }
        return;
    }
    let specs = key.buffers();
    let _ = (key.flops(), key.activation_bytes(), key.work_items());
    if specs.iter().map(|s| s.len).sum::<usize>() > MAX_RUN_FLOATS {
        return;
    }
    let p = match engine.compile(&key) {
        Ok(p) => p,
        Err(e) => panic!("{name} is valid but does not compile: {e}"),
    };

    // Lengths: each buffer off by its delta (saturating at 0); weights flipped on request.
    let lens: Vec<usize> = specs
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let d = case.deltas.get(i).copied().unwrap_or(0) as isize;
            s.len.saturating_add_signed(d)
        })
        .collect();
    let conv = matches!(key, PrimitiveKey::Conv(_));
    let has_weights = conv != case.flip_weights;
    let first_extra = if conv { 3 } else { 2 };
    let extras = (specs.len() - first_extra)
        .saturating_add_signed(case.extra_count_delta as isize % 3)
        .min(4);
    let items = match case.range {
        Some((a, b)) => a as usize..b as usize,
        None => 0..key.work_items(),
    };
    // Weights of a key that takes none get the destination's length: any will do.
    let weights_len = if conv { lens[1] } else { lens[first_extra - 1] };
    let extra_len = |i: usize| {
        lens.get(first_extra + i)
            .copied()
            .unwrap_or(lens[first_extra - 1])
    };
    let expected = expected_error(&key, &items, &lens, has_weights, extras);

    // With the right lengths and an unwidened key, the data are the problem's.
    let problem =
        (expected.is_none() && case.widen.is_none()).then(|| Problem::new(&key, case.op.seed));
    let src = match &problem {
        Some(pr) => guarded(&pr.src),
        None => guarded_zeros(lens[0]),
    };
    let weights = has_weights.then(
        || match problem.as_ref().and_then(|pr| pr.weights.as_ref()) {
            Some(w) => guarded(w),
            None => guarded_zeros(weights_len),
        },
    );
    let extra: Vec<GuardedBuffer> = (0..extras)
        .map(|i| match &problem {
            Some(pr) => guarded(&pr.extra[i]),
            None => guarded_zeros(extra_len(i)),
        })
        .collect();
    let extra_slices: Vec<&[f32]> = extra.iter().map(|e| e.as_slice()).collect();
    let dst_len = lens[first_extra - 1];
    let mut dst = guarded_zeros(dst_len);
    let before = dst.as_slice().to_vec();
    let args = ExecArgs {
        src: src.as_slice(),
        weights: weights.as_ref().map(|w| w.as_slice()),
        dst: dst.as_mut_slice(),
        extra: &extra_slices,
        // The fuzzed keys have no fused pool; the kernel tests cover it.
        scratch: None,
    };
    let result = match (&case.range, case.parallel) {
        (Some(_), _) => p.execute_range(args, None, items.clone()),
        (None, true) => match engine.execute(&p, args) {
            Ok(()) => Ok(()),
            Err(RuntimeError::Exec(e)) => Err(e),
            Err(other) => panic!("{name}: execute gave {other:?}"),
        },
        (None, false) => p.execute(args),
    };
    match (result, expected) {
        (Ok(()), None) => {
            if let (Some(pr), None) = (&problem, &case.range) {
                let got = from_layout(dst.as_slice(), pr.dst_layout, pr.dst_shape);
                if let Err(e) = pr.check(&got) {
                    panic!("{e}");
                }
            }
        }
        (Err(e), Some(want)) => {
            assert_eq!(e, want, "{name}");
            assert_eq!(dst.as_slice(), &before[..], "{name}: a rejected call wrote");
        }
        (got, want) => panic!("{name}: got {got:?}, expected {want:?}"),
    }
});
