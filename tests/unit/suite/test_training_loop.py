"""The training layer's parts that need no ranks: what a case may ask for, the steps' data, the per-mesh clip
against torch's own, and the messages a failing step gives."""

from __future__ import annotations

import re

import pytest
import torch
from training import steps


def test_a_case_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="unknown optimizer 'lion'"):
        steps.TrainCase("mixtral", "ep", optimizer="lion")
    with pytest.raises(ValueError, match="resume_at 3: a step before the last"):
        steps.TrainCase("mixtral", "ep", steps=3, resume_at=3)
    with pytest.raises(ValueError, match="stale_optimizer_state needs resume_at >= 2"):
        steps.TrainCase("mixtral", "ep", steps=4, resume_at=1, bug="stale_optimizer_state")
    with pytest.raises(ValueError, match="unknown clip"):
        steps.TrainCase("mixtral", "ep", clip="norm")


def test_the_known_bugs_table_sees_a_training_case_by_what_it_runs():
    assert steps.TrainCase("mixtral", "ep").checks == ("load", "train")
    assert steps.TrainCase("mixtral", "ep", clip="torch", optimizer="fused").checks == (
        "load", "train", "torch_clip", "fused_adamw")
    # EP and FSDP2+EP put parameters on several meshes: the loop clips per mesh unless the case asks for torch's
    assert [steps.TrainCase("mixtral", layout).clipping for layout in ("ep", "fsdp_ep")] == ["per_mesh"] * 2
    assert steps.TrainCase("qwen3", "fsdp").clipping == "torch"


def test_a_case_with_the_one_step_checks_or_mixed_precision_says_so_to_the_known_bugs_table():
    assert steps.TrainCase("mixtral", "fsdp_ep", one_step=True).checks == ("load", "logits", "gradients", "train")
    mixed = steps.TrainCase("qwen3", "fully_shard", dtype="bfloat16", mixed_precision=True)
    assert mixed.checks == ("load", "train", "mixed_precision") and mixed.parameter_dtype == "float32"
    assert steps.TrainCase("qwen3", "fsdp", dtype="bfloat16").parameter_dtype == "bfloat16"
    for dtype, layout in (("float32", "fsdp"), ("bfloat16", "ep")):  # mixed precision: bfloat16 on an FSDP2 layout
        with pytest.raises(ValueError, match="mixed precision computes in bfloat16 on an FSDP2 layout"):
            steps.TrainCase("mixtral" if layout == "ep" else "qwen3", layout, dtype=dtype, mixed_precision=True)


def test_the_whole_runs_kept_are_the_latest_and_found_only_by_all_that_determines_them(tmp_path):
    runs = steps.WholeRuns(tmp_path / "rank0")
    results = [(steps.StepResult(1.0, 2.0, {"w": torch.arange(3.0)}, {"w": torch.ones(2, dtype=torch.float64)}),)]

    def found(key):
        got = runs.get(key)
        return got is not None and got[0][0].loss == 1.0 and torch.equal(
            got[0][0].params["w"], results[0][0].params["w"])

    runs.put(("a",), results)
    runs.put(("b",), results)
    assert found(("a",))  # and now the latest
    runs.put(("a",), results)
    runs.put(("c",), results)  # the oldest, b, goes
    assert not found(("b",)) and found(("a",)) and found(("c",))
    assert sorted(path.name for path in (tmp_path / "rank0").iterdir()) == sorted(
        steps.handover.entry_name(key) for key in (("a",), ("c",)))
    # another process's ranks (a later test's) read them as they were written, grads and float64 params included
    again = steps.WholeRuns(tmp_path / "rank0").get(("c",))[0][0]
    assert torch.equal(again.grads["w"], torch.arange(3.0)) and again.params["w"].dtype == torch.float64
    # with no folder (no pool: nothing is handed on) nothing is kept
    nowhere = steps.WholeRuns(None)
    nowhere.put(("a",), results)
    assert nowhere.get(("a",)) is None

    class Config:
        _experts_implementation = "grouped_mm"

    class Model:
        config = Config()

    def key(**options):
        return steps.whole_runs_key("ckpt", steps.TrainCase("mixtral", **options), Model(), 2, None)

    # EP and FSDP2+EP (and a requested implementation the whole model resolved the same) share their whole runs
    assert key(layout="ep", experts_implementation="grouped_mm") == key(layout="fsdp_ep")
    # what changes the whole model's arithmetic changes the key
    assert len({key(layout="ep"), key(layout="ep", dtype="bfloat16"), key(layout="ep", optimizer="fused"),
                key(layout="ep", clip="torch"), key(layout="ep", steps=4)}) == 5


def test_every_micro_batch_and_step_feeds_other_data_and_the_other_order_the_same_data():
    first, second = steps.micro_batches(1), steps.micro_batches(2)
    batches = [*first, *second]
    assert len(first) == steps.MICRO_BATCHES
    assert all(not torch.equal(a, b) for i, a in enumerate(batches) for b in batches[i + 1:])
    other = steps.micro_batches(1, other_order=True)
    assert [torch.equal(a, b.flip(0)) for a, b in zip(first, reversed(other), strict=True)] == [True, True]


def test_the_per_mesh_clip_equals_torchs_where_there_is_one_mesh():
    torch.manual_seed(0)
    models = [torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    norms = []
    inputs = torch.randn(4, 8)
    for model, clip in zip(models, ("torch", "per_mesh"), strict=True):
        model(inputs).square().sum().mul(100).backward()
        norms.append(steps.clip_gradients(model, clip).item())
    assert norms[0] == pytest.approx(norms[1], rel=1e-6) and norms[0] > steps.MAX_GRAD_NORM
    for one, other in zip(models[0].parameters(), models[1].parameters(), strict=True):
        assert torch.allclose(one.grad, other.grad, rtol=1e-6, atol=0)
    clipped = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in models[1].parameters()]))
    assert clipped.item() == pytest.approx(steps.MAX_GRAD_NORM, rel=1e-5)


def test_a_scalar_over_its_bound_names_the_step_the_quantity_and_both_runs():
    assert steps.scalar_problem(2, "loss", 4.0000001, [4.0000002, 3.9999999], 4.0, "float32") is None
    problem = steps.scalar_problem(2, "loss", 4.1, [4.0000002, 3.9999999], 4.0, "float32")
    assert re.fullmatch(r"step 2: loss 4\.1 differs from the float64 run's 4 by 0\.1, over its bound \S+ "
                        r"\(the whole model's run: 4\.0000002\)", problem), problem
    # a NaN is never within a bound
    assert steps.scalar_problem(1, "gradient norm", float("nan"), [1.0], 1.0, "float32").startswith("step 1: ")
