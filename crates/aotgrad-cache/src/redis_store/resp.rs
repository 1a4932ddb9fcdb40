//! A small RESP2 client for the Redis tier: just what [`super::RedisStore`] sends,
//! with every exchange bounded in time and in size (see the parent module's docs).
//!
//! A command is a RESP array of bulk strings; commands may be sent together (a
//! pipeline) and their replies are read in order. A reply is read into a buffer, one
//! socket read at a time: before each read (and write) the socket's timeout is set to
//! what is left of the exchange's deadline, capped at the per-read timeout, and once
//! the deadline has passed the exchange fails. The parser refuses, before allocating
//! for them, a bulk string or an array whose announced length the rest of the reply
//! budget could not hold (each element counts at least its in-memory size), lines
//! longer than [`MAX_LINE_BYTES`], and nesting deeper than [`MAX_DEPTH`]; it grows its
//! buffers with what arrives, never with what is announced.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// The most one exchange's replies may take: bytes of bulk strings and lines, plus
/// the in-memory size of each reply element.
pub(crate) const MAX_REPLY_BYTES: usize = 512 << 20;

/// The longest status, error, integer or length line.
pub(crate) const MAX_LINE_BYTES: usize = 64 << 10;

/// The deepest nesting of arrays (what this client reads nests at most two deep).
pub(crate) const MAX_DEPTH: usize = 8;

/// How much one socket read asks for.
const READ_CHUNK: usize = 64 << 10;

/// A reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    /// A null bulk string or array.
    Nil,
    /// `:<n>`.
    Int(i64),
    /// `+<text>`.
    Status(String),
    /// `-<text>`: the server refused the command.
    Error(String),
    /// `$<n>` and its bytes.
    Bulk(Vec<u8>),
    /// `*<n>` and its elements.
    Array(Vec<Reply>),
}

/// A failed exchange: the connection is unusable after one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RespError(pub(crate) String);

impl std::fmt::Display for RespError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn fail<T>(msg: impl Into<String>) -> Result<T, RespError> {
    Err(RespError(msg.into()))
}

/// Where a server is and how to log in, from its URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Target {
    /// Where to connect.
    pub(crate) addr: Addr,
    /// The database index (`SELECT`ed when not 0).
    pub(crate) db: u32,
    /// The ACL user name (`AUTH <user> <password>`), when given with a password.
    pub(crate) user: Option<String>,
    /// The password (`AUTH`).
    pub(crate) password: Option<String>,
}

/// A server's address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Addr {
    /// A host name or IP address, and a port.
    Tcp { host: String, port: u16 },
    /// A Unix-domain socket.
    #[cfg(unix)]
    Unix(std::path::PathBuf),
}

/// `%XX` escapes decoded (user names and passwords may hold `@`, `:` or `/` that way).
fn percent_decode(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
            let v = hex.and_then(|h| u8::from_str_radix(h, 16).ok()).ok_or_else(|| format!("bad escape in {s:?}"))?;
            out.push(v);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("{s:?} is not UTF-8 once decoded"))
}

fn parse_db(s: &str) -> Result<u32, String> {
    s.parse::<u32>().map_err(|_| format!("database {s:?} is not a number"))
}

/// Parse `redis://[[user]:password@]host[:port][/db]` (port 6379, database 0 by
/// default; an IPv6 address in brackets), or on Unix
/// `unix:///path` / `redis+unix:///path` with optional `db`, `user` and `pass` query
/// parameters.
pub(crate) fn parse_url(url: &str) -> Result<Target, String> {
    let (scheme, rest) = url.split_once("://").ok_or("no scheme (expected redis://host:port/db)")?;
    let scheme = scheme.to_ascii_lowercase();
    if rest.contains('#') {
        return Err("a fragment (#) is not part of a Redis URL".into());
    }
    match scheme.as_str() {
        "redis" => {}
        #[cfg(unix)]
        "unix" | "redis+unix" => return parse_unix(rest),
        "rediss" => return Err("TLS (rediss://) is not supported".into()),
        other => return Err(format!("unsupported scheme {other:?} (expected redis://)")),
    }
    if rest.contains('?') {
        return Err("query parameters are not supported in a redis:// URL".into());
    }
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, ""),
    };
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let (mut user, mut password) = (None, None);
    if let Some(u) = userinfo {
        let (name, pass) = match u.split_once(':') {
            Some((n, p)) => (n, Some(p)),
            None => (u, None),
        };
        if !name.is_empty() {
            user = Some(percent_decode(name)?);
        }
        if let Some(p) = pass.filter(|p| !p.is_empty()) {
            password = Some(percent_decode(p)?);
        }
        if user.is_some() && password.is_none() {
            return Err("a user name without a password".into());
        }
    }
    let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
        let (h, after) = v6.split_once(']').ok_or("an IPv6 address without its closing ]")?;
        match after {
            "" => (h, None),
            p => (h, Some(p.strip_prefix(':').ok_or("junk after the IPv6 address")?)),
        }
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        }
    };
    if host.is_empty() {
        return Err("no host".into());
    }
    let port = match port {
        None => 6379,
        Some(p) => p.parse::<u16>().map_err(|_| format!("port {p:?} is not a port number"))?,
    };
    let db = match path {
        "" => 0,
        p => parse_db(p)?,
    };
    Ok(Target { addr: Addr::Tcp { host: host.to_string(), port }, db, user, password })
}

