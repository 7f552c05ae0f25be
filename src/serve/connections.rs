//! The local server's HTTP/1.1 connections, with limits a slow, idle or greedy client cannot
//! outlast:
//!
//! - A request's head must arrive within the header timeout (which also closes a keep-alive
//!   connection idle that long), and be at most [`MAX_REQUEST_LINE`] for its first line and
//!   [`MAX_HEAD`] and [`MAX_HEADERS`] in all; a larger one is answered in the API's own error
//!   shape (414, 431) before hyper, whose refusals have no body, parses it.
//! - A body must arrive within the body timeout once its head is in; it is read only by a
//!   handler that wants it, after the caller is authenticated, so a request without a valid
//!   token costs no more than its head. An answer given without reading the whole body ends the
//!   connection.
//! - At most `max_connections` are open. When all are, the one idle the longest between
//!   requests (or not yet sent one) is closed to admit the next, as nginx does with reusable
//!   connections: cheap keep-alive traffic cannot keep a new client out. Idle means its socket
//!   was found with nothing to read, at least [`IDLE_BEFORE_CLOSED`] ago: a new connection
//!   whose request a busy server has not read yet is not idle. A connection in the middle of a
//!   request is never cut; with none idle, the next one waits in the listen backlog until one
//!   ends.
//! - A connection whose request waits (a long-poll, an MCP call held for a person) lends its
//!   slot back for the wait ([`ConnectionSlot`]): the waiting requests are bounded by the
//!   API's waiting slots instead, and never keep another client out. Once its wait is over it
//!   takes a slot again, or, with none free, ends after its answer.

use std::collections::HashMap;
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::{HeaderValue, Request, Response, header};
use axum::response::IntoResponse;
use hyper::body::{Body, Bytes, Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use shared::api::ApiError;
use shared::api::extract::BodyLate;
use shared::api::waiting::{ConnectionSlot, LendSlot};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, watch};

/// The longest request line taken (method, path and version); a longer one is a 414. No path of
/// the API is nearly as long.
pub const MAX_REQUEST_LINE: usize = 8 * 1024;
/// The largest request head taken (request line and headers); a larger one is a 431.
pub const MAX_HEAD: usize = 32 * 1024;
/// The most headers a request may have (hyper's own limit); more is a 431.
pub const MAX_HEADERS: usize = 100;
/// How long a connection must have sat idle before it is closed to admit another: a client
/// that just connected most likely sends its request at once, which a busy server may not
/// read for a while, and a burst of new clients would otherwise close one another.
pub const IDLE_BEFORE_CLOSED: Duration = Duration::from_millis(500);
/// How long a connection that ends without reading all it was sent goes on reading (and
/// dropping) the rest: closing on unread bytes resets the connection, which may lose the answer
/// before the client reads it.
const LINGER: Duration = Duration::from_secs(2);

/// How long a client has for what, and how many connections may be open at once.
pub struct Limits {
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub max_connections: u32,
}

/// Serves `app` on the connections `listener` accepts, within `limits`, until `stop` completes;
/// then lets each connection finish the request it is serving and waits for them.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    stop: impl Future<Output = ()>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections as usize));
    let connections = Arc::new(Connections::new(slots.clone()));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        // Only a head this server did not follow (one sent before the previous answer) gets
        // this far; hyper refuses it, without a body.
        .max_header_size(2 * MAX_HEAD);
    tokio::pin!(stop);
    'accepting: loop {
        let (stream, peer) = tokio::select! {
            () = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: wait a little, as a busy server should.
                    tracing::warn!(%error, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => loop {
                let again_in = connections.make_room();
                tokio::select! {
                    () = &mut stop => break 'accepting,
                    slot = slots.clone().acquire_owned() => {
                        break slot.expect("the semaphore is never closed");
                    }
                    // Another connection went idle: if the one asked to close did not, this may.
                    () = connections.went_idle.notified() => {}
                    // The one idle the longest has now sat idle long enough to be closed.
                    () = tokio::time::sleep(again_in.unwrap_or_default()), if again_in.is_some() => {}
                }
            },
        };
        let watch = connections.open(slot);
        let exchange = Exchange {
            app: TowerToHyperService::new(app.clone()),
            watch: watch.clone(),
            lent: ConnectionSlot(Arc::new(Lender(watch.clone()))),
            body_timeout: limits.body_timeout,
        };
        let io = TokioIo::new(Watched {
            stream,
            watch: watch.clone(),
            refused: false,
        });
        let connection = http.serve_connection(io, exchange);
        tokio::spawn(run(connection, watch, peer, stop_rx.clone()));
    }
    drop(listener);
    let _ = stop_tx.send(true);
    connections.all_ended().await;
}

