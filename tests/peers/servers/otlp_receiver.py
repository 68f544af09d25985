"""A real OTLP/gRPC trace receiver for the tests (PyPI `grpcio` + `opentelemetry-proto`).

Usage: otlp_receiver.py OUT.jsonl PORT_FILE
Serves `opentelemetry.proto.collector.trace.v1.TraceService/Export` on 127.0.0.1 (a free port,
written to PORT_FILE once serving) and appends one JSON line per received span to OUT.jsonl:
`{"resource": {...}, "trace_id": hex, "span_id": hex, "parent_span_id": hex, "name": ...,
"kind": int, "start": ns, "end": ns, "status": {"code": int, "message": str},
"attributes": {key: value}, "metadata": {...}}`.
"""

import json
import sys
from concurrent import futures

import grpc
from opentelemetry.proto.collector.trace.v1 import (
    trace_service_pb2,
    trace_service_pb2_grpc,
)

OUT, PORT_FILE = sys.argv[1], sys.argv[2]


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


class Traces(trace_service_pb2_grpc.TraceServiceServicer):
    def Export(self, request, context):  # noqa: N802 - the gRPC method name
        metadata = {k: v for k, v in context.invocation_metadata() if not k.startswith(":")}
        with open(OUT, "a", encoding="utf-8") as f:
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
                                },
                                sort_keys=True,
                            )
                            + "\n"
                        )
        return trace_service_pb2.ExportTraceServiceResponse()


def main():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    with open(PORT_FILE + ".tmp", "w", encoding="utf-8") as f:
        f.write(str(port))
    import os

    os.replace(PORT_FILE + ".tmp", PORT_FILE)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
