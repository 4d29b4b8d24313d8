"""Text in and out through a model folder's own tokenizer.json (Hugging Face tokenizers), its chat template and
its end-of-sequence tokens: a random:tiny folder given a word-level tokenizer over its whole vocabulary."""

from __future__ import annotations

import json

import pytest

import loom

TEMPLATE = ("{{ bos_token }} {% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} {% endfor %}"
            "{% if add_generation_prompt %}<assistant> {% endif %}")


@pytest.fixture(scope="module")
def folder(tmp_path_factory, tiny):
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders

    path = tmp_path_factory.mktemp("tiny_text")
    tiny.export(path)
    words = ["<unk>", "<s>", "</s>", "<user>", "<assistant>", "<system>", "hello", "world"]
    vocab = {w: i for i, w in enumerate(words)}
    for i in range(len(words), tiny.vocab_size):
        vocab[f"w{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": {"content": "</s>"}, "chat_template": TEMPLATE}))
    return path


def test_text_prompt_and_text_out(folder):
    model = loom.load(folder, max_seq=64)
    assert model.text is not None and model.text.eos_token_ids == [2]
    session = loom.Session(loom.compile(model, num_sms=4), backend="cpu")
    out = session.generate("hello world", max_new_tokens=6, stop=[])
    assert out.prompt_ids == [6, 7]
    assert out.text == model.text.decode(out.new_ids)
    assert out.text.split() == [model.text.tokenizer.id_to_token(i) for i in out.new_ids if i not in (0, 1, 2)]
    streamed = list(session.stream("hello world", max_new_tokens=6, stop=[]))
    assert [t.id for t in streamed] == out.new_ids
    assert "".join(t.text for t in streamed).split() == out.text.split()


def test_chat_template(folder):
    model = loom.load(folder, max_seq=64)
    session = loom.Session(loom.compile(model, num_sms=4), backend="cpu")
    ids = session.encode("hello", chat=True)
    assert ids == [1, 3, 6, 4]  # <s> <user> hello <assistant>
    messages = [{"role": "system", "content": "world"}, {"role": "user", "content": "hello"}]
    assert session.encode(messages) == [1, 5, 7, 3, 6, 4]
    out = session.generate(messages, max_new_tokens=3, stop=[])
    assert out.prompt_ids == [1, 5, 7, 3, 6, 4] and len(out.new_ids) == 3


def test_end_of_sequence_stops_generation(folder, tmp_path):
    model = loom.load(folder, max_seq=64)
    session = loom.Session(loom.compile(model, num_sms=4), backend="cpu")
    free = session.generate("hello", max_new_tokens=8, stop=[]).new_ids
    # Make the model's own end-of-sequence token one it generates: generation_config.json names it.
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [free[1]]}))
    try:
        model = loom.load(folder, max_seq=64)
        assert model.text.eos_token_ids == [free[1]]
        session = loom.Session(loom.compile(model, num_sms=4), backend="cpu")
        assert session.generate("hello", max_new_tokens=8).new_ids == free[: free.index(free[1]) + 1]
    finally:
        (folder / "generation_config.json").unlink()


def test_folder_without_a_chat_template(folder, tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (plain / name).write_bytes((folder / name).read_bytes())
    session = loom.Session(loom.compile(loom.load(plain, max_seq=64), num_sms=4), backend="cpu")
    with pytest.raises(loom.InvalidArgumentError, match="chat_template"):
        session.encode("hello", chat=True)
    (plain / "tokenizer.json").write_text("{not json")
    with pytest.raises(loom.InvalidArgumentError, match="tokenizer.json"):
        loom.load(plain, max_seq=64)
