"""What the tasks of a parameter-server cluster agree on: the gRPC service's name and the
methods whose (possibly large) requests arrive in chunks."""

from __future__ import annotations

__all__ = ["MAX_REQUEST_BYTES", "SERVICE_NAME", "UPLOADS"]

SERVICE_NAME = "feedline.distribute.Server"
#: The largest request a server takes: a variable's first value, a dense gradient, a closure.
MAX_REQUEST_BYTES = 4 << 30
#: Methods whose requests may be large arrive in chunks (``RpcClient.upload``).
UPLOADS = ("Create", "Pull", "Push", "SetState", "Run", "CreateResource")
