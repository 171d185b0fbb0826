//! Models told apart by content, `.npz` parameters, and the names of parameters given: an
//! override that names no parameter is an error listing them all, a state dict's extra names
//! come back as unused.

use std::io::Write;

use primjit::ir::{Params, Tensor, parse};
use primjit::model_file::{ModelError, ModelFormat, ModelSource, sniff_model};
use primjit::params_file::{
    ParamFileError, ParamFormat, bind_params, params_from_bytes, sniff_params,
};

const GRAPH: &str = "graph g {
  input %x: f32[1, 3, 4, 4]
  param @w: f32[2, 3, 3, 3]
  param @b: f32[2]
  %c = conv2d(%x, @w, bias=@b, pads=[1, 1, 1, 1])
  output y = %c
}
";

/// A minimal ONNX model: one Conv whose weights are initializers, as exporters write it.
fn onnx_model() -> Vec<u8> {
    use primjit::onnx::proto::*;
    use prost::Message;
    let w: Vec<u8> = (0..54)
        .flat_map(|i| (i as f32 * 0.5).to_le_bytes())
        .collect();
    let float_input = |name: &str, dims: &[i64]| ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: data_type::FLOAT,
                shape: Some(TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|&d| tensor_shape_proto::Dimension {
                            value: Some(tensor_shape_proto::dimension::Value::DimValue(d)),
                        })
                        .collect(),
                }),
            })),
        }),
    };
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
        producer_name: "tests".into(),
        model_version: 3,
        doc_string: "a conv".into(),
        metadata_props: vec![StringStringEntryProto {
            key: "k".into(),
            value: "v".into(),
        }],
        graph: Some(GraphProto {
            name: "g".into(),
            node: vec![NodeProto {
                input: vec!["x".into(), "w".into()],
                output: vec!["y".into()],
                op_type: "Conv".into(),
                ..Default::default()
            }],
            initializer: vec![TensorProto {
                dims: vec![2, 3, 3, 3],
                data_type: data_type::FLOAT,
                name: "w".into(),
                raw_data: w.into(),
                ..Default::default()
            }],
            input: vec![float_input("x", &[1, 3, 4, 4])],
            output: vec![ValueInfoProto {
                name: "y".into(),
                r#type: None,
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

/// A `.npy` file of f32 values in C order.
fn npy(shape: &[u64], data: &[f32]) -> Vec<u8> {
    use npyz::WriterBuilder;
    let mut out = Vec::new();
    let mut writer = npyz::WriteOptions::new()
        .default_dtype()
        .shape(shape)
        .writer(&mut out)
        .begin_nd()
        .unwrap();
    writer.extend(data.iter().copied()).unwrap();
    writer.finish().unwrap();
    out
}

/// An `.npz` archive (stored, as `numpy.savez` writes it) of `.npy` entries.
fn npz(entries: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (name, bytes) in entries {
        zip.start_file(format!("{name}.npy"), options).unwrap();
        zip.write_all(bytes).unwrap();
    }
    zip.finish().unwrap().into_inner()
}

#[test]
fn the_format_is_told_by_content() {
    assert_eq!(sniff_model(&onnx_model()), ModelFormat::Onnx);
    assert_eq!(sniff_model(GRAPH.as_bytes()), ModelFormat::Ir);
    assert_eq!(sniff_model(b""), ModelFormat::Ir);
    assert_eq!(
        sniff_model(b"# caf\xc3\xa9\r\n\tgraph g {}\x0c"),
        ModelFormat::Ir
    );

    let onnx = ModelSource::from_bytes(&onnx_model(), "<bytes>").expect("imports");
    assert_eq!(onnx.format(), ModelFormat::Onnx);
    let graph = onnx.graph().unwrap();
    let meta = onnx.metadata(&graph);
    assert_eq!(
        (
            meta.producer_name.as_str(),
            meta.graph_name.as_str(),
            meta.version
        ),
        ("tests", "g", 3)
    );
    assert_eq!(meta.description, "a conv");
    assert_eq!(meta.custom, vec![("k".to_string(), "v".to_string())]);
    let w = &onnx.onnx.as_ref().unwrap().params;
    assert_eq!(w.iter().next().unwrap().1.data[53], 26.5);

    let ir = ModelSource::from_bytes(GRAPH.as_bytes(), "<bytes>").unwrap();
    assert_eq!(ir.format(), ModelFormat::Ir);
    assert_eq!(ir.metadata(&ir.graph().unwrap()).graph_name, "g");

    // A file without the `.onnx` suffix, and IR text under `.onnx`.
    let dir = std::env::temp_dir().join(format!("primjit-model-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("model"), onnx_model()).unwrap();
    std::fs::write(dir.join("graph.onnx"), GRAPH).unwrap();
    let read = ModelSource::read(&dir.join("model")).unwrap();
    assert_eq!(read.format(), ModelFormat::Onnx);
    let read = ModelSource::read(&dir.join("graph.onnx")).unwrap();
    assert_eq!(read.format(), ModelFormat::Ir);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_content_is_a_located_error_not_a_panic() {
    let e = ModelSource::from_bytes(b"# caf\xe9\ngraph g {}", "m.ir").unwrap_err();
    assert!(matches!(e, ModelError::NotUtf8 { offset: 5, .. }), "{e}");
    assert_eq!(
        e.to_string(),
        "`m.ir` is neither an ONNX model nor IR text: it is not UTF-8 at byte 5"
    );
    let e = ModelSource::from_bytes(b"\x08\x01\x3a\xff\xff", "<bytes>").unwrap_err();
    assert!(matches!(e, ModelError::Onnx(_)), "{e}");
    assert!(e.to_string().contains("<bytes>"), "{e}");
    let e = ModelSource::read("/nonexistent/model".as_ref()).unwrap_err();
    assert!(matches!(e, ModelError::Read { .. }), "{e}");
}

#[test]
fn npz_parameters_read_as_safetensors_do() {
    let graph = parse(GRAPH).unwrap();
    let w: Vec<f32> = (0..54).map(|i| i as f32 - 20.0).collect();
    let b = [0.5f32, -1.5];
    let file = npz(&[
        ("w", npy(&[2, 3, 3, 3], &w)),
        ("b", npy(&[2], &b)),
        ("fc.weight", npy(&[1], &[0.0])),
    ]);
    assert_eq!(sniff_params(&file), ParamFormat::Npz);
    let bound = params_from_bytes(&file, "p.npz", &graph, None).unwrap();
    assert_eq!(bound.params.get("w").unwrap().data, w);
    assert_eq!(bound.params.get("b").unwrap().data, b);
    assert_eq!(bound.unused, vec!["fc.weight".to_string()]);

    // A wrong shape and a missing parameter are the file's errors.
    let short = npz(&[("w", npy(&[2, 3, 3, 3], &w)), ("b", npy(&[3], &[0.0; 3]))]);
    let e = params_from_bytes(&short, "p.npz", &graph, None).unwrap_err();
    assert!(
        matches!(e, ParamFileError::Shape { ref name, .. } if name == "b"),
        "{e}"
    );
    let missing = npz(&[("w", npy(&[2, 3, 3, 3], &w))]);
    let e = params_from_bytes(&missing, "p.npz", &graph, None).unwrap_err();
    assert!(
        matches!(e, ParamFileError::Missing { ref name, .. } if name == "b"),
        "{e}"
    );
    // Not an archive after its magic: an error, not a panic.
    let e = params_from_bytes(b"PK\x03\x04garbage", "p.npz", &graph, None).unwrap_err();
    assert!(matches!(e, ParamFileError::Format { .. }), "{e}");
}

#[test]
fn overrides_must_name_parameters_while_a_state_dict_may_hold_more() {
    let graph = parse(GRAPH).unwrap();
    let initializers = Params::random(&graph, 1);
    let given = |names: &[&str]| -> Vec<(String, Tensor)> {
        names
            .iter()
            .map(|n| (n.to_string(), Tensor::zeros(vec![2])))
            .collect()
    };
    // Over a model's own values: every unknown name is listed, with the graph's parameters.
    let e = bind_params(
        &graph,
        Some(initializers.clone()),
        given(&["b", "wieght", "bias"]),
        "params",
    )
    .unwrap_err();
    assert!(
        matches!(e, ParamFileError::Unknown { ref unknown, .. } if unknown == &["bias", "wieght"]),
        "{e}"
    );
    assert_eq!(
        e.to_string(),
        "params names parameters the graph does not have: @bias, @wieght; its parameters: @w, @b"
    );
    // A known name replaces the initializer, the others stay.
    let bound = bind_params(&graph, Some(initializers.clone()), given(&["b"]), "params").unwrap();
    assert_eq!(bound.params.get("b").unwrap().data, vec![0.0, 0.0]);
    assert_eq!(bound.params.get("w"), initializers.get("w"));
    assert!(bound.unused.is_empty());
    // As a state dict: the extra names are reported, not bound.
    let bound = bind_params(&graph, None, given(&["b", "fc.bias"]), "params").unwrap();
    assert_eq!(bound.unused, vec!["fc.bias".to_string()]);
    assert!(bound.params.get("fc.bias").is_none());
    // The same rule for files.
    let file = npz(&[("extra", npy(&[1], &[0.0]))]);
    let e = params_from_bytes(&file, "o.npz", &graph, Some(initializers)).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("o.npz names parameters the graph does not have: @extra"),
        "{e}"
    );
}
