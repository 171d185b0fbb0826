//! The IR text format: any bytes either fail to parse with a located error, or parse into a
//! graph whose printed text parses again and prints identically (printing is canonical).
//! Verification, and the optimization passes on a graph that verifies, never panic, and the
//! passes keep a valid graph valid with the same output shapes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use primjit::ir::{parse, passes};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let graph = match parse(text) {
        Ok(graph) => graph,
        Err(e) => {
            // A location inside the text (or just past its end), 1-based.
            let lines = text.split('\n').count() as u32;
            assert!(
                e.loc.line >= 1 && e.loc.line <= lines && e.loc.col >= 1,
                "{e} is outside the text ({lines} lines)"
            );
            // Rendering the located error (what the CLI prints) must not panic either.
            let _ = primjit::IrError::from(e).render("fuzz.ir", text);
            return;
        }
    };
    let printed = graph.to_string();
    let reparsed = match parse(&printed) {
        Ok(g) => g,
        Err(e) => panic!("the printed graph does not parse: {e}\n{printed}"),
    };
    assert_eq!(reparsed.to_string(), printed, "printing is not canonical");

    let verified = graph.verify();
    assert_eq!(
        verified.is_ok(),
        reparsed.verify().is_ok(),
        "the graph and its reprint verify differently"
    );
    if let Err(e) = &verified {
        let _ = primjit::IrError::from(e.clone()).render("fuzz.ir", text);
        return;
    }
    let before = verified.expect("verified");
    let mut optimized = graph.clone();
    passes::optimize(&mut optimized);
    let after = match optimized.verify() {
        Ok(s) => s,
        Err(e) => panic!("the passes broke a valid graph: {e}\n{printed}\n{optimized}"),
    };
    for ((name, v), (name2, v2)) in graph.outputs().iter().zip(optimized.outputs()) {
        assert_eq!(name, name2);
        assert_eq!(
            before.describe(*v),
            after.describe(*v2),
            "output {name} changed shape"
        );
    }
    // The optimized graph prints and parses too (derived parameters included).
    let optimized_text = optimized.to_string();
    if let Err(e) = parse(&optimized_text) {
        panic!("the optimized graph does not parse: {e}\n{optimized_text}");
    }
});
