//! The fleet-shared tier: a [`Store`] on Redis (what PyTorch's remote cache uses).
//!
//! Layout: `aotgrad:v1:entries:<key>` is a hash of entry id → sealed blob,
//! `aotgrad:v1:key:<key>` the key's ingredients (JSON), `aotgrad:v1:artifact:<hash>`
//! an artifact blob; every write refreshes the TTL (an entry's hash, its TTL and its
//! ingredients are written in one `MULTI`/`EXEC` transaction, sent as one pipeline).
//!
//! The server is not trusted to behave: every exchange with it is bounded in time and
//! in size by a small RESP2 client of this crate's own (`resp`; the `redis` crate's
//! timeouts bound each socket read, not a reply, and its parser allocates what a
//! reply announces). Connecting, and each socket read or write, may take at most the
//! store's `timeout` (a silent server costs one timeout); a whole exchange (sending a
//! command, or a pipeline, and reading every byte of its replies) must finish within
//! the exchange timeout, by default ten times `timeout` (2.5 s at the default 250 ms;
//! see [`RedisStore::exchange_timeout`]), so a server that trickles a reply a byte at
//! a time is cut off too, while a large blob on a healthy link has room to arrive.
//! Replies may take at most 512 MiB per exchange, each element counted as at least
//! its in-memory size: a bulk string or an array announcing more than what is left of
//! that is refused before anything is allocated for it, buffers grow only with bytes
//! that arrive, lines are at most 64 KiB and arrays nest at most 8 deep.
//!
//! A connection that cannot be made, a command that times out or fails, and a reply
//! that breaks a bound are errors the cache logs and treats as a miss; after one, the
//! connection is dropped and the store stays away for a while (`retry_after`), so
//! that a dead or misbehaving server costs one failure, not one per lookup.
//!
//! URLs: `redis://[[user]:password@]host[:port][/db]` (`AUTH` when a password is
//! given, `SELECT` when the database is not 0), or on Unix a socket as
//! `unix:///path?db=N&pass=...` (also `redis+unix://`). Descriptions and messages
//! show the URL with its password replaced by `***`.

mod resp;

use crate::key::CacheKey;
use crate::store::{BlobInfo, Store, StoreError};
use resp::{Connection, Limits, Reply, RespError, Target};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

/// A Redis-backed store.
pub struct RedisStore {
    /// The URL as given, password redacted (for messages).
    shown: String,
    target: Target,
    conn: Mutex<Option<Connection>>,
    timeout: Duration,
    exchange_timeout: Duration,
    ttl_seconds: u64,
    retry_after: Duration,
    down_until: Mutex<Option<Instant>>,
}

const PREFIX: &str = "aotgrad:v1";

/// How many times the per-read timeout a whole exchange may take, by default.
const EXCHANGE_TIMEOUTS: u32 = 10;

/// A blob no reply could bring back (over the reply cap) is not written: it would be a
/// miss, and a failed exchange, on every later read.
fn too_big(store: &RedisStore, blob: &[u8]) -> Result<(), StoreError> {
    if blob.len() >= resp::MAX_REPLY_BYTES {
        return Err(store.err(format!(
            "a blob of {} bytes is not written: a reply may hold at most {} bytes",
            blob.len(),
            resp::MAX_REPLY_BYTES
        )));
    }
    Ok(())
}

fn protocol(msg: impl Into<String>) -> RespError {
    RespError(msg.into())
}

/// A reply that must not be an error.
fn ok(r: Reply) -> Result<Reply, RespError> {
    match r {
        Reply::Error(e) => Err(protocol(format!("server error: {e}"))),
        r => Ok(r),
    }
}

fn bulk_or_nil(r: Reply) -> Result<Option<Vec<u8>>, RespError> {
    match ok(r)? {
        Reply::Nil => Ok(None),
        Reply::Bulk(b) => Ok(Some(b)),
        r => Err(protocol(format!("expected a bulk string, got {}", resp::describe(&r)))),
    }
}

fn array(r: Reply) -> Result<Vec<Reply>, RespError> {
    match ok(r)? {
        Reply::Array(a) => Ok(a),
        r => Err(protocol(format!("expected an array, got {}", resp::describe(&r)))),
    }
}

fn text(r: Reply) -> Result<String, RespError> {
    let b = bulk_or_nil(r)?.ok_or_else(|| protocol("expected a bulk string, got nil"))?;
    String::from_utf8(b).map_err(|_| protocol("a name that is not UTF-8"))
}

fn count(r: Reply) -> Result<u64, RespError> {
    match ok(r)? {
        Reply::Int(n) => u64::try_from(n).map_err(|_| protocol(format!("a negative count {n}"))),
        r => Err(protocol(format!("expected an integer, got {}", resp::describe(&r)))),
    }
}

