//! Stage 1a of a call that no entry accepts: the runtime's side of the result cache.
//! It computes a traced call's key, loads a stored result whose guards hold (through
//! the same [`Entry::instantiate`] as a fresh one), stores fresh results and counts
//! what happened. Precompiled files are read and written by [`crate::function`].

use crate::config::AotConfig;
use crate::entry::{result_bindings, Entry, EntrySource};
use crate::error::Result;
use crate::signature::Arg;
use aotgrad_cache::CallSig;
use aotgrad_cache::{AotResult, Cache, CacheKey, KeyBuilder, OutputSlot};
use aotgrad_cpu::CpuTensor;
use aotgrad_trace::Traced;
use std::sync::{Arc, Mutex};

/// What the cache did for one compiled function.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CacheStats {
    /// Specializations loaded from the cache (no compilation).
    pub hits: u64,
    /// Lookups that found no entry under the key (compiled, then stored).
    pub misses: u64,
    /// Lookups that found entries under the key, none of whose guards held.
    pub guard_misses: u64,
    /// Specializations compiled without consulting the cache, with why.
    pub bypasses: u64,
    /// Stored entries rejected as corrupt, truncated, foreign, wrongly signed,
    /// inconsistent or from another version, or whose artifacts or backend load
    /// failed. A local one was removed, or overwritten by the recompile's entry; a
    /// remote one is left to its TTL and to the entry this process writes.
    pub rejected: u64,
    /// Stored entries written with another cache key (or, for a signed cache,
    /// without one): not checked or used here, and left in place for the processes
    /// that hold their key (this process stores its own beside them).
    pub skipped: u64,
    /// Failed cache writes (the compiled result is used all the same).
    pub write_errors: u64,
    /// Why each miss, guard miss, bypass, rejection and write error happened, in order.
    pub reasons: Vec<String>,
    /// Seconds spent computing keys (canonical graph, hashing; after tracing).
    pub key_seconds: f64,
    /// Seconds spent in lookups: reading, verifying, decoding and instantiating entries
    /// (hits and misses alike).
    pub load_seconds: f64,
    /// Seconds spent writing entries.
    pub store_seconds: f64,
}

pub(crate) struct CacheState {
    cache: Option<Arc<Cache>>,
    stats: Mutex<CacheStats>,
}

impl CacheState {
    pub(crate) fn new(cache: Option<Arc<Cache>>) -> CacheState {
        CacheState { cache, stats: Mutex::new(CacheStats::default()) }
    }

    fn note(&self, f: impl FnOnce(&mut CacheStats) -> String) {
        let mut s = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        let why = f(&mut s);
        s.reasons.push(why);
    }

    /// The key of a traced call, or `None` when there is no cache or it is bypassed.
    pub(crate) fn key_for(
        &self,
        config: &AotConfig,
        sig: &CallSig,
        traced: &Traced,
        layout: &[OutputSlot],
    ) -> Option<CacheKey> {
        self.cache.as_ref()?;
        let Some(identity) = config.backend.cache_identity() else {
            let why = format!(
                "bypass: backend `{}` declares no cache identity (its artifacts cannot be cached)",
                config.backend.name()
            );
            tracing::info!(target: "aotgrad::cache", "`{}`: {why}", config.name);
            self.note(|s| {
                s.bypasses += 1;
                why
            });
            return None;
        };
        let t = std::time::Instant::now();
        let key = cache_key(config, sig, traced, layout, &identity);
        self.stats.lock().unwrap_or_else(|e| e.into_inner()).key_seconds += t.elapsed().as_secs_f64();
        Some(key)
    }

    /// Load the first stored result under `key` whose guards hold for `args`.
    pub(crate) fn load(&self, config: &AotConfig, key: &CacheKey, args: &[Arg]) -> Result<Option<Entry>> {
        let started = std::time::Instant::now();
        let found = self.load_inner(config, key, args, started);
        self.stats.lock().unwrap_or_else(|e| e.into_inner()).load_seconds += started.elapsed().as_secs_f64();
        found
    }

