"""Tests of feedline/train/_checkpoint_files.py on object storage: checkpoints, their index,
``latest_checkpoint`` and ``max_to_keep`` on a real S3-compatible server on loopback (moto,
``tests/conftest.py``), on ``memory://`` and ``file://``; a real ``kill -9`` of a process in the
middle of a checkpoint's upload leaves the previous checkpoint the latest one, whole."""

from __future__ import annotations

import os
import pathlib
import signal
import uuid

import pytest
import torch

from feedline import _fs
from feedline.errors import DataLossError, InvalidArgumentError, NotFoundError
from feedline.train import Checkpoint, CheckpointManager, latest_checkpoint
from tests.launcher import Processes

pytestmark = pytest.mark.timeout(240)


def names(url: str) -> list[str]:
    """Every object under ``url``, hidden ones included, by name."""
    return _fs.list_names(url, "test")


def test_a_manager_on_s3_rotates_lists_and_restores(s3_bucket: str) -> None:
    directory = f"{s3_bucket}/run"
    weight = torch.zeros(4)
    manager = CheckpointManager(Checkpoint(weight=weight), directory, max_to_keep=2)
    for value in (1.0, 2.0, 3.0):
        weight.fill_(value)
        manager.save()
    assert names(directory) == ["checkpoint", "ckpt-2", "ckpt-3"]  # no temporary key is left
    assert (
        _fs.read_bytes(f"{directory}/checkpoint", "test")
        .decode()
        .startswith(
            'model_checkpoint_path: "ckpt-3"\n'
            'all_model_checkpoint_paths: "ckpt-2"\n'
            'all_model_checkpoint_paths: "ckpt-3"\n'
            "all_model_checkpoint_timestamps: "
        )
    )
    assert manager.checkpoints == [f"{directory}/ckpt-2", f"{directory}/ckpt-3"]
    assert latest_checkpoint(directory) == f"{directory}/ckpt-3"

    restored = torch.zeros(4)
    status = Checkpoint(weight=restored).restore(latest_checkpoint(directory))
    assert status.save_path == f"{directory}/ckpt-3" and restored.tolist() == [3.0] * 4
    Checkpoint(weight=restored).read(f"{directory}/ckpt-2").assert_consumed()
    assert restored.tolist() == [2.0] * 4

    # A new manager (a restarted job) takes over the listed checkpoints and goes on numbering.
    again = CheckpointManager(Checkpoint(weight=restored), directory, max_to_keep=2)
    assert again.checkpoints == manager.checkpoints
    assert again.save() == f"{directory}/ckpt-4"
    assert names(directory) == ["checkpoint", "ckpt-3", "ckpt-4"]


def test_checkpoint_save_write_and_latest_without_an_index_on_s3(s3_bucket: str) -> None:
    step = torch.tensor(7)
    checkpoint = Checkpoint(step=step)
    assert checkpoint.save(f"{s3_bucket}/a/ckpt") == f"{s3_bucket}/a/ckpt-1"
    assert checkpoint.save(f"{s3_bucket}/a/ckpt") == f"{s3_bucket}/a/ckpt-2"
    # A new Checkpoint never overwrites an earlier run's files: it numbers after them.
    assert Checkpoint(step=step).save(f"{s3_bucket}/a/ckpt") == f"{s3_bucket}/a/ckpt-3"
    assert checkpoint.write(f"{s3_bucket}/b/exact") == f"{s3_bucket}/b/exact"
    assert names(f"{s3_bucket}/b") == ["exact"]  # write: no index, no numbering
    _fs.remove_file(f"{s3_bucket}/a/checkpoint", "test")
    assert latest_checkpoint(f"{s3_bucket}/a") == f"{s3_bucket}/a/ckpt-3"  # by number
    assert latest_checkpoint(f"{s3_bucket}/nothing-here") is None
    restored = torch.tensor(0)
    Checkpoint(step=restored).read(f"{s3_bucket}/b/exact")
    assert int(restored) == 7


@pytest.mark.parametrize("scheme", ["memory", "file"])
def test_memory_and_file_urls_behave_as_local_paths(scheme: str, tmp_path: pathlib.Path) -> None:
    directory = (
        f"memory://checkpoints-{uuid.uuid4().hex[:8]}" if scheme == "memory" else tmp_path.as_uri()
    )
    weight = torch.zeros(2)
    manager = CheckpointManager(Checkpoint(weight=weight), directory, max_to_keep=1)
    weight.fill_(1.0)
    manager.save()
    weight.fill_(2.0)
    assert manager.save() == f"{directory}/ckpt-2"
    assert names(directory) == ["checkpoint", "ckpt-2"]
    assert latest_checkpoint(directory) == f"{directory}/ckpt-2"
    restored = torch.zeros(2)
    Checkpoint(weight=restored).restore(latest_checkpoint(directory))
    assert restored.tolist() == [2.0, 2.0]
    if scheme == "file":
        assert sorted(os.listdir(tmp_path)) == ["checkpoint", "ckpt-2"]


