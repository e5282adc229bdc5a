//! The connections: an accept loop over hyper-util's HTTP/1 + HTTP/2 builder, with what
//! `axum::serve` has no knobs for: a cap on open connections, and header and idle
//! timeouts (the body's limits are the handlers', with [`crate::read_body`]).
//!
//! The timeouts are kept here, per connection, rather than by hyper: hyper 1.x's
//! `header_read_timeout` also starts at the end of each response, so it would bound the
//! keep-alive idle wait to the header timeout; and it does not cover the auto builder's
//! protocol detection (the first bytes, read before hyper's HTTP/1 code runs), so a
//! client that sends one byte and stops would be held forever. Here:
//!
//! - a connection's first request head must be complete within the header timeout of
//!   the connection's start;
//! - between requests, a connection that sends nothing is closed after the idle timeout,
//!   and once a byte of the next HTTP/1 request head arrives it has the header timeout
//!   from that byte (HTTP/2 connections, whose pings and window updates are no request,
//!   get the idle timeout only);
//! - a request in flight is never timed out here: its body has the body timeout (the
//!   handlers, [`crate::read_body`]), its response takes what it takes.
//!
//! The cap: at [`HttpLimits::max_connections`], a new connection makes room by closing the open one
//! that has waited longest without a request that has been fully received (idle, or
//! still sending its head or body). A connection whose request is being answered is
//! never closed for room; when every connection is answering one, the new connection is
//! closed at once. So a flood of slow clients (slow-loris) cannot lock out a normal
//! client, whose request, sent whole, is served the moment it arrives.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use futures::task::AtomicWaker;
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinSet;
use tokio::time::{Instant, Sleep};
use tower::ServiceExt;

use crate::files::{effective_cap, open_files_limit};
use crate::limits::HttpLimits;

/// Largest request head (request line and headers; HTTP/1 answers 431 beyond it, as
/// hyper does when its read buffer is full). Real heads are well under 8 KiB; 32 KiB
/// leaves room for large bearer tokens and tracing headers while bounding what a
/// slow-loris connection can make the server hold.
pub const MAX_HEAD_BYTES: usize = 32 << 10;

/// What one connection's timers and the cap look at: written by the connection's own
/// task (bytes read) and by its requests (which, on HTTP/2, run in tasks of their own).
struct ConnState {
    /// Requests whose response has not ended (high 16 bits) and, in microseconds since
    /// the server's start, when that count last became zero, or the connection's start
    /// (low 48 bits): one word, so the two are always read together.
    open_since: AtomicU64,
    /// Microseconds since the server's start of the first byte read while no request was
    /// open; current only when later than the `since` of `open_since`.
    first_byte: AtomicU64,
    /// A request has been seen.
    served: AtomicBool,
    /// The connection speaks HTTP/2.
    h2: AtomicBool,
    /// Requests fully received or being answered: such a connection is not closed for room.
    active: AtomicU32,
    /// [`GRACEFUL`] and [`EVICT`].
    flags: AtomicU8,
    /// The connection's task, woken when a request ends or a flag is set.
    waker: AtomicWaker,
}

/// Close after the response in progress (idle connections at once; HTTP/2 gets a GOAWAY).
const GRACEFUL: u8 = 1;
/// Close now to make room, unless a request became active meanwhile.
const EVICT: u8 = 2;

const SINCE_BITS: u32 = 48;
const SINCE_MASK: u64 = (1 << SINCE_BITS) - 1;

/// A consistent reading of a connection's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Snapshot {
    open: u64,
    since: u64,
    first_byte: Option<u64>,
    served: bool,
    h2: bool,
}

impl ConnState {
    fn new(now: u64) -> ConnState {
        ConnState {
            open_since: AtomicU64::new(now & SINCE_MASK),
            first_byte: AtomicU64::new(0),
            served: AtomicBool::new(false),
            h2: AtomicBool::new(false),
            active: AtomicU32::new(0),
            flags: AtomicU8::new(0),
            waker: AtomicWaker::new(),
        }
    }

    fn snapshot(&self) -> Snapshot {
        let word = self.open_since.load(Ordering::Acquire);
        let since = word & SINCE_MASK;
        let first = self.first_byte.load(Ordering::Acquire);
        Snapshot {
            open: word >> SINCE_BITS,
            since,
            first_byte: (first > since).then_some(first),
            served: self.served.load(Ordering::Acquire),
            h2: self.h2.load(Ordering::Acquire),
        }
    }

