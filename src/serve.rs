//! `countersign serve`: the HTTP decision API and the review page over the embedded engine,
//! with bearer tokens verified against the state directory's development key. With
//! `--dev-sign-in`, on a loopback address only, it also offers development sign-in
//! (`/dev/people`, `/dev/token` with the state's sign-in secret), so the review page can sign in
//! as a person of the directory.
//!
//! Each connection is HTTP/1.1 with limits a slow, idle or greedy client cannot outlast
//! (`connections.rs`): a head within the header timeout and of a sane size, a body within the
//! body timeout and read only once the caller is authenticated, and at most `max_connections`
//! open, the one idle the longest closed to admit a new one when all are. Requests that wait
//! take the API's waiting slots (`max_waiting`, at most `max_waiting_per_person` of them one
//! person's) instead of connection slots, so waiters cannot keep anyone else out.

mod connections;

use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use shared::api::waiting::{WaitLimits, WaitSlots};
use shared::api::{self, Authenticate, BearerJwt, DevSignIn};
use shared::engine::Engine;
use tokio::net::TcpListener;

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

/// Serves until SIGTERM or ctrl-c, then finishes the requests in flight, the runs `POST /runs`
/// accepted and the resumes Slack decisions left running. Meanwhile it sweeps every `sweep_every`, as the recurring schedule
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
    // MCP servers are started and listed when a call, a listing or a run first needs them.
    let engine = Arc::new(local.engine);
    if !options.sweep_every.is_zero() {
        tokio::spawn(sweep_forever(engine.clone(), options.sweep_every));
    }
    // An accepted run is driven here after its 202, and a Slack click is answered before the
    // run it settles resumes; that resume runs here too.
    let background = api::Background::default();
    let gateway =
        shared::deploy::mcp_settings_from_env().map_err(|e| Failure::usage(e.to_string()))?;
    let waiting = WaitSlots::new(WaitLimits {
        total: options.max_waiting,
        per_person: options.max_waiting_per_person,
    });
    let metrics = crate::metrics::router(engine.clone(), bound)?;
    let mut app = api::local_router(
        engine,
        auth,
        local.claims,
        dev,
        slack,
        background.clone(),
        gateway,
    )
    .layer(axum::Extension(Arc::new(waiting)))
    .merge(metrics);
    if crate::otel::on() {
        app = app.layer(axum::middleware::from_fn(crate::otel::continue_trace));
    }
    open_files_for(options.max_connections + options.max_waiting);
    // One flushed line: scripts and tests read the address from it (port 0 picks a free one).
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "listening on http://{bound}")
        .and_then(|()| stdout.flush())
        .map_err(|e| failure(format!("cannot write to stdout: {e}")))?;
    drop(stdout);
    tracing::info!(%bound, "serving the decision API");

    let limits = connections::Limits {
        header_timeout: options.header_timeout,
        body_timeout: options.body_timeout,
        max_connections: options.max_connections,
    };
    connections::serve(listener, app, limits, stopped()).await;
    // The runs being driven and the resumes Slack decisions left finish too, as the requests
    // in flight did.
    background.finished().await;
    Ok(())
}

/// The local stand-in for the recurring EventBridge schedule. A failed sweep is logged and the
/// next one tries again; the process stopping ends it.
pub(crate) async fn sweep_forever(engine: Arc<Engine>, every: Duration) {
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        if let Err(error) = engine.sweep(SWEEP_BUDGET).await {
            tracing::warn!(%error, "the sweep failed; trying again next time");
        }
    }
}

/// Files this process keeps open besides its connections: the store's, the listener, stdio,
/// outgoing connections to models, tools and MCP servers.
const OTHER_FILES: u64 = 128;

/// Raises this process's limit of open files to what `connections` (connections and waiting
/// requests together) need, up to the hard limit, as servers do: many systems start a process
/// at 1,024. Says on stderr if even the hard limit is short, then serves within it.
#[cfg(unix)]
fn open_files_for(connections: u32) {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let wanted = u64::from(connections) + OTHER_FILES;
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return;
    };
    let raised = wanted.min(hard);
    if raised > soft
        && let Err(error) = setrlimit(Resource::RLIMIT_NOFILE, raised, hard)
    {
        tracing::warn!(%error, "cannot raise the open-file limit");
    }
    let now = getrlimit(Resource::RLIMIT_NOFILE).map_or(soft, |(soft, _)| soft);
    if now < wanted {
        eprintln!(
            "WARNING: this process may open {now} files, fewer than the {wanted} that \
             --max-connections and --max-waiting may hold with the store's own; past it, new \
             connections wait. Raise the limit (ulimit -n) or lower those flags."
        );
    }
}

#[cfg(not(unix))]
fn open_files_for(_: u32) {}

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
