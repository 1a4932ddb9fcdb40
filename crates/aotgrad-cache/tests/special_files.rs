//! Special files in a disk cache: a FIFO, a link to a file outside the cache, a link
//! to `/dev/zero` in place of an entry, an artifact or a key's `key.json`. Each is a
//! bounded, logged miss: the call returns (each runs in a thread the test waits on for
//! a few seconds only), nothing is read from the link's target and the target is not
//! retimed, and the next write puts a regular file in its place.

#![cfg(unix)]

use aotgrad_cache::{
    AotResult, Artifact, Cache, CacheKey, CallSig, DiskStore, Flavour, GraphDumps, KeyBuilder, ResultMeta, Store,
};
use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Run `f` in a thread and wait for it a few seconds: a call that blocks (a FIFO
/// opened for reading) or reads without end (`/dev/zero`) fails the test instead of
/// hanging it.
fn bounded<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(5)) {
        Ok(v) => v,
        Err(e) => panic!("{what} did not return within 5 s ({e}): it blocks or reads without end"),
    }
}

fn key(n: u8) -> CacheKey {
    CacheKey { hex: format!("{n:064x}"), ingredients: Default::default() }
}

fn entry_path(root: &Path, key: &CacheKey, id: &str) -> PathBuf {
    root.join("v1").join("entries").join(&key.hex).join(format!("{id}.entry"))
}

fn artifact_path(root: &Path, hash: &str) -> PathBuf {
    root.join("v1").join("artifacts").join(format!("{hash}.artifact"))
}

fn key_json(root: &Path, key: &CacheKey) -> PathBuf {
    root.join("v1").join("entries").join(&key.hex).join("key.json")
}

fn make_fifo(p: &Path) {
    let _ = fs::remove_file(p);
    let c = CString::new(p.as_os_str().as_bytes()).expect("path");
    // SAFETY: a valid NUL-terminated path.
    let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(rc, 0, "mkfifo {}: {}", p.display(), std::io::Error::last_os_error());
}

fn make_link(target: &Path, p: &Path) {
    let _ = fs::remove_file(p);
    std::os::unix::fs::symlink(target, p).expect("symlink");
}

/// The special files the cache tests put in a blob's place: a FIFO (no target), a
/// link to `outside`, a link to `/dev/zero`.
fn specials(outside: &Path) -> [(&'static str, Option<&Path>); 3] {
    [
        ("a FIFO", None),
        ("a link to a file outside", Some(outside)),
        ("a link to /dev/zero", Some(Path::new("/dev/zero"))),
    ]
}

/// Put a FIFO (`link_to` is `None`) or a link to `link_to` at `p`.
fn make_special(p: &Path, link_to: Option<&Path>) {
    match link_to {
        None => make_fifo(p),
        Some(target) => make_link(target, p),
    }
}

/// A time long past, set on files whose time must not move.
fn long_ago() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000)
}

/// A file outside the cache that links point at: fixed contents, an old time.
struct Outside {
    _dir: tempfile::TempDir,
    path: PathBuf,
    contents: Vec<u8>,
}

impl Outside {
    fn new(contents: &[u8]) -> Outside {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("precious");
        fs::write(&path, contents).expect("write");
        fs::File::options().write(true).open(&path).expect("open").set_modified(long_ago()).expect("set time");
        Outside { _dir: dir, path, contents: contents.to_vec() }
    }
    fn assert_untouched(&self) {
        let m = fs::metadata(&self.path).expect("the target is still there");
        assert_eq!(m.modified().expect("mtime"), long_ago(), "the link's target was retimed");
        assert_eq!(fs::read(&self.path).expect("read"), self.contents, "the link's target was changed");
    }
}

fn is_regular(p: &Path) -> bool {
    fs::symlink_metadata(p).is_ok_and(|m| m.is_file())
}

/// A store holding entries `e` and `f` under key 1 and one artifact.
fn filled(max_bytes: u64) -> (tempfile::TempDir, Arc<DiskStore>, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Arc::new(DiskStore::new(dir.path(), max_bytes));
    store.put_entry(&key(1), "e", b"entry e").expect("write");
    store.put_entry(&key(1), "f", b"entry f").expect("write");
    let hash = "a".repeat(64);
    store.put_artifact(&hash, b"an artifact").expect("write");
    (dir, store, hash)
}

