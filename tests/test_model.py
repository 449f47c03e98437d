"""``invariance model`` on plain torch models: planted batch-variant ops at known modules must be
named (module and aten op), invariant controls must pass, and the outputs (JSON, Markdown, HTML,
CLI, replay, the pytest fixture) must carry what was found."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import model_zoo as zoo
import pytest
import torch
from torch import nn

import invariance
from invariance.cli import main
from invariance.model import ModelReport, check_model, replay_model
from invariance.model.check import cause_of, first_differing_op
from invariance.model.inputs import ModelInterface, detect_interface
from invariance.model.record import Layout, OpRecord, Piece, cut
from invariance.render.model import model_failure_text, model_to_html, model_to_markdown
from invariance.report import ReportError

ZOO = str(Path(__file__).parent / "model_zoo.py")
CPU = {"device": "cpu"}


# --- the origin of planted defects ---------------------------------------------------------

def test_planted_linear_is_the_origin_and_its_op_is_named() -> None:
    report = check_model(zoo.planted_linear_lm, scenarios="batch", batch_sizes=[2, 4], **CPU)
    assert not report.passed
    for s in report.scenarios:
        assert s.status == "diverged" and s.classification == "batch-variant"
        o = s.origin
        assert o is not None and o.path == "layers.1.mlp.0"
        assert o.module_type == "BatchVariantLinear" and o.inputs_compared >= 1
        assert o.op is not None and o.op.name == "aten::sum"
        assert "another code path" in o.op.note  # the planted split-K runs other ops
        assert o.diff.num_different > 0 and o.diff.max_ulp > 0
        # Everything before it agreed: the first layer and the attention of the second.
        assert s.clean_prefix > 10 and s.first_divergence == "layers.1.mlp.0"
        assert [g.module_type for g in s.origins] == ["BatchVariantLinear"]
        assert s.curve[0].max_ulp == 0 and s.curve[-1].label == "output"
        assert s.curve[-1].max_ulp > 0
        assert s.reproducer is not None and s.reproducer.batch_size == 2
    assert report.scenarios[1].reproducer is not None
    assert report.scenarios[1].reproducer.shrunk  # batch of 4 shrunk to 2


def test_invariant_control_passes_every_scenario() -> None:
    report = check_model(zoo.invariant_lm, **CPU)
    assert report.passed, report.summary()
    assert {s.status for s in report.scenarios} == {"identical"}
    assert {s.family for s in report.scenarios} == set(invariance.model.FAMILIES)
    assert all(s.calls_compared > 20 for s in report.scenarios)


def test_batch_statistics_norm_is_named_with_its_reduction() -> None:
    report = check_model(zoo.planted_norm_lm, scenarios="batch,pad-right", batch_sizes=[3],
                         **CPU)
    for s in report.scenarios:
        o = s.origin
        assert o is not None and (o.path, o.module_type) == ("layers.2.norm2", "BatchStatNorm")
        assert o.op is not None and o.op.name == "aten::mean"
        assert "across the batch" in o.op.cause


def test_decode_defect_is_found_only_on_the_kv_cache_path() -> None:
    report = check_model(zoo.planted_decode_lm, **CPU)
    by = {s.family: s for s in report.scenarios}
    for family in ("batch", "order", "pad-left", "pad-right", "decode-vs-prefill"):
        assert by[family].status == "identical", family  # no cache or batch of one
    s = by["decode"]
    assert s.status == "diverged" and s.origin is not None
    assert (s.origin.path, s.origin.module_type) == ("layers.1.attn", "Attention")
    assert s.origin.step >= 1  # a decode forward, not the prefill
    assert s.origin.op is not None and "code path" in s.origin.op.cause
    # The fixed model (same layers, no planted branch) passes the same scenario.
    assert check_model(zoo.invariant_lm, scenarios="decode", **CPU).passed


def test_plain_sequential_over_rows() -> None:
    report = check_model(zoo.planted_rows_model, scenarios="batch,order,pad-left,decode",
                         batch_sizes=[2], **CPU)
    by = {s.family: s for s in report.scenarios}
    assert by["batch"].origin is not None and by["batch"].origin.path == "2"
    assert by["batch"].origin.op is not None and by["batch"].origin.op.name == "aten::mean"
    assert by["pad-left"].status == "skipped" and "nothing to pad" in by["pad-left"].reason
    assert by["decode"].status == "skipped" and "KV cache" in by["decode"].reason
    control = check_model(zoo.rows_model, scenarios="batch,order", batch_sizes=[2, 5], **CPU)
    assert control.passed


def test_encoder_without_a_cache_skips_decoding() -> None:
    report = check_model(zoo.invariant_encoder, scenarios="batch,pad-left,decode",
                         batch_sizes=[2], **CPU)
    assert report.passed
    decode = report.scenarios[-1]
    assert decode.status == "skipped" and "no KV cache" in decode.reason


class _Switched(nn.Module):
    """Invariant on its first call, split-K on its second (its ``planted`` argument)."""

    def __init__(self) -> None:
        super().__init__()
        self.fixed = zoo.RowwiseLinear(16, 16)
        self.planted = zoo.BatchVariantLinear(16, 16, alone_rows=1)
        self.planted.load_state_dict(self.fixed.state_dict())

    def forward(self, x: torch.Tensor, planted: bool) -> torch.Tensor:
        return (self.planted if planted else self.fixed)(x)


class _Shared(nn.Module):
    """One module called three times; its second call carries the defect."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = zoo.RowwiseLinear(16, 16)
        self.shared = _Switched()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.shared(self.inp(x), False)
        x = self.shared(x, True)
        return self.shared(x, False)


