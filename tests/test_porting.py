"""``import feedline as tf``: lazy modules, TensorFlow's spellings, and hints for names feedline
does not have (feedline/_porting.py, feedline/__init__.py, feedline/compat)."""

from __future__ import annotations

import doctest
import functools
import pathlib
import re
import subprocess
import sys
import types

import pytest

import feedline
import feedline as tf
from feedline import _enums, _porting

PORTING = pathlib.Path(__file__).resolve().parents[1] / "docs" / "porting.md"

LAZY_MODULES = [
    "compat",
    "config",
    "data",
    "datasets",
    "distribute",
    "errors",
    "io",
    "metrics",
    "nn",
    "service",
    "train",
]


@pytest.mark.parametrize("name", LAZY_MODULES)
def test_lazy_modules_resolve_to_the_modules(name: str) -> None:
    module = getattr(feedline, name)
    assert module is sys.modules[f"feedline.{name}"]
    assert name in dir(feedline) and name in feedline.__all__


def test_dir_lists_what_resolves() -> None:
    names = dir(feedline)
    assert names == sorted(names)
    assert {"TensorSpec", "TensorShape", "float32", "__version__"} <= set(names)
    assert "constant" not in names
    assert tf.TensorSpec is tf.data.TensorSpec


def _owner(key: str) -> tuple[types.ModuleType, str]:
    """The feedline module that stands for ``tf.<key>``'s module, and the attribute's name."""
    *path, name = key.split(".")
    return functools.reduce(getattr, path, feedline), name


@pytest.mark.parametrize("key", list(_porting.REPLACEMENTS))
def test_tensorflow_names_say_what_to_use(key: str) -> None:
    module, name = _owner(key)
    with pytest.raises(AttributeError) as caught:
        getattr(module, name)
    message = str(caught.value)
    assert f"feedline has no tf.{key}; {_porting.REPLACEMENTS[key]}" in message
    assert caught.value.name == name and caught.value.obj is module
    assert not hasattr(module, name)


@pytest.mark.parametrize(
    ("expression", "hint"),
    [
        ("tf.constant", "torch.tensor(value)"),
        ("tf.cast", "tensor.to(dtype)"),
        ("tf.reduce_sum", "torch.sum"),
        ("tf.keras", "torch.nn"),
        ("tf.estimator", "training loop"),
        ("tf.function", "drop the @tf.function decorator"),
        ("tf.GradientTape", "loss.backward()"),
        ("tf.Variable", "torch.nn.Parameter"),
    ],
)
def test_the_common_names(expression: str, hint: str) -> None:
    with pytest.raises(AttributeError, match=r"feedline has no tf\.") as caught:
        eval(expression, {"tf": tf})
    assert hint in str(caught.value)


@pytest.mark.parametrize(
    ("module", "name"),
    [
        (feedline, "dta"),
        (feedline, "Constant"),
        (feedline.compat, "v2"),
        (feedline.compat.v1, "distribut"),
        (feedline.data.experimental, "AutoShardPolicyy"),
        (feedline.distribute.experimental, "ValueContex"),
        (feedline.config, "list_logical_device"),
    ],
)
def test_misspelt_names_keep_python_s_error(module: types.ModuleType, name: str) -> None:
    with pytest.raises(AttributeError) as caught:
        getattr(module, name)
    assert str(caught.value) == f"module {module.__name__!r} has no attribute {name!r}"
    assert caught.value.name == name and caught.value.obj is module


