"""The dispatcher process: ``DispatchServer``, its durable state and journal, its core (``core``:
state, lock, wake-ups, ``apply``) and the parts that receive it and answer its RPCs (datasets,
jobs, workers, split hand-out, long polls, garbage collection, durability)."""

from feedline.service.dispatcher.server import DispatchServer

__all__ = ["DispatchServer"]
