"""A step-time profile by context level: the levels its cells were measured at, the profile of one
level, and one level's step-time surface. A profile measured without levels has one, the plan's
``prompt_tokens``; its per-(k, B) views (``StepTimeProfile.estimates`` and the others) read the
lowest level of a profile that holds several (``core.steptime.lowest_context``)."""

from __future__ import annotations

import dataclasses

from tabletune_pipelines.core.noise import NoisySurface
from tabletune_pipelines.core.steptime import StepTimes
from tabletune_pipelines.errors import DocumentError
from tabletune_pipelines.formats.documents import StepTimeProfile

__all__ = ["at_context", "context_levels", "level_step_times"]


def context_levels(profile: StepTimeProfile) -> list[int]:
    """The context levels of the profile's cells, ascending (one for a profile without levels)."""
    return sorted({c.context_tokens for c in profile.cells})


def at_context(profile: StepTimeProfile, level: int) -> StepTimeProfile:
    """The profile of one context level: its cells alone; the mixed-step samples (measured at the
    first level) go with the lowest level. ``DocumentError`` naming the level when it has no cells."""
    levels = context_levels(profile)
    if level not in levels:
        raise DocumentError(f"step-time profile of {profile.identity.key}: no cells at context {level}; it has "
                            f"{levels}")
    return dataclasses.replace(profile, cells=tuple(c for c in profile.cells if c.context_tokens == level),
                               samples=profile.samples if level == levels[0] else ())


def level_step_times(profile: StepTimeProfile) -> StepTimes:
    """T(B, k) of a one-level profile's all-rejected cells with their errors over B = 1..max_num_seqs
    (``core.noise.NoisySurface.step_times``; the lowest level of a profile with several)."""
    return NoisySurface.from_cells(profile.estimates("reject")).step_times(profile.identity.max_num_seqs)
