"""The first transformers release that declared an expert-parallel plan for each model type, as read from the
releases' own configuration sources by ep_plan_history.py into ep_plan_history.json (the cache this module reads;
regenerate it with `python tests/gpu/models/ep_plan_history.py --regenerate`)."""

from __future__ import annotations

import functools
import json

from models.ep_plan_history import HISTORY_PATH


@functools.cache
def history() -> dict:
    """{"generated_from": [releases read, oldest first], "first_release": {model_type: release}}."""
    return json.loads(HISTORY_PATH.read_text())


def first_ep_release(model_type: str) -> str | None:
    """The first release whose configuration class for `model_type` declares a non-empty `base_model_ep_plan`;
    None for a model type no release read declares one for."""
    return history()["first_release"].get(model_type)


def releases_read() -> list[str]:
    return list(history()["generated_from"])
