"""The Python client against a real `countersign serve`: allowed, gated, edited, rejected,
repeated, raced and lost calls of the helpdesk example's caller-run refund tool."""

from __future__ import annotations

import asyncio
import threading
import time
import unittest
import uuid

from countersign import Gate, GateError, Unknown, gated

from server import ServerTest

AGENT = "helpdesk"


class Refunds:
    """The caller's own refund function: what it was asked to do, in order."""

    def __init__(self) -> None:
        self.made: list[tuple[str, int, str]] = []
        self.lock = threading.Lock()

    def refund(self, order_id: str, amount_cents: int, key: str) -> str:
        with self.lock:
            self.made.append((order_id, amount_cents, key))
        return f"refunded {amount_cents} cents on {order_id}"


class GateTest(ServerTest):

    def setUp(self) -> None:
        self.gate = Gate(self.server.url, self.server.token("helpdesk-bot"))
        self.refunds = Refunds()
        self.call_id = f"call_{uuid.uuid4().hex[:10]}"
        self.order = f"A-{uuid.uuid4().hex[:6]}"

    def waiting_approval(self, order: str) -> dict:
        for _ in range(200):
            for approval in self.server.waiting("fran"):
                if approval["args"].get("order_id") == order:
                    return approval
            time.sleep(0.05)
        self.fail(f"no approval waits for {order}")

    def test_a_refund_within_policy_runs_at_once_under_version_1(self) -> None:
        outcome, value = self.gate.run(
            AGENT, "refund", {"order_id": self.order, "amount_cents": 5000}, self.call_id,
            self.refunds.refund,
        )
        self.assertEqual(outcome.status, "succeeded")
        self.assertEqual(value, f"refunded 5000 cents on {self.order}")
        self.assertEqual(outcome.result, value)
        self.assertEqual(len(self.refunds.made), 1)
        order, cents, key = self.refunds.made[0]
        self.assertEqual((order, cents), (self.order, 5000))
        self.assertEqual(key, f"{outcome.action_id}:1")

    def test_a_large_refund_waits_runs_once_lowered_and_repeats_attach(self) -> None:
        refund = gated(self.gate, AGENT, "refund")(self.refunds.refund)
        answers: list[str] = []
        agent = threading.Thread(
            target=lambda: answers.append(
                refund(order_id=self.order, amount_cents=12500, call_id=self.call_id)
            )
        )
        agent.start()
        approval = self.waiting_approval(self.order)
        self.assertEqual(self.refunds.made, [], "nothing runs before a decision")
        self.server.cli("review", "edit", approval["id"], "--amount", "75", "--as", "fran")
        agent.join(timeout=30)
        self.assertFalse(agent.is_alive())

        self.assertEqual(answers, [f"refunded 7500 cents on {self.order}"])
        [(order, cents, key)] = self.refunds.made
        self.assertEqual((order, cents), (self.order, 7500))
        self.assertTrue(key.endswith(":2"), key)

        # The framework runs the tool again after a restart: the same call, never a second refund.
        again = refund(order_id=self.order, amount_cents=12500, call_id=self.call_id)
        self.assertEqual(again, f"refunded 7500 cents on {self.order}")
        self.assertEqual(len(self.refunds.made), 1)

    def test_a_rejected_refund_never_runs_and_says_so(self) -> None:
        refund = gated(self.gate, AGENT, "refund")(self.refunds.refund)
        answers: list[str] = []
        agent = threading.Thread(
            target=lambda: answers.append(
                refund(order_id=self.order, amount_cents=30000, call_id=self.call_id)
            )
        )
        agent.start()
        approval = self.waiting_approval(self.order)
        self.server.cli(
            "review", "reject", approval["id"], "--reason", "order was never paid", "--as", "fran"
        )
        agent.join(timeout=30)
        self.assertEqual(self.refunds.made, [])
        self.assertEqual(len(answers), 1)
        self.assertIn("order was never paid", answers[0])
        outcome = self.gate.propose(AGENT, "refund", {"order_id": self.order, "amount_cents": 30000}, self.call_id)
        self.assertEqual(outcome.status, "rejected")
        self.assertTrue(outcome.settled and not outcome.ran)

    def test_a_short_wait_comes_back_waiting_with_who_decides(self) -> None:
        started = time.monotonic()
        outcome = self.gate.call(
            AGENT, "refund", {"order_id": self.order, "amount_cents": 20000}, self.call_id,
            conversation="thread-7", timeout=0.5,
        )
        self.assertLess(time.monotonic() - started, 5)
        self.assertEqual(outcome.status, "awaiting_approval")
        self.assertEqual(outcome.conversation, "thread-7")
        assert outcome.approval is not None
        self.assertEqual(outcome.approval.approver_role, "finance_manager")
        self.assertIn(outcome.approval.id, outcome.message)
        self.assertIn("never runs twice", outcome.message)

    def test_a_call_id_reused_for_other_arguments_is_refused(self) -> None:
        self.gate.run(AGENT, "refund", {"order_id": self.order, "amount_cents": 100}, self.call_id, self.refunds.refund)
        with self.assertRaises(GateError) as refused:
            self.gate.propose(AGENT, "refund", {"order_id": self.order, "amount_cents": 200}, self.call_id)
        self.assertEqual((refused.exception.status, refused.exception.code), (409, "call_id_reused"))
        self.assertEqual(len(self.refunds.made), 1)

    def test_arguments_that_do_not_fit_the_schema_are_refused_before_anyone_sees_them(self) -> None:
        outcome, value = self.gate.run(
            AGENT, "refund", {"order_id": self.order, "amount_cents": "lots"}, self.call_id, self.refunds.refund
        )
        self.assertEqual(outcome.status, "refused")
        self.assertIsNone(value)
        self.assertEqual(self.refunds.made, [])
        self.assertEqual([a for a in self.server.waiting("fran", timeout=0) if a["args"].get("order_id") == self.order], [])

    def test_two_claimants_at_once_one_wins(self) -> None:
        outcome = self.gate.call(AGENT, "refund", {"order_id": self.order, "amount_cents": 900}, self.call_id)
        self.assertEqual(outcome.status, "approved")
        results: dict[str, object] = {}
        barrier = threading.Barrier(2)

        def claim(who: str) -> None:
            barrier.wait()
            try:
                results[who] = self.gate.claim(outcome.id, who)
            except GateError as refused:
                results[who] = refused

        claimants = [threading.Thread(target=claim, args=(who,)) for who in ("left", "right")]
        for thread in claimants:
            thread.start()
        for thread in claimants:
            thread.join()
        won = [who for who, got in results.items() if not isinstance(got, GateError)]
        lost = [got for got in results.values() if isinstance(got, GateError)]
        self.assertEqual(len(won), 1, results)
        self.assertEqual([e.status for e in lost], [409])
        claimed = self.gate.claim(outcome.id, won[0])  # a retry after a lost answer
        assert claimed.claim is not None
        self.assertEqual((claimed.status, claimed.claim.claimant), ("running", won[0]))
        self.assertEqual(claimed.key, f"{outcome.action_id}:1")

    def test_an_outcome_the_function_cannot_tell_is_left_unreported_and_never_rerun(self) -> None:
        def unsure(order_id: str, amount_cents: int) -> str:
            self.refunds.made.append((order_id, amount_cents, ""))
            raise Unknown("the payment provider timed out")

        args = {"order_id": self.order, "amount_cents": 800}
        outcome, _ = self.gate.run(AGENT, "refund", args, self.call_id, unsure)
        self.assertEqual(outcome.status, "running")
        again, _ = self.gate.run(AGENT, "refund", args, self.call_id, unsure, timeout=0.2)
        self.assertEqual(again.status, "running")
        self.assertEqual(len(self.refunds.made), 1)

    def test_a_function_that_raises_is_reported_failed(self) -> None:
        def broken(order_id: str, amount_cents: int) -> str:
            raise ValueError("card expired")

        outcome, value = self.gate.run(AGENT, "refund", {"order_id": self.order, "amount_cents": 700}, self.call_id, broken)
        self.assertEqual(outcome.status, "failed")
        self.assertIsNone(value)
        self.assertIn("card expired", outcome.message)

    def test_an_async_function_is_gated_too(self) -> None:
        async def refund(order_id: str, amount_cents: int, key: str) -> str:
            await asyncio.sleep(0)
            return self.refunds.refund(order_id, amount_cents, key)

        wrapped = gated(self.gate, AGENT, "refund")(refund)
        answer = asyncio.run(wrapped(order_id=self.order, amount_cents=4200, call_id=self.call_id))
        self.assertEqual(answer, f"refunded 4200 cents on {self.order}")
        self.assertEqual(len(self.refunds.made), 1)

    def test_a_token_that_does_not_verify_is_told_so(self) -> None:
        with self.assertRaises(GateError) as refused:
            Gate(self.server.url, "not-a-token").propose(AGENT, "refund", {}, self.call_id)
        self.assertEqual(refused.exception.status, 401)


