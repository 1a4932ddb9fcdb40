//! `aotgrad-cache`: compiled results as plain data, and the cache that keeps them.
//!
//! - [`result`]: [`AotResult`], everything needed to rebuild a compiled callable
//!   without tracing or compiling (artifacts, runtime metadata, guards, graphs for
//!   logs, compile times), bundled or referencing an artifact store;
//! - [`sig`]: the call signature an entry was compiled for;
//! - [`key`]: cache keys made of named ingredients, so a miss can say what differed;
//! - [`envelope`]: the checked frame around every stored blob (magic, version,
//!   length, checksum or keyed MAC);
//! - [`store`]: the [`Store`] trait and the on-disk store (atomic writes, private
//!   directories, least-recently-used eviction);
//! - [`redis_store`]: the fleet-shared tier on Redis (short timeouts, TTL; entries
//!   must carry a MAC);
//! - [`cache`]: [`Cache`], which seals, checks, rejects and explains.
//!
//! The runtime (the `aotgrad` facade) builds every compiled entry from an
//! [`AotResult`], whether it was just compiled or loaded from here.

pub mod cache;
pub mod envelope;
pub mod key;
pub mod redis_store;
pub mod result;
pub mod sig;
pub mod store;

pub use cache::{
    decode_precompiled, encode_precompiled, mac_key_from_env, Cache, Candidate, Flavour, Lookup, StoredEntry,
};
pub use key::{CacheKey, KeyBuilder, FORMAT_VERSION};
pub use redis_store::RedisStore;
pub use result::{
    AotResult, Artifact, BackwardError, GraphDumps, GraphKind, OutputSlot, ResultMeta, RngSlots, StoredArtifact,
    StoredResult, TrainingMeta,
};
pub use sig::{ArgSig, CallSig, Leafness};
pub use store::{read_regular_file, BlobInfo, DiskStore, Store, StoreError, MAX_BLOB_BYTES};