impl RedisStore {
    /// A store at `url` (`redis://127.0.0.1:6379/`; see the module docs for the
    /// forms); `timeout` bounds connecting and every socket read and write (a zero one
    /// is taken as 1 ms), ten times it each whole exchange; entries expire
    /// `ttl_seconds` after their last write.
    pub fn new(url: &str, timeout: Duration, ttl_seconds: u64) -> Result<RedisStore, StoreError> {
        let shown = resp::redact(url);
        let target = resp::parse_url(url)
            .map_err(|e| StoreError { store: format!("redis {shown}"), msg: format!("invalid URL: {e}") })?;
        let timeout = timeout.max(Duration::from_millis(1));
        Ok(RedisStore {
            shown,
            target,
            conn: Mutex::new(None),
            timeout,
            exchange_timeout: timeout.saturating_mul(EXCHANGE_TIMEOUTS),
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

    /// How long one whole exchange (a command or pipeline sent, all of its replies
    /// read) may take: default ten times the timeout; never less than the timeout.
    pub fn exchange_timeout(mut self, d: Duration) -> RedisStore {
        self.exchange_timeout = d.max(self.timeout);
        self
    }

    fn err(&self, msg: impl std::fmt::Display) -> StoreError {
        StoreError { store: self.describe(), msg: msg.to_string() }
    }

    /// Run `f` on a connection (made or reused); a failure drops the connection and
    /// marks the server down for `retry_after`.
    fn with<T>(&self, f: impl FnOnce(&mut Connection) -> Result<T, RespError>) -> Result<T, StoreError> {
        if let Some(t) = *self.down_until.lock().unwrap_or_else(|e| e.into_inner()) {
            if Instant::now() < t {
                return Err(self.err("unreachable a moment ago; not retried yet"));
            }
        }
        let mut slot = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        let result = (|| {
            if slot.is_none() {
                let limits = Limits { io: self.timeout, exchange: self.exchange_timeout };
                *slot = Some(Connection::open(&self.target, limits)?);
            }
            let c = slot.as_mut().ok_or_else(|| protocol("no connection"))?;
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
                tracing::debug!(target: "aotgrad::cache", "{}: {e}; not retried for {:?}", self.describe(), self.retry_after);
                Err(self.err(e))
            }
        }
    }

    /// One command and its reply (an error reply is a failure).
    fn call(&self, args: &[&[u8]]) -> Result<Reply, StoreError> {
        self.with(|c| ok(c.call(args)?))
    }

    fn scan(&self, pattern: &str) -> Result<Vec<String>, StoreError> {
        // One deadline and a bound on what a scan may return, whatever the server's
        // cursors say (a server that never returns cursor 0 ends here, not never).
        const MAX_KEYS: usize = 1 << 20;
        let started = Instant::now();
        let limit = self.exchange_timeout.saturating_mul(4);
        self.with(|c| {
            let mut cursor = "0".to_string();
            let mut out = Vec::new();
            loop {
                if started.elapsed() > limit || out.len() > MAX_KEYS {
                    return Err(protocol(format!(
                        "a SCAN that has not ended after {:?} and {} keys",
                        started.elapsed(),
                        out.len()
                    )));
                }
                let reply = c.call(&[b"SCAN", cursor.as_bytes(), b"MATCH", pattern.as_bytes(), b"COUNT", b"1000"])?;
                let mut parts = array(reply)?.into_iter();
                let (Some(next), Some(keys), None) = (parts.next(), parts.next(), parts.next()) else {
                    return Err(protocol("a SCAN reply that is not [cursor, keys]"));
                };
                let next = text(next)?;
                if next.is_empty() || !next.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(protocol(format!("a SCAN cursor {next:?}")));
                }
                for k in array(keys)? {
                    out.push(text(k)?);
                }
                if next == "0" {
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
        format!("redis {}", self.shown)
    }

    fn entries(&self, key: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let k = format!("{PREFIX}:entries:{key}");
        let mut v = self.with(|c| {
            let items = array(c.call(&[b"HGETALL", k.as_bytes()])?)?;
            if items.len() % 2 != 0 {
                return Err(protocol("an HGETALL reply with an odd number of elements"));
            }
            let mut out = Vec::with_capacity(items.len() / 2);
            let mut it = items.into_iter();
            while let (Some(id), Some(blob)) = (it.next(), it.next()) {
                let blob = bulk_or_nil(blob)?.ok_or_else(|| protocol("a nil hash value"))?;
                out.push((text(id)?, blob));
            }
            Ok(out)
        })?;
        v.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(v)
    }

    fn entries_where(
        &self,
        key: &str,
        want: &dyn Fn(&str) -> bool,
    ) -> Result<(Vec<(String, Vec<u8>)>, Vec<String>), StoreError> {
        // The ids first; then only the wanted blobs (another key's entries are not
        // fetched, so they cost neither transfer nor reply budget).
        let k = format!("{PREFIX}:entries:{key}");
        let ids: Vec<String> =
            self.with(|c| array(c.call(&[b"HKEYS", k.as_bytes()])?)?.into_iter().map(text).collect())?;
        let (mut mine, mut others): (Vec<String>, Vec<String>) = ids.into_iter().partition(|id: &String| want(id));
        mine.sort();
        others.sort();
        if mine.is_empty() {
            return Ok((Vec::new(), others));
        }
        let mut args: Vec<&[u8]> = vec![b"HMGET", k.as_bytes()];
        args.extend(mine.iter().map(|id| id.as_bytes()));
        let blobs =
            self.with(|c| array(c.call(&args)?)?.into_iter().map(bulk_or_nil).collect::<Result<Vec<_>, _>>())?;
        if blobs.len() != mine.len() {
            return Err(self.err("an HMGET reply of another length than asked"));
        }
        // An id removed since the listing (a TTL, another process) is not there.
        let found = mine.into_iter().zip(blobs).filter_map(|(id, b)| b.map(|b| (id, b))).collect();
        Ok((found, others))
    }

    fn put_entry(&self, key: &CacheKey, id: &str, blob: &[u8]) -> Result<(), StoreError> {
        too_big(self, blob)?;
        let k = format!("{PREFIX}:entries:{}", key.hex);
        let ingredients = format!("{PREFIX}:key:{}", key.hex);
        let json = serde_json::to_vec(key).map_err(|e| self.err(e))?;
        let ttl = self.ttl_seconds.to_string();
        self.with(|c| {
            let replies = c.exchange(&[
                &[b"MULTI"],
                &[b"HSET", k.as_bytes(), id.as_bytes(), blob],
                &[b"EXPIRE", k.as_bytes(), ttl.as_bytes()],
                &[b"SET", ingredients.as_bytes(), &json, b"EX", ttl.as_bytes()],
                &[b"EXEC"],
            ])?;
            // MULTI's OK, three QUEUED, then EXEC's array of the three results (an error
            // anywhere, a queued command's or one inside EXEC's array, fails the write).
            let mut replies = replies.into_iter();
            let exec = replies.next_back().ok_or_else(|| protocol("no EXEC reply"))?;
            for r in replies {
                ok(r)?;
            }
            let results = array(exec)?;
            if results.len() != 3 {
                return Err(protocol(format!("EXEC gave {} results for 3 commands", results.len())));
            }
            for r in results {
                ok(r)?;
            }
            Ok(())
        })
    }

    fn remove_entry(&self, key: &str, id: &str) -> Result<(), StoreError> {
        let k = format!("{PREFIX}:entries:{key}");
        self.call(&[b"HDEL", k.as_bytes(), id.as_bytes()]).map(|_| ())
    }

    fn artifact(&self, hash: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let k = format!("{PREFIX}:artifact:{hash}");
        self.with(|c| bulk_or_nil(c.call(&[b"GET", k.as_bytes()])?))
    }

    fn put_artifact(&self, hash: &str, blob: &[u8]) -> Result<(), StoreError> {
        too_big(self, blob)?;
        let k = format!("{PREFIX}:artifact:{hash}");
        let ttl = self.ttl_seconds.to_string();
        self.call(&[b"SET", k.as_bytes(), blob, b"EX", ttl.as_bytes()]).map(|_| ())
    }

    fn remove_artifact(&self, hash: &str) -> Result<(), StoreError> {
        let k = format!("{PREFIX}:artifact:{hash}");
        self.call(&[b"DEL", k.as_bytes()]).map(|_| ())
    }

    fn keys(&self) -> Result<Vec<CacheKey>, StoreError> {
        let names = self.scan(&format!("{PREFIX}:key:*"))?;
        let mut out = Vec::new();
        for n in names {
            let json = self.with(|c| bulk_or_nil(c.call(&[b"GET", n.as_bytes()])?))?;
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
            let fields: Vec<String> =
                self.with(|c| array(c.call(&[b"HKEYS", k.as_bytes()])?)?.into_iter().map(text).collect())?;
            for id in fields {
                let bytes = self.with(|c| count(c.call(&[b"HSTRLEN", k.as_bytes(), id.as_bytes()])?))?;
                out.push(BlobInfo { key: key.clone(), id, bytes, last_used: SystemTime::now() });
            }
        }
        for k in self.scan(&format!("{PREFIX}:artifact:*"))? {
            let bytes = self.with(|c| count(c.call(&[b"STRLEN", k.as_bytes()])?))?;
            let hash = k.rsplit(':').next().unwrap_or_default().to_string();
            out.push(BlobInfo { key: hash, id: String::new(), bytes, last_used: SystemTime::now() });
        }
        Ok(out)
    }

    fn clear(&self) -> Result<(), StoreError> {
        for k in self.scan(&format!("{PREFIX}:*"))? {
            self.call(&[b"DEL", k.as_bytes()])?;
        }
        Ok(())
    }
}
