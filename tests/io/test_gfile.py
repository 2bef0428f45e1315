"""Tests of feedline/io/gfile.py (and the file-system layer feedline/_fs.py) on local paths and
on fsspec's in-memory file system; the expected behaviour is TensorFlow 2.21's tf.io.gfile,
recorded by running it."""

from __future__ import annotations

import pathlib
import uuid
from collections.abc import Iterator
from typing import Any

import fsspec
import pytest

import feedline as tf
from feedline import _fs
from feedline.errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    UnimplementedError,
)
from feedline.io import gfile


@pytest.fixture(params=["local", "memory"])
def root(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Iterator[str]:
    """A directory holding ``a/f.txt`` ("hi\\n") and the empty directory ``a/b``."""
    if request.param == "local":
        base = str(tmp_path / "root")
    else:
        base = f"memory://gfile-test-{uuid.uuid4().hex}"
    gfile.makedirs(gfile.join(base, "a", "b"))
    with gfile.GFile(gfile.join(base, "a", "f.txt"), "w") as f:
        f.write("hi\n")
    yield base
    if request.param == "memory":
        fsspec.filesystem("memory").rm(base.removeprefix("memory://"), recursive=True)


def test_listdir_glob_exists_isdir(root: str) -> None:
    a = gfile.join(root, "a")
    assert gfile.listdir(a) == ["b", "f.txt"]
    assert gfile.glob(gfile.join(a, "*")) == [gfile.join(a, "b"), gfile.join(a, "f.txt")]
    assert gfile.glob(gfile.join(root, "zz*")) == []
    assert gfile.exists(a) and not gfile.exists(gfile.join(root, "nope"))
    assert (gfile.isdir(a), gfile.isdir(gfile.join(a, "f.txt"))) == (True, False)
    assert not gfile.isdir(gfile.join(root, "nope"))
    with pytest.raises(NotFoundError, match="could not find directory"):
        gfile.listdir(gfile.join(root, "nope"))


def test_glob_of_several_patterns_and_of_a_relative_one(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # TensorFlow: "the pattern can be a Python iterable of string patterns"; a relative pattern
    # gives relative paths ("For example, ['__init__.py']").
    (tmp_path / "sub").mkdir()
    for name in ("a.py", "b.txt", "c.py"):
        (tmp_path / "sub" / name).write_text(name)
    monkeypatch.chdir(tmp_path)
    assert gfile.glob("sub/*.py") == ["sub/a.py", "sub/c.py"]
    assert gfile.glob(iter(["sub/a.*", "sub/*.txt", "sub/a.py"])) == ["sub/a.py", "sub/b.txt"]
    assert gfile.glob(str(tmp_path / "sub" / "*.txt")) == [str(tmp_path / "sub" / "b.txt")]


def test_text_mode_is_the_bytes_decoded_as_tensorflow_reads_them(root: str) -> None:
    # No newline translation, lines end at \n only, byte offsets for seek and tell, and
    # str or bytes written in either mode.
    path = gfile.join(root, "crlf.txt")
    with gfile.GFile(path, "wb") as f:
        f.write(b"a\r\nb\rc\n")
        f.write("\u00e9\n")  # a str in binary mode: its UTF-8 bytes
    with gfile.GFile(path, "w+") as f:
        f.write(b"a\r\nb\rc\n\xc3\xa9\n")
    reader = gfile.GFile(path)
    assert reader.readlines() == ["a\r\n", "b\rc\n", "\u00e9\n"]
    reader.seek(-3, 2)  # 3 bytes before the end: the two of "é" and the newline
    assert reader.read() == "\u00e9\n" and reader.tell() == 10
    reader.seek(0)
    reader.seek(3, 1)
    assert reader.read(2) == "b\r"
    assert gfile.GFile(path, "rb").read() == b"a\r\nb\rc\n\xc3\xa9\n"


def test_reading_and_writing_files(root: str) -> None:
    path = gfile.join(root, "a", "f.txt")
    assert gfile.GFile(path).read() == "hi\n"
    assert gfile.GFile(path, "rb").read() == b"hi\n"
    assert gfile.GFile(path).readline() == "hi\n"
    assert gfile.GFile(path).readlines() == ["hi\n"] == list(gfile.GFile(path))
    assert gfile.GFile(path).size() == 3
    written = gfile.join(root, "w.txt")
    with gfile.GFile(written, "w") as f:
        f.write("abc")
        assert f.tell() == 3
    with gfile.GFile(written, "a") as f:
        f.write("d")
    assert gfile.GFile(written).read() == "abcd"
    with gfile.GFile(gfile.join(root, "bytes.bin"), "wb") as f:
        f.write(b"\x00\x01")
    reader = gfile.GFile(gfile.join(root, "bytes.bin"), "rb")
    reader.seek(1)
    assert reader.read() == b"\x01"


def test_file_errors_as_tensorflow(root: str) -> None:
    path = gfile.join(root, "a", "f.txt")
    with pytest.raises(NotFoundError, match="does not exist"):
        gfile.GFile(gfile.join(root, "nope")).read()
    with pytest.raises(InvalidArgumentError, match="mode 'x'"):
        gfile.GFile(path, "x")
    with pytest.raises(PermissionDeniedError, match="isn't open for writing"):
        gfile.GFile(path, "r").write("x")


def test_directories_as_tensorflow(root: str) -> None:
    a = gfile.join(root, "a")
    gfile.mkdir(a)  # an existing directory: nothing, as TensorFlow 2.21
    gfile.makedirs(a)
    gfile.mkdir(gfile.join(root, "c"))
    assert gfile.isdir(gfile.join(root, "c"))
    with pytest.raises(FailedPreconditionError, match="is a directory"):
        gfile.remove(gfile.join(a, "b"))
    with pytest.raises(NotFoundError):
        gfile.remove(gfile.join(root, "nope"))
    with pytest.raises(NotFoundError, match="not found"):
        gfile.rmtree(gfile.join(root, "nope"))
    gfile.rmtree(a)
    assert not gfile.exists(a) and gfile.exists(root)


def test_rename_and_copy_refuse_to_overwrite_unless_told(root: str) -> None:
    f = gfile.join(root, "a", "f.txt")
    g = gfile.join(root, "g.txt")
    gfile.copy(f, g)
    assert gfile.GFile(g).read() == "hi\n"
    with pytest.raises(AlreadyExistsError, match="already exists"):
        gfile.copy(f, g)
    with pytest.raises(AlreadyExistsError, match="already exists"):
        gfile.rename(f, g)
    gfile.rename(f, g, overwrite=True)
    assert not gfile.exists(f) and gfile.GFile(g).read() == "hi\n"
    with pytest.raises(NotFoundError):
        gfile.rename(f, gfile.join(root, "h.txt"))


def test_copy_across_file_systems(root: str, tmp_path: pathlib.Path) -> None:
    other = f"memory://gfile-other-{uuid.uuid4().hex}/x.txt"
    local = str(tmp_path / "y.txt")
    gfile.copy(gfile.join(root, "a", "f.txt"), other)
    gfile.copy(other, local)
    assert pathlib.Path(local).read_text() == "hi\n"
    with pytest.raises(InvalidArgumentError, match="different file systems"):
        gfile.rename(other, str(tmp_path / "z.txt"))


def test_stat_and_walk(root: str) -> None:
    info = gfile.stat(gfile.join(root, "a", "f.txt"))
    assert info.length == 3 and not info.is_directory and isinstance(info.mtime_nsec, int)
    assert gfile.stat(gfile.join(root, "a")).is_directory
    with pytest.raises(NotFoundError):
        gfile.stat(gfile.join(root, "nope"))
    # TensorFlow: [('/tmp/gft', ['a'], []), ('/tmp/gft/a', ['b'], ['f.txt']),
    #              ('/tmp/gft/a/b', [], [])]
    a, b = gfile.join(root, "a"), gfile.join(root, "a", "b")
    assert list(gfile.walk(root)) == [(root, ["a"], []), (a, ["b"], ["f.txt"]), (b, [], [])]
    assert [d for d, _, _ in gfile.walk(root, topdown=False)] == [b, a, root]
    assert list(gfile.walk(gfile.join(root, "nope"))) == []


def test_schemes_without_a_back_end_say_what_to_do() -> None:
    with pytest.raises(UnimplementedError, match="scheme 'foo' is not implemented"):
        gfile.exists("foo://bucket/key")
    try:
        import s3fs  # noqa: F401
    except ImportError:
        with pytest.raises(InvalidArgumentError, match="needs the package s3fs: pip install s3fs"):
            gfile.exists("s3://bucket/key")


def test_join_and_local_detection() -> None:
    assert gfile.join("gs://b", "x", "y") == "gs://b/x/y"
    assert gfile.join("/tmp", "a") == "/tmp/a"
    assert _fs.is_local("/tmp/x") and _fs.is_local("file:///tmp/x")
    assert not _fs.is_local("memory://x") and not _fs.is_local("s3://b/k")


def test_tensorflow_spelling() -> None:
    assert tf.io.gfile is gfile
    assert tf.io.gfile.GFile is gfile.GFile
