"""Loading, compiling and schedule files: every public function, and errors with the CLI's messages."""

from __future__ import annotations

import json
import os
import re

import pytest

import loom
from conftest import run_cli


def test_version_is_the_projects():
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "..", "..", "CMakeLists.txt"), encoding="utf-8") as f:
        version = re.search(r"project\(loom VERSION ([0-9.]+)", f.read()).group(1)
    assert loom.__version__ == version


def test_load_a_preset(tiny):
    assert tiny.spec == "random:tiny"
    assert tiny.family == "llama"
    assert tiny.num_layers > 0 and tiny.vocab_size > 0 and tiny.head_dim > 0
    assert tiny.max_seq == 64
    assert tiny.has_weights
    assert tiny.text is None  # presets have no tokenizer
    assert "random:tiny" in repr(tiny)


def test_config_only_load_compiles_but_cannot_run():
    m = loom.load("random:tiny", max_seq=32, weights=False)
    assert not m.has_weights
    s = loom.compile(m, num_sms=4)
    with pytest.raises(loom.InvalidArgumentError, match="without weights"):
        loom.Session(s, backend="cpu")


@pytest.mark.parametrize("spec", ["random:no-such-preset", "/no/such/folder"])
def test_load_errors_carry_the_cli_message(spec, tmp_path):
    with pytest.raises(loom.Error) as e:
        loom.load(spec)
    cli = run_cli("compile", f"--model={spec}", f"--out={tmp_path / 'x.pb'}")
    assert cli.returncode == 1
    assert cli.stderr.strip().splitlines()[-1] == f"loom: {e.value}"


def test_compile_options(tiny):
    s = loom.compile(tiny, num_sms=8, policy="lpt", granularity="op", unfuse="norm,silu")
    assert s.num_sms == 8
    text = s.summary()
    assert "8 SMs" in text and "LPT" in text and "PER_OP" in text
    assert "instructions per step" in text
    assert s.num_instructions > 0 and s.num_barriers > 0
    assert s.max_seq == tiny.max_seq and s.vocab_size == tiny.vocab_size
    assert "SM 0:" in s.summary(instructions=True)
    assert "num_sms" not in repr(s)


@pytest.mark.parametrize("option,value,flag", [
    ("policy", "fastest", "--policy=fastest"),
    ("granularity", "atom", "--granularity=atom"),
    ("unfuse", ["everything"], "--unfuse=everything"),
    ("num_sms", -3, "--num_sms=-3"),
])
def test_bad_options_carry_the_cli_message(tiny, tmp_path, option, value, flag):
    with pytest.raises(loom.InvalidArgumentError) as e:
        loom.compile(tiny, **{option: value})
    cli = run_cli("compile", "--model=random:tiny", flag, f"--out={tmp_path / 'x.pb'}")
    assert cli.returncode == 1
    # The CLI names the flag (--policy), Python the keyword (policy): otherwise the same words.
    assert cli.stderr.strip().splitlines()[-1] == f"loom: --{e.value}"
    assert isinstance(e.value, ValueError)


def test_unknown_option_and_wrong_model(tiny):
    with pytest.raises(loom.InvalidArgumentError, match="unknown option 'fusion_level'"):
        loom.compile(tiny, fusion_level=3)
    with pytest.raises(TypeError):
        loom.compile("random:tiny")
    with pytest.raises(loom.InvalidArgumentError, match="load it with max_seq=128"):
        loom.compile(tiny, max_seq=128)


def test_options_file(tiny, tmp_path):
    path = tmp_path / "opts.pbtxt"
    path.write_text("num_sms: 6\npolicy: ROUND_ROBIN\n")
    s = loom.compile(tiny, options=path)
    assert s.num_sms == 6 and "ROUND_ROBIN" in s.summary()
    assert loom.compile(tiny, options=path, num_sms=5).num_sms == 5  # keywords override the file
    path.write_text('num_sms: "many"\n')
    with pytest.raises(loom.Error, match="opts.pbtxt"):
        loom.compile(tiny, options=path)


@pytest.mark.parametrize("name", ["s.pb", "s.pbtxt"])
def test_schedule_files_round_trip(tiny_schedule, tmp_path, name):
    path = tmp_path / name
    tiny_schedule.save(path)
    back = loom.Schedule.load(path)
    assert back.num_instructions == tiny_schedule.num_instructions
    assert back.summary() == tiny_schedule.summary()
    assert back.model is None  # a file holds no weights


def test_hostile_schedule_files_are_refused(tmp_path):
    garbage = tmp_path / "garbage.pb"
    garbage.write_bytes(os.urandom(4096))
    with pytest.raises(loom.Error):
        loom.Schedule.load(garbage)
    bad_op = tmp_path / "op.pbtxt"
    bad_op.write_text('format_version: 9\nnum_sms: 1\nqueues { instructions { opcode: "WARP_DRIVE" } }\n')
    with pytest.raises(loom.Error, match="WARP_DRIVE"):
        loom.Schedule.load(bad_op)
    with pytest.raises(loom.NotFoundError):
        loom.Schedule.load(tmp_path / "missing.pb")


def test_export_writes_a_transformers_folder(tiny, tmp_path):
    tiny.export(tmp_path / "tiny")
    assert (tmp_path / "tiny" / "config.json").is_file()
    assert (tmp_path / "tiny" / "model.safetensors").is_file()
    back = loom.load(tmp_path / "tiny", max_seq=64)
    assert back.num_layers == tiny.num_layers and back.text is None


def test_quantize_writes_a_compressed_tensors_folder(tiny, tmp_path):
    tiny.quantize(tmp_path / "w4", "W4A16", group_size=64)
    config = json.loads((tmp_path / "w4" / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "compressed-tensors"
    assert config["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] == 64
    back = loom.load(tmp_path / "w4", max_seq=64)
    assert any("as stored (int4 matvec)" in note for note in back.notes)  # bf16 scales: kept as int4
    tiny.quantize(tmp_path / "w8", "W8A16")
    assert any("widened to bf16" in note for note in loom.load(tmp_path / "w8", max_seq=64).notes)
    with pytest.raises(loom.Error, match="one of FP8, W4A16, W8A16"):
        tiny.quantize(tmp_path / "bad", "INT3")
    with pytest.raises(loom.InvalidArgumentError, match="group_size"):
        tiny.quantize(tmp_path / "bad", "W4A16", group_size=2.0)


def test_quantize_from_a_spec_streams_the_same_folder(tiny, tmp_path):
    # loom.quantize reads (or makes) one weight at a time: the same bytes as quantizing the loaded model.
    tiny.quantize(tmp_path / "whole", "W4A16", group_size=32)
    loom.quantize("random:tiny", tmp_path / "streamed", "W4A16", 32)
    for name in ("model.safetensors", "config.json"):
        assert (tmp_path / "whole" / name).read_bytes() == (tmp_path / "streamed" / name).read_bytes()
    with pytest.raises(loom.Error, match="one of FP8, W4A16, W8A16"):
        loom.quantize("random:tiny", tmp_path / "bad", "INT3")
    with pytest.raises(loom.Error, match="not-a-folder"):
        loom.quantize(tmp_path / "not-a-folder", tmp_path / "bad", "FP8")
