"""``Dataset.list_files``: the file names matching glob patterns, shuffled per pass by default."""

from __future__ import annotations

import os
import secrets
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from feedline.data.dataset import (
    Dataset,
    DatasetIterator,
    IteratorContext,
    ListedVersions,
    mix_seed,
)
from feedline.data.readers._files import (
    NoFilesMatchedError,
    decode_name,
    list_matches,
    string_array_items,
)
from feedline.errors import InvalidArgumentError
from feedline.structure import BYTES, TensorSpec, bytes_array, bytes_scalar


class ListFilesDataset(Dataset):
    """The files that match ``file_pattern``, as 0-d object arrays holding the names as ``bytes``.

    Args:
      file_pattern: a glob pattern (``*``, ``?``, ``[...]``; hidden files match too) or a list of
        them. The patterns are matched once, when the dataset is made; the names of all patterns
        are sorted together (a file matched by two patterns appears twice, as in tf.data).
      shuffle: whether every pass lists the files in a new random order (default True). With
        ``shuffle=False`` the names come sorted and the dataset is random-access.
      seed: makes the orders reproducible: the k-th pass has the same order on every worker and
        in every run, and each pass has a different one. Without a seed every pass draws a fresh
        order.

    Raises:
      NotFoundError: no file matches any of the patterns; it is also an
        ``InvalidArgumentError``, as TensorFlow raises there.

    As a file source, this dataset is marked ``_is_file_reader`` and exposes the sorted names as
    ``_filenames``; FILE auto-sharding splits them (see ``feedline.data.readers``).

    The listing also keeps each object's version (ETag, generation) on a store, and a reader of
    the pipeline that opens one of these objects reads that version or raises
    ``DataLossError`` (see ``IteratorContext.listed_versions``): every worker, and a split run
    again after a worker was lost, reads the objects as they were listed.

    Example:
      >>> import os, tempfile
      >>> d = tempfile.mkdtemp()
      >>> for name in ("b.txt", "a.txt", "c.csv"):
      ...     open(os.path.join(d, name), "w").close()
      >>> ds = ListFilesDataset(os.path.join(d, "*.txt"), shuffle=False)
      >>> [os.path.basename(f.item()) for f in ds]
      [b'a.txt', b'b.txt']
    """

    _is_file_reader = True

    def __init__(
        self,
        file_pattern: str | bytes | os.PathLike | Sequence[Any] | np.ndarray,
        shuffle: bool | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__()
        patterns = _patterns(file_pattern)
        names: list[str] = []
        versions = ListedVersions()
        sizes: list[int | None] = []
        for pattern in patterns:
            matches = list_matches(pattern, "list_files")
            names.extend(matches)
            for name, match in matches.items():
                sizes.append(match.size)
                if match.version is not None:
                    versions[name] = match.version
                    if match.size is not None:
                        versions.sizes[name] = match.size
        if not names:
            shown = patterns[0] if len(patterns) == 1 else patterns
            raise NoFilesMatchedError(
                f"list_files: no files matched pattern {shown!r}; check the directory and the "
                "wildcards (the patterns are matched when the dataset is made)",
                name=str(shown),
            )
        if seed is not None and (isinstance(seed, bool) or not hasattr(seed, "__index__")):
            raise InvalidArgumentError(f"list_files: seed must be an int or None, got {seed!r}")
        self._filenames = tuple(sorted(names))
        self._encoded = tuple(os.fsencode(name) for name in self._filenames)
        self._versions = versions
        if None not in sizes:  # every size known (unset otherwise: fingerprints as before)
            self._mean_bytes = sum(cast(list[int], sizes)) // len(sizes)
        self._shuffle = True if shuffle is None else bool(shuffle)
        self._seed = None if seed is None else int(seed)
        self._element_spec = TensorSpec((), BYTES)

    def _cardinality(self) -> int:
        return len(self._filenames)

    def _random_access(self) -> _NamesAccess | None:
        return None if self._shuffle else _NamesAccess(self._encoded)

    def _with_files(self, filenames: Sequence[str]) -> ListFilesDataset:
        """The same listing restricted to ``filenames`` (FILE auto-sharding)."""
        clone = ListFilesDataset.__new__(ListFilesDataset)
        Dataset.__init__(clone)
        clone._filenames = tuple(sorted(decode_name(n) for n in filenames))
        clone._encoded = tuple(os.fsencode(name) for name in clone._filenames)
        clone._versions = self._versions.only(clone._filenames)
        if self.mean_bytes is not None:
            clone._mean_bytes = self.mean_bytes
        clone._shuffle, clone._seed = self._shuffle, self._seed
        clone._element_spec = self._element_spec
        return clone

    @property
    def mean_bytes(self) -> int | None:
        """The mean size of the files in bytes, where the listing gave every file's size (an
        object store's); None otherwise (a local listing does not read sizes)."""
        mean: int | None = getattr(self, "_mean_bytes", None)
        return mean

    def pin_versions(self, ctx: IteratorContext) -> None:
        """Tells the readers of ``ctx``'s pipeline the versions this listing found, behind those
        the pipeline holds already (a split run again holds its first run's versions, which a
        listing made since does not replace): the listing's own map, not a copy, which a
        worker's split runs would otherwise make of every listed name once per split."""
        maps = ctx.listed_versions.maps
        if self._versions and not any(held is self._versions for held in maps):
            maps.append(self._versions)

    def pass_seed(self, ctx: IteratorContext) -> int:
        """The shuffle seed of one pass: fixed by ``seed`` and the pass, or fresh without one."""
        if self._seed is None:
            return secrets.randbits(63)
        return mix_seed(self._seed, ctx.seed)

    def _make_iterator(self, ctx: IteratorContext) -> _ListFilesIterator:
        return _ListFilesIterator(self, ctx)


def _patterns(file_pattern: Any) -> list[str]:
    if isinstance(file_pattern, np.ndarray | np.generic):
        return string_array_items(file_pattern, "list_files", "file_pattern")
    if isinstance(file_pattern, list | tuple):
        if not file_pattern:
            raise InvalidArgumentError("list_files: file_pattern is an empty list; give a pattern")
        return [decode_name(p) for p in file_pattern]
    return [decode_name(file_pattern)]


class _NamesAccess:
    def __init__(self, names: tuple[bytes, ...]) -> None:
        self._names = names

    def __len__(self) -> int:
        return len(self._names)

    def get(self, index: int) -> np.ndarray:
        return bytes_scalar(self._names[index])

    def gather(self, indices: np.ndarray | slice) -> np.ndarray:
        if isinstance(indices, slice):
            return bytes_array(self._names[indices])
        return bytes_array([self._names[int(i)] for i in indices])


class _ListFilesIterator(DatasetIterator):
    def __init__(self, dataset: ListFilesDataset, ctx: IteratorContext) -> None:
        super().__init__(dataset, ctx)
        dataset.pin_versions(ctx)
        self._names = dataset._encoded
        self._shuffle = dataset._shuffle
        self._reset(dataset.pass_seed(ctx) if self._shuffle else 0, 0)

    def _reset(self, seed: int, position: int) -> None:
        self._seed = seed
        if self._shuffle:
            order = np.random.default_rng(seed).permutation(len(self._names))
            self._order = [self._names[i] for i in order]
        else:
            self._order = list(self._names)
        self._position = position

    def _next(self) -> np.ndarray:
        position = self._position
        if position >= len(self._order):
            raise StopIteration
        self._position = position + 1
        return bytes_scalar(self._order[position])

    def _next_batch(self, n: int) -> np.ndarray:
        position = self._position
        if position >= len(self._order):
            raise StopIteration
        self._position = min(position + n, len(self._order))
        return bytes_array(self._order[position : self._position])

    def _get_state(self) -> dict[str, Any]:
        return {"seed": self._seed, "position": self._position}

    def _set_state(self, state: dict[str, Any]) -> None:
        self._reset(int(state["seed"]), int(state["position"]))