class _FailsToPickle:
    """An object whose state does not pickle: its save fails in the middle of the file."""

    def get_state(self) -> object:
        return {"fine": torch.ones(300_000), "broken": lambda: None}

    def set_state(self, state: object) -> None:
        raise AssertionError("never restored")


def test_a_save_that_fails_midway_leaves_the_store_as_it_was(s3_bucket: str) -> None:
    directory = f"{s3_bucket}/run"
    checkpoint = Checkpoint(step=torch.tensor(1))
    manager = CheckpointManager(checkpoint, directory)
    manager.save()
    before = (names(directory), _fs.read_bytes(f"{directory}/checkpoint", "test"))
    checkpoint.broken = _FailsToPickle()
    with pytest.raises(Exception, match="pickle") as raised:
        manager.save()
    assert any("does not pickle" in note for note in raised.value.__notes__)
    assert (names(directory), _fs.read_bytes(f"{directory}/checkpoint", "test")) == before
    assert checkpoint.save_counter == 1 and manager.checkpoints == [f"{directory}/ckpt-1"]


def test_damage_read_back_from_the_store_is_data_loss(s3_bucket: str) -> None:
    path = Checkpoint(weight=torch.arange(1000.0)).write(f"{s3_bucket}/good")
    data = bytearray(_fs.read_bytes(path, "test"))
    fs, _ = _fs.filesystem(s3_bucket)
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x10
    fs.pipe_file(f"{s3_bucket}/flipped".removeprefix("s3://"), bytes(flipped))
    with pytest.raises(DataLossError, match=rf"{s3_bucket}/flipped is damaged: tensor 'weight'"):
        Checkpoint(weight=torch.zeros(1000)).read(f"{s3_bucket}/flipped")
    fs.pipe_file(f"{s3_bucket}/cut".removeprefix("s3://"), bytes(data[:-100]))
    with pytest.raises(DataLossError, match=rf"{s3_bucket}/cut is damaged") as raised:
        Checkpoint(weight=torch.zeros(1000)).read(f"{s3_bucket}/cut")
    assert raised.value.filename == f"{s3_bucket}/cut"


def test_a_missing_checkpoint_or_a_directory_names_the_url(s3_bucket: str) -> None:
    Checkpoint(step=torch.tensor(1)).save(f"{s3_bucket}/run/ckpt")
    with pytest.raises(NotFoundError, match=f"no checkpoint file at {s3_bucket}/run/ckpt-9"):
        Checkpoint(step=torch.tensor(0)).restore(f"{s3_bucket}/run/ckpt-9")
    with pytest.raises(NotFoundError, match=f"{s3_bucket}/run is a directory"):
        Checkpoint(step=torch.tensor(0)).restore(f"{s3_bucket}/run")
    with pytest.raises(NotFoundError, match="s3://no-such-bucket-feedline/ckpt"):
        Checkpoint(step=torch.tensor(0)).save("s3://no-such-bucket-feedline/ckpt")


# A process that saves ckpt-1 (zeros), then saves ckpt-2 (ones, 16 MB) and stops in the middle of
# its upload: after the first part of the multipart upload has reached the server, it prints
# "uploading" and waits to be killed. Parts are 5 MiB, S3's smallest.
_KILLED_MID_UPLOAD = """
import sys, time
import s3fs
import torch
from feedline.train import Checkpoint, CheckpointManager

s3fs.S3FileSystem.default_block_size = 5 << 20
directory = sys.argv[1]
weight = torch.zeros(4 << 20)
manager = CheckpointManager(Checkpoint(weight=weight), directory)
manager.save()
weight.fill_(1.0)
upload_chunk = s3fs.core.S3File._upload_chunk

def stop_midway(self, final=False):
    done = upload_chunk(self, final)
    if self.parts and not final:
        print("uploading", self.path, flush=True)
        time.sleep(120)
    return done

s3fs.core.S3File._upload_chunk = stop_midway
manager.save()
print("saved", flush=True)
"""


