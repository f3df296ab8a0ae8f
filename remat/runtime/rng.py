"""Random-number state for checkpointed regions and model-parallel streams, on CPU and CUDA alike.

A checkpointed region re-runs its forward in backward; its random ops (dropout) must draw the same numbers again.
`snapshot` records the generator states a region starts from and `replay` runs code from them, leaving the
generators as it found them. `RNGStatesTracker` keeps named streams (one per model-parallel purpose) that code enters
with `fork(name)`; a region's snapshot includes the tracker's streams too, so dropout inside a fork replays as well.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterable, Iterator, Mapping

import torch

MODEL_PARALLEL_RNG = "model-parallel-rng"


def default_device() -> torch.device:
    """The device whose generator the tracker forks: the current CUDA device if there is one, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def get_state(device: torch.device) -> torch.Tensor:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_rng_state(device)
    return torch.get_rng_state()


def set_state(state: torch.Tensor, device: torch.device) -> None:
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.set_rng_state(state, device)
    else:
        torch.set_rng_state(state)


def manual_seed(seed: int, device: torch.device) -> None:
    """Seed only `device`'s default generator (torch.manual_seed would seed every device)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.manual_seed(seed)
    else:
        torch.default_generator.manual_seed(seed)


def seeded_state(seed: int, device: torch.device) -> torch.Tensor:
    """The generator state `seed` gives on `device`, computed without touching the default generator."""
    return torch.Generator(device=device).manual_seed(seed).get_state()


class RNGStatesTracker:
    """Named random streams, each entered with `fork(name)`; the default stream continues untouched outside.

    `add(name, seed)` creates a stream; seeds and names must be unique. `get_states`/`set_states` copy the streams'
    states out and back (a checkpointed region does so to replay the streams in backward).
    """

    def __init__(self, device: torch.device | str | None = None) -> None:
        self.device = torch.device(device) if device is not None else default_device()
        self.reset()

    def reset(self) -> None:
        self.states_: dict[str, torch.Tensor] = {}
        self.seeds_: set[int] = set()

    def get_states(self) -> dict[str, torch.Tensor]:
        return dict(self.states_)

    def set_states(self, states: Mapping[str, torch.Tensor]) -> None:
        self.states_ = dict(states)

    def add(self, name: str, seed: int) -> None:
        if seed in self.seeds_:
            raise ValueError(
                f"add(name={name!r}, seed={seed}): seed {seed} is already used by another stream; "
                "give each stream its own seed"
            )
        if name in self.states_:
            raise ValueError(
                f"add(name={name!r}, seed={seed}): a stream named {name!r} already exists; "
                "call reset() first or pick another name"
            )
        self.seeds_.add(seed)
        self.states_[name] = seeded_state(seed, self.device)

    @contextlib.contextmanager
    def fork(self, name: str = MODEL_PARALLEL_RNG) -> Iterator[None]:
        """Draw from stream `name` inside the block; the default stream resumes where it was afterwards."""
        if name not in self.states_:
            known = ", ".join(map(repr, self.states_)) or "none"
            raise ValueError(
                f"fork(name={name!r}): no stream of that name (streams: {known}); create it with add(name, seed) first"
            )
        outside = get_state(self.device)
        set_state(self.states_[name], self.device)
        try:
            yield
        finally:
            self.states_[name] = get_state(self.device)
            set_state(outside, self.device)


TRACKER = RNGStatesTracker()
"""The process's tracker: `remat.checkpointing.get_cuda_rng_tracker()` returns it."""


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """Generator states a region started from: one per device, plus the tracker's streams."""

    devices: tuple[tuple[torch.device, torch.Tensor], ...]
    streams: Mapping[str, torch.Tensor]


def snapshot(devices: Iterable[torch.device]) -> Snapshot:
    """The states of the CPU generator and of each CUDA device in `devices`."""
    wanted = {torch.device("cpu")} | {torch.device(d) for d in devices if torch.device(d).type == "cuda"}
    ordered = sorted(wanted, key=str)
    return Snapshot(tuple((d, get_state(d)) for d in ordered), TRACKER.get_states())


@contextlib.contextmanager
def replay(snap: Snapshot) -> Iterator[None]:
    """Run the block from the generator states of `snap`; every generator and stream is restored afterwards."""
    current = [(d, get_state(d)) for d, _ in snap.devices]
    streams = TRACKER.get_states()
    for device, state in snap.devices:
        set_state(state, device)
    TRACKER.set_states(snap.streams)
    try:
        yield
    finally:
        for device, state in current:
            set_state(state, device)
        TRACKER.set_states(streams)
