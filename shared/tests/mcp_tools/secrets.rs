//! An MCP server that quotes back the binding's secrets, over Streamable HTTP, in every form a
//! server may: its header in a text result, as a key and percent-encoded in
//! `structuredContent`, JSON-escaped in an error result, and in a protocol error's message. No
//! form of a secret reaches an outcome, the store, the audit or the API; nor, over stdio, a
//! server's `env` echoed back.

use super::*;
use axum::http::request::Parts;
use shared::engine::Engine;
use shared::ports::clock::ManualClock;
use shared::testing::McpTools;

/// A header's secret that a JSON string escapes.
const QUOTED_TOKEN: &str = "tok\"MCP\\secret-5150";
/// A secret in the server's URL, which the URL percent-encodes.
const URL_KEY: &str = "mcp key/é-909";
/// A header's value written in the definition itself.
const LITERAL: &str = "literal-mcp-key-777";

const SECRETS: [&str; 3] = [QUOTED_TOKEN, URL_KEY, LITERAL];

/// Its tools, each quoting in its own way.
const CARELESS_TOOLS: [&str; 4] = ["echo_text", "echo_structured", "refuse", "protocol_error"];

/// Every byte that is not a letter or a digit as `%xx`, in lower case.
fn lower_case_percent(text: &str) -> String {
    text.bytes()
        .map(|b| match b.is_ascii_alphanumeric() {
            true => (b as char).to_string(),
            false => format!("%{b:02x}"),
        })
        .collect()
}

/// Quotes back what it was sent: the `Authorization` and `X-Api-Key` headers and the URI.
fn careless_answer(
    request: CallToolRequestParams,
    parts: &Parts,
) -> Result<CallToolResult, ErrorData> {
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .map(|value| value.to_str().unwrap_or_default().to_string())
            .unwrap_or_default()
    };
    let (authorization, api_key) = (header("authorization"), header("x-api-key"));
    let uri = parts.uri.to_string();
    match request.name.as_ref() {
        "echo_text" => Ok(CallToolResult::success(vec![ContentBlock::text(
            json!({
                "authorization": authorization,
                "api_key_as_json": serde_json::to_string(&api_key).unwrap(),
                "uri": uri,
            })
            .to_string(),
        )])),
        "echo_structured" => Ok(CallToolResult::structured(json!({
            authorization.clone(): "as a key",
            "percent": lower_case_percent(&authorization),
            "nested": [{"uri": uri, "api_key": api_key}],
        }))),
        "refuse" => Ok(CallToolResult::error(vec![ContentBlock::text(format!(
            "refused {}",
            serde_json::to_string(&authorization).unwrap()
        ))])),
        _ => Err(ErrorData::invalid_params(
            format!("bad token {authorization} for {uri}"),
            None,
        )),
    }
}

/// The careless server on loopback: its address and its serving task.
async fn careless_server() -> (SocketAddr, JoinHandle<()>) {
    let listing = CARELESS_TOOLS
        .into_iter()
        .map(|name| McpListing::new(name, "Quotes what it was sent.", object_schema(json!({}))))
        .collect();
    McpTools::new(listing, careless_answer)
        .serve()
        .await
        .unwrap()
}

/// A connection to the careless server at `addr`, a secret in its URL and in each header.
async fn careless_at(addr: SocketAddr) -> McpServer {
    let url = format!("http://{addr}/mcp");
    let env = move |name: &str| match name {
        "CARELESS_URL" => Some(url.clone()),
        "CARELESS_KEY" => Some(URL_KEY.to_string()),
        "CARELESS_TOKEN" => Some(QUOTED_TOKEN.to_string()),
        _ => None,
    };
    let resolved = binding(&format!(
        r#"
        [mcp.orders]
        url = "${{CARELESS_URL}}?k=${{CARELESS_KEY}}"
        headers = {{ Authorization = "Bearer ${{CARELESS_TOKEN}}", X-Api-Key = "{LITERAL}" }}
        timeout = "5s"
        "#
    ))
    .resolve("mcp.orders", &env)
    .unwrap();
    McpServer::connect(resolved).await.unwrap()
}

#[tokio::test]
async fn a_server_that_quotes_the_secrets_back_in_every_form_has_none_of_them_stored_or_shown() {
    let (addr, _task) = careless_server().await;
    let careless = careless_at(addr).await;
    let mut tools = Toolbox::new();
    for tool in careless.tools().await.unwrap() {
        tools = tools.with(Arc::new(tool));
    }
    let calls: Vec<(&str, Value)> = CARELESS_TOOLS.iter().map(|t| (*t, json!({}))).collect();
    let script = harness::Script::default().then_call(&calls);
    let policy = harness::allowing("careless", &CARELESS_TOOLS);
    let policy = Arc::new(Policy::from_toml(&policy).unwrap());
    let agent = Agent::new(harness::scripted_task("ben").agent, policy)
        .with_model(Arc::new(script))
        .with_tools(tools);
    let backend = harness::Embedded::fresh();
    let engine = Engine::builder(harness::Backend::connect(&backend).await)
        .agent(agent)
        .clock(Arc::new(ManualClock::new(harness::start_of_test())))
        .build();

    let report = engine.start(harness::scripted_task("ben")).await.unwrap();

    let history = engine
        .history(&harness::acme(), &report.run_id)
        .await
        .unwrap();
    assert_eq!(
        harness::statuses(&history),
        [
            ActionStatus::Succeeded,
            ActionStatus::Succeeded,
            ActionStatus::Failed,
            ActionStatus::Failed
        ]
    );
    // What the server said is there, each secret where it stood: the test is not vacuous.
    let results: Vec<String> = history
        .actions
        .iter()
        .map(|a| a.result.as_ref().unwrap().content.clone())
        .collect();
    assert!(
        results[0].contains("\"authorization\":\"[redacted]\""),
        "{}",
        results[0]
    );
    assert!(
        results[0].contains("\"uri\":\"/?k=${CARELESS_KEY}\""),
        "{}",
        results[0]
    );
    assert!(
        results[1].contains("\"[redacted]\":\"as a key\""),
        "{}",
        results[1]
    );
    assert!(
        results[1].contains("\"percent\":\"[redacted]\""),
        "{}",
        results[1]
    );
    assert!(
        results[2].contains("refused \"[redacted]\""),
        "{}",
        results[2]
    );
    assert!(
        results[3].contains("bad token [redacted] for"),
        "{}",
        results[3]
    );

    let audit = super::audit_api::audit_over_http(engine, &report.run_id).await;
    assert!(audit.contains("[redacted]"), "{audit}");
    super::secret_forms::assert_no_secret_in("GET /runs/{id}/audit", audit.as_bytes(), &SECRETS);
    super::secret_forms::assert_no_secret_in("the state directory", &backend.bytes(), &SECRETS);
}
