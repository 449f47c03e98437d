"""The measured launch table (kernels.tuned) and the tuner that writes it (invariance.tune), on the
Triton interpreter: which calls a table reaches, that it changes settings and never bits, that a
bad table is named, and that the tuner admits only candidates with the rules' bits (its
bit-defining control is rejected, and a comparison that cannot see differences fails the run)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
import triton

import kernels
from invariance import HeadConfig, compare_bits
from invariance.bench import BenchWorkload
from invariance.cli import main
from invariance.features import Features
from invariance.tune import _Bucket, run_tune
from kernels._device import _device_slug
from kernels.tuned import SCHEMA, TABLE_ENV, bucket, device_slug, feature_tag, load_table

#: Where the kernels run in this session (conftest's ``device`` fixture: CUDA when there is one).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

HEADS = HeadConfig(4, 2, 64)  # conftest.HEADS: the smallest GQA configuration
SHAPE = [(1, 150), (1, 90)]  # two decodes, one over two tiles at half precision (128 keys)


def _call(batch: Any, **kw: Any) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse = kernels.unified_attention(batch.q, batch.k_cache, batch.v_cache,
                                         batch.cu_seqlens_q, batch.kv_lens, batch.block_table,
                                         sm_scale=batch.sm_scale, **kw)
    return out, lse


def _plan(batch: Any, **kw: Any) -> kernels.LaunchPlan:
    return kernels.plan_attention(batch.q, batch.k_cache, batch.v_cache, batch.cu_seqlens_q,
                                  batch.kv_lens, batch.block_table, **kw)


def _key(batch: Any) -> str:
    return bucket(batch.q.dtype, HEADS.head_dim, HEADS.num_q_heads // HEADS.num_kv_heads,
                  batch.k_cache.shape[1], batch.kv_lens.shape[0], batch.q.shape[0],
                  int(batch.kv_lens.max()))


def _write_table(path: Path, entries: dict[str, Any], device: str | None = None,
                 release: str | None = None) -> Path:
    """A table for ``device`` (default: the one the tests run on)."""
    device = device or _device_slug(torch.device(DEVICE))
    path.write_text(json.dumps({"schema": SCHEMA, "device": device,
                                "triton": release or triton.__version__, "entries": entries}))
    return path


@pytest.fixture
def batch(make_batch: Any) -> Any:
    return make_batch(torch.float32, SHAPE)


def test_bucket_classes_are_pure_functions_of_shapes() -> None:
    assert bucket(torch.bfloat16, 128, 4, 16, 8, 8, 8192) == "bf16/d128/g4/p16/b16/q1/kv16k"
    assert bucket(torch.float16, 64, 8, 1, 1, 1, 1024) == "fp16/d64/g8/p1/b1/q1/kv1k"
    assert bucket(torch.float32, 256, 2, 64, 300, 300 * 2000, 200_000) == \
        "fp32/d256/g2/p64/bmax/qmax/kvmax"
    # the class edges: at the bound inside, one past it outside
    assert bucket(torch.bfloat16, 128, 4, 16, 4, 32, 4096).split("/")[4:] == ["b4", "q8", "kv4k"]
    assert bucket(torch.bfloat16, 128, 4, 16, 5, 45, 4097).split("/")[4:] == \
        ["b16", "q128", "kv16k"]
    assert device_slug("NVIDIA H200") == "nvidia-h200"
    assert device_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"


def test_a_table_entry_changes_the_launch_and_no_bit(batch: Any, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    rules = _plan(batch)
    assert rules.tuned is None
    other = "split" if rules.plan == "fused" else "fused"
    # Another plan and pipeline depth: bit-neutral on every GPU (stages schedule loads only).
    stages = 3 if rules.num_stages != 3 else 2
    path = _write_table(tmp_path / "t.json", {_key(batch): {"plan": other,
                                                            "tuning": {"num_stages": stages}}})
    monkeypatch.setenv(TABLE_ENV, str(path))
    tuned = _plan(batch)
    assert (tuned.tuned, tuned.plan, tuned.num_stages) == (_key(batch), other, stages)
    out, lse = _call(batch)
    ref_out, ref_lse = _call(batch, tuning=kernels.Tuning())  # the rules: the table is off
    assert compare_bits(out, ref_out).num_different == 0
    assert compare_bits(lse, ref_lse).num_different == 0
    # The caller's own settings, another plan or split size, and features keep the rules.
    assert _plan(batch, tuning=kernels.Tuning()).tuned is None
    assert _plan(batch, plan=rules.plan).tuned is None
    assert _plan(batch, split_size=2048).tuned is None
    assert _plan(batch, window_left=64).tuned is None
    # A bucket with no entry keeps the rules.
    monkeypatch.setenv(TABLE_ENV, str(_write_table(tmp_path / "u.json", {})))
    assert _plan(batch).tuned is None


@pytest.mark.parametrize("gpu, release", [("another-gpu", None), (None, "0.1.0")])
def test_a_table_of_another_gpu_or_triton_release_is_not_used(
        batch: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpu: str | None,
        release: str | None) -> None:
    path = _write_table(tmp_path / "t.json", {_key(batch): {"plan": "split", "tuning": {}}},
                        device=gpu, release=release)
    monkeypatch.setenv(TABLE_ENV, str(path))
    with pytest.warns(RuntimeWarning, match="the shape rules decide"):
        assert _plan(batch).tuned is None
    monkeypatch.setenv(TABLE_ENV, "off")
    assert _plan(batch).tuned is None


def test_an_entry_the_call_cannot_take_falls_back_to_the_rules(
        batch: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The keys-as-rows tile needs Hopper's Gluon kernels at fp16/bf16: refused for this float32
    # call, so the rules decide, and a warning says so.
    path = _write_table(tmp_path / "t.json", {_key(batch): {"plan": "split",
                                                            "tuning": {"keys_rows": True}}})
    monkeypatch.setenv(TABLE_ENV, str(path))
    with pytest.warns(RuntimeWarning, match="keys_rows=True needs"):
        assert _plan(batch) == _plan(batch, tuning=kernels.Tuning())


def test_a_named_table_of_another_gpu_is_said(batch: Any, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write_table(tmp_path / "t.json", {}, device="some-other-gpu")
    monkeypatch.setenv(TABLE_ENV, str(path))
    with pytest.warns(RuntimeWarning, match="table of some-other-gpu"):
        assert _plan(batch).tuned is None


def test_the_planner_and_the_tuner_agree_on_a_bucket(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from invariance.bench import build_batch
    from invariance.tune import _bucket_of, _family

    w = BenchWorkload("mixed", (1, 7, 1), (40, 90, 200), heads=HEADS, dtype="float32")
    key = _bucket_of(w, _family(w, torch.float32, HEADS, 16))
    b = build_batch(w, HEADS, torch.float32, 16, DEVICE)
    monkeypatch.setenv(TABLE_ENV, str(_write_table(tmp_path / "t.json",
                                                   {key: {"plan": "split", "tuning": {}}})))
    lens = (list(w.q_lens), list(w.kv_lens))
    assert _plan(b, validate=False, host_lens=lens).tuned == key
    assert _plan(b).tuned == key  # the lengths read back give the same bucket


KEY = "bf16/d128/g4/p16/b16/q1/kv16k"


@pytest.mark.parametrize("edit, names", [
    (lambda t: t.update(schema="other/1"), "schema"),
    (lambda t: t.update(device=""), "device"),
    (lambda t: t["entries"][KEY].update(plan="auto"), "plan"),
    (lambda t: t["entries"][KEY].update(tuning={"block_n": 32}), "tuning"),
    (lambda t: t["entries"][KEY].update(tuning={"num_warps": 3}), "Tuning.num_warps"),
    (lambda t: t["entries"][KEY].update(us="fast"), "us"),
    (lambda t: t.update(entries=[]), "entries"),
    (lambda t: t["entries"][KEY].update(tunings={}), "tunings"),
    (lambda t: t.update(rulez=[]), "rulez"),
    (lambda t: t.update(entries={"nonsense": {"plan": "split"}}), "entry key"),
    (lambda t: t.update(device="NVIDIA H200"), "device"),
    (lambda t: t.update(triton="abc"), "triton"),
    (lambda t: t.update(rules=["bf16/d128/g4/p16/b16/q1/kv16K"]), "rules"),
])
def test_a_bad_table_is_named_with_its_field(tmp_path: Path, edit: Any, names: str) -> None:
    table = {"schema": SCHEMA, "device": "x", "triton": "3.6.0",
             "entries": {KEY: {"plan": "split", "tuning": {}}}}
    edit(table)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(table))
    with pytest.raises(ValueError, match=names) as info:
        load_table(path)
    assert str(path) in str(info.value)


def test_an_unreadable_table_in_force_is_a_named_error(batch: Any, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TABLE_ENV, str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match=TABLE_ENV):
        _plan(batch)
    for name, content in (("bad.json", b"{not json"), ("utf16.json", b"\xff\xfe{")):
        (tmp_path / name).write_bytes(content)
        monkeypatch.setenv(TABLE_ENV, str(tmp_path / name))
        with pytest.raises(ValueError, match=f"{TABLE_ENV}.*{name}.*cannot be read as JSON"):
            _plan(batch)


WORKLOAD = BenchWorkload("two-decodes", (1, 1), (150, 90), heads=HEADS, dtype="float32")
SPACE = {"plan": ("fused", "split"), "num_warps": (4, 8)}


def _fake_times(monkeypatch: pytest.MonkeyPatch) -> None:
    """Times by setting: the rules 120 us, fused 80, split 100, 8 warps 30 less."""
    def time_us(self: _Bucket, timer: Any, plan: str, overrides: dict[str, Any]) -> float:
        base = {"auto": 120.0, "fused": 80.0, "split": 100.0}[plan]
        return base - (30.0 if overrides.get("num_warps") == 8 else 0.0)
    monkeypatch.setattr(_Bucket, "time_us", time_us)


def _fake_tuner(monkeypatch: pytest.MonkeyPatch) -> None:
    """:func:`_fake_times` and the small :data:`SPACE` as the declared space (for the CLI)."""
    _fake_times(monkeypatch)
    monkeypatch.setattr("kernels.tuned.TUNABLE", SPACE)


def test_tune_keeps_the_fastest_admitted_setting_and_rejects_its_control(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _fake_times(monkeypatch)
    result = run_tune([WORKLOAD], device=DEVICE, timer=object(), space=SPACE)  # type: ignore[arg-type]
    [b] = result.buckets
    assert result.controls_rejected
    [control] = [t for t in b.trials if t.status.startswith("control")]
    assert control.status == "control-rejected" and control.differing > 0
    assert set(control.tuning) == {"block_n"}  # half the contract's tile: bit-defining
    assert b.entry is not None
    assert (b.entry["plan"], b.entry["tuning"], b.entry["us"]) == ("fused", {"num_warps": 8}, 50.0)
    assert b.rules_us == 120.0
    path = tmp_path / "t.json"
    path.write_text(result.table_json())
    assert load_table(path).entries[b.bucket].tuning == {"num_warps": 8}


def test_tune_fails_when_the_comparison_cannot_see_a_difference(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_times(monkeypatch)
    monkeypatch.setattr(_Bucket, "differing", lambda self, plan, overrides: 0)
    result = run_tune([WORKLOAD], device=DEVICE, timer=object(), space=SPACE)  # type: ignore[arg-type]
    assert not result.controls_rejected
    assert "NOT REJECTED" in result.to_markdown()


def test_a_control_that_cannot_run_fails_the_tune(monkeypatch: pytest.MonkeyPatch) -> None:
    """A control the planner refuses compared no bits: the run must not call it rejected."""
    _fake_times(monkeypatch)
    monkeypatch.setattr("invariance.tune._control_block_n", lambda batch, n: 8)  # not a tile
    result = run_tune([WORKLOAD], device=DEVICE, timer=object(), space=SPACE)  # type: ignore[arg-type]
    [control] = [t for t in result.buckets[0].trials if t.status.startswith("control")]
    assert control.status == "control-refused" and not result.controls_rejected


def test_tune_keeps_the_rules_when_no_candidate_beats_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_Bucket, "time_us", lambda self, timer, plan, overrides: 100.0)
    result = run_tune([WORKLOAD], device=DEVICE, timer=object(), space=SPACE)  # type: ignore[arg-type]
    assert result.buckets[0].entry is None
    assert result.table()["entries"] == {}


def test_tune_rejects_a_setting_that_changes_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    """A candidate whose launch changes the bits (here the rules' output perturbed for the
    split plan) is rejected however fast it is."""
    _fake_times(monkeypatch)
    original = _Bucket._call

    def call(batch: Any, plan: str, overrides: dict[str, Any]) -> Any:
        fn = original(batch, plan, overrides)
        if plan != "split":
            return fn

        def perturbed() -> tuple[torch.Tensor, torch.Tensor]:
            out, lse = fn()
            return out, torch.nextafter(lse, torch.full_like(lse, float("inf")))
        return perturbed
    monkeypatch.setattr(_Bucket, "_call", staticmethod(call))
    monkeypatch.setattr(_Bucket, "time_us",
                        lambda self, timer, plan, overrides: 10.0 if plan == "split" else 90.0)
    result = run_tune([WORKLOAD], device=DEVICE, timer=object(), space=SPACE)  # type: ignore[arg-type]
    [b] = result.buckets
    split = [t for t in b.trials if t.plan == "split"]
    assert "rejected" in {t.status for t in split}
    # every split trial that ran was rejected; one with the rules' own launch is not run
    assert all(t.status == "rejected" or (t.status == "duplicate" and t.same_as == "rules")
               for t in split)
    assert b.entry is None or b.entry["plan"] == "fused"


def test_tune_cli_writes_the_table_and_names_bad_arguments(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake_tuner(monkeypatch)
    table, md = tmp_path / "t.json", tmp_path / "t.md"
    assert main(["tune", "--device", DEVICE, "--lengths", "decode:150,90", "--dtype", "fp32",
                 "--heads", "4:2:64",
                 "--table", str(table), "--markdown", str(md), "--no-progress"]) == 0
    loaded = load_table(table)
    assert loaded.device == _device_slug(torch.device(DEVICE)) and len(loaded.entries) == 1
    assert "| bucket |" in md.read_text()
    capsys.readouterr()
    assert main(["tune", "--device", "cpu", "--lengths", "decode:150", "--table",
                 str(tmp_path)]) == 2
    assert "--table" in capsys.readouterr().err
    assert main(["tune", "--device", "cpu", "--lengths", "decode:150", "--table",
                 str(table), "--margin", "2"]) == 2
    assert "--margin" in capsys.readouterr().err


@pytest.mark.parametrize("path", sorted((Path(kernels.__file__).parent / "tuned").glob("*.json")),
                         ids=lambda p: p.name)
def test_every_shipped_table_loads_and_names_its_gpu(path: Path) -> None:
    from kernels.tuned import TUNABLE

    table = load_table(path)
    raw = json.loads(path.read_text())
    assert table.device == path.stem
    assert table.entries and not set(table.entries) & set(raw["rules"])
    for key, entry in table.entries.items():  # load_table checked each key is a bucket
        # An entry of a feature bucket records the feature values it was proven with.
        assert (key.count("/") == 7) == bool(entry.features), (key, entry.features)
        assert set(entry.tuning) <= set(TUNABLE) - {"plan"}
        assert entry.us is not None and entry.rules_us is not None and entry.us < entry.rules_us


def test_an_interrupted_tune_keeps_its_finished_buckets(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from invariance.tune import _Search

    _fake_tuner(monkeypatch)
    original, calls = _Search.run, []

    def run(self: _Search, space: Any) -> Any:
        calls.append(self.b.key)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return original(self, space)
    monkeypatch.setattr(_Search, "run", run)
    table, md = tmp_path / "t.json", tmp_path / "t.md"
    argv = ["tune", "--device", DEVICE, "--lengths", "decode:150", "--lengths", "decode:150x8",
            "--dtype", "fp32", "--heads", "4:2:64", "--table", str(table), "--markdown", str(md),
            "--no-progress"]
    assert main(argv) == 130
    assert list(load_table(table).entries) == [calls[0]]
    assert not md.exists() and calls[0] in (tmp_path / "t.md.partial").read_text()
    # --resume searches only the bucket the interrupted run did not finish.
    monkeypatch.setattr(_Search, "run", original)
    assert main([*argv, "--resume"]) == 0
    assert set(load_table(table).entries) == set(calls)
    # --again PREFIX searches the buckets it names again and keeps the others; alone (without
    # --resume) or empty it is a usage error.
    searched: list[str] = []

    def counted(self: _Search, space: Any) -> Any:
        searched.append(self.b.key)
        return original(self, space)
    monkeypatch.setattr(_Search, "run", counted)
    assert main([*argv, "--resume", "--again", calls[1]]) == 0
    assert searched == [calls[1]] and set(load_table(table).entries) == set(calls)
    # The table keeps every command that wrote it, the earlier ones first.
    commands = json.loads(table.read_text())["command"].split(" ; ")
    assert len(commands) == 3 and commands[2].endswith(f"--again {calls[1]}")
    assert "--resume" not in commands[0] and "--resume" in commands[1]
    assert main([*argv, "--resume", "--again", "fp32/"]) == 0
    assert sorted(searched[1:]) == sorted(calls)
    # A bucket the run's workloads do not reach stays in the table, even under --again.
    i = argv.index("decode:150x8")
    one = argv[:i - 1] + argv[i + 1:]
    assert main([*one, "--resume", "--again", "fp32/"]) == 0
    assert set(load_table(table).entries) == set(calls) and len(searched) == 4
    # A prefix matches whole fields: fp32/d6 is not fp32/d64.
    assert main([*argv, "--resume", "--again", "fp32/d6"]) == 0 and len(searched) == 4
    for bad, said in ((["--again", "fp32/"], "exists; pass --resume"),
                      (["--resume", "--again", " "], "--again: expected a bucket key or its "
                                                     "leading fields such as bf16/d64, got ' '")):
        assert main([*argv, *bad]) == 2
        assert said in capsys.readouterr().err
    missing = [a if a != str(table) else str(tmp_path / "none.json") for a in argv]
    assert main([*missing, "--resume", "--again", "fp32"]) == 2
    assert "none.json, which does not exist" in capsys.readouterr().err


def test_tune_under_another_contract_is_measured_and_never_applied(
        batch: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``block_n``: the reference and every candidate run at that KV tile (bit-defining), the
    control halves it; the table records it, and the planner never applies such a table."""
    _fake_times(monkeypatch)
    contract = 2 * _plan(batch, tuning=kernels.Tuning()).block_n
    result = run_tune([WORKLOAD], device=DEVICE, timer=object(), space=SPACE,  # type: ignore[arg-type]
                      block_n=contract)
    [b] = result.buckets
    [control] = [t for t in b.trials if t.status.startswith("control")]
    assert control.tuning == {"block_n": contract // 2} and control.status == "control-rejected"
    assert result.controls_rejected and b.entry is not None
    assert "block_n" not in b.entry["tuning"] and f"{contract} keys" in result.to_markdown()
    path = tmp_path / "t.json"
    path.write_text(result.table_json())
    assert load_table(path).block_n == contract
    monkeypatch.setenv(TABLE_ENV, str(path))
    with pytest.warns(RuntimeWarning, match="contract experiment"):
        assert _plan(batch).tuned is None
    with pytest.raises(ValueError, match="block_n: expected a power of two"):
        run_tune([WORKLOAD], device=DEVICE, timer=object(), block_n=48)  # type: ignore[arg-type]
    assert main(["tune", "--device", DEVICE, "--lengths", "decode:9", "--table",
                 str(tmp_path / "u.json"), "--block-n", "24"]) == 2


def test_tune_cli_never_overwrites_a_table_and_says_what_it_left(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake_tuner(monkeypatch)
    table = tmp_path / "t.json"
    table.write_text("mine")
    base = ["tune", "--device", DEVICE, "--dtype", "fp32", "--heads", "4:2:64", "--no-progress",
            "--table", str(table)]
    assert main([*base, "--lengths", "decode:150"]) == 2
    assert "exists; pass --resume" in capsys.readouterr().err and table.read_text() == "mine"
    table.unlink()
    # Out of time before the first bucket: the run is incomplete (exit 1) and says so.
    assert main([*base, "--lengths", "decode:150", "--budget-s", "0"]) == 1
    assert "not searched within --budget-s" in capsys.readouterr().err
    # Rows within one control tile: no control can run there, and the report says so.
    table.unlink()
    assert main([*base, "--lengths", "decode:9"]) == 0
    assert "No control could run in float32 4:2:64 page 16" in capsys.readouterr().out
    base.remove("--heads")
    base.remove("4:2:64")
    for args, flag in ((["--heads", "4:2:100"], "--heads: expected a head dim"),
                       (["--heads", "4:2"], "--heads: expected"),
                       (["--page-size", "3"], "--page-size: expected a power of two"),
                       (["--budget-s", "inf"], "--budget-s: expected finite seconds")):
        assert main([*base, "--lengths", "decode:9", *args]) == 2
        assert flag in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------
# Calls with features: buckets of their own, tuned with the features on
# ------------------------------------------------------------------------------------------------

def test_feature_buckets_are_canonical_and_apart() -> None:
    assert feature_tag() == ""
    assert feature_tag(127, sinks=True) == "w127+sinks"  # the window exactly, never a class
    assert feature_tag(4096, soft_cap=True) != feature_tag(4095, soft_cap=True)
    assert feature_tag(soft_cap=True, fp8=True) == "cap+fp8"
    base = bucket(torch.bfloat16, 64, 8, 16, 8, 8, 8192)
    assert bucket(torch.bfloat16, 64, 8, 16, 8, 8, 8192, "w127+sinks") == f"{base}/w127+sinks"


@pytest.mark.parametrize("tag", ["", "sinks+w64", "cap+sinks", "w1k", "w012", "w-1",
                                 "sinks+sinks", "w64+w128", "x", "W64", "w64+"])
def test_a_bad_feature_bucket_is_named(tmp_path: Path, tag: str) -> None:
    path = _write_table(tmp_path / "t.json", {f"{KEY}/{tag}": {"plan": "split", "tuning": {}}})
    with pytest.raises(ValueError, match=f"{re.escape(str(path))}: entry key"):
        load_table(path)


def test_a_feature_entry_runs_only_calls_with_those_features(
        batch: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sinks = torch.linspace(-1.0, 1.0, HEADS.num_q_heads, device=batch.q.device)
    feats = {"window_left": 64, "sinks": sinks}
    rules = _plan(batch, **feats)
    key = f"{_key(batch)}/w64+sinks"
    other = "split" if rules.plan == "fused" else "fused"
    monkeypatch.setenv(TABLE_ENV, str(_write_table(tmp_path / "t.json",
                                                   {key: {"plan": other, "tuning": {}}})))
    tuned = _plan(batch, **feats)
    assert (tuned.tuned, tuned.plan) == (key, other)
    # The same shapes without the features, or with other ones: other buckets, the rules.
    assert _plan(batch).tuned is None
    assert _plan(batch, window_left=64).tuned is None
    assert _plan(batch, **feats, logits_soft_cap=30.0).tuned is None
    assert _plan(batch, window_left=63, sinks=sinks).tuned is None  # another window
    out, lse = _call(batch, **feats)
    ref_out, ref_lse = _call(batch, tuning=kernels.Tuning(), **feats)
    assert compare_bits(out, ref_out).num_different == 0
    assert compare_bits(lse, ref_lse).num_different == 0


def test_tune_with_features_searches_their_bucket_with_them_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from invariance.backends.kernels import feature_kwargs
    from invariance.bench import build_batch

    _fake_times(monkeypatch)
    features = Features(window=48, sinks=True)
    result = run_tune([WORKLOAD], device=DEVICE, timer=object(), space=SPACE,  # type: ignore[arg-type]
                      features=features)
    [b] = result.buckets
    assert b.bucket.endswith("/w48+sinks") and result.controls_rejected
    assert b.entry is not None and b.entry["features"] == features.to_dict()
    assert b.entry is not None and not any(t.status == "rejected" for t in b.trials)
    path = tmp_path / "t.json"
    path.write_text(result.table_json())
    monkeypatch.setenv(TABLE_ENV, str(path))
    fb = build_batch(WORKLOAD, HEADS, torch.float32, 16, DEVICE, features=features)
    lens = (list(WORKLOAD.q_lens), list(WORKLOAD.kv_lens))
    assert _plan(fb, validate=False, host_lens=lens,
                 **feature_kwargs(fb, kernels.plan_attention)).tuned == b.bucket
    plain = build_batch(WORKLOAD, HEADS, torch.float32, 16, DEVICE)
    assert _plan(plain, validate=False, host_lens=lens).tuned is None


def test_tune_cli_takes_features_and_names_bad_ones(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake_tuner(monkeypatch)
    table = tmp_path / "t.json"
    args = ["tune", "--device", DEVICE, "--lengths", "decode:150,90", "--dtype", "fp32",
            "--heads", "4:2:64", "--no-progress"]
    assert main([*args, "--feature", "window=48,softcap=30", "--table", str(table)]) == 0
    assert [k.rsplit("/", 1)[1] for k in load_table(table).entries] == ["w48+cap"]
    capsys.readouterr()
    for bad, name in ((["--feature", "window=-5"], "window"),
                      (["--feature", "softcap=1e-9"], "logits_soft_cap"),  # the kernels' range
                      (["--kv-dtype", "fp8_e4m3"], "k_cache")):  # FP8 with float32 queries
        assert main([*args, *bad, "--table", str(tmp_path / "u.json")]) == 2
        assert name in capsys.readouterr().err
        assert not (tmp_path / "u.json").exists()


def _search_with(times: Any) -> tuple[Any, list[tuple[str, dict[str, Any]]],
                                      list[tuple[str, dict[str, Any], float]]]:
    """A bucket's search (``_Search``) whose candidates take their times from ``times(plan,
    overrides)`` (None: the planner refuses them) and whose selection is recorded: the search,
    the candidates tried and the selections, in order."""
    from types import SimpleNamespace

    from invariance.tune import Trial, _Search

    tried: list[tuple[str, dict[str, Any]]] = []
    selected: list[tuple[str, dict[str, Any], float]] = []

    def trial(plan: str, overrides: dict[str, Any]) -> Trial:
        tried.append((plan, dict(overrides)))
        t = times(plan, overrides)
        return Trial(plan, dict(overrides), "admitted" if t else "refused", us=t)

    search = object.__new__(_Search)
    search.margin = 0.03
    search.trial = trial
    search._select = lambda plan, o, u: selected.append((plan, o, u))
    search.b = SimpleNamespace(signature=lambda plan, o: (plan, tuple(sorted(o.items()))))
    search.rules_sig = ("auto", ())
    search.result = "result"
    return search, tried, selected


def test_the_search_descends_from_each_kernel_family() -> None:
    """Each plan on each kernel family is a base of the search: the Gluon tile (90 us) takes
    no stage count, the Triton kernels (100 us) run 80 us with 5 stages, and that is what is
    selected (a search that kept the Gluon tile first never tried it)."""
    def us(plan: str, overrides: dict[str, Any]) -> float | None:
        if overrides.get("gluon"):
            return None if "num_stages" in overrides else 90.0  # the planner refuses
        return 80.0 if overrides.get("num_stages") == 5 else 100.0

    search, tried, selected = _search_with(us)
    space = {"plan": ("fused",), "gluon": (False, True), "num_stages": (2, 5)}
    assert search.run(space) == "result"
    assert selected == [("fused", {"gluon": False, "num_stages": 5}, 80.0)]
    assert ("fused", {"gluon": True, "num_stages": 5}) in tried  # the Gluon base descended too
    assert all(set(o) <= {"gluon", "num_stages"} for _, o in tried)


def test_the_keys_as_rows_tile_is_a_split_plan_base() -> None:
    """The keys-as-rows tile is a family of its own in the split plan (the rules take it only
    for decode batches, and it takes no override a descent from the Triton base may have fixed
    first): its base is searched and selected at 60 us against the Triton kernels' 70 us with
    8 warps (which the tile refuses); the fused plan has no such base."""
    def us(plan: str, overrides: dict[str, Any]) -> float | None:
        if overrides.get("keys_rows"):
            return None if plan == "fused" or "num_warps" in overrides else 60.0
        return 70.0 if overrides.get("num_warps") == 8 else 100.0

    search, tried, selected = _search_with(us)
    space = {"plan": ("fused", "split"), "num_warps": (4, 8), "keys_rows": (False, True)}
    assert search.run(space) == "result"
    assert selected == [("split", {"keys_rows": True}, 60.0)]
    assert tried[2] == ("split", {"keys_rows": True})  # a base, after the two plans' own
    assert ("fused", {"keys_rows": True}) not in tried[:3]


def test_the_feature_probe_runs_on_the_tuning_device(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The planner refuses tensors off the tuning device, so `invariance tune --feature` builds
    its probe of the features there (a CPU probe made every feature run on a GPU exit 2): on
    the device it is given (a device this machine lacks, to tell it from the CPU), and from the
    CLI on the run's device."""
    import invariance.tune as tune_module

    class Built(Exception):
        pass

    def stop(*args: Any, **kwargs: Any) -> Any:
        raise Built(str(args[4]))
    monkeypatch.setattr(tune_module, "build_batch", stop)
    with pytest.raises(Built, match=r"^meta$"):
        tune_module.check_features(Features(window=8), torch.float32, HEADS, 16, "meta")
    monkeypatch.undo()
    _fake_tuner(monkeypatch)
    built, original = [], tune_module.build_batch

    def spy(*args: Any, **kwargs: Any) -> Any:
        built.append(str(kwargs["device"] if "device" in kwargs else args[4]))
        return original(*args, **kwargs)
    monkeypatch.setattr(tune_module, "build_batch", spy)
    assert main(["tune", "--device", DEVICE, "--lengths", "decode:150", "--dtype", "fp32",
                 "--heads", "4:2:64", "--feature", "window=8", "--no-progress", "--table",
                 str(tmp_path / "t.json")]) == 0
    assert built and set(built) == {DEVICE}  # the probe, then the bucket's batch


def test_a_bucket_whose_control_is_admitted_stays_out_of_the_table(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A window of 0 (each query sees its own key alone): no tile can change a bit, so no
    control runs; a bucket whose control ran and was admitted is left for --resume."""
    _fake_times(monkeypatch)
    result = run_tune([WORKLOAD], device=DEVICE, timer=object(), space=SPACE,  # type: ignore[arg-type]
                      features=Features(window=0))
    [b] = result.buckets
    assert not any(t.status.startswith("control") for t in b.trials) and not b.unproven
    assert result.uncontrolled
    monkeypatch.setattr("invariance.tune._Search.control", lambda self: False)
    result = run_tune([WORKLOAD], device=DEVICE, timer=object(), space=SPACE)  # type: ignore[arg-type]
    [b] = result.buckets
    assert b.unproven and not result.controls_rejected
    assert result.table()["entries"] == {} and result.table()["rules"] == []