if __name__ == "__main__":
    unittest.main()


class OneWaitEachTest(ServerTest):
    """A server where one person may hold one waiting request."""

    serve_args = ("--max-waiting-per-person", "1")

    def test_a_wait_past_the_persons_share_pauses_and_asks_again_instead_of_failing(self) -> None:
        gate = Gate(self.server.url, self.server.token("helpdesk-bot"))
        order = f"A-{uuid.uuid4().hex[:6]}"
        outcome = gate.propose(AGENT, "refund", {"order_id": order, "amount_cents": 20000}, "call_held")
        # Another wait of the same person holds their one slot.
        holder = threading.Thread(target=gate.get, args=(outcome.id,), kwargs={"wait": 25})
        holder.start()
        time.sleep(0.5)
        with self.assertRaises(GateError) as refused:
            gate.get(outcome.id, wait=5)
        self.assertEqual((refused.exception.status, refused.exception.code), (429, "too_many_waits"))

        started = time.monotonic()
        waited = gate.wait(outcome, timeout=6)

        self.assertGreaterEqual(time.monotonic() - started, 5)
        self.assertEqual(waited.status, "awaiting_approval")
        approval = self.server.waiting("fran")[0]
        self.server.cli("review", "reject", approval["id"], "--reason", "not now", "--as", "fran")
        holder.join(timeout=10)