type Connection = http1::Connection<TokioIo<Watched>, Exchange>;

/// Runs one connection to its end: asked to close, it closes once idle (at once if it is); at a
/// refused head, it answers in the API's shape itself.
async fn run(
    mut connection: Connection,
    watch: Arc<Watch>,
    peer: SocketAddr,
    mut stop: watch::Receiver<bool>,
) {
    let _registered = Registered(watch.clone());
    let mut closing = false;
    let ended = loop {
        tokio::select! {
            ended = std::future::poll_fn(|cx| connection.poll_without_shutdown(cx)) => break ended,
            () = watch.wake.notified() => {
                if watch.refusal().is_some() {
                    break Ok(());
                }
                if !closing {
                    Pin::new(&mut connection).graceful_shutdown();
                    closing = true;
                }
            }
            _ = stop.changed(), if !closing => {
                Pin::new(&mut connection).graceful_shutdown();
                closing = true;
            }
        }
    };
    if let Err(error) = ended {
        tracing::debug!(%peer, %error, "connection closed");
    }
    if watch.refusal().is_some() {
        // The refused head may have come before hyper sent the previous answer whole.
        let sent = std::future::poll_fn(|cx| match connection.poll_without_shutdown(cx) {
            Poll::Pending if watch.unflushed.load(Ordering::Acquire) => Poll::Pending,
            _ => Poll::Ready(()),
        });
        let _ = tokio::time::timeout(LINGER, sent).await;
    }
    let mut stream = connection.into_parts().io.into_inner().stream;
    match watch.refusal() {
        Some(refusal) => {
            tracing::debug!(%peer, ?refusal, "request head refused");
            if let Err(error) = write_answer(&mut stream, refusal.error()).await {
                tracing::debug!(%peer, %error, "cannot answer a refused head");
            }
            close_lingering(stream).await;
        }
        None if watch.body_unread.load(Ordering::Acquire) => close_lingering(stream).await,
        None => {
            let _ = stream.shutdown().await;
        }
    }
}

