"""Countersign's Python client: put an agent's tool calls behind a durable human sign-off.

See :class:`Gate` for the gate API and :func:`gated` for a decorator that makes a Python
function a caller-run tool: it runs only after approval, once, with the approved arguments.
"""

from .gate import SETTLED, Approval, Claim, Gate, GateError, Outcome, Unknown, gated

__all__ = ["SETTLED", "Approval", "Claim", "Gate", "GateError", "Outcome", "Unknown", "gated"]
__version__ = "0.1.0"