    fn request_opened(&self, h2: bool) {
        self.served.store(true, Ordering::Release);
        if h2 {
            self.h2.store(true, Ordering::Release);
        }
        self.open_since.fetch_add(1 << SINCE_BITS, Ordering::AcqRel);
    }

    fn request_closed(&self, now: u64) {
        let _ = self
            .open_since
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| {
                Some(match word >> SINCE_BITS {
                    0 => word,
                    1 => now & SINCE_MASK,
                    _ => word - (1 << SINCE_BITS),
                })
            });
        self.waker.wake();
    }

    /// Bytes arrived: the first while no request is open starts the header timeout.
    fn bytes_read(&self, now: impl FnOnce() -> u64) {
        let word = self.open_since.load(Ordering::Acquire);
        if word >> SINCE_BITS == 0 && self.first_byte.load(Ordering::Acquire) <= word & SINCE_MASK {
            self.first_byte.store(now(), Ordering::Release);
        }
    }

    fn flag(&self, flag: u8) {
        self.flags.fetch_or(flag, Ordering::AcqRel);
        self.waker.wake();
    }
}

/// When a connection in state `s` is closed for taking too long, in microseconds since
/// the server's start; `None` while a request is open.
fn deadline(s: Snapshot, limits: &Limits) -> Option<u64> {
    if s.open > 0 {
        return None;
    }
    Some(if !s.served {
        s.since + limits.header_us
    } else if s.h2 {
        s.since + limits.idle_us
    } else {
        match s.first_byte {
            Some(t) => t + limits.header_us,
            None => s.since + limits.idle_us,
        }
    })
}

/// The connection to close to make room: of those with no active request and not being
/// closed already, the one that has waited longest.
fn choose_victim<'a>(
    conns: impl Iterator<Item = (&'a u64, &'a Arc<ConnState>)>,
) -> Option<(u64, Arc<ConnState>)> {
    conns
        .filter(|(_, c)| {
            c.active.load(Ordering::Acquire) == 0 && c.flags.load(Ordering::Acquire) & EVICT == 0
        })
        .min_by_key(|(_, c)| c.open_since.load(Ordering::Acquire) & SINCE_MASK)
        .map(|(id, c)| (*id, Arc::clone(c)))
}

#[derive(Debug, Clone, Copy)]
struct Limits {
    cap: usize,
    header_us: u64,
    idle_us: u64,
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros())
        .unwrap_or(u64::MAX)
        .min(SINCE_MASK)
}

#[derive(Default)]
struct Registry {
    next_id: u64,
    conns: HashMap<u64, Arc<ConnState>>,
    /// Connections flagged [`EVICT`] and not gone yet.
    evicting: usize,
}

struct Shared {
    start: Instant,
    limits: Limits,
    registry: Mutex<Registry>,
    builder: auto::Builder<TokioExecutor>,
}

impl Shared {
    fn now(&self) -> u64 {
        micros(self.start.elapsed())
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a new connection, first making room when at the cap; `None` when no
    /// room can be made.
    fn admit(&self) -> Option<(u64, Arc<ConnState>)> {
        let mut reg = self.registry();
        if reg.conns.len() - reg.evicting >= self.limits.cap {
            let (_, victim) = choose_victim(reg.conns.iter())?;
            victim.flag(EVICT);
            reg.evicting += 1;
        }
        let id = reg.next_id;
        reg.next_id += 1;
        let conn = Arc::new(ConnState::new(self.now()));
        reg.conns.insert(id, Arc::clone(&conn));
        Some((id, conn))
    }

    /// An evicted connection turned out to be answering a request: it stays.
    fn spare(&self, conn: &ConnState) {
        let mut reg = self.registry();
        if conn.flags.fetch_and(!EVICT, Ordering::AcqRel) & EVICT != 0 {
            reg.evicting -= 1;
        }
    }

    fn remove(&self, id: u64) {
        let mut reg = self.registry();
        if let Some(conn) = reg.conns.remove(&id)
            && conn.flags.load(Ordering::Acquire) & EVICT != 0
        {
            reg.evicting -= 1;
        }
    }

    fn flag_all(&self, flag: u8) {
        for conn in self.registry().conns.values() {
            conn.flag(flag);
        }
    }

    /// Flags the connections that have served a request.
    fn flag_served(&self, flag: u8) {
        for conn in self.registry().conns.values() {
            if conn.served.load(Ordering::Acquire) {
                conn.flag(flag);
            }
        }
    }
}

/// The server: its accept loop runs until [`Connections::stop`].
pub struct Connections {
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<Duration>>,
    task: tokio::task::JoinHandle<bool>,
}

impl Connections {
    /// Starts accepting on `listener`, serving `app` on every connection.
    pub fn start(listener: TcpListener, app: Router, limits: &HttpLimits) -> Connections {
        Connections::start_with(listener, Plain(app), limits)
    }

