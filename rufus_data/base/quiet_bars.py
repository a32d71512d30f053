"""Third-party progress bars off a terminal. Transformers' Trainer and model loading, datasets',
the hub's and lm-eval's draw tqdm bars; into a file or pipe each redraw is another line, mixed
with Rufus's own progress lines (console.py). So when stderr (where the bars go) is no terminal,
each CLI turns them off when it starts (cli_options.CliApp), through the switches tqdm, the hub
and datasets read when first imported (and so the processes a command starts: accelerate,
lm-eval workers), and by telling the libraries loaded already. What passes tqdm's `disable`
itself asks `bars_off()`: the Trainer (trl_args) and lm-eval's HF model (lm_eval_models). A
switch the user set (TQDM_DISABLE=0) is kept."""

from __future__ import annotations

import os
import sys

BAR_SWITCHES = {"TQDM_DISABLE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}


def quiet_bars_off_a_terminal(stream=None) -> bool:
    """Turn third-party bars off where `stream` (stderr) is no terminal; whether they are off now."""
    stream = sys.stderr if stream is None else stream
    if not _is_terminal(stream):
        for name, value in BAR_SWITCHES.items():
            os.environ.setdefault(name, value)
        if bars_off():
            _quiet_loaded_libraries()
    return bars_off()


def bars_off() -> bool:
    """Whether third-party bars are off (for a caller that passes tqdm's `disable` itself, as lm-eval does)."""
    return os.environ.get("TQDM_DISABLE", "").strip().lower() in ("1", "true", "yes")


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def _quiet_loaded_libraries() -> None:
    """Libraries imported already (an in-process caller) read the switches at import: tell them."""
    if "tqdm" in sys.modules:  # tqdm reads TQDM_DISABLE once, when imported: a bar made later still asks it
        _default_tqdm_off()
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    if "transformers" in sys.modules:
        from transformers.utils import logging

        logging.disable_progress_bar()
    if "datasets" in sys.modules:
        from datasets.utils import disable_progress_bars as disable_datasets_bars

        disable_datasets_bars()



def _default_tqdm_off() -> None:
    """Make `disable=True` tqdm's default, as TQDM_DISABLE at import would have (tqdm.utils.envwrap
    binds it to `__init__`); every tqdm class calls this one. A caller's own `disable` still wins."""
    from functools import partialmethod

    import tqdm.std

    init = tqdm.std.tqdm.__dict__["__init__"]
    bound = dict(getattr(init, "keywords", {}))
    if bound.get("disable") is not True:
        tqdm.std.tqdm.__init__ = partialmethod(getattr(init, "func", init), **{**bound, "disable": True})
