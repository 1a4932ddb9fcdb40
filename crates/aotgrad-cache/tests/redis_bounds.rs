//! The Redis tier against a misbehaving server: a stand-in on a loopback port that
//! trickles a reply, announces a reply too large to hold, nests without end or stalls.
//! Every call is an error within a bounded time, allocates nothing like what was
//! announced, and marks the tier down (the next call fails at once). Also: logging in
//! and selecting a database, against the stand-in and a real `redis-server`.

use aotgrad_cache::{Cache, CacheKey, KeyBuilder, RedisStore, Store};
use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The system allocator, noting the largest single request (a parser that allocates
/// what a reply announces shows up here long before it exhausts memory).
struct Noting;

static LARGEST_ALLOCATION: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed on to the system allocator unchanged.
unsafe impl GlobalAlloc for Noting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST_ALLOCATION.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's layout, as GlobalAlloc::alloc requires.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from System.alloc with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST_ALLOCATION.fetch_max(new_size, Ordering::Relaxed);
        // SAFETY: as GlobalAlloc::realloc requires, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Noting = Noting;

/// No test in this binary asks for more than this in one allocation.
const SMALL: usize = 32 << 20;

fn assert_no_large_allocation() {
    let largest = LARGEST_ALLOCATION.load(Ordering::Relaxed);
    assert!(largest < SMALL, "an allocation of {largest} bytes");
}

/// The per-read timeout the stores here use (the whole exchange: ten times it).
const TIMEOUT: Duration = Duration::from_millis(250);

/// What a stand-in server does once it has read a request.
type Script = fn(&mut TcpStream);

/// A stand-in server on a loopback port: each connection's first request is read,
/// then `script` runs on the socket. Returns its URL.
fn stand_in(script: Script) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(mut s) = s else { continue };
            std::thread::spawn(move || {
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                let mut request = [0u8; 4096];
                if s.read(&mut request).is_ok_and(|n| n > 0) {
                    script(&mut s);
                }
            });
        }
    });
    format!("redis://127.0.0.1:{port}/")
}

