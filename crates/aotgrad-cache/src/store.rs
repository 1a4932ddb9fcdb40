//! Where blobs live: the [`Store`] trait and the on-disk store.
//!
//! A store keeps, per cache key, any number of entry blobs (one per guard set), the
//! key's ingredients (for miss diagnostics), and content-addressed artifact blobs.
//! Stores move sealed bytes only; checking them is the cache's job
//! ([`crate::envelope`]).
//!
//! The on-disk store reads only regular files, and reads them boundedly. Every blob
//! (an entry, an artifact, a key's `key.json`) is checked with `lstat` and then opened
//! without following a final symbolic link and without blocking (on Unix
//! `O_NOFOLLOW | O_NONBLOCK | O_NOCTTY`), and the opened file is checked again with
//! `fstat`: a symbolic link, FIFO, socket, device or directory in a blob's place is
//! refused (never opened, or never read), and so is a file larger than the cap on one
//! blob (the smaller of [`MAX_BLOB_BYTES`] and the store's size limit; 1 MiB for a
//! `key.json`). A read takes at most the size `fstat` gave. A blob is marked used by
//! retiming the file it was read from, through that open file, never by its path, so
//! a link in the cache never retimes its target. A refused entry or artifact comes
//! back as an empty blob (the cache rejects it as too short, logs it and removes it:
//! the link itself, never its target), with a warning naming what was found; a
//! refused `key.json` is skipped with a warning. Key directories are real directories
//! too: a link in place of one is not followed (reading its entries is an error, a
//! write replaces the link with a directory, listings skip it).

use crate::key::CacheKey;
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

/// A store operation that failed (I/O, a connection): always reported as a miss.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{store}: {msg}")]
pub struct StoreError {
    /// Which store.
    pub store: String,
    /// What went wrong.
    pub msg: String,
}

/// One blob a store holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlobInfo {
    /// The cache key (entries) or content hash (artifacts).
    pub key: String,
    /// The entry id within the key (empty for artifacts).
    pub id: String,
    /// Size in bytes.
    pub bytes: u64,
    /// Last use (read or write).
    pub last_used: SystemTime,
}

