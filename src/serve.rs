//! `countersign serve`: the HTTP decision API and the review page over the embedded engine,
//! with bearer tokens verified against the state directory's development key. On a loopback
//! address it also offers development sign-in (`/dev/people`, `/dev/token`), so the review page
//! can sign in as a person of the directory.

use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use shared::api::{self, Authenticate, BearerJwt, DevSignIn};
use shared::engine::Engine;

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

/// Serves until SIGTERM or ctrl-c, then finishes the requests in flight. Meanwhile it sweeps
/// every `sweep_every`, as the recurring schedule does in AWS.
pub async fn run(
    local: Local,
    state: &Path,
    addr: &str,
    sweep_every: Duration,
) -> Result<(), Failure> {
    let key = token::dev_key(state)?;
    let jwt = Arc::new(BearerJwt::hs256(&key).map_err(|e| failure(e.to_string()))?);
    let auth: Arc<dyn Authenticate> = jwt.clone();

    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Failure::usage(format!("cannot listen on {addr}: {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| failure(format!("no local address: {e}")))?;
    // Anyone who reaches development sign-in can act as anyone: only this machine may.
    let dev = bound.ip().is_loopback().then(|| DevSignIn {
        directory: local.directory,
        issuer: jwt,
        ttl: token::DEFAULT_TTL,
    });
    if dev.is_none() {
        tracing::warn!(%bound, "not a loopback address: development sign-in is off");
    }
    let engine = Arc::new(local.engine);
    if !sweep_every.is_zero() {
        tokio::spawn(sweep_forever(engine.clone(), sweep_every));
    }
    let app = api::local_router(engine, auth, local.claims, dev);
    // One flushed line: scripts and tests read the address from it (port 0 picks a free one).
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "listening on http://{bound}")
        .and_then(|()| stdout.flush())
        .map_err(|e| failure(format!("cannot write to stdout: {e}")))?;
    drop(stdout);
    tracing::info!(%bound, "serving the decision API");

    axum::serve(listener, app)
        .with_graceful_shutdown(stopped())
        .await
        .map_err(|e| failure(format!("the server stopped: {e}")))
}

/// The local stand-in for the recurring EventBridge schedule. A failed sweep is logged and the
/// next one tries again; the process stopping ends it.
async fn sweep_forever(engine: Arc<Engine>, every: Duration) {
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
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
