"""Device choice and seeded generators, in one place."""

from __future__ import annotations

import logging

import numpy as np
import torch

logger = logging.getLogger("datamask")

__all__ = ["resolve_device", "make_generators"]


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` -> cuda when available, else cpu; ``"cuda:N"`` checked to exist."""
    if isinstance(device, torch.device):
        return device
    name = str(device).strip().lower()
    if name == "auto":
        chosen = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        logger.info("device=auto -> %s (cuda available: %s)", chosen, torch.cuda.is_available())
        return chosen
    if name == "cpu":
        return torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} was asked for but CUDA is not available here.")
        dev = torch.device(name)
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(
                f"device {device!r} does not exist; this machine has "
                f"{torch.cuda.device_count()} CUDA device(s)."
            )
        return dev
    raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N'; got {device!r}.")


def make_generators(seed: int, device: torch.device) -> tuple[torch.Generator, np.random.Generator]:
    """One torch generator on ``device`` and one numpy generator, both from ``seed``."""
    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed))
    return gen, np.random.default_rng(int(seed))
