//! [`Cache`]: a [`Store`] plus the rules for what goes in and what comes out: entries
//! are sealed ([`crate::envelope`]) and encoded with [`aotgrad_ir::codec`]; anything
//! that fails a check on the way out is logged, removed and treated as a miss.

use crate::envelope::{self, Kind};
use crate::key::CacheKey;
use crate::result::{AotResult, GraphDumps, GraphKind, StoredArtifact, StoredResult};
use crate::store::{BlobInfo, DiskStore, Store, StoreError};
use aotgrad_ir::codec;
use serde::{Deserialize, Serialize};

/// The payload of one cache entry: its key (checked on load: an entry copied under
/// another key is foreign) and the result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StoredEntry {
    /// The key it was written under.
    pub key: CacheKey,
    /// The result.
    pub result: StoredResult,
}

/// How entries hold their artifacts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavour {
    /// Inside the entry: one blob per entry.
    Bundled,
    /// In the content-addressed artifact store: entries with equal artifacts share them.
    Referencing,
}

/// An entry found under a key (its guards are the caller's to check).
#[derive(Clone, Debug)]
pub struct Candidate {
    /// Its id within the key.
    pub id: String,
    /// The result.
    pub result: StoredResult,
    /// The sealed blob it was decoded from, when it came from a remote tier (what
    /// [`Cache::promote`] copies); empty for a local one.
    pub blob: Vec<u8>,
}

/// What a lookup found.
#[derive(Debug, Default)]
pub struct Lookup {
    /// Valid entries under the key.
    pub candidates: Vec<Candidate>,
    /// Entries rejected (corrupt, truncated, wrong version, foreign, bad MAC,
    /// inconsistent contents), with why; a lookup removes rejected local entries.
    pub rejected: Vec<String>,
    /// Entries written by a process with another cache key, or (for a signed cache)
    /// without one: their ids say whose they are ([`Cache::lookup`]). They are not
    /// checked, used, removed or replaced here, but left for the processes that can
    /// check them.
    pub skipped: Vec<String>,
    /// The store could not be read (a logged miss).
    pub error: Option<String>,
}

/// The default size limit of a disk cache: 4 GiB.
pub const DEFAULT_MAX_BYTES: u64 = 4 << 30;

/// A compiled-result cache over a local store and optional remote tiers: lookups go
/// local first, then remote (a remote hit is copied into the local store); fresh
/// results are written to every tier.
pub struct Cache {
    store: Box<dyn Store>,
    remotes: Vec<Box<dyn Store>>,
    flavour: Flavour,
    mac_key: Option<[u8; 32]>,
    /// The public id of the key (see [`key_id`]), empty when unsigned.
    key_id: String,
    /// Whether the "remote tiers are off: unsigned" warning was logged.
    warned_unsigned: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache")
            .field("store", &self.store.describe())
            .field("remotes", &self.remotes.iter().map(|r| r.describe()).collect::<Vec<_>>())
            .field("flavour", &self.flavour)
            .field("signed", &self.mac_key.is_some())
            .finish()
    }
}

/// Derive the 32-byte MAC key from a secret of any length.
pub fn mac_key_from_secret(secret: &[u8]) -> [u8; 32] {
    blake3::derive_key("aotgrad cache entry MAC v1", secret)
}

