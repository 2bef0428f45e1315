"""The dispatcher process: ``DispatchServer``, its durable state and journal, and the parts
that answer its RPCs (jobs, workers, split hand-out, long polls, garbage collection)."""

from feedline.service.dispatcher.server import DispatchServer

__all__ = ["DispatchServer"]
