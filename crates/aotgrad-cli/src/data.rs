//! Fashion-MNIST from its IDX files (gzip-compressed or not).
//!
//! The IDX format: a big-endian header — two zero bytes, a type code (`0x08`: u8), the
//! number of dims — then each dim as a big-endian u32, then the data. Images are
//! `idx3` (`count × rows × cols`), labels `idx1` (`count`). Every malformed or
//! truncated file is an error naming the file and what is wrong with it.

use flate2::read::MultiGzDecoder;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Where Debian's `dataset-fashion-mnist` package installs the files.
pub const SYSTEM_DIR: &str = "/usr/share/datasets/fashion-mnist";
/// The command that installs them.
pub const INSTALL_HINT: &str = "sudo apt-get install dataset-fashion-mnist";
/// The ten class names, by label.
pub const CLASSES: [&str; 10] =
    ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"];

/// The four files of the dataset (without `.gz`).
pub const FILES: [&str; 4] =
    ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"];

/// A data loading error: which file and what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// No directory holding the dataset was found.
    #[error(
        "Fashion-MNIST not found ({tried}); install it with `{INSTALL_HINT}`, or pass --data DIR \
         (or set AOTGRAD_DATA) to a directory holding {files}"
    )]
    NotFound {
        /// The places looked at.
        tried: String,
        /// The expected file names.
        files: String,
    },
    /// A file could not be read.
    #[error("{path}: {msg}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        msg: String,
    },
    /// A file is not a valid IDX file of the expected kind.
    #[error("{path}: {msg}")]
    Format {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
}

/// One split: `len` images of `rows × cols` u8 pixels, row-major, and their labels.
#[derive(Clone, Debug, PartialEq)]
pub struct Split {
    /// Pixels, `len × rows × cols`.
    pub images: Vec<u8>,
    /// Labels in `0..10`.
    pub labels: Vec<u8>,
    /// Image height.
    pub rows: usize,
    /// Image width.
    pub cols: usize,
}

impl Split {
    /// Number of examples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }
    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }
    /// The first `n` examples (all when `n` is larger).
    pub fn truncated(mut self, n: usize) -> Split {
        let n = n.min(self.len());
        self.images.truncate(n * self.rows * self.cols);
        self.labels.truncate(n);
        self
    }
}

/// The training and test splits.
#[derive(Clone, Debug)]
pub struct FashionMnist {
    /// 60,000 training examples.
    pub train: Split,
    /// 10,000 test examples.
    pub test: Split,
    /// Where they were read from.
    pub dir: PathBuf,
}

/// The directory to read: `--data`, else `AOTGRAD_DATA`, else the Debian package's.
pub fn find_dir(arg: Option<&Path>) -> Result<PathBuf, DataError> {
    let mut tried = Vec::new();
    let candidates: Vec<(String, PathBuf)> = match arg {
        // An explicit directory is the only candidate: never silently use another.
        Some(p) => vec![("--data".into(), p.to_path_buf())],
        None => {
            let mut c = Vec::new();
            if let Some(env) = std::env::var_os("AOTGRAD_DATA") {
                c.push(("AOTGRAD_DATA".into(), PathBuf::from(env)));
            }
            c.push(("the dataset-fashion-mnist package".into(), PathBuf::from(SYSTEM_DIR)));
            c
        }
    };
    for (what, dir) in candidates {
        if FILES.iter().all(|f| file_in(&dir, f).is_some()) {
            return Ok(dir);
        }
        tried.push(format!("{what}: {}", dir.display()));
    }
    Err(DataError::NotFound {
        tried: tried.join("; "),
        files: FILES.iter().map(|f| format!("{f}[.gz]")).collect::<Vec<_>>().join(", "),
    })
}

/// `dir/name.gz` or `dir/name`, whichever exists.
fn file_in(dir: &Path, name: &str) -> Option<PathBuf> {
    [dir.join(format!("{name}.gz")), dir.join(name)].into_iter().find(|p| p.is_file())
}

/// Read both splits from `dir` (see [`find_dir`]).
pub fn load(dir: &Path) -> Result<FashionMnist, DataError> {
    let path = |name: &str| {
        file_in(dir, name)
            .ok_or_else(|| DataError::Io { path: dir.join(format!("{name}.gz")), msg: "no such file".into() })
    };
    let train = read_split(&path(FILES[0])?, &path(FILES[1])?)?;
    let test = read_split(&path(FILES[2])?, &path(FILES[3])?)?;
    Ok(FashionMnist { train, test, dir: dir.to_path_buf() })
}

