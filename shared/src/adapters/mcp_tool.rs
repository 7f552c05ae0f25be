//! Tools from an MCP server, over Streamable HTTP or over the stdio of a process this one
//! starts (`command = ...`, never in Lambda), through the official Rust SDK (`rmcp`). A stdio
//! server gets [`INHERITED_ENV`] and its own `env`, logs its stderr through `tracing`, runs in
//! a process group of its own killed with its session, and is started again by the next call
//! once it has exited (the ping before each call finds it gone); a call in flight when it dies
//! is unknown, as any transport failure after sending is. An error that says it would not start
//! or died quotes the last lines of its stderr: its own words say why.
//!
//! An agent definition binds a server, then its tools by name or all at once:
//!
//! ```toml
//! [mcp.orders]                                   # a server, by a name the definition chooses
//! url = "${ORDERS_MCP_URL}"                      # its Streamable HTTP endpoint
//! headers = { Authorization = "Bearer ${ORDERS_MCP_TOKEN}" }
//! timeout = "10s"                                # optional, per request, at most 60s (30s)
//! tools = "*"                                    # optional: "*" or a list of names
//!                                                # (absent: only [tools.*] entries bind)
//!
//! [tools.issue_refund]                           # one tool of a server, bound by name
//! mcp = { server = "orders", tool = "issue_refund" }
//! ```
//!
//! What a call means:
//! - `call` sends `tools/call` with the exact approved arguments and the key `action_id:version`
//!   in the request's `_meta` as `"idempotency_key"`: a server that acts on it once makes the
//!   call exactly-once across crashes.
//! - A result is kept as the server gave it ([`ToolOutcome::Mcp`]): its content blocks, its
//!   `structuredContent`, and `isError: true` makes it **failed**, else **succeeded**. The model
//!   reads the text made of it; the MCP gateway hands the blocks and structured content on.
//!   A JSON-RPC error answering the call (unknown tool, invalid arguments) is **failed** too.
//! - Before each call the server is pinged; if that fails (the server restarted, the session
//!   expired, the connection dropped), the binding reconnects once. If it still cannot reach
//!   the server the call is **failed** and says that nothing was sent.
//! - Once `tools/call` is sent, a transport failure (timeout, lost connection, a 5xx, even a
//!   404 for a session that expired after the ping) is **unknown**: the call may have taken
//!   effect, so it is never sent again. Only a connect error on the call's own request (no
//!   pooled connections, so nothing reached the server) is failed. MCP has no way to ask
//!   whether a call took effect, so [`Tool::reconciles`] is false and an unknown outcome goes
//!   to the agent's recovery owner, a person.
//! - Hints (`readOnlyHint`, `destructiveHint`; absent = false) and the spec (name, description,
//!   `inputSchema`) are read once, when the tools are listed, and frozen: a server that changes
//!   its annotations later does not change what policy matched.
//! - A server that is down at [`McpServer::connect`] or [`McpServer::tools`] is
//!   [`McpError::Unreachable`]: a run is not started on it.
//! - Header values, `env` values and every value a `${VAR}` filled in never appear in `Debug`,
//!   errors, outcomes or the stderr lines logged, in any form the wire gives them
//!   ([`Secrets`]): they are replaced by their `${NAME}` or by `[redacted]`, in an outcome's
//!   every string (content, `structuredContent`, its keys included), in one pass over the
//!   whole outcome. Keep a secret in a header rather than the URL: the SDK's own error logs
//!   may print the URL.
//! - Redirects are not followed. An answer larger than 1 MiB is refused; to a `tools/call`,
//!   that is unknown like any failure after sending.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use process_wrap::tokio::CommandWrap;
use reqwest::header::{HeaderName, HeaderValue};
use rmcp::ServiceExt;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig,
    ClientRequest, Implementation, MetaObject, PingRequest, RequestMetaObject, ServerResult,
};
use rmcp::service::{
    ClientInitializeError, PeerRequestOptions, RoleClient, RunningService, ServiceError,
};
use rmcp::transport::streamable_http_client::{
    StreamableHttpClientTransportConfig, StreamableHttpError,
};
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::Mutex;

use super::env_template::BindingError;
use super::env_template::{self, Lookup};
use super::secrets::Secrets;
use crate::adapters::env_template::Filling;
use crate::domain::action::ToolOutcome;
use crate::domain::policy::ToolHints;
use crate::ports::model::ToolSpec;
use crate::ports::tools::{Tool, ToolCall};

/// How long one request may take when the binding does not say.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest `timeout` a binding may ask for.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(60);
/// The largest answer read from a server; a tool result is stored with its action.
const MAX_RESPONSE_BYTES: usize = 1024 * 1024;
/// The key under which the idempotency key travels in a `tools/call` request's `_meta`.
pub const IDEMPOTENCY_META_KEY: &str = "idempotency_key";

/// Headers the transport sets itself; a binding may not override them.
const RESERVED_HEADERS: &[&str] = &[
    "accept",
    "content-type",
    "content-length",
    "host",
    "mcp-session-id",
    "mcp-protocol-version",
    "last-event-id",
];

/// What a malformed `[mcp.<server>]` is told: the two forms a server may take.
pub const SERVER_FORMS: &str = "a server is either reached over Streamable HTTP, url = \"https://...\" \
     with optional headers, or started as a local process over stdio, command = \"npx\" with \
     optional args = [...], env = { ... } and cwd";

/// `[mcp.<server>]` as written in an agent definition.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "RawServerBinding")]
pub struct McpServerBinding {
    /// How the server is reached.
    pub endpoint: Endpoint,
    /// Per request, such as `"10s"`; at most 60s, 30s when absent.
    pub timeout: Option<String>,
    /// Which of the server's tools the agent gets without a `[tools.*]` entry each.
    pub tools: Option<ToolSelection>,
}

