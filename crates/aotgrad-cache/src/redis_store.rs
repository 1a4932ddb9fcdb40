//! The fleet-shared tier: a [`Store`] on Redis (what PyTorch's remote cache uses).
//!
//! Layout: `aotgrad:v1:entries:<key>` is a hash of entry id → sealed blob,
//! `aotgrad:v1:key:<key>` the key's ingredients (JSON), `aotgrad:v1:artifact:<hash>`
//! an artifact blob; every write refreshes the TTL. A connection that cannot be made
//! or a command that times out is an error the cache logs and treats as a miss; after
//! one, the store stays away for a while (`retry_after`) so that a dead server costs
//! one timeout, not one per lookup.

use crate::key::CacheKey;
use crate::store::{BlobInfo, Store, StoreError};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

/// A Redis-backed store.
pub struct RedisStore {
    url: String,
    client: redis::Client,
    conn: Mutex<Option<redis::Connection>>,
    timeout: Duration,
    ttl_seconds: u64,
    retry_after: Duration,
    down_until: Mutex<Option<Instant>>,
}

const PREFIX: &str = "aotgrad:v1";

impl RedisStore {
    /// A store at `url` (`redis://127.0.0.1:6379/`); `timeout` bounds connecting and
    /// every command; entries expire `ttl_seconds` after their last write.
    pub fn new(url: &str, timeout: Duration, ttl_seconds: u64) -> Result<RedisStore, StoreError> {
        let client = redis::Client::open(url)
            .map_err(|e| StoreError { store: format!("redis {url}"), msg: format!("invalid URL: {e}") })?;
        Ok(RedisStore {
            url: url.to_string(),
            client,
            conn: Mutex::new(None),
            timeout,
            ttl_seconds: ttl_seconds.max(1),
            retry_after: Duration::from_secs(30),
            down_until: Mutex::new(None),
        })
    }

    /// How long to stay away after a failure (default 30 s).
    pub fn retry_after(mut self, d: Duration) -> RedisStore {
        self.retry_after = d;
        self
    }

    fn err(&self, msg: impl std::fmt::Display) -> StoreError {
        StoreError { store: self.describe(), msg: msg.to_string() }
    }

    /// Run `f` on a connection (made or reused); a failure drops the connection and
    /// marks the server down for `retry_after`.
    fn with<T>(&self, f: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>) -> Result<T, StoreError> {
        if let Some(t) = *self.down_until.lock().unwrap_or_else(|e| e.into_inner()) {
            if Instant::now() < t {
                return Err(self.err("unreachable a moment ago; not retried yet"));
            }
        }
        let mut slot = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        let result = (|| {
            if slot.is_none() {
                let c = self.client.get_connection_with_timeout(self.timeout)?;
                c.set_read_timeout(Some(self.timeout))?;
                c.set_write_timeout(Some(self.timeout))?;
                *slot = Some(c);
            }
            let c =
                slot.as_mut().ok_or_else(|| redis::RedisError::from((redis::ErrorKind::IoError, "no connection")))?;
            f(c)
        })();
        match result {
            Ok(v) => {
                *self.down_until.lock().unwrap_or_else(|e| e.into_inner()) = None;
                Ok(v)
            }
            Err(e) => {
                *slot = None;
                *self.down_until.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now() + self.retry_after);
                Err(self.err(e))
            }
        }
    }

    fn scan(&self, pattern: &str) -> Result<Vec<String>, StoreError> {
        self.with(|c| {
            let mut cursor: u64 = 0;
            let mut out = Vec::new();
            loop {
                let (next, keys): (u64, Vec<String>) =
                    redis::cmd("SCAN").arg(cursor).arg("MATCH").arg(pattern).arg("COUNT").arg(1000).query(c)?;
                out.extend(keys);
                if next == 0 {
                    break;
                }
                cursor = next;
            }
            out.sort();
            Ok(out)
        })
    }
}

impl Store for RedisStore {
    fn describe(&self) -> String {
        format!("redis {}", self.url)
    }

