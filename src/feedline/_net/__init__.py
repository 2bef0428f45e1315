"""The network layer that the data service and the parameter-server cluster share: gRPC with
raw-buffer frames and a token check (``rpc``), the frame format (``wire``), errors as they
travel between processes (``remote_errors``) and a quiet, ordered stop at interpreter exit
(``exit``). It imports nothing of ``feedline.service`` or ``feedline.distribute``.
"""

import os

# gRPC's C core logs at INFO by default, among others a line for each connection whose server
# stopped with calls or a connection open ("Got goaway [2] ... Cancelling all calls"): news of
# a peer's ordinary departure, which the service reports itself where it matters. Its errors
# are still logged; set GRPC_VERBOSITY (DEBUG, INFO, ERROR, NONE) to choose otherwise. It is
# read when gRPC initialises, so it takes effect where feedline imports gRPC first.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
