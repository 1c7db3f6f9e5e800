"""A training case's whole-model runs are made once, split across its ranks (training/steps.py, WHOLE_RUN_MAKERS):
as it is on rank 0, the float64 truth on rank 1, in another order on rank 2 (rank 0 of 2), every rank comparing
with the same numbers. Run on 2 and 4 CPU ranks with gloo, as the cells run it."""

from __future__ import annotations

import pytest

from harness.ranks import run_distributed

pytest.importorskip("torch")
pytest.importorskip("transformers")

STEPS = 2


def trained_runs(checkpoint: str, layout: str) -> dict:
    """Run a training case on this rank, noting each run `train_step` stepped; then what the rank compared with."""
    import torch
    from checks.kinds import Layout
    from training import steps

    stepped = []
    original = steps.train_step

    def noting(run, step, loss_of):
        if getattr(loss_of, "__name__", "") == "sharded_loss":
            stepped.append("sharded")
        elif next(run.model.parameters()).dtype == torch.float64:
            stepped.append("truth")
        else:
            stepped.append("other order" if run.other_order else "as is")
        return original(run, step, loss_of)

    steps.train_step = noting
    try:
        case = steps.TrainCase("qwen3_moe", Layout(layout), steps=STEPS, reuse_whole_runs=False)
        metrics = steps.run_training(checkpoint, case)
    finally:
        steps.train_step = original
    return {"stepped": sorted(stepped), "metrics": metrics}


@pytest.mark.parametrize(("world_size", "made_by"), [
    (2, [["as is", "other order"], ["truth"]]),
    (4, [["as is"], ["truth"], ["other order"], []]),
])
def test_each_whole_run_is_made_on_one_rank_and_every_rank_compares_with_its_numbers(checkpoints, world_size,
                                                                                      made_by):
    checkpoint = checkpoints("qwen3_moe").path
    results = [result.value for result in run_distributed(world_size, trained_runs, checkpoint, "fsdp_ep",
                                                          timeout=300, device="cpu")]
    assert [result["stepped"] for result in results] == [sorted(["sharded", *made] * STEPS) for made in made_by]
    # what every rank measured the sharded run against: the same whole runs, to the bit
    whole = [{name: value for name, value in result["metrics"].items() if name.startswith("whole_")}
             for result in results]
    assert whole[0] and all(each == whole[0] for each in whole)