#[cfg(unix)]
fn parse_unix(rest: &str) -> Result<Target, String> {
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    if path.is_empty() {
        return Err("no socket path".into());
    }
    let mut t = Target { addr: Addr::Unix(percent_decode(path)?.into()), db: 0, user: None, password: None };
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "db" => t.db = parse_db(v)?,
            "user" => t.user = Some(percent_decode(v)?).filter(|u| !u.is_empty()),
            "pass" => t.password = Some(percent_decode(v)?).filter(|p| !p.is_empty()),
            other => return Err(format!("unsupported query parameter {other:?}")),
        }
    }
    if t.user.is_some() && t.password.is_none() {
        return Err("a user name without a password".into());
    }
    Ok(t)
}

/// `url` with its password (if any) replaced by `***`, for messages.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_string() };
    // The authority's password: `user:password@`. The authority ends at the last `@`
    // when there is one (a password may hold an unescaped `/` or `?`), else at the
    // path or query.
    let end = match rest.rfind('@') {
        Some(at) => rest[at..].find(['/', '?']).map_or(rest.len(), |e| at + e),
        None => rest.find(['/', '?']).unwrap_or(rest.len()),
    };
    let (authority, tail) = rest.split_at(end);
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{user}:***@{host}"),
            None => authority.to_string(),
        },
        None => authority.to_string(),
    };
    // A Unix URL's `pass=` parameter.
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|p| if p.starts_with("pass=") { "pass=***".to_string() } else { p.to_string() })
                .collect();
            format!("{path}?{}", query.join("&"))
        }
        None => tail.to_string(),
    };
    format!("{scheme}://{authority}{tail}")
}

/// A connected socket.
enum Stream {
    Tcp(TcpStream),
    #[cfg(unix)]
    Unix(std::os::unix::net::UnixStream),
}

impl Stream {
    fn set_read_timeout(&self, d: Duration) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(Some(d)),
            #[cfg(unix)]
            Stream::Unix(s) => s.set_read_timeout(Some(d)),
        }
    }
    fn set_write_timeout(&self, d: Duration) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_write_timeout(Some(d)),
            #[cfg(unix)]
            Stream::Unix(s) => s.set_write_timeout(Some(d)),
        }
    }
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            #[cfg(unix)]
            Stream::Unix(s) => s.read(buf),
        }
    }
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            #[cfg(unix)]
            Stream::Unix(s) => s.write(buf),
        }
    }
}

/// The time limits of a connection.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// Connecting, and each socket read or write: the longest the server may stay silent.
    pub(crate) io: Duration,
    /// One whole exchange: sending the commands and reading every byte of their replies.
    pub(crate) exchange: Duration,
}

/// `now + d`, or a far but representable instant when that overflows.
fn deadline_after(d: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(d).unwrap_or_else(|| now + Duration::from_secs(365 * 24 * 3600))
}

/// An open connection to a server.
pub(crate) struct Connection {
    stream: Stream,
    limits: Limits,
    /// Bytes received and not yet parsed: `buf[pos..]`.
    buf: Vec<u8>,
    pos: usize,
    /// The current exchange's deadline.
    deadline: Instant,
    /// What is left of the current exchange's reply budget.
    budget: usize,
}

