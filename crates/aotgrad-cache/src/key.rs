//! Cache keys: a blake3 hash over named *ingredients*, each itself a hash of one part
//! of what a compiled result depends on. Keeping the ingredients (not only the final
//! hash) lets a miss say which one differed from the nearest existing entry.

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};

/// The version of the entry format; part of every key.
pub const FORMAT_VERSION: u32 = 9;

/// A cache key and the ingredients it was made of.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheKey {
    /// The key: hex blake3 over the ingredients in order.
    pub hex: String,
    /// `ingredient → hex blake3 of its canonical form`, in a stable order.
    pub ingredients: IndexMap<String, String>,
}

/// Builds a [`CacheKey`] one ingredient at a time.
#[derive(Default)]
pub struct KeyBuilder {
    ingredients: IndexMap<String, String>,
}

impl KeyBuilder {
    /// A builder that starts with the crate and format versions.
    pub fn new() -> KeyBuilder {
        let mut b = KeyBuilder::default();
        b.add("versions", format!("aotgrad {} entry format {FORMAT_VERSION}", env!("CARGO_PKG_VERSION")).as_bytes());
        b
    }
    /// Add ingredient `name` with canonical bytes `bytes` (replacing one of that name).
    pub fn add(&mut self, name: &str, bytes: &[u8]) -> &mut KeyBuilder {
        self.ingredients.insert(name.to_string(), blake3::hash(bytes).to_hex().to_string());
        self
    }
    /// Add ingredient `name` by streaming its canonical bytes into a hasher.
    pub fn add_with(&mut self, name: &str, write: impl FnOnce(&mut blake3::Hasher)) -> &mut KeyBuilder {
        let mut h = blake3::Hasher::new();
        write(&mut h);
        self.ingredients.insert(name.to_string(), h.finalize().to_hex().to_string());
        self
    }
    /// The key.
    pub fn finish(self) -> CacheKey {
        let mut h = blake3::Hasher::new();
        for (name, value) in &self.ingredients {
            h.update(&(name.len() as u64).to_le_bytes());
            h.update(name.as_bytes());
            h.update(value.as_bytes());
        }
        CacheKey { hex: h.finalize().to_hex().to_string(), ingredients: self.ingredients }
    }
}

impl CacheKey {
    /// The ingredients whose values differ from `other`'s (or that only one has).
    pub fn differing(&self, other: &CacheKey) -> Vec<String> {
        let mut out: Vec<String> = self
            .ingredients
            .iter()
            .filter(|(k, v)| other.ingredients.get(*k) != Some(*v))
            .map(|(k, _)| k.clone())
            .collect();
        out.extend(other.ingredients.keys().filter(|k| !self.ingredients.contains_key(*k)).cloned());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_ingredient_changes_the_key_and_is_named() {
        let make = |graph: &str, config: &str| {
            let mut b = KeyBuilder::new();
            b.add("graph", graph.as_bytes()).add("config", config.as_bytes());
            b.finish()
        };
        let a = make("g", "c");
        assert_eq!(a, make("g", "c"));
        let b = make("g2", "c");
        assert_ne!(a.hex, b.hex);
        assert_eq!(a.differing(&b), vec!["graph".to_string()]);
        let c = make("g", "c2");
        assert_ne!(a.hex, c.hex);
        assert_eq!(a.differing(&c), vec!["config".to_string()]);
        // Names are part of the key: moving bytes between ingredients changes it.
        let mut d = KeyBuilder::new();
        d.add("graphc", b"g").add("onfig", b"c");
        assert_ne!(a.hex, d.finish().hex);
    }
}
