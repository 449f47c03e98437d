"""``invariance model`` on Hugging Face ``transformers`` models built from configs (random
weights, nothing downloaded): the shipped configs, local directories, and the attention swap
through transformers' attention registry (``reference`` and, in the Triton interpreter,
``kernels``)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

import model_zoo as zoo

from invariance.model import CONFIGS, check_model, load_model
from invariance.model.attention import swap_attention

CPU = {"device": "cpu"}


def _logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits  # type: ignore[no-any-return]


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to open a connection fails the test."""
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"network access attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_shipped_configs_build_offline_and_run(name: str, no_network: None) -> None:
    loaded = load_model(name)
    assert os.environ.get("HF_HUB_OFFLINE")  # set before transformers is imported
    assert loaded.huggingface and "random weights (seed 0)" in loaded.source
    assert not loaded.module.training
    ids = torch.arange(6).view(1, 6)
    # A fixed seed gives the same weights every time.
    assert torch.equal(_logits(loaded.module, ids), _logits(load_model(name).module, ids))
    assert not torch.equal(_logits(loaded.module, ids),
                           _logits(load_model(name, seed=1).module, ids))


def test_config_overrides_and_unknown_fields() -> None:
    model = load_model("llama:num_hidden_layers=3,hidden_size=128").module
    assert model.config.num_hidden_layers == 3 and model.config.hidden_size == 128
    with pytest.raises(ValueError, match="LlamaConfig has no field 'hidden_sizes'"):
        load_model("llama:hidden_sizes=3")
    with pytest.raises(ValueError, match="expected config overrides as key=value"):
        load_model("llama:layers")


def test_local_directories_load_config_or_weights(tmp_path: Path, no_network: None) -> None:
    original = load_model("llama", seed=3).module
    config_only, with_weights = tmp_path / "config", tmp_path / "weights"
    original.config.save_pretrained(config_only)
    original.save_pretrained(with_weights)
    ids = torch.arange(5).view(1, 5)
    saved = load_model(str(with_weights))
    assert "its weights" in saved.source
    assert torch.equal(_logits(saved.module, ids), _logits(original, ids))
    fresh = load_model(str(config_only), seed=3)
    assert "random weights" in fresh.source
    assert load_model(str(config_only / "config.json")).module.config.hidden_size == 64
    with pytest.raises(ValueError, match="a directory without one"):
        load_model(str(tmp_path))


def test_planted_linear_in_a_transformers_model_is_named() -> None:
    report = check_model(zoo.hf_planted_llama, attention="reference", scenarios="batch",
                         batch_sizes=[2], **CPU)
    o = report.origin
    assert o is not None and o.path == "model.layers.1.mlp.down_proj"
    assert o.module_type == "BatchVariantLinear" and o.op is not None
    assert o.op.name == "aten::sum"
    assert report.attention == "reference"
    # Fixed (row-wise Linears, the reference attention): every scenario passes.
    fixed = check_model(zoo.hf_invariant_llama, attention="reference",
                        scenarios="batch,pad-left,pad-right,decode,decode-vs-prefill",
                        batch_sizes=[2], **CPU)
    assert fixed.passed, fixed.summary()
    assert [s.status for s in fixed.scenarios] == ["identical"] * 5


def test_kernels_attention_swap_is_invariant_in_the_interpreter() -> None:
    report = check_model(zoo.hf_invariant_llama, attention="kernels", scenarios="batch,decode",
                         batch_sizes=[2], length=6, decode_steps=2, **CPU)
    assert report.passed, report.summary()
    assert report.attention == "kernels"


def test_swap_restores_the_model_and_refuses_other_masks() -> None:
    model = load_model("qwen2-sliding").module
    before = model.config._attn_implementation
    ids = torch.arange(8).view(1, 8)  # longer than the window of 4
    with swap_attention(model, "reference") as name:
        assert name == "reference"
        with pytest.raises(ValueError, match="sliding window of 4"):
            _logits(model, ids)
    assert model.config._attn_implementation == before
    report = check_model("qwen2-sliding", attention="reference", scenarios="batch",
                         batch_sizes=[2], **CPU)
    assert report.scenarios[0].status == "error" and "sliding window" in report.scenarios[0].reason
    assert not report.passed


def test_swapped_attention_matches_sdpa_closely() -> None:
    model = load_model("llama").module
    ids = torch.randint(0, 256, (3, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[0, :2] = 0  # left padding
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        with swap_attention(model, "reference"):
            got = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    valid = mask.bool()
    torch.testing.assert_close(got[valid], want[valid], rtol=1e-4, atol=1e-5)


def test_moe_and_default_stacks_report_without_errors() -> None:
    # Whether the CPU's GEMMs and SDPA are batch-invariant depends on the CPU and the torch
    # build; what must hold anywhere: nothing errors, and a divergence has an origin and an op.
    for name in ("mixtral", "llama"):
        report = check_model(name, scenarios="batch,decode", batch_sizes=[2], **CPU)
        for s in report.scenarios:
            assert s.status in ("identical", "diverged"), s.reason
            if s.status == "diverged":
                assert s.origin is not None and s.origin.diff.num_different > 0
                assert s.curve and s.curve[-1].label == "output"


class _Counting:
    """The reference backend, counting its calls (proves the swap routes through it)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, batch: object) -> object:
        from invariance.backends.reference import reference_backend

        self.calls += 1
        return reference_backend(batch)  # type: ignore[arg-type]


def test_the_swap_routes_attention_and_a_variant_backend_is_caught() -> None:
    counting = _Counting()
    report = check_model(zoo.hf_invariant_llama, attention=counting, scenarios="batch",
                         batch_sizes=[2], **CPU)
    assert report.passed and counting.calls >= 4  # two layers, two runs at least
    # Negative control: the harness's deliberately batch-variant attention (KV chunks of
    # 128 // batch size tokens: 4 at a batch of 32, one chunk alone), swapped in, is named as
    # the origin (the attention module, and the torch op inside it).
    bad = check_model(zoo.hf_invariant_llama, attention="torch-batch-variant",
                      scenarios="batch", batch_sizes=[32], shrink=False, **CPU)
    o = bad.origin
    assert o is not None and o.path == "model.layers.0.self_attn"
    assert o.module_type == "LlamaAttention" and o.op is not None
    assert [g.module_type for g in bad.scenarios[0].origins] == ["LlamaAttention"]