impl Connection {
    /// Connect to `target` (within `limits.io`), then log in and select the database
    /// (each an exchange of its own).
    pub(crate) fn open(target: &Target, limits: Limits) -> Result<Connection, RespError> {
        let stream = match &target.addr {
            Addr::Tcp { host, port } => {
                let deadline = deadline_after(limits.io);
                let addrs = (host.as_str(), *port)
                    .to_socket_addrs()
                    .map_err(|e| RespError(format!("cannot resolve {host}:{port}: {e}")))?;
                let mut last = None;
                let mut stream = None;
                for a in addrs {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    match TcpStream::connect_timeout(&a, left) {
                        Ok(s) => {
                            stream = Some(s);
                            break;
                        }
                        Err(e) => last = Some(format!("{a}: {e}")),
                    }
                }
                let s = stream.ok_or_else(|| {
                    RespError(format!(
                        "cannot connect to {host}:{port}: {}",
                        last.unwrap_or_else(|| format!("no address within {:?}", limits.io))
                    ))
                })?;
                // Commands are small writes followed by a wait for the reply.
                let _ = s.set_nodelay(true);
                Stream::Tcp(s)
            }
            #[cfg(unix)]
            Addr::Unix(path) => Stream::Unix(
                std::os::unix::net::UnixStream::connect(path)
                    .map_err(|e| RespError(format!("cannot connect to {}: {e}", path.display())))?,
            ),
        };
        let mut c =
            Connection { stream, limits, buf: Vec::new(), pos: 0, deadline: Instant::now(), budget: MAX_REPLY_BYTES };
        if let Some(password) = &target.password {
            let mut auth: Vec<&[u8]> = vec![&b"AUTH"[..]];
            if let Some(user) = &target.user {
                auth.push(user.as_bytes());
            }
            auth.push(password.as_bytes());
            match c.call(&auth)? {
                Reply::Status(s) if s == "OK" => {}
                r => return fail(format!("AUTH failed: {}", describe(&r))),
            }
        }
        if target.db != 0 {
            let db = target.db.to_string();
            match c.call(&[b"SELECT", db.as_bytes()])? {
                Reply::Status(s) if s == "OK" => {}
                r => return fail(format!("SELECT {db} failed: {}", describe(&r))),
            }
        }
        Ok(c)
    }

    /// Send one command and read its reply (an error reply is returned, not failed).
    pub(crate) fn call(&mut self, args: &[&[u8]]) -> Result<Reply, RespError> {
        let mut replies = self.exchange(&[args])?;
        replies.pop().ok_or_else(|| RespError("no reply".into()))
    }

    /// Send `commands` together and read one reply for each, all within one deadline
    /// and one reply budget.
    pub(crate) fn exchange(&mut self, commands: &[&[&[u8]]]) -> Result<Vec<Reply>, RespError> {
        // Bytes left over from the last exchange are replies nobody asked for: the
        // connection is out of step, and would pair every later command with the
        // reply to an earlier one.
        if self.pos != self.buf.len() {
            return fail("the server sent bytes no command asked for".to_string());
        }
        self.deadline = deadline_after(self.limits.exchange);
        self.budget = MAX_REPLY_BYTES;
        let mut out = Vec::new();
        for args in commands {
            out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
            for a in *args {
                out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
                out.extend_from_slice(a);
                out.extend_from_slice(b"\r\n");
            }
        }
        self.send(&out)?;
        let mut replies = Vec::with_capacity(commands.len());
        for _ in commands {
            replies.push(self.reply(0)?);
        }
        Ok(replies)
    }

