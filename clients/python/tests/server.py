"""A real `countersign serve` for the client's tests: its own state directory, the helpdesk
example's definition and people (or another example's), and the CLI in other processes for what
a reviewer does."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
import unittest
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "helpdesk"


def binary() -> str:
    """The countersign binary: COUNTERSIGN_BIN, else the workspace's debug build."""
    if "COUNTERSIGN_BIN" in os.environ:
        return os.environ["COUNTERSIGN_BIN"]
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    return str(target / "debug" / "countersign")


class Server:
    def __init__(self, *serve_args: str, example: Path = EXAMPLE) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="countersign-client-")
        self.env = {
            **os.environ,
            "COUNTERSIGN_STATE": self._dir.name,
            "COUNTERSIGN_AGENTS": str(example),
            "COUNTERSIGN_PEOPLE": str(example / "people.toml"),
        }
        self.process = subprocess.Popen(
            [binary(), "serve", "--addr", "127.0.0.1:0", "--sweep-every", "0s", *serve_args],
            env=self.env,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if "listening on " not in line:
            self.process.kill()
            raise RuntimeError(f"countersign serve did not start: {line!r}")
        self.url = line.split("listening on ", 1)[1].strip()

    def cli(self, *args: str) -> str:
        """Runs the CLI over the same state, as a reviewer in another process would."""
        done = subprocess.run([binary(), *args], env=self.env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"countersign {' '.join(args)}: {done.stderr}")
        return done.stdout

    def token(self, person: str) -> str:
        return self.cli("token", "--as", person).strip()

    def waiting(self, person: str, timeout: float = 20.0) -> list[dict]:
        """The approvals waiting in `person`'s tenant, once there is at least one."""
        deadline = time.monotonic() + timeout
        while True:
            request = urllib.request.Request(
                self.url + "/approvals", headers={"authorization": f"Bearer {self.token(person)}"}
            )
            with urllib.request.urlopen(request, timeout=10) as answer:
                approvals = json.load(answer)["approvals"]
            if approvals or time.monotonic() > deadline:
                return approvals
            time.sleep(0.05)

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)
        if self.process.stdout:
            self.process.stdout.close()
        self._dir.cleanup()


class ServerTest(unittest.TestCase):
    """Tests sharing one server for their class, started with `serve_args` over `example`."""

    server: Server
    serve_args: tuple[str, ...] = ()
    example: Path = EXAMPLE

    @classmethod
    def setUpClass(cls) -> None:
        cls.server = Server(*cls.serve_args, example=cls.example)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.server.close()
