"""Loading datasets from the HuggingFace hub without hanging on a dead network.

`datasets.load_dataset` retries an unreachable hub for half a minute and logs a dozen lines before it fails.
So the hub is asked once, with a short timeout, whether it answers; when it does not, the dataset is loaded in
offline mode: from the local cache when a run downloaded it before, else one clear failure within seconds.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator

PROBE_SECONDS = 5.0


@functools.cache
def hub_answers() -> bool:
    """Whether the hub answers an HTTP request within PROBE_SECONDS (False in offline mode)."""
    from huggingface_hub import constants, get_session

    if constants.is_offline_mode() or os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE"):
        return False
    try:
        get_session().head(constants.ENDPOINT, timeout=PROBE_SECONDS)
    except Exception:  # no network, DNS, proxy, TLS: the hub cannot be used
        return False
    return True


@contextlib.contextmanager
def offline_unless_reachable() -> Iterator[bool]:
    """Within the block the hub libraries work offline (cache only) when the hub does not answer; yields
    whether it answered."""
    import datasets
    from huggingface_hub import constants

    if hub_answers():
        yield True
        return
    saved = constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = datasets.config.HF_HUB_OFFLINE = True
    try:
        yield False
    finally:
        constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE = saved


def stay_offline() -> None:
    """The hub libraries work offline (cache only) for the rest of the process: after the hub did not answer, a
    model read from the cache is read from it again without half a minute of retries per file."""
    import datasets
    from huggingface_hub import constants

    constants.HF_HUB_OFFLINE = datasets.config.HF_HUB_OFFLINE = True


def load_hub_dataset(*args, **kwargs):
    """`datasets.load_dataset(*args, **kwargs)`, offline when the hub does not answer (see the module)."""
    import datasets

    with offline_unless_reachable():
        return datasets.load_dataset(*args, **kwargs)
