"""Tests of feedline/data/ops/_buffer_pool.py."""

from __future__ import annotations

import gc
import threading

import numpy as np
import torch

from feedline.data.ops._buffer_pool import BufferPool


def test_a_block_comes_back_only_when_nothing_refers_to_it() -> None:
    pool = BufferPool(keep=2)
    batch = pool.take((4, 3), np.dtype(np.float32))
    assert batch.flags.writeable and batch.flags.c_contiguous
    batch[:] = 7
    address = batch.ctypes.data
    row, tensor = batch[2], torch.from_numpy(batch)
    del batch
    gc.collect()
    assert pool.free_blocks() == 0  # a row and a tensor still use it
    del row
    assert pool.free_blocks() == 0
    del tensor
    assert pool.free_blocks() == 1
    again = pool.take((2, 6), np.dtype(np.float32))  # the same bytes, another shape
    assert again.ctypes.data == address and again.shape == (2, 6)
    other = pool.take((2, 6), np.dtype(np.float32))  # none free: a new block
    assert other.ctypes.data != address


def test_the_pool_keeps_at_most_keep_free_blocks_of_a_size() -> None:
    pool = BufferPool(keep=2)
    taken = [pool.take((10,), np.dtype(np.int64)) for _ in range(5)]
    del taken
    assert pool.free_blocks() == 2
    assert pool.take((0, 3), np.dtype(np.float64)).shape == (0, 3)
    kept = pool.take((10,), np.dtype(np.int64))
    pool.close()  # frees what is free; a leased block is freed when dropped
    assert pool.free_blocks() == 0
    del kept
    assert pool.free_blocks() == 0


def test_arrays_outlive_their_pool() -> None:
    pool = BufferPool()
    kept = pool.take((3,), np.dtype(np.int32))
    kept[:] = [1, 2, 3]
    del pool
    gc.collect()
    assert kept.tolist() == [1, 2, 3]
    del kept  # its lease finds no pool: the block is freed


def test_threads_take_and_drop_arrays_at_once() -> None:
    pool = BufferPool(keep=4)
    failures: list[str] = []

    def work(value: int) -> None:
        for _ in range(200):
            array = pool.take((256,), np.dtype(np.int64))
            array[:] = value
            if not (array == value).all():
                failures.append(f"thread {value} saw another thread's values")

    threads = [threading.Thread(target=work, args=(v,)) for v in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert failures == [] and pool.free_blocks() <= 4