def test_a_module_called_several_times_is_keyed_by_call_order() -> None:
    report = check_model(_Shared, scenarios="batch", batch_sizes=[2], **CPU)
    o = report.scenarios[0].origin
    assert o is not None and (o.path, o.call) == ("shared.planted", 0)
    assert report.scenarios[0].clean_prefix >= 3  # inp, shared.fixed and shared's first use
    assert "shared.planted" in report.summary()


@dataclass
class _Out:
    hidden: torch.Tensor
    aux_loss: torch.Tensor


class _TupleBlock(nn.Module):
    def __init__(self, planted: bool) -> None:
        super().__init__()
        self.lin = (zoo.BatchVariantLinear(8, 8, alone_rows=1) if planted
                    else zoo.RowwiseLinear(8, 8))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.lin(x)
        return y, y.pow(2).mean()  # a scalar: cannot be mapped to a request


class _TupleModel(nn.Module):
    invariance_inputs = "rows:8"

    def __init__(self, planted: bool = True) -> None:
        super().__init__()
        self.a = _TupleBlock(False)
        self.b = _TupleBlock(planted)

    def forward(self, x: torch.Tensor) -> _Out:
        h, _ = self.a(x)
        h, aux = self.b(h)
        return _Out(h, aux)


def test_tuples_dataclasses_and_unmappable_leaves() -> None:
    report = check_model(_TupleModel, scenarios="batch", batch_sizes=[3], **CPU)
    s = report.scenarios[0]
    assert s.origin is not None and s.origin.path == "b.lin"
    assert any("a scalar" in e for e in s.unmapped_examples)
    assert s.unmapped >= 2  # the blocks' and the model's scalar
    assert check_model(lambda: _TupleModel(False), scenarios="batch", batch_sizes=[3],
                       **CPU).passed


# --- pieces ----------------------------------------------------------------------------------

