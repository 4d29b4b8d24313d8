"""Sessions: a compiled model resident on the CPU reference VM or the GPU megakernel, generating tokens."""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import Any, Iterable, Iterator, Mapping, Sequence

from . import _loom
from .errors import InvalidArgumentError, check_int
from .model import Model
from .progress import progress_bars
from .schedule import Schedule, _model_and_backend, compile as _compile



@dataclasses.dataclass
class Generation:
    """What ``Session.generate`` returns."""

    prompt_ids: list[int]
    new_ids: list[int]  # the generated tokens, up to and including a stop token
    text: str | None  # the generated text (None without a tokenizer)
    prompt_ms: float  # consuming the prompt: the prefill pass (or steps), kernel time on the GPU
    ms_per_token: float  # the decode steps after the first new token
    used_prefill: bool  # whether one prefill pass consumed the prompt (else why not: Session.prefill_note)
    # Time to first token as felt: wall clock from the prompt's ids to the first new token on the host, the pass's
    # lowering (a prompt length not seen before: ``lower_ms``), its upload, launch and kernel all counted.
    ttft_ms: float = 0.0
    lower_ms: float = 0.0

    @property
    def ids(self) -> list[int]:
        """Prompt and generated tokens."""
        return self.prompt_ids + self.new_ids


@dataclasses.dataclass
class Token:
    """One token of ``Session.stream``: its id and its text (empty without a tokenizer)."""

    id: int
    text: str


