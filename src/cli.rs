//! The command line: every command is its own process over the same state directory.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use shared::agents::Environment;
use shared::api::claude_code::OnTimeout;
use shared::api::waiting::WaitLimits;
use shared::deploy::MOST_OPEN_APPROVALS;
use shared::engine::{DEFAULT_MAX_OPEN_APPROVALS, MAX_PENDING_PAGE, PENDING_PAGE};

#[derive(Debug, Parser)]
#[command(
    name = "countersign",
    version,
    about = "Durable human sign-off for an AI agent's risky tool calls",
    after_help = "The state lives in one SQLite file under --state (default ./state). \
                  Agents are the definitions --agents names (the shipped expense and refunds ones by default). \
                  Set ANTHROPIC_API_KEY to drive them with Claude; without it each agent's offline model plays it."
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Args)]
pub struct Global {
    /// The state directory (the embedded store lives here).
    #[arg(
        long,
        global = true,
        env = "COUNTERSIGN_STATE",
        default_value = "state"
    )]
    pub state: PathBuf,
    /// Print one JSON object on stdout instead of text.
    #[arg(long, global = true)]
    pub json: bool,
    /// Agent definitions to load instead of the shipped ones (expense, refunds): comma-separated
    /// paths, each an agent's directory (with agent.toml) or a directory of them.
    #[arg(long, global = true, env = "COUNTERSIGN_AGENTS", value_name = "PATHS")]
    pub agents: Option<String>,
    /// A people directory to use instead of the shipped one.
    #[arg(long, global = true, env = "COUNTERSIGN_PEOPLE")]
    pub people: Option<PathBuf>,
    /// A claims file to use instead of the shipped example claims.
    #[arg(long, global = true, env = "COUNTERSIGN_CLAIMS")]
    pub claims: Option<PathBuf>,
    /// The most approvals one requester may have waiting on people at once; a call past it is
    /// not proposed (its caller is told so, and no reviewer sees it).
    #[arg(
        long,
        global = true,
        env = "COUNTERSIGN_MAX_OPEN_APPROVALS",
        value_name = "N",
        default_value_t = DEFAULT_MAX_OPEN_APPROVALS,
        value_parser = clap::value_parser!(u32).range(1..=i64::from(MOST_OPEN_APPROVALS))
    )]
    pub max_open_approvals: u32,
    /// Testing aid, in debug builds only: this process's clock runs this far ahead (such as 2d),
    /// so the sweep finds every deadline and lease past. A release build has no such option.
    #[cfg(debug_assertions)]
    #[arg(long, global = true, env = CLOCK_OFFSET_ENV, value_parser = parse_duration, value_name = "DURATION")]
    pub clock_offset: Option<std::time::Duration>,
}

/// The variable that moves a debug build's clock ahead (`--clock-offset`).
pub const CLOCK_OFFSET_ENV: &str = "COUNTERSIGN_CLOCK_OFFSET";

