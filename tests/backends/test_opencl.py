"""OpenCL backend specifics: one context and queue per device, program cache, limits, contexts."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from graph_runtime.backends import get_backend
from graph_runtime.errors import DeviceError, LibraryError

ADD_ONE = """
__kernel void add_one(__global float *x, const unsigned long offset) {
    x[offset + get_global_id(0)] += 1.0f;
}
"""


@pytest.fixture
def backend(opencl_available: None) -> object:
    return get_backend("opencl")


@pytest.mark.opencl
def test_context_and_queue_are_made_once(backend) -> None:
    import pyopencl as cl

    ctx = backend.context(0)
    queue = backend.queue(0)
    assert backend.context(0) is ctx and backend.queue(0) is queue
    assert queue.context.int_ptr == ctx.int_ptr
    assert not queue.properties & cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE


@pytest.mark.opencl
def test_device_info_names_device_and_platform(backend) -> None:
    import pyopencl as cl

    info = backend.device_info(0)
    platform_names = [p.name.strip() for p in cl.get_platforms()]
    assert any(info.name.endswith(f"({name})") for name in platform_names)
    assert info.memory_bytes == backend.cl_device(0).global_mem_size


@pytest.mark.opencl
def test_program_is_built_once_per_source_and_options(backend) -> None:
    prg = backend.program(0, ADD_ONE)
    assert backend.program(0, ADD_ONE) is prg
    assert backend.program(0, ADD_ONE, ("-cl-fast-relaxed-math",)) is not prg


@pytest.mark.opencl
def test_kernel_on_the_queue_is_ordered_with_copies(backend) -> None:
    host = np.arange(8, dtype=np.float32)
    buf = backend.alloc(0, 64)
    arr = backend.view(buf, 16, (8,), np.dtype("float32"))
    backend.from_host(host, arr)
    prg = backend.program(0, ADD_ONE)
    # The in-order queue runs the kernel before the read that follows it: no explicit sync.
    prg.add_one(backend.queue(0), (8,), None, arr.base_data, np.uint64(arr.offset // 4))
    np.testing.assert_array_equal(backend.to_host(arr), host + 1)


@pytest.mark.opencl
def test_build_error_carries_the_log(backend) -> None:
    broken = "__kernel void broken(__global float *x) { x[0] = undeclared_name; }"
    with pytest.raises(LibraryError, match=r"opencl:0: building OpenCL broken failed .*build log"
                                           r"(.|\n)*undeclared_name"):
        backend.program(0, broken, name="broken")


@pytest.mark.opencl
def test_buffer_over_the_single_allocation_limit(backend) -> None:
    limit = int(backend.cl_device(0).max_mem_alloc_size)
    with pytest.raises(DeviceError, match=rf"cannot allocate one buffer of {limit + 1} bytes; "
                                          rf"the device's largest single allocation "
                                          rf"\(CL_DEVICE_MAX_MEM_ALLOC_SIZE\) is {limit} bytes"):
        backend.alloc(0, limit + 1)


@pytest.mark.opencl
def test_zero_byte_buffer_gets_one_byte(backend) -> None:
    assert backend.alloc(0, 0).size == 1


@pytest.mark.opencl
def test_unknown_device_id(backend) -> None:
    count = backend.device_count()
    with pytest.raises(DeviceError, match=rf"opencl:{count} does not exist: this machine has "
                                          rf"{count} opencl device"):
        backend.alloc(count, 16)


@pytest.mark.opencl
def test_array_from_a_foreign_context_copies_through_the_host(backend) -> None:
    import pyopencl as cl
    import pyopencl.array as cl_array

    foreign_ctx = cl.Context([backend.cl_device(0)])
    foreign_queue = cl.CommandQueue(foreign_ctx)
    host = np.arange(12, dtype=np.int32).reshape(3, 4)
    foreign = cl_array.to_device(foreign_queue, host)
    assert backend.device_id_of(foreign) == 0
    ours = backend.empty(0, (3, 4), np.dtype("int32"))
    backend.copy(foreign, ours)
    np.testing.assert_array_equal(backend.to_host(ours), host)
    backend.copy(ours, foreign)
    np.testing.assert_array_equal(foreign.get(), host)


@pytest.mark.opencl
def test_non_contiguous_device_array_is_refused(backend) -> None:
    arr = backend.empty(0, (4, 4), np.dtype("float32"))
    transposed = arr.transpose()
    with pytest.raises(DeviceError, match=r"opencl: the to_host source must be C-contiguous"):
        backend.to_host(transposed)


def test_missing_pyopencl_is_a_device_error() -> None:
    # A fresh interpreter where importing pyopencl fails, as on a machine without it.
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'pyopencl':\n"
        "            raise ImportError('No module named ' + repr(name))\n"
        "sys.meta_path.insert(0, Block())\n"
        "from graph_runtime.backends import get_backend\n"
        "from graph_runtime.errors import DeviceError\n"
        "try:\n"
        "    get_backend('opencl')\n"
        "except DeviceError as e:\n"
        "    print(e)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        "opencl: pyopencl not installed; pip install 'graph_runtime[opencl]' (and an OpenCL "
        "driver, e.g. Debian's pocl-opencl-icd)")