class Session:
    """A schedule resident on a backend: ``"cpu"`` (the reference VM: exact float32, slow), ``"gpu"`` (the
    persistent megakernel on a Hopper GPU) or ``"auto"`` (the GPU when there is one).

    ``Session(schedule)`` runs a schedule compiled in this process (it knows its model); ``Session(model)``
    compiles with default options first; a schedule read from a file needs ``model=`` with its weights. Close
    it (or use it as a context manager) to free its memory at once; a closed session raises on every call.
    Threads may share a session: generations run one at a time (a ``stream`` holds the session until it ends).
    ``lower_ahead`` (default: on the GPU) lowers every prompt bucket's prefill pass in a background thread from
    the start, so that a prompt length's first generation waits for no lowering (``Generation.lower_ms`` 0).
    """

    def __init__(self, schedule: Schedule | Model, backend: str = "auto", *, model: Model | None = None,
                 progress: bool = True, lower_ahead: bool | None = None) -> None:
        if isinstance(schedule, Model):
            model, schedule = schedule, _compile(schedule)
        if not isinstance(schedule, Schedule):
            raise TypeError(f"Session() takes a loom.Schedule or loom.Model, not {type(schedule).__name__}")
        model, backend = _model_and_backend(schedule, model, backend)
        self.model = model
        self.schedule = schedule
        self._lock = threading.RLock()  # one generation at a time: start, steps and reading the tokens together
        with progress_bars(progress):
            self._native = _loom.Session(model._native, schedule._native, backend)
        if lower_ahead if lower_ahead is not None else self._native.backend == "gpu":
            self._native.lower_ahead()

    # -- state ---------------------------------------------------------------------------------------------------
    @property
    def backend(self) -> str:
        return self._native.backend

    @property
    def tokens(self) -> list[int]:
        """The prompt followed by every token generated since the last generate/stream/start."""
        return list(self._native.tokens)

    @property
    def prefill_note(self) -> str:
        """Why the last prompt was consumed token by token ("" when one prefill pass took it)."""
        return self._native.prefill_note

    def wait_lowered_ahead(self) -> int:
        """Blocks until the passes ``lower_ahead`` started lowering are all lowered; returns how many it lowered
        (0 without ``lower_ahead``, on a schedule without prefill weights, or for a model that takes no buckets)."""
        return int(self._native.wait_lowered_ahead())

    def close(self) -> None:
        """Frees the session's memory now; a generation in another thread ends first, a later call raises."""
        self._native.close()

    @property
    def closed(self) -> bool:
        return self._native.closed

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        if self.closed:
            return "loom.Session(closed)"
        return f"loom.Session({self.model.spec!r} on {self.backend}, position {self._native.position})"

    # -- generating ----------------------------------------------------------------------------------------------
    def encode(self, prompt: Any, *, chat: bool = False) -> list[int]:
        """Token ids of a prompt: ids as given; text through the model folder's tokenizer; with ``chat`` (or a
        list of {"role", "content"} messages) through its chat template first."""
        messages = None
        if isinstance(prompt, str):
            if chat:
                messages = [{"role": "user", "content": prompt}]
        elif isinstance(prompt, Sequence) and prompt and isinstance(prompt[0], Mapping):
            messages = list(prompt)
        else:
            if not isinstance(prompt, Iterable):
                raise InvalidArgumentError(
                    "prompt: token ids (a list of ints), text, or chat messages ({'role', 'content'} dicts)")
            # Token ids are integers: a float (even 3.0) is refused, not truncated; the vocabulary is checked by
            # the runtime.
            try:
                ids = [check_int(t, f"token {i}") for i, t in enumerate(prompt)]
            except InvalidArgumentError as e:
                raise InvalidArgumentError(
                    f"prompt: token ids (a list of ints), text, or chat messages ({{'role', 'content'}} dicts): {e}"
                ) from None
            if not ids:
                raise InvalidArgumentError("the prompt needs at least one token")
            return ids
        text = self.model.text
        if text is None:
            raise InvalidArgumentError(
                f"text prompts need the model folder's tokenizer.json; {self.model.spec} has none: pass token ids")
        if messages is not None:
            return text.encode(text.apply_chat_template(messages), add_special_tokens=False)
        return text.encode(prompt)

    def decode(self, ids: Sequence[int]) -> str:
        text = self.model.text
        if text is None:
            raise InvalidArgumentError(f"{self.model.spec} has no tokenizer: there is no text to decode")
        return text.decode(ids)

    def _stops(self, stop: Sequence[int] | None) -> set[int]:
        if stop is not None:
            return {int(t) for t in stop}
        return set(self.model.text.eos_token_ids) if self.model.text is not None else set()

    def generate(self, prompt: Any, max_new_tokens: int = 32, *, chat: bool = False,
                 stop: Sequence[int] | None = None, prefill: bool = True) -> Generation:
        """Consumes ``prompt`` (one prefill pass where the schedule has one) and generates up to
        ``max_new_tokens`` greedily, all decode steps in one kernel launch on the GPU. Generation ends at the
        first stop token (``stop``; default: the model's end-of-sequence tokens, none for random models); the
        steps after it are computed and dropped."""
        max_new_tokens = check_int(max_new_tokens, "max_new_tokens", low=-2**63)
        if max_new_tokens < 1:
            raise InvalidArgumentError(f"max_new_tokens must be >= 1, not {max_new_tokens}")
        ids = self.encode(prompt, chat=chat)
        native = self._native
        stops = self._stops(stop)
        steps = max_new_tokens - 1
        with self._lock:
            native.start(ids, prefill)
            prompt_ms, ttft_ms, lower_ms = native.prompt_ms, native.ttft_ms, native.pass_lower_ms
            new = list(native.tokens)[len(ids):]
            stepped = steps > 0 and not (stops and new[0] in stops)
            if stepped:
                native.step(steps)
                new = list(native.tokens)[len(ids):]
            ms_per_token = native.step_ms / steps if stepped else 0.0
            used_prefill = native.used_prefill
        for i, t in enumerate(new):
            if t in stops:
                new = new[: i + 1]
                break
        text = self.model.text.decode(new) if self.model.text is not None else None
        return Generation(ids, new, text, prompt_ms, ms_per_token, used_prefill, ttft_ms, lower_ms)

    def stream(self, prompt: Any, max_new_tokens: int = 32, *, chat: bool = False,
               stop: Sequence[int] | None = None, prefill: bool = True) -> Iterator[Token]:
        """As ``generate``, yielding each token as it is made (one kernel launch per token on the GPU)."""
        max_new_tokens = check_int(max_new_tokens, "max_new_tokens", low=-2**63)
        if max_new_tokens < 1:
            raise InvalidArgumentError(f"max_new_tokens must be >= 1, not {max_new_tokens}")
        ids = self.encode(prompt, chat=chat)
        native = self._native
        stops = self._stops(stop)
        text = self.model.text
        new: list[int] = []
        shown = ""
        with self._lock:
            native.start(ids, prefill)
            for i in range(max_new_tokens):
                if i > 0:
                    native.step(1)
                token = int(native.tokens[-1])
                new.append(token)
                piece = ""
                if text is not None:  # the text so far, minus what was shown: multi-token characters come whole
                    full = text.decode(new)
                    piece, shown = full[len(shown):], full
                yield Token(token, piece)
                if token in stops:
                    return

    def start(self, prompt: Any, *, chat: bool = False, prefill: bool = True, keep_logits: bool = False) -> int:
        """Loads and consumes a prompt; returns the first new token (then ``step`` for more). ``keep_logits``:
        ``kept_logits()`` then holds every step's logits from the prompt's first position on (what ``loom run
        --logits_out`` writes; the prefill pass computes every prompt row's, steps run one a launch)."""
        ids = self.encode(prompt, chat=chat)
        with self._lock:
            self._native.start(ids, prefill, keep_logits)
            return int(self._native.tokens[-1])

    def kept_logits(self) -> Any:
        """Every step's logits since a ``start(keep_logits=True)``: a numpy array [steps, vocab], one row per position
        from the prompt's first (row i chose token i + 1); empty without ``keep_logits``."""
        with self._lock:
            return self._native.kept_logits()

    def step(self, n: int = 1) -> list[int]:
        """Generates ``n`` more tokens; returns them."""
        n = check_int(n, "n")
        with self._lock:
            before = self._native.position
            self._native.step(n)
            return list(self._native.tokens)[before + 1:]

    def logits(self) -> Any:
        """The last step's logits [vocab]: on the GPU a torch tensor on the device that shares the megakernel's
        memory (DLPack, no copy; valid until the next call that runs the model), or the DLPack-capable array
        itself without torch; on the CPU a numpy array (a copy)."""
        if self.backend == "gpu":
            view = self._native.logits_device()
            try:
                import torch
            except ImportError:
                return view
            return torch.from_dlpack(view)
        return self._native.logits_host()

    def trace(self, steps: int = 8, json_path: str | os.PathLike[str] = "loom_trace.json",
              png_path: str | os.PathLike[str] | None = None, *, steps_per_launch: int = 0) -> str:
        """GPU: runs ``steps`` decode steps timing every instruction (in launches of ``steps_per_launch``; 0: one);
        writes the Chrome/Perfetto trace JSON (one track per SM) and, with ``png_path``, a timeline picture; returns
        the summary (time per opcode, gaps)."""
        summary = self._native.trace_steps(check_int(steps, "steps"), os.fspath(json_path),
                                           check_int(steps_per_launch, "steps_per_launch"))
        if png_path is not None:
            from .trace import render_png

            render_png(json_path, png_path, title=f"{self.model.spec}: {steps} decode steps")
        return summary
