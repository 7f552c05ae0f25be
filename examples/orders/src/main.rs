//! `orders`: the orders service of Countersign's refunds example, the downstream system a
//! refunds agent's HTTP tools call. It knows nothing of Countersign: it refunds an order at most
//! once per idempotency key, never beyond what was paid, and answers whether a key took effect.

mod http;
mod refund;
mod store;

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};

use crate::http::{App, Fault};
use crate::store::Store;

#[derive(Parser)]
#[command(
    name = "orders",
    about = "The refunds example's orders service: refunds an order once per idempotency key"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the HTTP API; the first line on stdout is `listening on http://ADDR`.
    #[command(
        after_help = "Environment:\n  ORDERS_TOKEN  when set, every request needs \
                            `Authorization: Bearer <ORDERS_TOKEN>` (401 otherwise)"
    )]
    Serve {
        /// The SQLite file; created and seeded with the example's orders on first open.
        #[arg(long)]
        db: PathBuf,
        /// Where to listen; port 0 picks a free port.
        #[arg(long, default_value = "127.0.0.1:8790")]
        addr: String,
        /// Inject a failure into refund POSTs, to test what a caller does with a lost answer.
        #[arg(long, value_enum)]
        fault: Option<Fault>,
    },
    /// List the refunds made, oldest first.
    Refunds {
        /// The SQLite file the service uses.
        #[arg(long)]
        db: PathBuf,
        /// Only the refunds of this order.
        #[arg(long, value_name = "ORDER_ID")]
        order: Option<String>,
        /// Print a JSON array instead of one line per refund.
        #[arg(long)]
        json: bool,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let result = match Cli::parse().command {
        Command::Serve { db, addr, fault } => serve(db, &addr, fault).await,
        Command::Refunds { db, order, json } => list_refunds(db, order.as_deref(), json),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("orders: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Serves until the process is stopped. No graceful shutdown: every answered refund is already
/// on disk, and a request hanging by `--fault` would hold it open forever.
async fn serve(db: PathBuf, addr: &str, fault: Option<Fault>) -> Result<(), String> {
    let token = match std::env::var("ORDERS_TOKEN") {
        Ok(token) if token.is_empty() => return Err("ORDERS_TOKEN is set but empty".into()),
        Ok(token) => Some(token),
        Err(std::env::VarError::NotPresent) => None,
        Err(std::env::VarError::NotUnicode(_)) => return Err("ORDERS_TOKEN is not UTF-8".into()),
    };
    let store = Store::open(&db).map_err(|e| format!("cannot open {}: {e}", db.display()))?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let bound = listener
        .local_addr()
        .map_err(|e| format!("no local address: {e}"))?;
    tracing::info!(%bound, db = %db.display(), token = token.is_some(), ?fault, "serving orders");
    let app = Arc::new(App {
        store: Arc::new(store),
        token,
        fault,
    });
    // One flushed line: scripts and tests read the address from it (port 0 picks a free one).
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "listening on http://{bound}")
        .and_then(|()| stdout.flush())
        .map_err(|e| format!("cannot write to stdout: {e}"))?;
    drop(stdout);
    axum::serve(listener, http::router(app))
        .await
        .map_err(|e| format!("the server stopped: {e}"))
}

fn list_refunds(db: PathBuf, order: Option<&str>, json: bool) -> Result<(), String> {
    // Listing must not create an empty database where the service's was expected.
    if !db.is_file() {
        return Err(format!("no orders database at {}", db.display()));
    }
    let store = Store::open(&db).map_err(|e| format!("cannot open {}: {e}", db.display()))?;
    let mut refunds = store
        .refunds()
        .map_err(|e| format!("cannot read the refunds: {e}"))?;
    refunds.retain(|refund| order.is_none_or(|order| refund.ask.order_id == order));
    let mut stdout = std::io::stdout().lock();
    let written = if json {
        let all: Vec<_> = refunds.iter().map(http::refund_json).collect();
        writeln!(stdout, "{}", serde_json::Value::Array(all))
    } else {
        refunds.iter().try_for_each(|refund| {
            writeln!(
                stdout,
                "{}  {} {}  {}  key {}  {}  {}",
                refund.refund_id,
                refund.ask.amount_cents,
                refund.ask.currency,
                refund.ask.order_id,
                refund.idempotency_key,
                refund.ask.reason,
                refund.created_at,
            )
        })
    };
    written.map_err(|e| format!("cannot write to stdout: {e}"))
}