/// Where a server is: a URL, or a command this process starts. Every text may use `${VAR}`.
#[derive(Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// Streamable HTTP; the headers are sent with every request and never shown.
    Http {
        url: String,
        headers: BTreeMap<String, String>,
    },
    /// A process started with piped stdio, once per process that calls it. Its environment is
    /// [`INHERITED_ENV`] from this process plus `env`, whose values are never shown.
    Stdio {
        command: String,
        args: Vec<String>,
        env: BTreeMap<String, String>,
        cwd: Option<String>,
    },
}

/// What a stdio server inherits of this process's environment (as the MCP SDKs do): enough
/// to find and run a program, never this process's own settings and secrets.
pub const INHERITED_ENV: &[&str] = &[
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "LANG", "TMPDIR",
];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServerBinding {
    url: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    command: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    cwd: Option<String>,
    timeout: Option<String>,
    tools: Option<ToolSelection>,
}

impl TryFrom<RawServerBinding> for McpServerBinding {
    type Error = String;
    fn try_from(raw: RawServerBinding) -> Result<Self, String> {
        let stdio_only = !raw.args.is_empty() || !raw.env.is_empty() || raw.cwd.is_some();
        let endpoint = match (raw.url, raw.command) {
            (Some(url), None) if !stdio_only => Endpoint::Http {
                url,
                headers: raw.headers,
            },
            (None, Some(command)) if raw.headers.is_empty() => Endpoint::Stdio {
                command,
                args: raw.args,
                env: raw.env,
                cwd: raw.cwd,
            },
            (Some(_), Some(_)) => return Err(format!("has both url and command; {SERVER_FORMS}")),
            (None, None) => return Err(format!("needs url or command; {SERVER_FORMS}")),
            (Some(_), None) => {
                return Err(format!(
                    "args, env and cwd are for a server started by command; {SERVER_FORMS}"
                ));
            }
            (None, Some(_)) => {
                return Err(format!(
                    "headers are for a server reached by url (a stdio server takes env); \
                     {SERVER_FORMS}"
                ));
            }
        };
        Ok(Self {
            endpoint,
            timeout: raw.timeout,
            tools: raw.tools,
        })
    }
}

impl McpServerBinding {
    /// Whether this process must start the server: no such server can run in Lambda.
    pub fn is_stdio(&self) -> bool {
        matches!(self.endpoint, Endpoint::Stdio { .. })
    }
}

/// `tools = "*"` (every tool the server lists) or `tools = ["a", "b"]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "RawSelection")]
pub enum ToolSelection {
    All,
    Named(Vec<String>),
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawSelection {
    One(String),
    Many(Vec<String>),
}

impl TryFrom<RawSelection> for ToolSelection {
    type Error = String;
    fn try_from(raw: RawSelection) -> Result<Self, String> {
        match raw {
            RawSelection::One(star) if star == "*" => Ok(Self::All),
            RawSelection::One(other) => Err(format!(
                "tools must be \"*\" or a list of tool names, not {other:?}"
            )),
            RawSelection::Many(names) => Ok(Self::Named(names)),
        }
    }
}

/// `mcp = { server = "orders", tool = "issue_refund" }` in a `[tools.<name>]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpToolBinding {
    /// A server named under `[mcp.*]` in the same definition.
    pub server: String,
    /// The tool's name as the server lists it.
    pub tool: String,
}

/// Header and env values are secrets: show their names only.
impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Http { url, headers } => f
                .debug_struct("Http")
                .field("url", url)
                .field("headers", &headers.keys().collect::<Vec<_>>())
                .finish(),
            Endpoint::Stdio {
                command,
                args,
                env,
                cwd,
            } => f
                .debug_struct("Stdio")
                .field("command", command)
                .field("args", args)
                .field("env", &env.keys().collect::<Vec<_>>())
                .field("cwd", cwd)
                .finish(),
        }
    }
}

impl fmt::Debug for McpServerBinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("McpServerBinding")
            .field("endpoint", &self.endpoint)
            .field("timeout", &self.timeout)
            .field("tools", &self.tools)
            .finish()
    }
}

impl McpServerBinding {
    /// Fills `${VAR}` from `env` and checks every setting. `field` is where the binding sits,
    /// such as `mcp.orders`; the server's name is its last segment.
    pub fn resolve(&self, field: &str, env: Lookup<'_>) -> Result<ResolvedMcpServer, BindingError> {
        let name = field.rsplit('.').next().unwrap_or(field).to_string();
        let mut secrets = Secrets::default();

        let transport = match &self.endpoint {
            Endpoint::Http { url, headers } => {
                resolve_http(field, url, headers, env, &mut secrets)?
            }
            Endpoint::Stdio {
                command,
                args,
                env: vars,
                cwd,
            } => resolve_stdio(
                field,
                command,
                args,
                vars,
                cwd.as_deref(),
                env,
                &mut secrets,
            )?,
        };

        let timeout_field = format!("{field}.timeout");
        let timeout = match &self.timeout {
            None => DEFAULT_TIMEOUT,
            Some(text) => humantime::parse_duration(text)
                .map_err(|e| BindingError::invalid(&timeout_field, e.to_string()))?,
        };
        if timeout.is_zero() || timeout > MAX_TIMEOUT {
            return Err(BindingError::invalid(
                &timeout_field,
                "must be more than 0s and at most 60s",
            ));
        }

        if let Some(ToolSelection::Named(names)) = &self.tools {
            let tools_field = format!("{field}.tools");
            for (i, tool) in names.iter().enumerate() {
                if tool.is_empty() {
                    return Err(BindingError::invalid(&tools_field, "a tool name is empty"));
                }
                if names[..i].contains(tool) {
                    return Err(BindingError::invalid(
                        &tools_field,
                        format!("{tool} is named twice"),
                    ));
                }
            }
        }

        Ok(ResolvedMcpServer {
            name,
            transport,
            timeout,
            tools: self.tools.clone(),
            secrets,
        })
    }
}

