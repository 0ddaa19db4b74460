"""python -m kvtier.serve: the command line, the process's memory setting, and uvicorn."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence

import uvicorn

from kvtier.serve.app import DEFAULT_MAX_BODY_BYTES, build_app
from kvtier.serve.service import Service

log = logging.getLogger("kvtier.serve")


def keep_freed_memory() -> None:
    """As kvtier-worker does: by default glibc hands large freed blocks back to
    the kernel, and every prefill then takes thousands of page faults to get
    them back. Blocks past 32 MiB (glibc's ceiling) still come from mmap."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3  # malloc.h
        libc.mallopt(m_mmap_threshold, 32 << 20)
        libc.mallopt(m_trim_threshold, 1 << 30)
        libc.mallopt(m_top_pad, 64 << 20)
    except (OSError, AttributeError):  # Not glibc: nothing to tune.
        pass


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kvtier.serve",
                                description="An OpenAI-compatible chat service over kvtier.")
    p.add_argument("--model", required=True, help="a Hugging Face model directory (loaded offline)")
    p.add_argument("--served-model-name", default="", help="the model's name in the API (default: the directory's)")
    p.add_argument("--socket", default="/run/kvtier/kvtierd.sock", help="kvtierd's socket")
    p.add_argument("--tenant", default="")
    p.add_argument("--profile", default="", help="kvtierd's profile (default: its first)")
    p.add_argument("--cache", choices=("kvtier", "local", "none"), default="kvtier",
                   help="where a conversation's K/V is kept between turns: kvtierd (shared by every process), "
                        "this process alone (for comparison), or nowhere (recompute every turn)")
    p.add_argument("--no-kvtier", dest="cache", action="store_const", const="none", help="--cache none")
    p.add_argument("--local-sessions", type=int, default=64, help="--cache local: conversations kept")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-context", type=int, default=0, help="tokens (default: the model's maximum)")
    p.add_argument("--context-policy", choices=("refuse", "truncate"), default="refuse",
                   help="an overlong conversation: refused (400), or cut to the system prompt and the latest turns")
    p.add_argument("--queue-limit", type=int, default=16, help="requests in progress or waiting before 503")
    p.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                   help="the largest request body taken; a larger one is refused (413) unread (default: 4 MiB)")
    p.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    p.add_argument("--log-level", default="info")
    p.add_argument("--no-keep-memory", dest="keep_memory", action="store_false",
                   help="let glibc return freed memory to the kernel between requests (the default keeps it)")
    return p


def main(argv: Sequence[str] | None = None) -> None:
    a = parser().parse_args(argv)
    if a.keep_memory:
        keep_freed_memory()
    logging.basicConfig(level=a.log_level.upper(), format="kvtier.serve: %(levelname)s: %(message)s")
    service = Service(a)
    if service.link is not None:
        service.link.start()  # Connects now; kvtierd not there yet means connecting when it is.
    log.info("serving %s on http://%s:%d (model identity %s, max context %d)", service.name, a.host, a.port,
             service.identity, service.max_context)
    uvicorn.run(build_app(service, a.max_body_bytes), host=a.host, port=a.port, log_level=a.log_level)