    /// What is left before the deadline, capped at the per-read limit; an error once
    /// the deadline has passed.
    fn time_left(&self) -> Result<Duration, RespError> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return fail(format!("the exchange did not finish within {:?}", self.limits.exchange));
        }
        Ok(left.min(self.limits.io))
    }

    fn timed_out(&self, what: &str) -> RespError {
        if Instant::now() >= self.deadline {
            RespError(format!("the exchange did not finish within {:?}", self.limits.exchange))
        } else {
            RespError(format!("{what} timed out (nothing for {:?})", self.limits.io))
        }
    }

    fn send(&mut self, bytes: &[u8]) -> Result<(), RespError> {
        let mut off = 0;
        while off < bytes.len() {
            let left = self.time_left()?;
            self.stream.set_write_timeout(left).map_err(|e| RespError(format!("cannot set a timeout: {e}")))?;
            match self.stream.write(&bytes[off..]) {
                Ok(0) => return fail("the server closed the connection"),
                Ok(n) => off += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Err(self.timed_out("sending"))
                }
                Err(e) => return fail(format!("cannot send: {e}")),
            }
        }
        Ok(())
    }

    /// Read more bytes into the buffer (at least one, or an error).
    fn fill(&mut self) -> Result<(), RespError> {
        if self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        } else if self.pos >= READ_CHUNK {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        loop {
            let left = self.time_left()?;
            self.stream.set_read_timeout(left).map_err(|e| RespError(format!("cannot set a timeout: {e}")))?;
            let old = self.buf.len();
            self.buf.resize(old + READ_CHUNK, 0);
            let got = self.stream.read(&mut self.buf[old..]);
            self.buf.truncate(old + *got.as_ref().unwrap_or(&0));
            match got {
                Ok(0) => return fail("the server closed the connection"),
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Err(self.timed_out("reading the reply"))
                }
                Err(e) => return fail(format!("cannot read the reply: {e}")),
            }
        }
    }

    /// Take `n` bytes of the reply budget.
    fn charge(&mut self, n: usize, what: impl FnOnce() -> String) -> Result<(), RespError> {
        if n > self.budget {
            return fail(format!("{} passes the limit of {MAX_REPLY_BYTES} bytes on a reply", what()));
        }
        self.budget -= n;
        Ok(())
    }

    /// The next line, without its `\r\n`.
    fn line(&mut self) -> Result<Vec<u8>, RespError> {
        let mut scanned = self.pos;
        loop {
            if let Some(i) = self.buf[scanned..].windows(2).position(|w| w == b"\r\n") {
                let end = scanned + i;
                let line = self.buf[self.pos..end].to_vec();
                self.pos = end + 2;
                let len = line.len();
                self.charge(len + 2, || format!("a line of {len} bytes"))?;
                return Ok(line);
            }
            if self.buf.len() - self.pos > MAX_LINE_BYTES {
                return fail(format!("a reply line longer than {MAX_LINE_BYTES} bytes"));
            }
            // Scan again from the last byte seen (a `\r` may end the part already read).
            scanned = self.buf.len().saturating_sub(1).max(self.pos);
            let before = self.pos;
            self.fill()?;
            // `fill` may move the unparsed bytes to the start of the buffer.
            scanned = scanned - before + self.pos;
        }
    }

    /// `n` bytes of a bulk string and the `\r\n` after them (already charged).
    fn bulk(&mut self, n: usize) -> Result<Vec<u8>, RespError> {
        let mut out: Vec<u8> = Vec::new();
        while out.len() < n {
            if self.pos == self.buf.len() {
                self.fill()?;
            }
            let take = (self.buf.len() - self.pos).min(n - out.len());
            if out.capacity() < out.len() + take {
                // Grow with what arrived (doubling, never past the announced length).
                let want = (out.capacity() * 2).max(out.len() + take).min(n);
                out.try_reserve_exact(want - out.len())
                    .map_err(|_| RespError(format!("no memory for a reply of {n} bytes")))?;
            }
            out.extend_from_slice(&self.buf[self.pos..self.pos + take]);
            self.pos += take;
        }
        while self.buf.len() - self.pos < 2 {
            self.fill()?;
        }
        if &self.buf[self.pos..self.pos + 2] != b"\r\n" {
            return fail("a bulk string not followed by \\r\\n");
        }
        self.pos += 2;
        Ok(out)
    }

    /// One reply, nested `depth` arrays deep.
    fn reply(&mut self, depth: usize) -> Result<Reply, RespError> {
        self.charge(std::mem::size_of::<Reply>(), || "a reply element".into())?;
        let line = self.line()?;
        let Some((&tag, rest)) = line.split_first() else { return fail("an empty reply line") };
        let text = || String::from_utf8_lossy(rest).into_owned();
        match tag {
            b'+' => Ok(Reply::Status(text())),
            b'-' => Ok(Reply::Error(text())),
            b':' => Ok(Reply::Int(parse_int(rest)?)),
            b'$' => {
                let n = parse_int(rest)?;
                if n == -1 {
                    return Ok(Reply::Nil);
                }
                let n = usize::try_from(n).map_err(|_| RespError(format!("a bulk string of length {n}")))?;
                self.charge(n.saturating_add(2), || format!("a bulk string of {n} bytes"))?;
                Ok(Reply::Bulk(self.bulk(n)?))
            }
            b'*' => {
                let n = parse_int(rest)?;
                if n == -1 {
                    return Ok(Reply::Nil);
                }
                let n = usize::try_from(n).map_err(|_| RespError(format!("an array of length {n}")))?;
                if depth >= MAX_DEPTH {
                    return fail(format!("arrays nested more than {MAX_DEPTH} deep"));
                }
                // Every element takes at least its own size: refuse now what the budget
                // could never hold (the elements charge themselves as they come).
                if n.saturating_mul(std::mem::size_of::<Reply>()) > self.budget {
                    return fail(format!(
                        "an array of {n} elements passes the limit of {MAX_REPLY_BYTES} bytes on a reply"
                    ));
                }
                let mut items = Vec::with_capacity(n.min(1024));
                for _ in 0..n {
                    items.push(self.reply(depth + 1)?);
                }
                Ok(Reply::Array(items))
            }
            other => fail(format!("a reply of unknown type {:?}", other as char)),
        }
    }
}