fn resolve_http(
    field: &str,
    template: &str,
    header_templates: &BTreeMap<String, String>,
    env: Lookup<'_>,
    secrets: &mut Secrets,
) -> Result<Transport, BindingError> {
    let url_field = format!("{field}.url");
    let url_text = env_template::expand_into(template, &url_field, env, secrets, Filling::Text)?;
    let url = reqwest::Url::parse(&url_text)
        .ok()
        .filter(|url| matches!(url.scheme(), "http" | "https") && url.has_host())
        .ok_or_else(|| BindingError::invalid(&url_field, "must be an http or https URL"))?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err(BindingError::invalid(
            &url_field,
            "carries credentials (user:password@ before the host), which the SDK's logs may \
             print; send them in a header instead, such as \
             headers = { Authorization = \"Basic ${ORDERS_MCP_BASIC_AUTH}\" }",
        ));
    }
    let url_shown = if env_template::mentions_env(template) {
        template.to_string()
    } else {
        url.to_string()
    };

    let mut headers = HashMap::new();
    for (header, template) in header_templates {
        let header_field = format!("{field}.headers.{header}");
        let value =
            env_template::expand_into(template, &header_field, env, secrets, Filling::Credential)?;
        let header_name = HeaderName::from_bytes(header.as_bytes())
            .map_err(|_| BindingError::invalid(&header_field, "not a valid header name"))?;
        if RESERVED_HEADERS.contains(&header_name.as_str()) {
            return Err(BindingError::invalid(
                &header_field,
                "set by the MCP transport itself; a binding may not send it",
            ));
        }
        let mut header_value = HeaderValue::from_str(&value)
            .map_err(|_| BindingError::invalid(&header_field, "not a valid header value"))?;
        header_value.set_sensitive(true);
        secrets.add_header(&value);
        headers.insert(header_name, header_value);
    }
    Ok(Transport::Http {
        url,
        url_shown,
        headers,
    })
}

fn resolve_stdio(
    field: &str,
    command: &str,
    args: &[String],
    vars: &BTreeMap<String, String>,
    cwd: Option<&str>,
    env: Lookup<'_>,
    secrets: &mut Secrets,
) -> Result<Transport, BindingError> {
    let command_field = format!("{field}.command");
    let program = env_template::expand_into(command, &command_field, env, secrets, Filling::Text)?;
    if program.trim().is_empty() {
        return Err(BindingError::invalid(
            &command_field,
            "names the program to start, such as \"npx\"",
        ));
    }
    let args_field = format!("{field}.args");
    let mut expanded_args = Vec::with_capacity(args.len());
    for arg in args {
        expanded_args.push(env_template::expand_into(
            arg,
            &args_field,
            env,
            secrets,
            Filling::Text,
        )?);
    }
    let mut expanded_vars = BTreeMap::new();
    for (var, template) in vars {
        let var_field = format!("{field}.env.{var}");
        let valid = !var.is_empty() && !var.contains(['=', '\0']);
        if !valid {
            return Err(BindingError::invalid(&var_field, "not a variable name"));
        }
        let value =
            env_template::expand_into(template, &var_field, env, secrets, Filling::Credential)?;
        secrets.add(&value);
        expanded_vars.insert(var.clone(), value);
    }
    let cwd = cwd
        .map(|dir| {
            let cwd_field = format!("{field}.cwd");
            let dir = env_template::expand_into(dir, &cwd_field, env, secrets, Filling::Text)?;
            Ok::<_, BindingError>(std::path::PathBuf::from(dir))
        })
        .transpose()?;
    Ok(Transport::Stdio {
        program,
        args: expanded_args,
        vars: expanded_vars,
        cwd,
    })
}

/// How a resolved server is reached.
#[derive(Clone)]
enum Transport {
    Http {
        url: reqwest::Url,
        /// The URL as it may be shown: the template when it came from the environment.
        url_shown: String,
        headers: HashMap<HeaderName, HeaderValue>,
    },
    Stdio {
        program: String,
        args: Vec<String>,
        vars: BTreeMap<String, String>,
        cwd: Option<std::path::PathBuf>,
    },
}

/// A server binding with its variables filled and its settings checked.
#[derive(Clone)]
pub struct ResolvedMcpServer {
    name: String,
    transport: Transport,
    timeout: Duration,
    tools: Option<ToolSelection>,
    /// Values that must never show: every header and `env` value, every value a `${VAR}`
    /// filled in.
    secrets: Secrets,
}

impl ResolvedMcpServer {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// `None` when the definition binds this server's tools one by one.
    pub fn tools(&self) -> Option<&ToolSelection> {
        self.tools.as_ref()
    }

    /// Where it is, as it may be shown: its URL, or its command (arguments redacted).
    fn shown(&self) -> String {
        match &self.transport {
            Transport::Http { url_shown, .. } => url_shown.clone(),
            Transport::Stdio { program, args, .. } => {
                self.redact(format!("{program} {}", args.join(" ")).trim_end())
            }
        }
    }

    /// `text` with every secret, in any form, replaced by its variable's `${NAME}` or
    /// `[redacted]`.
    fn redact(&self, text: &str) -> String {
        self.secrets.redact(text)
    }
}