    /// Starts accepting on `listener`, each connection first going through `accept` (a
    /// TLS handshake, say), which also picks the router that serves it.
    pub fn start_with<A: Accept>(
        listener: TcpListener,
        accept: A,
        limits: &HttpLimits,
    ) -> Connections {
        let cap = effective_cap(limits.max_connections, open_files_limit());
        if cap < limits.max_connections {
            tracing::warn!(
                max_connections = limits.max_connections,
                lowered_to = cap,
                open_files_limit = open_files_limit(),
                "the connection cap lowered to what the open-files limit allows (ulimit -n)"
            );
        }
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            // Timeouts are this module's (see its docs); hyper's default would apply 30 s.
            .header_read_timeout(None)
            .max_buf_size(MAX_HEAD_BYTES);
        builder.http2().max_header_list_size(MAX_HEAD_BYTES as u32);
        let shared = Arc::new(Shared {
            start: Instant::now(),
            limits: Limits {
                cap,
                header_us: micros(limits.header_timeout),
                idle_us: micros(limits.idle_timeout),
            },
            registry: Mutex::default(),
            builder,
        });
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(accept_loop(
            listener,
            Arc::clone(&shared),
            Arc::new(accept),
            stopped,
        ));
        Connections {
            shared,
            stop: Some(stop),
            task,
        }
    }

    /// The connection cap in effect.
    pub fn cap(&self) -> usize {
        self.shared.limits.cap
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.shared.registry().conns.len()
    }

    /// Closes the connections open now that have served a request, once their response
    /// in progress is sent: idle ones at once, HTTP/2 ones with a GOAWAY. A connection
    /// still on its first request is left to be answered (a client that just connected
    /// has sent, or is sending, a request it expects an answer to; the header timeout
    /// bounds it), as are connections accepted later.
    pub fn close_open(&self) {
        self.shared.flag_served(GRACEFUL);
    }

    /// Stops accepting (the port closes), closes every connection gracefully and waits up
    /// to `grace` for them; any still open then are dropped. Returns whether some were.
    pub async fn stop(mut self, grace: Duration) -> io::Result<bool> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(grace);
        }
        (&mut self.task).await.map_err(io::Error::other)
    }
}

async fn accept_loop<A: Accept>(
    listener: TcpListener,
    shared: Arc<Shared>,
    accept: Arc<A>,
    mut stop: oneshot::Receiver<Duration>,
) -> bool {
    let mut tasks = JoinSet::new();
    let mut refused = Refused::default();
    let grace = loop {
        tokio::select! {
            biased;
            grace = &mut stop => break grace.unwrap_or(Duration::ZERO),
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => {
                    // Tokens stream as small writes: send each at once.
                    let _ = tcp.set_nodelay(true);
                    match shared.admit() {
                        Some((id, conn)) => {
                            tasks.spawn(serve_connection(Arc::clone(&shared), id, conn, tcp, Arc::clone(&accept)));
                        }
                        None => refused.note(shared.limits.cap),
                    }
                }
                // The peer gave up before we accepted: nothing to do.
                Err(e) if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionAborted
                        | io::ErrorKind::ConnectionReset
                        | io::ErrorKind::ConnectionRefused
                ) => {}
                // Out of file descriptors, most likely: wait for some to be closed.
                Err(e) => {
                    tracing::error!("accept error: {e}");
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                        grace = &mut stop => break grace.unwrap_or(Duration::ZERO),
                    }
                }
            }
        }
    };
    drop(listener);
    shared.flag_all(GRACEFUL);
    let all_closed =
        tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} })
            .await
            .is_ok();
    if !all_closed {
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
    }
    !all_closed
}

