//! `aotgrad cache stats | list | inspect KEY | clear`: the compiled-result cache of a
//! directory, as a person reads it.

use aotgrad::cache::{Cache, DiskStore};
use std::fmt::Write as _;
use std::path::Path;
use std::time::SystemTime;

/// What to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Totals.
    Stats,
    /// One line per entry.
    List,
    /// A key's ingredients and entries as JSON.
    Inspect(String),
    /// Remove everything.
    Clear,
}

fn bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}

fn ago(t: SystemTime) -> String {
    match SystemTime::now().duration_since(t) {
        Ok(d) if d.as_secs() < 120 => format!("{} s ago", d.as_secs()),
        Ok(d) if d.as_secs() < 7200 => format!("{} min ago", d.as_secs() / 60),
        Ok(d) if d.as_secs() < 172_800 => format!("{} h ago", d.as_secs() / 3600),
        Ok(d) => format!("{} days ago", d.as_secs() / 86_400),
        Err(_) => "just now".into(),
    }
}

/// Run `action` on the cache in `dir` (checked with the key `AOTGRAD_CACHE_KEY` or
/// `AOTGRAD_CACHE_KEY_FILE` gives, as the programs using it do); the text to print.
pub fn run(dir: &Path, action: &Action) -> Result<String, String> {
    // Opened with the environment's key: entries signed by the programs sharing the
    // directory are checked (and a signed entry is never taken for a corrupt one).
    let cache = Cache::disk_from_env(dir)?;
    let mut out = String::new();
    match action {
        Action::Stats => {
            let blobs = cache.list().map_err(|e| e.to_string())?;
            let entries: Vec<_> = blobs.iter().filter(|b| !b.id.is_empty()).collect();
            let artifacts: Vec<_> = blobs.iter().filter(|b| b.id.is_empty()).collect();
            let mut keys: Vec<&str> = entries.iter().map(|b| b.key.as_str()).collect();
            keys.dedup();
            let total: u64 = blobs.iter().map(|b| b.bytes).sum();
            let _ = writeln!(out, "cache {}", dir.display());
            let _ = writeln!(
                out,
                "{} key(s), {} entr{} ({}), {} shared artifact(s) ({}); {} in all",
                keys.len(),
                entries.len(),
                if entries.len() == 1 { "y" } else { "ies" },
                bytes(entries.iter().map(|b| b.bytes).sum()),
                artifacts.len(),
                bytes(artifacts.iter().map(|b| b.bytes).sum()),
                bytes(total)
            );
            if let (Some(old), Some(new)) =
                (blobs.iter().map(|b| b.last_used).min(), blobs.iter().map(|b| b.last_used).max())
            {
                let _ = writeln!(out, "least recently used {}, most recently {}", ago(old), ago(new));
            }
        }
        Action::List => {
            let keys = aotgrad::cache::Store::keys(&DiskStore::new(dir, u64::MAX)).map_err(|e| e.to_string())?;
            let sizes = cache.list().map_err(|e| e.to_string())?;
            let _ = writeln!(
                out,
                "{:<16}  {:<8}  {:<20} {:<9} {:<5} {:>10}  guards",
                "key", "entry", "function", "path", "nodes", "bytes"
            );
            for k in &keys {
                let found = cache.peek(k);
                for c in &found.candidates {
                    let m = &c.result.meta;
                    let size = sizes.iter().find(|b| b.key == k.hex && b.id == c.id).map_or(0, |b| b.bytes);
                    let _ = writeln!(
                        out,
                        "{:<16}  {:<8}  {:<20} {:<9} {:<5} {:>10}  {}",
                        k.hex.get(..16).unwrap_or(&k.hex),
                        // An entry's id is its file name, which need not be ASCII.
                        c.id.chars().take(8).collect::<String>(),
                        m.name,
                        if m.training.is_some() { "training" } else { "inference" },
                        m.traced_nodes,
                        bytes(size),
                        m.guard_expr()
                    );
                }
                for r in &found.rejected {
                    let _ = writeln!(out, "rejected: {r}");
                }
            }
            if keys.is_empty() {
                let _ = writeln!(out, "(empty)");
            }
        }
        Action::Inspect(key) => {
            let v = cache.inspect(key)?;
            out = serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?;
            out.push('\n');
        }
        Action::Clear => {
            let total: u64 = cache.list().map_err(|e| e.to_string())?.iter().map(|b| b.bytes).sum();
            cache.clear().map_err(|e| e.to_string())?;
            let _ = writeln!(out, "removed {} from {}", bytes(total), dir.display());
        }
    }
    Ok(out)
}
