//! Where blobs live: the [`Store`] trait and the on-disk store.
//!
//! A store keeps, per cache key, any number of entry blobs (one per guard set), the
//! key's ingredients (for miss diagnostics), and content-addressed artifact blobs.
//! Stores move sealed bytes only; checking them is the cache's job
//! ([`crate::envelope`]).

use crate::key::CacheKey;
use std::fs;
use std::io::Write;
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
    /// Write entry `id` under `key` (replacing one with that id) and the key's
    /// ingredients.
    fn put_entry(&self, key: &CacheKey, id: &str, blob: &[u8]) -> Result<(), StoreError>;
    /// Remove entry `id` under `key` (a corrupt one).
    fn remove_entry(&self, key: &str, id: &str) -> Result<(), StoreError>;
    /// An artifact blob by content hash.
    fn artifact(&self, hash: &str) -> Result<Option<Vec<u8>>, StoreError>;
    /// Write an artifact blob under its content hash.
    fn put_artifact(&self, hash: &str, blob: &[u8]) -> Result<(), StoreError>;
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
/// Directories are created private to the user (mode 0700). Beyond `max_bytes` the
/// least recently used blobs are removed after a write. The limit is kept without
/// listing the store on every write: a handle lists it on its first write, then adds
/// what it writes to the total it found, and lists (and evicts) again only when that
/// estimate passes the limit; what other processes write meanwhile is seen at that
/// listing, so the store may pass its limit by what they wrote since.
pub struct DiskStore {
    root: PathBuf,
    max_bytes: u64,
    /// Bytes held at this handle's last listing plus what it wrote since (`None`:
    /// not listed yet).
    estimate: std::sync::Mutex<Option<u64>>,
    /// Listings made for the size limit (what the tests check).
    listings: AtomicU64,
}

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

