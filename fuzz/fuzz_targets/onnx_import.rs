//! The ONNX importer: any bytes, and real models with bytes flipped, are either an
//! `OnnxError` or an imported graph that verifies, prints as IR text that parses back to the
//! same text, and whose parameters fill every declaration. Never a panic.
//!
//! The first byte picks the mode: odd, the rest is the model; even, the rest is a list of
//! `(offset, xor)` byte pairs applied to a real model (the DeepLab-like family model of
//! `tests/onnx/families`), so that mutations stay deep inside valid protobuf. libFuzzer's own
//! mutations of the seed corpus (`tests/onnx`) do the rest.
#![no_main]

use libfuzzer_sys::fuzz_target;
use primjit::ir::parse;

const MODEL: &[u8] = include_bytes!("../../tests/onnx/families/deeplab.onnx");

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let bytes: Vec<u8> = if mode & 1 == 1 {
        rest.to_vec()
    } else {
        let mut model = MODEL.to_vec();
        for pair in rest.chunks_exact(3) {
            let at = u16::from_le_bytes([pair[0], pair[1]]) as usize * 7 % model.len();
            model[at] ^= pair[2];
        }
        // A mode byte of 2 also truncates the model after the mutations.
        if mode == 2 && !rest.is_empty() {
            model.truncate(rest[0] as usize * model.len() / 256);
        }
        model
    };
    let imported = match primjit_onnx::import_bytes(&bytes, "fuzz.onnx", None) {
        Ok(i) => i,
        Err(e) => {
            // Every error renders, and a model error lists at least one problem.
            let text = e.to_string();
            assert!(!text.is_empty());
            if let primjit_onnx::OnnxError::Problems { problems, .. } = &e {
                assert!(!problems.is_empty(), "no problem listed: {text}");
            }
            return;
        }
    };
    let graph = &imported.graph;
    if let Err(e) = graph.verify() {
        panic!("an imported graph does not verify: {e}\n{graph}");
    }
    let printed = graph.to_string();
    let reparsed = match parse(&printed) {
        Ok(g) => g,
        Err(e) => panic!("the imported graph's text does not parse: {e}\n{printed}"),
    };
    assert_eq!(reparsed.to_string(), printed, "printing is not canonical");
    let mut params = imported.params.clone();
    if let Err(e) = params.materialize(graph) {
        panic!("the initializers do not fill the graph's parameters: {e}\n{printed}");
    }
});