def test_kill_9_in_the_middle_of_an_upload_leaves_the_previous_checkpoint(
    s3_bucket: str,
) -> None:
    directory = f"{s3_bucket}/run"
    with Processes(_KILLED_MID_UPLOAD, [("trainer", {})], argv=[directory], timeout=180) as procs:
        line = procs.wait_for_line("trainer", "uploading", timeout=150)
        procs.send("trainer", signal.SIGKILL)
        assert procs.wait_exit("trainer", timeout=30) == -signal.SIGKILL
        assert "saved" not in procs.output("trainer")
    # The upload was under way when the process died, and the store shows none of it.
    fs, _ = _fs.filesystem(s3_bucket)
    bucket = s3_bucket.removeprefix("s3://")
    pending = [upload["Key"] for upload in fs.list_multipart_uploads(bucket)]
    assert line.split()[1] in {f"{bucket}/{key}" for key in pending}
    assert names(directory) == ["checkpoint", "ckpt-1"]
    assert latest_checkpoint(directory) == f"{directory}/ckpt-1"
    weight = torch.full((4 << 20,), 5.0)
    Checkpoint(weight=weight).restore(latest_checkpoint(directory)).assert_consumed()
    assert bool((weight == 0).all())
    # The restarted job takes over and its next save is ckpt-2, whole.
    manager = CheckpointManager(Checkpoint(weight=weight), directory)
    assert manager.checkpoints == [f"{directory}/ckpt-1"]
    weight.fill_(2.0)
    assert manager.save() == f"{directory}/ckpt-2"
    restored = torch.zeros(4 << 20)
    Checkpoint(weight=restored).restore(latest_checkpoint(directory))
    assert bool((restored == 2).all())


def test_bad_credentials_are_permission_denied_naming_the_url() -> None:
    from feedline.errors import PermissionDeniedError
    from tests.conftest import credential_checked_s3

    with credential_checked_s3() as (bucket, check_credentials):
        Checkpoint(step=torch.tensor(3)).save(f"{bucket}/run/ckpt")
        check_credentials()
        with pytest.raises(PermissionDeniedError, match=f"{bucket}/run/ckpt-2"):
            Checkpoint(step=torch.tensor(3)).write(f"{bucket}/run/ckpt-2")
        with pytest.raises(PermissionDeniedError, match=f"{bucket}/run/ckpt-1"):
            Checkpoint(step=torch.tensor(0)).restore(f"{bucket}/run/ckpt-1")
        with pytest.raises(PermissionDeniedError, match=f"{bucket}/run/checkpoint"):
            latest_checkpoint(f"{bucket}/run")


def test_storage_options_carry_the_credentials_of_every_checkpoint_call() -> None:
    # The environment's keys are refused once the checks are on: the user's keys reach the
    # store only through storage_options.
    from feedline.errors import PermissionDeniedError
    from tests.conftest import credential_checked_s3, new_s3_user_options

    with credential_checked_s3() as (bucket, check_credentials):
        options = new_s3_user_options()
        check_credentials()
        directory = f"{bucket}/run"
        step = torch.tensor(1)
        manager = CheckpointManager(
            Checkpoint(step=step), directory, max_to_keep=2, storage_options=options
        )
        assert manager.storage_options == options
        for value in (1, 2, 3):
            step.fill_(value)
            manager.save()
        assert manager.checkpoints == [f"{directory}/ckpt-2", f"{directory}/ckpt-3"]
        again = CheckpointManager(Checkpoint(step=step), directory, storage_options=options)
        assert again.checkpoints == manager.checkpoints  # the index, read back
        latest = latest_checkpoint(directory, storage_options=options)
        assert latest == f"{directory}/ckpt-3"
        restored = torch.tensor(0)
        Checkpoint(step=restored).restore(latest, storage_options=options)
        assert int(restored) == 3
        checkpoint = Checkpoint(step=torch.tensor(7))
        assert checkpoint.save(f"{bucket}/a/ckpt", storage_options=options).endswith("ckpt-1")
        checkpoint.write(f"{bucket}/b/exact", storage_options=options)
        Checkpoint(step=restored).read(f"{bucket}/b/exact", storage_options=options)
        assert int(restored) == 7
        with pytest.raises(PermissionDeniedError, match=f"{directory}/checkpoint"):
            latest_checkpoint(directory)  # the environment's keys
        with pytest.raises(PermissionDeniedError, match=f"{bucket}/b/exact"):
            Checkpoint(step=restored).read(f"{bucket}/b/exact")


def test_storage_options_must_be_a_dict_of_arguments(tmp_path: pathlib.Path) -> None:
    with pytest.raises(InvalidArgumentError, match=r"Checkpoint\.save: storage_options must be"):
        Checkpoint(step=torch.tensor(1)).save(str(tmp_path / "ckpt"), storage_options="key=x")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="CheckpointManager: storage_options"):
        CheckpointManager(Checkpoint(), str(tmp_path), storage_options=[("key", "x")])  # type: ignore[arg-type]
    # Local paths take no options: those given for a store are not passed to them.
    path = Checkpoint(step=torch.tensor(1)).save(
        str(tmp_path / "ckpt"), storage_options={"key": "x"}
    )
    assert latest_checkpoint(str(tmp_path), storage_options={"key": "x"}) == path


