//! The fleet-shared Redis tier, against a real `redis-server` started on a loopback
//! port for each test (Debian's `redis-server`; `cargo xtask ci` installs it). Without
//! the binary the tests fail saying how to get it, unless `AOTGRAD_SKIP_REDIS_TESTS=1`.

use aotgrad::cache::{envelope, Cache, RedisStore, Store};
use aotgrad::trace::{DType, Tensor};
use aotgrad::{aot_function, AotConfig, AotFunction};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

struct RedisServer {
    child: Child,
    port: u16,
}

impl RedisServer {
    /// A fresh server, or `None` when skipping is asked for.
    fn start() -> Option<RedisServer> {
        if std::env::var("AOTGRAD_SKIP_REDIS_TESTS").is_ok_and(|v| v == "1") {
            eprintln!("AOTGRAD_SKIP_REDIS_TESTS=1: skipping a Redis test");
            return None;
        }
        // A free port can be handed to two tests at once: a server that exits (its port
        // taken) is started again on another port, so no test talks to another's server.
        for _ in 0..20 {
            let port =
                std::net::TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("addr").port();
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| {
                    panic!(
                        "cannot start redis-server ({e}): install it (`sudo apt-get install redis-server`; `cargo \
                         xtask ci` does) or set AOTGRAD_SKIP_REDIS_TESTS=1 to skip the Redis tests"
                    )
                });
            let mut server = RedisServer { child, port };
            let t = Instant::now();
            let mut exited = false;
            while TcpStream::connect(("127.0.0.1", port)).is_err() {
                assert!(t.elapsed() < Duration::from_secs(10), "redis-server did not start listening on port {port}");
                if server.child.try_wait().ok().flatten().is_some() {
                    exited = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            // Listening, but maybe someone else's server: ours must still be running.
            std::thread::sleep(Duration::from_millis(50));
            if exited || server.child.try_wait().ok().flatten().is_some() {
                continue;
            }
            return Some(server);
        }
        panic!("could not start redis-server on a free port after 20 tries");
    }
    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
    fn store(&self, ttl: u64) -> RedisStore {
        RedisStore::new(&self.url(), Duration::from_millis(2000), ttl).expect("url")
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn data(shape: &[usize], start: f64) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_f64(&(0..n).map(|i| start + 0.25 * i as f64).collect::<Vec<_>>(), shape, DType::F32).expect("data")
}

fn program(a: &[Tensor]) -> aotgrad::Result<Vec<Tensor>> {
    let y = a[0].matmul(&a[1])?.tanh()?;
    Ok(vec![y.sum(&[1], false)?])
}

fn run(f: &AotFunction) -> Vec<f64> {
    f.call(&[data(&[3, 4], 0.0), data(&[4, 2], 1.0)]).expect("call")[0].to_vec_f64().expect("values")
}

/// A machine: its own local directory, the shared server, a secret.
fn machine(server: &RedisServer, secret: &str) -> (tempfile::TempDir, Arc<Cache>) {
    let dir = tempfile::tempdir().expect("temp dir");
    let cache = Cache::disk(dir.path()).signed(secret.as_bytes()).with_remote(Box::new(server.store(3600)));
    (dir, Arc::new(cache))
}

fn function(cache: &Arc<Cache>) -> AotFunction {
    aot_function(program, AotConfig::default().cache(cache.clone())).expect("aot")
}

#[test]
fn machines_share_entries_through_redis() {
    let Some(server) = RedisServer::start() else { return };
    let (_a_dir, a) = machine(&server, "fleet secret");
    let want = run(&function(&a));
    // Machine B has an empty local cache: the entry comes from Redis, then is local.
    let (b_dir, b) = machine(&server, "fleet secret");
    let first = function(&b);
    assert_eq!(run(&first), want);
    let s = first.cache_stats();
    assert_eq!((s.hits, s.misses, s.rejected), (1, 0, 0), "{s:?}");
    assert!(s.reasons[0].contains("tier 1"), "{s:?}");
    assert!(b_dir.path().join("v1/entries").is_dir(), "the remote hit was copied locally");
    let second = function(&b);
    assert_eq!(run(&second), want);
    assert!(second.cache_stats().reasons[0].contains("tier 0"), "{:?}", second.cache_stats());
}

#[test]
fn an_entry_without_the_fleet_key_is_rejected_never_run() {
    let Some(server) = RedisServer::start() else { return };
    let (_a_dir, a) = machine(&server, "alpha");
    let want = run(&function(&a));
    let store = server.store(3600);
    let keys = store.keys().expect("keys");
    let key = keys.first().expect("a key");
    let alpha_ids: Vec<String> = store.entries(&key.hex).expect("entries").into_iter().map(|(id, _)| id).collect();
    // Another key's entry is never checked or run, nor deleted: beta stores its own.
    let (_b_dir, b) = machine(&server, "beta");
    let f = function(&b);
    assert_eq!(run(&f), want);
    let s = f.cache_stats();
    assert_eq!((s.hits, s.rejected, s.skipped), (0, 0, 1), "{s:?}");
    assert!(s.reasons.iter().any(|r| r.contains("written with another cache key")), "{s:?}");
    let held = store.entries(&key.hex).expect("entries");
    assert_eq!(held.len(), 2, "alpha's entry and beta's");
    let beta_id = held.iter().map(|(id, _)| id.clone()).find(|id| !alpha_ids.contains(id)).expect("beta's id");
    // A forged, unsigned entry written straight into Redis in place of beta's.
    let forged = envelope::seal(envelope::Kind::Entry, b"not even an entry", None);
    store.put_entry(key, &beta_id, &forged).expect("write");
    let (_c_dir, c) = machine(&server, "beta");
    let g = function(&c);
    assert_eq!(run(&g), want);
    let s = g.cache_stats();
    assert_eq!((s.hits, s.rejected), (0, 1), "{s:?}");
    assert!(s.reasons.iter().any(|r| r.contains("not signed")), "{s:?}");
}

#[test]
fn redis_down_or_unreachable_is_a_logged_miss() {
    let Some(server) = RedisServer::start() else { return };
    let (_a_dir, a) = machine(&server, "k");
    let want = run(&function(&a));
    drop(server); // the server goes away
    let dir = tempfile::tempdir().expect("temp dir");
    let gone = Cache::disk(dir.path())
        .signed(b"k")
        .with_remote(Box::new(RedisStore::new("redis://127.0.0.1:1/", Duration::from_millis(200), 60).expect("url")));
    for cache in [a, Arc::new(gone)] {
        let f = function(&cache);
        assert_eq!(run(&f), want);
        let s = f.cache_stats();
        assert_eq!(s.hits + s.misses, 1, "{s:?}");
    }
    // A fresh local cache with the dead remote: a miss naming the unreachable tier, a
    // compile, a failed remote write counted; and the next lookup skips the dead tier.
    let dir = tempfile::tempdir().expect("temp dir");
    let dead =
        Arc::new(Cache::disk(dir.path()).signed(b"k").with_remote(Box::new(
            RedisStore::new("redis://127.0.0.1:1/", Duration::from_millis(200), 60).expect("url"),
        )));
    let f = function(&dead);
    assert_eq!(run(&f), want);
    let s = f.cache_stats();
    assert_eq!((s.misses, s.write_errors), (1, 1), "{s:?}");
    assert!(s.reasons[0].contains("unreachable"), "{s:?}");
    let g = function(&dead);
    assert_eq!(run(&g), want);
    assert_eq!(g.cache_stats().hits, 1, "the local tier still works: {:?}", g.cache_stats());
}

#[test]
fn a_server_that_never_answers_is_a_logged_miss_not_a_hang() {
    // Accepts connections and never replies (a hung or overloaded server).
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in listener.incoming() {
            held.push(s);
        }
    });
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("redis://127.0.0.1:{port}/");
    let silent = Arc::new(
        Cache::disk(dir.path())
            .signed(b"k")
            .with_remote(Box::new(RedisStore::new(&url, Duration::from_millis(200), 60).expect("url"))),
    );
    let t = Instant::now();
    let f = function(&silent);
    let want = run(&f);
    let s = f.cache_stats();
    assert_eq!((s.hits, s.misses, s.write_errors), (0, 1, 1), "{s:?}");
    assert!(s.reasons[0].contains("unreachable"), "{s:?}");
    // Bounded by the timeouts (generously: the machine may be loaded), not a hang.
    assert!(t.elapsed() < Duration::from_secs(30), "took {:?}", t.elapsed());
    // The local tier still serves the next lookup.
    let g = function(&silent);
    assert_eq!(run(&g), want);
    assert_eq!(g.cache_stats().hits, 1, "{:?}", g.cache_stats());
}