/// Writes `error` as a whole HTTP/1.1 answer that ends the connection.
async fn write_answer(stream: &mut TcpStream, error: ApiError) -> io::Result<()> {
    let (parts, body) = error.into_response().into_parts();
    let body = axum::body::to_bytes(body, usize::MAX)
        .await
        .unwrap_or_default();
    let status = parts.status;
    let mut head = format!(
        "HTTP/1.1 {} {}\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or_default()
    );
    for (name, value) in &parts.headers {
        if let Ok(value) = value.to_str() {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
    }
    head.push_str(&format!(
        "content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    ));
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(&body).await?;
    stream.flush().await
}

/// Ends the connection, reading and dropping what the client still sends for up to [`LINGER`],
/// so that unread bytes do not turn the close into a reset the answer may be lost to.
async fn close_lingering(mut stream: TcpStream) {
    let _ = stream.shutdown().await;
    let mut sink = [0u8; 16 * 1024];
    let drain = async { while let Ok(1..) = stream.read(&mut sink).await {} };
    let _ = tokio::time::timeout(LINGER, drain).await;
}

/// The open connections, for the accept loop to find the one idle the longest.
struct Connections {
    open: Mutex<HashMap<u64, Arc<Watch>>>,
    next_id: AtomicU64,
    /// Notified whenever a connection goes idle.
    went_idle: Arc<Notify>,
    /// Notified whenever a connection ends.
    ended: Notify,
    /// The connection slots; each open connection holds one, except while its request waits.
    slots: Arc<Semaphore>,
}

impl Connections {
    fn new(slots: Arc<Semaphore>) -> Self {
        Self {
            open: Mutex::default(),
            next_id: AtomicU64::default(),
            went_idle: Arc::default(),
            ended: Notify::new(),
            slots,
        }
    }

    /// A new connection's watch, holding `slot`, registered until its task drops its
    /// [`Registered`].
    fn open(self: &Arc<Self>, slot: OwnedSemaphorePermit) -> Arc<Watch> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let watch = Arc::new(Watch {
            id,
            slot: Mutex::new(Some(slot)),
            phase: Mutex::new(Phase::Idle(Instant::now())),
            silent: Mutex::new(None),
            wake: Notify::new(),
            close_asked: AtomicBool::new(false),
            refused: Mutex::new(None),
            body_unread: AtomicBool::new(false),
            unflushed: AtomicBool::new(false),
            connections: Arc::downgrade(self),
        });
        lock(&self.open).insert(id, watch.clone());
        watch
    }

    /// Once every connection has ended (those lending their slot to a wait included).
    async fn all_ended(&self) {
        loop {
            let ended = self.ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if lock(&self.open).is_empty() {
                return;
            }
            ended.await;
        }
    }

    /// Asks the connection idle the longest to close, unless one asked already is still idle
    /// (it is closing now). With none idle, nothing: each busy one ends in its time. When the
    /// one idle the longest has not sat idle for [`IDLE_BEFORE_CLOSED`] yet, how long until it
    /// has.
    fn make_room(&self) -> Option<Duration> {
        let open = lock(&self.open);
        let idle = || {
            open.values()
                .filter_map(|watch| watch.idle_since().map(|since| (since, watch)))
        };
        if idle().any(|(_, watch)| watch.close_asked.load(Ordering::Acquire)) {
            return None;
        }
        let (since, oldest) = idle().min_by_key(|(since, _)| *since)?;
        let idle_for = since.elapsed();
        if idle_for < IDLE_BEFORE_CLOSED {
            return Some(IDLE_BEFORE_CLOSED - idle_for);
        }
        tracing::debug!(
            ?idle_for,
            "all connections are open: closing the one idle the longest"
        );
        oldest.close_asked.store(true, Ordering::Release);
        oldest.wake.notify_one();
        None
    }
}

/// Where one connection stands between requests, and what its task is asked to do.
struct Watch {
    id: u64,
    /// Its connection slot; none while its request waits, or once the wait is over and no
    /// slot was free (it ends after its answer).
    slot: Mutex<Option<OwnedSemaphorePermit>>,
    phase: Mutex<Phase>,
    /// Since when its reads have found nothing to read: idle between requests, it is silent
    /// since then (a new connection not read yet may hold a request already).
    silent: Mutex<Option<Instant>>,
    /// Wakes the connection's task: it is asked to close, or its request's head was refused.
    wake: Notify,
    close_asked: AtomicBool,
    refused: Mutex<Option<Refusal>>,
    /// An answer was given without reading its request's whole body: the connection ends.
    body_unread: AtomicBool,
    /// Hyper wrote bytes it has not flushed yet.
    unflushed: AtomicBool,
    connections: std::sync::Weak<Connections>,
}

/// Keeps a connection among the open ones while its task runs, however the task ends.
struct Registered(Arc<Watch>);

impl Drop for Registered {
    fn drop(&mut self) {
        if let Some(connections) = self.0.connections.upgrade() {
            lock(&connections.open).remove(&self.0.id);
            connections.ended.notify_waiters();
        }
    }
}

enum Phase {
    /// Waiting for a request since then (the connection's start, or the last answer).
    Idle(Instant),
    /// A request's head is arriving.
    Head(HeadScan),
    /// A request is being answered.
    Busy,
}

impl Watch {
    /// Since when the connection is idle: between requests, and found with nothing to read
    /// (since then, or since its last answer if later).
    fn idle_since(&self) -> Option<Instant> {
        let silent = (*lock(&self.silent))?;
        match *lock(&self.phase) {
            Phase::Idle(since) => Some(since.max(silent)),
            Phase::Head(_) | Phase::Busy => None,
        }
    }

    /// A read found nothing to read: a connection between requests is now idle.
    fn found_nothing(&self) {
        let mut silent = lock(&self.silent);
        if silent.is_none() {
            *silent = Some(Instant::now());
            drop(silent);
            if let Some(connections) = self.connections.upgrade() {
                connections.went_idle.notify_one();
            }
        }
    }

    fn refusal(&self) -> Option<Refusal> {
        *lock(&self.refused)
    }

    /// Follows bytes the client sent: a refusal once they make a head too large.
    fn received(&self, bytes: &[u8]) -> Result<(), Refusal> {
        *lock(&self.silent) = None;
        let mut phase = lock(&self.phase);
        if let Phase::Idle(_) = *phase {
            *phase = Phase::Head(HeadScan::default());
        }
        let Phase::Head(scan) = &mut *phase else {
            return Ok(());
        };
        match scan.feed(bytes) {
            Scanned::Partial => Ok(()),
            Scanned::Complete => {
                *phase = Phase::Busy;
                Ok(())
            }
            Scanned::Refused(refusal) => {
                *phase = Phase::Busy;
                *lock(&self.refused) = Some(refusal);
                self.wake.notify_one();
                Err(refusal)
            }
        }
    }

    /// The answer went out, and its request was read whole: the next request may come, on a
    /// connection that holds a slot; one that could not take one back closes now.
    fn answered(&self) {
        *lock(&self.phase) = Phase::Idle(Instant::now());
        if !self.holds_slot() {
            self.close_asked.store(true, Ordering::Release);
            self.wake.notify_one();
        }
        if let Some(connections) = self.connections.upgrade() {
            connections.went_idle.notify_one();
        }
    }

    /// Whether the connection holds a slot, taking a free one if it lent its own.
    fn holds_slot(&self) -> bool {
        let mut slot = lock(&self.slot);
        if slot.is_none()
            && let Some(connections) = self.connections.upgrade()
        {
            *slot = connections.slots.clone().try_acquire_owned().ok();
        }
        slot.is_some()
    }
}

/// A connection as its requests see it ([`ConnectionSlot`]): one that waits lends the
/// connection's slot back to the accept loop for the wait.
struct Lender(Arc<Watch>);

impl LendSlot for Lender {
    fn lend(&self) {
        // Dropped, the permit is the accept loop's again.
        lock(&self.0.slot).take();
    }

    fn reclaim(&self) {
        self.0.holds_slot();
    }
}

/// A lock whose holder cannot leave the state half-changed: a panic elsewhere does not poison
/// what the other connections read.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Why a request's head was refused before hyper parsed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    RequestLine,
    Head,
}

impl Refusal {
    fn error(self) -> ApiError {
        match self {
            Refusal::RequestLine => ApiError::uri_too_long(MAX_REQUEST_LINE),
            Refusal::Head => ApiError::headers_too_large(MAX_HEAD, MAX_HEADERS),
        }
    }
}

/// Follows a request's head as its bytes arrive: its size, its lines, and its end (the first
/// empty line; empty lines before the request line are skipped, as HTTP/1.1 allows).
#[derive(Default)]
struct HeadScan {
    read: usize,
    /// Lines ended so far: the request line, then one per header.
    lines: usize,
    /// Characters of the current line, line endings aside.
    line: usize,
    started: bool,
}

enum Scanned {
    Partial,
    Complete,
    Refused(Refusal),
}

impl HeadScan {
    fn feed(&mut self, bytes: &[u8]) -> Scanned {
        for &byte in bytes {
            self.read += 1;
            match byte {
                b'\n' if !self.started => {}
                b'\n' if self.line == 0 => return Scanned::Complete,
                b'\n' => {
                    self.lines += 1;
                    self.line = 0;
                }
                b'\r' => {}
                _ => {
                    self.started = true;
                    self.line += 1;
                }
            }
            if self.lines == 0 && self.read > MAX_REQUEST_LINE {
                return Scanned::Refused(Refusal::RequestLine);
            }
            if self.read > MAX_HEAD || self.lines > MAX_HEADERS + 1 {
                return Scanned::Refused(Refusal::Head);
            }
        }
        Scanned::Partial
    }
}

/// The connection's socket, watched: each read is followed by the connection's [`Watch`].
struct Watched {
    stream: TcpStream,
    watch: Arc<Watch>,
    /// The head was refused: hyper reads nothing more, and the connection's task answers.
    refused: bool,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.refused {
            // Never ready: the connection's task stops polling hyper and answers itself.
            return Poll::Pending;
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut this.stream).poll_read(cx, buf);
        if read.is_pending() {
            this.watch.found_nothing();
        }
        ready!(read)?;
        let received = &buf.filled()[before..];
        if !received.is_empty() && this.watch.received(received).is_err() {
            buf.set_filled(before);
            this.refused = true;
            return Poll::Pending;
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.watch.unflushed.store(true, Ordering::Release);
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.watch.unflushed.store(true, Ordering::Release);
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    /// Hyper flushes once its own buffer is written whole.
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(Pin::new(&mut self.stream).poll_flush(cx))?;
        self.watch.unflushed.store(false, Ordering::Release);
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// One request through the router: its body timed, its answer watched.
#[derive(Clone)]
struct Exchange {
    app: TowerToHyperService<Router>,
    watch: Arc<Watch>,
    /// Given to each request, for a wait to lend the connection's slot.
    lent: ConnectionSlot,
    body_timeout: Duration,
}

type Answered = Pin<Box<dyn Future<Output = Result<Response<Answer>, Infallible>> + Send>>;

impl hyper::service::Service<Request<Incoming>> for Exchange {
    type Response = Response<Answer>;
    type Error = Infallible;
    type Future = Answered;

    fn call(&self, request: Request<Incoming>) -> Answered {
        let read_through = Arc::new(AtomicBool::new(request.body().is_end_stream()));
        let mut request = request.map(|body| Timed {
            body,
            deadline: Box::pin(tokio::time::sleep(self.body_timeout)),
            within: self.body_timeout,
            read_through: read_through.clone(),
        });
        request.extensions_mut().insert(self.lent.clone());
        let answer = hyper::service::Service::call(&self.app, request);
        let watch = self.watch.clone();
        Box::pin(async move {
            let mut response = answer.await?;
            let whole = read_through.load(Ordering::Acquire);
            if !whole {
                // What is left of the body would be read as the next request.
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
                watch.body_unread.store(true, Ordering::Release);
            } else if !watch.holds_slot() {
                // It waited, and every slot was taken meanwhile: it ends after this answer.
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            Ok(response.map(|body| Answer {
                body,
                idle_after: whole.then_some(watch),
            }))
        })
    }
}

/// A request's body, which must arrive within `within` of its head.
struct Timed {
    body: Incoming,
    deadline: Pin<Box<tokio::time::Sleep>>,
    within: Duration,
    /// Set once the body was read to its end.
    read_through: Arc<AtomicBool>,
}

impl Body for Timed {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(frame) => {
                if frame.is_none() || this.body.is_end_stream() {
                    this.read_through.store(true, Ordering::Release);
                }
                Poll::Ready(frame.map(|frame| frame.map_err(Into::into)))
            }
            Poll::Pending => match this.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyLate(this.within))))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// An answer's body; once hyper is done with it, the connection is idle again (unless the
/// request was not read whole, and the connection ends).
struct Answer {
    body: axum::body::Body,
    idle_after: Option<Arc<Watch>>,
}

impl Body for Answer {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        if let Some(watch) = self.idle_after.take() {
            watch.answered();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scanned(chunks: &[&[u8]]) -> Vec<&'static str> {
        let mut scan = HeadScan::default();
        chunks
            .iter()
            .map(|chunk| match scan.feed(chunk) {
                Scanned::Partial => "partial",
                Scanned::Complete => "complete",
                Scanned::Refused(Refusal::RequestLine) => "request line",
                Scanned::Refused(Refusal::Head) => "head",
            })
            .collect()
    }

    #[test]
    fn a_head_ends_at_its_first_empty_line_wherever_the_reads_split_it() {
        assert_eq!(
            scanned(&[b"GET / HTTP/1.1\r\nHost: a\r", b"\n\r", b"\n"]),
            ["partial", "partial", "complete"]
        );
        assert_eq!(scanned(&[b"\r\n\r\nGET / HTTP/1.1\n\n"]), ["complete"]);
        assert_eq!(scanned(&[b"\r\n", b"\r\n"]), ["partial", "partial"]);
    }

    #[test]
    fn a_long_request_line_or_a_large_head_is_refused_as_it_arrives() {
        let path = "a".repeat(MAX_REQUEST_LINE);
        let line = format!("GET /{path} HTTP/1.1\r\n\r\n");
        assert_eq!(scanned(&[line.as_bytes()]), ["request line"]);

        let header = format!("X-Big: {}\r\n", "a".repeat(MAX_HEAD));
        let head = format!("GET / HTTP/1.1\r\n{header}\r\n");
        assert_eq!(scanned(&[head.as_bytes()]), ["head"]);

        let many = "X-A: 1\r\n".repeat(MAX_HEADERS + 1);
        let head = format!("GET / HTTP/1.1\r\n{many}\r\n");
        assert_eq!(scanned(&[head.as_bytes()]), ["head"]);
        let enough = "X-A: 1\r\n".repeat(MAX_HEADERS);
        let head = format!("GET / HTTP/1.1\r\n{enough}\r\n");
        assert_eq!(scanned(&[head.as_bytes()]), ["complete"]);
    }
}