fn valid_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl DiskStore {
    /// A store rooted at `root` (created when first written) holding at most `max_bytes`.
    pub fn new(root: impl Into<PathBuf>, max_bytes: u64) -> DiskStore {
        DiskStore { root: root.into(), max_bytes, estimate: std::sync::Mutex::new(None), listings: AtomicU64::new(0) }
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
        std::env::temp_dir().join("aotgrad-cache")
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

    fn make_dir(&self, dir: &Path) -> Result<(), StoreError> {
        if dir.is_dir() {
            return Ok(());
        }
        // Something that is not a directory where one should be: replace it.
        if dir.exists() {
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
        self.make_dir(dir)?;
        let tmp = dir.join(format!(
            ".tmp-{}-{}-{}",
            std::process::id(),
            SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0),
            TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let result = (|| {
            let mut f = fs::File::create(&tmp).map_err(|e| self.err("cannot create", &tmp, e))?;
            f.write_all(bytes).map_err(|e| self.err("cannot write", &tmp, e))?;
            // No fsync: a cache needs atomicity, not durability. A crash may leave a
            // truncated or empty entry, which the checksum rejects and a compile replaces.
            drop(f);
            if path.is_dir() {
                let _ = fs::remove_dir_all(path);
            }
            fs::rename(&tmp, path).map_err(|e| self.err("cannot rename into", path, e))
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result
    }

    /// Read a blob and mark it used (its modification time is what eviction orders
    /// by), through one open file.
    fn read_and_touch(path: &Path) -> std::io::Result<Vec<u8>> {
        use std::io::Read;
        let mut f = fs::File::open(path)?;
        let mut bytes = Vec::with_capacity(f.metadata().map(|m| m.len() as usize).unwrap_or(0));
        f.read_to_end(&mut bytes)?;
        // Setting the time needs ownership, not write access; a blob this user cannot
        // retime (not theirs) is retimed through a writable handle if it can be.
        if f.set_modified(SystemTime::now()).is_err() {
            Self::touch(path);
        }
        Ok(bytes)
    }

    fn touch(path: &Path) {
        if let Ok(f) = fs::File::options().append(true).open(path) {
            let _ = f.set_modified(SystemTime::now());
        }
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

    fn files(&self, dir: &Path, ext: &str) -> Vec<(PathBuf, fs::Metadata)> {
        let Ok(rd) = fs::read_dir(dir) else { return Vec::new() };
        rd.filter_map(|e| e.ok())
            .filter(|e| e.path().extension().is_some_and(|x| x == ext))
            .filter_map(|e| Some((e.path(), e.metadata().ok()?)))
            .filter(|(_, m)| m.is_file())
            .collect()
    }
}

fn stem(p: &Path) -> String {
    p.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
}

impl Store for DiskStore {
    fn describe(&self) -> String {
        format!("disk {}", self.root.display())
    }

    fn entries(&self, key: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        if !valid_name(key) {
            return Err(self.err("invalid key", Path::new(key), "not a hex name"));
        }
        let dir = self.entries_dir().join(key);
        let rd = match fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => {
                return Err(self.err("not a directory:", &dir, "expected the key's entries"))
            }
            Err(e) => return Err(self.err("cannot read", &dir, e)),
        };
        let mut out = Vec::new();
        let mut paths: Vec<PathBuf> = rd
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "entry"))
            .collect();
        paths.sort();
        for p in paths {
            match Self::read_and_touch(&p) {
                Ok(bytes) => out.push((stem(&p), bytes)),
                // Removed by another process's eviction since the listing: not there.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                // A directory, unreadable file...: an empty blob is rejected as too short.
                Err(e) => {
                    tracing::warn!(target: "aotgrad::cache", "cannot read {}: {e}", p.display());
                    out.push((stem(&p), Vec::new()));
                }
            }
        }
        Ok(out)
    }

    fn put_entry(&self, key: &CacheKey, id: &str, blob: &[u8]) -> Result<(), StoreError> {
        if !valid_name(&key.hex) || !valid_name(id) {
            return Err(self.err("invalid key or id", Path::new(id), "not a hex name"));
        }
        let dir = self.entries_dir().join(&key.hex);
        let key_file = dir.join("key.json");
        if !key_file.is_file() {
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
        let r = if p.is_dir() { fs::remove_dir_all(&p) } else { fs::remove_file(&p) };
        match r {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(self.err("cannot remove", &p, e)),
        }
    }

    fn artifact(&self, hash: &str) -> Result<Option<Vec<u8>>, StoreError> {
        if !valid_name(hash) {
            return Ok(None);
        }
        let p = self.artifacts_dir().join(format!("{hash}.artifact"));
        match fs::read(&p) {
            Ok(b) => {
                Self::touch(&p);
                Ok(Some(b))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.err("cannot read", &p, e)),
        }
    }

    fn put_artifact(&self, hash: &str, blob: &[u8]) -> Result<(), StoreError> {
        if !valid_name(hash) {
            return Err(self.err("invalid artifact hash", Path::new(hash), "not a hex name"));
        }
        let p = self.artifacts_dir().join(format!("{hash}.artifact"));
        if p.is_file() {
            Self::touch(&p);
            return Ok(());
        }
        self.write_atomic(&p, blob)?;
        // Counted, not checked: the entry written next (which references it) checks.
        let mut estimate = self.estimate.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(total) = estimate.as_mut() {
            *total = total.saturating_add(blob.len() as u64);
        }
        Ok(())
    }

    fn keys(&self) -> Result<Vec<CacheKey>, StoreError> {
        let Ok(rd) = fs::read_dir(self.entries_dir()) else { return Ok(Vec::new()) };
        let mut out = Vec::new();
        for e in rd.filter_map(|e| e.ok()) {
            let Ok(json) = fs::read(e.path().join("key.json")) else { continue };
            if let Ok(k) = serde_json::from_slice::<CacheKey>(&json) {
                out.push(k);
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
            let mut dirs: Vec<PathBuf> = rd.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.is_dir()).collect();
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
