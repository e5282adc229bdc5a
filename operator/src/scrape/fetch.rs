//! The scrape's HTTP side: one `GET` over plain HTTP/1.1, with keep-alive, reading the body
//! straight into a buffer the caller reuses.
//!
//! A general client (reqwest, hyper) keeps a read buffer per connection that grows to the
//! largest body it has seen (about 400 KB for an 8-rank engine's exposition) and stays
//! allocated while the connection idles between scrapes: 4 GB for 10,000 replicas. Here an
//! idle connection is just its socket; a body is read once, from the socket into the
//! buffer, with the limit enforced as it arrives.
//!
//! What it speaks: `http://` URLs; responses framed by `Content-Length`, by
//! `Transfer-Encoding: chunked`, or by the connection closing; `Connection: close` and
//! HTTP/1.0 keep-alive rules. No TLS (replicas are scraped on the pod network), no
//! redirects (a replica's metrics are where it is), no compression (none is asked for).
//!
//! A connection kept from an earlier scrape may have been closed by the replica in the
//! meantime (servers time idle connections out, uvicorn after 5 s): when it fails before a
//! single byte of the response, the request is sent once more on a new connection, as a
//! `GET` safely can be.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::error::ScrapeError;
use super::key::ScrapeKey;

/// Longest response head (status line and headers) accepted.
const MAX_HEAD: usize = 64 * 1024;
/// Longest chunk-size line accepted (the size and any chunk extensions).
const MAX_CHUNK_LINE: usize = 1024;
/// Room made before a read when the buffer is nearly full.
const READ_ROOM: usize = 64 * 1024;
/// How long a connection may idle in the pool before it is closed rather than reused.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// Where one replica's metrics are: the address to connect to and the request to send.
/// Its `Debug` shows the address only: the request may carry a key.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Endpoint {
    /// `host:port` (brackets around an IPv6 host): the connection pool's key.
    authority: String,
    request: Vec<u8>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("authority", &self.authority)
            .finish_non_exhaustive()
    }
}

impl Endpoint {
    /// The endpoint of `url`, which must be `http://host[:port][/path][?query]`; its request
    /// carries `key` as a bearer token when there is one.
    pub(crate) fn parse(url: &str, key: Option<&ScrapeKey>) -> Result<Endpoint, ScrapeError> {
        let bad = |why: &str| ScrapeError::Connect(format!("cannot scrape {url:?}: {why}"));
        let parsed = reqwest::Url::parse(url).map_err(|e| bad(&e.to_string()))?;
        if parsed.scheme() != "http" {
            return Err(bad("only http:// replicas are scraped"));
        }
        // IPv6 hosts come in brackets, as an authority needs them.
        let host = parsed
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| bad("no host"))?;
        let port = parsed.port().unwrap_or(80);
        let authority = format!("{host}:{port}");
        let mut target = parsed.path().to_owned();
        if let Some(q) = parsed.query() {
            target.push('?');
            target.push_str(q);
        }
        let mut request = format!(
            "GET {target} HTTP/1.1\r\nHost: {authority}\r\n\
             User-Agent: ballast-operator/{}\r\nAccept: text/plain;version=0.0.4\r\n",
            env!("CARGO_PKG_VERSION")
        );
        if let Some(key) = key {
            request.push_str("Authorization: Bearer ");
            request.push_str(key.as_str());
            request.push_str("\r\n");
        }
        request.push_str("\r\n");
        let request = request.into_bytes();
        Ok(Endpoint { authority, request })
    }
}

/// Idle keep-alive connections, at most one per replica address.
#[derive(Debug, Default)]
pub(crate) struct Connections {
    idle: Mutex<Pool>,
}

#[derive(Debug, Default)]
struct Pool {
    streams: HashMap<String, (TcpStream, Instant)>,
    swept: Option<Instant>,
}

