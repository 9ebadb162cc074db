#!/usr/bin/env python3
"""A real gRPC client for the tests (grpcio): makes `--calls` unary calls of `--method` to
TARGET, one after the other on one channel, each with metadata `x-client: <--client>` (one
line per `--client` given), and
prints one JSON array: per call its status code name (`OK`, `RESOURCE_EXHAUSTED`, ...), the
status message (`details`, percent-decoded by grpcio), the reply (text, or null), and the
initial and trailing metadata (a trailers-only answer's fields arrive as trailing metadata).

h2c by prior knowledge by default; `--ca <PEM>` speaks h2 over TLS, trusting only that CA and
checking the certificate for `--tls-name` (default `localhost`).
"""

import argparse
import json

import grpc


def metadata(pairs):
    out = {}
    for key, value in pairs or ():
        if isinstance(value, bytes):
            value = value.decode("latin-1")
        out[key] = value
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("target")
    ap.add_argument("--calls", type=int, default=1)
    ap.add_argument("--client", action="append")
    ap.add_argument("--method", default="/slidegate.test.Echo/Echo")
    ap.add_argument("--message", help="the request's bytes (default: hello <i>)")
    ap.add_argument("--ca")
    ap.add_argument("--tls-name", default="localhost")
    args = ap.parse_args()

    if args.ca:
        with open(args.ca, "rb") as f:
            creds = grpc.ssl_channel_credentials(root_certificates=f.read())
        options = (("grpc.ssl_target_name_override", args.tls_name),)
        channel = grpc.secure_channel(args.target, creds, options=options)
    else:
        channel = grpc.insecure_channel(args.target)
    call = channel.unary_unary(args.method)

    results = []
    for i in range(args.calls):
        request = args.message.encode() if args.message else b"hello %d" % i
        md = tuple(("x-client", c) for c in (args.client or ["client"]))
        try:
            reply, c = call.with_call(request, metadata=md, timeout=20)
            results.append({
                "code": "OK",
                "details": c.details() or "",
                "reply": reply.decode(),
                "initial": metadata(c.initial_metadata()),
                "trailing": metadata(c.trailing_metadata()),
            })
        except grpc.RpcError as e:
            results.append({
                "code": e.code().name,
                "details": e.details() or "",
                "reply": None,
                "initial": metadata(e.initial_metadata()),
                "trailing": metadata(e.trailing_metadata()),
            })
    channel.close()
    print(json.dumps(results))


if __name__ == "__main__":
    main()
