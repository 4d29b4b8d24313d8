"""Sessions on the CPU reference VM (GPU cases skip without a GPU): generation against the C++ CLI, streaming,
logits, errors, closed sessions."""

from __future__ import annotations

import os

import numpy as np
import pytest

import loom
from conftest import gpu_or_skip, run_cli


def cli_tokens(*flags: str) -> list[int]:
    r = run_cli("run", "--model=random:tiny", "--max_seq=64", "--backend=cpu", *flags)
    assert r.returncode == 0, r.stderr
    line = next(l for l in r.stdout.splitlines() if l.startswith("tokens:"))
    return [int(t) for t in line.split()[1:]]


@pytest.mark.parametrize("prefill", [True, False])
def test_generate_matches_the_cli(tiny_schedule, prefill):
    session = loom.Session(tiny_schedule, backend="cpu")
    out = session.generate([5, 17, 42, 7], max_new_tokens=10, prefill=prefill)
    assert out.new_ids == cli_tokens("--prompt=5,17,42,7", "--tokens=10", f"--prefill={str(prefill).lower()}")
    assert out.prompt_ids == [5, 17, 42, 7]
    assert out.ids == out.prompt_ids + out.new_ids
    assert out.used_prefill == prefill
    assert out.text is None
    assert session.tokens == out.ids


@pytest.mark.parametrize("prefill", [True, False])
def test_kept_logits_are_what_the_cli_writes(tiny_schedule, tmp_path, prefill):
    # loom run --logits_out and Session.start(keep_logits=True) are one code path (runtime::Session): bitwise equal.
    path = tmp_path / "logits.bin"
    r = run_cli("run", "--model=random:tiny", "--max_seq=64", "--num_sms=8", "--backend=cpu", "--prompt=5,17,42,7",
                "--tokens=4", f"--prefill={str(prefill).lower()}", f"--logits_out={path}")
    assert r.returncode == 0, r.stderr
    session = loom.Session(tiny_schedule, backend="cpu")
    session.start([5, 17, 42, 7], prefill=prefill, keep_logits=True)
    assert session.kept_logits().shape == (4, tiny_schedule.vocab_size)
    session.step(3)
    kept = session.kept_logits()
    assert kept.shape == (4 + 3, tiny_schedule.vocab_size) and kept.dtype == np.float32
    assert np.array_equal(kept, np.fromfile(path, dtype=np.float32).reshape(kept.shape))
    assert np.array_equal(kept[-1], session.logits())
    session.start([5, 17, 42, 7], prefill=prefill)
    assert session.kept_logits().shape == (0, tiny_schedule.vocab_size)


def test_session_from_a_model_compiles_with_defaults(tiny):
    session = loom.Session(tiny, backend="cpu")
    assert session.schedule.num_sms == 132
    assert len(session.generate([1, 2], max_new_tokens=3).new_ids) == 3


def test_stream_yields_what_generate_returns(tiny_schedule):
    session = loom.Session(tiny_schedule, backend="cpu")
    want = session.generate([3, 1, 4, 1, 5], max_new_tokens=6).new_ids
    got = [t.id for t in session.stream([3, 1, 4, 1, 5], max_new_tokens=6)]
    assert got == want
    assert all(t.text == "" for t in session.stream([3], max_new_tokens=2))


def test_stop_tokens_end_generation(tiny_schedule):
    session = loom.Session(tiny_schedule, backend="cpu")
    full = session.generate([9, 8, 7], max_new_tokens=8).new_ids
    stop = full[2]
    cut = session.generate([9, 8, 7], max_new_tokens=8, stop=[stop]).new_ids
    assert cut == full[: full.index(stop) + 1]
    streamed = [t.id for t in session.stream([9, 8, 7], max_new_tokens=8, stop=[stop])]
    assert streamed == cut


