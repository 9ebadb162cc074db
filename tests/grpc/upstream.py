#!/usr/bin/env python3
"""A real gRPC upstream for the tests (grpcio, no protoc: a generic handler with identity
serializers, so messages are raw bytes).

Service `slidegate.test.Echo`, plaintext HTTP/2 (h2c) on 127.0.0.1 at a port the OS chooses:
- `Echo` answers the request's bytes and counts the call;
- `Count` answers how many `Echo` calls arrived, as decimal text;
- `Login` answers `ok` to the message `good` and fails any other with `UNAUTHENTICATED` before
  anything is sent (a trailers-only answer: `grpc-status` in the head);
- `LoginLate` does the same after sending its initial metadata (`grpc-status` in trailers).

Prints the port on the first line of stdout once it serves, and stops when stdin closes (the
test harness holds it open and kills the process on drop).
"""

import sys
import threading
from concurrent import futures

import grpc

SERVICE = "slidegate.test.Echo"

_calls = 0
_lock = threading.Lock()


def echo(request, _context):
    global _calls
    with _lock:
        _calls += 1
    return request


def count(_request, _context):
    with _lock:
        return str(_calls).encode()


def login(request, context):
    if request != b"good":
        context.abort(grpc.StatusCode.UNAUTHENTICATED, "bad credentials")
    return b"ok"


def login_late(request, context):
    context.send_initial_metadata((("x-late", "1"),))
    return login(request, context)


def main():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    handler = grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Echo": grpc.unary_unary_rpc_method_handler(echo),
            "Count": grpc.unary_unary_rpc_method_handler(count),
            "Login": grpc.unary_unary_rpc_method_handler(login),
            "LoginLate": grpc.unary_unary_rpc_method_handler(login_late),
        },
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    if port == 0:
        sys.exit("upstream.py: could not bind a port")
    server.start()
    print(port, flush=True)
    sys.stdin.read()
    server.stop(0)


if __name__ == "__main__":
    main()