impl Cache {
    /// A cache over `store`, bundled entries, unsigned.
    pub fn new(store: Box<dyn Store>) -> Cache {
        Cache {
            store,
            remotes: Vec::new(),
            flavour: Flavour::Bundled,
            mac_key: None,
            key_id: String::new(),
            warned_unsigned: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Add a remote tier under the local store (a fleet-shared Redis, say). Remote
    /// entries are trusted only with a MAC, so remote tiers are used only by a signed
    /// cache ([`Cache::signed`]); an unsigned one neither reads nor writes them (and
    /// logs why once).
    pub fn with_remote(mut self, remote: Box<dyn Store>) -> Cache {
        self.remotes.push(remote);
        self
    }

    /// The tiers: 1 (local) plus the remotes.
    pub fn tiers(&self) -> usize {
        1 + self.remotes.len()
    }

    fn tier(&self, t: usize) -> Option<&dyn Store> {
        if t == 0 {
            return Some(self.store.as_ref());
        }
        let remote = self.remotes.get(t - 1)?;
        if self.mac_key.is_none() {
            if !self.warned_unsigned.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::warn!(
                    target: "aotgrad::cache",
                    "remote tier {} is off: this cache is not signed, and a shared tier's entries are trusted only \
                     with a MAC (set AOTGRAD_CACHE_KEY)",
                    remote.describe()
                );
            }
            return None;
        }
        Some(remote.as_ref())
    }

    /// A disk cache at `dir` with the default size limit.
    pub fn disk(dir: impl Into<std::path::PathBuf>) -> Cache {
        Cache::new(Box::new(DiskStore::new(dir, DEFAULT_MAX_BYTES)))
    }

    /// The cache the environment asks for: a disk cache when `AOTGRAD_CACHE_DIR` or
    /// `AOTGRAD_REDIS_URL` is set (size limit `AOTGRAD_CACHE_MAX_BYTES`, entries
    /// signed when `AOTGRAD_CACHE_KEY` or `AOTGRAD_CACHE_KEY_FILE` gives a secret),
    /// with a Redis tier under it when `AOTGRAD_REDIS_URL` is set and the cache is
    /// signed (`AOTGRAD_REDIS_TTL` seconds, default a week; `AOTGRAD_REDIS_TIMEOUT_MS`,
    /// default 250); `None` when neither is set or `AOTGRAD_CACHE=0`. A bad size limit
    /// or an unreadable key file is an error (the caller runs without a cache rather
    /// than with one it was not asked for); a bad Redis setting only turns the Redis
    /// tier off, with a warning.
    pub fn from_env() -> Result<Option<Cache>, String> {
        if std::env::var("AOTGRAD_CACHE").is_ok_and(|v| v == "0") {
            return Ok(None);
        }
        let set = |v: &str| std::env::var_os(v).is_some_and(|d| !d.is_empty());
        if !set("AOTGRAD_CACHE_DIR") && !set("AOTGRAD_REDIS_URL") {
            return Ok(None);
        }
        Ok(Some(Cache::user_default()?.with_env_remote()))
    }

    /// A disk cache in [`DiskStore::default_dir`], configured from the environment
    /// as [`Cache::disk_from_env`] describes.
    pub fn user_default() -> Result<Cache, String> {
        Cache::disk_from_env(DiskStore::default_dir())
    }

    /// A disk cache at `dir` with the environment's size limit
    /// (`AOTGRAD_CACHE_MAX_BYTES`) and key (`AOTGRAD_CACHE_KEY` or
    /// `AOTGRAD_CACHE_KEY_FILE`): what a tool that reads or writes a given cache
    /// directory opens, so that it checks and signs entries as the programs sharing
    /// the directory do.
    pub fn disk_from_env(dir: impl Into<std::path::PathBuf>) -> Result<Cache, String> {
        let max = match std::env::var("AOTGRAD_CACHE_MAX_BYTES") {
            Ok(v) => v.trim().parse::<u64>().map_err(|e| format!("AOTGRAD_CACHE_MAX_BYTES={v:?}: {e}"))?,
            Err(_) => DEFAULT_MAX_BYTES,
        };
        let mut cache = Cache::new(Box::new(DiskStore::new(dir, max)));
        if let Some(secret) = secret_from_env()? {
            cache = cache.signed(&secret);
        }
        Ok(cache)
    }

    /// This cache with the Redis tier `AOTGRAD_REDIS_URL` asks for (see
    /// [`Cache::from_env`]); unchanged, with a warning, when the cache is unsigned or a
    /// Redis setting is bad.
    pub fn with_env_remote(self) -> Cache {
        let url = match std::env::var("AOTGRAD_REDIS_URL") {
            Ok(url) if !url.is_empty() => url,
            _ => return self,
        };
        if self.mac_key.is_none() {
            tracing::warn!(
                target: "aotgrad::cache",
                "AOTGRAD_REDIS_URL is set but no AOTGRAD_CACHE_KEY or AOTGRAD_CACHE_KEY_FILE: a shared cache must \
                 be signed, so the Redis tier is off"
            );
            return self;
        }
        let num = |v: &str, d: u64| -> Result<u64, String> {
            match std::env::var(v) {
                Ok(s) => s.trim().parse::<u64>().map_err(|e| format!("{v}={s:?}: {e}")),
                Err(_) => Ok(d),
            }
        };
        let redis = num("AOTGRAD_REDIS_TIMEOUT_MS", 250).and_then(|ms| {
            let ttl = num("AOTGRAD_REDIS_TTL", 7 * 24 * 3600)?;
            crate::RedisStore::new(&url, std::time::Duration::from_millis(ms), ttl).map_err(|e| e.to_string())
        });
        match redis {
            Ok(r) => self.with_remote(Box::new(r)),
            Err(e) => {
                tracing::warn!(target: "aotgrad::cache", "the Redis tier is off (the disk cache stays on): {e}");
                self
            }
        }
    }

    /// Store artifacts by reference in the artifact store (or bundled).
    pub fn flavour(mut self, flavour: Flavour) -> Cache {
        self.flavour = flavour;
        self
    }

    /// Sign entries with a MAC keyed by `secret` and refuse entries without it.
    pub fn signed(mut self, secret: &[u8]) -> Cache {
        let key = mac_key_from_secret(secret);
        self.key_id = key_id(&key);
        self.mac_key = Some(key);
        self
    }

    /// The suffix this cache's ids carry: `-<key id>` when signed, nothing when not.
    fn suffix(&self) -> String {
        if self.key_id.is_empty() {
            String::new()
        } else {
            format!("-{}", self.key_id)
        }
    }

    /// Whether stored blob `name` (an entry id or an artifact name) was written by a
    /// cache with this one's key (or, unsigned, by an unsigned one): only those are
    /// checked, used, removed or replaced here. The others are left for the processes
    /// that hold their key.
    fn owns(&self, name: &str) -> bool {
        match name.split_once('-') {
            None => self.key_id.is_empty(),
            Some((_, id)) => id == self.key_id,
        }
    }

    /// The store name of the artifact with content hash `hash`.
    fn artifact_name(&self, hash: &str) -> String {
        format!("{hash}{}", self.suffix())
    }

    /// The store's description.
    pub fn describe(&self) -> String {
        let remotes: String = self.remotes.iter().map(|r| format!(" + {}", r.describe())).collect();
        format!(
            "{}{remotes} ({}, {})",
            self.store.describe(),
            match self.flavour {
                Flavour::Bundled => "bundled",
                Flavour::Referencing => "referencing",
            },
            if self.mac_key.is_some() { "signed" } else { "checksummed" }
        )
    }

    fn open_blob<'a>(&self, bytes: &'a [u8], kind: Kind) -> Result<&'a [u8], envelope::EnvelopeError> {
        envelope::open(bytes, kind, self.mac_key.as_ref(), self.mac_key.is_some())
    }

    /// The valid entries under `key` in the local store; invalid ones are logged,
    /// removed and listed. Entry ids say whose an entry is: a hash of its guards,
    /// followed for a signed cache by `-` and the key's public id (12 hex digits of a
    /// keyed hash, which reveal nothing of the key). A cache checks, uses, removes and
    /// replaces only the entries written with its own key (or, unsigned, those written
    /// without one); it skips the others and stores its own beside them, so processes
    /// with different keys (or none) share a directory without destroying each other's
    /// entries, and a flipped "signed" bit in an unsigned cache's entry is an entry
    /// that fails its check, removed and replaced.
    pub fn lookup(&self, key: &CacheKey) -> Lookup {
        self.lookup_tier(0, key)
    }

    /// [`Cache::lookup`] that removes nothing (for tools that only look: a tool run
    /// with another key, or none, must not delete the entries of the programs that
    /// share the directory).
    pub fn peek(&self, key: &CacheKey) -> Lookup {
        self.find(0, key, false)
    }

    /// [`Cache::lookup`] in tier `tier` (0: local, then the remotes in order).
    pub fn lookup_tier(&self, tier: usize, key: &CacheKey) -> Lookup {
        self.find(tier, key, true)
    }

    /// The entries under `key` in tier `tier`; with `remove`, rejected local ones
    /// are removed.
    fn find(&self, tier: usize, key: &CacheKey, remove: bool) -> Lookup {
        let mut out = Lookup::default();
        let Some(store) = self.tier(tier) else { return out };
        let (blobs, others) = match store.entries_where(&key.hex, &|id| self.owns(id)) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(target: "aotgrad::cache", "cache read failed (a miss): {e}");
                out.error = Some(e.to_string());
                return out;
            }
        };
        for id in others {
            // Another key's entry (or an unsigned one, for a signed cache): not
            // checkable here, and not this cache's to judge; not even read.
            let why = match id.split_once('-') {
                Some(_) => "written with another cache key (left in place)",
                None => "written without a cache key, which this cache requires (left in place)",
            };
            tracing::debug!(target: "aotgrad::cache", "skipped cache entry {}/{id} in {}: {why}", key.hex, store.describe());
            out.skipped.push(format!("{}/{id} ({}): {why}", key.hex, store.describe()));
        }
        for (id, bytes) in blobs {
            // The envelope (its checksum or MAC covers the whole blob), then the contents.
            match self.decode_entry(&bytes) {
                Ok(entry) if entry.key.hex == key.hex => {
                    let blob = if tier > 0 { bytes } else { Vec::new() };
                    out.candidates.push(Candidate { id, result: entry.result, blob });
                }
                Ok(entry) => self.reject(
                    remove && tier == 0,
                    store,
                    &mut out,
                    key,
                    &id,
                    format!("foreign entry (written for key {})", entry.key.hex),
                ),
                Err(why) => self.reject(remove && tier == 0, store, &mut out, key, &id, why),
            }
        }
        out
    }

    /// Log a rejected entry; a local one is removed (a remote one is left to its TTL
    /// and to the replacement this process writes: another holder of a different key
    /// may have written it).
    fn reject(&self, remove: bool, store: &dyn Store, out: &mut Lookup, key: &CacheKey, id: &str, why: String) {
        tracing::warn!(target: "aotgrad::cache", "rejected cache entry {}/{id} in {}: {why}", key.hex, store.describe());
        if remove {
            if let Err(e) = store.remove_entry(&key.hex, id) {
                tracing::warn!(target: "aotgrad::cache", "{e}");
            }
        }
        out.rejected.push(format!("{}/{id} ({}): {why}", key.hex, store.describe()));
    }

    /// Copy entry `id` (its sealed `blob`) found in remote tier `tier` into the local
    /// store (and the tiers above `tier`), so the next lookup is local. The blob is
    /// copied as it is: it passed this cache's MAC (remote tiers are read only by a
    /// signed cache), so it is what this cache would have sealed.
    pub fn promote(&self, tier: usize, key: &CacheKey, id: &str, blob: &[u8]) {
        for t in 0..tier {
            if let Some(s) = self.tier(t) {
                if let Err(e) = s.put_entry(key, id, blob) {
                    tracing::warn!(target: "aotgrad::cache", "could not copy a remote entry locally: {e}");
                }
            }
        }
    }

    /// Check and decode one entry blob (its envelope, then its contents).
    pub fn decode_entry(&self, bytes: &[u8]) -> Result<StoredEntry, String> {
        let payload = self.open_blob(bytes, Kind::Entry).map_err(|e| e.to_string())?;
        let entry = codec::decode::<StoredEntry>("cache entry", payload).map_err(|e| e.to_string())?;
        entry.result.validate().map_err(|e| format!("inconsistent contents: {e}"))?;
        Ok(entry)
    }

    /// A referenced artifact's bytes, checked against its hash: the first tier holding
    /// a valid copy wins. A local copy that fails its check is logged and removed (the
    /// recompile that follows a failed load writes it again); a remote copy is copied
    /// into the tiers above it only once it has passed. Artifacts are stored per key
    /// like entries (`<hash>-<key id>` when signed), so this only ever reads, removes
    /// or replaces copies this cache's key wrote.
    pub fn fetch_artifact(&self, hash: &str, len: u64) -> Result<Vec<u8>, String> {
        let mut problems = Vec::new();
        let name = self.artifact_name(hash);
        for t in 0..self.tiers() {
            let Some(store) = self.tier(t) else { continue };
            let blob = match store.artifact(&name) {
                Ok(Some(b)) => b,
                Ok(None) => continue,
                Err(e) => {
                    problems.push(e.to_string());
                    continue;
                }
            };
            let checked = match self.open_blob(&blob, Kind::Artifact) {
                Err(e) => Err(e.to_string()),
                Ok(p) if p.len() as u64 != len || blake3::hash(p).to_hex().as_str() != hash => {
                    Err("does not match its hash".to_string())
                }
                Ok(p) => Ok(p),
            };
            match checked {
                Ok(payload) => {
                    for above in 0..t {
                        if let Some(Err(e)) = self.tier(above).map(|s| s.put_artifact(&name, &blob)) {
                            tracing::warn!(target: "aotgrad::cache", "could not copy a remote artifact: {e}");
                        }
                    }
                    return Ok(payload.to_vec());
                }
                Err(why) => {
                    tracing::warn!(target: "aotgrad::cache", "rejected artifact {name} in {}: {why}", store.describe());
                    if t == 0 {
                        if let Err(e) = store.remove_artifact(&name) {
                            tracing::warn!(target: "aotgrad::cache", "{e}");
                        }
                    }
                    problems.push(format!("{}: {why}", store.describe()));
                }
            }
        }
        Err(if problems.is_empty() {
            format!("artifact {hash} is not in the store (evicted?)")
        } else {
            format!("artifact {hash} is missing or unusable: {}", problems.join("; "))
        })
    }

    /// Rebuild a loaded candidate's result (resolving referenced artifacts).
    pub fn instantiate<T>(&self, stored: StoredResult) -> Result<AotResult<T>, String> {
        AotResult::from_stored(stored, |hash, len| self.fetch_artifact(hash, len))
    }

    /// Write `result` under `key` in every tier, replacing an entry with the same
    /// guards. Every tier is tried; the first failure is returned.
    pub fn insert<T>(&self, key: &CacheKey, result: &AotResult<T>) -> Result<(), StoreError> {
        let mut failed: Option<StoreError> = None;
        let stored = result.to_stored(|bytes| match self.flavour {
            Flavour::Bundled => None,
            Flavour::Referencing => {
                let hash = blake3::hash(bytes).to_hex().to_string();
                let blob = envelope::seal(Kind::Artifact, bytes, self.mac_key.as_ref());
                let name = self.artifact_name(&hash);
                for t in 0..self.tiers() {
                    if let Some(Err(e)) = self.tier(t).map(|s| s.put_artifact(&name, &blob)) {
                        failed.get_or_insert(e);
                    }
                }
                Some(StoredArtifact::Referenced { hash, len: bytes.len() as u64 })
            }
        });
        // The id says whose entry it is: a cache with another key (or none) stores
        // beside it and never replaces it.
        let id = format!("{}{}", entry_id(&stored), self.suffix());
        let entry = StoredEntry { key: key.clone(), result: stored };
        let payload = codec::encode("cache entry", &entry)
            .map_err(|e| StoreError { store: self.store.describe(), msg: e.to_string() })?;
        let blob = envelope::seal(Kind::Entry, &payload, self.mac_key.as_ref());
        for t in 0..self.tiers() {
            if let Some(Err(e)) = self.tier(t).map(|s| s.put_entry(key, &id, &blob)) {
                failed.get_or_insert(e);
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// Why `key` missed: the nearest stored key and the ingredients that differ.
    pub fn explain_miss(&self, key: &CacheKey) -> String {
        let keys = match self.store.keys() {
            Ok(k) => k,
            Err(e) => return format!("the store cannot be listed: {e}"),
        };
        let nearest =
            keys.iter().filter(|k| k.hex != key.hex).map(|k| (key.differing(k), k)).min_by_key(|(d, _)| d.len());
        match nearest {
            None => "no other key in the local cache".to_string(),
            Some((d, k)) => format!("nearest entry {} differs in: {}", short(&k.hex), d.join(", ")),
        }
    }

    /// Every blob in the store.
    pub fn list(&self) -> Result<Vec<BlobInfo>, StoreError> {
        self.store.list()
    }

    /// The entries under `key` (or a unique prefix of it) as readable JSON (artifact
    /// bytes summarized).
    pub fn inspect(&self, key_prefix: &str) -> Result<serde_json::Value, String> {
        let keys = self.store.keys().map_err(|e| e.to_string())?;
        let matching: Vec<&CacheKey> = keys.iter().filter(|k| k.hex.starts_with(key_prefix)).collect();
        let key = match matching.as_slice() {
            [k] => *k,
            [] => return Err(format!("no cache key starts with {key_prefix:?}")),
            many => return Err(format!("{} keys start with {key_prefix:?}; give more digits", many.len())),
        };
        let found = self.peek(key);
        let entries: Vec<serde_json::Value> = found
            .candidates
            .iter()
            .map(|c| {
                let mut v = serde_json::to_value(&c.result).unwrap_or_default();
                for side in ["forward", "backward"] {
                    if let Some(slot) = v.get_mut(side) {
                        if let Some(bytes) = slot.get("Bundled").and_then(|b| b.as_array()) {
                            *slot = serde_json::json!({ "Bundled": format!("<{} bytes>", bytes.len()) });
                        }
                    }
                }
                // The graphs are stored packed: show them printed, by name.
                if let Some(obj) = v.as_object_mut() {
                    obj.insert("graphs".into(), graphs_json(&c.result.graphs));
                }
                serde_json::json!({ "id": c.id, "guards": c.result.meta.guard_expr(), "result": v })
            })
            .collect();
        Ok(serde_json::json!({
            "key": key.hex,
            "ingredients": key.ingredients,
            "entries": entries,
            "rejected": found.rejected,
            "skipped": found.skipped,
        }))
    }

    /// Remove everything.
    pub fn clear(&self) -> Result<(), StoreError> {
        self.store.clear()
    }
}

/// A stored result's graphs as `{"traced": "<printed graph>", ...}` (a graph the
/// compile did not have is left out; one that does not decode says so).
fn graphs_json(graphs: &[Option<aotgrad_ir::codec::Bytes>; 5]) -> serde_json::Value {
    let dumps = GraphDumps::from_packed(graphs.clone().map(|g| g.map(|b| b.0)));
    let mut out = serde_json::Map::new();
    for (kind, g) in GraphKind::ALL.into_iter().zip(graphs) {
        if g.is_some() {
            let text = dumps.text(kind).unwrap_or_else(|| "<unreadable>".into());
            out.insert(kind.name().into(), serde_json::Value::String(text));
        }
    }
    serde_json::Value::Object(out)
}

/// An entry's id within its key: a hash of its guards (a recompile with the same
/// guards replaces it; different guards live side by side), to which a signed cache
/// adds `-<key id>`.
fn entry_id(stored: &StoredResult) -> String {
    let h = blake3::hash(stored.meta.guard_expr().as_bytes()).to_hex();
    h[..32].to_string()
}

/// The public id of a MAC key: 12 hex digits of a keyed hash of a constant. It tells
/// whose entry a file is without saying anything about the key (finding a key with a
/// given id is a preimage search on blake3).
fn key_id(key: &[u8; 32]) -> String {
    blake3::keyed_hash(key, b"aotgrad cache key id").to_hex()[..12].to_string()
}

fn short(hex: &str) -> &str {
    hex.get(..16).unwrap_or(hex)
}

fn secret_from_env() -> Result<Option<Vec<u8>>, String> {
    if let Some(k) = std::env::var_os("AOTGRAD_CACHE_KEY").filter(|k| !k.is_empty()) {
        return Ok(Some(k.into_encoded_bytes()));
    }
    if let Some(p) = std::env::var_os("AOTGRAD_CACHE_KEY_FILE").filter(|k| !k.is_empty()) {
        return read_key_file(std::path::Path::new(&p)).map(Some);
    }
    Ok(None)
}

/// The secret in a key file. A file written by `echo` ends in a newline that the same
/// secret in `AOTGRAD_CACHE_KEY` would not hold: line endings are not part of it.
fn read_key_file(p: &std::path::Path) -> Result<Vec<u8>, String> {
    let mut bytes = std::fs::read(p).map_err(|e| format!("AOTGRAD_CACHE_KEY_FILE {}: {e}", p.display()))?;
    while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        bytes.pop();
    }
    if bytes.is_empty() {
        return Err(format!("AOTGRAD_CACHE_KEY_FILE {} is empty", p.display()));
    }
    Ok(bytes)
}

/// The MAC key the environment gives (`AOTGRAD_CACHE_KEY` or `AOTGRAD_CACHE_KEY_FILE`),
/// the one a cache and precompiled files are signed with; `None` when neither is set.
pub fn mac_key_from_env() -> Result<Option<[u8; 32]>, String> {
    Ok(secret_from_env()?.map(|s| mac_key_from_secret(&s)))
}

/// Seal bundled results as a precompiled-function file (for deployment), signed with
/// `key` when given.
pub fn encode_precompiled<T>(results: &[&AotResult<T>], key: Option<&[u8; 32]>) -> Result<Vec<u8>, String> {
    let stored: Vec<StoredResult> = results.iter().map(|r| r.to_stored(|_| None)).collect();
    let payload = codec::encode("precompiled function", &stored).map_err(|e| e.to_string())?;
    Ok(envelope::seal(Kind::Precompiled, &payload, key))
}

/// Check and decode a precompiled-function file: its envelope (with `key`, the file
/// must be signed with it; without, a signed file is refused, since it cannot be
/// checked), then every result's contents ([`StoredResult::validate`]).
pub fn decode_precompiled(bytes: &[u8], key: Option<&[u8; 32]>) -> Result<Vec<StoredResult>, String> {
    let payload = envelope::open(bytes, Kind::Precompiled, key, key.is_some()).map_err(|e| e.to_string())?;
    let stored: Vec<StoredResult> = codec::decode("precompiled function", payload).map_err(|e| e.to_string())?;
    for (i, r) in stored.iter().enumerate() {
        r.validate().map_err(|e| format!("specialization {i} has inconsistent contents: {e}"))?;
    }
    Ok(stored)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_file_gives_the_secret_without_its_line_ending() {
        let dir = std::env::temp_dir().join(format!("aotgrad-keyfile-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = |name: &str, bytes: &[u8]| {
            let p = dir.join(name);
            std::fs::write(&p, bytes).unwrap();
            p
        };
        assert_eq!(read_key_file(&file("plain", b"s3cret")).unwrap(), b"s3cret");
        assert_eq!(read_key_file(&file("echo", b"s3cret\n")).unwrap(), b"s3cret");
        assert_eq!(read_key_file(&file("crlf", b"s3cret\r\n")).unwrap(), b"s3cret");
        // Inner bytes, spaces included, are the secret's own.
        assert_eq!(read_key_file(&file("inner", b" a\nb \n")).unwrap(), b" a\nb ");
        assert!(read_key_file(&file("empty", b"\n")).unwrap_err().contains("is empty"));
        assert!(read_key_file(&dir.join("missing")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