    fn entries(&self, key: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let k = format!("{PREFIX}:entries:{key}");
        let mut v: Vec<(String, Vec<u8>)> = self.with(|c| redis::cmd("HGETALL").arg(&k).query(c))?;
        v.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(v)
    }

    fn put_entry(&self, key: &CacheKey, id: &str, blob: &[u8]) -> Result<(), StoreError> {
        let k = format!("{PREFIX}:entries:{}", key.hex);
        let ingredients = format!("{PREFIX}:key:{}", key.hex);
        let json = serde_json::to_vec(key).map_err(|e| self.err(e))?;
        let ttl = self.ttl_seconds;
        self.with(|c| {
            redis::pipe()
                .atomic()
                .cmd("HSET")
                .arg(&k)
                .arg(id)
                .arg(blob)
                .ignore()
                .cmd("EXPIRE")
                .arg(&k)
                .arg(ttl)
                .ignore()
                .cmd("SET")
                .arg(&ingredients)
                .arg(json.as_slice())
                .arg("EX")
                .arg(ttl)
                .ignore()
                .query(c)
        })
    }

    fn remove_entry(&self, key: &str, id: &str) -> Result<(), StoreError> {
        let k = format!("{PREFIX}:entries:{key}");
        self.with(|c| redis::cmd("HDEL").arg(&k).arg(id).query(c))
    }

    fn artifact(&self, hash: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let k = format!("{PREFIX}:artifact:{hash}");
        self.with(|c| redis::cmd("GET").arg(&k).query(c))
    }

    fn put_artifact(&self, hash: &str, blob: &[u8]) -> Result<(), StoreError> {
        let k = format!("{PREFIX}:artifact:{hash}");
        let ttl = self.ttl_seconds;
        self.with(|c| redis::cmd("SET").arg(&k).arg(blob).arg("EX").arg(ttl).query(c))
    }

    fn remove_artifact(&self, hash: &str) -> Result<(), StoreError> {
        let k = format!("{PREFIX}:artifact:{hash}");
        self.with(|c| redis::cmd("DEL").arg(&k).query(c))
    }

    fn keys(&self) -> Result<Vec<CacheKey>, StoreError> {
        let names = self.scan(&format!("{PREFIX}:key:*"))?;
        let mut out = Vec::new();
        for n in names {
            let json: Option<Vec<u8>> = self.with(|c| redis::cmd("GET").arg(&n).query(c))?;
            // Only ingredients that name their own key (they are printed and sliced).
            if let Some(k) = json.and_then(|j| serde_json::from_slice::<CacheKey>(&j).ok()) {
                if crate::store::valid_name(&k.hex) && n.rsplit(':').next() == Some(k.hex.as_str()) {
                    out.push(k);
                }
            }
        }
        Ok(out)
    }

    fn list(&self) -> Result<Vec<BlobInfo>, StoreError> {
        let mut out = Vec::new();
        for k in self.scan(&format!("{PREFIX}:entries:*"))? {
            let key = k.rsplit(':').next().unwrap_or_default().to_string();
            let fields: Vec<String> = self.with(|c| redis::cmd("HKEYS").arg(&k).query(c))?;
            for id in fields {
                let bytes: u64 = self.with(|c| redis::cmd("HSTRLEN").arg(&k).arg(&id).query(c))?;
                out.push(BlobInfo { key: key.clone(), id, bytes, last_used: SystemTime::now() });
            }
        }
        for k in self.scan(&format!("{PREFIX}:artifact:*"))? {
            let bytes: u64 = self.with(|c| redis::cmd("STRLEN").arg(&k).query(c))?;
            let hash = k.rsplit(':').next().unwrap_or_default().to_string();
            out.push(BlobInfo { key: hash, id: String::new(), bytes, last_used: SystemTime::now() });
        }
        Ok(out)
    }

    fn clear(&self) -> Result<(), StoreError> {
        for k in self.scan(&format!("{PREFIX}:*"))? {
            self.with(|c| redis::cmd("DEL").arg(&k).query::<()>(c))?;
        }
        Ok(())
    }
}
