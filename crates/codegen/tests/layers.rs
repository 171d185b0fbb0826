//! The crate's layering, checked on its sources: Cranelift is named only in its backend
//! folder, and the data layers (tiers, tile shapes, keys) import nothing above them.

use std::fs;
use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("the crate's sources are readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Lines of `text` that are code, not comments.
fn code_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
        .map(|(i, l)| (i + 1, l))
}

#[test]
fn only_the_cranelift_backend_names_cranelift() {
    let root = src();
    let backend = root.join("backend").join("cranelift");
    let mut files = Vec::new();
    sources(&root, &mut files);
    assert!(files.len() > 20, "found the sources: {files:?}");
    let mut found = Vec::new();
    for path in files.iter().filter(|p| !p.starts_with(&backend)) {
        let text = fs::read_to_string(path).expect("a readable source");
        for (n, line) in code_lines(&text) {
            if line.contains("cranelift_") || line.contains("InstBuilder") {
                found.push(format!("{}:{n}: {}", path.display(), line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "Cranelift named outside backend/cranelift:\n{}",
        found.join("\n")
    );
}

#[test]
fn data_layers_import_nothing_above_them() {
    // Each layer with the modules it may import from this crate.
    let layers: [(&str, &[&str]); 4] = [
        ("target.rs", &[]),
        ("tile.rs", &["target"]),
        ("approx.rs", &[]),
        ("key.rs", &["target", "tile"]),
    ];
    for (file, allowed) in layers {
        let text = fs::read_to_string(src().join(file)).expect("a readable source");
        for (n, line) in code_lines(&text) {
            for (at, _) in line.match_indices("crate::") {
                let module: String = line[at + "crate::".len()..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                assert!(
                    allowed.contains(&module.as_str()),
                    "{file}:{n} imports crate::{module}, above its layer: {}",
                    line.trim()
                );
            }
        }
    }
}