impl Connections {
    /// A kept connection to `authority` that has not been idle too long and that the
    /// replica has not visibly closed.
    fn take(&self, authority: &str) -> Option<TcpStream> {
        let (stream, since) = self.lock().streams.remove(authority)?;
        if since.elapsed() > IDLE_TIMEOUT {
            return None;
        }
        // Nothing may arrive between responses: a readable socket is closed or broken.
        match stream.try_read(&mut [0u8; 1]) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Some(stream),
            _ => None,
        }
    }

    fn put(&self, authority: &str, stream: TcpStream) {
        let now = Instant::now();
        let mut pool = self.lock();
        pool.streams.insert(authority.to_owned(), (stream, now));
        // Replicas that went away leave their connection behind: close those now and then.
        if pool
            .swept
            .is_none_or(|t| now.duration_since(t) > IDLE_TIMEOUT / 2)
        {
            pool.streams
                .retain(|_, (_, since)| now.duration_since(*since) <= IDLE_TIMEOUT);
            pool.swept = Some(now);
        }
    }

    /// Connections kept now (for tests and metrics).
    pub(crate) fn idle(&self) -> usize {
        self.lock().streams.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pool> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Fetches `endpoint` and puts the body of a 2xx response of at most `max_body` bytes into
/// `body` (an empty, reused buffer). Never holds more than `max_body` bytes of body: a
/// larger `Content-Length` is refused before reading, and any other body is dropped (with
/// its connection) as soon as it passes the limit. The caller bounds the time.
pub(crate) async fn fetch(
    connections: &Connections,
    endpoint: &Endpoint,
    body: &mut Vec<u8>,
    max_body: usize,
) -> Result<(), ScrapeError> {
    if let Some(stream) = connections.take(&endpoint.authority) {
        match exchange(stream, endpoint, body, max_body).await {
            Ok(reuse) => return keep(connections, endpoint, reuse),
            Err(Failure::BeforeResponse(_)) => body.clear(), // closed while idle: retry
            Err(Failure::Error(e)) => return Err(e),
        }
    }
    let stream = TcpStream::connect(&endpoint.authority)
        .await
        .map_err(|e| ScrapeError::Connect(e.to_string()))?;
    let _ = stream.set_nodelay(true);
    match exchange(stream, endpoint, body, max_body).await {
        Ok(reuse) => keep(connections, endpoint, reuse),
        Err(Failure::BeforeResponse(why)) => Err(ScrapeError::Connect(why)),
        Err(Failure::Error(e)) => Err(e),
    }
}

fn keep(
    connections: &Connections,
    endpoint: &Endpoint,
    reuse: Option<TcpStream>,
) -> Result<(), ScrapeError> {
    if let Some(stream) = reuse {
        connections.put(&endpoint.authority, stream);
    }
    Ok(())
}

enum Failure {
    /// Nothing of a response arrived: the request may be sent again.
    BeforeResponse(String),
    Error(ScrapeError),
}

impl From<ScrapeError> for Failure {
    fn from(e: ScrapeError) -> Self {
        Failure::Error(e)
    }
}

fn broken(what: impl std::fmt::Display) -> Failure {
    Failure::Error(ScrapeError::Body(what.to_string()))
}

/// How the body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    Length(usize),
    Chunked,
    UntilClose,
}

/// What a response head says.
#[derive(Debug, PartialEq, Eq)]
struct Head {
    status: u16,
    framing: Framing,
    /// The connection may carry the next request.
    keep_alive: bool,
}

