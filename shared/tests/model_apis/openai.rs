//! The OpenAI-compatible client against a Chat Completions stand-in.

use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::post;
use serde_json::{Value, json};
use shared::adapters::openai::{OpenAiEndpoint, OpenAiModel};
use shared::adapters::secrets::Secrets;
use shared::agents::Wiring;
use shared::domain::conversation::{Block, StopReason, TurnUsage};
use shared::ports::model::ModelError;

use super::{
    Backend, Orders, Scratch, ScriptedApi, load_refunds_with_model, looking_up_ord_55,
    mia_lowers_the_refund_to_75, model_turns, one_turn, refund_task, refunds_engine, secret_forms,
    serve, told_not_an_object,
};
use crate::harness::{acme, event_names};

const ROUTE: &str = "/v1/chat/completions";
const KEY: &str = "sk-test-4f9c2a7e";
const ANSWERING_MODEL: &str = "gpt-4o-2024-08-06";

/// A chat completion as the API documents it: one choice, its finish reason, and usage.
fn completion(message: Value, finish_reason: &str) -> Value {
    json!({
        "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
        "object": "chat.completion",
        "created": 1_764_600_000,
        "model": ANSWERING_MODEL,
        "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 812, "completion_tokens": 64, "total_tokens": 876},
        "system_fingerprint": "fp_6b68a8204b",
    })
}

/// The model's message: its words and its calls, each `(id, name, arguments as text)`.
fn assistant(content: Option<&str>, calls: &[(&str, &str, &str)]) -> Value {
    let mut message = json!({"role": "assistant", "content": content, "refusal": null});
    if !calls.is_empty() {
        message["tool_calls"] = calls
            .iter()
            .map(|(id, name, arguments)| {
                json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}})
            })
            .collect();
    }
    message
}

/// A turn of tool calls, as the API ends one.
fn calls(content: &str, calls: &[(&str, &str, &str)]) -> Value {
    completion(assistant(Some(content), calls), "tool_calls")
}

/// The walkthrough's first turn: the model reads ord_55 with call `id` and these arguments.
fn looks_up_ord_55(id: &str, arguments: &str) -> Value {
    calls(
        "I'll look up order ord_55.",
        &[(id, "get_order", arguments)],
    )
}

/// A last turn: words only.
fn words(content: &str) -> Value {
    completion(assistant(Some(content), &[]), "stop")
}

/// The API's error body.
fn api_error(message: &str, kind: &str, code: &str) -> Value {
    json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
}

fn model_at(base_url: &str, turn_timeout: Duration) -> OpenAiModel {
    let endpoint = OpenAiEndpoint {
        base_url,
        secrets: Secrets::default(),
        key: Some((KEY, "OPENAI_API_KEY")),
        turn_timeout,
    };
    OpenAiModel::new(endpoint, "gpt-4o", 512).unwrap()
}

/// The refunds agent with its `[model]` table on the Chat Completions API `api`.
async fn openai_refunds(
    backend: &dyn Backend,
    api: &ScriptedApi,
    orders: &Orders,
    scratch: &Scratch,
) -> shared::engine::Engine {
    let table = r#"[model]
provider = "openai"
id = "gpt-4o"
base_url = "${LLM_BASE_URL}"
api_key_env = "LLM_API_KEY"
max_turns = 8
offline = "script.toml""#;
    let base_url = base_url(api).await;
    let orders_url = orders.serve().await;
    let env = [
        ("LLM_BASE_URL", base_url.as_str()),
        ("LLM_API_KEY", KEY),
        ("ORDERS_URL", orders_url.as_str()),
    ];
    refunds_engine(backend, table, &env, None, &scratch.0).await
}

/// Serves `api`; its base URL, as `base_url` names it.
async fn base_url(api: &ScriptedApi) -> String {
    format!("{}/v1", api.serve(ROUTE).await)
}

/// The messages of the `n`th request the API was sent.
fn sent_messages(api: &ScriptedApi, n: usize) -> Vec<Value> {
    api.requests()[n].1["messages"].as_array().unwrap().clone()
}

