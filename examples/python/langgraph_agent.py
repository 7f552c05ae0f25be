"""A LangGraph agent whose refund tool waits for Countersign's sign-off.

The graph is the team's own: its model, its loop, its tool. One decorator puts the refund
behind the gate: a refund above USD 100 waits for a finance manager, who may lower it, and then
runs here once, with the approved amount and the key ``action_id:version``. The model is
scripted so the example runs offline; swap ``ScriptedModel()`` for a real chat model (such as
``ChatAnthropic(model=...)`` from langchain-anthropic) to drive it for real.

    COUNTERSIGN_URL=http://127.0.0.1:8780 COUNTERSIGN_TOKEN=$(countersign token --as helpdesk-bot) \
        python examples/python/langgraph_agent.py "Order A-1001 arrived broken: refund USD 125."
"""

from __future__ import annotations

import os
import re
import sys
from typing import Annotated, Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

import payments
from countersign import Gate, gated

gate = Gate(os.environ.get("COUNTERSIGN_URL", "http://127.0.0.1:8780"), os.environ["COUNTERSIGN_TOKEN"])


@gated(gate, agent="helpdesk", tool="refund")
def approved_refund(order_id: str, amount_cents: int, key: str) -> str:
    return payments.refund(order_id, amount_cents, key)


@tool("refund")
def refund(order_id: str, amount_cents: int, tool_call_id: Annotated[str, InjectedToolCallId]) -> str:
    """Refunds part of an order to its customer. Amounts are in cents."""
    return approved_refund(order_id=order_id, amount_cents=amount_cents, call_id=tool_call_id)


class ScriptedModel(BaseChatModel):
    """Plays the model offline: proposes the refund the task asks for, then reports its result."""

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> "ScriptedModel":
        return self

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any) -> ChatResult:
        results = [m for m in messages if isinstance(m, ToolMessage)]
        if results:
            reply = AIMessage(content=f"Done. {results[-1].content}")
        else:
            task = str(messages[0].content)
            order = re.search(r"\b[A-Z]-\d+\b", task).group(0)
            dollars = re.search(r"USD (\d+)", task).group(1)
            reply = AIMessage(
                content=f"I propose refunding USD {dollars} on {order}.",
                tool_calls=[{"name": "refund", "args": {"order_id": order, "amount_cents": int(dollars) * 100}, "id": f"call_{os.urandom(6).hex()}"}],
            )
        return ChatResult(generations=[ChatGeneration(message=reply)])


def build(model: BaseChatModel) -> Any:
    model = model.bind_tools([refund])
    graph = StateGraph(MessagesState)
    graph.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
    graph.add_node("tools", ToolNode([refund]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile()


if __name__ == "__main__":
    task = sys.argv[1] if len(sys.argv) > 1 else "Order A-1001 arrived broken: refund USD 125."
    final = build(ScriptedModel()).invoke({"messages": [HumanMessage(task)]})
    print(final["messages"][-1].content)