fn parse_int(s: &[u8]) -> Result<i64, RespError> {
    std::str::from_utf8(s)
        .ok()
        .filter(|t| !t.is_empty() && t.len() <= 20)
        .and_then(|t| t.parse::<i64>().ok())
        .ok_or_else(|| RespError(format!("{:?} is not an integer", String::from_utf8_lossy(s))))
}

/// A reply, shortly, for messages.
pub(crate) fn describe(r: &Reply) -> String {
    match r {
        Reply::Nil => "nil".into(),
        Reply::Int(n) => format!("integer {n}"),
        Reply::Status(s) => format!("status {s:?}"),
        Reply::Error(e) => format!("error {e:?}"),
        Reply::Bulk(b) => format!("a bulk string of {} bytes", b.len()),
        Reply::Array(a) => format!("an array of {} elements", a.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(host: &str, port: u16) -> Addr {
        Addr::Tcp { host: host.into(), port }
    }

    #[test]
    fn urls_give_host_port_database_and_login() {
        let t = parse_url("redis://127.0.0.1:6379/").unwrap();
        assert_eq!(t, Target { addr: tcp("127.0.0.1", 6379), db: 0, user: None, password: None });
        let t = parse_url("redis://cache.internal").unwrap();
        assert_eq!((t.addr, t.db), (tcp("cache.internal", 6379), 0));
        let t = parse_url("redis://:s%40cret@10.0.0.2:7000/3").unwrap();
        assert_eq!(t, Target { addr: tcp("10.0.0.2", 7000), db: 3, user: None, password: Some("s@cret".into()) });
        let t = parse_url("REDIS://alice:pw@[::1]:6380/1").unwrap();
        assert_eq!(
            t,
            Target { addr: tcp("::1", 6380), db: 1, user: Some("alice".into()), password: Some("pw".into()) }
        );
        assert_eq!(parse_url("redis://[::1]").unwrap().addr, tcp("::1", 6379));
        for bad in [
            "127.0.0.1:6379",
            "http://127.0.0.1/",
            "rediss://127.0.0.1/",
            "redis://",
            "redis://:6379/",
            "redis://h:port/",
            "redis://h:70000/",
            "redis://h/x",
            "redis://h/1/2",
            "redis://h/-1",
            "redis://h/?protocol=resp3",
            "redis://alice@h/",
            "redis://:%zz@h/",
            "redis://[::1/",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }

    #[cfg(unix)]
    #[test]
    fn unix_socket_urls_take_their_settings_as_parameters() {
        let t = parse_url("unix:///run/redis.sock?db=2&pass=pw").unwrap();
        assert_eq!(
            t,
            Target { addr: Addr::Unix("/run/redis.sock".into()), db: 2, user: None, password: Some("pw".into()) }
        );
        assert_eq!(parse_url("redis+unix:///tmp/r.sock").unwrap().addr, Addr::Unix("/tmp/r.sock".into()));
        assert!(parse_url("unix://?db=1").is_err());
        assert!(parse_url("unix:///tmp/r.sock?timeout=3").is_err());
    }

    #[test]
    fn passwords_are_redacted_in_messages() {
        assert_eq!(redact("redis://:s3cret@host:1/2"), "redis://:***@host:1/2");
        assert_eq!(redact("redis://alice:s3cret@host"), "redis://alice:***@host");
        assert_eq!(redact("redis://host:1/"), "redis://host:1/");
        assert_eq!(redact("unix:///r.sock?db=1&pass=s3cret"), "unix:///r.sock?db=1&pass=***");
    }
}