def test_cut_maps_batch_token_flat_and_shared_tensors() -> None:
    lay = Layout(batch=3, length=5, row=1, index=(2, 3, 4), tokens=(0, 1, 2))  # left-padded
    x = torch.arange(3 * 5 * 4.0).view(3, 5, 4)
    p = cut(x, lay)
    assert isinstance(p, Piece) and p.how == "batch" and p.tokens == (0, 1, 2)
    assert torch.equal(p.tensor, x[1, 2:5])
    heads = x.view(3, 5, 2, 2).transpose(1, 2)  # [B, H, L, D]: the token dim found after heads
    ph = cut(heads, lay)
    assert isinstance(ph, Piece) and torch.equal(ph.tensor, x[1, 2:5].view(3, 2, 2))
    flat = cut(x.view(15, 4), lay)
    assert isinstance(flat, Piece) and flat.how == "flat" and torch.equal(flat.tensor, x[1, 2:5])
    shared = cut(torch.ones(1, 4), lay)
    assert isinstance(shared, Piece) and shared.how == "shared" and shared.tokens is None
    # A decode step (one token per row): a [B, ...] tensor holds that token's row.
    step = Layout(batch=3, length=1, row=2, index=(0,), tokens=(7,))
    rows = torch.arange(12.0).view(3, 4)
    pd = cut(rows, step)
    assert isinstance(pd, Piece) and pd.tokens == (7,) and torch.equal(pd.tensor, rows[2:3])
    assert cut(torch.ones(()), lay) == "a scalar"
    assert "no leading dim of size 3" in str(cut(torch.ones(7, 4), lay))
    assert "not a tensor" in str(cut(object(), lay))


