"""``Dataset.prefetch``: a background thread keeps up to ``buffer_size`` elements ready."""

from __future__ import annotations

from typing import Any

from feedline.data.autotune import BufferTuner
from feedline.data.dataset import AUTOTUNE, Dataset, DatasetIterator, IteratorContext
from feedline.data.ops._background import END, ERROR, Producer
from feedline.data.ops._checks import check_int
from feedline.errors import InvalidArgumentError


class PrefetchDataset(Dataset):
    """Produces elements ahead of the consumer on a background thread.

    ``buffer_size=AUTOTUNE`` starts at one element and doubles whenever the consumer finds the
    buffer empty, within the RAM budget of ``Options.autotune``. ``buffer_size=0`` is a no-op.
    The iterator's state holds the input's position and the elements already buffered, so a
    restored iterator yields exactly what the original would have.
    """

    def __init__(self, input_dataset: Dataset, buffer_size: int) -> None:
        super().__init__((input_dataset,))
        buffer_size = check_int("buffer_size", buffer_size, "prefetch")
        if buffer_size < 0 and buffer_size != AUTOTUNE:
            raise InvalidArgumentError(
                f"prefetch: buffer_size must be >= 0 or AUTOTUNE (-1), got {buffer_size}"
            )
        self._buffer_size = buffer_size
        self._element_spec = input_dataset.element_spec

    def _cardinality(self) -> int:
        return self._inputs[0].cardinality()

    def _make_iterator(self, ctx: IteratorContext) -> DatasetIterator:
        return _PrefetchIterator(self, ctx)


class _PrefetchIterator(DatasetIterator):
    def __init__(self, dataset: PrefetchDataset, ctx: IteratorContext) -> None:
        super().__init__(dataset, ctx)
        self._input = dataset._inputs[0]._iterator(ctx)
        self._synchronous = dataset._buffer_size == 0
        tuner = BufferTuner(ctx.options) if dataset._buffer_size == AUTOTUNE else None
        self._tuner = tuner
        fixed = dataset._buffer_size
        capacity = (lambda: tuner.size) if tuner else (lambda: fixed)
        self._producer = Producer(self._input._next, capacity, name="feedline-prefetch")

    def _next(self) -> Any:
        if self._synchronous:
            return self._input._next()
        (kind, value), waited = self._producer.get()
        if kind == END:
            raise StopIteration
        if kind == ERROR:
            raise value.with_traceback(value.__traceback__)
        if self._tuner is not None:
            self._tuner.observe(value, waited)
        return value

    def _get_state(self) -> dict[str, Any]:
        input_state, items = self._producer.capture(self._input.get_state)
        return {"input": input_state, "buffer": items}

    def _set_state(self, state: dict[str, Any]) -> None:
        self._producer.stop()
        self._input.set_state(state["input"])
        self._producer.reset(list(state["buffer"]))

    def _close(self) -> None:
        self._producer.stop()
        self._input.close()
