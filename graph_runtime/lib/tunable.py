"""Tunable ops: an op's candidate kernels by name, filtered by where they apply and by the settings,
the rest raced by one function (tuning.Choice) under the one speedup rule (_timing.min_speedup).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Sequence, TypeVar

from .. import settings
from .._timing import Race, Verdict, speedups
from .tuning import Choice

Spec = TypeVar("Spec")


def _always(spec: Any) -> bool:
    return True


@dataclass(frozen=True)
class Candidate(Generic[Spec]):
    """One way to compute an op: its name (in settings and the tuning file), where it applies,
    how it is built, its kind (the speedup rule's key: "plain", "spread" for work handed to the
    runtime's workers, "padded", "split") and whether it is oneDNN's (GRAPH_RUNTIME_ONEDNN=off
    removes it; on forces it wherever it applies). build None: the op makes its kernel from the
    chosen name itself (attention.py's split). otherwise: the candidate the setting forcing
    this one takes where this one does not apply (the op's fallback where empty or not offered
    either)."""

    name: str
    build: Callable[[Spec], Any] | None = None
    applies: Callable[[Spec], bool] = _always
    kind: str = "plain"
    onednn: bool = False
    otherwise: str = ""


@dataclass(frozen=True)
class TunableOp(Generic[Spec]):
    """An op's candidates and the choice (its name in the tuning file, the setting that forces
    it) that picks among those offered. fallback: what a forced name that does not apply
    takes (None: the choice is measured instead)."""

    choice: Choice
    candidates: tuple[Candidate[Spec], ...]
    fallback: str | None = None
    _by_name: dict[str, Candidate[Spec]] = field(init=False, repr=False, compare=False)
    _onednn: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {c.name: c for c in self.candidates})
        object.__setattr__(self, "_onednn", any(c.onednn for c in self.candidates))

    def candidate(self, name: str) -> Candidate[Spec]:
        """The candidate called name."""
        return self._by_name[name]

    def offered(self, spec: Spec) -> list[str]:
        """The candidates that apply to spec and that the settings allow, in the set's order.

        GRAPH_RUNTIME_ONEDNN=off removes oneDNN's; on needs the library (LibraryError with the
        reason when it cannot load) before asking where oneDNN applies.
        """
        mode = settings.word(settings.ONEDNN) if self._onednn else "auto"
        names = []
        for c in self.candidates:
            if c.onednn and mode == "off":
                continue
            if c.onednn and mode == "on":
                from .kernels.onednn import binding
                binding.library()
            if c.applies(spec):
                names.append(c.name)
        return names

    def forced(self, names: Sequence[str]) -> str | None:
        """The candidate the settings force among names (offered ones): under
        GRAPH_RUNTIME_ONEDNN=on the last oneDNN one offered (a set lists its oneDNN candidates
        plainest first), else the choice's setting where it names one of names, else the forced
        candidate's otherwise where offered, else fallback; None: measure."""
        onednn = [name for name in names if self._by_name[name].onednn]
        if onednn and settings.word(settings.ONEDNN) == "on":
            return onednn[-1]
        forced = self.choice.forced()
        if forced is None or forced in names:
            return forced
        candidate = self._by_name.get(forced)
        if candidate is not None and candidate.otherwise in names:
            return candidate.otherwise
        return self.fallback

    def choose(self, names: Sequence[str], device: str, key: str,
               measure: Callable[[Race], Verdict], base: str) -> str:
        """The forced candidate, else the only one offered, else the remembered or measured one
        among names (offered(spec)), base kept unless another clearly gains what the speedup
        rule asks of its kind (_timing.speedups: one figure per challenger, so that candidates of
        several kinds race at once). measure: as Choice.choose's.
        """
        forced = self.forced(names)
        if forced is not None:
            return forced
        if len(names) == 1:
            return names[0]
        kind = {name: self._by_name[name].kind for name in names}
        speedup = speedups(kind[base], {name: kind[name] for name in names if name != base})
        return self.choice.choose(device, key, names, measure, base, speedup)

    def first(self, names: Sequence[str]) -> str:
        """The forced candidate, else the first offered (names: offered(spec)), unmeasured: for
        a set whose candidates are not raced (oneDNN's int8 kernels against the exact float64
        references they replace, onednn/choice.py)."""
        forced = self.forced(names)
        return names[0] if forced is None else forced

    def build(self, name: str, spec: Spec) -> Any:
        """The kernel of candidate name (which must apply to spec)."""
        make = self._by_name[name].build
        assert make is not None, f"{self.choice.name}: {name} is built by its op"
        return make(spec)