/// Send `bytes` one at a time, 100 ms apart (each read's timeout is never reached).
fn trickle(s: &mut TcpStream, bytes: &[u8]) {
    for b in bytes {
        if s.write_all(&[*b]).is_err() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Send `bytes`, then hold the connection open, silent, for a while.
fn then_stall(s: &mut TcpStream, bytes: &[u8]) {
    let _ = s.write_all(bytes);
    std::thread::sleep(Duration::from_secs(20));
}

fn store(url: &str) -> RedisStore {
    RedisStore::new(url, TIMEOUT, 60).expect("url")
}

fn key() -> CacheKey {
    let mut b = KeyBuilder::new();
    b.add("test", b"a misbehaving server");
    b.finish()
}

/// Run `call`, which must fail within `within`; then a second call must fail at once,
/// the tier being down.
fn fails_in_time<T: std::fmt::Debug>(
    s: &RedisStore,
    within: Duration,
    want: &str,
    call: impl Fn(&RedisStore) -> Result<T, aotgrad_cache::StoreError>,
) {
    let t = Instant::now();
    let r = call(s);
    let took = t.elapsed();
    let e = r.expect_err("a misbehaving server's reply is an error");
    assert!(took < within, "took {took:?} (at most {within:?}): {e}");
    assert!(e.msg.contains(want), "{e}: does not say {want:?}");
    assert_no_large_allocation();
    let t = Instant::now();
    let again = call(s).expect_err("the tier is down");
    assert!(again.msg.contains("not retried yet"), "{again}");
    assert!(t.elapsed() < Duration::from_millis(100), "the second call waited {:?}", t.elapsed());
}

fn trickled_entries(s: &mut TcpStream) {
    trickle(s, b"*2\r\n$1\r\ne\r\n$30\r\n012345678901234567890123456789\r\n");
}

fn trickled_artifact(s: &mut TcpStream) {
    trickle(s, b"$40\r\n0123456789012345678901234567890123456789\r\n");
}

#[test]
fn a_reply_trickled_a_byte_at_a_time_is_cut_off_at_the_exchange_deadline() {
    let s = store(&stand_in(trickled_entries));
    fails_in_time(&s, Duration::from_secs(5), "did not finish within", |s| s.entries(&key().hex));
    let s = store(&stand_in(trickled_artifact));
    fails_in_time(&s, Duration::from_secs(5), "did not finish within", |s| s.artifact(&"a".repeat(64)));
    // A longer exchange deadline lets the same reply through.
    let s = store(&stand_in(trickled_artifact)).exchange_timeout(Duration::from_secs(30));
    let got = s.artifact(&"a".repeat(64)).expect("a slow but whole reply");
    assert_eq!(got.as_deref(), Some(&b"0123456789012345678901234567890123456789"[..]));
}

#[test]
fn a_server_that_stalls_mid_reply_is_cut_off_by_the_read_timeout() {
    let s = store(&stand_in(|s| then_stall(s, b"*2\r\n$1\r\ne\r\n$30\r\n0123")));
    fails_in_time(&s, Duration::from_secs(2), "timed out", |s| s.entries(&key().hex));
}

#[test]
fn an_array_of_two_billion_elements_is_refused_before_allocating() {
    let s = store(&stand_in(|s| then_stall(s, b"*2147483648\r\n")));
    fails_in_time(&s, Duration::from_secs(2), "an array of 2147483648 elements", |s| s.entries(&key().hex));
    // The same, and the server hangs up.
    let s = store(&stand_in(|s| {
        let _ = s.write_all(b"*2147483648\r\n");
    }));
    fails_in_time(&s, Duration::from_secs(2), "an array of 2147483648 elements", |s| s.entries(&key().hex));
    // In reply to a write (MULTI's reply).
    let s = store(&stand_in(|s| then_stall(s, b"*2147483648\r\n")));
    fails_in_time(&s, Duration::from_secs(2), "an array of 2147483648 elements", |s| s.put_entry(&key(), "e", b"blob"));
}

#[test]
fn a_bulk_string_of_four_gigabytes_is_refused_before_allocating() {
    let s = store(&stand_in(|s| then_stall(s, b"$4000000000\r\n")));
    fails_in_time(&s, Duration::from_secs(2), "a bulk string of 4000000000 bytes", |s| s.artifact(&"a".repeat(64)));
    let s = store(&stand_in(|s| then_stall(s, b"*2\r\n$1\r\ne\r\n$4000000000\r\n")));
    fails_in_time(&s, Duration::from_secs(2), "a bulk string of 4000000000 bytes", |s| s.entries(&key().hex));
}

#[test]
fn an_announced_length_within_the_limit_allocates_only_what_arrives() {
    // 400 MB announced (under the reply limit), 3 bytes sent, then silence.
    let s = store(&stand_in(|s| then_stall(s, b"$400000000\r\nabc")));
    fails_in_time(&s, Duration::from_secs(2), "timed out", |s| s.artifact(&"a".repeat(64)));
    // Ten million elements announced (their size is under the limit), none sent.
    let s = store(&stand_in(|s| then_stall(s, b"*10000000\r\n")));
    fails_in_time(&s, Duration::from_secs(2), "timed out", |s| s.entries(&key().hex));
}

#[test]
fn malformed_replies_are_errors() {
    let cases: [(Script, &str); 6] = [
        (|s| then_stall(s, &b"*1\r\n".repeat(100)), "nested more than"),
        (|s| then_stall(s, &[&b"+"[..], &vec![b'x'; 100_000]].concat()), "longer than"),
        (|s| then_stall(s, b"%2\r\n"), "unknown type"),
        (|s| then_stall(s, b"*-2\r\n"), "an array of length -2"),
        (|s| then_stall(s, b"*2\r\n$3\r\nabcd\r\n"), "not followed by"),
        (|s| then_stall(s, b"*2\r\n:7\r\n:8\r\n"), "expected a bulk string"),
    ];
    for (script, want) in cases {
        let s = store(&stand_in(script));
        fails_in_time(&s, Duration::from_secs(2), want, |s| s.entries(&key().hex));
    }
    // An error reply is a failure too.
    let s = store(&stand_in(|s| then_stall(s, b"-WRONGTYPE not a hash\r\n")));
    fails_in_time(&s, Duration::from_secs(2), "WRONGTYPE", |s| s.entries(&key().hex));
}

#[test]
fn through_a_signed_cache_a_misbehaving_remote_is_a_bounded_miss() {
    let scripts: [Script; 4] = [
        trickled_entries,
        |s| then_stall(s, b"*2147483648\r\n"),
        |s| then_stall(s, b"$4000000000\r\n"),
        |s| then_stall(s, b"*2\r\n$1\r\ne\r\n$4000000000\r\n"),
    ];
    for script in scripts {
        let dir = tempfile::tempdir().expect("temp dir");
        let cache = Cache::disk(dir.path()).signed(b"k").with_remote(Box::new(store(&stand_in(script))));
        let t = Instant::now();
        let found = cache.lookup_tier(1, &key());
        assert!(t.elapsed() < Duration::from_secs(5), "took {:?}", t.elapsed());
        assert!(found.candidates.is_empty(), "{found:?}");
        assert!(found.error.is_some(), "a logged miss: {found:?}");
        // The tier is down now: an artifact fetch skips it at once.
        let t = Instant::now();
        let fetched = cache.fetch_artifact(&"a".repeat(64), 40);
        assert!(fetched.is_err());
        assert!(t.elapsed() < Duration::from_millis(100), "took {:?}", t.elapsed());
        assert_no_large_allocation();
    }
    // An artifact fetch from a trickling remote is bounded too.
    let dir = tempfile::tempdir().expect("temp dir");
    let cache = Cache::disk(dir.path()).signed(b"k").with_remote(Box::new(store(&stand_in(trickled_artifact))));
    let t = Instant::now();
    let fetched = cache.fetch_artifact(&"a".repeat(64), 40);
    assert!(fetched.is_err_and(|e| e.contains("did not finish within")));
    assert!(t.elapsed() < Duration::from_secs(5), "took {:?}", t.elapsed());
}

/// Read exactly `want` from `s` (a request the stand-in expects).
fn expect_request(s: &mut TcpStream, want: &[u8]) -> bool {
    let mut got = vec![0u8; want.len()];
    s.read_exact(&mut got).is_ok() && got == want
}

#[test]
fn a_password_and_a_database_are_sent_as_auth_and_select() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        let Ok((mut s, _)) = listener.accept() else { return };
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let script: [(&[u8], &[u8]); 3] = [
            (b"*3\r\n$4\r\nAUTH\r\n$5\r\nalice\r\n$4\r\np@ss\r\n", b"+OK\r\n"),
            (b"*2\r\n$6\r\nSELECT\r\n$1\r\n5\r\n", b"+OK\r\n"),
            (b"*2\r\n$3\r\nGET\r\n", b""),
        ];
        for (request, reply) in script {
            if !expect_request(&mut s, request) {
                let _ = s.write_all(b"-ERR not what the test expected\r\n");
                return;
            }
            let _ = s.write_all(reply);
        }
        // The rest of the GET: its key, then a value.
        let mut rest = [0u8; 256];
        let _ = s.read(&mut rest);
        let _ = s.write_all(b"$5\r\nhello\r\n");
        std::thread::sleep(Duration::from_secs(5));
    });
    let s = RedisStore::new(&format!("redis://alice:p%40ss@127.0.0.1:{port}/5"), TIMEOUT, 60).expect("url");
    assert!(!s.describe().contains("p%40ss"), "the password is not shown: {}", s.describe());
    assert_eq!(s.artifact(&"a".repeat(64)).expect("get"), Some(b"hello".to_vec()));
}