def test_generation_reports_time_to_first_token(tiny_schedule):
    session = loom.Session(tiny_schedule, backend="cpu")
    cold = session.generate([5, 6, 7, 8, 9, 10, 11], max_new_tokens=2)  # a prompt length not lowered before
    warm = session.generate([4, 3, 2, 1, 5, 6, 7], max_new_tokens=2)   # the same length: its pass is kept
    assert cold.used_prefill and warm.used_prefill
    assert cold.lower_ms > 0 and warm.lower_ms == 0
    for g in (cold, warm):
        assert g.ttft_ms >= g.prompt_ms + g.lower_ms > 0
    token_by_token = session.generate([5, 6, 7], max_new_tokens=1, prefill=False)
    assert token_by_token.lower_ms == 0 and token_by_token.ttft_ms >= token_by_token.prompt_ms > 0


def test_passes_lowered_ahead_make_a_first_length_warm(tiny_schedule):
    ahead = loom.Session(tiny_schedule, backend="cpu", lower_ahead=True)
    assert ahead.wait_lowered_ahead() >= 3  # buckets of 16, 32 and the rest of the cache
    first = ahead.generate([5, 6, 7, 8, 9, 10, 11], max_new_tokens=3)
    assert first.used_prefill and first.lower_ms == 0
    plain = loom.Session(tiny_schedule, backend="cpu")  # on the CPU: nothing lowered ahead by default
    assert plain.wait_lowered_ahead() == 0
    again = plain.generate([5, 6, 7, 8, 9, 10, 11], max_new_tokens=3)
    assert again.lower_ms > 0 and again.new_ids == first.new_ids


def test_start_and_step(tiny_schedule):
    session = loom.Session(tiny_schedule, backend="cpu")
    want = session.generate([2, 4, 6], max_new_tokens=5).new_ids
    first = session.start([2, 4, 6])
    assert [first] + session.step(2) + session.step(2) == want


def test_logits_are_the_last_steps(tiny_schedule):
    session = loom.Session(tiny_schedule, backend="cpu")
    out = session.generate([11, 12, 13], max_new_tokens=4)
    logits = session.logits()
    assert isinstance(logits, np.ndarray) and logits.shape == (tiny_schedule.vocab_size,)
    assert logits.dtype == np.float32 and np.isfinite(logits).all()
    assert int(np.argmax(logits)) == out.new_ids[-1]  # greedy: the last token is the last step's argmax


def test_prompt_errors(tiny_schedule):
    session = loom.Session(tiny_schedule, backend="cpu")
    with pytest.raises(loom.InvalidArgumentError, match="at least one token"):
        session.generate([])
    with pytest.raises(loom.InvalidArgumentError, match="tokenizer"):
        session.generate("hello")
    with pytest.raises(loom.InvalidArgumentError, match="vocabulary"):
        session.generate([tiny_schedule.vocab_size + 5])
    with pytest.raises(loom.InvalidArgumentError, match="KV cache"):
        session.generate(list(range(1, 70)))
    with pytest.raises(loom.InvalidArgumentError, match="KV cache"):
        session.generate([1, 2], max_new_tokens=100)
    with pytest.raises(loom.InvalidArgumentError, match="max_new_tokens"):
        session.generate([1], max_new_tokens=0)
    with pytest.raises(loom.InvalidArgumentError, match="token ids"):
        session.generate([object()])
    with pytest.raises(loom.InvalidArgumentError, match="unknown backend 'tpu'"):
        loom.Session(tiny_schedule, backend="tpu")


def test_token_ids_and_counts_are_integers_in_range(tiny, tiny_schedule):
    session = loom.Session(tiny_schedule, backend="cpu")
    for bad, why in (([1.0], "token 0 must be an integer, not float"), ([1, 2.7], "token 1 must be an integer"),
                     ([True], "not a bool"), ([2**40], r"token 0 = 1099511627776 is out of range")):
        with pytest.raises(loom.InvalidArgumentError, match=why):
            session.generate(bad)
    assert session.generate([np.int64(3)], max_new_tokens=2).prompt_ids == [3]  # numpy integers are integers
    session.start([1])
    for call in (lambda: session.step(2**40), lambda: session.step(1.0),
                 lambda: session.generate([1], max_new_tokens=2**40), lambda: session.trace(2**33)):
        with pytest.raises(loom.InvalidArgumentError):  # not nanobind's TypeError
            call()
    with pytest.raises(loom.InvalidArgumentError, match="max_seq = 1099511627776 is out of range"):
        loom.load("random:tiny", max_seq=2**40)
    with pytest.raises(loom.InvalidArgumentError, match="num_sms"):
        loom.compile(tiny, num_sms=2**40)


