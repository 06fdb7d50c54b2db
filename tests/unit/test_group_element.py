"""A token group crosses from a worker process as a Grain element of shared-memory arrays and
comes back as plain ndarrays over the same memory (the packer slices it once a document)."""

from __future__ import annotations

import gc

import numpy as np
from grain._src.python.ipc.shared_memory_array import SharedMemoryArray

from input_server.data.tokenizers.groups import TokenGroup


def _shared(values: np.ndarray) -> SharedMemoryArray:
    a = SharedMemoryArray(values.shape, values.dtype)
    a[:] = values
    a.unlink_on_del()  # the last holder frees it, as the server's side of Grain does
    return a


def test_a_groups_shared_memory_arrays_come_back_as_plain_views():
    group = TokenGroup(first_doc=7, tokens=np.arange(12, dtype=np.int32), lengths=np.array([5, 7]))
    element = group.to_element()
    element["tokens"], element["lengths"] = _shared(group.tokens), _shared(group.lengths)
    back = TokenGroup.from_element(element)
    for got, sent in ((back.tokens, element["tokens"]), (back.lengths, element["lengths"])):
        assert type(got) is np.ndarray and type(got[1:3]) is np.ndarray
        assert np.shares_memory(got, sent)  # a view: nothing copied
    assert back.first_doc == 7 and back.same_ids(group)
    del element, sent
    gc.collect()
    # The shared memory outlives the element: the views hold it.
    assert back.tokens.tolist() == list(range(12)) and back.lengths.tolist() == [5, 7]