/// Read everything through `store` in bounded time, with `e`, the artifact and
/// `key.json` replaced by special files: `e` comes back empty (rejected by the cache
/// as too short), `f` whole, the artifact empty or an error, key 1 is not among the
/// keys, and the listing counts regular files only.
fn check_refused(store: &Arc<DiskStore>, hash: &str) {
    let s = store.clone();
    let entries = bounded("entries()", move || s.entries(&key(1).hex)).expect("entries");
    assert_eq!(entries, vec![("e".to_string(), Vec::new()), ("f".to_string(), b"entry f".to_vec())]);
    let (s, h) = (store.clone(), hash.to_string());
    let artifact = bounded("artifact()", move || s.artifact(&h));
    assert!(matches!(&artifact, Ok(Some(b)) if b.is_empty()) || artifact.is_err(), "{artifact:?}");
    let s = store.clone();
    let keys = bounded("keys()", move || s.keys()).expect("keys");
    assert!(keys.is_empty(), "a key whose key.json is not a regular file is not listed: {keys:?}");
    let s = store.clone();
    let listed = bounded("list()", move || s.list()).expect("list");
    let names: Vec<(String, String)> = listed.iter().map(|b| (b.key.clone(), b.id.clone())).collect();
    assert_eq!(names, vec![(key(1).hex, "f".to_string())], "only regular files are listed");
    assert_eq!(listed[0].bytes, 7);
}

#[test]
fn a_fifo_in_place_of_an_entry_an_artifact_or_key_json_is_refused_without_blocking() {
    let (dir, store, hash) = filled(1 << 20);
    let root = dir.path();
    make_fifo(&entry_path(root, &key(1), "e"));
    make_fifo(&artifact_path(root, &hash));
    make_fifo(&key_json(root, &key(1)));
    check_refused(&store, &hash);
    // Removal removes the FIFOs; writes put regular files in their place.
    store.remove_entry(&key(1).hex, "e").expect("remove");
    assert!(fs::symlink_metadata(entry_path(root, &key(1), "e")).is_err());
    store.remove_artifact(&hash).expect("remove");
    assert!(fs::symlink_metadata(artifact_path(root, &hash)).is_err());
    make_fifo(&entry_path(root, &key(1), "e"));
    make_fifo(&artifact_path(root, &hash));
    let s = store.clone();
    bounded("put_entry()", move || s.put_entry(&key(1), "e", b"entry e again")).expect("write");
    let (s, h) = (store.clone(), hash.clone());
    bounded("put_artifact()", move || s.put_artifact(&h, b"an artifact")).expect("write");
    assert!(is_regular(&entry_path(root, &key(1), "e")));
    assert!(is_regular(&artifact_path(root, &hash)));
    assert!(is_regular(&key_json(root, &key(1))), "key.json is written again");
    assert_eq!(store.entries(&key(1).hex).expect("entries")[0].1, b"entry e again");
    assert_eq!(store.artifact(&hash).expect("artifact"), Some(b"an artifact".to_vec()));
    assert_eq!(store.keys().expect("keys"), vec![key(1)]);
}

#[test]
fn a_link_to_a_file_outside_the_cache_is_not_read_and_its_target_not_retimed() {
    let (dir, store, hash) = filled(1 << 20);
    let root = dir.path();
    // The target holds a valid-looking blob: the artifact's own bytes (a store that
    // followed the link would keep it as "already there" and retime it).
    let outside = Outside::new(b"an artifact");
    make_link(&outside.path, &entry_path(root, &key(1), "e"));
    make_link(&outside.path, &artifact_path(root, &hash));
    make_link(&outside.path, &key_json(root, &key(1)));
    check_refused(&store, &hash);
    outside.assert_untouched();
    // Writing the same artifact replaces the link with a regular file.
    store.put_artifact(&hash, b"an artifact").expect("write");
    assert!(is_regular(&artifact_path(root, &hash)));
    outside.assert_untouched();
    // Removal removes the link, not its target.
    store.remove_entry(&key(1).hex, "e").expect("remove");
    assert!(fs::symlink_metadata(entry_path(root, &key(1), "e")).is_err());
    make_link(&outside.path, &artifact_path(root, &hash));
    store.remove_artifact(&hash).expect("remove");
    assert!(fs::symlink_metadata(artifact_path(root, &hash)).is_err());
    outside.assert_untouched();
    // An eviction does not follow the link either.
    make_link(&outside.path, &entry_path(root, &key(1), "e"));
    let small = DiskStore::new(root, 1);
    small.put_entry(&key(2), "g", b"entry g").expect("write");
    outside.assert_untouched();
}

