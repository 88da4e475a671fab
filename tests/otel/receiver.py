"""An OTLP/HTTP receiver on loopback for reflexr's telemetry tests.

Decodes what an exporter POSTs to /v1/traces and /v1/metrics with the
official protobuf definitions (PyPI's opentelemetry-proto) and answers as a
collector does (an empty Export*ServiceResponse, application/x-protobuf).
GET /spans and GET /metrics give what it decoded so far, as JSON: ids in
lowercase hex, attributes as a flat object. It prints its port on its first
line, then serves until its stdin closes (the test that started it ends).
"""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

lock = threading.Lock()
spans = []
metrics = []
requests = {"traces": 0, "metrics": 0}


def value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    if kind is None:
        return None
    return getattr(v, kind)


def attributes(kvs):
    return {kv.key: value(kv.value) for kv in kvs}


def decode_traces(body):
    req = trace_service_pb2.ExportTraceServiceRequest()
    req.ParseFromString(body)
    out = []
    for rs in req.resource_spans:
        resource = attributes(rs.resource.attributes)
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(
                    {
                        "name": s.name,
                        "kind": s.kind,
                        "trace_id": s.trace_id.hex(),
                        "span_id": s.span_id.hex(),
                        "parent_span_id": s.parent_span_id.hex(),
                        "links": [
                            {"trace_id": l.trace_id.hex(), "span_id": l.span_id.hex()}
                            for l in s.links
                        ],
                        "attributes": attributes(s.attributes),
                        "status": {"code": s.status.code, "message": s.status.message},
                        "scope": ss.scope.name,
                        "service": resource.get("service.name"),
                    }
                )
    return out


def decode_metrics(body):
    req = metrics_service_pb2.ExportMetricsServiceRequest()
    req.ParseFromString(body)
    out = []
    for rm in req.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                kind = m.WhichOneof("data")
                points = []
                for p in getattr(m, kind).data_points:
                    point = {"attributes": attributes(p.attributes)}
                    if kind == "histogram":
                        point["count"] = p.count
                        point["sum"] = p.sum
                        point["bounds"] = list(p.explicit_bounds)
                    else:
                        point["value"] = p.as_int if p.HasField("as_int") else p.as_double
                    points.append(point)
                out.append(
                    {"name": m.name, "unit": m.unit, "kind": kind,
                     "scope": sm.scope.name, "points": points}
                )
    return out


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, status, ctype, body):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        ctype = self.headers.get("Content-Type", "")
        if ctype != "application/x-protobuf":
            return self.reply(415, "text/plain", b"not protobuf: " + ctype.encode())
        with lock:
            if self.path == "/v1/traces":
                spans.extend(decode_traces(body))
                requests["traces"] += 1
                answer = trace_service_pb2.ExportTraceServiceResponse()
            elif self.path == "/v1/metrics":
                metrics.extend(decode_metrics(body))
                requests["metrics"] += 1
                answer = metrics_service_pb2.ExportMetricsServiceResponse()
            else:
                return self.reply(404, "text/plain", b"no such signal")
        self.reply(200, "application/x-protobuf", answer.SerializeToString())

    def do_GET(self):
        with lock:
            if self.path == "/spans":
                data = spans
            elif self.path == "/metrics":
                data = metrics
            elif self.path == "/requests":
                data = requests
            else:
                return self.reply(404, "text/plain", b"")
            body = json.dumps(data).encode()
        self.reply(200, "application/json", body)


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(server.server_address[1], flush=True)
    # Serve until the parent closes our stdin (or dies).
    sys.stdin.read()
    server.shutdown()


if __name__ == "__main__":
    main()
