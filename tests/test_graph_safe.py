"""The planning protocol: ``plan(batch)`` runs before every call, outside the CUDA-graph capture,
on the static buffers the graph is captured on. On CPU the CUDA graph functions are replaced by
fakes that record the order of events."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from invariance import Chunk, HeadConfig, PageLayout, Request, Schedule, Step, Workload
from invariance.backends import planner, resolve
from invariance.backends.reference import reference_backend
from invariance.batch import AttentionBatch, AttentionResult
from invariance.schedule import run_schedule

WL = Workload((Request(0, 9), Request(1, 5), Request(2, 12)), HeadConfig(4, 2, 64),
              torch.float32, seed=2)
STEPS = (Step((Chunk(0, 0, 9), Chunk(1, 4, 5))), Step((Chunk(2, 3, 12), Chunk(1, 0, 0))))


class Recorder:
    """A backend with a planning step that records what happens, in order."""

    def __init__(self, log: list[tuple[Any, ...]]) -> None:
        self.log = log
        self.planned: AttentionBatch | None = None

    def plan(self, batch: AttentionBatch, *, graph: bool = False) -> None:
        self.log.append(("plan", graph, id(batch)))
        self.planned = batch

    def __call__(self, batch: AttentionBatch) -> AttentionResult:
        assert batch is self.planned, "called on a batch that was not planned"
        self.log.append(("call", id(batch)))
        return reference_backend(batch)


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    log: list[tuple[Any, ...]] = []

    class Stream:
        def __init__(self, *args: object) -> None:
            pass

        def wait_stream(self, other: object) -> None:
            pass

    class Graph:
        def replay(self) -> None:
            log.append(("replay",))

    @contextlib.contextmanager
    def graph(g: Graph) -> Iterator[None]:
        log.append(("capture-begin",))
        yield
        log.append(("capture-end",))

    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    return log


def test_graphed_step_plans_on_static_buffers_before_capture(
        fake_cuda: list[tuple[Any, ...]]) -> None:
    backend = Recorder(fake_cuda)
    out = run_schedule(resolve(backend), WL, Schedule(STEPS[:1], graph=True), "cpu")
    assert [e[0] for e in fake_cuda] == [
        "plan", "call", "capture-begin", "call", "capture-end", "replay"]
    plan, warm, _, capture, _, _ = fake_cuda
    assert plan[1] is True  # graph=True reaches a plan that accepts it
    assert plan[2] == warm[1] == capture[1]  # one static batch throughout
    ref = run_schedule(reference_backend, WL, Schedule(STEPS[:1]), "cpu")
    assert out.keys == ref.keys and torch.equal(out.out, ref.out)


def test_replay_sees_the_real_values_copied_into_zeroed_buffers(
        fake_cuda: list[tuple[Any, ...]], monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}
    backend = Recorder(fake_cuda)
    graph_cls = torch.cuda.CUDAGraph

    class CheckingGraph(graph_cls):  # type: ignore[misc, valid-type]
        def replay(self) -> None:
            static = backend.planned
            assert static is not None
            seen["static_q"] = static.q.clone()
            seen["static_k"] = static.k_cache.clone()
            super().replay()

    monkeypatch.setattr(torch.cuda, "CUDAGraph", CheckingGraph)
    zeroed: list[int] = []
    real_zero = torch.Tensor.zero_

    def spy_zero(t: torch.Tensor) -> torch.Tensor:
        zeroed.append(t.numel())
        return real_zero(t)

    monkeypatch.setattr(torch.Tensor, "zero_", spy_zero)
    from invariance.schedule import materialize

    batch = materialize(WL, STEPS[0], PageLayout(), "cpu")
    run_schedule(backend, WL, Schedule(STEPS[:1], graph=True), "cpu")
    assert torch.equal(seen["static_q"], batch.q)
    assert torch.equal(seen["static_k"], batch.k_cache)
    assert sorted(zeroed) == sorted([batch.q.numel(), batch.k_cache.numel(),
                                     batch.v_cache.numel()])
    assert backend.planned is not None and backend.planned.q.data_ptr() != batch.q.data_ptr()


def test_eager_steps_plan_before_every_call() -> None:
    log: list[tuple[Any, ...]] = []
    backend = Recorder(log)
    run_schedule(backend, WL, Schedule(STEPS), "cpu")
    assert [e[0] for e in log] == ["plan", "call", "plan", "call"]
    assert all(e[1] is False for e in log if e[0] == "plan")
    assert log[0][2] == log[1][1] and log[2][2] == log[3][1]


def test_planner_finds_the_hook_and_passes_graph_only_when_accepted() -> None:
    assert planner(reference_backend) is None
    calls: list[tuple[Any, ...]] = []

    class PlainPlan:
        def plan(self, batch: AttentionBatch) -> None:
            calls.append(("plain", batch))

        def __call__(self, batch: AttentionBatch) -> AttentionResult:
            return reference_backend(batch)

    class KwargsPlan(PlainPlan):
        def plan(self, batch: AttentionBatch, **kw: Any) -> None:  # type: ignore[override]
            calls.append(("kwargs", kw))

    p = planner(PlainPlan())
    assert p is not None
    p("b", True)  # type: ignore[arg-type]
    k = planner(resolve(KwargsPlan()))
    assert k is not None
    k("b", True)  # type: ignore[arg-type]
    assert calls == [("plain", "b"), ("kwargs", {"graph": True})]


def test_builtin_planning_backends_declare_cuda_graphs() -> None:
    from invariance.backends import capabilities

    for name in ("sdpa-math", "sdpa-flash", "flashinfer", "kernels"):
        assert planner(resolve(name)) is not None
        assert capabilities(resolve(name)).cuda_graphs


def test_kernels_backend_passes_the_planned_host_lengths(monkeypatch) -> None:
    # plan(batch) takes the lengths on the host; the next call on that batch hands them to
    # kernels.unified_attention (no sync inside a capture), a call on another batch does not.
    import kernels
    from invariance.backends.kernels import KernelsBackend
    from invariance.schedule import materialize

    seen: list[Any] = []

    def fake(q: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        seen.append(kwargs.get("host_lens"))
        return torch.zeros_like(q), torch.zeros(q.shape[:2])

    monkeypatch.setattr(kernels, "unified_attention", fake)
    batch = materialize(WL, STEPS[0], PageLayout(4), "cpu")
    other = materialize(WL, STEPS[1], PageLayout(4), "cpu")
    backend = KernelsBackend()
    backend.plan(batch)
    backend(batch)
    backend(other)
    assert seen == [([9, 1], [9, 5]), None]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_real_cuda_graph_matches_eager_for_a_planning_backend() -> None:  # pragma: no cover
    wl = Workload(WL.requests, WL.heads, torch.bfloat16, seed=2)
    backend = resolve("sdpa-math")
    eager = run_schedule(backend, wl, Schedule(STEPS), "cuda")
    graphed = run_schedule(backend, wl, Schedule(STEPS, graph=True), "cuda")
    assert eager.keys == graphed.keys
    assert torch.equal(eager.out.view(torch.int16), graphed.out.view(torch.int16))
    assert torch.equal(eager.lse.view(torch.int32), graphed.lse.view(torch.int32))