/// A place to keep sealed blobs.
pub trait Store: Send + Sync {
    /// A short description (`disk /home/u/.cache/aotgrad`).
    fn describe(&self) -> String;
    /// Every entry blob under `key`, as `(id, bytes)`; none is `Ok(vec![])`.
    fn entries(&self, key: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError>;
    /// The entry blobs under `key` whose ids `want` accepts, and the ids of the others,
    /// which are neither read nor marked used (a cache reads only its own key's
    /// entries). The default reads them all and sorts them out.
    #[allow(clippy::type_complexity)]
    fn entries_where(
        &self,
        key: &str,
        want: &dyn Fn(&str) -> bool,
    ) -> Result<(Vec<(String, Vec<u8>)>, Vec<String>), StoreError> {
        let (mine, others): (Vec<_>, Vec<_>) = self.entries(key)?.into_iter().partition(|(id, _)| want(id));
        Ok((mine, others.into_iter().map(|(id, _)| id).collect()))
    }
    /// Write entry `id` under `key` (replacing one with that id) and the key's
    /// ingredients.
    fn put_entry(&self, key: &CacheKey, id: &str, blob: &[u8]) -> Result<(), StoreError>;
    /// Remove entry `id` under `key` (a corrupt one).
    fn remove_entry(&self, key: &str, id: &str) -> Result<(), StoreError>;
    /// An artifact blob by content hash.
    fn artifact(&self, hash: &str) -> Result<Option<Vec<u8>>, StoreError>;
    /// Write an artifact blob under its content hash.
    fn put_artifact(&self, hash: &str, blob: &[u8]) -> Result<(), StoreError>;
    /// Remove the artifact under `hash` (a corrupt one).
    fn remove_artifact(&self, hash: &str) -> Result<(), StoreError>;
    /// The ingredients of every key held (for "nearest entry" diagnostics).
    fn keys(&self) -> Result<Vec<CacheKey>, StoreError>;
    /// Every blob held: entries, then artifacts.
    fn list(&self) -> Result<Vec<BlobInfo>, StoreError>;
    /// Remove everything.
    fn clear(&self) -> Result<(), StoreError>;
}

/// The on-disk store: `<root>/v1/entries/<key>/{key.json, <id>.entry}` and
/// `<root>/v1/artifacts/<hash>.artifact`. Writes go to a temporary file in the same
/// directory and are renamed into place, so a reader sees a whole old blob or a whole
/// new one; concurrent writers of one entry write identical ids, the last rename wins.
/// Directories are created private to the user (mode 0700), and on Unix a root that
/// another user owns or can write is refused (every read and write is then a logged
/// store error: a miss, and no entry written). Beyond `max_bytes` the
/// least recently used blobs are removed after a write. The limit is kept without
/// listing the store on every write: a handle lists it on its first write, then adds
/// what it writes to the total it found, and lists (and evicts) again only when that
/// estimate passes the limit; what other processes write meanwhile is seen at that
/// listing, so the store may pass its limit by what they wrote since. Blobs are read
/// only from regular files, never through a link, and never past their size or the
/// cap on one blob (see the module docs).
pub struct DiskStore {
    root: PathBuf,
    max_bytes: u64,
    /// Bytes held at this handle's last listing plus what it wrote since (`None`:
    /// not listed yet).
    estimate: std::sync::Mutex<Option<u64>>,
    /// Listings made for the size limit (what the tests check).
    listings: AtomicU64,
    /// Whether the root is private to this user, once checked (see `check_private`).
    private: std::sync::OnceLock<Result<(), String>>,
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Age after which a temporary file is a crashed writer's leftover.
const STALE_TMP_SECONDS: u64 = 3600;

/// The most one entry or artifact read from disk may hold, whatever the store's size
/// limit (a smaller limit caps it further): a larger file is refused, not read.
pub const MAX_BLOB_BYTES: u64 = 4 << 30;

/// The most a key's `key.json` (a few hundred bytes of ingredient hashes) may hold.
const MAX_KEY_JSON_BYTES: u64 = 1 << 20;

/// Why a blob was not read.
#[derive(Debug)]
enum ReadError {
    /// Nothing there.
    Missing,
    /// Something that is not a blob: not a regular file, or larger than the cap.
    Refused(String),
    /// The file could not be opened or read.
    Io(std::io::Error),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Missing => write!(f, "not found"),
            ReadError::Refused(why) => write!(f, "refused: {why}"),
            ReadError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl From<std::io::Error> for ReadError {
    fn from(e: std::io::Error) -> ReadError {
        if e.kind() == std::io::ErrorKind::NotFound {
            ReadError::Missing
        } else {
            ReadError::Io(e)
        }
    }
}

/// What a file type is, for messages about a refused blob.
fn kind_of(t: fs::FileType) -> &'static str {
    if t.is_symlink() {
        return "a symbolic link (not followed)";
    }
    if t.is_dir() {
        return "a directory";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_socket() {
            return "a socket";
        }
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
    }
    "not a regular file"
}

/// Open the regular file at `path` for reading, with its size. What is there is
/// looked at first without following a link (a FIFO or a device is never opened: an
/// open can block or have effects); the open itself neither follows a final link nor
/// blocks, and what it opened is checked again (the name may have been replaced in
/// between).
fn open_regular(path: &Path) -> Result<(fs::File, u64), ReadError> {
    let seen = fs::symlink_metadata(path)?;
    if !seen.is_file() {
        return Err(ReadError::Refused(kind_of(seen.file_type()).to_string()));
    }
    let mut options = fs::File::options();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY);
    }
    let f = match options.open(path) {
        Ok(f) => f,
        #[cfg(unix)]
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(ReadError::Refused("a symbolic link (not followed)".to_string()));
        }
        Err(e) => return Err(e.into()),
    };
    // fstat: what was opened, not what the name points at now.
    let opened = f.metadata()?;
    if !opened.is_file() {
        return Err(ReadError::Refused(kind_of(opened.file_type()).to_string()));
    }
    Ok((f, opened.len()))
}

