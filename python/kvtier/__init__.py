"""kvtier: the KV-cache service's client for Python workers.

    import kvtier
    client = kvtier.Client(socket="/run/kvtier/kvtierd.sock", tenant="", model_id=None)
    with client.acquire(tokens, session="chat-1") as lease:
        lease.wait()
        kv = lease.block(0)  # numpy [layers, 2, block_tokens, kv_heads, head_dim], a view of the pool
    with client.allocate(2) as w:
        w.block(0)[...] = ...
        client.commit(w, "chat-1", tokens[: 2 * client.block_tokens])

Every error kvtierd or libkvtier reports raises a subclass of kvtier.Error
named after its status code (NotFoundError, ResourceExhaustedError, ...),
carrying the daemon's message; `code` is the code's stable name.
"""


class Error(Exception):
    """A kvtier status other than ok."""

    code = "unknown"


def _error_class(code: str) -> type:
    name = "".join(part.capitalize() for part in code.split("_")) + "Error"
    return type(name, (Error,), {"code": code, "__doc__": f"kvtier status '{code}'."})


# One class per status code (kvtier/status.h), named as the native module raises them.
_CODES = (
    "invalid_argument",
    "not_found",
    "resource_exhausted",
    "failed_precondition",
    "already_exists",
    "unavailable",
    "protocol_error",
    "version_mismatch",
    "permission_denied",
    "timeout",
    "corrupt",
    "internal",
)
for _code in _CODES:
    _cls = _error_class(_code)
    globals()[_cls.__name__] = _cls
del _code, _cls

from ._native import PROTOCOL_VERSION, Client, Lease, WriteLease  # noqa: E402  (the errors must exist first)

__all__ = ["Client", "Lease", "WriteLease", "Error", "PROTOCOL_VERSION"] + [
    "".join(p.capitalize() for p in c.split("_")) + "Error" for c in _CODES
]
