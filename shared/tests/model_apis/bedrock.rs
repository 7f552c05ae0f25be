//! The Bedrock client (the AWS SDK's Converse) against a Converse stand-in, reached through the
//! SDK's endpoint override and signed with the credentials it is given, as a function's role.

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_bedrockruntime::config::{BehaviorVersion, Credentials, Region};
use serde_json::{Value, json};
use shared::adapters::bedrock::BedrockModel;
use shared::domain::conversation::{Block, StopReason, TurnUsage};
use shared::ports::model::{Model, ModelError};

use super::{
    Backend, Orders, Scratch, ScriptedApi, looking_up_ord_55, mia_lowers_the_refund_to_75,
    model_turns, one_turn, refund_task, refunds_engine, told_not_an_object,
};

const ROUTE: &str = "/model/{model}/converse";
const PROFILE: &str = "us.anthropic.claude-sonnet-4-5-20250929-v1:0";

/// A client of the stand-in at `base`, in us-east-1, with a role's credentials.
fn model_at(base: &str) -> BedrockModel {
    let config = aws_sdk_bedrockruntime::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new(
            "ASIATESTROLE",
            "role-secret",
            Some("session-token".into()),
            None,
            "test",
        ))
        .endpoint_url(base)
        .build();
    BedrockModel::with_config(&config, PROFILE, 512, Duration::from_secs(20))
}

/// A Converse answer as the API documents it: the model's message, why it stopped, and usage.
fn converse(content: Vec<Value>, stop_reason: &str) -> Value {
    json!({
        "output": {"message": {"role": "assistant", "content": content}},
        "stopReason": stop_reason,
        "usage": {"inputTokens": 1_024, "outputTokens": 96, "totalTokens": 1_120},
        "metrics": {"latencyMs": 840},
    })
}

fn text(words: &str) -> Value {
    json!({"text": words})
}

fn tool_use(id: &str, name: &str, input: Value) -> Value {
    json!({"toolUse": {"toolUseId": id, "name": name, "input": input}})
}

/// The walkthrough's first turn: the model reads ord_55.
fn looks_up_ord_55() -> Value {
    converse(
        vec![
            text("I'll look up order ord_55."),
            tool_use("tooluse_get", "get_order", json!({"order_id": "ord_55"})),
        ],
        "tool_use",
    )
}

/// A Bedrock error: its type in `x-amzn-errortype`, its words in the body.
fn failing(api: ScriptedApi, status: u16, kind: &str, message: &str) -> ScriptedApi {
    api.reply_with(
        status,
        &[("x-amzn-errortype", kind)],
        json!({"message": message}),
    )
}

// ---------------------------------------------------------------------------------------------
// The client
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn the_client_signs_with_the_roles_credentials_sends_the_tools_and_reads_a_tool_use() {
    let api = ScriptedApi::default().reply(200, looks_up_ord_55());
    let model = model_at(&api.serve(ROUTE).await);

    let reply = one_turn(&model).await.unwrap();

    assert_eq!(reply.stop_reason, StopReason::ToolUse);
    assert_eq!(reply.content, looking_up_ord_55("tooluse_get"));
    assert_eq!(
        reply.usage,
        Some(TurnUsage {
            model: PROFILE.into(),
            input_tokens: Some(1_024),
            output_tokens: Some(96),
        })
    );
    let (headers, body) = &api.requests()[0];
    let signed = headers["authorization"].to_str().unwrap();
    assert!(
        signed.starts_with("AWS4-HMAC-SHA256 Credential=ASIATESTROLE/")
            && signed.contains("/us-east-1/bedrock/aws4_request"),
        "{signed}"
    );
    assert_eq!(headers["x-amz-security-token"], "session-token");
    assert_eq!(body["system"], json!([{"text": "You refund orders."}]));
    assert_eq!(
        body["messages"],
        json!([{"role": "user", "content": [{"text": "Refund USD 125 for order ord_55."}]}])
    );
    assert_eq!(
        body["toolConfig"]["tools"][0]["toolSpec"],
        json!({"name": "get_order", "description": "Reads an order.",
            "inputSchema": {"json": {"type": "object", "properties": {"order_id": {"type": "string"}}}}})
    );
    assert_eq!(body["inferenceConfig"]["maxTokens"], 512);
}

#[tokio::test]
async fn throttling_and_a_server_error_are_tried_again_and_a_refused_request_is_not() {
    let api = ScriptedApi::default();
    let api = failing(
        api,
        429,
        "ThrottlingException",
        "Too many requests, please wait before trying again.",
    );
    let api = failing(
        api,
        500,
        "InternalServerException",
        "The server encountered an error.",
    )
    .reply(200, converse(vec![text("Hello.")], "end_turn"));
    let api = failing(
        api,
        400,
        "ValidationException",
        "The provided model identifier is invalid.",
    );
    let model = model_at(&api.serve(ROUTE).await);

    let reply = one_turn(&model).await.unwrap();
    assert_eq!(
        reply.content,
        [Block::Text {
            text: "Hello.".into()
        }]
    );
    assert_eq!(
        api.requests().len(),
        3,
        "tried again after the 429 and the 500"
    );

    let refused = one_turn(&model).await.unwrap_err();
    assert_eq!(
        refused,
        ModelError::Refused {
            status: 400,
            message: "The provided model identifier is invalid.".into()
        }
    );
    assert_eq!(api.requests().len(), 4, "a 400 is not retried");
}

