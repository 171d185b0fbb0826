//! `read_safetensors` maps the file: it reads the values the bytes hold, bit for bit as
//! `safetensors_params` does from a buffer, and the mapping is gone once it returns.

#![cfg(target_os = "linux")]

use std::path::PathBuf;

use primjit::ir::parse;
use primjit::params_file::{ParamFileError, read_safetensors, safetensors_params};
use safetensors::Dtype;
use safetensors::tensor::TensorView;

const GRAPH: &str = "graph g {
  input %x: f32[1, 3, 4, 4]
  param @w: f32[2, 3, 3, 3]
  param @b: f32[2]
  %c = conv2d(%x, @w, bias=@b, pads=[1, 1, 1, 1])
  output y = %c
}
";

/// A file of this test process under the temporary directory, removed when dropped.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str, bytes: &[u8]) -> Self {
        let path = std::env::temp_dir().join(format!("primjit-{}-{name}", std::process::id()));
        std::fs::write(&path, bytes).expect("write a temporary file");
        TempFile(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Whether the process maps `path` (`/proc/self/maps` lists mapped files by path).
fn is_mapped(path: &std::path::Path) -> bool {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("read /proc/self/maps");
    let path = path.to_str().expect("a UTF-8 path");
    maps.lines().any(|l| l.ends_with(path))
}

#[test]
fn read_safetensors_reads_the_mapped_file_and_unmaps_it() {
    let graph = parse(GRAPH).expect("parses");
    // Distinct values, and a tensor the graph does not use (of another dtype) before them.
    let w: Vec<u8> = (0..54)
        .flat_map(|i| (i as f32 * 0.25 - 3.0).to_le_bytes())
        .collect();
    let b: Vec<u8> = [1.5f32, -2.0]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let unused = vec![7u8; 24];
    let views = vec![
        (
            "a.unused",
            TensorView::new(Dtype::F64, vec![3], &unused).unwrap(),
        ),
        (
            "w",
            TensorView::new(Dtype::F32, vec![2, 3, 3, 3], &w).unwrap(),
        ),
        ("b", TensorView::new(Dtype::F32, vec![2], &b).unwrap()),
    ];
    let bytes = safetensors::serialize(views, None).expect("serializes");
    let file = TempFile::new("params.safetensors", &bytes);

    let read = read_safetensors(&file.0, &graph, None).expect("reads");
    assert!(!is_mapped(&file.0), "the file is still mapped");
    let want = safetensors_params(&bytes, "buffer", &graph, None).expect("reads");
    assert_eq!(read, want);
    let w = &read.get("w").expect("w").data;
    assert_eq!((w[0], w[53]), (-3.0, 53.0 * 0.25 - 3.0));
    assert_eq!(read.get("b").expect("b").data, vec![1.5, -2.0]);
    assert!(read.get("a.unused").is_none());
}

#[test]
fn an_empty_file_is_not_a_safetensors_file() {
    let graph = parse(GRAPH).expect("parses");
    let file = TempFile::new("empty.safetensors", &[]);
    let err = read_safetensors(&file.0, &graph, None).unwrap_err();
    assert!(matches!(err, ParamFileError::Format { .. }), "{err:?}");
    assert!(
        err.to_string().contains("is not a safetensors file"),
        "{err}"
    );
    assert!(!is_mapped(&file.0));
}
