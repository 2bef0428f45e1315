"""The worker process: ``WorkerServer`` and the tasks it runs for the dispatcher's jobs."""

from feedline.service.worker.server import WorkerServer

__all__ = ["WorkerServer"]
