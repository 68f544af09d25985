"""A real OTLP trace receiver for the tests (PyPI `grpcio` + `opentelemetry-proto`).

Usage: otlp_receiver.py OUT.jsonl PORT_FILE [--http] [--tls CERT_CHAIN.pem KEY.pem]
Serves on 127.0.0.1 (a free port, written to PORT_FILE once serving), by default
`opentelemetry.proto.collector.trace.v1.TraceService/Export` over gRPC; with `--http`, OTLP/HTTP
(`POST /v1/traces` with an `application/x-protobuf` body, anything else answered 404/415).
With `--tls` either one is served over TLS with that certificate chain and key.
Appends one JSON line per received span to OUT.jsonl:
`{"resource": {...}, "trace_id": hex, "span_id": hex, "parent_span_id": hex, "name": ...,
"kind": int, "start": ns, "end": ns, "status": {"code": int, "message": str},
"attributes": {key: value}, "metadata": {...}, "transport": "grpc" | "http", "path": str}`
(`metadata`: the gRPC metadata or the HTTP headers, lower-cased).
"""

import argparse
import json
import os
import ssl
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from opentelemetry.proto.collector.trace.v1 import (
    trace_service_pb2,
    trace_service_pb2_grpc,
)

LOCK = threading.Lock()


def value(v):
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind in ("array_value", "kvlist_value"):
        return str(getattr(v, kind))
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind)


def attrs(kvs):
    return {kv.key: value(kv.value) for kv in kvs}


def record(out, request, metadata, transport, path):
    with LOCK, open(out, "a", encoding="utf-8") as f:
        for rs in request.resource_spans:
            resource = attrs(rs.resource.attributes)
            for ss in rs.scope_spans:
                for s in ss.spans:
                    f.write(
                        json.dumps(
                            {
                                "resource": resource,
                                "scope": ss.scope.name,
                                "trace_id": s.trace_id.hex(),
                                "span_id": s.span_id.hex(),
                                "parent_span_id": s.parent_span_id.hex(),
                                "name": s.name,
                                "kind": s.kind,
                                "start": s.start_time_unix_nano,
                                "end": s.end_time_unix_nano,
                                "status": {"code": s.status.code, "message": s.status.message},
                                "attributes": attrs(s.attributes),
                                "metadata": metadata,
                                "transport": transport,
                                "path": path,
                            },
                            sort_keys=True,
                        )
                        + "\n"
                    )


class Traces(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, out):
        self.out = out

    def Export(self, request, context):  # noqa: N802 - the gRPC method name
        metadata = {k: v for k, v in context.invocation_metadata() if not k.startswith(":")}
        record(self.out, request, metadata, "grpc", "TraceService/Export")
        return trace_service_pb2.ExportTraceServiceResponse()


def serve_grpc(out, tls):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(out), server)
    if tls:
        cert, key = (open(p, "rb").read() for p in tls)
        port = server.add_secure_port(
            "127.0.0.1:0", grpc.ssl_server_credentials([(key, cert)])
        )
    else:
        port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return port, server.wait_for_termination


def serve_http(out, tls):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - the http.server method name
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            if self.path != "/v1/traces":
                return self.answer(404, b"not found")
            if self.headers.get("content-type") != "application/x-protobuf":
                return self.answer(415, b"expected application/x-protobuf")
            try:
                request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
            except Exception as e:  # noqa: BLE001 - a bad body is the client's fault
                return self.answer(400, str(e).encode())
            metadata = {k.lower(): v for k, v in self.headers.items()}
            record(out, request, metadata, "http", self.path)
            reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.answer(200, reply, "application/x-protobuf")

        def answer(self, code, body, content_type="text/plain"):
            self.send_response(code)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt, *args):
            print("otlp http: " + fmt % args, flush=True)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if tls:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(tls[0], tls[1])
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
    return server.server_address[1], server.serve_forever


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("port_file")
    ap.add_argument("--http", action="store_true")
    ap.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"))
    a = ap.parse_args()
    port, run = (serve_http if a.http else serve_grpc)(a.out, a.tls)
    with open(a.port_file + ".tmp", "w", encoding="utf-8") as f:
        f.write(str(port))
    os.replace(a.port_file + ".tmp", a.port_file)
    run()


if __name__ == "__main__":
    main()