def test_nothing_runs_before_start(tiny_schedule):
    session = loom.Session(tiny_schedule, backend="cpu")
    with pytest.raises(loom.InvalidArgumentError, match=r"step\(\) before start\(\)"):
        session.step(1)
    with pytest.raises(loom.InvalidArgumentError, match=r"logits\(\) before start\(\)"):
        session.logits()
    session.start([1, 2])
    assert np.isfinite(session.logits()).all()


def test_closed_sessions_refuse_every_call(tiny_schedule):
    with loom.Session(tiny_schedule, backend="cpu") as session:
        session.generate([1], max_new_tokens=2)
    assert session.closed and "closed" in repr(session)
    for call in (lambda: session.generate([1]), lambda: session.tokens, lambda: session.logits(),
                 lambda: session.step(1)):
        with pytest.raises(loom.InvalidArgumentError, match="closed"):
            call()
    session.close()  # twice is fine


def test_a_schedule_from_a_file_needs_its_model(tiny, tiny_schedule, tmp_path):
    tiny_schedule.save(tmp_path / "s.pb")
    schedule = loom.Schedule.load(tmp_path / "s.pb")
    with pytest.raises(loom.InvalidArgumentError, match="model="):
        loom.Session(schedule, backend="cpu")
    session = loom.Session(schedule, backend="cpu", model=tiny)
    assert session.generate([1, 2, 3], 4).new_ids == loom.Session(tiny_schedule, "cpu").generate([1, 2, 3], 4).new_ids
    other = loom.load("random:tiny-qwen3", max_seq=64)
    if other.vocab_size != tiny.vocab_size:
        with pytest.raises(loom.InvalidArgumentError, match="not a schedule of model"):
            loom.Session(schedule, backend="cpu", model=other)


def test_traces_come_from_the_gpu(tiny_schedule, tmp_path):
    session = loom.Session(tiny_schedule, backend="cpu")
    session.generate([1], max_new_tokens=1)
    with pytest.raises(loom.InvalidArgumentError, match="GPU"):
        session.trace(2, tmp_path / "t.json")


def test_gpu_backend_without_a_gpu_says_why(tiny_schedule):
    ok, why = loom.gpu_available()
    if ok:
        pytest.skip("this machine has a GPU")
    assert why
    with pytest.raises(loom.UnavailableError, match=why.split(" (")[0]):
        loom.Session(tiny_schedule, backend="gpu")
    assert loom.Session(tiny_schedule, backend="auto").backend == "cpu"


def test_gpu_generate_matches_the_cli_and_logits_are_torch(tiny_schedule, tmp_path):
    gpu_or_skip()
    session = loom.Session(tiny_schedule, backend="gpu")
    out = session.generate([5, 17, 42, 7], max_new_tokens=10)
    r = run_cli("run", "--model=random:tiny", "--max_seq=64", "--backend=gpu", "--num_sms=8", "--prompt=5,17,42,7",
                "--tokens=10")
    assert r.returncode == 0, r.stderr
    line = next(l for l in r.stdout.splitlines() if l.startswith("tokens:"))
    assert out.new_ids == [int(t) for t in line.split()[1:]]
    torch = pytest.importorskip("torch")
    logits = session.logits()
    assert isinstance(logits, torch.Tensor) and logits.is_cuda and logits.shape == (tiny_schedule.vocab_size,)
    assert int(torch.argmax(logits)) == out.new_ids[-1]
    summary = session.trace(4, tmp_path / "t.json", tmp_path / "t.png")
    assert "MATVEC" in summary and (tmp_path / "t.png").stat().st_size > 0


