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
kvtier.__version__ is the installed package's version (the build tree's: the
CMake project's).
"""


from __future__ import annotations


class Error(Exception):
    """A kvtier status other than ok."""

    code = "unknown"


# One class per status code (kvtier/status.h), named as the native module raises
# them (kvtier.<Code>Error, found by name): written out so type checkers see them.
class InvalidArgumentError(Error):
    """kvtier status 'invalid_argument'."""

    code = "invalid_argument"


class NotFoundError(Error):
    """kvtier status 'not_found'."""

    code = "not_found"


class ResourceExhaustedError(Error):
    """kvtier status 'resource_exhausted'."""

    code = "resource_exhausted"


class FailedPreconditionError(Error):
    """kvtier status 'failed_precondition'."""

    code = "failed_precondition"


class AlreadyExistsError(Error):
    """kvtier status 'already_exists'."""

    code = "already_exists"


class UnavailableError(Error):
    """kvtier status 'unavailable'."""

    code = "unavailable"


class ProtocolErrorError(Error):
    """kvtier status 'protocol_error'."""

    code = "protocol_error"


class VersionMismatchError(Error):
    """kvtier status 'version_mismatch'."""

    code = "version_mismatch"


class PermissionDeniedError(Error):
    """kvtier status 'permission_denied'."""

    code = "permission_denied"


class TimeoutError(Error):
    """kvtier status 'timeout'."""

    code = "timeout"


class CorruptError(Error):
    """kvtier status 'corrupt'."""

    code = "corrupt"


class InternalError(Error):
    """kvtier status 'internal'."""

    code = "internal"


_CODES = tuple(cls.code for cls in Error.__subclasses__())

from ._native import PROTOCOL_VERSION, Client, Lease, WriteLease  # noqa: E402  (the errors must exist first)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kvtier")
    except PackageNotFoundError:  # A build tree on PYTHONPATH: the CMake project's version.
        from ._native import __version__ as built

        return built


__version__ = _version()

__all__ = ["Client", "Lease", "WriteLease", "Error", "PROTOCOL_VERSION", "__version__",
           "InvalidArgumentError", "NotFoundError", "ResourceExhaustedError", "FailedPreconditionError",
           "AlreadyExistsError", "UnavailableError", "ProtocolErrorError", "VersionMismatchError",
           "PermissionDeniedError", "TimeoutError", "CorruptError", "InternalError"]
