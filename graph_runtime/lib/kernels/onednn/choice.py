"""Where oneDNN kernels are offered to the CPU kernel choices (kept small until the tuning
service takes the choices over): the candidate names, and the setting that forces them."""
from __future__ import annotations

from typing import Any

from ...conv_params import ConvParams
from ..cpu.conv_epilogue import Epilogue
from . import binding


def onednn_forced() -> bool:
    """GRAPH_RUNTIME_ONEDNN=on: oneDNN wherever it applies, no timing; the library must load."""
    if binding.onednn_mode() != "on":
        return False
    binding.library()  # LibraryError with the reason when it cannot run
    return True


def onednn_conv_names(p: ConvParams, epilogue: Epilogue) -> list[str]:
    """["onednn"] where a oneDNN primitive computes this conv2d and its epilogue, else []."""
    from .conv import conv_applies
    if binding.onednn_mode() == "on":
        binding.library()
    return ["onednn"] if conv_applies(p, epilogue) else []


def onednn_conv(p: ConvParams, epilogue: Epilogue) -> Any:
    """The oneDNN conv2d kernel (imported on first use: loading the library costs ~50 ms)."""
    from .conv import OnednnConv
    return OnednnConv(p, epilogue)