#[derive(Debug, Subcommand)]
pub enum Command {
    /// The expense example only: start its agent on one of the example's claims, for the
    /// employee who filed it. Any other agent starts with `run --agent NAME`.
    Agent {
        /// The claim to process, such as c-102.
        claim: String,
        /// Time a reviewer has to decide, overriding the policy (such as 30m, 2h, 0s).
        #[arg(long, value_parser = parse_duration)]
        ttl: Option<std::time::Duration>,
    },
    /// Start any agent on a task, for a person of the people directory (the run's requester).
    Run {
        /// The agent: the name of a loaded definition (expense, refunds, or one of --agents),
        /// or a definition's directory, loaded for this command (the commands that later
        /// decide or resume its run need it in --agents too).
        #[arg(long, value_name = "NAME|DIR")]
        agent: String,
        /// What the agent is asked to do.
        task: String,
        /// Who asks: they may not approve the run's calls.
        #[arg(long = "as", value_name = "NAME")]
        person: String,
        /// Time a reviewer has to decide, shorter than the policy's (such as 30m, 2h, 0s).
        #[arg(long, value_parser = parse_duration)]
        ttl: Option<std::time::Duration>,
    },
    /// List what waits for a decision, a page at a time, or decide.
    Review {
        #[command(subcommand)]
        action: Option<Review>,
        /// Only what waits in this person's organisation.
        #[arg(long = "as", value_name = "NAME")]
        person: Option<String>,
        /// How many to list, soonest deadline first.
        #[arg(long, default_value_t = PENDING_PAGE as u32, value_parser = clap::value_parser!(u32).range(1..=MAX_PENDING_PAGE as i64))]
        limit: u32,
        /// Where to start: the cursor the page before printed.
        #[arg(long)]
        cursor: Option<String>,
        /// Every waiting approval, page after page.
        #[arg(long, conflicts_with_all = ["limit", "cursor"])]
        all: bool,
    },
    /// Cancel a run; its open approvals are cancelled with it.
    Cancel {
        run: String,
        #[arg(long = "as", value_name = "NAME")]
        person: String,
    },
    /// The full history of a run, or of the run an approval belongs to.
    Audit {
        /// A run id (run-…) or an approval id (ap-…).
        id: String,
    },
    /// Serve the HTTP decision API over the state; bearer tokens come from `countersign token`.
    Serve(ServeOptions),
    /// Serve one agent's tools to an MCP client (Claude Code, Claude Desktop, Cursor, VS Code)
    /// over stdio, for one person: each call goes through the agent's policy and approvals.
    Mcp(McpOptions),
    /// Print a development bearer token for a person of the people directory.
    Token {
        #[arg(long = "as", value_name = "NAME")]
        person: String,
        /// How long the token is valid, such as 30m or 12h.
        #[arg(long, default_value = "12h", value_parser = parse_duration)]
        ttl: std::time::Duration,
    },
    /// What an operator watches, per tenant and agent: approvals waiting and the oldest one's
    /// wait, unknown outcomes, and the decisions, executions and policy rulings counted so far
    /// (the figures GET /metrics serves).
    Stats {
        /// Only this tenant's figures.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// The expense example only: the claims its agent paid and declined. Other agents' calls
    /// are not in it; `audit` shows what each run did.
    Ledger,
    /// Resume runs from the SQS queue, as the resume function does (needs COUNTERSIGN_STORE=dynamodb).
    Worker {
        /// Take what is queued now, then exit.
        #[arg(long)]
        once: bool,
    },
    /// Hold an agent's policy to a case file, or try a candidate policy on its stored calls.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// A coding agent's hook: one event's JSON on stdin, the hook's answer on stdout.
    #[command(subcommand)]
    Hook(Hook),
}

#[derive(Debug, Subcommand)]
pub enum Hook {
    /// Claude Code's command hook (PreToolUse, PostToolUse, PostToolUseFailure): each call of a
    /// tool the agent lists goes through its policy and, where it says so, a person; the
    /// answer is Claude Code's permissionDecision. Any failure exits 2, which blocks the call.
    ClaudeCode(ClaudeCodeHook),
}

/// Whose calls Claude Code's hook proposes, to which agent, and how long it waits.
#[derive(Debug, clap::Args)]
pub struct ClaudeCodeHook {
    /// The agent whose policy decides: a loaded definition's name, or a definition's directory
    /// (such as examples/claude-code; the commands that decide its calls need it in --agents too).
    #[arg(long, default_value = "claude-code", value_name = "NAME|DIR")]
    pub agent: String,
    /// Who asks: every call is this person's, and they may not approve it.
    #[arg(long = "as", env = "COUNTERSIGN_AS", value_name = "NAME")]
    pub person: String,
    /// How long to wait for a person's decision: under the hook's timeout (60 s by default).
    #[arg(long, default_value = "50s", value_parser = parse_duration)]
    pub wait: Duration,
    /// What to answer when nobody decided in time: ask (Claude Code asks its user) or defer
    /// (a headless `claude -p` session stops, to be resumed once it is decided).
    #[arg(long, default_value = "ask", value_name = "ask|defer")]
    pub on_timeout: OnTimeout,
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Decide each [[case]] of CASES under the agent's policy: each failing case is printed with
    /// the rules that decided it, and the command exits 1 if any failed.
    Test {
        /// The agent: a definition's directory, or a loaded definition's name.
        #[arg(long, value_name = "DIR")]
        agent: String,
        /// The case file: [[case]] tables with tool, args, as and expect.
        cases: PathBuf,
    },
    /// Decide the agent's stored calls again under a candidate policy: how many calls each
    /// outcome got, before and after, per tool, and every call whose outcome would change.
    Replay {
        /// The agent: a definition's directory, or a loaded definition's name.
        #[arg(long, value_name = "DIR")]
        agent: String,
        /// The candidate policy's manifest (its Cedar files beside it); the agent's own if left out.
        #[arg(long, value_name = "FILE")]
        policy: Option<PathBuf>,
        /// How far back to look, such as 7d or 12h.
        #[arg(long, default_value = "7d", value_parser = parse_duration)]
        since: std::time::Duration,
    },
}

impl PolicyCommand {
    pub fn agent(&self) -> &String {
        match self {
            PolicyCommand::Test { agent, .. } | PolicyCommand::Replay { agent, .. } => agent,
        }
    }
}

impl Command {
    /// When the command needs the variables the agents' bindings read: at start for the ones
    /// that run tools (they start, serve or resume runs themselves); only to run a tool for the
    /// ones that review, decide and read, which leave a call they cannot run to one that can.
    pub fn environment(&self) -> Environment {
        match self {
            Command::Agent { .. }
            | Command::Run { .. }
            | Command::Serve(_)
            | Command::Mcp(_)
            | Command::Worker { .. } => Environment::AtStart,
            Command::Review { .. }
            | Command::Cancel { .. }
            | Command::Audit { .. }
            | Command::Token { .. }
            | Command::Stats { .. }
            | Command::Ledger
            | Command::Policy(_)
            | Command::Hook(_) => Environment::WhenRun,
        }
    }
}

/// Whose tools `mcp` serves, to whom.
#[derive(Debug, clap::Args)]
pub struct McpOptions {
    /// The agent whose tools the client gets: a loaded definition's name, or a definition's
    /// directory (the commands that decide its calls need it in --agents too).
    #[arg(long, value_name = "NAME|DIR")]
    pub agent: String,
    /// Who asks: every call is this person's, and they may not approve it.
    #[arg(long = "as", value_name = "NAME")]
    pub person: String,
    /// How often to sweep (expiries, reminders, retries), as `serve` does; 0s turns it off.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub sweep_every: Duration,
}

/// How `serve` listens and what it offers.
#[derive(Debug, clap::Args)]
pub struct ServeOptions {
    /// Where to listen; port 0 picks a free one. The address is printed on stdout.
    #[arg(long, default_value = "127.0.0.1:8780", value_name = "HOST:PORT")]
    pub addr: String,
    /// How often the server sweeps (expiries, reminders, retries), as the recurring schedule
    /// does in AWS; 0s turns it off.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub sweep_every: Duration,
    /// Offer development sign-in (the review page's person picker, POST /dev/token) to whoever
    /// holds the secret in <state>/dev-sign-in.secret. Loopback addresses only; off by default.
    #[arg(long)]
    pub dev_sign_in: bool,
    /// How long a client has to send a request's head; also how long a keep-alive connection
    /// may sit idle between requests.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub header_timeout: Duration,
    /// How long a client has to send a request's body once its head arrived.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub body_timeout: Duration,
    /// Connections open at once. When all are, the one idle the longest between requests is
    /// closed to admit another; with none idle, more wait to be accepted.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub max_connections: u32,
    /// Requests waiting at once (gate long-polls, MCP calls held for a person). A waiting
    /// request gives its connection slot back while it waits; past this, a wait is answered at
    /// once.
    #[arg(long, default_value_t = WaitLimits::DEFAULT.total, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub max_waiting: u32,
    /// Of the waiting requests, how many one person may hold; past it, their next wait is
    /// answered at once (a gate long-poll with 429 and Retry-After).
    #[arg(long, default_value_t = WaitLimits::DEFAULT.per_person, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub max_waiting_per_person: u32,
}

#[derive(Debug, Subcommand)]
pub enum Review {
    /// Approve the exact call an approval shows.
    Approve {
        #[command(flatten)]
        submission: Submission,
    },
    /// Approve a lower amount: the call gets a new version, which policy evaluates again.
    Edit {
        /// The new amount in dollars, such as 200 or 199.50. It must be lower.
        #[arg(long, value_parser = parse_amount)]
        amount: shared::domain::money::Amount,
        /// Why, for the record.
        #[arg(long)]
        note: Option<String>,
        #[command(flatten)]
        submission: Submission,
    },
    /// Reject the call; the agent is told and does not retry it.
    Reject {
        #[arg(long)]
        reason: String,
        #[command(flatten)]
        submission: Submission,
    },
    /// Answer a recovery: did the call whose outcome is unknown take effect?
    Answer {
        /// It took effect (the service shows it was made).
        #[arg(
            long,
            conflicts_with = "did_not_take_effect",
            required_unless_present = "did_not_take_effect"
        )]
        took_effect: bool,
        /// It did not take effect (the service has no trace of it, and never will).
        #[arg(long)]
        did_not_take_effect: bool,
        /// What you checked, for the record.
        #[arg(long)]
        note: Option<String>,
        #[command(flatten)]
        submission: Submission,
    },
    /// Expire what nobody decided in time (the sweep), and deliver anything left undelivered.
    Expire,
}

/// What every decision names: the approval, who decides, and optionally its id and version.
#[derive(Debug, Args)]
pub struct Submission {
    pub approval: String,
    #[arg(long = "as", value_name = "NAME")]
    pub person: String,
    /// Makes the decision idempotent: the same id again returns the recorded outcome.
    #[arg(long)]
    pub decision_id: Option<String>,
    /// The action version being decided; by default the version the approval is for.
    #[arg(long)]
    pub version: Option<u32>,
}

pub(crate) fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("{text:?} is not a duration like 30m, 2h or 0s: {e}"))
}

fn parse_amount(text: &str) -> Result<shared::domain::money::Amount, String> {
    text.parse()
        .map_err(|e: shared::domain::money::AmountError| e.to_string())
}