/// Read an image file and its label file, checking they agree.
pub fn read_split(images: &Path, labels: &Path) -> Result<Split, DataError> {
    let (dims, pixels) = read_idx(images, 3)?;
    let (ldims, labs) = read_idx(labels, 1)?;
    if dims[0] != ldims[0] {
        return Err(DataError::Format {
            path: labels.to_path_buf(),
            msg: format!("{} labels for {} images in {}", ldims[0], dims[0], images.display()),
        });
    }
    if let Some((i, &l)) = labs.iter().enumerate().find(|(_, &l)| l as usize >= CLASSES.len()) {
        return Err(DataError::Format {
            path: labels.to_path_buf(),
            msg: format!("label {l} of example {i} is not a class (0..{})", CLASSES.len()),
        });
    }
    Ok(Split { images: pixels, labels: labs, rows: dims[1], cols: dims[2] })
}

/// The bytes of `path`, gunzipped when it is gzip data: every member of the stream
/// (as `gzip -d` reads concatenated members); bytes after them that are not another
/// member are an error, as `gzip -t` says.
fn read_bytes(path: &Path) -> Result<Vec<u8>, DataError> {
    let raw = std::fs::read(path).map_err(|e| DataError::Io { path: path.to_path_buf(), msg: e.to_string() })?;
    if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        MultiGzDecoder::new(raw.as_slice()).read_to_end(&mut out).map_err(|e| DataError::Format {
            path: path.to_path_buf(),
            msg: format!("corrupt or truncated gzip data: {e}"),
        })?;
        Ok(out)
    } else {
        Ok(raw)
    }
}

/// Parse an IDX file of u8 data with `rank` dims: the dims and the data.
pub fn read_idx(path: &Path, rank: usize) -> Result<(Vec<usize>, Vec<u8>), DataError> {
    let bytes = read_bytes(path)?;
    let bad = |msg: String| DataError::Format { path: path.to_path_buf(), msg };
    if bytes.len() < 4 {
        return Err(bad(format!("{} bytes: too short for an IDX header", bytes.len())));
    }
    if bytes[0] != 0 || bytes[1] != 0 {
        return Err(bad(format!(
            "not an IDX file (magic {:02x}{:02x}{:02x}{:02x})",
            bytes[0], bytes[1], bytes[2], bytes[3]
        )));
    }
    if bytes[2] != 0x08 {
        return Err(bad(format!("IDX element type 0x{:02x}, expected 0x08 (unsigned bytes)", bytes[2])));
    }
    if bytes[3] as usize != rank {
        return Err(bad(format!("an IDX file of {} dims, expected {rank}", bytes[3])));
    }
    let header = 4 + 4 * rank;
    if bytes.len() < header {
        return Err(bad(format!("truncated header: {} bytes, the header needs {header}", bytes.len())));
    }
    let dims: Vec<usize> = (0..rank)
        .map(|d| u32::from_be_bytes(bytes[4 + 4 * d..8 + 4 * d].try_into().expect("4 bytes")) as usize)
        .collect();
    let want =
        dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).ok_or_else(|| bad(format!("dims {dims:?} overflow")))?;
    let have = bytes.len() - header;
    if have < want {
        return Err(bad(format!("truncated: dims {dims:?} need {want} data bytes, the file has {have}")));
    }
    if have > want {
        return Err(bad(format!("{} trailing bytes after the {want} data bytes of dims {dims:?}", have - want)));
    }
    Ok((dims, bytes[header..].to_vec()))
}

/// Write an IDX file of u8 data (for tests and tools): `dims` then `data`.
pub fn write_idx(path: &Path, dims: &[usize], data: &[u8], gzip: bool) -> std::io::Result<()> {
    let mut bytes = vec![0, 0, 0x08, dims.len() as u8];
    for &d in dims {
        bytes.extend_from_slice(&(d as u32).to_be_bytes());
    }
    bytes.extend_from_slice(data);
    if gzip {
        use std::io::Write;
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(&bytes)?;
        bytes = enc.finish()?;
    }
    std::fs::write(path, bytes)
}
