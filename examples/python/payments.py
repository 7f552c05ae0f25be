"""The helpdesk's own refund function, as a team's agent would already have it: here it records
each refund in a JSON-lines ledger, once per idempotency key, as a payment provider would."""

from __future__ import annotations

import json
import os
from pathlib import Path

LEDGER = Path(os.environ.get("REFUNDS_LEDGER", "refunds.jsonl"))


def refund(order_id: str, amount_cents: int, key: str) -> str:
    """Refunds `amount_cents` of `order_id`; the same key twice refunds once."""
    made = [json.loads(line) for line in LEDGER.read_text().splitlines()] if LEDGER.exists() else []
    if not any(entry["key"] == key for entry in made):
        with LEDGER.open("a") as ledger:
            ledger.write(json.dumps({"order_id": order_id, "amount_cents": amount_cents, "key": key}) + "\n")
    return f"Refunded USD {amount_cents / 100:.2f} on order {order_id} (key {key})."
