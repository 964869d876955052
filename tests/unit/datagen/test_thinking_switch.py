"""generate.thinking reaches the real chat templates of the role's families through the family's switch.

The templates are the models' own (fixtures/chat_template_*.jinja, provenance in fixtures/README.md); the switch
comes from the role's one family table (defaults/main.yml: sglang_datagen_parser_families), and the kwargs from
the pipeline's one function (``datagen.gen.settings.chat_template_kwargs``, through what generate sends and
what tokenize renders with). Rendered as transformers' ``apply_chat_template`` renders (sandboxed,
``trim_blocks``, ``lstrip_blocks``, ``loopcontrols``): a wrong switch name leaves the prompt as the template's
default, and the assertions on the generation prompt fail.
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict

import jinja2
import jinja2.ext
import jinja2.sandbox
import pytest
import yaml

from datagen.config import ConfigError
from datagen.gen.settings import settings_from_config
from datagen.tokenize import template_kwargs
from tests.support.paths import DATAGEN_FIXTURES, ROOT

FAMILIES = yaml.safe_load(open(os.path.join(ROOT, "roles", "sglang_datagen", "defaults", "main.yml")))[
    "sglang_datagen_parser_families"]
QUESTION = [{"role": "user", "content": "What is 2 + 2?"}]


def family_switch(model: str) -> str:
    """The family's switch as tasks/family.yml picks it: the first entry whose match is in the basename."""
    name = os.path.basename(model).lower()
    return next(f for f in FAMILIES if re.search(f["match"], name)).get("thinking", "")


def sent_kwargs(switch: str, thinking: bool) -> Dict[str, Any]:
    """What generate sends for that config, checked equal to what tokenize renders with."""
    raw = {"servers": ["http://127.0.0.1:30000"], "generate": {"thinking": thinking, "thinking_switch": switch}}
    kwargs = settings_from_config(raw).template_kwargs()
    assert template_kwargs(raw) == kwargs
    return kwargs


def render(template: str, **kwargs: Any) -> str:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[jinja2.ext.loopcontrols])
    text = (DATAGEN_FIXTURES / template).read_text(encoding="utf-8")
    return env.from_string(text).render(messages=QUESTION, add_generation_prompt=True, bos_token="<BOS>", **kwargs)


def generation_prompt(rendered: str) -> str:
    """What DeepSeek-V3.1's template puts after the last assistant tag (SGLang's copy is laid out over indented
    lines, which render as whitespace around the tags)."""
    return rendered.rsplit("<｜Assistant｜>", 1)[1].strip()


def test_deepseek_v31_thinks_exactly_when_generate_thinking_says():
    switch = family_switch("deepseek-ai/DeepSeek-V3.1")
    assert switch == "thinking"
    on = render("chat_template_deepseek_v31.jinja", **sent_kwargs(switch, True))
    off = render("chat_template_deepseek_v31.jinja", **sent_kwargs(switch, False))
    assert generation_prompt(on) == "<think>", on
    assert generation_prompt(off) == "</think>", off
    # the bug this guards against: Qwen3's kwarg leaves DeepSeek-V3.1 at its default, no thinking
    assert render("chat_template_deepseek_v31.jinja", enable_thinking=True) == off


def test_qwen3_thinks_exactly_when_generate_thinking_says():
    switch = family_switch("Qwen/Qwen3-8B")
    assert switch == "enable_thinking"
    on = render("chat_template_qwen3.jinja", **sent_kwargs(switch, True))
    off = render("chat_template_qwen3.jinja", **sent_kwargs(switch, False))
    assert on == "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n", repr(on)
    assert off == on + "<think>\n\n</think>\n\n", repr(off)  # the empty think block: no thinking
    # Qwen3 thinks by default: DeepSeek's kwarg would not switch it off
    assert render("chat_template_qwen3.jinja", thinking=False) == on


@pytest.mark.parametrize("switch, thinking, kwargs", [
    ("enable_thinking", False, {"enable_thinking": False}),  # the default, as before: always explicit
    ("thinking", True, {"thinking": True}),
    ("none", False, {}),  # no switch in the template: nothing to send
    ("always", True, {}),
])
def test_only_the_templates_own_switch_is_sent(switch, thinking, kwargs):
    assert sent_kwargs(switch, thinking) == kwargs


def test_the_default_switch_is_qwen3s():
    raw = {"servers": ["http://127.0.0.1:30000"], "generate": {"thinking": True}}
    assert settings_from_config(raw).template_kwargs() == template_kwargs(raw) == {"enable_thinking": True}


@pytest.mark.parametrize("generate, key, says", [
    ({"thinking": True, "thinking_switch": "none"}, "generate.thinking", "has no thinking switch"),
    ({"thinking_switch": "always"}, "generate.thinking", "always thinks"),
    ({"thinking_switch": "enable-thinking"}, "generate.thinking_switch", "expected the chat template's thinking kwarg"),
    ({"thinking_switch": ""}, "generate.thinking_switch", "expected the chat template's thinking kwarg"),
    ({"thinking_switch": "thinking", "chat_template_kwargs": {"thinking": True}},
     "generate.chat_template_kwargs.thinking", "move it to generate.thinking (sent as thinking"),
    # the other family's name would be ignored by the template: refused too
    ({"thinking_switch": "thinking", "chat_template_kwargs": {"enable_thinking": True}},
     "generate.chat_template_kwargs.enable_thinking", "set through generate.thinking"),
])
def test_a_thinking_the_template_cannot_follow_is_refused(generate, key, says):
    with pytest.raises(ConfigError) as err:
        settings_from_config({"servers": ["http://127.0.0.1:30000"], "generate": generate})
    assert str(err.value).startswith(key + ":") or f"\n  {key}:" in str(err.value), str(err.value)
    assert says in str(err.value)