def test_python_suggests_the_close_name() -> None:
    result = subprocess.run(
        [sys.executable, "-c", "import feedline as tf\ntf.dta"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.stderr.splitlines()[-1] == (
        "AttributeError: module 'feedline' has no attribute 'dta'. Did you mean: 'data'?"
    )


def test_experimental_spellings_are_the_same_objects() -> None:
    assert tf.distribute.experimental.ValueContext is tf.distribute.ValueContext
    assert tf.data.experimental.AutoShardPolicy is tf.data.AutoShardPolicy
    assert tf.data.experimental.DistributeOptions is tf.data.DistributeOptions
    assert tf.data.experimental.service is tf.service
    for name in tf.service.__all__:
        assert getattr(tf.data.experimental.service, name) is getattr(tf.service, name)
    assert tf.compat.v1.distribute is tf.distribute
    # tf.compat.v1.data adds TF1's iterator functions to tf.data's names (the same objects).
    assert tf.compat.v1.data.Dataset is tf.data.Dataset
    assert tf.compat.v1.data.Options is tf.data.Options
    assert tf.compat.v1.distribute.experimental is tf.distribute.experimental


def test_multi_worker_mirrored_strategy_under_experimental(monkeypatch: pytest.MonkeyPatch) -> None:
    # TensorFlow's experimental class is the strategy with its older signature,
    # (communication, cluster_resolver).
    experimental = tf.distribute.experimental
    monkeypatch.delattr(experimental, "MultiWorkerMirroredStrategy", raising=False)
    strategy_class = experimental.MultiWorkerMirroredStrategy
    assert issubclass(strategy_class, tf.distribute.MultiWorkerMirroredStrategy)
    assert "MultiWorkerMirroredStrategy" in dir(experimental)
    assert experimental.CollectiveCommunication is experimental.CommunicationImplementation
    for communication in (experimental.CollectiveCommunication.RING, "RING"):
        strategy = strategy_class(communication)
        assert strategy.communication_options.implementation.name == "RING"
        assert strategy.num_replicas_in_sync == 1  # no cluster: one worker
    assert strategy_class().communication_options.implementation.name == "AUTO"
    monkeypatch.delattr(experimental, "MultiWorkerMirroredStrategy")
    import feedline.distribute.multi_worker as multi_worker

    monkeypatch.delattr(multi_worker, "ExperimentalMultiWorkerMirroredStrategy")
    assert "MultiWorkerMirroredStrategy" not in dir(experimental)
    with pytest.raises(AttributeError, match="not available in this version of feedline"):
        experimental.MultiWorkerMirroredStrategy  # noqa: B018


@pytest.mark.parametrize(
    "expression",
    [
        "tf.distribute.experimental.ParameterServerStrategy",
        "tf.compat.v1.distribute.experimental.ParameterServerStrategy",
    ],
)
def test_parameter_server_strategy_is_not_available(expression: str) -> None:
    if hasattr(tf.distribute, "ParameterServerStrategy"):
        assert eval(expression, {"tf": tf}) is tf.distribute.ParameterServerStrategy
        return
    with pytest.raises(AttributeError) as caught:
        eval(expression, {"tf": tf})
    assert (
        "ParameterServerStrategy is not available in this version of feedline; "
        "MultiWorkerMirroredStrategy trains synchronously across processes"
    ) in str(caught.value)
    assert "ParameterServerStrategy" not in dir(tf.distribute.experimental)


def test_lazy_attributes_resolve_once_and_name_what_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module = types.ModuleType("feedline._lazy_example")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    module.__getattr__, module.__dir__ = _porting.lazy_attributes(
        module.__name__, {"path": "os.path", "sep": "os:sep", "later": "os:not_there_yet"}
    )
    import os

    assert module.path is os.path and module.sep == os.sep
    assert vars(module)["sep"] == os.sep  # stored on the module after the first access
    assert "path" in dir(module) and "later" not in dir(module)
    with pytest.raises(AttributeError, match="later is not available in this version"):
        module.later  # noqa: B018
    with pytest.raises(AttributeError, match=r"has no attribute 'other'$"):
        module.other  # noqa: B018


def test_every_name_of_the_table_is_in_docs_porting() -> None:
    text = PORTING.read_text()
    for key, hint in _porting.REPLACEMENTS.items():
        assert f"| `tf.{key}` | {hint} |" in text, f"docs/porting.md lacks the row of tf.{key}"


def test_doctests() -> None:
    for module in (_porting, _enums, feedline, feedline.compat.v1):
        results = doctest.testmod(module)
        assert results.attempted >= 1 and results.failed == 0, module.__name__


@pytest.mark.parametrize(
    ("module", "name", "hint"),
    [
        ("distribute", "TPUStrategy", "MirroredStrategy (no TPUs)"),
        ("distribute", "NcclAllReduce", "uses NCCL on GPUs"),
        ("nn", "relu", "torch.relu(x)"),
        ("nn", "sparse_softmax_cross_entropy_with_logits", "cross_entropy(logits, labels"),
    ],
)
def test_strategy_and_nn_names_say_what_to_use(module: str, name: str, hint: str) -> None:
    with pytest.raises(AttributeError, match=re.escape(hint)):
        getattr(getattr(tf, module), name)
    with pytest.raises(AttributeError) as error:
        getattr(getattr(tf, module), name + "_typo")
    assert str(error.value) == f"module 'feedline.{module}' has no attribute '{name}_typo'"


def test_names_tensorflow_code_reaches() -> None:
    from feedline.distribute.cluster_resolver import ClusterSpec

    assert tf.train.ClusterSpec is ClusterSpec
    spec = tf.train.ClusterSpec({"worker": ["w0:2222", "w1:2222"], "ps": {1: "p1:2222"}})
    assert spec.jobs == ["ps", "worker"] and spec.num_tasks("worker") == 2
    assert spec.task_address("worker", 1) == "w1:2222" and spec.job_tasks("ps") == [None, "p1:2222"]
    assert callable(tf.py_function) and callable(tf.numpy_function)
    assert tf.nest.flatten({"b": 2, "a": 1}) == [1, 2]
    assert tf.compat.v1.data.Dataset is tf.data.Dataset


def test_compat_v1_iterators() -> None:
    dataset = tf.data.Dataset.range(3)
    iterator = tf.compat.v1.data.make_one_shot_iterator(dataset)
    assert [int(iterator.get_next()) for _ in range(3)] == [0, 1, 2]
    # TensorFlow 2 runs eagerly, where an initializable iterator is refused.
    with pytest.raises(RuntimeError, match="eager execution"):
        tf.compat.v1.data.make_initializable_iterator(dataset)