// ---------------------------------------------------------------------------------------------
// The refunds walkthrough through Converse, on both stores
// ---------------------------------------------------------------------------------------------

/// The refunds agent with its `[model]` table on Bedrock, its client pointed at `api`.
async fn bedrock_refunds(
    backend: &dyn Backend,
    api: &ScriptedApi,
    orders: &Orders,
    scratch: &Scratch,
) -> shared::engine::Engine {
    let table = format!(
        "[model]\nprovider = \"bedrock\"\nid = \"{PROFILE}\"\nmax_turns = 8\noffline = \"script.toml\""
    );
    let model: Arc<dyn Model> = Arc::new(model_at(&api.serve(ROUTE).await));
    let orders_url = orders.serve().await;
    let env = [("ORDERS_URL", orders_url.as_str())];
    refunds_engine(backend, &table, &env, Some(model), &scratch.0).await
}

async fn given_the_refunds_agent_on_bedrock_when_mia_lowers_the_refund_then_version_2_runs_once_and_every_result_goes_back_as_a_tool_result(
    backend: &dyn Backend,
) {
    let api = ScriptedApi::default()
        .reply(
            200,
            looks_up_ord_55(),
        )
        .reply(
            200,
            converse(
                vec![
                    text("The blender arrived damaged; I propose refunding USD 125.00."),
                    tool_use(
                        "tooluse_refund",
                        "issue_refund",
                        json!({"order_id": "ord_55", "amount_cents": 12_500, "currency": "USD", "reason": "damaged_item"}),
                    ),
                ],
                "tool_use",
            ),
        )
        .reply(
            200,
            converse(vec![text("Refunded USD 75.00 for ord_55.")], "end_turn"),
        );
    let orders = Orders::default();
    let scratch = Scratch::new();
    let engine = bedrock_refunds(backend, &api, &orders, &scratch).await;

    let (approval, history) = mia_lowers_the_refund_to_75(&engine, &orders).await;

    let requests = api.requests();
    assert_eq!(requests.len(), 3);
    let second = requests[1].1["messages"].as_array().unwrap().clone();
    assert_eq!(
        second[1],
        json!({"role": "assistant", "content": [
            {"text": "I'll look up order ord_55."},
            {"toolUse": {"toolUseId": "tooluse_get", "name": "get_order", "input": {"order_id": "ord_55"}}},
        ]})
    );
    let result = &second[2]["content"][0]["toolResult"];
    assert_eq!(result["toolUseId"], "tooluse_get");
    assert_eq!(result["status"], "success");
    assert!(
        result["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("cracked jug")
    );
    let third = requests[2].1["messages"].as_array().unwrap().clone();
    let last = &third.last().unwrap()["content"][0]["toolResult"];
    assert_eq!(last["toolUseId"], "tooluse_refund");
    let key = format!("{}:2", approval.action_id);
    assert!(
        last["content"][0]["text"].as_str().unwrap().contains(&key),
        "{last}"
    );

    let usage = TurnUsage {
        model: PROFILE.into(),
        input_tokens: Some(1_024),
        output_tokens: Some(96),
    };
    assert_eq!(
        model_turns(&history),
        [
            (usage.clone(), StopReason::ToolUse),
            (usage.clone(), StopReason::ToolUse),
            (usage, StopReason::EndTurn)
        ]
    );
}

async fn given_a_tool_use_whose_input_is_not_an_object_then_the_model_is_told_so_as_an_error_result_and_the_run_goes_on(
    backend: &dyn Backend,
) {
    let api = ScriptedApi::default()
        .reply(
            200,
            converse(
                vec![tool_use(
                    "tooluse_bad",
                    "get_order",
                    json!("{\"order_id\": \"ord_55\""),
                )],
                "tool_use",
            ),
        )
        .reply(
            200,
            converse(
                vec![text("I could not read the order; nothing was refunded.")],
                "end_turn",
            ),
        );
    let orders = Orders::default();
    let scratch = Scratch::new();
    let engine = bedrock_refunds(backend, &api, &orders, &scratch).await;

    let report = engine.start(refund_task()).await.unwrap();

    let second = api.requests()[1].1["messages"].as_array().unwrap().clone();
    let told = &second.last().unwrap()["content"][0]["toolResult"];
    assert_eq!(told["toolUseId"], "tooluse_bad");
    assert_eq!(told["status"], "error");
    let text = told["content"][0]["text"].as_str().unwrap();
    told_not_an_object(&engine, &report, &orders, text).await;
}

on_both_stores!([
    given_the_refunds_agent_on_bedrock_when_mia_lowers_the_refund_then_version_2_runs_once_and_every_result_goes_back_as_a_tool_result,
    given_a_tool_use_whose_input_is_not_an_object_then_the_model_is_told_so_as_an_error_result_and_the_run_goes_on,
]);
