#!/usr/bin/env python3
"""A support team's credits service, standard library only: the service of the README's "your
own agent in five minutes". It knows nothing of Countersign; it does what docs/services.md asks.

  POST /customers/{customer_id}/credits   {"amount_cents", "reason", ...}, Idempotency-Key: KEY
      201 with the credit; the same key again: 200 with the same credit, nothing new
  GET  /credits/by-key/{KEY}              200 with the credit made under KEY, or 404, after
      which KEY is void: a request that brings it later is refused (409), so a 404 means "did
      not take effect, and never will"

Usage: python3 examples/credits/service.py [--db state/credits.db] [--port 8791]
Prints "listening on http://127.0.0.1:PORT" first (--port 0 picks a free port).
"""
import argparse, json, os, re, sqlite3, threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_CREDIT_CENTS = 20_000  # the hard limit lives here, whatever any approval says
lock = threading.Lock()


class Credits(BaseHTTPRequestHandler):
    def answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def refuse(self, status, code, message):
        self.answer(status, {"error": {"code": code, "message": message}})

    def do_POST(self):
        path = re.fullmatch(r"/customers/([\w-]+)/credits", self.path)
        key = self.headers.get("Idempotency-Key")
        if not path:
            return self.refuse(404, "not_found", "no such path")
        if not key:
            return self.refuse(400, "no_key", "send an Idempotency-Key")
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            amount, reason = body["amount_cents"], str(body["reason"])
        except (ValueError, KeyError, TypeError):
            return self.refuse(400, "bad_body", "amount_cents and reason are required")
        if type(amount) is not int or not 0 < amount <= MAX_CREDIT_CENTS:
            return self.refuse(422, "bad_amount", f"a credit is 1 to {MAX_CREDIT_CENTS} cents")
        with lock, db:
            if db.execute("SELECT 1 FROM void WHERE key = ?", (key,)).fetchone():
                return self.refuse(409, "key_void", "this key was looked up and voided")
            made = find(key)
            if made:
                return self.answer(200, made)
            now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            db.execute("INSERT INTO credits VALUES (?, ?, ?, ?, ?)",
                       (key, path[1], amount, reason, now))
            return self.answer(201, find(key))

    def do_GET(self):
        path = re.fullmatch(r"/credits/by-key/([^/?]+)", self.path)
        if not path:
            return self.refuse(404, "not_found", "no such path")
        with lock, db:
            made = find(path[1])
            if made:
                return self.answer(200, made)
            db.execute("INSERT OR IGNORE INTO void VALUES (?)", (path[1],))
        return self.refuse(404, "not_found", "no credit under this key; the key is now void")

    def log_message(self, *_):
        pass


def find(key):
    row = db.execute("SELECT * FROM credits WHERE key = ?", (key,)).fetchone()
    names = ("idempotency_key", "customer_id", "amount_cents", "reason", "created_at")
    return dict(zip(names, row)) if row else None


if __name__ == "__main__":
    args = argparse.ArgumentParser()
    args.add_argument("--db", default="state/credits.db")
    args.add_argument("--port", type=int, default=8791)
    args = args.parse_args()
    os.makedirs(os.path.dirname(args.db) or ".", exist_ok=True)
    db = sqlite3.connect(args.db, check_same_thread=False, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("CREATE TABLE IF NOT EXISTS credits (key TEXT PRIMARY KEY, customer_id TEXT,"
               " amount_cents INTEGER, reason TEXT, created_at TEXT)")
    db.execute("CREATE TABLE IF NOT EXISTS void (key TEXT PRIMARY KEY)")
    db.isolation_level = ""
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Credits)
    print(f"listening on http://127.0.0.1:{server.server_port}", flush=True)
    server.serve_forever()
