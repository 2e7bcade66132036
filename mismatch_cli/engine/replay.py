"""The replayed trainers' accumulators, found by the class of the settings their family resolves.

Each trainer's formulas live in its own module (`engine/trl.py`, ...); this map is the only place
that lists them, keyed by settings type so the engine never compares a family's name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from mismatch_cli.correction.areal import ArealSpec
from mismatch_cli.correction.miles import MilesMisSpec, MilesSpec
from mismatch_cli.correction.ms_swift import MsSwiftSpec
from mismatch_cli.correction.nemo_rl import NemoRlSpec
from mismatch_cli.correction.openrlhf import OpenrlhfSpec
from mismatch_cli.correction.prime_rl import PrimeRlSpec
from mismatch_cli.correction.skyrl import SkyrlSpec
from mismatch_cli.correction.slime import SlimeMisSpec, SlimeSpec
from mismatch_cli.correction.trl import TrlSpec
from mismatch_cli.engine.areal import ArealAccumulator
from mismatch_cli.engine.core.protocol import Accumulator
from mismatch_cli.engine.miles import MilesAccumulator, MilesMisAccumulator
from mismatch_cli.engine.ms_swift import MsSwiftAccumulator
from mismatch_cli.engine.nemo_rl import NemoRlAccumulator
from mismatch_cli.engine.openrlhf import OpenrlhfAccumulator
from mismatch_cli.engine.prime_rl import PrimeRlAccumulator
from mismatch_cli.engine.skyrl import SkyrlAccumulator
from mismatch_cli.engine.slime import SlimeAccumulator, SlimeMisAccumulator
from mismatch_cli.engine.trl import TrlAccumulator

ACCUMULATORS: dict[type, Callable[[Any, torch.device], Accumulator]] = {
    TrlSpec: TrlAccumulator,
    NemoRlSpec: NemoRlAccumulator,
    SkyrlSpec: SkyrlAccumulator,
    PrimeRlSpec: PrimeRlAccumulator,
    SlimeSpec: SlimeAccumulator,
    SlimeMisSpec: SlimeMisAccumulator,
    OpenrlhfSpec: OpenrlhfAccumulator,
    ArealSpec: ArealAccumulator,
    MsSwiftSpec: MsSwiftAccumulator,
    MilesSpec: MilesAccumulator,
    MilesMisSpec: MilesMisAccumulator,
}


def trainer_accumulator(settings: Any, device: torch.device) -> Accumulator | None:
    """The accumulator of a replayed trainer's resolved settings (None when the trainer logs nothing)."""
    if settings is None:
        return None
    return ACCUMULATORS[type(settings)](settings, device)