#[test]
fn a_link_in_place_of_a_key_directory_is_not_followed() {
    let (dir, store, _) = filled(1 << 20);
    let root = dir.path();
    // A directory outside the cache that looks like a key's: an entry and key.json.
    let outside_dir = tempfile::tempdir().expect("temp dir");
    let outside = Outside::new(b"entry e");
    let outside_entry = outside_dir.path().join("e.entry");
    fs::copy(&outside.path, &outside_entry).expect("copy");
    fs::write(outside_dir.path().join("key.json"), serde_json::to_vec(&key(3)).expect("json")).expect("write");
    fs::File::options().write(true).open(&outside_entry).expect("open").set_modified(long_ago()).expect("time");
    let key_dir = root.join("v1").join("entries").join(&key(3).hex);
    std::os::unix::fs::symlink(outside_dir.path(), &key_dir).expect("symlink");
    let s = store.clone();
    let read = bounded("entries()", move || s.entries(&key(3).hex));
    assert!(read.is_err(), "{read:?}");
    assert_eq!(store.keys().expect("keys"), vec![key(1)], "a linked key directory is not a key held");
    assert!(store.list().expect("list").iter().all(|b| b.key != key(3).hex));
    assert_eq!(fs::metadata(&outside_entry).expect("meta").modified().expect("mtime"), long_ago());
    // A write replaces the link with a directory of its own.
    store.put_entry(&key(3), "e", b"entry e").expect("write");
    assert!(fs::symlink_metadata(&key_dir).expect("meta").is_dir());
    assert_eq!(fs::read_dir(outside_dir.path()).expect("dir").count(), 2, "nothing written outside");
    assert_eq!(fs::metadata(&outside_entry).expect("meta").modified().expect("mtime"), long_ago());
}

#[test]
fn a_link_to_dev_zero_is_refused_not_read() {
    // No size limit to speak of: the bound is that a link is not followed, and a read
    // takes at most the size of the regular file opened.
    let (dir, store, hash) = filled(u64::MAX);
    let root = dir.path();
    let zero = Path::new("/dev/zero");
    make_link(zero, &entry_path(root, &key(1), "e"));
    make_link(zero, &artifact_path(root, &hash));
    make_link(zero, &key_json(root, &key(1)));
    check_refused(&store, &hash);
    // put_artifact reads what is there to compare: not through the link either.
    let (s, h) = (store.clone(), hash.clone());
    bounded("put_artifact()", move || s.put_artifact(&h, b"an artifact")).expect("write");
    assert!(is_regular(&artifact_path(root, &hash)));
}

#[test]
fn a_blob_over_the_size_cap_is_refused_and_a_regular_one_is_retimed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = DiskStore::new(dir.path(), 1000);
    store.put_entry(&key(1), "e", b"entry e").expect("write");
    let hash = "b".repeat(64);
    store.put_artifact(&hash, b"an artifact").expect("write");
    // Larger than the store's limit (written behind its back): refused, not read.
    fs::write(entry_path(dir.path(), &key(1), "big"), vec![7u8; 2000]).expect("write");
    let entries = store.entries(&key(1).hex).expect("entries");
    assert_eq!(entries, vec![("big".to_string(), Vec::new()), ("e".to_string(), b"entry e".to_vec())]);
    // A regular blob is marked used when read (what eviction orders by).
    for p in [entry_path(dir.path(), &key(1), "e"), artifact_path(dir.path(), &hash)] {
        fs::File::options().write(true).open(&p).expect("open").set_modified(long_ago()).expect("time");
    }
    store.entries(&key(1).hex).expect("entries");
    assert_eq!(store.artifact(&hash).expect("artifact"), Some(b"an artifact".to_vec()));
    for p in [entry_path(dir.path(), &key(1), "e"), artifact_path(dir.path(), &hash)] {
        let age = fs::metadata(&p).expect("meta").modified().expect("mtime").elapsed().unwrap_or_default();
        assert!(age < Duration::from_secs(600), "{} was not retimed on read", p.display());
    }
}

