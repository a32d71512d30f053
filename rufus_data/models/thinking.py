"""Thinking modes of hybrid reasoning models: which switch a chat template reads, and a requested
mode (`thinking: on | off | default`) applied the way that family expects.

Two switches exist, told apart from the template text:
- `enable_thinking`: a template variable (Qwen3, GLM-4.5, Gemma 4, Nemotron 3): passed as a
  chat-template keyword (apply_chat_template's kwargs; vLLM's `chat_template_kwargs`; lm-eval's
  `chat_template_args`).
- `system_flag`: `/think` or `/no_think` at the end of the system message (SmolLM3): the template
  reads the word and strips it, so the flag goes into the messages themselves.
`default` changes nothing and asks nothing of the template; `on`/`off` of a template with neither
switch is refused (the model would silently answer in its own default mode)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from rufus_data.base.errors import RufusError
from rufus_data.models.chat_template import template_name

ThinkingMode = Literal["on", "off", "default"]
Switch = Literal["enable_thinking", "system_flag"]
MODES = ("on", "off", "default")


def yaml_thinking_mode(value):
    """`thinking: off` in YAML reads as false (YAML 1.1 booleans): the mode the user wrote."""
    return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value
FLAGS = {"on": "/think", "off": "/no_think"}
ENABLE_THINKING = re.compile(r"\benable_thinking\b")
NO_THINK_FLAG = "/no_think"  # not `/think`: every `</think>` contains that
THINKING_HELP = ("hybrid reasoning models: `on` or `off` sets the mode through the switch the chat template reads "
                 "(Qwen3's `enable_thinking`, SmolLM3's /think and /no_think system flags); `default`: the template's own")


def thinking_switch(template: str | dict | None) -> Switch | None:
    """The switch a chat template reads (None: neither)."""
    if isinstance(template, dict):  # named variants: `default` is the one a chat renders with
        template = template.get("default")
    if not template:
        return None
    if ENABLE_THINKING.search(template):
        return "enable_thinking"
    if NO_THINK_FLAG in template:
        return "system_flag"
    return None


@dataclass(frozen=True)
class Thinking:
    """A thinking mode resolved for one template: what it adds to the messages and to the template's kwargs."""

    mode: ThinkingMode = "default"
    switch: Switch | None = None

    def messages(self, messages: list[dict]) -> list[dict]:
        """The messages as this mode renders them: for system flags, the system message ends with the
        mode's flag (any flag it held replaced; a system message holding only the flag when there is none)."""
        if self.mode == "default" or self.switch != "system_flag":
            return messages
        flag = FLAGS[self.mode]
        if messages and messages[0].get("role") == "system":
            words = [w for w in str(messages[0].get("content") or "").split(" ") if w not in FLAGS.values()]
            text = " ".join(words).rstrip()
            return [{**messages[0], "content": f"{text} {flag}" if text else flag}, *messages[1:]]
        return [{"role": "system", "content": flag}, *messages]

    def template_kwargs(self) -> dict:
        """Keywords the chat template renders with (apply_chat_template's kwargs)."""
        if self.mode == "default" or self.switch != "enable_thinking":
            return {}
        return {"enable_thinking": self.mode == "on"}

    def system_instruction(self, system: str | None) -> str | None:
        """A system prompt (an eval suite's) with this mode's flag, as `messages` would set it."""
        if self.switch != "system_flag" or self.mode == "default":
            return system
        return self.messages([{"role": "system", "content": system or ""}])[0]["content"]

    def record(self) -> dict:
        return {"mode": self.mode, "switch": self.switch}


def decide_thinking(template: str | dict | None, mode: str, owner: str) -> Thinking:
    """`mode` for a template (`owner` names its model in the error): refused when the mode is
    unknown, or when `on`/`off` is asked of a template with no switch."""
    if mode not in MODES:
        raise RufusError(f"{owner}: thinking {mode!r} is not a mode: give on, off or default")
    switch = thinking_switch(template)
    if mode != "default" and switch is None:
        name = template_name(template.get("default") if isinstance(template, dict) else template) if template else "none"
        raise RufusError(f"{owner}: `thinking: {mode}` was asked, but its chat template ({name}) has no thinking "
                         "switch (neither an `enable_thinking` variable, as Qwen3's, nor /think and /no_think "
                         "system flags, as SmolLM3's), so the mode cannot reach the model: set `thinking: default`, "
                         "or give a hybrid reasoning model (or `chat_template:`) that has one")
    return Thinking(mode, switch)  # type: ignore[arg-type]


def model_thinking(model, mode: str) -> Thinking:
    """`mode` for a model reference (built-in, folder, hub id, run): its tokenizer's template is
    read only when a mode is asked; one that cannot be read here is refused."""
    if mode == "default":
        return Thinking()
    from rufus_data.models.reference import ModelRef

    ref = ModelRef.of(model)
    try:
        from transformers import AutoTokenizer  # heavy: only when a mode is asked

        template = AutoTokenizer.from_pretrained(ref.folder()).chat_template
    except Exception as err:  # noqa: BLE001 - a served name without local files, a folder without a tokenizer
        raise RufusError(f"model {ref.text}: `thinking: {mode}` needs its chat template to tell which switch it reads, "
                         f"and its tokenizer could not be loaded here ({str(err).splitlines()[0][:160]}): give a local "
                         "folder or hub id (--tokenizer for a server), or set `thinking: default`") from None
    return decide_thinking(template, mode, f"model {ref.text}")
