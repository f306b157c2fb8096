"""Checks at create that a raw OpenCL kernel's launch fits its declared arguments and the device."""
from __future__ import annotations

from typing import Any, Sequence

from ....errors import LibraryError

# OpenCL C integer types by size in bytes (a kernel argument cannot be size_t).
_INTEGER_TYPES = {4: ("int", "uint"), 8: ("long", "ulong")}


def check_arguments(kernel: Any, where: str, arrays: int, tail: Sequence[Any],
                    count: str | None) -> None:
    """Arrays go to __global or __constant pointers, the count n to an integer of its size: the
    launch would otherwise fail at run (INVALID_ARG_SIZE) or read the wrong bits.

    Args:
        arrays: how many arrays the node passes first; tail: the NumPy scalars after them.
        count: the lib.json's "count" (named in the message).
    """
    import pyopencl as cl
    space = cl.kernel_arg_address_qualifier
    for index in range(kernel.num_args):
        declared = _declared(kernel, index)
        if index < arrays:
            if declared is not None and declared[0] not in (space.GLOBAL, space.CONSTANT):
                raise LibraryError(f"{where}: argument {index} is {declared[2]!r}, but the node "
                                   f"passes array {index} there (the arguments are one __global "
                                   "pointer per input, then per output)")
            continue
        value = tail[index - arrays]
        types = _INTEGER_TYPES[value.itemsize]
        if declared is not None and (declared[0] != space.PRIVATE or declared[1] not in types):
            raise LibraryError(f"{where}: argument {index} is {declared[2]!r}, but count "
                               f"{count!r} passes n there ({value.itemsize} bytes); declare it "
                               f"{' or '.join(types)}, or change count")
        try:
            kernel.set_arg(index, value)
        except cl.Error as e:
            raise LibraryError(f"{where}: argument {index} does not take the count n as "
                               f"{count!r} ({e})") from e


def _declared(kernel: Any, index: int) -> tuple[int, str, str] | None:
    """(address qualifier, type, "type name") of a kernel argument; None when the driver keeps
    no argument info (then clSetKernelArg's own size check is all there is)."""
    import pyopencl as cl
    info = cl.kernel_arg_info
    try:
        qualifier = int(kernel.get_arg_info(index, info.ADDRESS_QUALIFIER))
        type_name = str(kernel.get_arg_info(index, info.TYPE_NAME)).strip()
        name = kernel.get_arg_info(index, info.NAME)
    except cl.Error:
        return None
    # NOTE: drivers spell "uint" as "unsigned int" too.
    return qualifier, type_name.replace("unsigned ", "u"), f"{type_name} {name}"


def check_work_group(kernel: Any, dev: Any, where: str, total: int, group: int | None,
                     options: Sequence[str]) -> None:
    """The work-group size the kernel and device allow for a 1-D launch of total work items in
    groups of group (None: the driver chooses): at run it would be INVALID_WORK_GROUP_SIZE."""
    import pyopencl as cl
    wg_info = cl.kernel_work_group_info
    required = [int(v) for v in kernel.get_work_group_info(wg_info.COMPILE_WORK_GROUP_SIZE, dev)]
    if any(required) and (group is None or [group, 1, 1] != required):
        raise LibraryError(f"{where}: the kernel declares reqd_work_group_size"
                           f"({', '.join(map(str, required))}); local_size is {group}, expected "
                           f"{required[0]} (a 1-D launch)")
    if group is None:
        return
    most = int(kernel.get_work_group_info(wg_info.WORK_GROUP_SIZE, dev))
    if group > most:
        raise LibraryError(f"{where}: local_size {group} is more work items than this kernel "
                           f"may have in a group on this device (CL_KERNEL_WORK_GROUP_SIZE "
                           f"{most})")
    most = int(dev.max_work_item_sizes[0])
    if group > most:
        raise LibraryError(f"{where}: local_size {group} is beyond the device's limit in "
                           f"dimension 0 (CL_DEVICE_MAX_WORK_ITEM_SIZES[0] {most})")
    if total % group and not _non_uniform_groups(dev, options):
        raise LibraryError(f"{where}: local_size {group} does not divide the global size "
                           f"{total}; this device and build launch whole work-groups only "
                           f"(OpenCL 1.2): round the global size up, e.g. \"(n + {group - 1}) / "
                           f"{group} * {group}\", or make local_size null")


def _non_uniform_groups(dev: Any, options: Sequence[str]) -> bool:
    """Whether a last, smaller work-group is allowed: an OpenCL C 2.0+ build (-cl-std) on a
    device that supports it (every 2.x device; a 3.0 device that says so)."""
    import pyopencl as cl
    flags = " ".join(options).split()
    standard = [f for f in flags if f.startswith("-cl-std=CL")]
    if not standard or standard[-1] < "-cl-std=CL2.0" or "-cl-uniform-work-group-size" in flags:
        return False
    words = dev.version.split()
    if len(words) > 1 and words[1].startswith("2."):
        return True
    try:
        return bool(dev.non_uniform_work_group_support)
    except (cl.Error, AttributeError):  # a driver (or pyopencl) without the 3.0 query
        return False