/// Logs refused connections without flooding: the first, then a count every 10 s.
#[derive(Default)]
struct Refused {
    since_log: u64,
    last_log: Option<Instant>,
}

impl Refused {
    fn note(&mut self, cap: usize) {
        self.since_log += 1;
        if self
            .last_log
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(10))
        {
            tracing::warn!(
                refused = self.since_log,
                max_connections = cap,
                "connections refused: all {cap} are answering requests (--max-connections)"
            );
            self.since_log = 0;
            self.last_log = Some(Instant::now());
        }
    }
}

/// How a connection ended.
enum End {
    Closed,
    TimedOut,
    Evicted,
}

/// Deregisters a connection however its task ends (aborted included).
struct Registered {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.shared.remove(self.id);
    }
}

async fn serve_connection<A: Accept>(
    shared: Arc<Shared>,
    id: u64,
    conn: Arc<ConnState>,
    tcp: TcpStream,
    accept: Arc<A>,
) {
    let _registered = Registered {
        shared: Arc::clone(&shared),
        id,
    };
    // The accept step (a TLS handshake) counts against the header timeout of the
    // connection's start, and ends early when the connection is closed for room or the
    // server stops.
    let closed = std::future::poll_fn(|cx| {
        conn.waker.register(cx.waker());
        if conn.flags.load(Ordering::Acquire) & (EVICT | GRACEFUL) != 0 {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    });
    let header = Duration::from_micros(shared.limits.header_us);
    let (stream, app) = tokio::select! {
        accepted = tokio::time::timeout(header, accept.accept(tcp)) => match accepted {
            Ok(Ok(accepted)) => accepted,
            Ok(Err(e)) => {
                tracing::debug!(connection = id, error = %e, "connection refused by its accept step");
                return;
            }
            Err(_) => {
                tracing::debug!(connection = id, "accept step timed out");
                return;
            }
        },
        () = closed => return,
    };
    let io = TokioIo::new(CountingIo {
        tcp: stream,
        conn: Arc::clone(&conn),
        shared: Arc::clone(&shared),
    });
    let service = ConnService {
        app,
        conn: Arc::clone(&conn),
        shared: Arc::clone(&shared),
    };
    let builder = &shared.builder;
    let mut http = std::pin::pin!(builder.serve_connection(io, service));
    let mut timer: Option<Pin<Box<Sleep>>> = None;
    let mut graceful = false;
    let end = std::future::poll_fn(|cx| {
        conn.waker.register(cx.waker());
        let flags = conn.flags.load(Ordering::Acquire);
        if flags & EVICT != 0 {
            if conn.active.load(Ordering::Acquire) == 0 {
                return Poll::Ready(End::Evicted);
            }
            shared.spare(&conn);
        }
        if flags & GRACEFUL != 0 && !graceful {
            graceful = true;
            http.as_mut().graceful_shutdown();
        }
        if http.as_mut().poll(cx).is_ready() {
            return Poll::Ready(End::Closed);
        }
        loop {
            let Some(due) = deadline(conn.snapshot(), &shared.limits) else {
                timer = None;
                return Poll::Pending;
            };
            let at = shared.start + Duration::from_micros(due);
            let t = match &mut timer {
                Some(t) => {
                    if t.deadline() != at {
                        t.as_mut().reset(at);
                    }
                    t
                }
                None => timer.insert(Box::pin(tokio::time::sleep_until(at))),
            };
            if t.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            // Due, unless a request or a byte moved the deadline meanwhile.
            if deadline(conn.snapshot(), &shared.limits) == Some(due) {
                return Poll::Ready(End::TimedOut);
            }
        }
    })
    .await;
    match end {
        End::Closed => {}
        End::TimedOut => tracing::debug!(connection = id, "connection timed out"),
        End::Evicted => tracing::debug!(connection = id, "connection closed to make room"),
    }
}

/// What [`Connections::start_with`] does with each new connection before HTTP: a TLS
/// handshake, say. It returns the stream HTTP runs on and the router that serves this
/// connection (which may depend on what the handshake learnt, such as a client
/// certificate). It runs within the header timeout of the connection's start.
pub trait Accept: Send + Sync + 'static {
    /// The stream HTTP runs on.
    type Io: AsyncRead + AsyncWrite + Send + Unpin + 'static;

    /// Turns an accepted TCP connection into a stream and its router; an error closes it.
    fn accept(&self, tcp: TcpStream) -> BoxFuture<io::Result<(Self::Io, Router)>>;
}

