"""What the Python scripts of scripts/ share: failing with the script's name, free loopback
ports, and waiting for a thing to be ready. Imported by each script with

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
    from common import die, free_port
"""

import os
import socket
import sys
import time


def die(msg):
    """Stop the script with `<script>: ERROR: msg` on stderr and exit status 1."""
    sys.exit(f"{os.path.basename(sys.argv[0])}: ERROR: {msg}")


def free_port(family=socket.AF_INET, host="127.0.0.1", bus=False):
    """A loopback port nothing listens on now. `bus`: also free at port + 10000 (a Redis
    Cluster node's bus port)."""
    for _ in range(200):
        with socket.socket(family) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if not bus:
            return port
        if port < 55535:
            with socket.socket(family) as s:
                try:
                    s.bind((host, port + 10000))
                    return port
                except OSError:
                    continue
    die("no free loopback port")


def free_ports(n):
    """`n` distinct free loopback ports (all held open until each is known)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def wait(what, check, timeout=20.0):
    """Poll `check()` (an OSError counts as not yet) every 50 ms until it is true; die after
    `timeout` seconds naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.05)
    die(f"{what} not ready after {timeout:.0f} s")
