"""An OTLP/HTTP trace receiver on loopback for tests: decodes each POST /v1/traces body as an
ExportTraceServiceRequest with the official opentelemetry-proto package, appends every span to
the file named by its first argument as a JSON line, and answers as a collector does. It listens
on the port its second argument names, else on a free one, and prints
`listening on http://127.0.0.1:<port>` first; a body that does not decode is answered 400 and
recorded as {"undecodable": ...}, so the test sees it."""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

RECEIVED = sys.argv[1]
WRITING = threading.Lock()


def value_of(any_value):
    """An attribute's value as JSON: the one field of the AnyValue that is set."""
    kind = any_value.WhichOneof("value")
    return None if kind is None else getattr(any_value, kind)


def attributes(key_values):
    return {kv.key: value_of(kv.value) for kv in key_values}


def spans_of(request):
    for resource_spans in request.resource_spans:
        resource = attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                yield {
                    "service": resource.get("service.name"),
                    "scope": scope_spans.scope.name,
                    "name": span.name,
                    "trace_id": span.trace_id.hex(),
                    "span_id": span.span_id.hex(),
                    "parent_span_id": span.parent_span_id.hex(),
                    "attributes": attributes(span.attributes),
                }


class Receiver(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        try:
            if self.path != "/v1/traces":
                raise DecodeError(f"posted to {self.path}")
            lines = [json.dumps(span) for span in spans_of(ExportTraceServiceRequest.FromString(body))]
            status, answer = 200, ExportTraceServiceResponse().SerializeToString()
        except DecodeError as error:
            lines = [json.dumps({"undecodable": str(error)})]
            status, answer = 400, b""
        with WRITING, open(RECEIVED, "a") as received:
            received.writelines(line + "\n" for line in lines)
        self.send_response(status)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


port = int(sys.argv[2]) if len(sys.argv) > 2 else 0
server = ThreadingHTTPServer(("127.0.0.1", port), Receiver)
print(f"listening on http://127.0.0.1:{server.server_port}", flush=True)
server.serve_forever()
