"""Text in and out: a Hugging Face folder's own tokenizer (tokenizer.json, through the ``tokenizers`` library),
its chat template (tokenizer_config.json, rendered with ``jinja2`` as transformers does) and its end-of-sequence
tokens (generation_config.json or config.json)."""

from __future__ import annotations

import json
import os
from typing import Any, Mapping, Sequence

from . import _loom
from .errors import InvalidArgumentError


class TextCodec:
    """Encodes prompts and decodes tokens with a model folder's tokenizer; renders its chat template."""

    def __init__(self, tokenizer: Any, chat_template: str | None, special: Mapping[str, str],
                 eos_token_ids: Sequence[int]) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.special = dict(special)
        self.eos_token_ids = list(eos_token_ids)

    @staticmethod
    def from_folder(folder: str) -> "TextCodec | None":
        """The folder's tokenizer, or None when it has no tokenizer.json (then prompts are token ids)."""
        path = os.path.join(folder, "tokenizer.json")
        if not os.path.isfile(path):
            return None
        from tokenizers import Tokenizer

        try:
            tokenizer = Tokenizer.from_file(path)
        except Exception as e:  # the library's own exception types vary between versions
            raise InvalidArgumentError(f"{path}: not a tokenizer the tokenizers library reads ({e})") from None
        config = _read_json(os.path.join(folder, "tokenizer_config.json"))
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        special = {}
        for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
            value = config.get(key)
            if isinstance(value, dict):
                value = value.get("content")
            if isinstance(value, str):
                special[key] = value
        eos: list[int] = []
        for name in ("generation_config.json", "config.json"):
            value = _read_json(os.path.join(folder, name)).get("eos_token_id")
            if value is not None:
                eos = [int(v) for v in (value if isinstance(value, list) else [value])]
                break
        if not eos and "eos_token" in special:
            token = tokenizer.token_to_id(special["eos_token"])
            eos = [token] if token is not None else []
        return TextCodec(tokenizer, template if isinstance(template, str) else None, special, eos)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def apply_chat_template(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True) -> str:
        """The conversation as the model was trained to read it (the folder's chat template)."""
        if self.chat_template is None:
            raise InvalidArgumentError("the model folder's tokenizer_config.json has no chat_template")
        import jinja2.sandbox

        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

        def raise_exception(message: str) -> None:
            raise InvalidArgumentError(f"chat template: {message}")

        env.globals["raise_exception"] = raise_exception
        try:
            template = env.from_string(self.chat_template)
            return template.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                   **self.special)
        except jinja2.TemplateError as e:
            raise InvalidArgumentError(f"chat template: {e}") from None


def _read_json(path: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, ValueError) as e:
        raise InvalidArgumentError(f"{path}: {e}") from None
    return value if isinstance(value, dict) else {}