def test_threads_share_a_session_one_call_at_a_time(tiny_schedule):
    import threading

    session = loom.Session(tiny_schedule, backend="cpu")
    want = session.generate([7, 7, 7], max_new_tokens=4).new_ids
    results, errors = [], []

    def work():
        try:
            for _ in range(3):
                results.append(session.generate([7, 7, 7], max_new_tokens=4).new_ids)
        except loom.Error as e:  # a close() racing a generate: refused, not a crash
            errors.append(str(e))

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [want] * 9 and not errors
    closer = threading.Thread(target=session.close)
    worker = threading.Thread(target=work)
    worker.start()
    closer.start()
    worker.join()
    closer.join()
    assert session.closed and all("closed" in e for e in errors)


def test_quantized_projections_generate_as_the_cli():
    # random:tiny with FP8 projections (MATVEC_FP8 tiles) and int4 ones (MATVEC_W4): the Session and `loom run
    # --scheme=...` agree, with and without the prefill pass.
    for scheme, note in (("FP8", "quantized to FP8"), ("W4A16", "quantized to int4")):
        model = loom.load("random:tiny", max_seq=64, scheme=scheme)
        assert any(note in n for n in model.notes)
        for prefill in (True, False):
            out = loom.Session(model, backend="cpu").generate([5, 17, 42, 7], max_new_tokens=6, prefill=prefill)
            assert out.new_ids == cli_tokens("--prompt=5,17,42,7", "--tokens=6", f"--scheme={scheme}",
                                             f"--prefill={str(prefill).lower()}")
    with pytest.raises(ValueError, match="W4A16"):
        loom.load("random:tiny", scheme="INT3")


def test_a_bf16_kv_cache_generates_as_the_cli():
    # kv_dtype="bf16": the caches are bf16 in the graph, and the Session and `loom run --kv_dtype=bf16` agree, with and
    # without the prefill pass; anything but f32 / bf16 is refused by name.
    model = loom.load("random:tiny", max_seq=64, kv_dtype="bf16")
    assert model.kv_dtype == "bf16" and "KV cache 64 bf16" in repr(model)
    assert loom.load("random:tiny", max_seq=64, weights=False).kv_dtype == "f32"
    for prefill in (True, False):
        out = loom.Session(model, backend="cpu").generate([5, 17, 42, 7], max_new_tokens=6, prefill=prefill)
        assert out.new_ids == cli_tokens("--prompt=5,17,42,7", "--tokens=6", "--kv_dtype=bf16",
                                         f"--prefill={str(prefill).lower()}")
    with pytest.raises(ValueError, match="kv_dtype"):
        loom.load("random:tiny", kv_dtype="f16")


@pytest.mark.parametrize("fixture", ["awq-g32", "gptq-g32-asym", "w4a16-g32-f16"])
def test_hub_int4_checkpoints_generate_as_the_checked_cli(fixture):
    # AutoAWQ's, GPTQModel's and compressed-tensors' (float16 scales) int4 packings, read as int4 (MATVEC_W4): the
    # Session's tokens are `loom run --check`'s, which the op-by-op oracle confirms.
    folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "quantized", fixture)
    model = loom.load(folder, max_seq=64)
    assert any("(int4 matvec)" in n for n in model.notes), model.notes
    out = loom.Session(model, backend="cpu").generate([5, 17, 42, 7], max_new_tokens=6)
    r = run_cli("run", f"--model={folder}", "--max_seq=64", "--backend=cpu", "--prompt=5,17,42,7", "--tokens=6",
                "--check")
    assert r.returncode == 0, r.stderr
    assert "identical to the op-by-op oracle" in r.stdout + r.stderr
    line = next(l for l in r.stdout.splitlines() if l.startswith("tokens:"))
    assert out.new_ids == [int(t) for t in line.split()[1:]]