/// One request and its response on `stream`. Returns the stream when it can be reused.
async fn exchange(
    mut stream: TcpStream,
    endpoint: &Endpoint,
    buf: &mut Vec<u8>,
    max_body: usize,
) -> Result<Option<TcpStream>, Failure> {
    buf.clear();
    if let Err(e) = stream.write_all(&endpoint.request).await {
        return Err(Failure::BeforeResponse(e.to_string()));
    }
    // The head, and whatever of the body came with it.
    let head_len = loop {
        if let Some(end) = memchr::memmem::find(buf, b"\r\n\r\n") {
            break end + 4;
        }
        if buf.len() > MAX_HEAD {
            return Err(broken(format!(
                "response head longer than {MAX_HEAD} bytes"
            )));
        }
        match read_more(&mut stream, buf).await {
            Ok(0) if buf.is_empty() => {
                return Err(Failure::BeforeResponse(
                    "connection closed before a response".into(),
                ));
            }
            Ok(0) => return Err(broken("connection closed inside the response head")),
            Ok(_) => {}
            Err(e) if buf.is_empty() => return Err(Failure::BeforeResponse(e.to_string())),
            Err(e) => return Err(broken(e)),
        }
    };
    let head = parse_head(&buf[..head_len]).map_err(broken)?;
    if !(200..300).contains(&head.status) {
        return Err(ScrapeError::HttpStatus(head.status).into());
    }
    buf.drain(..head_len);
    let too_large = || Failure::Error(ScrapeError::TooLarge { limit: max_body });
    match head.framing {
        Framing::Length(len) => {
            if len > max_body {
                return Err(too_large());
            }
            if buf.len() > len {
                return Err(broken("more bytes than Content-Length"));
            }
            buf.reserve_exact(len - buf.len());
            while buf.len() < len {
                match stream.read_buf(buf).await {
                    Ok(0) => {
                        return Err(broken(format!(
                            "connection closed after {} of {len} bytes",
                            buf.len()
                        )));
                    }
                    Ok(_) if buf.len() > len => {
                        return Err(broken("more bytes than Content-Length"));
                    }
                    Ok(_) => {}
                    Err(e) => return Err(broken(e)),
                }
            }
        }
        Framing::Chunked => {
            let mut chunks = Dechunk::default();
            loop {
                match chunks.decode(buf).map_err(broken)? {
                    Progress::Done => break,
                    Progress::More if chunks.decoded > max_body => return Err(too_large()),
                    Progress::More => {}
                }
                match read_more(&mut stream, buf).await {
                    Ok(0) => return Err(broken("connection closed inside a chunked body")),
                    Ok(_) => {}
                    Err(e) => return Err(broken(e)),
                }
            }
            if chunks.decoded > max_body {
                return Err(too_large());
            }
        }
        Framing::UntilClose => loop {
            if buf.len() > max_body {
                return Err(too_large());
            }
            match read_more(&mut stream, buf).await {
                Ok(0) => return Ok(None),
                Ok(_) => {}
                Err(e) => return Err(broken(e)),
            }
        },
    }
    Ok(head.keep_alive.then_some(stream))
}

/// One read into the buffer's spare room, making room first when it is nearly full.
async fn read_more(stream: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<usize> {
    if buf.capacity() - buf.len() < READ_ROOM / 4 {
        buf.reserve(READ_ROOM);
    }
    stream.read_buf(buf).await
}

/// Parses a response head (status line, headers, the empty line).
fn parse_head(head: &[u8]) -> Result<Head, String> {
    let text = std::str::from_utf8(head).map_err(|_| "response head is not UTF-8".to_owned())?;
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    let http10 = match version {
        "HTTP/1.1" => false,
        "HTTP/1.0" => true,
        _ => return Err(format!("not an HTTP/1.x response: {status_line:?}")),
    };
    let status: u16 = parts
        .next()
        .filter(|s| s.len() == 3 && s.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let mut length: Option<usize> = None;
    let mut chunked = false;
    let mut close = http10;
    for line in lines.take_while(|l| !l.is_empty()) {
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| format!("bad header line {line:?}"))?;
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            let n: usize = value
                .parse()
                .map_err(|_| format!("bad Content-Length {value:?}"))?;
            if length.is_some_and(|l| l != n) {
                return Err("conflicting Content-Length headers".into());
            }
            length = Some(n);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            let last = value.rsplit(',').next().unwrap_or_default().trim();
            if !last.eq_ignore_ascii_case("chunked") || value.contains(',') {
                return Err(format!("unsupported Transfer-Encoding {value:?}"));
            }
            chunked = true;
        } else if name.eq_ignore_ascii_case("content-encoding")
            && !value.eq_ignore_ascii_case("identity")
        {
            return Err(format!("unsupported Content-Encoding {value:?}"));
        } else if name.eq_ignore_ascii_case("connection") {
            for token in value.split(',').map(str::trim) {
                if token.eq_ignore_ascii_case("close") {
                    close = true;
                } else if token.eq_ignore_ascii_case("keep-alive") && http10 {
                    close = false;
                }
            }
        }
    }
    let framing = if chunked {
        // RFC 9112 §6.3: Transfer-Encoding overrides Content-Length, and such a message
        // must not be reused.
        if length.is_some() {
            close = true;
        }
        Framing::Chunked
    } else if let Some(n) = length {
        Framing::Length(n)
    } else if status == 204 || status == 304 {
        Framing::Length(0)
    } else {
        close = true;
        Framing::UntilClose
    };
    Ok(Head {
        status,
        framing,
        keep_alive: !close,
    })
}

