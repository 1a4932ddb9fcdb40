//! The IDX loader on small synthetic files: valid gzip and raw files, and every kind
//! of malformed or truncated file giving an error that names the file.

use aotgrad_cli::data::{self, DataError, FILES};
use std::path::{Path, PathBuf};

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("aotgrad-data-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A complete dataset of `n` train and `m` test 2×3 images with labels `i % 10`.
fn write_dataset(d: &Path, n: usize, m: usize, gzip: bool) {
    let ext = if gzip { ".gz" } else { "" };
    for (k, count) in [(0, n), (2, m)] {
        let pixels: Vec<u8> = (0..count * 6).map(|i| (i * 7 % 256) as u8).collect();
        let labels: Vec<u8> = (0..count).map(|i| (i % 10) as u8).collect();
        data::write_idx(&d.join(format!("{}{ext}", FILES[k])), &[count, 2, 3], &pixels, gzip).unwrap();
        data::write_idx(&d.join(format!("{}{ext}", FILES[k + 1])), &[count], &labels, gzip).unwrap();
    }
}

#[test]
fn reads_gzip_and_raw_files() {
    for gzip in [true, false] {
        let d = dir(if gzip { "gz" } else { "raw" });
        write_dataset(&d, 12, 5, gzip);
        let ds = data::load(&d).unwrap();
        assert_eq!((ds.train.len(), ds.train.rows, ds.train.cols), (12, 2, 3));
        assert_eq!(ds.test.len(), 5);
        assert_eq!(ds.train.images[..4], [0, 7, 14, 21]);
        assert_eq!(ds.train.labels[..3], [0, 1, 2]);
        assert_eq!(ds.test.labels, [0, 1, 2, 3, 4]);
        let cut = ds.train.truncated(4);
        assert_eq!((cut.len(), cut.images.len()), (4, 24));
        assert_eq!(data::find_dir(Some(&d)).unwrap(), d);
    }
}

fn err_of(bytes: &[u8], rank: usize, name: &str) -> String {
    let d = dir(name);
    let p = d.join(name);
    std::fs::write(&p, bytes).unwrap();
    let e = data::read_idx(&p, rank).unwrap_err();
    assert!(matches!(e, DataError::Format { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains(name), "the error names the file: {msg}");
    msg
}

#[test]
fn malformed_files_are_clear_errors() {
    let header = |rank: u8, dims: &[u32]| {
        let mut b = vec![0, 0, 8, rank];
        for d in dims {
            b.extend_from_slice(&d.to_be_bytes());
        }
        b
    };
    assert!(err_of(&[0, 0], 1, "short").contains("too short for an IDX header"));
    assert!(err_of(b"PK\x03\x04rest", 1, "zip").contains("not an IDX file"));
    assert!(err_of(&[0, 0, 0x0d, 1, 0, 0, 0, 0], 1, "floats").contains("element type 0x0d"));
    assert!(err_of(&header(1, &[3]), 3, "rank").contains("an IDX file of 1 dims, expected 3"));
    assert!(err_of(&header(3, &[2])[..8], 3, "cut_header").contains("truncated header"));
    let mut b = header(3, &[2, 2, 2]);
    b.extend_from_slice(&[1; 5]);
    assert!(err_of(&b, 3, "cut_data").contains("truncated: dims [2, 2, 2] need 8 data bytes, the file has 5"));
    let mut b = header(1, &[2]);
    b.extend_from_slice(&[1; 4]);
    assert!(err_of(&b, 1, "trailing").contains("2 trailing bytes"));
}

#[test]
fn corrupt_gzip_and_inconsistent_splits() {
    let d = dir("gzip");
    write_dataset(&d, 10, 10, true);
    let p = d.join(format!("{}.gz", FILES[0]));
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() / 2]).unwrap();
    let e = data::load(&d).unwrap_err().to_string();
    assert!(e.contains(FILES[0]) && e.contains("corrupt or truncated gzip"), "{e}");

    // Garbage after a whole gzip stream is refused (gzip -t refuses it too); a second
    // gzip member after the first is read on.
    let d = dir("gzip-trailing");
    write_dataset(&d, 10, 10, true);
    let p = d.join(format!("{}.gz", FILES[0]));
    let mut bytes = std::fs::read(&p).unwrap();
    bytes.extend_from_slice(b"trailing garbage");
    std::fs::write(&p, &bytes).unwrap();
    let e = data::load(&d).unwrap_err().to_string();
    assert!(e.contains(FILES[0]) && e.contains("corrupt or truncated gzip"), "{e}");
    let split = d.join("split.gz");
    let raw = d.join("raw");
    data::write_idx(&raw, &[4], &[1, 2, 3, 4], false).unwrap();
    let whole = std::fs::read(&raw).unwrap();
    let mut two = Vec::new();
    for part in [&whole[..6], &whole[6..]] {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut enc, part).unwrap();
        two.extend(enc.finish().unwrap());
    }
    std::fs::write(&split, two).unwrap();
    assert_eq!(data::read_idx(&split, 1).unwrap(), (vec![4], vec![1, 2, 3, 4]));

    let d = dir("mismatch");
    write_dataset(&d, 10, 10, false);
    data::write_idx(&d.join(FILES[1]), &[9], &[0; 9], false).unwrap();
    let e = data::load(&d).unwrap_err().to_string();
    assert!(e.contains(FILES[1]) && e.contains("9 labels for 10 images"), "{e}");

    data::write_idx(&d.join(FILES[1]), &[10], &[0, 1, 2, 3, 4, 5, 6, 7, 8, 12], false).unwrap();
    let e = data::load(&d).unwrap_err().to_string();
    assert!(e.contains("label 12 of example 9 is not a class"), "{e}");
}

#[test]
fn a_missing_dataset_says_how_to_install_it() {
    let d = dir("empty");
    let e = data::find_dir(Some(&d)).unwrap_err().to_string();
    assert!(e.contains("apt-get install dataset-fashion-mnist"), "{e}");
    assert!(e.contains(&d.display().to_string()) && e.contains("--data"), "{e}");
    let e = data::load(&d).unwrap_err().to_string();
    assert!(e.contains("no such file"), "{e}");
}