def test_on_a_store_that_shows_partial_files_the_name_appears_only_complete(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # memory:// shows a file while it is written, as some stores do: the checkpoint goes to a
    # hidden temporary name and appears under its own only once complete.
    from feedline.train import _checkpoint_format

    directory = f"memory://partial-{uuid.uuid4().hex[:8]}"
    seen_while_writing: list[list[str]] = []
    dump = _checkpoint_format.dump

    def looking_dump(state: object, file: object) -> None:
        dump(state, file)  # type: ignore[arg-type]
        seen_while_writing.append(names(directory))

    monkeypatch.setattr(_checkpoint_format, "dump", looking_dump)
    path = Checkpoint(step=torch.tensor(4)).save(f"{directory}/ckpt")
    (listing,) = seen_while_writing
    assert "ckpt-1" not in listing and any(
        name.startswith(".ckpt-1.") and name.endswith(".tmp") for name in listing
    )
    assert names(directory) == ["checkpoint", "ckpt-1"]
    step = torch.tensor(0)
    Checkpoint(step=step).restore(path)
    assert int(step) == 4


def test_a_write_that_fails_after_parts_were_uploaded_aborts_the_upload(s3_bucket: str) -> None:
    def fails_midway(file: object) -> None:
        for _ in range(11):  # 55 MiB: past s3fs's 50 MiB parts, so a part is uploaded
            file.write(bytes(5 << 20))  # type: ignore[attr-defined]
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        _fs.write_whole(f"{s3_bucket}/run/ckpt-1", fails_midway, "test")
    fs, _ = _fs.filesystem(s3_bucket)
    assert fs.list_multipart_uploads(s3_bucket.removeprefix("s3://")) == []  # aborted
    assert names(s3_bucket) == []


def test_a_restore_through_connections_reset_mid_response_reads_every_byte_once(
    s3_bucket: str, s3_endpoint: str
) -> None:
    # Checkpoints of 1 MiB restored through a proxy that resets 40% of its connections after
    # 16 KiB of the answer: each read goes on at the byte it reached, and every checksum holds.
    from tests.fault_proxy import FaultProxy
    from tests.test_fs import _through

    directory = f"{s3_bucket}/noisy"
    weight = torch.zeros(1 << 18)
    manager = CheckpointManager(Checkpoint(weight=weight), directory, max_to_keep=None)
    for value in range(4):
        weight.copy_(torch.arange(1 << 18, dtype=torch.float32) * value)
        manager.save()
    host, port = s3_endpoint.removeprefix("http://").split(":")
    with FaultProxy((host, int(port)), reset_fraction=0.4, reset_after=16384, seed=5) as proxy:
        _through(proxy.url)
        try:
            restored = []
            for path in manager.checkpoints:
                Checkpoint(weight=weight).restore(path).assert_consumed()
                restored.append(weight.clone())
            latest = latest_checkpoint(directory)
        finally:
            _through(s3_endpoint)
    assert proxy.resets > 0, "the proxy reset no connection: the test proved nothing"
    assert latest == f"{directory}/ckpt-4"
    for value, tensor in enumerate(restored):
        assert torch.equal(tensor, torch.arange(1 << 18, dtype=torch.float32) * value)


def test_an_index_replaced_while_it_is_read_is_read_again(s3_bucket: str) -> None:
    # A sidecar polls the index while training replaces it at every save: each read gives a
    # whole index, never an error for the object that changed between two of its requests.
    import threading

    from feedline.train._checkpoint_files import read_index, write_index

    directory = f"{s3_bucket}/polled"
    write_index(directory, f"{directory}/ckpt-0", [f"{directory}/ckpt-0"])
    stop = threading.Event()
    written = [0]

    def save_again_and_again() -> None:
        while not stop.is_set():
            written[0] += 1
            path = f"{directory}/ckpt-{written[0]}"
            write_index(directory, path, [path])

    saver = threading.Thread(target=save_again_and_again, name="index-saver", daemon=True)
    saver.start()
    try:
        seen = [read_index(directory) for _ in range(100)]
    finally:
        stop.set()
        saver.join(timeout=30)
    assert written[0] > 10, "the index was hardly replaced: the test proved nothing"
    for index in seen:
        assert index is not None and index[0] is not None and index[1] == [index[0]]
    numbers = [int(str(index[0]).rsplit("-", 1)[1]) for index in seen if index is not None]
    assert numbers == sorted(numbers)  # each read saw the index as it was then, or later