impl fmt::Debug for ResolvedMcpServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut shown = f.debug_struct("ResolvedMcpServer");
        shown.field("name", &self.name);
        match &self.transport {
            Transport::Http {
                url_shown, headers, ..
            } => shown
                .field("url", url_shown)
                .field("headers", &headers.keys().collect::<Vec<_>>()),
            Transport::Stdio { vars, cwd, .. } => shown
                .field("command", &self.shown())
                .field("env", &vars.keys().collect::<Vec<_>>())
                .field("cwd", cwd),
        };
        shown
            .field("timeout", &self.timeout)
            .field("tools", &self.tools)
            .finish()
    }
}

/// Why a server or its tools cannot be used. Details never carry a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum McpError {
    #[error("the MCP server {server} is unreachable: {detail}")]
    Unreachable { server: String, detail: String },
    #[error("the MCP server {server} refused: {detail}")]
    Refused { server: String, detail: String },
    #[error("the MCP server {server} lists no tool named {tool}")]
    UnknownTool { server: String, tool: String },
}

type Session = RunningService<RoleClient, ClientConfig>;

/// A connected MCP server. Cheap to clone: every clone shares one session.
#[derive(Clone)]
pub struct McpServer {
    inner: Arc<Inner>,
}

struct Inner {
    config: ResolvedMcpServer,
    /// The HTTP client of a server reached by URL.
    http: Option<reqwest::Client>,
    /// The last words of a stdio server's process on its stderr.
    stderr: StderrTail,
    /// The live session; replaced when it is found dead before a call.
    session: Mutex<Arc<Session>>,
}

impl fmt::Debug for McpServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("McpServer")
            .field("name", &self.inner.config.name)
            .field("at", &self.inner.config.shown())
            .finish()
    }
}