    fn load_inner(
        &self,
        config: &AotConfig,
        key: &CacheKey,
        args: &[Arg],
        started: std::time::Instant,
    ) -> Result<Option<Entry>> {
        let Some(cache) = &self.cache else { return Ok(None) };
        // Entries under the key whose guards (or input metadata) do not accept the call.
        let mut any = false;
        // Entries under the key that were found but could not be used.
        let mut unusable = 0usize;
        // Entries under the key written with another cache key (or none).
        let mut others = 0usize;
        let mut errors = Vec::new();
        for tier in 0..cache.tiers() {
            let found = cache.lookup_tier(tier, key);
            unusable += found.rejected.len();
            others += found.skipped.len();
            for why in &found.rejected {
                self.note(|s| {
                    s.rejected += 1;
                    format!("rejected {why}")
                });
            }
            for why in &found.skipped {
                self.note(|s| {
                    s.skipped += 1;
                    format!("skipped {why}")
                });
            }
            if let Some(e) = found.error {
                errors.push(e);
            }
            for c in found.candidates {
                if result_bindings(&c.result.meta, args).is_none() {
                    any = true;
                    continue;
                }
                let guards = c.result.meta.guard_expr();
                let aotgrad_cache::Candidate { id, result, blob } = c;
                let result = match cache.instantiate::<CpuTensor>(result) {
                    Ok(r) => r,
                    Err(why) => {
                        unusable += 1;
                        self.reject(&config.name, key, &why);
                        continue;
                    }
                };
                match Entry::instantiate(Arc::new(result), config.backend.as_ref(), EntrySource::Cache) {
                    Ok(entry) => {
                        if tier > 0 {
                            cache.promote(tier, key, &id, &blob);
                        }
                        tracing::info!(
                            target: "aotgrad::cache",
                            "cache hit for `{}` (key {}, tier {tier}, guards {guards}) in {:.2} ms",
                            config.name,
                            &key.hex[..16],
                            started.elapsed().as_secs_f64() * 1e3
                        );
                        self.note(|s| {
                            s.hits += 1;
                            format!("hit {} (tier {tier})", &key.hex[..16])
                        });
                        return Ok(Some(entry));
                    }
                    Err(e) => {
                        unusable += 1;
                        self.reject(&config.name, key, &e.to_string());
                    }
                }
            }
        }
        let why = if any {
            format!("guard miss: key {} has entries, but none of their guards hold for this call", &key.hex[..16])
        } else if unusable > 0 {
            format!(
                "miss: key {} is stored, but its {unusable} entr{} could not be used (rejected: see above)",
                &key.hex[..16],
                if unusable == 1 { "y" } else { "ies" }
            )
        } else if others > 0 {
            format!(
                "miss: key {} holds only entries written with another cache key (or without one); this process \
                 stores its own beside them",
                &key.hex[..16]
            )
        } else {
            format!("miss: key {} not stored; {}", &key.hex[..16], cache.explain_miss(key))
        };
        let why = if errors.is_empty() { why } else { format!("{why} (unreachable: {})", errors.join("; ")) };
        tracing::info!(target: "aotgrad::cache", "`{}`: {why}", config.name);
        self.note(|s| {
            if any {
                s.guard_misses += 1;
            } else {
                s.misses += 1;
            }
            why
        });
        Ok(None)
    }

    fn reject(&self, name: &str, key: &CacheKey, why: &str) {
        tracing::warn!(target: "aotgrad::cache", "`{name}`: cache entry under {} unusable: {why}", &key.hex[..16]);
        self.note(|s| {
            s.rejected += 1;
            format!("rejected {}: {why}", &key.hex[..16])
        });
    }