/// A future an [`Accept`] returns.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Plain TCP, one router for all.
struct Plain(Router);

impl Accept for Plain {
    type Io = TcpStream;

    fn accept(&self, tcp: TcpStream) -> BoxFuture<io::Result<(TcpStream, Router)>> {
        let app = self.0.clone();
        Box::pin(async move { Ok((tcp, app)) })
    }
}

/// The stream, noting when bytes arrive.
struct CountingIo<T> {
    tcp: T,
    conn: Arc<ConnState>,
    shared: Arc<Shared>,
}

impl<T: AsyncRead + Unpin> AsyncRead for CountingIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.tcp).poll_read(cx, buf);
        if matches!(poll, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            let shared = &self.shared;
            self.conn.bytes_read(|| shared.now());
        }
        poll
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for CountingIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

/// The router, with each request's life noted in its connection's state.
#[derive(Clone)]
struct ConnService {
    app: Router,
    conn: Arc<ConnState>,
    shared: Arc<Shared>,
}

impl hyper::service::Service<Request<Incoming>> for ConnService {
    type Response = Response<TrackedBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        self.conn
            .request_opened(req.version() == hyper::Version::HTTP_2);
        let mark = Arc::new(RequestMark {
            conn: Arc::clone(&self.conn),
            active: AtomicBool::new(false),
        });
        let guard = RequestGuard {
            mark: Arc::clone(&mark),
            shared: Arc::clone(&self.shared),
        };
        let (parts, body) = req.into_parts();
        if body.is_end_stream() {
            mark.activate();
        }
        let req = Request::from_parts(
            parts,
            Body::new(ReceivedBody {
                inner: body,
                mark: Some(mark),
            }),
        );
        let app = self.app.clone();
        Box::pin(async move {
            let resp = match app.oneshot(req).await {
                Ok(resp) => resp,
                Err(never) => match never {},
            };
            guard.mark.activate();
            Ok(resp.map(|inner| TrackedBody {
                inner,
                guard: Some(guard),
            }))
        })
    }
}

/// One request's standing on its connection.
struct RequestMark {
    conn: Arc<ConnState>,
    active: AtomicBool,
}

impl RequestMark {
    /// The request was fully received, or its answer began: its connection is no longer
    /// closed for room.
    fn activate(&self) {
        if !self.active.swap(true, Ordering::AcqRel) {
            self.conn.active.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// Ends a request when dropped: when its response body ended or was dropped, or when
/// the request was dropped before it had a response (the connection went away).
struct RequestGuard {
    mark: Arc<RequestMark>,
    shared: Arc<Shared>,
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        if self.mark.active.load(Ordering::Acquire) {
            self.mark.conn.active.fetch_sub(1, Ordering::AcqRel);
        }
        self.mark.conn.request_closed(self.shared.now());
    }
}

/// The request body, activating its request when it has been received whole.
struct ReceivedBody {
    inner: Incoming,
    mark: Option<Arc<RequestMark>>,
}

impl HttpBody for ReceivedBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let poll = Pin::new(&mut self.inner).poll_frame(cx);
        let done = match &poll {
            Poll::Ready(None) => true,
            Poll::Ready(Some(Ok(_))) => self.inner.is_end_stream(),
            _ => false,
        };
        if done && let Some(mark) = self.mark.take() {
            mark.activate();
        }
        poll
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The response body, ending its request when it ends or is dropped.
struct TrackedBody {
    inner: Body,
    guard: Option<RequestGuard>,
}

impl HttpBody for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let poll = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(poll, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            self.guard = None;
        }
        poll
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        cap: 4,
        header_us: 10_000_000,
        idle_us: 120_000_000,
    };

    fn snap(open: u64, since: u64, first_byte: Option<u64>, served: bool, h2: bool) -> Snapshot {
        Snapshot {
            open,
            since,
            first_byte,
            served,
            h2,
        }
    }