def test_interface_detection_and_bad_inputs() -> None:
    lm = detect_interface(zoo.TinyLM())
    assert (lm.kind, lm.width, lm.mask, lm.positions, lm.cache) == (
        "tokens", zoo.VOCAB, True, True, "past_key_values")
    rows = detect_interface(zoo.rows_model())
    assert (rows.kind, rows.width, rows.cache) == ("rows", 16, None)
    assert detect_interface(zoo.rows_model(), "sequence:16").kind == "sequence"
    with pytest.raises(ValueError, match="inputs: cannot tell what ReLU takes"):
        detect_interface(nn.ReLU())
    for bad in ("tokens", "words:3", "rows:0", "rows:x"):
        with pytest.raises(ValueError, match="inputs: expected tokens:VOCAB"):
            ModelInterface.parse(bad)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"length": 0}, "length: expected an int >= 1, got 0"),
    ({"decode_steps": -1}, "decode_steps: expected an int >= 0, got -1"),
    ({"batch_sizes": [1]}, "batch_sizes: expected ints >= 2"),
    ({"batch_sizes": "2,x"}, "batch_sizes: expected ints >= 2"),
    ({"scenarios": "batch,nope"}, "scenarios: expected some of batch, order"),
    ({"dtype": "int8"}, "dtype: expected one of float16, bfloat16, float32, float64"),
    ({"device": "tpu"}, "device: expected 'cpu' or 'cuda', got 'tpu'"),
    ({"seed": -2}, "seed: expected an int >= 0, got -2"),
    ({"shrink": "yes"}, "shrink: expected a bool, got 'yes'"),
    ({"attention": "nope"}, "attention: backend: unknown name 'nope'"),
])
def test_bad_arguments_name_the_argument(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_model(zoo.invariant_lm, **{**CPU, **kwargs})  # type: ignore[arg-type]


def test_bad_models_name_the_model() -> None:
    with pytest.raises(ValueError, match="model: expected one of llama"):
        check_model("nonsense", **CPU)
    with pytest.raises(ValueError, match="cannot import module 'no_such_module'"):
        check_model("no_such_module:build", **CPU)
    with pytest.raises(ValueError, match="has no attribute 'nope'"):
        check_model(f"{ZOO}:nope", **CPU)
    with pytest.raises(ValueError, match=r"expected the callable to return a torch\.nn\.Module, "
                                         r"got int"):
        check_model(lambda: 3, **CPU)
    with pytest.raises(ValueError, match="attention: expected a transformers model"):
        check_model(zoo.invariant_lm, attention="reference", **CPU)


def test_gemm_cause_names_m() -> None:
    cause = cause_of("aten::mm", [[24, 64], [64, 128]], [[5, 64], [64, 128]], False)
    assert "GEMM whose M (rows) is 24 in this run and 5 in the reference" in cause
    assert "batch's token count" in cause
    assert "M is 2" not in cause_of("aten::addmm", [[128], [2, 64], [64, 128]],
                                    [[128], [2, 64], [64, 128]], False)
    assert "attention kernel" in cause_of(
        "aten::_scaled_dot_product_efficient_attention", [[2, 4, 8, 64]], [[1, 4, 8, 64]], False)


def test_first_differing_op_on_one_code_path() -> None:
    def op(i: int, name: str, value: float, shapes: list[list[int]]) -> OpRecord:
        rec = OpRecord(i, name, (("m", 0),), shapes)
        rec.outputs["(value)"] = Piece(torch.full((2, 3), value), (0, 1), "batch", 0)
        return rec

    ref = [op(0, "aten::view", 1.0, [[8, 3]]), op(1, "aten::mm", 2.0, [[8, 3], [3, 3]])]
    var = [op(0, "aten::view", 1.0, [[16, 3]]), op(1, "aten::mm", 2.5, [[16, 3], [3, 3]])]
    found = first_differing_op(var, ref, ("m", 0), set())
    assert found is not None and found.name == "aten::mm" and found.note == ""
    assert "M (rows) is 16 in this run and 8" in found.cause
    assert first_differing_op(ref, ref, ("m", 0), set()) is None
    # Ops inside another independent origin are left out.
    inner = op(1, "aten::mm", 2.5, [[16, 3], [3, 3]])
    inner.stack = (("m", 0), ("m.child", 0))
    assert first_differing_op([var[0], inner], ref, ("m", 0), {("m.child", 0)}) is None


# --- reports, renderers, replay ----------------------------------------------------------------

@pytest.fixture(scope="module")
def planted_report() -> ModelReport:
    return check_model(zoo.planted_linear_lm, scenarios="batch,decode", batch_sizes=[2], **CPU)


def test_json_round_trip_and_validation(planted_report: ModelReport, tmp_path: Path) -> None:
    path = tmp_path / "model.json"
    planted_report.to_json(path)
    again = ModelReport.from_json(path)
    assert again.to_dict() == planted_report.to_dict()
    data = json.loads(path.read_text())
    assert data["schema"] == "invariance.model-report" and data["version"] == "1.0"
    assert data["passed"] is False
    data["scenarios"][0]["origin"]["call"] = "zero"
    with pytest.raises(ReportError, match=r"scenarios\[0\]\.origin\.call: expected int, got "
                                          r"str 'zero'"):
        ModelReport.from_dict(data)
    data["scenarios"][0]["origin"]["call"] = 0
    data["version"] = "1.7"
    data["scenarios"][0]["later_field"] = {"kept": True}
    newer = ModelReport.from_dict(data)
    assert newer.scenarios[0].extra == {"later_field": {"kept": True}}
    assert newer.to_dict()["scenarios"][0]["later_field"] == {"kept": True}
    data["version"] = "2.0"
    with pytest.raises(ReportError, match="newer than this invariance"):
        ModelReport.from_dict(data)
    with pytest.raises(ReportError, match=r"schema: expected 'invariance\.model-report'"):
        ModelReport.from_dict({"schema": "invariance.report", "version": "1.1"})


def test_renderers_carry_the_origin(planted_report: ModelReport) -> None:
    md = model_to_markdown(planted_report)
    assert "layers.1.mlp.0 [BatchVariantLinear]" in md and "aten::sum" in md
    assert "invariance.replay_model(case)" in md
    html = model_to_html(planted_report)
    assert "<svg" in html and "<script" not in html
    svg = html[html.index("<svg"):html.index("</svg>") + len("</svg>")]
    root = ET.fromstring(svg)  # well-formed, self-contained
    assert root.tag.endswith("svg") and "layers.1" in svg
    text = model_failure_text(planted_report, "test_x")
    assert "origin: layers.1.mlp.0 [BatchVariantLinear]" in text and "reproducer" in text


def test_reproducer_replays(planted_report: ModelReport) -> None:
    s = planted_report.scenarios[0]
    assert s.reproducer is not None
    case = s.reproducer.case
    assert case["model"] == "model_zoo:planted_linear_lm"
    with pytest.raises(AssertionError, match=r"still diverges.*layers\.1\.mlp\.0"):
        replay_model(case)
    # The same case on the invariant model: identical.
    assert replay_model(case, model=zoo.invariant_lm).equal
    namespace: dict[str, object] = {}
    with pytest.raises(AssertionError, match="still diverges"):
        exec(s.reproducer.code, namespace)  # the pasted reproducer


# --- the CLI ---------------------------------------------------------------------------------

def test_cli_exit_codes_and_outputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = [f"--{k}" for k in ("json", "markdown", "html")]
    paths = [tmp_path / f"r.{ext}" for ext in ("json", "md", "html")]
    args = ["model", f"{ZOO}:planted_linear_lm", "--device", "cpu", "--scenarios", "batch",
            "--batch-sizes", "2", "--no-progress", "--cases", str(tmp_path / "cases")]
    for flag, path in zip(out, paths, strict=True):
        args += [flag, str(path)]
    assert main(args) == 1
    stdout = capsys.readouterr().out
    assert "origin: layers.1.mlp.0 [BatchVariantLinear]" in stdout and "aten::sum" in stdout
    assert all(p.is_file() for p in paths)
    assert ModelReport.from_json(paths[0]).origin is not None
    cases = sorted((tmp_path / "cases").iterdir())
    assert len(cases) == 1
    assert main(["replay", str(cases[0])]) == 1
    assert "STILL DIFFERS" in capsys.readouterr().out
    assert main(["replay", str(cases[0]), "--model", f"{ZOO}:invariant_lm"]) == 0
    assert main(["replay", str(paths[0]), "--index", "0"]) == 1
    assert main(["report", str(paths[0])]) == 1
    assert "layers.1.mlp.0" in capsys.readouterr().out
    fixed = ["model", f"{ZOO}:invariant_lm", "--device", "cpu", "--scenarios", "batch,decode",
             "--batch-sizes", "2", "--no-progress"]
    assert main(fixed) == 0
    assert "INVARIANT" in capsys.readouterr().out


@pytest.mark.parametrize(("args", "message"), [
    (["nonsense"], "model: expected one of llama"),
    (["ZOO:invariant_lm", "--length", "0"], "length: expected an int >= 1, got 0"),
    (["ZOO:invariant_lm", "--batch-sizes", "1"], "batch_sizes: expected ints >= 2"),
    (["ZOO:invariant_lm", "--scenarios", "bogus"], "scenarios: expected some of"),
    (["ZOO:invariant_lm", "--inputs", "rows"], "inputs: expected tokens:VOCAB"),
    (["ZOO:invariant_lm", "--dtype", "int4"], "dtype: expected one of float16"),
    (["ZOO:invariant_lm", "--attention", "kernels"], "attention: expected a transformers"),
])
def test_cli_usage_errors_exit_2_with_one_line(args: list[str], message: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    args = [a.replace("ZOO", ZOO) for a in args]
    assert main(["model", *args, "--device", "cpu", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


# --- the pytest fixture ----------------------------------------------------------------------

def test_fixture_passes_and_fails(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(f"""
        def test_invariant(invariance_model):
            report = invariance_model({ZOO + ':invariant_lm'!r}, device="cpu",
                                      scenarios="batch", batch_sizes=[2])
            assert report.passed

        def test_planted(invariance_model):
            invariance_model({ZOO + ':planted_linear_lm'!r}, device="cpu",
                             scenarios="batch", batch_sizes=[2])

        def test_bad(invariance_model):
            invariance_model("nonsense", device="cpu")
    """)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(["*origin: layers.1.mlp.0 [[]BatchVariantLinear[]]*",
                                 "*invariance_model: model: expected one of llama*"])


class _Encoder(nn.Module):
    """Float sequences through torch's own (batch-first) multi-head attention."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = zoo.RowwiseLinear(8, 8)
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        return self.attn(h, h, h, need_weights=False)[0]


def test_float_models_with_attention_take_sequences() -> None:
    iface = detect_interface(_Encoder())
    assert (iface.kind, iface.width, iface.mask) == ("sequence", 8, False)
    report = check_model(_Encoder, scenarios="batch,pad-left", batch_sizes=[2], **CPU)
    assert report.scenarios[1].status == "skipped"  # no mask: nothing to pad
    batch = report.scenarios[0]
    assert batch.status in ("identical", "diverged") and batch.calls_compared >= 3