    /// Store a fresh result (a failure is logged and counted, never an error).
    pub(crate) fn store(&self, key: &CacheKey, result: &AotResult<CpuTensor>) {
        let Some(cache) = &self.cache else { return };
        let t = std::time::Instant::now();
        let written = cache.insert(key, result);
        self.stats.lock().unwrap_or_else(|e| e.into_inner()).store_seconds += t.elapsed().as_secs_f64();
        if let Err(e) = written {
            tracing::warn!(target: "aotgrad::cache", "cache write failed: {e}");
            self.note(|s| {
                s.write_errors += 1;
                format!("write error: {e}")
            });
        }
    }

    pub(crate) fn stats(&self) -> CacheStats {
        self.stats.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// The cache key of a traced call: the traced graph in canonical form (input names
/// and source locations left out), the call signature (dtypes, ranks, grad flags,
/// leafness, aliasing pattern, plain values; the metadata is in the graph's inputs),
/// the autograd facts of the trace, each config field that changes compilation, the
/// backend's identity, and the versions. Guards are not part of it: entries under one
/// key are told apart by their guards, checked against each call.
pub(crate) fn cache_key(
    config: &AotConfig,
    sig: &CallSig,
    traced: &Traced,
    layout: &[OutputSlot],
    backend_identity: &str,
) -> CacheKey {
    let mut b = KeyBuilder::new();
    b.add_with("graph", |h| hash_canonical_graph(&traced.graph, h));
    b.add("call signature", format!("{sig:?}").as_bytes());
    b.add(
        "trace facts",
        format!(
            "{:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?}",
            traced.input_requires_grad,
            traced.input_made_requires_grad,
            traced.input_tracked_from,
            traced.no_grad_views,
            traced.hidden_meta,
            traced.output_requires_grad,
            traced.output_no_grad_view,
            traced.output_creation,
            traced.detach_values,
            traced.value_requires_grad,
            traced.rng
        )
        .as_bytes(),
    );
    b.add("output layout", format!("{layout:?}").as_bytes());
    b.add("decompositions", format!("{:?}", config.decomps).as_bytes());
    b.add("dynamic", format!("{:?} duck {}", config.dynamic, config.duck_shape).as_bytes());
    b.add("keep_inference_input_mutations", format!("{}", config.keep_inference_input_mutations).as_bytes());
    b.add("simplify", format!("{}", config.simplify).as_bytes());
    b.add("partitioner", format!("{:?}", config.partitioner).as_bytes());
    b.add("backend", backend_identity.as_bytes());
    b.finish()
}

/// Stream the graph's canonical form into `h`: every input's id, metadata and storage
/// (not its name), every node's op, arguments, metadata and storage (not its source
/// location), the outputs.
fn hash_canonical_graph(g: &aotgrad_ir::Graph, h: &mut blake3::Hasher) {
    use aotgrad_ir::codec::encode_into;
    // Encoded into a buffer (infallible: plain data into memory) that the hasher takes
    // in large chunks.
    let mut buf: Vec<u8> = Vec::with_capacity(1 << 17);
    let _ = encode_into("graph", &g.inputs.len(), &mut buf);
    for i in &g.inputs {
        let _ = encode_into("graph input", &(i.id, &i.meta, i.storage), &mut buf);
    }
    let _ = encode_into("graph", &g.nodes.len(), &mut buf);
    for n in &g.nodes {
        let _ = encode_into("graph node", &(n.out, &n.op, &n.args, &n.meta, n.storage), &mut buf);
        if buf.len() >= 1 << 16 {
            h.update(&buf);
            buf.clear();
        }
    }
    let _ = encode_into("graph outputs", &g.outputs, &mut buf);
    h.update(&buf);
}

/// A short description of a call's arguments, for errors.
pub(crate) fn describe_call(args: &[Arg]) -> String {
    let parts: Vec<String> = args
        .iter()
        .map(|a| match a {
            Arg::Tensor(t) => format!("{}{}", t.meta(), if t.is_requires_grad() { " requires_grad" } else { "" }),
            Arg::Int(v) => v.to_string(),
            Arg::Float(v) => v.to_string(),
            Arg::Bool(v) => v.to_string(),
            Arg::None => "None".into(),
        })
        .collect();
    parts.join(", ")
}