impl McpServer {
    /// Opens a session (`initialize` over Streamable HTTP, or over the stdio of the server's
    /// process, started now).
    pub async fn connect(config: ResolvedMcpServer) -> Result<Self, McpError> {
        let http = match &config.transport {
            Transport::Http { .. } => Some(
                super::trust::client_builder()
                    .redirect(reqwest::redirect::Policy::none())
                    // A fresh connection per request: a connect error then means nothing was sent.
                    .pool_max_idle_per_host(0)
                    .connect_timeout(config.timeout)
                    .build()
                    .map_err(|e| McpError::Unreachable {
                        server: config.name.clone(),
                        detail: config.redact(&e.to_string()),
                    })?,
            ),
            Transport::Stdio { .. } => None,
        };
        let stderr = StderrTail::default();
        let session = open(&config, http.as_ref(), &stderr).await?;
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                http,
                stderr,
                session: Mutex::new(Arc::new(session)),
            }),
        })
    }

    pub fn name(&self) -> &str {
        &self.inner.config.name
    }

    /// Every tool the server lists (`tools/list`, all pages), specs and hints frozen now.
    pub async fn tools(&self) -> Result<Vec<McpTool>, McpError> {
        let session = self.current().await;
        let listed = match self.list(&session).await {
            Err(McpError::Unreachable { .. }) => {
                // The session may have died since it was opened: one new one, then give up.
                let fresh = self.reconnect(&session).await?;
                self.list(&fresh).await?
            }
            other => other?,
        };
        Ok(listed
            .into_iter()
            .map(|tool| McpTool::from_listing(self.clone(), tool))
            .collect())
    }

    /// One tool by the name the server lists it under.
    pub async fn tool(&self, name: &str) -> Result<McpTool, McpError> {
        self.tools()
            .await?
            .into_iter()
            .find(|tool| tool.remote_name == name)
            .ok_or_else(|| McpError::UnknownTool {
                server: self.name().to_string(),
                tool: name.to_string(),
            })
    }

    /// The tools the binding's `tools` selects: all for `"*"`, each named one (an error if the
    /// server does not list it), none when absent.
    pub async fn selected_tools(&self) -> Result<Vec<McpTool>, McpError> {
        let Some(selection) = self.inner.config.tools.clone() else {
            return Ok(Vec::new());
        };
        let listed = self.tools().await?;
        match selection {
            ToolSelection::All => Ok(listed),
            ToolSelection::Named(names) => names
                .iter()
                .map(|name| {
                    listed
                        .iter()
                        .find(|tool| &tool.remote_name == name)
                        .cloned()
                        .ok_or_else(|| McpError::UnknownTool {
                            server: self.name().to_string(),
                            tool: name.clone(),
                        })
                })
                .collect(),
        }
    }

    async fn list(&self, session: &Session) -> Result<Vec<rmcp::model::Tool>, McpError> {
        let config = &self.inner.config;
        match tokio::time::timeout(config.timeout, session.list_all_tools()).await {
            Ok(Ok(tools)) => Ok(tools),
            Ok(Err(ServiceError::McpError(error))) => Err(McpError::Refused {
                server: config.name.clone(),
                detail: config.redact(&format!("tools/list: {}", error.message)),
            }),
            Ok(Err(error)) => Err(self.unreachable(&cause(&error))),
            Err(_) => Err(self.unreachable(&format!(
                "no answer to tools/list within {}",
                humantime::format_duration(config.timeout)
            ))),
        }
    }

    async fn current(&self) -> Arc<Session> {
        self.inner.session.lock().await.clone()
    }

    /// Replaces `stale` with a new session, unless another caller already did.
    async fn reconnect(&self, stale: &Arc<Session>) -> Result<Arc<Session>, McpError> {
        let mut slot = self.inner.session.lock().await;
        if !Arc::ptr_eq(&slot, stale) {
            return Ok(slot.clone());
        }
        if matches!(self.inner.config.transport, Transport::Stdio { .. }) {
            tracing::warn!(server = %self.inner.config.name, "the MCP server's process is gone: starting it again");
        }
        let inner = &self.inner;
        let fresh = Arc::new(open(&inner.config, inner.http.as_ref(), &inner.stderr).await?);
        *slot = fresh.clone();
        Ok(fresh)
    }

    /// A session that answered a ping just now, or a new one. Nothing of a call is sent yet.
    async fn ready(&self) -> Result<Arc<Session>, McpError> {
        let session = self.current().await;
        let ping = ClientRequest::PingRequest(PingRequest::default());
        let options = PeerRequestOptions::with_timeout(self.inner.config.timeout);
        let alive = match session.send_request_with_option(ping, options).await {
            Ok(handle) => matches!(
                handle.await_response().await,
                Ok(_) | Err(ServiceError::McpError(_))
            ),
            Err(_) => false,
        };
        if alive {
            Ok(session)
        } else {
            self.reconnect(&session).await
        }
    }

    fn unreachable(&self, detail: &str) -> McpError {
        McpError::Unreachable {
            server: self.inner.config.name.clone(),
            detail: self.inner.config.redact(detail),
        }
    }

    /// Sends one `tools/call` and says what came of it, with no secret of the binding in it
    /// in any form, whatever the server answered: redacted here, on the whole outcome.
    async fn call_tool(&self, tool: &str, call: ToolCall<'_>) -> ToolOutcome {
        let outcome = self.send_call(tool, call).await;
        self.inner.config.secrets.redact_outcome(outcome)
    }

    /// Sends one `tools/call` and says what came of it; see the module's semantics.
    async fn send_call(&self, tool: &str, call: ToolCall<'_>) -> ToolOutcome {
        let config = &self.inner.config;
        let session = match self.ready().await {
            Ok(session) => session,
            Err(error) => {
                return ToolOutcome::Failed {
                    error: format!("{error}; the call was not sent"),
                };
            }
        };
        let mut meta = MetaObject::new();
        meta.0.insert(
            IDEMPOTENCY_META_KEY.to_string(),
            Value::String(call.idempotency_key.to_string()),
        );
        let mut params = CallToolRequestParams::new(tool.to_string());
        params.arguments = match call.args.as_value() {
            Value::Object(map) => Some(map),
            _ => None,
        };
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        let options =
            PeerRequestOptions::with_timeout(config.timeout).with_meta(RequestMetaObject(meta));
        let handle = match session.send_request_with_option(request, options).await {
            Ok(handle) => handle,
            Err(error) => {
                return ToolOutcome::Failed {
                    error: format!(
                        "the MCP server {} could not be given the call ({}){}; it was not sent",
                        config.name,
                        cause(&error),
                        self.last_words().await
                    ),
                };
            }
        };
        match handle.await_response().await {
            Ok(ServerResult::CallToolResult(result)) => outcome_of(result),
            Ok(_) => ToolOutcome::Unknown {
                detail: format!(
                    "the MCP server {} answered tools/call with something other than a result",
                    config.name
                ),
            },
            Err(ServiceError::McpError(error)) => ToolOutcome::Failed {
                error: format!(
                    "the MCP server {} refused the call: {}",
                    config.name, error.message
                ),
            },
            Err(ServiceError::Timeout { timeout }) => ToolOutcome::Unknown {
                detail: format!(
                    "the MCP server {} did not answer within {}; the call may have taken effect",
                    config.name,
                    humantime::format_duration(timeout)
                ),
            },
            Err(error) if never_connected(&error) => ToolOutcome::Failed {
                error: format!(
                    "could not connect to the MCP server {} ({}); the call was not sent",
                    config.name,
                    cause(&error)
                ),
            },
            Err(error) => ToolOutcome::Unknown {
                detail: format!(
                    "the connection to the MCP server {} failed after the call was sent ({}){}; \
                     it may have taken effect",
                    config.name,
                    cause(&error),
                    self.last_words().await
                ),
            },
        }
    }

    /// What a stdio server's process last wrote to its stderr, for an error that says it died:
    /// `; its stderr said: …`, or nothing.
    async fn last_words(&self) -> String {
        match self.inner.config.transport {
            Transport::Stdio { .. } => self.inner.stderr.said().await,
            Transport::Http { .. } => String::new(),
        }
    }
}

/// The innermost reason of a transport error ("Connection refused", "HTTP 502"), without the
/// SDK's type names.
fn cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut deepest = error;
    loop {
        // The SDK wraps the HTTP client's error without naming it as the source.
        if let Some(StreamableHttpError::Client(inner)) =
            deepest.downcast_ref::<StreamableHttpError<reqwest::Error>>()
        {
            deepest = inner;
            continue;
        }
        match deepest.source() {
            Some(next) => deepest = next,
            None => return deepest.to_string(),
        }
    }
}

/// Whether the request's own POST failed to connect: with no pooled connections, nothing of
/// it reached the server.
fn never_connected(error: &ServiceError) -> bool {
    let ServiceError::TransportSend(error) = error else {
        return false;
    };
    matches!(
        error.error.downcast_ref::<StreamableHttpError<reqwest::Error>>(),
        Some(StreamableHttpError::Client(inner)) if inner.is_connect()
    )
}

