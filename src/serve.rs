//! `countersign serve`: the HTTP decision API and the review page over the embedded engine,
//! with bearer tokens verified against the state directory's development key. With
//! `--dev-sign-in`, on a loopback address only, it also offers development sign-in
//! (`/dev/people`, `/dev/token` with the state's sign-in secret), so the review page can sign in
//! as a person of the directory.
//!
//! Each connection is HTTP/1.1 with limits a slow or idle client cannot outlast: the request
//! head must arrive within the header timeout (which also closes a keep-alive connection idle
//! that long), a body within the body timeout, and at most `max_connections` are open at once;
//! the next one waits in the listen backlog until one closes.

use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use shared::api::{self, ApiError, Authenticate, BearerJwt, DevSignIn};
use shared::engine::Engine;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

use crate::cli::ServeOptions;
use crate::fail::Failure;
use crate::local::Local;
use crate::token;

fn failure(message: String) -> Failure {
    Failure {
        code: "serve",
        message,
        exit: 1,
    }
}

/// Serves until SIGTERM or ctrl-c, then finishes the requests in flight and the resumes Slack
/// decisions left running. Meanwhile it sweeps every `sweep_every`, as the recurring schedule
/// does in AWS.
pub async fn run(local: Local, state: &Path, options: ServeOptions) -> Result<(), Failure> {
    let key = token::dev_key(state)?;
    let jwt = Arc::new(BearerJwt::hs256(&key).map_err(|e| failure(e.to_string()))?);
    let auth: Arc<dyn Authenticate> = jwt.clone();

    let addr = &options.addr;
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| Failure::usage(format!("cannot listen on {addr}: {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| failure(format!("no local address: {e}")))?;
    let slack = shared::deploy::slack_from_env(Some(&local.directory))
        .map_err(|e| Failure::usage(e.to_string()))?;
    let dev = match options.dev_sign_in {
        false => None,
        // Anyone who reaches development sign-in can act as anyone: only this machine may.
        true if !bound.ip().is_loopback() => {
            return Err(Failure::usage(format!(
                "--dev-sign-in needs a loopback address (127.0.0.1, [::1]), not {bound}"
            )));
        }
        true => {
            let secret = token::dev_sign_in_secret(state)?;
            let secret_file = state.join(token::SECRET_FILE);
            eprintln!(
                "WARNING: development sign-in is ON. Whoever holds the secret in {} can sign in \
                 as any person of the directory, approvers included. For development only; \
                 never on real approvals.\n\
                 Sign in at: http://{bound}/#dev-secret={secret}",
                secret_file.display()
            );
            Some(DevSignIn {
                directory: local.directory,
                issuer: jwt,
                ttl: token::DEFAULT_TTL,
                secret,
            })
        }
    };
    let engine = Arc::new(local.engine);
    // Lists the agents' MCP tools without holding up the server; a server down is tried again.
    tokio::spawn({
        let engine = engine.clone();
        async move { shared::agents::prepare_all(&engine).await }
    });
    if !options.sweep_every.is_zero() {
        tokio::spawn(sweep_forever(engine.clone(), options.sweep_every));
    }
    // A Slack click is answered before the run it settles resumes; that resume runs here.
    let background = api::Background::default();
    let app = api::local_router(engine, auth, local.claims, dev, slack, background.clone()).layer(
        middleware::from_fn_with_state(options.body_timeout, body_within),
    );
    // One flushed line: scripts and tests read the address from it (port 0 picks a free one).
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "listening on http://{bound}")
        .and_then(|()| stdout.flush())
        .map_err(|e| failure(format!("cannot write to stdout: {e}")))?;
    drop(stdout);
    tracing::info!(%bound, "serving the decision API");

    accept_until_stopped(listener, app, &options).await;
    // The resumes Slack decisions left running finish too, as the requests in flight did.
    background.finished().await;
    Ok(())
}

/// Accepts connections until the process is told to stop, each within the limits of `options`;
/// then lets each finish the request it is serving and waits for them.
async fn accept_until_stopped(listener: TcpListener, app: Router, options: &ServeOptions) {
    let slots = Arc::new(Semaphore::new(options.max_connections as usize));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(options.header_timeout);
    let stopping = stopped();
    tokio::pin!(stopping);
    loop {
        let slot = tokio::select! {
            () = &mut stopping => break,
            slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
        };
        let (stream, peer) = tokio::select! {
            () = &mut stopping => break,
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
        let service = TowerToHyperService::new(app.clone());
        let connection = http.serve_connection(TokioIo::new(stream), service);
        let mut stop_rx = stop_rx.clone();
        tokio::spawn(async move {
            let _slot = slot;
            tokio::pin!(connection);
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(error) = result {
                        tracing::debug!(%peer, %error, "connection closed");
                    }
                    return;
                }
                _ = stop_rx.changed() => connection.as_mut().graceful_shutdown(),
            }
            if let Err(error) = connection.await {
                tracing::debug!(%peer, %error, "connection closed while stopping");
            }
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    // Every connection holds a slot until it ends: having them all back means all have ended.
    let _ = slots.acquire_many(options.max_connections).await;
}

/// Reads the request's body (at most the API's limit) within `timeout`, so a client that stops
/// sending mid-body holds no connection and no handler. A body over the limit is refused as the
/// API refuses it (400 `body_too_large`); one that is late is 408 and ends the connection.
async fn body_within(State(timeout): State<Duration>, request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    match tokio::time::timeout(timeout, axum::body::to_bytes(body, api::MAX_BODY_BYTES)).await {
        Ok(Ok(bytes)) => next.run(Request::from_parts(parts, bytes.into())).await,
        Ok(Err(_)) => ApiError::bad_request(
            "body_too_large",
            format!("the body is larger than {} bytes", api::MAX_BODY_BYTES),
        )
        .into_response(),
        Err(_) => {
            let mut response = ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                format!(
                    "the body did not arrive within {}",
                    humantime::format_duration(timeout)
                ),
            )
            .into_response();
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            response
        }
    }
}

/// The local stand-in for the recurring EventBridge schedule. A failed sweep is logged and the
/// next one tries again; the process stopping ends it.
async fn sweep_forever(engine: Arc<Engine>, every: Duration) {
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        // Decisions resume runs in this process: keep every agent's MCP tools listed.
        shared::agents::prepare_all(&engine).await;
        if let Err(error) = engine.sweep(SWEEP_BUDGET).await {
            tracing::warn!(%error, "the sweep failed; trying again next time");
        }
    }
}

/// Items of each kind one local sweep touches at most, as the sweep function's default.
const SWEEP_BUDGET: usize = 200;

async fn stopped() {
    let ctrl_c = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::warn!(%error, "cannot listen for ctrl-c");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => {
                terminate.recv().await;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
    tracing::info!("shutting down");
}