/// The `len` bytes of an opened regular file (its size when opened), refused when
/// over `cap`. A file that shrank since gives fewer bytes (a truncated blob, which
/// its check rejects); one that grew gives its first `len`.
fn read_bounded(f: &mut fs::File, len: u64, cap: u64) -> Result<Vec<u8>, ReadError> {
    if len > cap {
        return Err(ReadError::Refused(format!("{len} bytes, over the limit of {cap} bytes on one blob")));
    }
    let n = usize::try_from(len).map_err(|_| ReadError::Refused(format!("{len} bytes do not fit in memory")))?;
    let mut bytes = Vec::new();
    bytes.try_reserve_exact(n).map_err(|e| ReadError::Io(std::io::Error::new(std::io::ErrorKind::OutOfMemory, e)))?;
    f.take(len).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Mark an opened blob used now (its modification time is what eviction orders by),
/// through the open file: never by path, so nothing a name was swapped for is
/// retimed. On Unix the times are set to now by `futimens` with no times given,
/// which, unlike setting given times, needs write permission on the file or its
/// ownership, not a writable handle: a blob another user wrote into this user's cache
/// is retimed when this user may write it, as through a writable handle.
fn retime(f: &fs::File) {
    #[cfg(unix)]
    {
        use std::os::unix::io::AsRawFd;
        // SAFETY: the descriptor is open for the whole call (borrowed from `f`), and a
        // null `times` is futimens's documented "set both to now".
        let _ = unsafe { libc::futimens(f.as_raw_fd(), std::ptr::null()) };
    }
    #[cfg(not(unix))]
    {
        let _ = f.set_modified(SystemTime::now());
    }
}

/// Read the regular file at `path` (at most `cap` bytes), and mark it used when
/// `touch` is set.
/// Read a file someone handed over (a precompiled function) as the store reads its
/// blobs: a regular file only, opened without following a final link or blocking
/// (a FIFO is refused, not waited on), and no larger than `cap` bytes.
pub fn read_regular_file(path: &Path, cap: u64) -> Result<Vec<u8>, String> {
    read_blob(path, cap, false).map_err(|e| e.to_string())
}

fn read_blob(path: &Path, cap: u64, touch: bool) -> Result<Vec<u8>, ReadError> {
    let (mut f, len) = open_regular(path)?;
    let bytes = read_bounded(&mut f, len, cap)?;
    if touch {
        retime(&f);
    }
    Ok(bytes)
}

/// Whether `p` is a directory itself (not a link to one).
fn is_real_dir(p: &Path) -> bool {
    fs::symlink_metadata(p).is_ok_and(|m| m.is_dir())
}

/// Remove what is at `p`: a directory with its contents, anything else (a link
/// included) by its name alone, never a link's target.
fn remove_path(p: &Path) -> std::io::Result<()> {
    if is_real_dir(p) {
        fs::remove_dir_all(p)
    } else {
        fs::remove_file(p)
    }
}

pub(crate) fn valid_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl DiskStore {
    /// A store rooted at `root` (created when first written) holding at most `max_bytes`.
    pub fn new(root: impl Into<PathBuf>, max_bytes: u64) -> DiskStore {
        DiskStore {
            root: root.into(),
            max_bytes,
            estimate: std::sync::Mutex::new(None),
            listings: AtomicU64::new(0),
            private: std::sync::OnceLock::new(),
        }
    }

    /// The default directory: `AOTGRAD_CACHE_DIR`, else `$XDG_CACHE_HOME/aotgrad`, else
    /// `~/.cache/aotgrad`, else a directory under the system temp dir.
    pub fn default_dir() -> PathBuf {
        if let Some(d) = std::env::var_os("AOTGRAD_CACHE_DIR").filter(|d| !d.is_empty()) {
            return PathBuf::from(d);
        }
        if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
            return PathBuf::from(d).join("aotgrad");
        }
        if let Some(h) = std::env::var_os("HOME").filter(|d| !d.is_empty()) {
            return PathBuf::from(h).join(".cache").join("aotgrad");
        }
        // Shared by every user: one directory each (and `check_private` refuses one
        // another user made).
        #[cfg(unix)]
        let name = format!("aotgrad-cache-{}", unsafe { libc::geteuid() });
        #[cfg(not(unix))]
        let name = "aotgrad-cache".to_string();
        std::env::temp_dir().join(name)
    }

    /// On Unix, refuse a cache root that another user owns or can write: whoever can
    /// write the cache decides what this process runs (an unsigned entry needs only a
    /// valid checksum). Checked once per handle, when the root exists.
    fn check_private(&self) -> Result<(), StoreError> {
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            if let Some(verdict) = self.private.get() {
                return verdict.clone().map_err(|msg| StoreError { store: self.describe(), msg });
            }
            if !self.root.exists() {
                // Not there yet: created private on the first write.
                return Ok(());
            }
            // SAFETY: geteuid has no preconditions and cannot fail.
            let me = unsafe { libc::geteuid() };
            // The root and the directories entries and artifacts are written into
            // (key directories are created inside `entries`, so they are as safe).
            let v1 = self.root.join("v1");
            let dirs = [self.root.clone(), v1.clone(), v1.join("entries"), v1.join("artifacts")];
            let mut verdict = Ok(());
            for d in &dirs {
                let Ok(m) = fs::metadata(d) else { continue };
                let bad = if m.uid() != me {
                    Some(format!("is owned by user {}, not this user ({me})", m.uid()))
                } else if m.mode() & 0o022 != 0 {
                    Some(format!("can be written by other users (mode {:o}); `chmod go-w` it", m.mode() & 0o777))
                } else {
                    None
                };
                if let Some(why) = bad {
                    verdict = Err(format!("{} {why}: the cache is not used", d.display()));
                    break;
                }
            }
            let verdict = self.private.get_or_init(|| verdict);
            verdict.clone().map_err(|msg| StoreError { store: self.describe(), msg })
        }
        #[cfg(not(unix))]
        Ok(())
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn err(&self, what: &str, path: &Path, e: impl std::fmt::Display) -> StoreError {
        StoreError { store: self.describe(), msg: format!("{what} {}: {e}", path.display()) }
    }
    fn entries_dir(&self) -> PathBuf {
        self.root.join("v1").join("entries")
    }
    fn artifacts_dir(&self) -> PathBuf {
        self.root.join("v1").join("artifacts")
    }

    /// Make `dir` if it is not there. A link to a directory in its place is used
    /// when `follow_link` is set (the store's own directories, which `check_private`
    /// checks through links), replaced otherwise (a key's directory).
    fn make_dir(&self, dir: &Path, follow_link: bool) -> Result<(), StoreError> {
        if if follow_link { dir.is_dir() } else { is_real_dir(dir) } {
            return Ok(());
        }
        // Something that is not a directory where one should be (a file, a FIFO, a
        // link): remove it, by its name (a link goes, its target stays).
        if fs::symlink_metadata(dir).is_ok() {
            let _ = fs::remove_file(dir);
        }
        let mut b = fs::DirBuilder::new();
        b.recursive(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::DirBuilderExt;
            b.mode(0o700);
        }
        b.create(dir).map_err(|e| self.err("cannot create", dir, e))
    }

    /// Write `bytes` to `path` atomically.
    fn write_atomic(&self, path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
        let dir = path.parent().ok_or_else(|| self.err("no parent for", path, "root"))?;
        // A key's directory must be one itself; the artifact directory may be a link.
        self.make_dir(dir, dir.parent() != Some(self.entries_dir().as_path()))?;
        let tmp = dir.join(format!(
            ".tmp-{}-{}-{}",
            std::process::id(),
            SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0),
            TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let result = (|| {
            // A new file only: nothing already there (a link) is opened and truncated.
            let mut f = fs::File::options()
                .write(true)
                .create_new(true)
                .open(&tmp)
                .map_err(|e| self.err("cannot create", &tmp, e))?;
            f.write_all(bytes).map_err(|e| self.err("cannot write", &tmp, e))?;
            // No fsync: a cache needs atomicity, not durability. A crash may leave a
            // truncated or empty entry, which the checksum rejects and a compile replaces.
            drop(f);
            // A rename replaces a file, FIFO or link by its name (a link's target is
            // untouched), but not a directory.
            if is_real_dir(path) {
                let _ = fs::remove_dir_all(path);
            }
            fs::rename(&tmp, path).map_err(|e| self.err("cannot rename into", path, e))
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result
    }

    /// The cap on one entry or artifact read: [`MAX_BLOB_BYTES`], or the size limit
    /// when smaller (a blob over it would be the first to go at the next eviction).
    fn blob_cap(&self) -> u64 {
        MAX_BLOB_BYTES.min(self.max_bytes)
    }

    /// Account for `written` new bytes; when the estimate passes the limit (or on the
    /// first write), list the store and evict.
    fn wrote(&self, written: u64) -> Result<(), StoreError> {
        let mut estimate = self.estimate.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(total) = estimate.as_mut() {
            *total = total.saturating_add(written);
            if *total <= self.max_bytes {
                return Ok(());
            }
        }
        let held = self.evict();
        *estimate = held.as_ref().ok().copied();
        held.map(|_| ())
    }

    /// How many times this handle listed the store to keep its size limit.
    #[cfg(test)]
    fn limit_listings(&self) -> u64 {
        self.listings.load(Ordering::Relaxed)
    }

    /// Remove least recently used blobs until the store fits its size limit; returns
    /// the bytes it then holds.
    fn evict(&self) -> Result<u64, StoreError> {
        self.listings.fetch_add(1, Ordering::Relaxed);
        self.remove_stale_temporaries();
        let mut blobs = self.list()?;
        let mut total: u64 = blobs.iter().map(|b| b.bytes).sum();
        if total <= self.max_bytes {
            return Ok(total);
        }
        blobs.sort_by_key(|b| b.last_used);
        for b in blobs {
            if total <= self.max_bytes {
                break;
            }
            let path = if b.id.is_empty() {
                self.artifacts_dir().join(format!("{}.artifact", b.key))
            } else {
                self.entries_dir().join(&b.key).join(format!("{}.entry", b.id))
            };
            if fs::remove_file(&path).is_ok() {
                tracing::debug!(target: "aotgrad::cache", "evicted {} ({} bytes)", path.display(), b.bytes);
                total = total.saturating_sub(b.bytes);
            }
        }
        Ok(total)
    }

    /// Remove temporary files a crashed writer left (older than an hour: a live
    /// writer renames its file within moments), which no listing counts.
    fn remove_stale_temporaries(&self) {
        let stale = |m: &fs::Metadata| {
            m.modified().ok().and_then(|t| t.elapsed().ok()).is_some_and(|age| age.as_secs() > STALE_TMP_SECONDS)
        };
        let mut dirs = vec![self.artifacts_dir()];
        if let Ok(rd) = fs::read_dir(self.entries_dir()) {
            dirs.extend(rd.filter_map(|e| e.ok()).filter(is_dir_entry).map(|e| e.path()));
        }
        for d in dirs {
            let Ok(rd) = fs::read_dir(&d) else { continue };
            for e in rd.filter_map(|e| e.ok()) {
                let is_tmp = e.file_name().to_str().is_some_and(|n| n.starts_with(".tmp-"));
                if is_tmp && e.metadata().is_ok_and(|m| m.is_file() && stale(&m)) {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
    }

    /// The regular files named `*.<ext>` in `dir`, with their metadata. A directory
    /// entry's metadata is the entry's own (a link is a link, not its target), so
    /// links, FIFOs and the like are not counted.
    fn files(&self, dir: &Path, ext: &str) -> Vec<(PathBuf, fs::Metadata)> {
        let Ok(rd) = fs::read_dir(dir) else { return Vec::new() };
        rd.filter_map(|e| e.ok())
            .filter(|e| e.path().extension().is_some_and(|x| x == ext))
            .filter_map(|e| Some((e.path(), e.metadata().ok()?)))
            .filter(|(_, m)| m.is_file())
            .collect()
    }
}

/// Whether a directory entry is a directory itself (its type is the entry's own: a
/// link to a directory is not one).
fn is_dir_entry(e: &fs::DirEntry) -> bool {
    e.file_type().is_ok_and(|t| t.is_dir())
}

fn stem(p: &Path) -> String {
    p.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
}

impl Store for DiskStore {
    fn describe(&self) -> String {
        format!("disk {}", self.root.display())
    }

    fn entries(&self, key: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        Ok(self.entries_where(key, &|_| true)?.0)
    }

    fn entries_where(
        &self,
        key: &str,
        want: &dyn Fn(&str) -> bool,
    ) -> Result<(Vec<(String, Vec<u8>)>, Vec<String>), StoreError> {
        if !valid_name(key) {
            return Err(self.err("invalid key", Path::new(key), "not a hex name"));
        }
        self.check_private()?;
        let dir = self.entries_dir().join(key);
        match fs::symlink_metadata(&dir) {
            Ok(m) if m.is_dir() => {}
            Ok(m) => {
                let what = kind_of(m.file_type());
                return Err(self.err("not a directory:", &dir, format!("{what} in place of the key's entries")));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), Vec::new())),
            Err(e) => return Err(self.err("cannot read", &dir, e)),
        }
        let rd = match fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), Vec::new())),
            Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => {
                return Err(self.err("not a directory:", &dir, "expected the key's entries"))
            }
            Err(e) => return Err(self.err("cannot read", &dir, e)),
        };
        let (mut out, mut others) = (Vec::new(), Vec::new());
        let mut paths: Vec<PathBuf> = rd
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "entry"))
            .collect();
        paths.sort();
        let cap = self.blob_cap();
        for p in paths {
            if !want(&stem(&p)) {
                others.push(stem(&p));
                continue;
            }
            match read_blob(&p, cap, true) {
                Ok(bytes) => out.push((stem(&p), bytes)),
                // Removed by another process's eviction since the listing: not there.
                Err(ReadError::Missing) => {}
                // A link, FIFO, directory, oversized or unreadable file...: an empty blob,
                // which the cache rejects as too short (and removes).
                Err(e) => {
                    tracing::warn!(target: "aotgrad::cache", "cannot read cache entry {}: {e}", p.display());
                    out.push((stem(&p), Vec::new()));
                }
            }
        }
        Ok((out, others))
    }

    fn put_entry(&self, key: &CacheKey, id: &str, blob: &[u8]) -> Result<(), StoreError> {
        if !valid_name(&key.hex) || !valid_name(id) {
            return Err(self.err("invalid key or id", Path::new(id), "not a hex name"));
        }
        self.check_private()?;
        let dir = self.entries_dir().join(&key.hex);
        let key_file = dir.join("key.json");
        // Rewritten unless a regular file is there (a link or FIFO is replaced).
        if !fs::symlink_metadata(&key_file).is_ok_and(|m| m.is_file()) {
            let json = serde_json::to_vec_pretty(key).map_err(|e| self.err("cannot encode", &key_file, e))?;
            self.write_atomic(&key_file, &json)?;
        }
        self.write_atomic(&dir.join(format!("{id}.entry")), blob)?;
        // A replaced entry counts again: the estimate errs high, toward listing early.
        self.wrote(blob.len() as u64)
    }

    fn remove_entry(&self, key: &str, id: &str) -> Result<(), StoreError> {
        if !valid_name(key) || !valid_name(id) {
            return Ok(());
        }
        let p = self.entries_dir().join(key).join(format!("{id}.entry"));
        match remove_path(&p) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(self.err("cannot remove", &p, e)),
        }
    }

    fn artifact(&self, hash: &str) -> Result<Option<Vec<u8>>, StoreError> {
        if !valid_name(hash) {
            return Ok(None);
        }
        self.check_private()?;
        let p = self.artifacts_dir().join(format!("{hash}.artifact"));
        match read_blob(&p, self.blob_cap(), true) {
            Ok(b) => Ok(Some(b)),
            Err(ReadError::Missing) => Ok(None),
            // Not an artifact: an empty blob, which the cache rejects as too short (and
            // removes, so that the next write puts a regular file there).
            Err(e @ ReadError::Refused(_)) => {
                tracing::warn!(target: "aotgrad::cache", "cannot read artifact {}: {e}", p.display());
                Ok(Some(Vec::new()))
            }
            Err(e) => Err(self.err("cannot read", &p, e)),
        }
    }

    fn put_artifact(&self, hash: &str, blob: &[u8]) -> Result<(), StoreError> {
        if !valid_name(hash) {
            return Err(self.err("invalid artifact hash", Path::new(hash), "not a hex name"));
        }
        self.check_private()?;
        let p = self.artifacts_dir().join(format!("{hash}.artifact"));
        // Content-addressed: a copy already there is kept, but only when it is a
        // regular file holding this blob byte for byte (a damaged copy that no load has
        // met yet is replaced, and so is a link or FIFO; one of another size is not read).
        if let Ok((mut f, len)) = open_regular(&p) {
            if len == blob.len() as u64 && read_bounded(&mut f, len, len).is_ok_and(|held| held == blob) {
                retime(&f);
                return Ok(());
            }
        }
        self.write_atomic(&p, blob)?;
        // Counted, not checked: the entry written next (which references it) checks.
        let mut estimate = self.estimate.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(total) = estimate.as_mut() {
            *total = total.saturating_add(blob.len() as u64);
        }
        Ok(())
    }

    fn remove_artifact(&self, hash: &str) -> Result<(), StoreError> {
        if !valid_name(hash) {
            return Ok(());
        }
        let p = self.artifacts_dir().join(format!("{hash}.artifact"));
        match remove_path(&p) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(self.err("cannot remove", &p, e)),
        }
    }

    fn keys(&self) -> Result<Vec<CacheKey>, StoreError> {
        let Ok(rd) = fs::read_dir(self.entries_dir()) else { return Ok(Vec::new()) };
        let mut out = Vec::new();
        for e in rd.filter_map(|e| e.ok()).filter(is_dir_entry) {
            let dir = e.path();
            // A key with no entry left (all evicted or rejected) is not a key held.
            if self.files(&dir, "entry").is_empty() {
                continue;
            }
            let key_file = dir.join("key.json");
            let json = match read_blob(&key_file, MAX_KEY_JSON_BYTES, false) {
                Ok(json) => json,
                Err(ReadError::Missing) => continue,
                Err(e) => {
                    tracing::warn!(target: "aotgrad::cache", "ignored {}: {e}", key_file.display());
                    continue;
                }
            };
            // `key.json` is not sealed: one that does not name its own directory is
            // not trusted (its text is printed and sliced).
            match serde_json::from_slice::<CacheKey>(&json) {
                Ok(k) if valid_name(&k.hex) && e.file_name().to_str() == Some(k.hex.as_str()) => out.push(k),
                _ => {
                    tracing::warn!(target: "aotgrad::cache", "ignored {}: not this key's ingredients", dir.join("key.json").display())
                }
            }
        }
        out.sort_by(|a, b| a.hex.cmp(&b.hex));
        Ok(out)
    }

    fn list(&self) -> Result<Vec<BlobInfo>, StoreError> {
        let mut out = Vec::new();
        let info = |key: String, id: String, m: &fs::Metadata| BlobInfo {
            key,
            id,
            bytes: m.len(),
            last_used: m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
        };
        if let Ok(rd) = fs::read_dir(self.entries_dir()) {
            let mut dirs: Vec<PathBuf> = rd.filter_map(|e| e.ok()).filter(is_dir_entry).map(|e| e.path()).collect();
            dirs.sort();
            for d in dirs {
                let key = d.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
                for (p, m) in self.files(&d, "entry") {
                    out.push(info(key.clone(), stem(&p), &m));
                }
            }
        }
        for (p, m) in self.files(&self.artifacts_dir(), "artifact") {
            out.push(info(stem(&p), String::new(), &m));
        }
        Ok(out)
    }

    fn clear(&self) -> Result<(), StoreError> {
        *self.estimate.lock().unwrap_or_else(|e| e.into_inner()) = None;
        let v1 = self.root.join("v1");
        match fs::remove_dir_all(&v1) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(self.err("cannot remove", &v1, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> CacheKey {
        CacheKey { hex: format!("{n:064x}"), ingredients: Default::default() }
    }

    #[cfg(unix)]
    #[test]
    fn a_root_other_users_can_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("aotgrad-store-private-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        let s = DiskStore::new(&dir, u64::MAX);
        let e = s.put_entry(&key(0), "e", b"blob").unwrap_err();
        assert!(e.msg.contains("can be written by other users"), "{e}");
        assert!(s.entries(&key(0).hex).is_err());
        assert!(s.artifact(&key(0).hex).is_err());
        assert!(!dir.join("v1").exists(), "nothing was written");
        // Made private, a new handle uses it.
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
        let s = DiskStore::new(&dir, u64::MAX);
        s.put_entry(&key(0), "e", b"blob").unwrap();
        assert_eq!(s.entries(&key(0).hex).unwrap().len(), 1);
        // A directory inside that others can write is refused too.
        fs::set_permissions(dir.join("v1").join("entries"), fs::Permissions::from_mode(0o777)).unwrap();
        let e = DiskStore::new(&dir, u64::MAX).entries(&key(0).hex).unwrap_err();
        assert!(e.msg.contains("entries can be written by other users"), "{e}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_crashed_writers_temporary_files_are_removed_once_stale() {
        let dir = std::env::temp_dir().join(format!("aotgrad-store-tmp-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let s = DiskStore::new(&dir, u64::MAX);
        s.put_entry(&key(0), "e", b"blob").unwrap();
        let key_dir = s.entries_dir().join(key(0).hex);
        let (old, fresh) = (key_dir.join(".tmp-1-2-3"), key_dir.join(".tmp-4-5-6"));
        fs::write(&old, b"half a blob").unwrap();
        fs::write(&fresh, b"being written").unwrap();
        let two_hours_ago = SystemTime::now() - std::time::Duration::from_secs(7200);
        fs::File::options().append(true).open(&old).unwrap().set_modified(two_hours_ago).unwrap();
        s.evict().unwrap();
        assert!(!old.exists(), "a stale temporary is removed");
        assert!(fresh.exists(), "a live writer's temporary is left alone");
        assert_eq!(s.list().unwrap().len(), 1);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn keys_are_the_keys_holding_entries_whose_ingredients_name_them() {
        let dir = std::env::temp_dir().join(format!("aotgrad-store-keys-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let s = DiskStore::new(&dir, u64::MAX);
        for n in 0..3 {
            s.put_entry(&key(n), "e", b"blob").unwrap();
        }
        // Key 1 loses its only entry; key 2's ingredients are replaced by another key's
        // (with a name that would break slicing by bytes).
        s.remove_entry(&key(1).hex, "e").unwrap();
        let forged = CacheKey { hex: "ééééééééééééééé".into(), ingredients: Default::default() };
        fs::write(s.entries_dir().join(key(2).hex).join("key.json"), serde_json::to_vec(&forged).unwrap()).unwrap();
        let keys: Vec<String> = s.keys().unwrap().into_iter().map(|k| k.hex).collect();
        assert_eq!(keys, vec![key(0).hex]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_size_limit_lists_the_store_only_when_its_estimate_passes_it() {
        let dir = std::env::temp_dir().join(format!("aotgrad-store-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let a = DiskStore::new(&dir, 10_000);
        // Many small writes under the limit: one listing (the first write's).
        for n in 0..20 {
            a.put_entry(&key(n), "e", &[n; 100]).unwrap();
        }
        assert_eq!(a.limit_listings(), 1);
        assert_eq!(a.list().unwrap().len(), 20);
        // Another handle (another process) fills the store past the limit.
        let b = DiskStore::new(&dir, 10_000);
        for n in 20..30 {
            b.put_entry(&key(n), "e", &[n; 1000]).unwrap();
        }
        let held = |s: &DiskStore| s.list().unwrap().iter().map(|x| x.bytes).sum::<u64>();
        assert!(held(&b) <= 10_000, "{} bytes", held(&b));
        // The first handle's estimate does not know; its writes list again once the
        // estimate passes the limit, and the store is back under it.
        let before = a.limit_listings();
        for n in 30..120 {
            a.put_entry(&key(n), "e", &[n; 100]).unwrap();
        }
        assert!(a.limit_listings() > before);
        assert!(held(&a) <= 10_000, "{} bytes", held(&a));
        fs::remove_dir_all(&dir).unwrap();
    }
}
