"""A free TCP port on this machine, for a process Rufus starts to listen on: the vLLM server the
launcher starts, accelerate's main process (two runs on one machine must not share 29500)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port the kernel just gave out and took back: free now, likely still free when used."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