/// A small result: inference, no arguments, one artifact of a few bytes.
fn result(artifact: &[u8]) -> AotResult<()> {
    let meta = ResultMeta {
        name: "f".into(),
        sig: CallSig { args: Vec::new(), grad_enabled: false },
        traced_args: Vec::new(),
        slot_of_arg: Vec::new(),
        input_metas: Vec::new(),
        guards: Vec::new(),
        rng: None,
        meta: Default::default(),
        convention: Default::default(),
        graph_inputs: 0,
        graph_output_metas: Vec::new(),
        detached: Vec::new(),
        straight_through: Vec::new(),
        backward_errors: Vec::new(),
        output_layout: Vec::new(),
        made_requires_grad: Vec::new(),
        version_bumps: Vec::new(),
        training: None,
        backend: "none".into(),
        backend_identity: "none".into(),
        traced_nodes: 0,
        stages: Vec::new(),
    };
    AotResult {
        meta,
        forward: Artifact::from_bytes(artifact.to_vec()),
        backward: None,
        graphs: GraphDumps::from_packed([None, None, None, None, None]),
    }
}

/// The one file in `dir` named `*.<ext>`.
fn only_file(dir: &Path, ext: &str) -> PathBuf {
    let found: Vec<PathBuf> = fs::read_dir(dir)
        .expect("dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .collect();
    assert_eq!(found.len(), 1, "{found:?}");
    found.into_iter().next().expect("one")
}

#[test]
fn through_the_cache_a_special_entry_is_a_rejected_miss_and_the_next_insert_replaces_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cache = Arc::new(Cache::new(Box::new(DiskStore::new(dir.path(), 1 << 20))));
    let mut b = KeyBuilder::new();
    b.add("test", b"special entries");
    let k = b.finish();
    let r = result(b"artifact bytes");
    cache.insert(&k, &r).expect("insert");
    let entry = only_file(&dir.path().join("v1").join("entries").join(&k.hex), "entry");
    let outside = Outside::new(b"precious");
    for (what, link_to) in specials(&outside.path) {
        make_special(&entry, link_to);
        let (c, key) = (cache.clone(), k.clone());
        let found = bounded("Cache::lookup", move || c.lookup(&key));
        assert!(found.candidates.is_empty(), "{what}: {found:?}");
        assert_eq!(found.rejected.len(), 1, "{what}: {found:?}");
        assert!(found.error.is_none(), "{what}: {found:?}");
        assert!(fs::symlink_metadata(&entry).is_err(), "{what}: the rejected entry is removed");
        outside.assert_untouched();
        cache.insert(&k, &r).expect("insert");
        assert!(is_regular(&entry), "{what}: the next insert writes a regular file");
        let found = cache.lookup(&k);
        assert_eq!((found.candidates.len(), found.rejected.len()), (1, 0), "{what}: {found:?}");
    }
}

#[test]
fn through_the_cache_a_special_artifact_is_a_failed_load_and_the_next_insert_replaces_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cache = Arc::new(Cache::new(Box::new(DiskStore::new(dir.path(), 1 << 20))).flavour(Flavour::Referencing));
    let k = KeyBuilder::new().finish();
    let r = result(b"artifact bytes");
    cache.insert(&k, &r).expect("insert");
    let artifact = only_file(&dir.path().join("v1").join("artifacts"), "artifact");
    let sealed = fs::read(&artifact).expect("read");
    // The target holds the very blob (a store that followed the link would load it).
    let outside = Outside::new(&sealed);
    for (what, link_to) in specials(&outside.path) {
        make_special(&artifact, link_to);
        let (c, key) = (cache.clone(), k.clone());
        let loaded = bounded("Cache::instantiate", move || {
            let found = c.lookup(&key);
            assert_eq!(found.candidates.len(), 1, "{found:?}");
            let stored = found.candidates.into_iter().next().expect("one").result;
            c.instantiate::<()>(stored).map(|_| ())
        });
        assert!(loaded.is_err(), "{what}: the artifact is unusable");
        assert!(fs::symlink_metadata(&artifact).is_err(), "{what}: the rejected artifact is removed");
        outside.assert_untouched();
        cache.insert(&k, &r).expect("insert");
        assert!(is_regular(&artifact), "{what}: the next insert writes a regular file");
        assert_eq!(fs::read(&artifact).expect("read"), sealed);
        let found = cache.lookup(&k);
        let stored = found.candidates.into_iter().next().expect("a candidate").result;
        assert!(cache.instantiate::<()>(stored).is_ok(), "{what}");
    }
}
