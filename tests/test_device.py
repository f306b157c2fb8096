"""Device parsing, aliases, DLPack codes and the errors for unknown or missing devices."""
from __future__ import annotations

import pytest

import graph_runtime as gr
from graph_runtime.backends import REGISTRY, check_device, get_backend
from graph_runtime.device import DEVICE_NAMES, DLPACK_CODES, Device, device, device_type_code
from graph_runtime.errors import DeviceError


@pytest.mark.parametrize("spec, expected", [
    ("cpu", Device(1, 0)),
    ("cuda:1", Device(2, 1)),
    ("opencl(0)", Device(4, 0)),
    ("opencl(3)", Device(4, 3)),
    (" CUDA:2 ", Device(2, 2)),
    ((2, 1), Device(2, 1)),
    (("opencl", 2), Device(4, 2)),
    (4, Device(4, 0)),
    ("4:1", Device(4, 1)),
    (Device(2, 3), Device(2, 3)),
])
def test_device_parses_every_form(spec: object, expected: Device) -> None:
    assert device(spec) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("alias, kind", [
    ("gpu", "cuda"), ("cl", "opencl"), ("llvm", "cpu"), ("host", "cpu"), ("GPU:1", "cuda"),
])
def test_aliases_map_to_kinds(alias: str, kind: str) -> None:
    assert device(alias).kind == kind


def test_device_id_argument_overrides_the_spec() -> None:
    assert device("cuda:1", 3) == Device(2, 3)
    assert device(Device(4, 0), 2) == Device(4, 2)
    assert device(2, 1) == Device(2, 1)


def test_makers_and_names() -> None:
    assert gr.cpu() == Device(1, 0)
    assert gr.cuda(1) == Device(2, 1)
    assert gr.opencl(2) == Device(4, 2)
    dev = gr.opencl(1)
    assert (dev.kind, dev.spec, str(dev), repr(dev)) == ("opencl", "opencl:1", "opencl:1",
                                                         "Device(opencl:1)")
    assert device(dev.spec) == dev
    assert Device(99, 0).kind == "type99"


def test_devices_hash_and_order() -> None:
    assert len({gr.cpu(0), Device(1, 0), gr.cuda(0)}) == 2
    assert sorted([gr.opencl(0), gr.cuda(1), gr.cpu(0), gr.cuda(0)]) == [
        gr.cpu(0), gr.cuda(0), gr.cuda(1), gr.opencl(0)]


def test_dlpack_codes_match_dlpack_h() -> None:
    assert (DLPACK_CODES["cpu"], DLPACK_CODES["cuda"], DLPACK_CODES["opencl"]) == (1, 2, 4)
    assert all(DEVICE_NAMES[code] == name for name, code in DLPACK_CODES.items())
    assert device_type_code("gpu") == 2
    assert device_type_code(4) == 4


def test_unknown_type_names_the_choices() -> None:
    with pytest.raises(DeviceError, match=r"unknown device type 'tpu'; expected one of: cpu, "
                                          r"cuda, opencl"):
        device("tpu")


def test_unknown_type_code() -> None:
    with pytest.raises(DeviceError, match=r"unknown DLPack device type code 99; known: 1 \(cpu\)"):
        device(99)


@pytest.mark.parametrize("spec", ["cuda:x", "cuda:-1", "opencl()", "cpu:1.5"])
def test_bad_id_says_what_an_id_looks_like(spec: str) -> None:
    with pytest.raises(DeviceError, match=r"non-negative integer, as in 'cuda:1'"):
        device(spec)


def test_bad_tuple_and_bad_type() -> None:
    with pytest.raises(DeviceError, match=r"must be \(device_type, device_id\), got \(2, 0, 1\)"):
        device((2, 0, 1))
    with pytest.raises(DeviceError, match=r"cannot make a device from float 1.5"):
        device(1.5)  # type: ignore[arg-type]
    with pytest.raises(DeviceError, match=r"cannot make a device from bool"):
        device(True)  # type: ignore[arg-type]


def test_known_type_without_backend() -> None:
    with pytest.raises(DeviceError, match=r"no backend for device type 'vulkan'; graph_runtime "
                                          r"supports: cpu, cuda, opencl"):
        get_backend("vulkan")
    assert "vulkan" not in REGISTRY


def test_out_of_range_id_names_the_count() -> None:
    with pytest.raises(DeviceError, match=r"cpu:3 does not exist: this machine has 1 cpu "
                                          r"device\(s\) \(ids 0..0\)"):
        check_device(gr.cpu(3))


@pytest.mark.opencl
def test_out_of_range_opencl_id() -> None:
    count = get_backend("opencl").device_count()
    with pytest.raises(DeviceError, match=rf"opencl:7 does not exist: this machine has "
                                          rf"{count} opencl device\(s\)"):
        check_device(device("opencl:7"))