    #[test]
    fn deadlines_follow_the_module_rules() {
        // The first request: the header timeout from the connection's start, bytes or not.
        assert_eq!(
            deadline(snap(0, 5, None, false, false), &LIMITS),
            Some(10_000_005)
        );
        assert_eq!(
            deadline(snap(0, 5, Some(7_000_000), false, false), &LIMITS),
            Some(10_000_005)
        );
        // Between requests: idle until a byte comes, then the header timeout from it.
        assert_eq!(
            deadline(snap(0, 5, None, true, false), &LIMITS),
            Some(120_000_005)
        );
        assert_eq!(
            deadline(snap(0, 5, Some(50_000_000), true, false), &LIMITS),
            Some(60_000_000)
        );
        // HTTP/2 frames are no request head.
        assert_eq!(
            deadline(snap(0, 5, Some(50_000_000), true, true), &LIMITS),
            Some(120_000_005)
        );
        // A request in flight is never timed out here.
        assert_eq!(deadline(snap(1, 5, None, true, false), &LIMITS), None);
        assert_eq!(deadline(snap(3, 5, None, false, true), &LIMITS), None);
    }

    #[test]
    fn the_state_word_counts_requests_and_restarts_the_wait() {
        let c = ConnState::new(100);
        assert_eq!(c.snapshot(), snap(0, 100, None, false, false));
        c.bytes_read(|| 150);
        assert_eq!(c.snapshot().first_byte, Some(150));
        c.request_opened(false);
        c.request_opened(false);
        assert_eq!(c.snapshot().open, 2);
        // Bytes while a request is open do not count.
        c.request_closed(400);
        assert_eq!(c.snapshot(), snap(1, 100, Some(150), true, false));
        c.request_closed(500);
        // The wait restarts; the old first byte is no longer current.
        assert_eq!(c.snapshot(), snap(0, 500, None, true, false));
        c.bytes_read(|| 600);
        c.bytes_read(|| 700);
        assert_eq!(c.snapshot().first_byte, Some(600), "the first byte counts");
        // Closing more than opened never wraps.
        c.request_closed(800);
        assert_eq!(c.snapshot().open, 0);
    }

    #[test]
    fn the_victim_is_the_longest_waiting_connection_without_an_active_request() {
        let conns: HashMap<u64, Arc<ConnState>> = [(1, 300), (2, 100), (3, 200), (4, 50)]
            .into_iter()
            .map(|(id, since)| (id, Arc::new(ConnState::new(since))))
            .collect();
        assert_eq!(choose_victim(conns.iter()).unwrap().0, 4);
        conns[&4].active.store(1, Ordering::Release);
        assert_eq!(choose_victim(conns.iter()).unwrap().0, 2, "active: kept");
        conns[&2].flags.store(EVICT, Ordering::Release);
        assert_eq!(choose_victim(conns.iter()).unwrap().0, 3, "being closed");
        conns[&3].active.store(2, Ordering::Release);
        conns[&1].active.store(1, Ordering::Release);
        assert!(choose_victim(conns.iter()).is_none(), "every one answering");
    }

    #[tokio::test]
    async fn close_open_closes_served_idle_connections_and_answers_new_ones() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let server = Connections::start(listener, app, &HttpLimits::default());
        let get = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        // `served`: one request answered, then idle on keep-alive.
        let mut served = TcpStream::connect(addr).await.unwrap();
        served.write_all(get).await.unwrap();
        let mut buf = vec![0u8; 1024];
        let n = served.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
        // `fresh`: connected, its request not sent yet.
        let mut fresh = TcpStream::connect(addr).await.unwrap();
        while server.open() < 2 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        server.close_open();
        let closed = tokio::time::timeout(Duration::from_secs(2), served.read(&mut buf)).await;
        assert!(
            matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
            "the served, idle connection is closed"
        );
        // The fresh one still gets its answer.
        tokio::time::sleep(Duration::from_millis(100)).await;
        fresh.write_all(get).await.unwrap();
        let n = tokio::time::timeout(Duration::from_secs(2), fresh.read(&mut buf))
            .await
            .expect("an answer")
            .unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", &buf[..n]);
        server.stop(Duration::from_secs(1)).await.unwrap();
    }
}