#[test]
fn an_unsigned_cache_neither_reads_nor_writes_the_shared_tier() {
    let Some(server) = RedisServer::start() else { return };
    let (_a_dir, a) = machine(&server, "fleet secret");
    let want = run(&function(&a));
    let held = server.store(3600).list().expect("list").len();
    let dir = tempfile::tempdir().expect("temp dir");
    let unsigned = Arc::new(Cache::disk(dir.path()).with_remote(Box::new(server.store(3600))));
    let f = function(&unsigned);
    assert_eq!(run(&f), want);
    let s = f.cache_stats();
    // Read, the signed entry would be a rejection ("no key"); it is not looked at.
    assert_eq!((s.hits, s.misses, s.rejected, s.write_errors), (0, 1, 0, 0), "{s:?}");
    // Written, an unsigned entry would replace the signed one (same key and guards).
    let store = server.store(3600);
    assert_eq!(store.list().expect("list").len(), held);
    for k in store.keys().expect("keys") {
        for (_, blob) in store.entries(&k.hex).expect("entries") {
            assert!(envelope::is_signed(&blob), "nothing unsigned was written to Redis");
        }
    }
}

#[test]
fn entries_expire_after_their_ttl() {
    let Some(server) = RedisServer::start() else { return };
    let store = server.store(1);
    let key = aotgrad::cache::KeyBuilder::new().finish();
    store.put_entry(&key, "e", b"blob").expect("write");
    assert_eq!(store.entries(&key.hex).expect("read").len(), 1);
    assert_eq!(store.keys().expect("keys").len(), 1);
    std::thread::sleep(Duration::from_millis(2100));
    assert!(store.entries(&key.hex).expect("read").is_empty(), "expired");
    store.put_entry(&key, "e", b"blob").expect("write");
    store.clear().expect("clear");
    assert!(store.list().expect("list").is_empty());
}
