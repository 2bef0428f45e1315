"""Tests of feedline/service/client/channels.py: calls that wait for the dispatcher to be
reachable say so while they wait, and name what they were for when they give up."""

from __future__ import annotations

import logging
import time

import pytest

from feedline import errors, service
from feedline.data import Dataset, Options
from feedline.service.client import channels
from tests.launcher import free_port


def test_registering_with_an_unreachable_dispatcher_says_it_waits_then_names_it(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(channels, "SLOW_CALL_S", 0.3)
    options = Options()
    options.experimental_distribute.service_timeout_ms = 2_000
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    dataset = Dataset.range(3).apply(service.distribute("parallel_epochs", address))
    started = time.monotonic()
    with (
        caplog.at_level(logging.WARNING, logger=channels.__name__),
        pytest.raises(errors.UnavailableError) as raised,
    ):
        iter(dataset.with_options(options))
    assert 1.5 < time.monotonic() - started < 30  # the bound held, and not less
    message = str(raised.value)
    assert address in message and "registering the dataset" in message, message
    assert "service_timeout_ms" in message, message
    waits = [r.getMessage() for r in caplog.records if "has not answered" in r.getMessage()]
    assert len(waits) == 1, caplog.text  # once, while it waited
    assert address in waits[0] and "waiting up to 2 s in all" in waits[0], waits


def test_a_call_answered_at_once_says_nothing(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(channels, "SLOW_CALL_S", 0.3)
    with (
        caplog.at_level(logging.WARNING, logger=channels.__name__),
        service.DispatchServer(service.DispatcherConfig()) as dispatcher,
    ):
        dataset = Dataset.range(3).apply(service.distribute("parallel_epochs", dispatcher.target))
        iterator = iter(dataset)  # registered and joined: no worker is needed for that
        time.sleep(0.6)  # past SLOW_CALL_S: a timer left running would log now
        iterator.close()
    assert "has not answered" not in caplog.text
