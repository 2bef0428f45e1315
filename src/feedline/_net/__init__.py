"""The network layer that the data service and the parameter-server cluster share: gRPC with
raw-buffer frames and a token check (``rpc``), the frame format (``wire``), errors as they
travel between processes (``remote_errors``) and a quiet, ordered stop at interpreter exit
(``exit``). It imports nothing of ``feedline.service`` or ``feedline.distribute``.
"""