/// Opens a session; a stdio server's process, started now, writes its stderr to `stderr`, and
/// an error saying it would not start quotes its last lines.
async fn open(
    config: &ResolvedMcpServer,
    http: Option<&reqwest::Client>,
    stderr: &StderrTail,
) -> Result<Session, McpError> {
    let client = ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("countersign", env!("CARGO_PKG_VERSION")),
    );
    let unreachable = |detail: String| McpError::Unreachable {
        server: config.name.clone(),
        detail: config.redact(&detail),
    };
    let initialized = match (&config.transport, http) {
        (Transport::Http { url, headers, .. }, Some(http)) => {
            let transport_config = StreamableHttpClientTransportConfig::with_uri(url.as_str())
                .custom_headers(headers.clone())
                // Never re-send a request the server refused for its session: this binding decides.
                .reinit_on_expired_session(false)
                .max_json_response_size(MAX_RESPONSE_BYTES)
                .max_sse_event_size(MAX_RESPONSE_BYTES);
            let transport =
                StreamableHttpClientTransport::with_client(http.clone(), transport_config);
            tokio::time::timeout(config.timeout, client.serve(transport)).await
        }
        (Transport::Stdio { .. }, _) => {
            let transport = spawn(config, stderr)
                .map_err(|e| unreachable(format!("cannot start {}: {e}", config.shown())))?;
            // Timing out drops the transport, which kills the process it started.
            tokio::time::timeout(config.timeout, client.serve(transport)).await
        }
        (Transport::Http { .. }, None) => unreachable!("a server reached by URL has its client"),
    };
    let why = match initialized {
        Ok(Ok(session)) => return Ok(session),
        Ok(Err(ClientInitializeError::TransportError { error, .. })) => cause(error.error.as_ref()),
        Ok(Err(error)) => cause(&error),
        Err(_) => format!(
            "no answer to initialize within {}",
            humantime::format_duration(config.timeout)
        ),
    };
    let said = match config.transport {
        Transport::Stdio { .. } => stderr.said().await,
        Transport::Http { .. } => String::new(),
    };
    Err(unreachable(format!("{why}{said}")))
}

/// The longest line of a stdio server's stderr logged as one event; a longer one is split.
const MAX_STDERR_LINE: u64 = 8 * 1024;
/// How many of a stdio server's last stderr lines an error quotes.
const STDERR_LINES_QUOTED: usize = 5;
/// The most characters of one quoted line, escaped.
const STDERR_LINE_QUOTED: usize = 240;
/// How long an error waits for a dead server's last stderr lines to be read.
const STDERR_SETTLE: Duration = Duration::from_millis(500);

/// The last lines a stdio server's process wrote to its stderr, redacted, escaped onto one
/// line each and cut short, for the error that says it would not start or died: its own words
/// ("None of the specified directories are accessible") say why. A new process starts afresh.
#[derive(Clone, Default)]
struct StderrTail(Arc<std::sync::Mutex<Tail>>);

#[derive(Default)]
struct Tail {
    lines: std::collections::VecDeque<String>,
    /// Closed once the current process's stderr has been read to its end.
    reading: Option<tokio::sync::watch::Receiver<()>>,
}

impl StderrTail {
    /// A new process's stderr: the last one's lines are forgotten. Reading holds the sender
    /// and drops it at the end.
    fn restart(&self) -> tokio::sync::watch::Sender<()> {
        let (sender, reading) = tokio::sync::watch::channel(());
        let mut tail = self.0.lock().unwrap();
        tail.lines.clear();
        tail.reading = Some(reading);
        sender
    }

    /// Keeps `line` (redacted already) as one of the last.
    fn push(&self, line: &str) {
        let escaped = crate::logs::escaped(line, false);
        let quoted = match escaped.char_indices().nth(STDERR_LINE_QUOTED) {
            Some((at, _)) => format!("{}…", &escaped[..at]),
            None => escaped,
        };
        let mut tail = self.0.lock().unwrap();
        if tail.lines.len() == STDERR_LINES_QUOTED {
            tail.lines.pop_front();
        }
        tail.lines.push_back(quoted);
    }

    /// `; its stderr said: a | b`, once the process's stderr has ended or [`STDERR_SETTLE`]
    /// has passed; nothing when it said nothing.
    async fn said(&self) -> String {
        let reading = self.0.lock().unwrap().reading.clone();
        if let Some(mut reading) = reading {
            // Never sent on: this ends when reading does, the sender dropped.
            let _ = tokio::time::timeout(STDERR_SETTLE, reading.changed()).await;
        }
        let tail = self.0.lock().unwrap();
        if tail.lines.is_empty() {
            return String::new();
        }
        let lines: Vec<&str> = tail.lines.iter().map(String::as_str).collect();
        format!("; its stderr said: {}", lines.join(" | "))
    }
}

/// Starts a stdio server: its own process group, killed with everything it started when its
/// session is dropped (or this process ends), its stderr logged and its last lines kept in
/// `tail`, never on this process's stdout, which may be `countersign mcp`'s own protocol
/// channel.
fn spawn(config: &ResolvedMcpServer, tail: &StderrTail) -> std::io::Result<TokioChildProcess> {
    let Transport::Stdio {
        program,
        args,
        vars,
        cwd,
    } = &config.transport
    else {
        unreachable!("only a stdio server is spawned");
    };
    let mut command = tokio::process::Command::new(program);
    command.args(args).env_clear();
    for name in INHERITED_ENV {
        if let Some(value) = std::env::var_os(name) {
            command.env(name, value);
        }
    }
    command.envs(vars);
    if let Some(cwd) = cwd {
        command.current_dir(cwd);
    }
    let mut wrapped = CommandWrap::from(command);
    #[cfg(unix)]
    wrapped.wrap(process_wrap::tokio::ProcessGroup::leader());
    wrapped.wrap(process_wrap::tokio::KillOnDrop);
    let (transport, stderr) = TokioChildProcess::builder(wrapped)
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    if let Some(stderr) = stderr {
        let reading = tail.restart();
        tokio::spawn(log_stderr(config.clone(), stderr, tail.clone(), reading));
    }
    Ok(transport)
}

