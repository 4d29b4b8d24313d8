"""Graphs from Python: GraphBuilder, models from numpy / torch weights, the op-by-op oracle; trace pictures."""

from __future__ import annotations

import json

import numpy as np
import pytest

import loom


def bf16(x: np.ndarray) -> np.ndarray:
    """x rounded to bfloat16 (nearest even), as Loom stores bf16 weights."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


def mlp_graph() -> loom.Graph:
    b = loom.GraphBuilder("mlp")
    x = b.input("x", [2, 8], loom.DType.F32)
    b.weight("norm", [8])
    b.weight("gate", [16, 8])
    b.weight("up", [16, 8])
    b.weight("down", [8, 16])
    h = b.rms_norm("h", x, "norm", 1e-5)
    g = b.linear("g", h, "gate")
    u = b.linear("u", h, "up")
    s = b.silu_mul("s", g, u)
    y = b.linear("y", s, "down")
    out = b.add("out", x, y)
    b.mark_output(out)
    return b.build()


def test_builder_and_oracle_against_numpy():
    rng = np.random.default_rng(7)
    w = {"norm": rng.uniform(0.5, 1.5, 8), "gate": rng.normal(size=(16, 8)), "up": rng.normal(size=(16, 8)),
         "down": rng.normal(size=(8, 16))}
    graph = mlp_graph()
    assert graph.name == "mlp" and graph.num_ops == 6
    assert ("x", [2, 8], "F32", "INPUT", False) in graph.tensors()
    model = loom.Model.from_graph(graph, w)
    x = rng.normal(size=(2, 8)).astype(np.float32)
    got = model.oracle().run({"x": x})["out"]
    wb = {k: bf16(v) for k, v in w.items()}
    h = x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + 1e-5) * wb["norm"]
    g, u = h @ wb["gate"].T, h @ wb["up"].T
    want = x + (g / (1 + np.exp(-g)) * u) @ wb["down"].T
    assert got.shape == (2, 8)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_graph_text_and_files(tmp_path):
    graph = mlp_graph()
    assert 'name: "mlp"' in graph.text() and "SILU_MUL" in graph.text()
    graph.save(tmp_path / "mlp.pbtxt")
    back = loom.Graph.load(str(tmp_path / "mlp.pbtxt"))
    assert back.text() == graph.text()


def test_torch_weights_if_torch_is_here():
    torch = pytest.importorskip("torch")
    graph = mlp_graph()
    w = {"norm": torch.ones(8), "gate": torch.randn(16, 8, dtype=torch.bfloat16), "up": torch.randn(16, 8),
         "down": torch.randn(8, 16)}
    model = loom.Model.from_graph(graph, w)
    out = model.oracle().run({"x": torch.randn(2, 8)})["out"]
    assert out.shape == (2, 8) and np.isfinite(out).all()


def test_bad_weights_and_graphs_are_refused():
    graph = mlp_graph()
    good = {"norm": np.ones(8), "gate": np.ones((16, 8)), "up": np.ones((16, 8)), "down": np.ones((8, 16))}
    with pytest.raises(loom.InvalidArgumentError, match=r"'gate': shape \[8, 16\], the graph declares \[16, 8\]"):
        loom.Model.from_graph(graph, {**good, "gate": np.ones((8, 16))})
    with pytest.raises(loom.InvalidArgumentError, match="no array for the graph's weight 'down'"):
        loom.Model.from_graph(graph, {k: v for k, v in good.items() if k != "down"})
    with pytest.raises(loom.InvalidArgumentError, match="'bias' is not a weight"):
        loom.Model.from_graph(graph, {**good, "bias": np.ones(8)})
    with pytest.raises(loom.InvalidArgumentError, match="numbers only"):
        loom.Model.from_graph(graph, {**good, "up": np.array([["a"] * 8] * 16)})
    model = loom.Model.from_graph(graph, good)
    with pytest.raises(loom.InvalidArgumentError, match="no array for 'x'"):
        model.oracle().run({})
    with pytest.raises(loom.InvalidArgumentError, match="shape"):
        model.oracle().run({"x": np.ones((3, 8))})
    b = loom.GraphBuilder("broken")
    b.input("x", [2, 8], loom.DType.F32)
    b.weight("w", [4, 5])
    b.linear("y", "x", "w")
    with pytest.raises(loom.Error, match="y"):
        b.build()


def test_lowering_refuses_what_it_does_not_cover():
    weights = {"norm": np.ones(8), "gate": np.ones((16, 8)), "up": np.ones((16, 8)), "down": np.ones((8, 16))}
    # The MLP (RMSNorm, linears, SiLU-mul, residual) compiles to a graph pass ...
    assert "graph pass" in loom.compile(loom.Model.from_graph(mlp_graph(), weights)).summary()
    # ... an ARGMAX outside a decoder does not.
    b = loom.GraphBuilder("argmax")
    b.input("x", [2, 8], loom.DType.F32)
    b.mark_output(b.argmax("i", "x"))
    with pytest.raises(loom.Error, match=r"\(ARGMAX\): an ARGMAX outside a decoder's prefill"):
        loom.compile(loom.Model.from_graph(b.build(), {}))


def test_trace_png(tmp_path):
    events = [{"name": "thread_name", "ph": "M", "pid": 0, "tid": sm, "args": {"name": f"SM {sm}"}} for sm in range(4)]
    for step in range(2):
        for sm in range(4):
            for i, (op, name) in enumerate([("MATVEC", "layers.0.qkv"), ("ATTN_PARTIAL", "layers.0.attn"),
                                            ("MATVEC", "layers.1.qkv")]):
                events.append({"name": op, "ph": "X", "pid": 0, "tid": sm, "ts": 100.0 * step + 10.0 * i + sm,
                               "dur": 8.0, "args": {"step": step, "index": i, "wait_us": 2.0, "op": name}})
    (tmp_path / "t.json").write_text(json.dumps({"traceEvents": events}))
    from loom.trace import load_slices, main, render_png

    assert len(load_slices(tmp_path / "t.json")) == 24
    assert len(load_slices(tmp_path / "t.json", step=1)) == 12
    assert {e["name"] for e in load_slices(tmp_path / "t.json", step=1, layer=0)} == {"MATVEC", "ATTN_PARTIAL"}
    pytest.importorskip("matplotlib")
    render_png(tmp_path / "t.json", tmp_path / "t.png", title="test")
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    main([str(tmp_path / "t.json"), str(tmp_path / "l.png"), "--step", "1", "--layer", "1"])
    assert (tmp_path / "l.png").stat().st_size > 0
    with pytest.raises(ValueError, match="no instruction slices"):
        render_png(tmp_path / "t.json", tmp_path / "e.png", layer=5)
    for e in events:
        e.get("args", {}).pop("op", None)
    (tmp_path / "old.json").write_text(json.dumps({"traceEvents": events}))
    with pytest.raises(ValueError, match="names no ops"):
        render_png(tmp_path / "old.json", tmp_path / "o.png", layer=0)


def test_progress_bars_context(capsys):
    from loom.progress import progress_bars

    with progress_bars(True):
        loom.load("random:tiny", max_seq=16)  # small: nothing drawn, and the hook is removed after
    with progress_bars(False):
        pass


def test_onnx_models_load_and_run_on_the_oracle():
    path = "/usr/share/libonnx-testdata/data/pytorch-converted/test_Conv2d_groups/model.onnx"
    import os

    if not os.path.exists(path):
        pytest.skip("libonnx-testdata is not installed")
    model = loom.load(path)
    assert model.family == "onnx" and model.has_weights
    (name, shape, dtype, kind, _), *_ = [t for t in model.graph().tensors() if t[3] == "INPUT"]
    x = np.random.default_rng(3).normal(size=shape).astype(np.float32)
    (y,) = model.oracle().run({name: x}).values()
    assert y.ndim == 4 and np.isfinite(y).all()
    # The grouped convolution compiles to one graph pass; a Session (token decoding) refuses it by name; a product
    # of two activations compiles too (B packed in the pass).
    schedule = loom.compile(model)
    with pytest.raises(loom.InvalidArgumentError, match="a general graph's pass"):
        loom.Session(schedule, backend="cpu")
    # Schedule.run runs the pass: the oracle's outputs within the graph tolerance (bf16 tensor-core operands), on the
    # VM and (where there is one) the GPU, resident between runs; a missing or unknown input is refused by name.
    for backend in ["cpu"] + (["gpu"] if loom.gpu_available()[0] else []):
        (got,) = schedule.run({name: x}, backend=backend).values()
        assert got.shape == y.shape
        assert np.linalg.norm(got - y) <= 3e-2 * np.linalg.norm(y), backend
        (again,) = schedule.run({name: x}, backend=backend).values()
        np.testing.assert_array_equal(again, got)
    with pytest.raises(loom.InvalidArgumentError, match=f"inputs: no array for '{name}'"):
        schedule.run({}, backend="cpu")
    with pytest.raises(loom.InvalidArgumentError, match="'z' is not an input of the graph"):
        schedule.run({name: x, "z": x}, backend="cpu")
    with pytest.raises(loom.InvalidArgumentError, match="a decode schedule, not a graph pass"):
        loom.compile(loom.load("random:tiny")).run({}, backend="cpu")
    matmul = loom.load("/usr/share/libonnx-testdata/data/node/test_matmul_2d/model.onnx")
    assert "GEMM" in loom.compile(matmul).summary()
    with pytest.raises(loom.InvalidArgumentError, match=r"\(Cos\): op type not supported"):
        loom.load("/usr/share/libonnx-testdata/data/node/test_cos/model.onnx")


def test_onnx_embedding_ids_from_numpy():
    """An ONNX Embedding (Gather from a table at an int64 input): int64 ids from numpy run the pass as the oracle
    does; ids outside the table or outside int32 are refused by value."""
    path = "/usr/share/libonnx-testdata/data/pytorch-converted/test_Embedding/model.onnx"
    import os

    if not os.path.exists(path):
        pytest.skip("libonnx-testdata is not installed")
    model = loom.load(path)
    tensors = model.graph().tensors()
    (name, shape, _, _, _), = [t for t in tensors if t[3] == "INPUT"]
    vocab = [t[1][0] for t in tensors if t[3] == "WEIGHT" and len(t[1]) == 2][0]
    ids = np.random.default_rng(5).integers(0, vocab, size=shape, dtype=np.int64)
    (want,) = model.oracle().run({name: ids}).values()
    schedule = loom.compile(model)
    for backend in ["cpu"] + (["gpu"] if loom.gpu_available()[0] else []):
        (got,) = schedule.run({name: ids}, backend=backend).values()
        assert got.shape == want.shape
        np.testing.assert_allclose(got, bf16(want), rtol=0, atol=0)  # EMBED reads the table in bf16
    with pytest.raises(loom.InvalidArgumentError, match=rf"value 0 is {vocab}, outside the table's rows \[0, {vocab}\)"):
        schedule.run({name: np.full(shape, vocab, dtype=np.int64)}, backend="cpu")
    with pytest.raises(loom.InvalidArgumentError, match="value 4294967296 is outside int32"):
        schedule.run({name: np.full(shape, 2**32, dtype=np.int64)}, backend="cpu")


def test_gated_conv_lm_prefills_and_decodes_like_token_by_token():
    # A decoder without attention: causal Conv1d state carried through the one-pass prefill into decode.
    model = loom.load("random:gated-conv-tiny")
    prompt = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
    one_pass = loom.Session(loom.compile(model), backend="cpu").generate(prompt, max_new_tokens=8)
    stepwise = loom.Session(loom.compile(model, prefill=False), backend="cpu").generate(prompt, max_new_tokens=8)
    assert one_pass.used_prefill and not stepwise.used_prefill
    assert one_pass.new_ids == stepwise.new_ids and len(one_pass.new_ids) == 8
