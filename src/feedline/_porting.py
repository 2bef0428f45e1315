"""TensorFlow names that feedline does not have, what to use instead, and lazy module attributes.

``REPLACEMENTS`` is the one table: a TensorFlow name (without ``tf.``) and what takes its place.
A module of feedline that stands for a TensorFlow module answers an unknown attribute with
``missing_attribute``: a name in the table gets an ``AttributeError`` that says what to use, any
other name Python's usual ``AttributeError`` (with ``name`` and ``obj`` set, so Python can
suggest a close spelling). ``docs/porting.md`` lists the same table.

``lazy_attributes`` gives such a module its ``__getattr__`` and ``__dir__``: names that import
their module on first access, so that ``import feedline`` imports neither torch nor the data
pipeline until they are used.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["REPLACEMENTS", "lazy_attributes", "missing_attribute"]

_TORCH_TENSORS = "feedline.data pipelines yield NumPy arrays; torch.from_numpy(array) shares them"

REPLACEMENTS: dict[str, str] = {
    # Tensors and their operations: PyTorch (or NumPy inside a feedline.data pipeline).
    "Tensor": f"use torch.Tensor ({_TORCH_TENSORS})",
    "constant": "use torch.tensor(value), or numpy.asarray(value) inside a pipeline",
    "convert_to_tensor": "use torch.as_tensor(value)",
    "cast": "use tensor.to(dtype) (torch) or array.astype(dtype) (NumPy)",
    "reduce_sum": "use torch.sum(x, dim=...)",
    "reduce_mean": "use torch.mean(x, dim=...)",
    "reduce_max": "use torch.amax(x, dim=...)",
    "reduce_min": "use torch.amin(x, dim=...)",
    "reduce_prod": "use torch.prod(x, dim=...)",
    "range": "use torch.arange(...), or feedline.data.Dataset.range(...) for a dataset",
    "shape": "use x.shape",
    "reshape": "use torch.reshape(x, shape)",
    "concat": "use torch.cat(tensors, dim=...)",
    "stack": "use torch.stack(tensors, dim=...)",
    "expand_dims": "use torch.unsqueeze(x, dim)",
    "squeeze": "use torch.squeeze(x, dim)",
    "zeros": "use torch.zeros(shape)",
    "fill": "use torch.full(shape, value), or numpy.full(shape, value) inside a pipeline",
    "ones": "use torch.ones(shape)",
    "matmul": "use torch.matmul(a, b) or a @ b",
    "argmax": "use torch.argmax(x, dim=...)",
    "one_hot": "use torch.nn.functional.one_hot(indices, num_classes)",
    "random": "use torch.rand / torch.randn / torch.randint (numpy.random in a pipeline)",
    "print": "use print(...)",
    "math": "use torch's functions (torch.exp, torch.eq, ...), or NumPy's inside a pipeline",
    "strings": (
        "use Python's str and bytes methods: a pipeline's scalar string is a 0-d object array, "
        ".item() gives its bytes"
    ),
    "debugging": (
        "check with numpy.isfinite / torch.isfinite and raise "
        "feedline.errors.InvalidArgumentError (which ignore_errors drops)"
    ),
    "TypeSpec": "use feedline.TensorSpec: element specs are TensorSpec or structures of them",
    "RaggedTensor": (
        "use feedline.data.RaggedArray (values + row_splits), which ragged_batch makes and "
        "as_torch turns into a torch nested tensor"
    ),
    "SparseTensor": (
        "use feedline.data.SparseArray (indices, values, dense_shape), which sparse_batch makes "
        "and as_torch turns into a torch.sparse_coo_tensor"
    ),
    # Models, training and graphs.
    "Variable": "use torch.nn.Parameter (or a tensor with requires_grad=True)",
    "Module": "use torch.nn.Module",
    "GradientTape": (
        "use loss.backward() (torch.autograd); under strategy.scope() the gradients are summed "
        "across replicas"
    ),
    "function": (
        "drop the @tf.function decorator: feedline runs eagerly on PyTorch "
        "(torch.compile(fn) compiles a step where you want it)"
    ),
    "device": "use tensor.to(device); a strategy places each replica on its device",
    "keras": (
        "use torch.nn for layers, models and losses, torch.optim for optimizers, "
        "feedline.metrics for metrics, feedline.datasets for keras.datasets"
    ),
    "estimator": (
        "use a training loop with a feedline.distribute strategy (docs/custom_training.md)"
    ),
    "saved_model": "use torch.save or torch.export; feedline.train.Checkpoint for checkpoints",
    "summary": "use torch.utils.tensorboard.SummaryWriter",
    "experimental": "use feedline.data.Optional for tf.experimental.Optional",
    # tf.config.
    "config.experimental": (
        "use the stable names (feedline.config.list_physical_devices, ...); PyTorch allocates "
        "GPU memory as it needs it, so set_memory_growth has no counterpart"
    ),
    "config.set_visible_devices": "set CUDA_VISIBLE_DEVICES, or pass the devices to the strategy",
    # tf.compat.v1.
    "compat.v1.Session": "call the function directly: feedline runs eagerly",
    "compat.v1.placeholder": "pass the value as an argument: feedline runs eagerly",
    "compat.v1.colocate_with": "drop the colocation scope: replicas keep their own copies",
    # tf.data.experimental.
    "data.IteratorSpec": "use iterator.element_spec: feedline iterators are not values of a graph",
    "data.experimental.DatasetInitializer": (
        "build a Python dict from the dataset: feedline has no lookup tables (tf.lookup)"
    ),
    "data.experimental.index_table_from_dataset": (
        "use {key: i for i, key in enumerate(...)}: feedline has no lookup tables (tf.lookup)"
    ),
    "data.experimental.table_from_dataset": (
        "use dict((k.item(), v.item()) for k, v in dataset): feedline has no lookup tables"
    ),
    "data.experimental.from_variant": "pass the Dataset itself: feedline has no variant tensors",
    "data.experimental.to_variant": "pass the Dataset itself: feedline has no variant tensors",
    "data.experimental.get_model_proto": (
        "feedline's autotuner keeps no model proto; Options.autotune sets its budgets"
    ),
    "data.experimental.make_saveable_from_iterator": (
        "use iterator.get_state() / set_state(), or feedline.train.Checkpoint(iterator=it)"
    ),
    # tf.distribute.experimental.
    "distribute.experimental.CentralStorageStrategy": (
        "use feedline.distribute.MirroredStrategy: PyTorch keeps no central variable store"
    ),
    "distribute.experimental.TPUStrategy": "use feedline.distribute.MirroredStrategy (no TPUs)",
    # tf.distribute.
    "distribute.TPUStrategy": "use feedline.distribute.MirroredStrategy (no TPUs)",
    "distribute.HierarchicalCopyAllReduce": (
        "use feedline.distribute.ReductionToOneDevice(), or leave cross_device_ops out"
    ),
    "distribute.NcclAllReduce": (
        "leave cross_device_ops out: MultiWorkerMirroredStrategy uses NCCL on GPUs"
    ),
    # tf.nn.
    "nn.relu": "use torch.relu(x) or torch.nn.ReLU()",
    "nn.softmax": "use torch.softmax(x, dim=-1)",
    "nn.sigmoid": "use torch.sigmoid(x)",
    "nn.softmax_cross_entropy_with_logits": (
        "use torch.nn.functional.cross_entropy(logits, targets, reduction='none')"
    ),
    "nn.sparse_softmax_cross_entropy_with_logits": (
        "use torch.nn.functional.cross_entropy(logits, labels, reduction='none')"
    ),
    "nn.l2_loss": "use (x ** 2).sum() / 2",
    "nn.dropout": "use torch.nn.functional.dropout(x, p)",
}


def _tensorflow_path(module_name: str) -> str:
    """``feedline.data.experimental`` -> ``data.experimental``; ``feedline`` -> ``""``;
    ``feedline.service`` (TensorFlow's ``tf.data.experimental.service``) ->
    ``data.experimental.service``."""
    path = module_name.removeprefix("feedline").removeprefix(".")
    if path == "service" or path.startswith("service."):
        path = "data.experimental." + path
    return path


def missing_attribute(module_name: str, name: str, unavailable: bool = False) -> AttributeError:
    """The error for ``getattr(module, name)`` when ``module`` has no such name.

    A TensorFlow name from ``REPLACEMENTS`` says what to use instead; with ``unavailable``, any
    other name says that it is not available in this version; otherwise the message is Python's
    usual one.

    Example:
      >>> str(missing_attribute("feedline", "constant"))  # doctest: +ELLIPSIS
      "module 'feedline' has no attribute 'constant': feedline has no tf.constant; use torch...
    """
    key = ".".join(filter(None, (_tensorflow_path(module_name), name)))
    message = f"module {module_name!r} has no attribute {name!r}"
    if key in REPLACEMENTS:
        message += f": feedline has no tf.{key}; {REPLACEMENTS[key]} (see docs/porting.md)"
    elif unavailable:
        message += f": {name} is not available in this version of feedline"
    return AttributeError(message, name=name, obj=sys.modules.get(module_name))


def lazy_attributes(
    module_name: str, targets: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A module's ``__getattr__`` and ``__dir__`` for names resolved on first access.

    Args:
      module_name: the module's ``__name__``.
      targets: attribute name -> ``"package.module"`` (the module itself) or
        ``"package.module:name"`` (a name in it). A ``module:name`` target whose module lacks the
        name raises an ``AttributeError`` saying it is not available in this version.

    Returns:
      ``(__getattr__, __dir__)`` to assign at the module's top level. Resolved values are stored
      on the module, so each name is looked up once.
    """

    def __getattr__(name: str) -> Any:
        target = targets.get(name)
        if target is None:
            raise missing_attribute(module_name, name)
        path, _, attribute = target.partition(":")
        value: Any = importlib.import_module(path)
        if attribute:
            if not hasattr(value, attribute):
                raise missing_attribute(module_name, name, unavailable=True)
            value = getattr(value, attribute)
        setattr(sys.modules[module_name], name, value)
        return value

    def __dir__() -> list[str]:
        names = set(vars(sys.modules[module_name]))
        for name, target in targets.items():
            path, _, attribute = target.partition(":")
            loaded = sys.modules.get(path)
            if not attribute or loaded is None or hasattr(loaded, attribute):
                names.add(name)
        return sorted(names)

    return __getattr__, __dir__