/// Each line a stdio server writes to its stderr, as a log event with its secrets redacted
/// (its control characters escaped by the log), and kept in `tail`. `reading` is dropped at
/// the end.
async fn log_stderr(
    config: ResolvedMcpServer,
    stderr: tokio::process::ChildStderr,
    tail: StderrTail,
    reading: tokio::sync::watch::Sender<()>,
) {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt};
    let mut reader = tokio::io::BufReader::new(stderr);
    let mut line = Vec::new();
    loop {
        line.clear();
        match (&mut reader)
            .take(MAX_STDERR_LINE)
            .read_until(b'\n', &mut line)
            .await
        {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                let text = config.redact(String::from_utf8_lossy(&line).trim_end());
                tracing::info!(server = %config.name, "{text}");
                if !text.trim().is_empty() {
                    tail.push(&text);
                }
            }
        }
    }
    drop(reading);
}

/// What a `tools/call` result means for the action: the server's result as it gave it, its
/// content blocks, structured content and `isError`. The one place an MCP outcome is made.
fn outcome_of(result: CallToolResult) -> ToolOutcome {
    ToolOutcome::Mcp {
        content: result
            .content
            .iter()
            .filter_map(|block| serde_json::to_value(block).ok())
            .collect(),
        structured_content: result.structured_content,
        is_error: result.is_error == Some(true),
    }
}

/// One tool of an MCP server, as listed.
#[derive(Clone)]
pub struct McpTool {
    server: McpServer,
    /// The name the server knows it by.
    remote_name: String,
    spec: ToolSpec,
    hints: ToolHints,
}

impl fmt::Debug for McpTool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("McpTool")
            .field("server", &self.server.name())
            .field("tool", &self.remote_name)
            .field("name", &self.spec.name)
            .field("hints", &self.hints)
            .finish()
    }
}

impl McpTool {
    fn from_listing(server: McpServer, tool: rmcp::model::Tool) -> Self {
        let annotations = tool.annotations.as_ref();
        let hints = ToolHints {
            read_only: annotations.and_then(|a| a.read_only_hint) == Some(true),
            destructive: annotations.and_then(|a| a.destructive_hint) == Some(true),
        };
        let spec = ToolSpec {
            name: tool.name.to_string(),
            description: tool
                .description
                .as_deref()
                .or(tool.title.as_deref())
                .unwrap_or_default()
                .to_string(),
            input_schema: Value::Object((*tool.input_schema).clone()),
        };
        Self {
            server,
            remote_name: tool.name.to_string(),
            spec,
            hints,
        }
    }

    /// The same tool under another name for the model and policy (`[tools.<name>]`); calls
    /// still use the server's name.
    pub fn exposed_as(mut self, name: impl Into<String>) -> Self {
        self.spec.name = name.into();
        self
    }

    /// The name the server lists it under.
    pub fn remote_name(&self) -> &str {
        &self.remote_name
    }

    pub fn server(&self) -> &McpServer {
        &self.server
    }
}

#[async_trait]
impl Tool for McpTool {
    fn spec(&self) -> ToolSpec {
        self.spec.clone()
    }

    fn hints(&self) -> ToolHints {
        self.hints
    }

