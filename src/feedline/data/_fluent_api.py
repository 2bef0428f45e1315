"""The declared fluent API of ``Dataset``: every method's signature and docstring.

``Dataset`` inherits these declarations, so type checkers and IDEs see ``Dataset.range``,
``ds.map``, ``ds.batch`` and the rest with their parameters and documentation. The bodies live
in ``feedline.data._fluent``, which imports the operations and attaches one implementation per
declared name to ``Dataset`` (taking the docstring from here); this module imports no
operation, so the base module ``feedline.data.dataset`` stays free of import cycles.
``tests/data/test_fluent.py`` checks that the declared and the attached methods agree.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

if TYPE_CHECKING:
    from feedline.data.dataset import Dataset
    from feedline.data.options import Options
    from feedline.data.torch_loader import FeedlineIterableDataset


def _not_attached(name: str) -> NoReturn:
    raise NotImplementedError(
        f"Dataset.{name} is declared here and attached by feedline.data._fluent, "
        "which importing feedline.data runs"
    )


class FluentAPI:
    """The fluent methods and static constructors of ``Dataset``, declared for type checkers."""

    # -- sources -------------------------------------------------------------------------------

    @staticmethod
    def range(
        *args: int, output_type: Any = None, name: str | None = None, dtype: Any = None
    ) -> Dataset:
        """The integers of ``range(start, stop, step)``, as int64 scalars.

        Args:
          *args: ``stop``, ``start, stop`` or ``start, stop, step``, as for Python's ``range``.
          output_type: the NumPy dtype of the elements (int64 by default), TensorFlow's keyword.
          name: accepted for TensorFlow compatibility; feedline names no operations.
          dtype: the same as ``output_type`` (``output_type`` wins where both are given).

        Returns:
          A random-access source dataset.

        Example:
          >>> from feedline.data import Dataset
          >>> [x.tolist() for x in Dataset.range(1, 7, 2)]
          [1, 3, 5]
        """
        _not_attached("range")

    @staticmethod
    def from_tensors(tensors: Any, *, name: str | None = None) -> Dataset:
        """A dataset of one element, ``tensors`` (a nested structure of arrays).

        Example:
          >>> from feedline.data import Dataset
          >>> [x.tolist() for x in Dataset.from_tensors([1, 2, 3])]
          [[1, 2, 3]]
        """
        _not_attached("from_tensors")

    @staticmethod
    def from_tensor_slices(tensors: Any, *, name: str | None = None) -> Dataset:
        """The rows of ``tensors`` (a nested structure of arrays) along their first dimension.

        Example:
          >>> from feedline.data import Dataset
          >>> [(x.tolist(), y.tolist()) for x, y in Dataset.from_tensor_slices(([1, 2], [3, 4]))]
          [(1, 3), (2, 4)]
        """
        _not_attached("from_tensor_slices")

    @staticmethod
    def from_generator(
        generator: Callable[..., Any],
        output_types: Any = None,
        output_shapes: Any = None,
        args: Sequence[Any] | None = None,
        output_signature: Any = None,
        *,
        name: str | None = None,
    ) -> Dataset:
        """The elements of ``generator(*args)``, converted to ``output_signature``.

        Args:
          generator: a callable that returns an iterable; called once per pass.
          output_types: the dtypes of the elements (tf.data's older form; with
            ``output_shapes`` or alone, then every component has unknown rank).
          output_shapes: the shapes that go with ``output_types``.
          args: the arguments ``generator`` is called with.
          output_signature: a structure of ``TensorSpec`` the elements must fit.

        Example:
          >>> import numpy as np
          >>> from feedline.data import Dataset, TensorSpec
          >>> spec = TensorSpec((), np.int32)
          >>> ds = Dataset.from_generator(lambda: iter([1, 2]), output_signature=spec)
          >>> [x.tolist() for x in ds]
          [1, 2]
        """
        _not_attached("from_generator")

    @staticmethod
    def from_torch(dataset: Any, output_signature: Any = None) -> Dataset:
        """The items of a PyTorch dataset, as NumPy elements.

        A map-style dataset (``__len__`` and ``__getitem__``) becomes a random-access source, an
        ``IterableDataset`` a stream; see ``feedline.data.ops.from_torch`` for the details.

        Args:
          dataset: a ``torch.utils.data.Dataset`` or ``IterableDataset``.
          output_signature: the ``TensorSpec`` structure of the items, where the first item
            should not be read to learn it.
        """
        _not_attached("from_torch")

    @staticmethod
    def list_files(
        file_pattern: str | Sequence[str],
        shuffle: bool | None = None,
        seed: int | None = None,
        *,
        name: str | None = None,
    ) -> Dataset:
        """The names of the files matching ``file_pattern``, as ``bytes`` scalars.

        Args:
          file_pattern: a glob pattern or a list of them.
          shuffle: whether to shuffle the names on every pass (True when None).
          seed: makes the shuffles reproducible.
        """
        _not_attached("list_files")

    @staticmethod
    def zip(*args: Any, datasets: Any = None, name: str | None = None) -> Dataset:
        """Elements of several datasets side by side, until the shortest ends.

        ``Dataset.zip(a, b)``, ``Dataset.zip((a, b))`` and ``Dataset.zip(datasets={"x": a})`` all
        work; the elements have the structure of the datasets given.

        Example:
          >>> from feedline.data import Dataset
          >>> ds = Dataset.zip(Dataset.range(3), Dataset.range(5, 7))
          >>> [(a.tolist(), b.tolist()) for a, b in ds]
          [(0, 5), (1, 6)]
        """
        _not_attached("zip")

    @staticmethod
    def sample_from_datasets(
        datasets: Sequence[Dataset],
        weights: Sequence[float] | Dataset | None = None,
        seed: int | None = None,
        stop_on_empty_dataset: bool = False,
        rerandomize_each_iteration: bool | None = None,
    ) -> Dataset:
        """Elements drawn at random from ``datasets`` with probabilities ``weights``.

        Args:
          datasets: the datasets to draw from, all of the same element structure.
          weights: a probability per dataset (uniform when None), or a dataset of such lists.
          seed: makes the draws reproducible.
          stop_on_empty_dataset: end when the picked dataset is empty, instead of drawing
            from the others.
          rerandomize_each_iteration: draw another sequence on every pass (with a seed).

        Example:
          >>> from feedline.data import Dataset
          >>> ds = Dataset.sample_from_datasets([Dataset.range(3), Dataset.range(10, 13)], seed=1)
          >>> sorted(x.tolist() for x in ds)
          [0, 1, 2, 10, 11, 12]
        """
        _not_attached("sample_from_datasets")

    @staticmethod
    def choose_from_datasets(
        datasets: Sequence[Dataset], choice_dataset: Dataset, stop_on_empty_dataset: bool = True
    ) -> Dataset:
        """Elements taken from ``datasets[i]`` for each ``i`` that ``choice_dataset`` yields.

        Args:
          datasets: the datasets to take from, all of the same element structure.
          choice_dataset: a dataset of int64 scalars, indices into ``datasets``.
          stop_on_empty_dataset: end when the chosen dataset is empty, instead of skipping it.

        Example:
          >>> from feedline.data import Dataset
          >>> choices = Dataset.from_tensor_slices([0, 1, 0])
          >>> ds = Dataset.choose_from_datasets([Dataset.range(3), Dataset.range(10, 13)], choices)
          >>> [x.tolist() for x in ds]
          [0, 10, 1]
        """
        _not_attached("choose_from_datasets")

    @staticmethod
    def counter(
        start: Any = 0, step: Any = 1, dtype: Any = np.int64, name: str | None = None
    ) -> Dataset:
        """``start``, ``start + step``, ``start + 2 * step``, ... forever, as ``dtype`` scalars.

        Each value is the previous one plus ``step`` in ``dtype`` (an integer counter wraps
        around at the end of its dtype's range, as TensorFlow's does). The cardinality is
        ``INFINITE_CARDINALITY``; the iterator's state is the next value.

        Args:
          start: the first value.
          step: what each value adds to the previous one (may be negative).
          dtype: an integer or floating-point NumPy dtype (int64 by default, as TensorFlow's).
          name: accepted for TensorFlow compatibility; feedline names no operations.

        Raises:
          TypeError: ``dtype`` is not numeric, or ``start``/``step`` do not fit it (a float for
            an integer dtype).

        Example:
          >>> from feedline.data import Dataset
          >>> [x.tolist() for x in Dataset.counter(start=10, step=-1).take(5)]
          [10, 9, 8, 7, 6]
        """
        _not_attached("counter")

    @staticmethod
    def random(
        seed: int | None = None,
        rerandomize_each_iteration: bool | None = None,
        name: str | None = None,
    ) -> Dataset:
        """Pseudorandom int64 scalars, uniform over the whole int64 range, forever.

        With a ``seed`` the sequence is reproducible; without one it is random but fixed for
        this dataset. Every pass (each ``iter``, each ``repeat`` epoch) yields the same sequence
        unless ``rerandomize_each_iteration`` is True, where each pass yields another one. The
        values are NumPy PCG64 outputs, so they differ from TensorFlow's for the same seed. The
        iterator's state is the generator's, restored exactly.

        Args:
          seed: makes the sequence reproducible.
          rerandomize_each_iteration: another sequence on every pass (False when None).
          name: accepted for TensorFlow compatibility; feedline names no operations.

        Example:
          >>> from feedline.data import Dataset
          >>> ds = Dataset.random(seed=4).take(10)
          >>> [x.tolist() for x in ds] == [x.tolist() for x in ds]
          True
          >>> ds = Dataset.random(seed=4, rerandomize_each_iteration=True).take(10)
          >>> [x.tolist() for x in ds] == [x.tolist() for x in ds]
          False
        """
        _not_attached("random")

    # -- transformations -----------------------------------------------------------------------

    def map(
        self,
        map_func: Callable[..., Any],
        num_parallel_calls: int | None = None,
        deterministic: bool | None = None,
        synchronous: bool | None = None,
        use_unbounded_threadpool: bool = False,
        *,
        use_processes: bool = False,
        name: str | None = None,
    ) -> Dataset:
        """``map_func`` applied to every element (a tuple element is passed as arguments).

        Args:
          map_func: the function; it returns the new element.
          num_parallel_calls: how many elements to map at once on background threads (or
            processes), ``AUTOTUNE`` to let feedline choose; None maps in the caller's thread.
          deterministic: whether the output keeps the input's order when mapping in parallel
            (None: the dataset's ``Options.deterministic``).
          synchronous: TensorFlow's promise of no parallelism and no buffering, which a map
            without ``num_parallel_calls`` keeps anyway; True with ``num_parallel_calls`` is a
            ``ValueError``, as in TensorFlow.
          use_unbounded_threadpool: accepted (TensorFlow's thread pool for I/O-bound
            functions); ``num_parallel_calls`` sets the threads here.
          use_processes: map in spawned worker processes instead of threads.

        Example:
          >>> from feedline.data import Dataset
          >>> [x.tolist() for x in Dataset.range(3).map(lambda x: x * 10)]
          [0, 10, 20]
        """
        _not_attached("map")

    def filter(self, predicate: Callable[..., Any], *, name: str | None = None) -> Dataset:
        """The elements for which ``predicate`` returns True.

        Example:
          >>> from feedline.data import Dataset
          >>> [x.tolist() for x in Dataset.range(6).filter(lambda x: x % 2 == 0)]
          [0, 2, 4]
        """
        _not_attached("filter")

    def flat_map(self, map_func: Callable[..., Dataset], *, name: str | None = None) -> Dataset:
        """The elements of the datasets that ``map_func`` returns, one dataset after another.

        Example:
          >>> from feedline.data import Dataset
          >>> [x.tolist() for x in Dataset.range(1, 3).flat_map(Dataset.range)]
          [0, 0, 1]
        """
        _not_attached("flat_map")

    def interleave(
        self,
        map_func: Callable[..., Dataset],
        cycle_length: int | None = None,
        block_length: int | None = None,
        num_parallel_calls: int | None = None,
        deterministic: bool | None = None,
        *,
        name: str | None = None,
    ) -> Dataset:
        """The datasets ``map_func`` makes, ``cycle_length`` open at a time, read in turns.

        Args:
          map_func: makes a dataset from an element.
          cycle_length: how many of those datasets are open at once.
          block_length: how many elements each open dataset gives in its turn (1 when None).
          num_parallel_calls: read the open datasets ahead on background threads.
          deterministic: whether the order stays the same as without parallel reads.

        Example:
          >>> from feedline.data import Dataset
          >>> ds = Dataset.range(2).interleave(lambda x: Dataset.range(3).map(lambda y: 10 * x + y))
          >>> [x.tolist() for x in ds]
          [0, 10, 1, 11, 2, 12]
        """
        _not_attached("interleave")

    def batch(
        self,
        batch_size: int,
        drop_remainder: bool = False,
        num_parallel_calls: int | None = None,
        deterministic: bool | None = None,
        *,
        name: str | None = None,
    ) -> Dataset:
        """Consecutive elements stacked in batches of ``batch_size``.

        Args:
          batch_size: the number of elements per batch.
          drop_remainder: drop the last batch where it is smaller.
          num_parallel_calls: stack batches ahead on background threads.
          deterministic: whether parallel batching keeps the order.

        Example:
          >>> from feedline.data import Dataset
          >>> [b.tolist() for b in Dataset.range(5).batch(2)]
          [[0, 1], [2, 3], [4]]
        """
        _not_attached("batch")

    def padded_batch(
        self,
        batch_size: int,
        padded_shapes: Any = None,
        padding_values: Any = None,
        drop_remainder: bool = False,
        *,
        name: str | None = None,
    ) -> Dataset:
        """Batches of elements padded to a common shape.

        Args:
          batch_size: the number of elements per batch.
          padded_shapes: the shape to pad each component to (None or -1 dimensions: the longest
            in the batch); None pads every dimension to the longest.
          padding_values: the value to pad each component with (0, or ``b""`` for strings).
          drop_remainder: drop the last batch where it is smaller.

        Example:
          >>> import numpy as np
          >>> from feedline.data import Dataset, TensorSpec
          >>> rows = lambda: iter([[1], [2, 3]])
          >>> ds = Dataset.from_generator(rows, output_signature=TensorSpec((None,), np.int64))
          >>> [b.tolist() for b in ds.padded_batch(2)]
          [[[1, 0], [2, 3]]]
        """
        _not_attached("padded_batch")

    def ragged_batch(
        self,
        batch_size: int,
        drop_remainder: bool = False,
        row_splits_dtype: Any = np.int64,
        name: str | None = None,
    ) -> Dataset:
        """Batches in which components of varying shape become ``RaggedArray`` values.

        A component whose shape is fully known in ``element_spec`` is stacked as ``batch``
        stacks it; one with unknown dimensions becomes a ``RaggedArray`` ragged up to its last
        unknown dimension; a ``RaggedArray`` or ``SparseArray`` component gains a dimension.

        Args:
          batch_size: the number of elements per batch.
          drop_remainder: drop the last batch where it is smaller.
          row_splits_dtype: the dtype of the new row splits, int64 or int32.
          name: unused; accepted for compatibility with tf.data.

        Example:
          >>> import numpy as np
          >>> from feedline.data import Dataset
          >>> ds = Dataset.range(6).map(lambda x: np.arange(x)).ragged_batch(2)
          >>> [b.to_list() for b in ds]
          [[[], [0]], [[0, 1], [0, 1, 2]], [[0, 1, 2, 3], [0, 1, 2, 3, 4]]]
        """
        _not_attached("ragged_batch")

    def sparse_batch(self, batch_size: int, row_shape: Any, name: str | None = None) -> Dataset:
        """Batches of dense elements, each batch one ``SparseArray`` of every element's values.

        Args:
          batch_size: the number of elements per batch.
          row_shape: the dense shape of one row (element); None or -1 for a dimension takes
            the batch's largest. Elements must have its rank and be no larger.
          name: unused; accepted for compatibility with tf.data.

        Example:
          >>> from feedline.data import Dataset, TensorSpec
          >>> rows = [[b"a", b"b", b"c"], [b"a", b"b"], [b"a", b"b", b"c", b"d"]]
          >>> ds = Dataset.from_generator(lambda: iter(rows), output_signature=TensorSpec(
          ...     [None], bytes)).sparse_batch(2, row_shape=[6])
          >>> [(b.indices.tolist(), b.dense_shape.tolist()) for b in ds][1]
          ([[0, 0], [0, 1], [0, 2], [0, 3]], [1, 6])
        """
        _not_attached("sparse_batch")

    def unbatch(self, *, name: str | None = None) -> Dataset:
        """Every element split along its first dimension.

        Example:
          >>> from feedline.data import Dataset
          >>> [x.tolist() for x in Dataset.range(4).batch(3).unbatch()]
          [0, 1, 2, 3]
        """
        _not_attached("unbatch")

    def rebatch(
        self,
        batch_size: int | Sequence[int],
        drop_remainder: bool = False,
        *,
        name: str | None = None,
    ) -> Dataset:
        """The rows of batched elements regrouped into batches of ``batch_size``.

        Args:
          batch_size: the new batch size, or a list of sizes used in turn.
          drop_remainder: drop the last batch where it is smaller.

        Example:
          >>> from feedline.data import Dataset
          >>> [b.tolist() for b in Dataset.range(6).batch(4).rebatch([1, 2])]
          [[0], [1, 2], [3], [4, 5]]
        """
        _not_attached("rebatch")

    def shuffle(
        self,
        buffer_size: int,
        seed: int | None = None,
        reshuffle_each_iteration: bool | None = None,
        *,
        name: str | None = None,
    ) -> Dataset:
        """The elements in random order, drawn from a buffer of ``buffer_size``.

        Args:
          buffer_size: the number of elements to draw from; at least the dataset's size for a
            uniform permutation.
          seed: makes the order reproducible.
          reshuffle_each_iteration: another order on every pass (True when None).

        Example:
          >>> from feedline.data import Dataset
          >>> sorted(x.tolist() for x in Dataset.range(5).shuffle(5, seed=0))
          [0, 1, 2, 3, 4]
        """
        _not_attached("shuffle")

    def repeat(self, count: int | None = None, *, name: str | None = None) -> Dataset:
        """The dataset ``count`` times, each a new pass (forever with None or -1).

        Example:
          >>> from feedline.data import Dataset
          >>> [x.tolist() for x in Dataset.range(2).repeat(2)]
          [0, 1, 0, 1]
        """
        _not_attached("repeat")

    def take(self, count: int, *, name: str | None = None) -> Dataset:
        """At most the first ``count`` elements (-1: all).

        Example:
          >>> from feedline.data import Dataset
          >>> [x.tolist() for x in Dataset.range(5).take(2)]
          [0, 1]
        """
        _not_attached("take")

    def take_while(self, predicate: Callable[..., Any], name: str | None = None) -> Dataset:
        """The elements up to (not including) the first for which ``predicate`` is False.

        A tuple element is unpacked into the predicate's arguments; it must return a scalar
        bool. The cardinality is UNKNOWN_CARDINALITY (0 where the input is empty).

        Args:
          predicate: maps an element to a scalar bool.
          name: accepted for TensorFlow compatibility; feedline names no operations.

        Example:
          >>> from feedline.data import Dataset
          >>> [x.tolist() for x in Dataset.range(10).take_while(lambda x: x < 5)]
          [0, 1, 2, 3, 4]
        """
        _not_attached("take_while")

    def skip(self, count: int, *, name: str | None = None) -> Dataset:
        """All but the first ``count`` elements (-1: none).

        Example:
          >>> from feedline.data import Dataset
          >>> [x.tolist() for x in Dataset.range(5).skip(3)]
          [3, 4]
        """
        _not_attached("skip")

    def shard(self, num_shards: int, index: int, *, name: str | None = None) -> Dataset:
        """Elements ``index``, ``index + num_shards``, ``index + 2 * num_shards``, ...

        Example:
          >>> from feedline.data import Dataset
          >>> [x.tolist() for x in Dataset.range(7).shard(3, 1)]
          [1, 4]
        """
        _not_attached("shard")

    def enumerate(self, start: int = 0, *, name: str | None = None) -> Dataset:
        """``(i, element)`` pairs, ``i`` an int64 counting from ``start``.

        Example:
          >>> from feedline.data import Dataset
          >>> [(i.tolist(), x.tolist()) for i, x in Dataset.range(5, 7).enumerate()]
          [(0, 5), (1, 6)]
        """
        _not_attached("enumerate")

    def scan(
        self, initial_state: Any, scan_func: Callable[..., Any], name: str | None = None
    ) -> Dataset:
        """The outputs of ``scan_func`` carried over the elements with a state.

        ``scan_func(state, element)`` returns ``(new_state, output_element)``; the state starts
        as ``initial_state`` and the new state must keep its structure and dtypes (a TypeError
        otherwise). The state is saved with the iterator's checkpoint. The cardinality is the
        input's.

        Args:
          initial_state: a nested structure of arrays (or scalars), the first state.
          scan_func: maps ``(state, element)`` to ``(new_state, output_element)``.
          name: accepted for TensorFlow compatibility; feedline names no operations.

        Example:
          >>> import numpy as np
          >>> from feedline.data import Dataset
          >>> [x.tolist() for x in Dataset.range(10).scan(np.int64(0), lambda s, i: (s + i, s))]
          [0, 0, 1, 3, 6, 10, 15, 21, 28, 36]
        """
        _not_attached("scan")

    def unique(self, name: str | None = None) -> Dataset:
        """Each distinct element once, in the order of its first appearance.

        The elements must be scalars of int32, int64 or string type (a TypeError otherwise, as
        in TensorFlow). The elements seen are saved with the iterator's checkpoint; the
        cardinality is UNKNOWN_CARDINALITY (0 where the input is empty).

        Args:
          name: accepted for TensorFlow compatibility; feedline names no operations.

        Example:
          >>> from feedline.data import Dataset
          >>> ds = Dataset.from_tensor_slices([1, 37, 2, 37, 2, 1]).unique()
          >>> [x.tolist() for x in ds]
          [1, 37, 2]
        """
        _not_attached("unique")

    def reduce(
        self, initial_state: Any, reduce_func: Callable[..., Any], name: str | None = None
    ) -> Any:
        """The elements folded into one state: ``reduce_func(state, element) -> new_state``.

        A terminal method: it runs the dataset and returns the final state (the initial state
        for an empty dataset). The new state must keep the initial state's structure and dtypes
        (a TypeError otherwise).

        Args:
          initial_state: a nested structure of arrays (or scalars), the first state.
          reduce_func: maps ``(state, element)`` to the new state.
          name: accepted for TensorFlow compatibility; feedline names no operations.

        Example:
          >>> import numpy as np
          >>> from feedline.data import Dataset
          >>> Dataset.range(5).reduce(np.int64(0), lambda x, y: x + y).tolist()
          10
        """
        _not_attached("reduce")

    def get_single_element(self, name: str | None = None) -> Any:
        """The one element of the dataset (a terminal method).

        An InvalidArgumentError if the dataset has no element ("Dataset was empty.") or more
        than one ("Dataset had more than one element."), as in TensorFlow.

        Args:
          name: accepted for TensorFlow compatibility; feedline names no operations.

        Example:
          >>> from feedline.data import Dataset
          >>> Dataset.from_tensors([1, 2]).get_single_element().tolist()
          [1, 2]
        """
        _not_attached("get_single_element")

    def prefetch(self, buffer_size: int, *, name: str | None = None) -> Dataset:
        """Elements produced ahead on a background thread, up to ``buffer_size`` of them.

        ``AUTOTUNE`` sizes the buffer as the consumer needs; 0 prefetches nothing.

        Example:
          >>> from feedline.data import AUTOTUNE, Dataset
          >>> [x.tolist() for x in Dataset.range(3).prefetch(AUTOTUNE)]
          [0, 1, 2]
        """
        _not_attached("prefetch")

    def cache(self, filename: str = "", *, name: str | None = None) -> Dataset:
        """The elements of the first complete pass, kept for later passes.

        Args:
          filename: where to keep them: ``""`` in memory, otherwise files with this prefix.

        Example:
          >>> from feedline.data import Dataset
          >>> ds = Dataset.range(3).shuffle(3).cache()
          >>> [x.tolist() for x in ds] == [x.tolist() for x in ds]
          True
        """
        _not_attached("cache")

    def concatenate(self, dataset: Dataset, *, name: str | None = None) -> Dataset:
        """This dataset's elements, then those of ``dataset`` (of the same structure).

        Example:
          >>> from feedline.data import Dataset
          >>> [x.tolist() for x in Dataset.range(2).concatenate(Dataset.range(5, 7))]
          [0, 1, 5, 6]
        """
        _not_attached("concatenate")

    def ignore_errors(self, log_warning: bool = False, *, name: str | None = None) -> Dataset:
        """The elements whose production raised no error; the others are dropped. Errors of
        the code rather than of an element (``NameError``, ``AttributeError``, ``ImportError``,
        ``SyntaxError``) are raised, as TensorFlow raises them when it traces the function.

        Args:
          log_warning: log every dropped element's error as a warning.
        """
        _not_attached("ignore_errors")

    def with_options(self, options: Options, *, name: str | None = None) -> Dataset:
        """The same dataset with ``options`` merged over its current ones.

        Example:
          >>> from feedline.data import Dataset, Options
          >>> options = Options()
          >>> options.deterministic = False
          >>> Dataset.range(2).with_options(options).options().deterministic
          False
        """
        _not_attached("with_options")

    def apply(self, transformation_func: Callable[[Dataset], Dataset]) -> Dataset:
        """``transformation_func(self)``: for transformations packaged as functions.

        Raises:
          TypeError: ``transformation_func`` did not return a ``Dataset``.

        Example:
          >>> from feedline.data import Dataset
          >>> [x.tolist() for x in Dataset.range(4).apply(lambda ds: ds.skip(2))]
          [2, 3]
        """
        _not_attached("apply")

    def window(
        self,
        size: int,
        shift: int | None = None,
        stride: int = 1,
        drop_remainder: bool = False,
        name: str | None = None,
    ) -> Dataset:
        """Windows of consecutive elements, each window a finite ``Dataset``.

        Window ``k`` starts at element ``k * shift`` (``shift`` defaults to ``size``) and holds
        ``size`` elements ``stride`` apart, fewer at the end of the input unless
        ``drop_remainder``. An element that is a structure gives the same structure of windows
        (a tuple of datasets, a dict of datasets). ``flat_map`` turns windows into tensors;
        ``ds.window(n, shift=1).flat_map(lambda w: w.batch(n))`` is cut from stacked rows by
        NumPy, without a dataset per window. The iterator's state holds the open window.

        Args:
          size: the number of elements of a window, >= 1.
          shift: the number of elements between the starts of two windows, >= 1.
          stride: the distance between the elements of a window, >= 1.
          drop_remainder: drop the windows that the end of the input leaves shorter.
          name: accepted for TensorFlow compatibility; feedline names no operations.

        Raises:
          InvalidArgumentError: ``size``, ``shift`` or ``stride`` is not an int >= 1.

        Example:
          >>> from feedline.data import Dataset
          >>> [[x.tolist() for x in w] for w in Dataset.range(7).window(3)]
          [[0, 1, 2], [3, 4, 5], [6]]
          >>> ds = Dataset.range(7).window(3, shift=1, drop_remainder=True)
          >>> [b.tolist() for b in ds.flat_map(lambda w: w.batch(3))]
          [[0, 1, 2], [1, 2, 3], [2, 3, 4], [3, 4, 5], [4, 5, 6]]
        """
        _not_attached("window")

    def group_by_window(
        self,
        key_func: Callable[..., Any],
        reduce_func: Callable[..., Dataset],
        window_size: int | None = None,
        window_size_func: Callable[..., Any] | None = None,
        name: str | None = None,
    ) -> Dataset:
        """Groups elements by key and reduces each window of a key to a dataset.

        ``key_func`` maps an element to a scalar int64 key (a Python int is accepted, other
        dtypes are a ValueError, as in TensorFlow). Once ``window_size`` (or
        ``window_size_func(key)``) elements of a key are gathered, ``reduce_func(key, window)``
        is called with them as a dataset and its elements are output. At the end of the input
        the windows left, possibly shorter, are reduced in increasing key order. Open windows
        are part of the iterator's state. Where ``reduce_func`` returns the window batched or
        padded-batched, windows are batched directly (it is called once per key to learn so).

        Args:
          key_func: maps an element to a scalar int64.
          reduce_func: maps ``(key, window_dataset)`` to a Dataset.
          window_size: the number of elements of a window; or give ``window_size_func``.
          window_size_func: maps a key to its window size (a scalar int64).
          name: accepted for TensorFlow compatibility; feedline names no operations.

        Raises:
          ValueError: neither or both of ``window_size`` and ``window_size_func`` are given,
            or ``key_func`` returns no scalar int64.
          TypeError: ``reduce_func`` does not return a Dataset.

        Example:
          >>> from feedline.data import Dataset
          >>> ds = Dataset.range(10).group_by_window(
          ...     key_func=lambda x: x % 2,
          ...     reduce_func=lambda key, window: window.batch(5),
          ...     window_size=5,
          ... )
          >>> [b.tolist() for b in ds]
          [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]]
        """
        _not_attached("group_by_window")

    def bucket_by_sequence_length(
        self,
        element_length_func: Callable[..., Any],
        bucket_boundaries: Sequence[int],
        bucket_batch_sizes: Sequence[int],
        padded_shapes: Any = None,
        padding_values: Any = None,
        pad_to_bucket_boundary: bool = False,
        no_padding: bool = False,
        drop_remainder: bool = False,
        name: str | None = None,
    ) -> Dataset:
        """Batches elements with others of similar length, padded to a common shape.

        The buckets are ``[-inf, b0), [b0, b1), ..., [b_last, inf)`` for the boundaries ``b``;
        an element goes to the bucket of ``element_length_func(element)`` and each bucket is
        batched by its own size in ``bucket_batch_sizes`` with ``padded_batch`` (``batch`` with
        ``no_padding``). Built on ``group_by_window``, as in TensorFlow: at the end of the
        input the partial batches come in bucket order.

        Args:
          element_length_func: maps an element to its length (an int).
          bucket_boundaries: the upper length boundaries of the buckets.
          bucket_batch_sizes: the batch size of each bucket, ``len(bucket_boundaries) + 1``.
          padded_shapes: as for ``padded_batch``; the elements' shapes by default.
          padding_values: as for ``padded_batch``; 0 by default.
          pad_to_bucket_boundary: pad unknown dimensions to the bucket's boundary minus 1
            rather than the batch's longest (every length must then be below the last
            boundary, else an InvalidArgumentError).
          no_padding: batch without padding (the elements of a bucket have one shape).
          drop_remainder: drop batches shorter than their bucket's batch size.
          name: accepted for TensorFlow compatibility; feedline names no operations.

        Raises:
          ValueError: ``len(bucket_batch_sizes) != len(bucket_boundaries) + 1``.

        Example:
          >>> import numpy as np
          >>> from feedline.data import Dataset, TensorSpec
          >>> elements = [[0], [1, 2, 3, 4], [5, 6, 7], [7, 8, 9, 10, 11],
          ...             [13, 14, 15, 16, 19, 20], [21, 22]]
          >>> ds = Dataset.from_generator(
          ...     lambda: iter(elements), output_signature=TensorSpec([None], np.int64)
          ... ).bucket_by_sequence_length(
          ...     element_length_func=lambda elem: elem.shape[0],
          ...     bucket_boundaries=[3, 5],
          ...     bucket_batch_sizes=[2, 2, 2],
          ... )
          >>> for batch in ds:
          ...     print(batch.tolist())
          [[1, 2, 3, 4], [5, 6, 7, 0]]
          [[7, 8, 9, 10, 11, 0], [13, 14, 15, 16, 19, 20]]
          [[0, 0], [21, 22]]
        """
        _not_attached("bucket_by_sequence_length")

    def as_torch(self, device: Any = None) -> FeedlineIterableDataset:
        """This dataset as a ``torch.utils.data.IterableDataset`` of torch tensors.

        The tensors share memory with the NumPy elements; the result has ``state_dict`` and
        ``load_state_dict``, for a plain loop or ``DataLoader(ds.as_torch(), batch_size=None)``.
        With ``device`` (``"cuda:0"``, ``"/gpu:0"``) they arrive on that device, copied one
        batch ahead through reusable pinned buffers on a copy stream of the device's own (as
        ``feedline.data.experimental.prefetch_to_device``). See ``feedline.data.torch_loader``.

        Example:
          >>> from feedline.data import Dataset
          >>> [b.tolist() for b in Dataset.range(3).batch(2).as_torch()]
          [[0, 1], [2]]
        """
        _not_attached("as_torch")

    def rejection_resample(
        self,
        class_func: Callable[..., Any],
        target_dist: Any,
        initial_dist: Any = None,
        seed: int | None = None,
        name: str | None = None,
    ) -> Dataset:
        """``(class, element)`` pairs, resampled so that the classes follow ``target_dist``.

        As in TensorFlow, elements are rejected, or repeated (it reads the input in two passes:
        one taken as it is, with the probability that keeps rejections fewest, and one whose
        elements it accepts with a probability per class), so the output may be longer than
        the input. It ends where the pass it draws from ends. Without ``initial_dist`` the
        input's class distribution is estimated online (class counts starting at 10 each).
        The result is ``(class_func(element), element)``; drop the class with
        ``.map(lambda class_func_result, data: data)``.

        Args:
          class_func: maps an element (a tuple is unpacked into arguments) to a scalar int in
            ``[0, num_classes)``.
          target_dist: the wanted class distribution, ``num_classes`` floats (normalised).
          initial_dist: the input's class distribution, if known (normalised).
          seed: makes the draws reproducible; every pass draws the same.
          name: accepted for TensorFlow compatibility; feedline names no operations.

        Raises:
          InvalidArgumentError: a distribution that is not a vector of ``num_classes``
            non-negative numbers, or (while iterating) a class outside ``[0, num_classes)``.
          TypeError: ``class_func`` returns anything but a scalar int.

        Example:
          >>> import numpy as np
          >>> from feedline.data import Dataset
          >>> labels = np.array([0] * 90 + [1] * 10)
          >>> ds = Dataset.from_tensor_slices(labels).repeat()
          >>> ds = ds.rejection_resample(lambda x: x, [0.5, 0.5], [0.9, 0.1], seed=0)
          >>> ds = ds.map(lambda class_func_result, data: data).take(2000)
          >>> counts = np.bincount([int(x) for x in ds])
          >>> bool(abs(counts[1] / 2000 - 0.5) < 0.05)
          True
        """
        _not_attached("rejection_resample")

    def save(
        self,
        path: str,
        compression: str | None = None,
        shard_func: Callable[..., Any] | None = None,
        checkpoint_args: dict[str, Any] | None = None,
    ) -> None:
        """Writes every element to the directory ``path``, for ``Dataset.load`` to read.

        The elements go to shard files in checksummed chunks, and a ``DONE`` file is written
        last: a save that stops early leaves nothing that ``load`` accepts. Saving to a path
        that holds a snapshot replaces it. The format is described in docs/snapshot_format.md.

        Args:
          path: the directory to write (made where missing).
          compression: None or "NONE", "GZIP", "LZ4", or "SNAPPY" (needs python-snappy).
          shard_func: ``shard_func(element)`` returns the element's shard, a non-negative int64
            scalar. By default the elements are dealt round-robin over as many shards as the
            CPU budget, and ``load`` reads them back in order.
          checkpoint_args: TensorFlow's ``CheckpointManager`` arguments, to make a long save
            resumable: ``directory`` (required) keeps the progress, and every
            ``checkpoint_interval`` elements (default 1024) the progress is written there; a
            save of the same path that finds it resumes from it. ``max_to_keep``,
            ``step_counter`` and TensorFlow's other manager arguments are accepted and
            unused (feedline keeps the newest progress only).

        Example:
          >>> import tempfile
          >>> from feedline.data import Dataset
          >>> path = tempfile.mkdtemp()
          >>> Dataset.range(4).save(path)
          >>> [int(x) for x in Dataset.load(path)]
          [0, 1, 2, 3]
        """
        _not_attached("save")

    @staticmethod
    def load(
        path: str,
        element_spec: Any = None,
        compression: str | None = None,
        reader_func: Callable[[Dataset], Dataset] | None = None,
        wait: bool = False,
    ) -> Dataset:
        """The dataset that ``Dataset.save`` (or a snapshot) wrote to ``path``.

        Args:
          path: the directory ``save`` wrote.
          element_spec: the elements' spec; by default the saved one. Where given, the saved
            elements must fit it (else InvalidArgumentError).
          compression: the compression the dataset was saved with; None reads whatever it was
            (each chunk records it), anything else must match.
          reader_func: ``reader_func(datasets)`` gets a dataset whose elements are the
            datasets of the shards and returns the dataset to read; by default they are
            interleaved, one element of each in turn, in parallel.
          wait: read a snapshot that ``distributed_save`` is still writing: the elements of
            each chunk as soon as it is committed, ending when the save is done (a finished
            distributed save is read the same way, so a position saved while it was written
            restores after); takes no ``reader_func`` while the save runs. A ``Dataset.save``
            still running is read once it finishes.

        Raises:
          NotFoundError: ``path`` holds no finished snapshot (and, with ``wait``, no
            ``distributed_save`` is writing one).
          DataLossError: when read, a chunk is missing, truncated or damaged.

        Example:
          >>> import tempfile
          >>> import numpy as np
          >>> from feedline.data import Dataset
          >>> path = tempfile.mkdtemp()
          >>> Dataset.range(6).save(path, shard_func=lambda x: x % 2)
          >>> ds = Dataset.load(path, reader_func=lambda datasets: datasets.flat_map(lambda d: d))
          >>> [int(x) for x in ds]
          [0, 2, 4, 1, 3, 5]
        """
        _not_attached("load")

    def snapshot(
        self,
        path: str,
        compression: str | None = "AUTO",
        reader_func: Callable[[Dataset], Dataset] | None = None,
        shard_func: Callable[..., Any] | None = None,
        name: str | None = None,
    ) -> Dataset:
        """The same elements, written to ``path`` on the first complete pass, read back after.

        The snapshot is kept in a subdirectory of ``path`` named by this dataset's
        ``fingerprint()``, so any pass, in any process, over the same pipeline reuses it, and
        another pipeline under the same ``path`` writes its own. A pass that stops before the
        end leaves no snapshot. See ``feedline.data.ops.snapshot``.

        Args:
          path: the directory of the snapshots.
          compression: "AUTO" (LZ4), "GZIP", "LZ4", "SNAPPY", or None / "NONE".
          reader_func: as ``load``'s, to read a finished snapshot.
          shard_func: as ``save``'s, to write one.
          name: unused (TensorFlow's op name).

        Example:
          >>> import tempfile
          >>> from feedline.data import Dataset
          >>> calls = []
          >>> ds = Dataset.range(3).map(lambda x: calls.append(int(x)) or x + 1)
          >>> ds = ds.snapshot(tempfile.mkdtemp())
          >>> [int(x) for x in ds], calls[-3:]
          ([1, 2, 3], [0, 1, 2])
          >>> calls.clear()
          >>> [int(x) for x in ds], calls
          ([1, 2, 3], [])
        """
        _not_attached("snapshot")

    def fingerprint(self) -> Any:
        """A uint64 fingerprint of this dataset's description.

        The same pipeline (operations, arguments, function code and the values functions
        capture) has the same fingerprint in any process of the same Python version; a
        different one, almost surely another. Iterating does not change it.

        Example:
          >>> from feedline.data import Dataset
          >>> a = Dataset.range(5).map(lambda x: x * 2)
          >>> b = Dataset.range(5).map(lambda x: x * 2)
          >>> bool(a.fingerprint() == b.fingerprint())
          True
          >>> bool(a.fingerprint() == Dataset.range(6).fingerprint())
          False
        """
        _not_attached("fingerprint")
