"""address_of gives array.ctypes.data for every kind of array a kernel may be handed."""
from __future__ import annotations

import numpy as np

from graph_runtime.lib.kernels.address import address_of
from graph_runtime.lib.kernels.cpu.omp_team import block


def test_address_of_is_ctypes_data_for_every_kind_of_array() -> None:
    base = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    frozen = np.ones(5)
    frozen.flags.writeable = False
    arrays = [base, base[1], base[:, :, ::2], base.transpose(2, 0, 1), frozen,
              np.empty(0, np.float32), np.array(3.0), np.zeros((0, 4), np.int64),
              base.reshape(-1)[3:]]
    for array in arrays:
        assert address_of(array) == array.ctypes.data, (array.shape, array.strides)


def test_block_holds_addresses_integers_and_float_bits() -> None:
    x = np.zeros(8, np.float32)
    made = block(x, 7, 2.5, -1.0e-5, np.int64(3))
    assert made.dtype == np.int64
    assert made.tolist() == [x.ctypes.data, 7, int(np.float64(2.5).view(np.int64)),
                             int(np.float64(-1.0e-5).view(np.int64)), 3]