    async fn call(&self, call: ToolCall<'_>) -> ToolOutcome {
        self.server.call_tool(&self.remote_name, call).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "ORDERS_MCP_URL" => Some("http://127.0.0.1:8791/mcp".into()),
            "ORDERS_MCP_TOKEN" => Some("tok-s3cret".into()),
            _ => None,
        }
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Definition {
        mcp: BTreeMap<String, McpServerBinding>,
        #[serde(default)]
        tools: BTreeMap<String, ToolEntry>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct ToolEntry {
        mcp: McpToolBinding,
    }

    const DEFINITION: &str = r#"
        [mcp.orders]
        url = "${ORDERS_MCP_URL}"
        headers = { Authorization = "Bearer ${ORDERS_MCP_TOKEN}" }
        timeout = "10s"
        tools = "*"

        [tools.issue_refund]
        mcp = { server = "orders", tool = "issue_refund" }
    "#;

    fn orders(text: &str) -> McpServerBinding {
        let definition: Definition = toml::from_str(text).unwrap();
        definition.mcp["orders"].clone()
    }

    #[test]
    fn a_definition_binds_a_server_and_a_tool() {
        let definition: Definition = toml::from_str(DEFINITION).unwrap();
        let orders = &definition.mcp["orders"];
        assert_eq!(orders.tools, Some(ToolSelection::All));
        assert_eq!(
            definition.tools["issue_refund"].mcp,
            McpToolBinding {
                server: "orders".into(),
                tool: "issue_refund".into()
            }
        );
        let resolved = orders.resolve("mcp.orders", &env).unwrap();
        assert_eq!(resolved.name(), "orders");
        assert_eq!(resolved.timeout(), Duration::from_secs(10));
        assert_eq!(resolved.shown(), "${ORDERS_MCP_URL}");
    }

    #[test]
    fn a_list_of_names_selects_those_tools() {
        let binding = orders("[mcp.orders]\nurl = \"http://x/mcp\"\ntools = [\"a\", \"b\"]\n");
        assert_eq!(
            binding.tools,
            Some(ToolSelection::Named(vec!["a".into(), "b".into()]))
        );
        let resolved = binding.resolve("mcp.orders", &env).unwrap();
        assert_eq!(resolved.timeout(), DEFAULT_TIMEOUT);
    }

    #[test]
    fn unknown_fields_and_bad_selections_are_refused() {
        for text in [
            "[mcp.orders]\nurl = \"http://x\"\nmethod = \"POST\"\n",
            "[mcp.orders]\nurl = \"http://x\"\ntools = \"all\"\n",
            "[mcp.orders]\nurl = \"http://x\"\n[tools.t]\nmcp = { server = \"orders\", tool = \"t\", x = 1 }\n",
        ] {
            assert!(toml::from_str::<Definition>(text).is_err(), "{text}");
        }
    }

    #[test]
    fn an_unset_variable_names_the_field_and_the_variable() {
        let binding = orders(
            "[mcp.orders]\nurl = \"http://x/mcp\"\nheaders = { Authorization = \"Bearer ${NOPE}\" }\n",
        );
        let error = binding.resolve("mcp.orders", &env).unwrap_err().to_string();
        assert_eq!(
            error,
            "mcp.orders.headers.Authorization: the environment variable NOPE is not set"
        );
    }

    #[test]
    fn bad_settings_name_their_field() {
        let cases = [
            ("url = \"ftp://x\"", "mcp.orders.url"),
            (
                "url = \"http://x\"\ntimeout = \"61s\"",
                "mcp.orders.timeout",
            ),
            ("url = \"http://x\"\ntimeout = \"0s\"", "mcp.orders.timeout"),
            (
                "url = \"http://x\"\ntimeout = \"soon\"",
                "mcp.orders.timeout",
            ),
            (
                "url = \"http://x\"\nheaders = { Accept = \"text/html\" }",
                "mcp.orders.headers.Accept",
            ),
            (
                "url = \"http://x\"\ntools = [\"a\", \"a\"]",
                "mcp.orders.tools",
            ),
        ];
        for (body, field) in cases {
            let binding = orders(&format!("[mcp.orders]\n{body}\n"));
            let error = binding.resolve("mcp.orders", &env).unwrap_err().to_string();
            assert!(error.starts_with(&format!("{field}: ")), "{body}: {error}");
        }
    }

    #[test]
    fn a_url_with_credentials_is_refused_without_showing_them() {
        let binding = orders("[mcp.orders]\nurl = \"https://bot:hunter22@orders.example/mcp\"\n");
        let error = binding.resolve("mcp.orders", &env).unwrap_err().to_string();
        assert!(
            error.starts_with("mcp.orders.url: carries credentials"),
            "{error}"
        );
        assert!(!error.contains("hunter22"), "{error}");
    }

    #[test]
    fn a_stdio_server_fills_its_variables_and_never_shows_its_env_values() {
        let binding = orders(
            "[mcp.orders]\ncommand = \"orders-mcp\"\nargs = [\"--token\", \"${ORDERS_MCP_TOKEN}\"]\n\
             env = { ORDERS_KEY = \"literal-key\", ORDERS_TOKEN = \"${ORDERS_MCP_TOKEN}\" }\n",
        );
        let resolved = binding.resolve("mcp.orders", &env).unwrap();
        let Transport::Stdio {
            program,
            args,
            vars,
            ..
        } = &resolved.transport
        else {
            panic!("{resolved:?}");
        };
        assert_eq!(program, "orders-mcp");
        assert_eq!(args, &["--token", "tok-s3cret"]);
        assert_eq!(vars["ORDERS_TOKEN"], "tok-s3cret");
        let shown = format!("{binding:?} {resolved:?}");
        assert!(
            !shown.contains("tok-s3cret") && !shown.contains("literal-key"),
            "{shown}"
        );
        assert_eq!(resolved.shown(), "orders-mcp --token ${ORDERS_MCP_TOKEN}");
        assert_eq!(
            resolved.redact("ORDERS_KEY=literal-key"),
            "ORDERS_KEY=[redacted]"
        );

        let unset = orders("[mcp.orders]\ncommand = \"x\"\nenv = { A = \"${NOPE}\" }\n");
        let error = unset.resolve("mcp.orders", &env).unwrap_err().to_string();
        assert_eq!(
            error,
            "mcp.orders.env.A: the environment variable NOPE is not set"
        );
    }

    #[test]
    fn secrets_never_show_in_debug_or_redacted_text() {
        let binding = orders(
            "[mcp.orders]\nurl = \"http://127.0.0.1:8791/mcp\"\nheaders = { Authorization = \"Bearer ${ORDERS_MCP_TOKEN}\", X-Literal = \"literal-key\" }\n",
        );
        let resolved = binding.resolve("mcp.orders", &env).unwrap();
        let shown = format!("{binding:?} {resolved:?}");
        assert!(
            !shown.contains("tok-s3cret") && !shown.contains("literal-key"),
            "{shown}"
        );
        assert_eq!(
            resolved.redact("sent Bearer tok-s3cret and literal-key"),
            "sent [redacted] and [redacted]"
        );
        assert_eq!(
            resolved.redact("token tok-s3cret"),
            "token ${ORDERS_MCP_TOKEN}"
        );
    }

    #[test]
    fn a_result_becomes_an_outcome_as_the_server_gave_it() {
        use rmcp::model::ContentBlock;
        use serde_json::json;
        let mut image = CallToolResult::success(vec![
            ContentBlock::text("The chart:"),
            ContentBlock::image("iVBORw0KGgo=", "image/png"),
        ]);
        image.structured_content = Some(json!({"points": 3}));
        assert_eq!(
            outcome_of(image),
            ToolOutcome::Mcp {
                content: vec![
                    json!({"type": "text", "text": "The chart:"}),
                    json!({"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"}),
                ],
                structured_content: Some(json!({"points": 3})),
                is_error: false,
            }
        );
        let refused = CallToolResult::error(vec![ContentBlock::text("order is closed")]);
        assert_eq!(
            outcome_of(refused),
            ToolOutcome::Mcp {
                content: vec![json!({"type": "text", "text": "order is closed"})],
                structured_content: None,
                is_error: true,
            }
        );
    }
}
