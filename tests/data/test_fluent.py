"""Tests of feedline/data/_fluent.py and _fluent_api.py: the declared fluent API of ``Dataset``
is the attached one, name for name, signature for signature, with the declared docstrings."""

from __future__ import annotations

import doctest
import inspect
import pickle
import pydoc
from collections.abc import Callable
from typing import Any

import pytest

from feedline.data import Dataset, _fluent, _fluent_api
from feedline.data._fluent_api import FluentAPI

DECLARED = sorted(name for name in vars(FluentAPI) if not name.startswith("_"))
ATTACHED = sorted(_fluent._STATIC.keys() | _fluent._METHODS.keys())


def _signature(fn: Callable[..., Any]) -> inspect.Signature:
    """``fn``'s signature, ``self`` unannotated (the implementations say ``self: Dataset``)."""
    signature = inspect.signature(fn)
    return signature.replace(
        parameters=[
            p.replace(annotation=inspect.Parameter.empty) if p.name == "self" else p
            for p in signature.parameters.values()
        ]
    )


def test_every_declared_name_is_attached_and_every_attached_name_declared() -> None:
    assert DECLARED == ATTACHED
    assert len(DECLARED) == 47
    for name in DECLARED:
        assert name in vars(Dataset), f"Dataset.{name} is declared but not attached"
        assert vars(Dataset)[name] is not vars(FluentAPI)[name]


@pytest.mark.parametrize("name", DECLARED)
def test_declared_and_attached_signatures_agree(name: str) -> None:
    declared = getattr(FluentAPI, name)
    attached = getattr(Dataset, name)
    assert attached is not declared
    assert _signature(attached) == _signature(declared)
    assert isinstance(vars(Dataset)[name], staticmethod) == isinstance(
        vars(FluentAPI)[name], staticmethod
    )
    assert (name in _fluent._STATIC) == isinstance(vars(FluentAPI)[name], staticmethod)


@pytest.mark.parametrize("name", DECLARED)
def test_attached_methods_carry_the_declared_docstring(name: str) -> None:
    declared = getattr(FluentAPI, name)
    attached = getattr(Dataset, name)
    assert declared.__doc__ and declared.__doc__.strip()
    assert attached.__doc__ == declared.__doc__
    assert attached.__name__ == name


def test_help_shows_signature_and_docstring() -> None:
    text = pydoc.render_doc(Dataset.batch, renderer=pydoc.plaintext)
    assert "batch(self: 'Dataset', batch_size: 'int', drop_remainder: 'bool' = False" in text
    assert "Consecutive elements stacked in batches of ``batch_size``." in text


def test_a_declaration_called_directly_says_where_the_body_is() -> None:
    with pytest.raises(NotImplementedError, match=r"attached by feedline\.data\._fluent"):
        FluentAPI.range(3)


def test_attached_methods_run_and_datasets_still_pickle() -> None:
    ds = Dataset.range(6).map(lambda x: x + 1).filter(lambda x: x % 2 == 0).batch(2)
    assert [b.tolist() for b in ds] == [[2, 4], [6]]
    again = pickle.loads(pickle.dumps(Dataset.range(4).shuffle(4, seed=3).batch(2)))
    assert sorted(x for b in again for x in b.tolist()) == [0, 1, 2, 3]


def test_docstring_examples() -> None:
    assert doctest.testmod(_fluent_api).failed == 0


def test_tensorflows_name_argument_is_accepted_and_unused(tmp_path: Any) -> None:
    ds = (
        Dataset.from_tensor_slices([1, 2, 3], name="slices")
        .map(lambda x: x * 2, name="double")
        .filter(lambda x: x > 2, name="big")
        .batch(2, name="pairs")
        .prefetch(1, name="ahead")
    )
    assert [b.tolist() for b in ds] == [[4, 6]]
    taking = [n for n in DECLARED if "name" in inspect.signature(getattr(Dataset, n)).parameters]
    assert {"map", "batch", "from_tensor_slices", "zip", "interleave"} <= set(taking)
    # TensorFlow's other map arguments: synchronous=True refuses parallelism, as there.
    quiet = Dataset.range(3).map(lambda x: x + 1, synchronous=True, use_unbounded_threadpool=True)
    assert [int(x) for x in quiet] == [1, 2, 3]
    with pytest.raises(ValueError, match="`synchronous` is not supported with"):
        Dataset.range(3).map(lambda x: x, num_parallel_calls=2, synchronous=True)
    from feedline.data import TextLineDataset, TFRecordDataset

    path = tmp_path / "lines.txt"
    path.write_text("a\nb\n")
    assert [x.item() for x in TextLineDataset(str(path), name="lines")] == [b"a", b"b"]
    assert TFRecordDataset(str(path), name="records").element_spec.shape == ()
