//! npz reading and writing: round trip, numpy's own (zip64) files, compressed files rejected.

use pipec_compiler::ir::{DType, TensorData};
use pipec_runtime::npz;
use std::path::PathBuf;

#[test]
fn round_trip_keeps_names_dtypes_shapes_and_data() {
    let arrays = vec![
        ("loss".to_string(), TensorData::from_f32(vec![], &[1.5])),
        (
            "grad/a.b".to_string(),
            TensorData::from_f32(vec![2, 3], &[1., 2., 3., 4., 5., 6.]),
        ),
        (
            "ids".to_string(),
            TensorData::from_i64(vec![4], &[1, -2, 3, 4]),
        ),
    ];
    let dir = std::env::temp_dir().join(format!("pipec-npz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("x.npz");
    npz::write_npz(&p, &arrays).unwrap();
    let back = npz::read_npz(&p).unwrap();
    assert_eq!(back, arrays);
    // numpy reads it too.
    let ok = std::process::Command::new("python3")
        .args([
            "-c",
            &format!(
                "import numpy as np; z=np.load(r'{}'); assert z['grad/a.b'].shape==(2,3) and z['ids'][1]==-2 and z['loss'].shape==()",
                p.display()
            ),
        ])
        .status()
        .map(|s| s.success());
    if let Ok(ok) = ok {
        assert!(ok, "numpy cannot read the npz");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn reads_numpy_reference_files() {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../onnx-models/mlp4.ref.npz");
    let a = npz::read_npz(&p).unwrap();
    let inp = &a.iter().find(|(k, _)| k == "input/input").unwrap().1;
    assert_eq!((inp.dtype, inp.dims.clone()), (DType::F32, vec![4, 64]));
    let loss = &a.iter().find(|(k, _)| k == "loss").unwrap().1;
    assert_eq!((loss.dtype, loss.dims.len()), (DType::F64, 0));
    assert!(a.iter().any(|(k, _)| k == "meta_json"));
}

#[test]
fn garbage_is_an_error_naming_the_file() {
    let dir = std::env::temp_dir().join(format!("pipec-npz-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("bad.npz");
    std::fs::write(&p, b"not a zip at all").unwrap();
    let e = npz::read_npz(&p).unwrap_err().to_string();
    assert!(e.contains("bad.npz"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
