"""Scheduled functions travel cloudpickled; what does not pickle is named."""

from __future__ import annotations

import threading

import pytest

from feedline.distribute.parameter_server import closures
from feedline.distribute.parameter_server.values import PerWorkerValues
from feedline.errors import InvalidArgumentError

LOCK = threading.Lock()


def test_the_object_that_does_not_pickle_is_named() -> None:
    with pytest.raises(InvalidArgumentError, match=r"argument 1 \(<unlocked _thread.lock"):
        closures.dumps_closure(print, (1, threading.Lock()), {})
    with pytest.raises(InvalidArgumentError, match=r"keyword argument 'lock', a _thread.lock,"):
        closures.dumps_closure(print, (), {"lock": threading.Lock()})
    lock = threading.Lock()
    with pytest.raises(InvalidArgumentError, match=r"closure variable 'lock', a _thread.lock,"):
        closures.dumps_closure(lambda: lock.locked(), (), {})


def test_per_worker_values_travel_as_references() -> None:
    values = PerWorkerValues(["a", "b"])
    data, refs = closures.dumps_closure(lambda v: v * 2, (values,), {})
    assert list(refs.values()) == [values]
    fn, args, _ = closures.ClosureUnpickler(data, {}, {values._feedline_reference()[1]: "b"}).load()
    assert fn(*args) == "bb"  # worker 1's element