/// Decodes a chunked body in place: the buffer holds the decoded bytes, then the raw bytes
/// not decoded yet.
#[derive(Debug, Default)]
struct Dechunk {
    /// Decoded bytes at the buffer's start.
    decoded: usize,
    state: ChunkState,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    /// Expecting a chunk-size line.
    #[default]
    Size,
    /// Inside a chunk's data, with this many bytes to go.
    Data(usize),
    /// After a chunk's data, expecting its CRLF.
    DataEnd,
    /// After the last chunk: trailer lines up to an empty one.
    Trailer,
}

enum Progress {
    Done,
    More,
}

impl Dechunk {
    /// Decodes what `buf` holds past the decoded part; keeps an incomplete line for later.
    fn decode(&mut self, buf: &mut Vec<u8>) -> Result<Progress, String> {
        let mut pos = self.decoded;
        let result = loop {
            let raw = &buf[pos..];
            match self.state {
                ChunkState::Size | ChunkState::Trailer => {
                    let Some(eol) = memchr::memmem::find(raw, b"\r\n") else {
                        if raw.len() > MAX_CHUNK_LINE {
                            return Err("chunk-size or trailer line too long".into());
                        }
                        break Ok(Progress::More);
                    };
                    let line = &raw[..eol];
                    pos += eol + 2;
                    if self.state == ChunkState::Trailer {
                        if line.is_empty() {
                            if pos != buf.len() {
                                return Err("bytes after the chunked body".into());
                            }
                            break Ok(Progress::Done);
                        }
                        continue;
                    }
                    let size = line.split(|b| *b == b';').next().unwrap_or_default();
                    let size = std::str::from_utf8(size)
                        .ok()
                        .map(str::trim)
                        .filter(|s| !s.is_empty() && s.len() <= 15)
                        .and_then(|s| usize::from_str_radix(s, 16).ok())
                        .ok_or_else(|| "bad chunk size".to_owned())?;
                    self.state = if size == 0 {
                        ChunkState::Trailer
                    } else {
                        ChunkState::Data(size)
                    };
                }
                ChunkState::Data(left) => {
                    let n = left.min(raw.len());
                    if n == 0 {
                        break Ok(Progress::More);
                    }
                    buf.copy_within(pos..pos + n, self.decoded);
                    self.decoded += n;
                    pos += n;
                    self.state = if n == left {
                        ChunkState::DataEnd
                    } else {
                        ChunkState::Data(left - n)
                    };
                }
                ChunkState::DataEnd => {
                    if raw.len() < 2 {
                        break Ok(Progress::More);
                    }
                    if &raw[..2] != b"\r\n" {
                        return Err("chunk data not followed by CRLF".into());
                    }
                    pos += 2;
                    self.state = ChunkState::Size;
                }
            }
        };
        // Keep only the decoded bytes and the undecoded rest, side by side.
        buf.copy_within(pos.., self.decoded);
        let rest = buf.len() - pos;
        buf.truncate(self.decoded + rest);
        if matches!(result, Ok(Progress::Done)) {
            buf.truncate(self.decoded);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn head(text: &str) -> Result<Head, String> {
        parse_head(text.as_bytes())
    }

    #[test]
    fn heads() {
        let h = head("HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n").unwrap();
        assert_eq!(h.framing, Framing::Length(12));
        assert!(h.keep_alive);
        let h = head("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n").unwrap();
        assert_eq!((h.framing, h.keep_alive), (Framing::Chunked, true));
        let h = head("HTTP/1.1 200 OK\r\nConnection: close\r\ncontent-length: 1\r\n\r\n").unwrap();
        assert!(!h.keep_alive);
        let h = head("HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n").unwrap();
        assert!(!h.keep_alive);
        let h =
            head("HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 1\r\n\r\n").unwrap();
        assert!(h.keep_alive);
        let h = head("HTTP/1.1 200 OK\r\n\r\n").unwrap();
        assert_eq!((h.framing, h.keep_alive), (Framing::UntilClose, false));
        let h = head("HTTP/1.1 204 No Content\r\n\r\n").unwrap();
        assert_eq!((h.framing, h.keep_alive), (Framing::Length(0), true));
        let h = head("HTTP/1.1 500 Oops\r\ncontent-length: 3\r\n\r\n").unwrap();
        assert_eq!(h.status, 500);
        for bad in [
            "HTTP/2 200 OK\r\n\r\n",
            "HTTP/1.1 20 OK\r\n\r\n",
            "HTTP/1.1 2000 OK\r\n\r\n",
            "garbage\r\n\r\n",
            "HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\n\r\n",
        ] {
            assert!(head(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn urls() {
        let e = Endpoint::parse("http://10.0.0.7:8000/metrics", None).unwrap();
        assert_eq!(e.authority, "10.0.0.7:8000");
        assert!(
            e.request
                .starts_with(b"GET /metrics HTTP/1.1\r\nHost: 10.0.0.7:8000\r\n")
        );
        let e = Endpoint::parse("http://[::1]:9/m?x=1", None).unwrap();
        assert_eq!(e.authority, "[::1]:9");
        assert!(e.request.starts_with(b"GET /m?x=1 HTTP/1.1\r\n"));
        assert_eq!(
            Endpoint::parse("http://h/", None).unwrap().authority,
            "h:80"
        );
        for bad in [
            "https://h/metrics",
            "h:80/metrics",
            "http://",
            "ftp://h/x",
            "",
        ] {
            let e = Endpoint::parse(bad, None).unwrap_err();
            assert_eq!(e.reason(), "connect", "{bad:?}");
        }
        let text = |e: &Endpoint| String::from_utf8(e.request.clone()).unwrap();
        assert!(!text(&e_plain()).contains("Authorization"));
        let key = ScrapeKey::first_of(b"\n  k-1  \nk-2\n").unwrap();
        let e = Endpoint::parse("http://h:1/metrics", Some(&key)).unwrap();
        let request = text(&e);
        assert!(
            request.contains("\r\nAuthorization: Bearer k-1\r\n") && request.ends_with("\r\n\r\n"),
            "{request:?}"
        );
        assert_eq!(format!("{key:?}"), "ScrapeKey(redacted)");
        for bad in ["", "two words", "caf\u{e9}", &"k".repeat(4097)] {
            assert!(ScrapeKey::new(bad).is_none(), "{bad:?}");
        }
        assert!(ScrapeKey::first_of(b" \n\n").is_none());
    }

    fn e_plain() -> Endpoint {
        Endpoint::parse("http://h:1/metrics", None).unwrap()
    }

    /// Decodes `raw` fed in pieces cut at `cuts`; returns the body or the error.
    fn dechunk(raw: &[u8], cuts: &[usize]) -> Result<Vec<u8>, String> {
        let mut buf = Vec::new();
        let mut d = Dechunk::default();
        let mut at = 0;
        let mut ends: Vec<usize> = cuts.iter().map(|c| c % (raw.len() + 1)).collect();
        ends.push(raw.len());
        ends.sort_unstable();
        for end in ends {
            if end < at {
                continue;
            }
            buf.extend_from_slice(&raw[at..end]);
            at = end;
            if let Progress::Done = d.decode(&mut buf)? {
                return Ok(buf);
            }
        }
        Err("incomplete".into())
    }

    fn chunked(body: &[u8], sizes: &[usize]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut rest = body;
        let mut sizes = sizes.iter().cycle();
        while !rest.is_empty() {
            let n = (*sizes.next().unwrap_or(&1)).clamp(1, rest.len());
            out.extend_from_slice(format!("{n:x};ext=1\r\n").as_bytes());
            out.extend_from_slice(&rest[..n]);
            out.extend_from_slice(b"\r\n");
            rest = &rest[n..];
        }
        out.extend_from_slice(b"0\r\nTrailer: x\r\n\r\n");
        out
    }

    #[test]
    fn broken_chunking_is_an_error() {
        assert!(dechunk(b"zz\r\n", &[]).is_err());
        assert!(dechunk(b"3\r\nabcX\r\n0\r\n\r\n", &[]).is_err());
        assert!(dechunk(b"0\r\n\r\nextra", &[]).is_err());
        assert!(dechunk(&[b'1'; 2000], &[]).is_err());
        assert_eq!(dechunk(b"3\r\nabc", &[]), Err("incomplete".into()));
    }

    proptest! {
        #[test]
        fn chunked_bodies_decode_whatever_the_reads(
            body in prop::collection::vec(any::<u8>(), 0..3000),
            sizes in prop::collection::vec(1usize..700, 1..8),
            cuts in prop::collection::vec(any::<usize>(), 0..12),
        ) {
            let raw = chunked(&body, &sizes);
            prop_assert_eq!(dechunk(&raw, &cuts), Ok(body));
        }
    }
}