// ---------------------------------------------------------------------------------------------
// The client
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn the_client_sends_the_key_the_model_and_the_tools_and_reads_a_tool_call_and_its_usage() {
    let api =
        ScriptedApi::default().reply(200, looks_up_ord_55("call_get", r#"{"order_id":"ord_55"}"#));
    let model = model_at(&base_url(&api).await, Duration::from_secs(10));

    let reply = one_turn(&model).await.unwrap();

    assert_eq!(reply.stop_reason, StopReason::ToolUse);
    assert_eq!(reply.content, looking_up_ord_55("call_get"));
    assert_eq!(
        reply.usage,
        Some(TurnUsage {
            model: ANSWERING_MODEL.into(),
            input_tokens: Some(812),
            output_tokens: Some(64),
        })
    );
    let (headers, body) = &api.requests()[0];
    assert_eq!(headers["authorization"], format!("Bearer {KEY}"));
    assert_eq!(body["model"], "gpt-4o");
    assert_eq!(body["max_completion_tokens"], 512);
    assert_eq!(
        body["messages"],
        json!([
            {"role": "system", "content": "You refund orders."},
            {"role": "user", "content": "Refund USD 125 for order ord_55."},
        ])
    );
    assert_eq!(
        body["tools"][0],
        json!({"type": "function", "function": {
            "name": "get_order",
            "description": "Reads an order.",
            "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}},
        }})
    );
}

#[tokio::test]
async fn a_refusal_is_the_turns_text_and_ends_it() {
    let refusal = json!({"role": "assistant", "content": null, "refusal": "I can't help with moving that money."});
    let api = ScriptedApi::default().reply(200, completion(refusal, "stop"));
    let model = model_at(&base_url(&api).await, Duration::from_secs(10));

    let reply = one_turn(&model).await.unwrap();

    assert_eq!(reply.stop_reason, StopReason::EndTurn);
    assert_eq!(
        reply.content,
        [Block::Text {
            text: "I can't help with moving that money.".into()
        }]
    );
}

#[tokio::test]
async fn a_429_is_tried_again_after_the_wait_its_retry_after_asks_for() {
    let api = ScriptedApi::default()
        .reply_with(
            429,
            &[("retry-after", "1")],
            api_error(
                "Rate limit reached for gpt-4o on requests per min (RPM): Limit 500, Used 500.",
                "requests",
                "rate_limit_exceeded",
            ),
        )
        .reply(200, words("Done."));
    let model = model_at(&base_url(&api).await, Duration::from_secs(10));

    let began = Instant::now();
    let reply = one_turn(&model).await.unwrap();

    assert_eq!(
        reply.content,
        [Block::Text {
            text: "Done.".into()
        }]
    );
    assert_eq!(api.requests().len(), 2);
    assert!(
        began.elapsed() >= Duration::from_secs(1),
        "waited as asked: {:?}",
        began.elapsed()
    );
}

#[tokio::test]
async fn a_500_is_tried_again_and_a_refused_request_is_not_and_names_no_key() {
    let api = ScriptedApi::default()
        .reply(
            500,
            api_error(
                "The server had an error while processing your request.",
                "server_error",
                "",
            ),
        )
        .reply(200, words("Hello."))
        .reply(
            401,
            api_error(
                &format!("Incorrect API key provided: {KEY}. You can find your API key at https://platform.openai.com/account/api-keys."),
                "invalid_request_error",
                "invalid_api_key",
            ),
        );
    let model = model_at(&base_url(&api).await, Duration::from_secs(10));

    let reply = one_turn(&model).await.unwrap();
    assert_eq!(reply.stop_reason, StopReason::EndTurn);
    assert_eq!(api.requests().len(), 2, "one retry after the 500");

    let refused = one_turn(&model).await.unwrap_err();
    let ModelError::Refused { status, message } = &refused else {
        panic!("refused: {refused:?}");
    };
    assert_eq!(*status, 401);
    assert!(message.starts_with("Incorrect API key provided: [redacted]."));
    assert!(!refused.to_string().contains(KEY), "{refused}");
    assert_eq!(api.requests().len(), 3, "a 401 is not retried");
}

#[tokio::test]
async fn a_wait_past_the_turns_time_ends_the_turn_at_once() {
    let api = ScriptedApi::default().reply_with(
        429,
        &[("retry-after", "30")],
        api_error(
            "You exceeded your current quota.",
            "insufficient_quota",
            "insufficient_quota",
        ),
    );
    let model = model_at(&base_url(&api).await, Duration::from_secs(3));

    let began = Instant::now();
    let error = one_turn(&model).await.unwrap_err();

    assert!(
        began.elapsed() < Duration::from_secs(3),
        "{:?}",
        began.elapsed()
    );
    assert!(error.to_string().contains("no time left"), "{error}");
    assert_eq!(api.requests().len(), 1);
}

#[tokio::test]
async fn a_model_slower_than_the_turns_time_is_cut_off() {
    async fn slow() -> axum::Json<Value> {
        tokio::time::sleep(Duration::from_secs(30)).await;
        axum::Json(words("Too late."))
    }
    let base = serve(Router::new().route(ROUTE, post(slow))).await;
    let model = model_at(&format!("{base}/v1"), Duration::from_secs(2));

    let began = Instant::now();
    let error = one_turn(&model).await.unwrap_err();

    assert!(
        began.elapsed() < Duration::from_secs(5),
        "{:?}",
        began.elapsed()
    );
    assert!(matches!(error, ModelError::Unavailable(_)), "{error:?}");
}

// ---------------------------------------------------------------------------------------------
// The refunds walkthrough through the Chat Completions wire format, on both stores
// ---------------------------------------------------------------------------------------------

async fn given_the_refunds_agent_on_an_openai_compatible_api_when_mia_lowers_the_refund_then_version_2_runs_once_and_every_result_goes_back_as_a_tool_message(
    backend: &dyn Backend,
) {
    let api = ScriptedApi::default()
        .reply(
            200,
            looks_up_ord_55("call_get", r#"{"order_id":"ord_55"}"#),
        )
        .reply(
            200,
            calls(
                "Order ord_55's blender arrived damaged and the customer paid USD 149.00, so I propose refunding USD 125.00.",
                &[(
                    "call_refund",
                    "issue_refund",
                    r#"{"order_id":"ord_55","amount_cents":12500,"currency":"USD","reason":"damaged_item"}"#,
                )],
            ),
        )
        .reply(200, words("Refunded USD 75.00 for ord_55 (re_1)."));
    let orders = Orders::default();
    let scratch = Scratch::new();
    let engine = openai_refunds(backend, &api, &orders, &scratch).await;

    let (approval, history) = mia_lowers_the_refund_to_75(&engine, &orders).await;

    assert_eq!(
        api.requests().len(),
        3,
        "one turn after the decision, none while it waited"
    );
    let second = sent_messages(&api, 1);
    assert_eq!(
        second[2],
        json!({"role": "assistant", "content": "I'll look up order ord_55.", "tool_calls": [
            {"id": "call_get", "type": "function", "function": {"name": "get_order", "arguments": "{\"order_id\":\"ord_55\"}"}},
        ]})
    );
    assert_eq!(second[3]["role"], "tool");
    assert_eq!(second[3]["tool_call_id"], "call_get");
    assert!(
        second[3]["content"]
            .as_str()
            .unwrap()
            .contains("cracked jug")
    );
    let third = sent_messages(&api, 2);
    let last = third.last().unwrap();
    assert_eq!(last["role"], "tool");
    assert_eq!(last["tool_call_id"], "call_refund");
    let key = format!("{}:2", approval.action_id);
    assert!(last["content"].as_str().unwrap().contains(&key), "{last}");
    for (headers, _) in api.requests() {
        assert_eq!(headers["authorization"], format!("Bearer {KEY}"));
    }

    assert_eq!(
        history.run.answer.as_deref(),
        Some("Refunded USD 75.00 for ord_55 (re_1).")
    );
    let usage = TurnUsage {
        model: ANSWERING_MODEL.into(),
        input_tokens: Some(812),
        output_tokens: Some(64),
    };
    assert_eq!(
        model_turns(&history),
        [
            (usage.clone(), StopReason::ToolUse),
            (usage.clone(), StopReason::ToolUse),
            (usage, StopReason::EndTurn)
        ]
    );
    let names = event_names(&history.entries);
    let at = |name: &str| names.iter().position(|n| *n == name).unwrap();
    assert!(at("model_turn") < at("proposed"), "{names:?}");
    let logged = serde_json::to_string(&history).unwrap();
    assert!(!logged.contains(KEY), "the key is in no record");
}

async fn given_a_tool_call_whose_arguments_are_not_json_then_the_model_is_told_so_and_the_run_goes_on(
    backend: &dyn Backend,
) {
    let api = ScriptedApi::default()
        .reply(200, looks_up_ord_55("call_bad", r#"{"order_id": "ord_55""#))
        .reply(
            200,
            words("I could not read the order; nothing was refunded."),
        );
    let orders = Orders::default();
    let scratch = Scratch::new();
    let engine = openai_refunds(backend, &api, &orders, &scratch).await;

    let report = engine.start(refund_task()).await.unwrap();

    let second = sent_messages(&api, 1);
    assert_eq!(
        second[2]["tool_calls"][0]["function"]["arguments"], r#"{"order_id": "ord_55""#,
        "the model's own text goes back as it wrote it"
    );
    let told = second.last().unwrap();
    assert_eq!(told["role"], "tool");
    assert_eq!(told["tool_call_id"], "call_bad");
    told_not_an_object(&engine, &report, &orders, told["content"].as_str().unwrap()).await;
}

/// The key as a careless API quotes it back: as is, percent-encoded, in a JSON string's own
/// escapes, inside Basic auth.
fn key_in_every_form() -> String {
    let basic = base64::Engine::encode(
        &base64::engine::general_purpose::STANDARD,
        format!("user:{KEY}"),
    );
    format!(
        "You sent {KEY} (as {}), \"{}\", Basic {basic}.",
        KEY.replace('-', "%2d"),
        KEY.replace('-', "\\u002d"),
    )
}

async fn given_a_model_api_that_quotes_its_key_back_in_every_form_then_no_record_or_api_answer_holds_it(
    backend: &dyn Backend,
) {
    let quoted = key_in_every_form();
    let api = ScriptedApi::default()
        .reply(
            200,
            calls(
                &quoted,
                &[("call_get", "get_order", r#"{"order_id":"ord_55"}"#)],
            ),
        )
        .reply(200, words(&quoted));
    let orders = Orders::default();
    let scratch = Scratch::new();
    let engine = openai_refunds(backend, &api, &orders, &scratch).await;

    let report = engine.start(refund_task()).await.unwrap();

    let history = engine.history(&acme(), &report.run_id).await.unwrap();
    let answer = history.run.answer.clone().unwrap();
    // The model's words are kept, the key in none of its forms: of the base64, what encodes
    // `user:` alone is left.
    assert_eq!(
        answer,
        "You sent [redacted] (as [redacted]), \"[redacted]\", Basic dXNlcjp[redacted]."
    );
    let records = serde_json::to_string(&history).unwrap();
    assert!(records.contains("You sent [redacted]"), "{records}");
    secret_forms::assert_no_secret_in("the run's records", records.as_bytes(), &[KEY]);
    let audit = crate::audit_api::audit_over_http(engine, &report.run_id).await;
    assert!(audit.contains("You sent [redacted]"), "{audit}");
    secret_forms::assert_no_secret_in("GET /runs/{id}/audit", audit.as_bytes(), &[KEY]);
}

on_both_stores!([
    given_the_refunds_agent_on_an_openai_compatible_api_when_mia_lowers_the_refund_then_version_2_runs_once_and_every_result_goes_back_as_a_tool_message,
    given_a_tool_call_whose_arguments_are_not_json_then_the_model_is_told_so_and_the_run_goes_on,
    given_a_model_api_that_quotes_its_key_back_in_every_form_then_no_record_or_api_answer_holds_it,
]);

#[tokio::test]
async fn a_base_url_with_credentials_is_refused_at_load_naming_its_field_and_not_them() {
    let scratch = Scratch::new();
    let written = "[model]\nprovider = \"openai\"\nid = \"gpt-4o\"\n\
                   base_url = \"https://bot:pw-hunter-77@llm.example/v1\"";
    let error = load_refunds_with_model(written, &scratch.0).err().unwrap();
    assert_eq!(error.field, "model.base_url", "{error}");
    assert!(error.message.contains("carries credentials"), "{error}");
    assert!(!error.to_string().contains("pw-hunter-77"), "{error}");

    // Filled from the environment, it is refused when the agent is bound, the same way.
    let filled = "[model]\nprovider = \"openai\"\nid = \"gpt-4o\"\n\
                  base_url = \"${LLM_BASE_URL}\"\napi_key_env = \"\"";
    let definition = load_refunds_with_model(filled, &scratch.0).unwrap();
    let env = |var: &str| {
        (var == "LLM_BASE_URL").then(|| "https://bot:pw-hunter-77@llm.example/v1".into())
    };
    let store = crate::Embedded::fresh().connect().await;
    let wiring = Wiring {
        env: &env,
        drives: true,
        ..Wiring::new(
            store,
            std::sync::Arc::new(shared::ports::clock::SystemClock),
            shared::example::expense::default_claims(),
        )
    };
    let error = wiring.build(&definition).err().unwrap();
    assert_eq!(error.field, "model.base_url", "{error}");
    assert!(!error.to_string().contains("pw-hunter-77"), "{error}");
}
