"""Both examples, end to end: the agent process proposes a USD 125 refund through the gate, a
finance manager lowers it to USD 75 from the CLI in another process, and the agent's own refund
function runs once with USD 75 under version 2's key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "clients" / "python" / "tests"))
from server import ServerTest  # noqa: E402


class ExamplesTest(ServerTest):

    def run_example(self, script: str, order: str) -> None:
        with tempfile.TemporaryDirectory() as scratch:
            ledger = Path(scratch) / "refunds.jsonl"
            env = {
                **os.environ,
                "COUNTERSIGN_URL": self.server.url,
                "COUNTERSIGN_TOKEN": self.server.token("helpdesk-bot"),
                "REFUNDS_LEDGER": str(ledger),
                "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parents[1] / "clients" / "python")]),
            }
            agent = subprocess.Popen(
                [sys.executable, str(HERE / script), f"Order {order} arrived broken: refund USD 125."],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )
            approval = self.approval_for(order)
            self.assertEqual(approval["tool"], "refund")
            self.assertEqual(approval["args"], {"order_id": order, "amount_cents": 12500})
            self.assertFalse(ledger.exists(), "nothing is refunded before a decision")

            self.server.cli("review", "edit", approval["id"], "--amount", "75", "--as", "fran", "--note", "partial damage")
            out, err = agent.communicate(timeout=60)
            self.assertEqual(agent.returncode, 0, err)

            [entry] = [json.loads(line) for line in ledger.read_text().splitlines()]
            self.assertEqual((entry["order_id"], entry["amount_cents"]), (order, 7500))
            self.assertTrue(entry["key"].endswith(":2"), entry)
            self.assertIn(f"Refunded USD 75.00 on order {order} (key {entry['key']})", out)
            audit = self.server.cli("audit", approval["id"])
            self.assertIn("7500", audit)
            self.assertIn("partial damage", audit)

    def approval_for(self, order: str) -> dict:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for approval in self.server.waiting("fran", timeout=0):
                if approval["args"].get("order_id") == order:
                    return approval
            time.sleep(0.1)
        self.fail(f"no approval for {order}")

    def test_the_langgraph_agent_runs_the_lowered_refund_once(self) -> None:
        self.run_example("langgraph_agent.py", "A-1001")

    def test_the_openai_agents_sdk_agent_runs_the_lowered_refund_once(self) -> None:
        self.run_example("openai_agents_agent.py", "A-2002")


if __name__ == "__main__":
    unittest.main()