/// A real `redis-server` with a password (as `tests/redis.rs` in the `aotgrad` crate
/// starts one: `AOTGRAD_SKIP_REDIS_TESTS=1` skips it).
struct RedisServer {
    child: std::process::Child,
    port: u16,
}

impl RedisServer {
    fn start(password: &str) -> Option<RedisServer> {
        if std::env::var("AOTGRAD_SKIP_REDIS_TESTS").is_ok_and(|v| v == "1") {
            eprintln!("AOTGRAD_SKIP_REDIS_TESTS=1: skipping a Redis test");
            return None;
        }
        for _ in 0..20 {
            let port = TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("addr").port();
            let child = std::process::Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .args(["--requirepass", password])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap_or_else(|e| {
                    panic!("cannot start redis-server ({e}): install it or set AOTGRAD_SKIP_REDIS_TESTS=1")
                });
            let mut server = RedisServer { child, port };
            let t = Instant::now();
            let mut exited = false;
            while TcpStream::connect(("127.0.0.1", port)).is_err() {
                assert!(t.elapsed() < Duration::from_secs(10), "redis-server did not start on port {port}");
                if server.child.try_wait().ok().flatten().is_some() {
                    exited = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            std::thread::sleep(Duration::from_millis(50));
            if exited || server.child.try_wait().ok().flatten().is_some() {
                continue;
            }
            return Some(server);
        }
        panic!("could not start redis-server on a free port after 20 tries");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_real_server_with_a_password_and_a_database() {
    let Some(server) = RedisServer::start("s3cret") else { return };
    let url = |pass: &str, db: u32| format!("redis://:{pass}@127.0.0.1:{}/{db}", server.port);
    let s = RedisStore::new(&url("s3cret", 2), Duration::from_secs(2), 60).expect("url");
    let k = key();
    // A blob of several megabytes: many reads, one exchange.
    let big: Vec<u8> = (0..6_000_000u32).map(|i| (i % 251) as u8).collect();
    s.put_entry(&k, "e", &big).expect("write");
    s.put_entry(&k, "f", b"small").expect("write");
    s.put_artifact(&"a".repeat(64), b"artifact").expect("write");
    let entries = s.entries(&k.hex).expect("read");
    assert_eq!(entries, vec![("e".to_string(), big.clone()), ("f".to_string(), b"small".to_vec())]);
    assert_eq!(s.artifact(&"a".repeat(64)).expect("read"), Some(b"artifact".to_vec()));
    assert_eq!(s.artifact(&"b".repeat(64)).expect("read"), None);
    assert_eq!(s.keys().expect("keys"), vec![k.clone()]);
    let mut sizes: Vec<u64> = s.list().expect("list").iter().map(|b| b.bytes).collect();
    sizes.sort();
    assert_eq!(sizes, vec![5, 8, big.len() as u64]);
    // Another database holds none of it.
    let other = RedisStore::new(&url("s3cret", 3), Duration::from_secs(2), 60).expect("url");
    assert!(other.entries(&k.hex).expect("read").is_empty());
    assert!(other.list().expect("list").is_empty());
    // A wrong password is an error naming AUTH (and the password is not shown).
    let wrong = RedisStore::new(&url("hunter2", 2), Duration::from_secs(2), 60).expect("url");
    let e = wrong.entries(&k.hex).expect_err("a wrong password");
    assert!(e.msg.contains("AUTH"), "{e}");
    assert!(!e.to_string().contains("hunter2"), "{e}");
    s.remove_entry(&k.hex, "e").expect("remove");
    s.remove_artifact(&"a".repeat(64)).expect("remove");
    assert_eq!(s.entries(&k.hex).expect("read").len(), 1);
    s.clear().expect("clear");
    assert!(s.list().expect("list").is_empty());
}
