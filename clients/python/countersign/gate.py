"""Countersign's gate API from Python: one proposed call, its decision and its outcome.

An agent that runs its own loop hands each proposed tool call to the gate before it runs. The
gate checks it against the tool's schema, rules on it with the agent's policy and, when a person
must decide, holds it durably until they do. A tool the definition binds runs in Countersign; a
tool marked ``executor = "caller"`` runs here, once, under a claim, with the exact approved
arguments (a reviewer may have lowered them) and the idempotency key ``action_id:version``.

The routes and the JSON are described in docs/gate-api.md.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import os
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping, TypeVar, Union

log = logging.getLogger("countersign")

#: Statuses after which nothing more happens to a call.
SETTLED = frozenset(
    {"succeeded", "failed", "rejected", "expired", "cancelled", "denied", "refused"}
)
#: The longest one long-poll holds; a longer wait is several of them.
MAX_POLL = 25.0
#: How long to pause before asking again about a call whose outcome is unknown.
UNKNOWN_PAUSE = 5.0
#: How long to pause when this person already holds their share of the server's waiting slots
#: (429 `too_many_waits`), as its `Retry-After` says.
WAITS_FULL_PAUSE = 5.0
#: How often a request lost to the network is tried again: the call's id makes it safe.
ATTEMPTS = 4


class GateError(Exception):
    """The gate refused a request: its HTTP status, the error's code and message, and the call
    as it stands when the answer carried it."""

    def __init__(
        self, status: int, code: str, message: str, call: "Outcome | None" = None
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.call = call


class Unknown(Exception):
    """Raise it from a gated function when its call may have taken effect and you cannot tell:
    no outcome is reported, and when the claim's lease ends the agent's recovery owner is asked
    whether it did. The function is never run again for this call."""


@dataclass(frozen=True)
class Approval:
    """Who must decide a waiting call, how many of them, by when, and where."""

    id: str
    approver_role: str
    quorum: int
    expires_at: str
    link: str | None = None


@dataclass(frozen=True)
class Claim:
    """Who took an approved caller-run call to run it, and until when they may report."""

    claimant: str
    lease_expires_at: str


@dataclass(frozen=True)
class Outcome:
    """A call as the gate reports it: where it stands and, once it ran, what it did."""

    id: str
    call_id: str | None
    agent: str
    tool: str
    status: str
    executor: str = "countersign"
    conversation: str | None = None
    action_id: str | None = None
    version: int | None = None
    args: Mapping[str, Any] | None = None
    key: str | None = None
    result: str | None = None
    is_error: bool = False
    approval: Approval | None = None
    claim: Claim | None = None
    attached: bool = False
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> "Outcome":
        result = body.get("result") or {}
        approval = body.get("approval")
        claim = body.get("claim")
        return cls(
            id=body["id"],
            call_id=body.get("call_id"),
            agent=body.get("agent", ""),
            tool=body.get("tool", ""),
            status=body["status"],
            executor=body.get("executor", "countersign"),
            conversation=body.get("conversation"),
            action_id=body.get("action_id"),
            version=body.get("version"),
            args=body.get("args"),
            key=body.get("key"),
            result=result.get("content"),
            is_error=bool(result.get("is_error", False)),
            approval=Approval(
                id=approval["id"],
                approver_role=approval.get("approver_role", ""),
                quorum=approval.get("quorum", 1),
                expires_at=approval.get("expires_at", ""),
                link=approval.get("link"),
            )
            if approval
            else None,
            claim=Claim(claim["claimant"], claim.get("lease_expires_at", ""))
            if claim
            else None,
            attached=bool(body.get("attached", False)),
            raw=body,
        )

    @property
    def settled(self) -> bool:
        """Nothing more will happen to the call."""
        return self.status in SETTLED

    @property
    def ran(self) -> bool:
        """It ran, once: ``result`` says what it did."""
        return self.status in ("succeeded", "failed")

    @property
    def message(self) -> str:
        """What the agent's model should read about the call: the tool's result, or in plain
        words why nothing ran and whether to wait."""
        if self.result is not None:
            return self.result
        if self.status == "awaiting_approval" and self.approval:
            where = f", {self.approval.link}" if self.approval.link else ""
            return (
                f"Nothing has run yet: {self.tool} waits for {self.approval.approver_role} "
                f"(approval {self.approval.id}{where}) until {self.approval.expires_at}. "
                "Asking again with the same call id returns its outcome; it never runs twice."
            )
        return {
            "approved": f"{self.tool} is approved and waits to be run by its caller.",
            "running": f"{self.tool} is running.",
            "unknown": f"{self.tool} may have taken effect; its outcome is being reconciled. "
            "Do not retry it.",
        }.get(self.status, f"{self.tool} was not executed ({self.status}). Do not retry it.")


Json = Union[str, int, float, bool, None, list, dict]
F = TypeVar("F", bound=Callable[..., Any])


class Gate:
    """The gate API of one Countersign server, for one person (the token's).

    >>> gate = Gate("http://127.0.0.1:8780", token)
    >>> outcome = gate.call("refunds", "issue_refund", {"order_id": "A-1"}, call_id="call_1")
    """

    def __init__(self, url: str, token: str, *, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout

    # The routes, one request each.

    def propose(
        self,
        agent: str,
        tool: str,
        args: Mapping[str, Any],
        call_id: str,
        conversation: str | None = None,
    ) -> Outcome:
        """Hands the gate one proposed call. The same ``call_id`` again is the same call."""
        body: dict[str, Any] = {"agent": agent, "tool": tool, "args": dict(args), "call_id": call_id}
        if conversation is not None:
            body["conversation"] = conversation
        return self._request("POST", "/gate/calls", body)

    def get(self, id: str, wait: float | None = None) -> Outcome:
        """The call as it stands; with ``wait`` (at most 25 s), once it moves on or the wait ends."""
        path = f"/gate/calls/{urllib.parse.quote(id, safe='')}"
        if wait is not None:
            wait = min(max(wait, 0.0), MAX_POLL)
            path += f"?wait={int(wait * 1000)}ms"
        return self._request("GET", path, None, timeout=self.timeout + (wait or 0.0))

    def claim(self, id: str, claimant: str) -> Outcome:
        """Takes an approved caller-run call to run it. One claimant wins; the same claimant
        again gets the same claim."""
        return self._request("POST", f"/gate/calls/{urllib.parse.quote(id, safe='')}/claim", {"claimant": claimant})

    def report(self, id: str, claimant: str, status: str, result: Json) -> Outcome:
        """Reports what running a claimed call did: ``succeeded`` or ``failed``."""
        body = {"claimant": claimant, "status": status, "result": result}
        return self._request("POST", f"/gate/calls/{urllib.parse.quote(id, safe='')}/outcome", body)

    # The flows.

    def wait(self, outcome: Outcome, timeout: float | None = None) -> Outcome:
        """Long-polls until the call is settled or ready to claim, or ``timeout`` seconds pass
        (``None``: as long as it takes)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while outcome.status in ("awaiting_approval", "running", "unknown"):
            left = MAX_POLL if deadline is None else deadline - time.monotonic()
            if left <= 0:
                break
            if outcome.status == "unknown":
                # The long-poll answers an unknown call at once: a person or the tool's lookup
                # settles it, in minutes rather than milliseconds.
                time.sleep(min(left, UNKNOWN_PAUSE))
                outcome = self.get(outcome.id)
                continue
            try:
                outcome = self.get(outcome.id, wait=min(left, MAX_POLL))
            except GateError as refused:
                # This person's other waits hold their share of the server's: the call as it
                # stands came with the refusal; ask again after the pause.
                if refused.code != "too_many_waits" or refused.call is None:
                    raise
                outcome = refused.call
                time.sleep(min(left, WAITS_FULL_PAUSE))
        return outcome

    def call(
        self,
        agent: str,
        tool: str,
        args: Mapping[str, Any],
        call_id: str,
        conversation: str | None = None,
        timeout: float | None = None,
    ) -> Outcome:
        """Proposes the call and waits for its outcome (or, for a caller-run tool, its approval)."""
        return self.wait(self.propose(agent, tool, args, call_id, conversation), timeout)

    def run(
        self,
        agent: str,
        tool: str,
        args: Mapping[str, Any],
        call_id: str,
        fn: Callable[..., Any],
        conversation: str | None = None,
        timeout: float | None = None,
    ) -> tuple[Outcome, Any]:
        """Puts ``fn`` behind the gate as a caller-run tool: proposes the call, waits for the
        decision, and once approved claims it and runs ``fn`` with the approved arguments (and
        ``key=`` if it takes one), then reports what it did. Returns the outcome and ``fn``'s
        value when it ran here (else ``None``)."""
        outcome = self.call(agent, tool, args, call_id, conversation, timeout)
        claimed = self._claimed(outcome)
        if claimed is None:
            return outcome, None
        try:
            value = fn(**_kwargs(fn, claimed))
        except Unknown:
            log.warning("%s %s: outcome unknown, left to the recovery owner", tool, claimed.key)
            return self.get(claimed.id), None
        except Exception as error:
            return self._report(claimed, "failed", _describe(error)), None
        return self._report(claimed, "succeeded", value), value

    async def run_async(
        self,
        agent: str,
        tool: str,
        args: Mapping[str, Any],
        call_id: str,
        fn: Callable[..., Awaitable[Any]],
        conversation: str | None = None,
        timeout: float | None = None,
    ) -> tuple[Outcome, Any]:
        """:meth:`run` for a coroutine function; the requests run on a worker thread."""
        outcome = await asyncio.to_thread(self.call, agent, tool, args, call_id, conversation, timeout)
        claimed = await asyncio.to_thread(self._claimed, outcome)
        if claimed is None:
            return outcome, None
        try:
            value = await fn(**_kwargs(fn, claimed))
        except Unknown:
            log.warning("%s %s: outcome unknown, left to the recovery owner", tool, claimed.key)
            return await asyncio.to_thread(self.get, claimed.id), None
        except Exception as error:
            return await asyncio.to_thread(self._report, claimed, "failed", _describe(error)), None
        return await asyncio.to_thread(self._report, claimed, "succeeded", value), value

    def _claimed(self, outcome: Outcome) -> Outcome | None:
        """Claims an approved caller-run call for this process; ``None`` when it is not ours to
        run (not approved, or another claimant has it)."""
        if outcome.status != "approved":
            return None
        claimant = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        try:
            claimed = self.claim(outcome.id, claimant)
        except GateError as refused:
            if refused.status != 409:
                raise
            log.info("%s: not claimed (%s)", outcome.id, refused.message)
            return None
        return claimed if claimed.claim and claimed.claim.claimant == claimant else None

    def _report(self, claimed: Outcome, status: str, result: Any) -> Outcome:
        assert claimed.claim is not None
        return self.report(claimed.id, claimed.claim.claimant, status, _jsonable(result))

    def _request(
        self, method: str, path: str, body: Mapping[str, Any] | None, timeout: float | None = None
    ) -> Outcome:
        data = None if body is None else json.dumps(body).encode()
        headers = {"authorization": f"Bearer {self.token}", "accept": "application/json"}
        if data is not None:
            headers["content-type"] = "application/json"
        for attempt in range(1, ATTEMPTS + 1):
            request = urllib.request.Request(self.url + path, data, headers, method=method)
            try:
                with urllib.request.urlopen(request, timeout=timeout or self.timeout) as answer:
                    return Outcome.from_json(json.load(answer))
            except urllib.error.HTTPError as refused:
                raise _gate_error(refused) from None
            except (urllib.error.URLError, ConnectionError, TimeoutError, socket.timeout):
                # Every route is idempotent (the call's id, the claimant, the same report):
                # asking again cannot make a second call.
                if attempt == ATTEMPTS:
                    raise
                time.sleep(0.2 * 2**attempt)
        raise AssertionError("unreachable")


def gated(
    gate: Gate,
    agent: str,
    tool: str | None = None,
    *,
    conversation: str | None = None,
    timeout: float | None = None,
) -> Callable[[F], F]:
    """Puts a Python function behind the gate as the caller-run tool ``tool`` (its name by
    default) of ``agent``. The wrapped function takes the tool's arguments as keywords and the
    framework's id for the call as ``call_id=``; it runs only after approval, once, with the
    approved arguments (and ``key=``, the idempotency key, if it takes one). It returns the
    function's value when the function ran in this call, else the outcome's text for the model
    (rejected, expired, denied, still waiting).

    >>> @gated(gate, agent="refunds")
    ... def refund(order_id: str, amount_cents: int, key: str) -> str: ...
    >>> refund(order_id="A-1", amount_cents=12500, call_id=tool_call_id)
    """

    def wrap(fn: F) -> F:
        name = tool or fn.__name__

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def run_async(*, call_id: str, **args: Any) -> Any:
                outcome, value = await gate.run_async(
                    agent, name, args, call_id, fn, conversation, timeout
                )
                return _answer(outcome, value)

            return run_async  # type: ignore[return-value]

        @functools.wraps(fn)
        def run(*, call_id: str, **args: Any) -> Any:
            outcome, value = gate.run(agent, name, args, call_id, fn, conversation, timeout)
            return _answer(outcome, value)

        return run  # type: ignore[return-value]

    return wrap


def _answer(outcome: Outcome, value: Any) -> Any:
    return value if outcome.status == "succeeded" and value is not None else outcome.message


def _kwargs(fn: Callable[..., Any], claimed: Outcome) -> dict[str, Any]:
    """The approved arguments, and the key if the function takes one."""
    kwargs = dict(claimed.args or {})
    if "key" in inspect.signature(fn).parameters:
        kwargs["key"] = claimed.key
    return kwargs


def _jsonable(value: Any) -> Json:
    """The value as JSON if it is JSON, else its text: a report never fails after the function ran."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return str(value)
    return value


def _describe(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"


def _gate_error(refused: urllib.error.HTTPError) -> GateError:
    try:
        body = json.load(refused)
    except ValueError:
        body = {}
    error = body.get("error") or {}
    call = body.get("call")
    return GateError(
        refused.code,
        error.get("code", "http_error"),
        error.get("message", refused.reason),
        Outcome.from_json(call) if isinstance(call, dict) and "id" in call else None,
    )
