"""An OpenAI Agents SDK agent whose refund tool waits for Countersign's sign-off.

The agent is the team's own: its model, its runner, its tool. One decorator puts the refund
behind the gate: a refund above USD 100 waits for a finance manager, who may lower it, and then
runs here once, with the approved amount and the key ``action_id:version``. The model is
scripted so the example runs offline; drop ``model=ScriptedModel()`` (and set OPENAI_API_KEY)
or pass ``model="gpt-5"`` to drive it for real.

    COUNTERSIGN_URL=http://127.0.0.1:8780 COUNTERSIGN_TOKEN=$(countersign token --as helpdesk-bot) \
        python examples/python/openai_agents_agent.py "Order A-1001 arrived broken: refund USD 125."
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from typing import Any

from agents import Agent, Model, ModelResponse, Runner, Usage, function_tool, set_tracing_disabled
from agents.tool_context import ToolContext
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

import payments
from countersign import Gate, gated

gate = Gate(os.environ.get("COUNTERSIGN_URL", "http://127.0.0.1:8780"), os.environ["COUNTERSIGN_TOKEN"])


@gated(gate, agent="helpdesk", tool="refund")
async def approved_refund(order_id: str, amount_cents: int, key: str) -> str:
    return payments.refund(order_id, amount_cents, key)


@function_tool
async def refund(ctx: ToolContext, order_id: str, amount_cents: int) -> str:
    """Refunds part of an order to its customer. Amounts are in cents."""
    return await approved_refund(order_id=order_id, amount_cents=amount_cents, call_id=ctx.tool_call_id)


class ScriptedModel(Model):
    """Plays the model offline: proposes the refund the task asks for, then reports its result."""

    async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> ModelResponse:
        items = [{"role": "user", "content": input}] if isinstance(input, str) else input
        results = [i for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"]
        if results:
            output: list[Any] = [message(f"Done. {results[-1]['output']}")]
        else:
            task = str(items[0]["content"])
            order = re.search(r"\b[A-Z]-\d+\b", task).group(0)
            dollars = re.search(r"USD (\d+)", task).group(1)
            call = {"order_id": order, "amount_cents": int(dollars) * 100}
            output = [
                message(f"I propose refunding USD {dollars} on {order}."),
                ResponseFunctionToolCall(type="function_call", name="refund", arguments=json.dumps(call), call_id=f"call_{os.urandom(6).hex()}"),
            ]
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the scripted model does not stream")


def message(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id="msg", type="message", role="assistant", status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


async def main(task: str) -> None:
    agent = Agent(name="helpdesk", instructions="Refund what the task asks, once.", tools=[refund], model=ScriptedModel())
    result = await Runner.run(agent, task)
    print(result.final_output)


if __name__ == "__main__":
    set_tracing_disabled(True)  # offline: nothing is sent to OpenAI's tracing
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "Order A-1001 arrived broken: refund USD 125."))
