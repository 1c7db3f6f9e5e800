"""The fixed body of every script `harness repro` writes (upstream/repro_writer.py): torch and transformers only.

The writer replaces this docstring with the case's and the `CASE: dict = {}` line with the case as a literal, and
changes nothing else. Imported as it is (CASE empty), it builds a case's tiny model for the writer, which checks
that the script's weights are the suite's checkpoint, tensor for tensor.

Which process runs what: the parent builds the tiny model from CASE, saves it to a temporary folder and spawns
CASE["world_size"] ranks (torch.multiprocessing). Each rank joins the group (a FileStore in that folder: no port),
loads the model whole, in float64 (the truth every bound is measured against, as in the suite) and sharded by
transformers, and runs the case's checks in order. A rank whose check fails writes what it raised to the folder
and exits 1; the parent prints the failure that came first and exits 1, or prints "no failure" and exits 0.
"""

import contextlib
import datetime
import importlib
import json
import math
import os
import socket
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Shard
from torch.overrides import TorchFunctionMode

# The case, as data: written by upstream/repro_writer.py from the suite's own values.
CASE: dict = {}

# What each rank is doing, for the failure record.
STAGE = ["starting"]
# A collective that waits longer is a hang: it raises, naming the stage, instead of waiting forever.
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=5)


def main() -> int:
    folder = tempfile.mkdtemp(prefix="repro-")
    checkpoint = os.path.join(folder, "checkpoint")
    build_model(CASE).save_pretrained(checkpoint)
    print(f"tiny checkpoint saved to {checkpoint}; {CASE['world_size']} ranks on {CASE['device']}", flush=True)
    died = None
    try:
        mp.spawn(rank_main, args=(CASE, folder), nprocs=CASE["world_size"], join=True)
    except Exception as error:  # a rank exited non-zero: its failure record says why
        died = error
    return report(folder, died)


# ---------------------------------------------------------------- the tiny model, as the suite builds it


def imported(path: str):
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def tensor_at(model, name: str) -> torch.Tensor:
    module, _, attribute = name.rpartition(".")
    return getattr(model.get_submodule(module) if module else model, attribute)


def build_model(case: dict):
    """The config's own init under a fixed seed, then (an MoE) the suite's routing code written into the weights."""
    spec = case["model"]
    config = imported(spec["config_class"])(**spec["config"])
    torch.manual_seed(case["weights"]["seed"])
    model = imported(spec["model_class"])(config)
    moe = case["weights"]["moe"]
    if moe is not None:
        with torch.no_grad():
            for name, std in moe["drawn"]:  # expert stacks the model's own init leaves empty
                tensor_at(model, name).normal_(0.0, std)
            write_routing_code(model, moe)
    return model


def write_routing_code(model, moe: dict) -> None:
    """Token t's embedding carries a code in the first E channels that sends it to experts token_experts[t] in every
    MoE layer: nothing else writes those channels (every output into the residual stream is zero there), and each
    router reads only its expert's channel. The router's own biases get small distinct values."""
    experts = moe["experts"]
    table = model.get_input_embeddings().weight
    table.normal_(0.0, moe["content_std"])
    table[:, :experts] = 0.0
    for token, chosen in enumerate(moe["token_experts"]):
        for expert, value in zip(chosen, moe["code_values"], strict=True):
            table[token, expert] = value
    for name, dim in moe["zero_code_rows"]:
        tensor_at(model, name).narrow(dim, 0, experts).zero_()
    for router in moe["routers"]:
        for weight_name, bias_name in router["pass_through"]:  # a router that is an MLP copies the code through
            weight = tensor_at(model, weight_name)
            weight[:experts, :] = 0.0
            weight[:experts, :experts] = torch.eye(experts)
            if bias_name is not None:
                tensor_at(model, bias_name)[:experts] = 0.0
        weight = tensor_at(model, router["weight"])
        weight.zero_()
        weight[:experts, :experts] = router["gain"] * torch.eye(experts)
        for name in router["token_tables"]:  # a hash router's token -> experts table
            table_buffer = tensor_at(model, name)
            table_buffer.copy_(torch.tensor(moe["token_experts"][: table_buffer.shape[0]]))
        for name in router["small_biases"]:
            tensor_at(model, name).copy_(torch.tensor(moe["small_bias"]))


# ---------------------------------------------------------------- the ranks


def rank_main(rank: int, case: dict, folder: str) -> None:
    try:
        device = join_group(rank, case, folder)
        run_checks(case, os.path.join(folder, "checkpoint"), device)
    except BaseException as error:  # the finding: recorded, then this rank leaves without tearing the group down
        record_failure(folder, rank, error)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    dist.destroy_process_group()


def join_group(rank: int, case: dict, folder: str) -> torch.device:
    world_size = case["world_size"]
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    store = dist.FileStore(os.path.join(folder, "store"), world_size)
    if case["device"] == "cuda":
        torch.cuda.set_device(rank)
        # float32 means float32: TF32 matmuls would put 1e-3 of noise under a 1e-6 bound
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        dist.init_process_group("nccl", store=store, rank=rank, world_size=world_size, timeout=COLLECTIVE_TIMEOUT)
        return torch.device("cuda", rank)
    if "GLOO_SOCKET_IFNAME" not in os.environ and any(name == "lo" for _, name in socket.if_nameindex()):
        os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # every rank is on this host
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=COLLECTIVE_TIMEOUT)
    return torch.device("cpu")


def stage(words: str) -> None:
    STAGE[0] = words


def record_failure(folder: str, rank: int, error: BaseException) -> None:
    frames = traceback.extract_tb(error.__traceback__)
    where = [f"{short_path(frame.filename)}:{frame.lineno} in {frame.name}" for frame in frames]
    record = {
        "rank": rank,
        "time": time.time(),
        "stage": STAGE[0],
        "type": type(error).__qualname__,
        "first_line": (str(error).strip().splitlines() or ["(no message)"])[0],
        "raised_at": where[-1] if where else None,
        "transformers_frames": [frame for frame in where if frame.startswith("transformers/")][-3:],
        "traceback": "".join(traceback.format_exception(type(error), error, error.__traceback__)),
    }
    with open(os.path.join(folder, f"failure-rank{rank}.json"), "w") as file:
        json.dump(record, file)


def short_path(filename: str) -> str:
    for marker in ("site-packages/", "dist-packages/"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    return os.path.basename(filename)


def report(folder: str, died: Exception | None) -> int:
    """The failure that came first (and the other ranks' after it), exit 1; or "no failure", exit 0."""
    records = []
    for name in os.listdir(folder):
        if name.startswith("failure-rank"):
            with open(os.path.join(folder, name)) as file:
                records.append(json.load(file))
    records.sort(key=lambda record: record["time"])
    if not records:
        if died is not None:
            print(f"FAILED: a rank died without an exception: {died}")
            return 1
        print(f"no failure: {', '.join(CASE['checks'])} matched the whole model on {CASE['world_size']} ranks")
        return 0
    first = records[0]
    print(f"FAILED on rank {first['rank']} while {first['stage']}:")
    for record in records:
        print(f"rank {record['rank']}: {record['type']}: {record['first_line']}")
        callers = [frame for frame in reversed(record["transformers_frames"]) if frame != record["raised_at"]]
        through = f" (from {' <- '.join(callers)})" if callers else ""
        print(f"rank {record['rank']}:   raised at {record['raised_at']}{through}")
    if "--traceback" in sys.argv[1:]:
        print(first["traceback"])
    return 1


# ---------------------------------------------------------------- loading


def from_pretrained(case: dict, path: str, kwargs: dict):
    kwargs = dict(kwargs)
    kwargs["dtype"] = getattr(torch, kwargs["dtype"])
    if "distributed_config" in kwargs:
        from transformers.distributed.configuration_utils import DistributedConfig

        kwargs["distributed_config"] = DistributedConfig(**kwargs["distributed_config"])
    return imported(case["model"]["model_class"]).from_pretrained(path, **kwargs)


def load_whole(case: dict, path: str, device: torch.device):
    return from_pretrained(case, path, case["load"]["whole"]).to(device)


def load_reference(case: dict, path: str, device: torch.device):
    """The truth: the whole model with exactly the case dtype's weights, computed in float64 by the eager experts."""
    return from_pretrained(case, path, case["load"]["reference"]).to(device).to(torch.float64)


def load_sharded(case: dict, path: str, device: torch.device):
    """transformers' own distributed loading; or (fully_shard) the whole model with torch's fully_shard applied on
    each decoder layer and the root."""
    load = case["load"]
    if load["fully_shard"] is None:
        return from_pretrained(case, path, load["sharded"])
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = from_pretrained(case, path, load["sharded"]).to(device)
    mesh = init_device_mesh(device.type, (case["world_size"],))
    for layer in model.get_submodule(load["fully_shard"]["layers"]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


# ---------------------------------------------------------------- the checks, in order


def run_checks(case: dict, path: str, device: torch.device) -> None:
    from transformers.utils import logging

    logging.disable_progress_bar()
    checks = case["checks"]
    stage("loading the whole model")
    whole = load_whole(case, path, device)
    stage("loading the float64 reference")
    reference = load_reference(case, path, device)
    stage("loading the sharded model")
    sharded = load_sharded(case, path, device)
    models = (sharded, whole, reference)
    if "load" in checks:
        stage("checking the load")
        check_load(case, sharded, whole)
    batch = make_batch(case).to(device)
    if "logits" in checks:
        stage("checking the logits")
        check_logits(case, models, batch)
    if "gradients" in checks:
        stage("checking the gradients of one forward and backward")
        check_gradients(case, models, batch)
    if "train" in checks:
        for model in models:
            model.zero_grad(set_to_none=True)
        train_and_compare(case, models, load_whole(case, path, device), device)
    say(f"rank {dist.get_rank()}: no failure")


def say(words: str) -> None:
    print(words, flush=True)


def full(tensor):
    """The whole tensor: gathered when it is a DTensor (a collective: every rank calls it)."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def local(tensor):
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def is_expert_stack(case: dict, name: str) -> bool:
    return case["layout"]["experts_sharded"] and name.endswith(tuple(case["expert_stacks"]))


def expert_share(tensor: torch.Tensor) -> torch.Tensor:
    """The contiguous 1/world of an expert stack that expert parallelism gives this rank."""
    count = tensor.shape[0] // dist.get_world_size()
    return tensor[dist.get_rank() * count : (dist.get_rank() + 1) * count]


def sharded_part(case: dict, name: str, tensor):
    """What this rank compares of a sharded model's tensor: its own experts of an expert stack, else the whole
    tensor (a DTensor gathered)."""
    return local(tensor) if is_expert_stack(case, name) else full(tensor)


def whole_part(case: dict, name: str, tensor):
    """The same part of the whole model's tensor."""
    return expert_share(tensor) if is_expert_stack(case, name) else tensor


def largest_difference(actual: torch.Tensor, expected: torch.Tensor) -> float:
    if actual.shape != expected.shape:
        return math.inf
    return (actual.double() - expected.double()).abs().max().item() if actual.numel() else 0.0


def check_load(case: dict, sharded, whole) -> None:
    """Each rank holds its share of every expert stack and the rest whole: parameters and buffers."""
    rank = dist.get_rank()
    mine, theirs = dict(sharded.named_parameters()), dict(whole.named_parameters())
    if mine.keys() != theirs.keys():
        raise AssertionError(f"the sharded model's parameters differ from the whole model's: missing "
                             f"{sorted(theirs.keys() - mine.keys())}, extra {sorted(mine.keys() - theirs.keys())}")
    problems = []
    for name, param in mine.items():
        part, expected = sharded_part(case, name, param.detach()), whole_part(case, name, theirs[name].detach())
        if part.shape != expected.shape:
            problems.append(f"rank {rank} holds {name} as shape {tuple(part.shape)} where its share of the whole "
                            f"model's is {tuple(expected.shape)}")
        elif not torch.equal(part, expected):
            problems.append(f"rank {rank}'s {name} differs from the whole model's after loading (largest difference "
                            f"{largest_difference(part, expected):.3g})")
    whole_buffers = dict(whole.named_buffers())
    for name, buffer in sharded.named_buffers():
        value = full(buffer)
        expected = whole_buffers.get(name)
        if expected is None:
            problems.append(f"rank {rank}'s sharded model has a buffer {name} the whole model has not")
        elif value.shape != expected.shape or not torch.equal(value, expected):
            problems.append(f"rank {rank}'s buffer {name} differs from the whole model's after loading "
                            f"(largest difference {largest_difference(value, expected):.3g})")
    if problems:
        raise AssertionError("load: " + "; ".join(problems))
    say(f"rank {rank}: load: holds its share of every expert stack, the rest whole")


# ---------------------------------------------------------------- inputs and outputs


def make_batch(case: dict) -> torch.Tensor:
    batch = case["batch"]
    generator = torch.Generator().manual_seed(batch["seed"])
    return torch.randint(0, batch["vocab"], (batch["sequences"], batch["tokens"]), generator=generator)


def rows(case: dict, rank: int) -> slice:
    """Rank `rank`'s 1/world of the batch's sequences."""
    per_rank = case["batch"]["sequences"] // case["world_size"]
    return slice(rank * per_rank, (rank + 1) * per_rank)


def my_rows(case: dict) -> slice:
    """The sequences this rank feeds: its own share where the layout is data parallel, else all."""
    return rows(case, dist.get_rank()) if case["layout"]["splits_batch"] else slice(None)


def embed_input_ids(module, args, kwargs):
    """A model fed embeddings: the token ids embedded by its own input embedding, inside its forward."""
    kwargs = dict(kwargs)
    kwargs["inputs_embeds"] = module.get_input_embeddings()(kwargs.pop("input_ids"))
    return args, kwargs


def run_model(case: dict, model, batch: torch.Tensor):
    if case["inputs"] != "inputs_embeds":
        return model(input_ids=batch, use_cache=False)
    handle = model.register_forward_pre_hook(embed_input_ids, with_kwargs=True)
    try:
        return model(input_ids=batch, use_cache=False)
    finally:
        handle.remove()


def model_logits(case: dict, model, batch: torch.Tensor) -> torch.Tensor:
    """The logits, whole; a base model's last hidden states scored by a fixed matrix that is no parameter."""
    output = run_model(case, model, batch)
    logits = getattr(output, "logits", None)
    if logits is not None:
        return full(logits)
    hidden = full(output.last_hidden_state)
    readout = case["readout"]
    generator = torch.Generator().manual_seed(readout["seed"])
    weight = torch.randn(readout["vocab"], readout["hidden"], generator=generator) * readout["std"]
    return hidden @ weight.to(dtype=hidden.dtype, device=hidden.device).T


def next_token_loss(logits: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), batch[:, 1:].flatten())


# ---------------------------------------------------------------- the float64 truth and the rounding it allows


class StayFloat64(TorchFunctionMode):
    """Inside it, every float a modeling file asks for is float64 (`.float()`, `.to(torch.float32)`, `dtype=`), so
    the reference keeps its digits where the code casts to float32 on purpose."""

    NARROWER = (torch.float32, torch.float16, torch.bfloat16)
    NARROWING = (torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in self.NARROWING:
            return args[0].to(torch.float64)
        if func in (torch.Tensor.to, torch.Tensor.type):
            args = tuple(torch.float64 if arg in self.NARROWER else arg for arg in args)
        if kwargs.get("dtype") in self.NARROWER:
            kwargs["dtype"] = torch.float64
        return func(*args, **kwargs)


@contextlib.contextmanager
def perturbed_rounding(model, seed: int):
    """Every leaf module's floating output times (1 + e), e uniform in [-ulp, ulp] of its dtype: a second sample of
    the whole model's rounding."""
    generator = torch.Generator().manual_seed(seed)

    def perturb(module, args, output):
        if not isinstance(output, torch.Tensor) or not output.is_floating_point() or isinstance(output, DTensor):
            return None
        noise = torch.rand(output.shape, generator=generator, dtype=torch.float64) * 2 - 1
        scale = 1 + noise.to(output.device) * torch.finfo(output.dtype).eps
        return output * scale.to(output.dtype)

    handles = [module.register_forward_hook(perturb) for module in model.modules() if not any(module.children())]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def bound(case: dict, whole_error: float, scale: float = 1.0, step: int = 1) -> float:
    """FACTOR times the whole model's own distance from float64 (or a floor of a few ulps); wider from step 2."""
    bounds = case["bounds"]
    noise = whole_error if math.isfinite(whole_error) else 0.0
    floor = bounds["floor_ulps"] * torch.finfo(getattr(torch, case["dtype"])).eps * scale
    widening = 1.0 if step <= 1 else bounds["training_compounding"]
    return widening * bounds["factor"] * max(noise, floor)


def relative_error(actual, expected) -> float:
    if actual is None and expected is None:
        return 0.0
    if actual is None or expected is None or actual.shape != expected.shape:
        return math.inf
    actual, expected = actual.double(), expected.double().to(actual.device)
    difference, scale = (actual - expected).norm().item(), expected.norm().item()
    if scale == 0.0:
        return 0.0 if difference == 0.0 else math.inf
    return difference / scale


def largest(values) -> float:
    values = list(values)
    return math.nan if any(math.isnan(value) for value in values) else max(values)


def over_bounds(subject: str, errors: dict, bounds: dict) -> str | None:
    """`SUBJECT differ from the whole model's: N of M parameters exceed their bound ...`, the worst five; or None."""
    def ratio(name):
        return math.inf if math.isnan(errors[name]) or bounds[name] <= 0 else errors[name] / bounds[name]

    over = sorted((name for name in errors if not errors[name] <= bounds[name]), key=ratio, reverse=True)
    if not over:
        return None
    listed = "; ".join(f"{name} {errors[name]:.3g} (its bound {bounds[name]:.3g})" for name in over[:5])
    return (f"{subject} differ from the whole model's: {len(over)} of {len(errors)} parameters exceed their bound "
            f"(rounding measured in this run): {listed}")


def worst(errors: dict, bounds: dict) -> str:
    return max(errors, key=lambda name: errors[name] / bounds[name] if bounds[name] > 0 else math.inf)


# ---------------------------------------------------------------- one forward, and one forward and backward


def check_logits(case: dict, models: tuple, batch: torch.Tensor) -> None:
    """The sharded logits within FACTOR times the whole model's own distance from the float64 logits."""
    sharded, whole, reference = models
    mine = my_rows(case)
    for model in models:
        model.eval()
    with torch.no_grad():
        sharded_logits = model_logits(case, sharded, batch[mine])
        whole_logits = model_logits(case, whole, batch)[mine]
        with StayFloat64():
            reference_logits = model_logits(case, reference, batch)[mine]
    whole_difference = largest_difference(whole_logits, reference_logits)
    scale = reference_logits.abs().max().item() if reference_logits.numel() else 0.0
    limit = bound(case, whole_difference, scale)
    if sharded_logits.shape != reference_logits.shape:
        raise AssertionError(f"logits differ: shape {tuple(sharded_logits.shape)}, whole model "
                             f"{tuple(reference_logits.shape)}")
    difference = (sharded_logits.double() - reference_logits.double()).abs()
    if not bool((difference <= limit).all()):
        outside = int((~(difference <= limit)).sum())
        raise AssertionError(f"logits differ from the whole model's: {outside} of {difference.numel()} values farther "
                             f"than {limit:.3g} from the float64 reference (the whole model's own rounding: "
                             f"{whole_difference:.3g}); largest difference {difference.max().item():.3g}")
    say(f"rank {dist.get_rank()}: logits: largest difference {difference.max().item():.3g} (bound {limit:.3g})")


def check_gradients(case: dict, models: tuple, batch: torch.Tensor) -> None:
    """One forward and backward of each model on the next-token loss; every parameter's gradient within FACTOR times
    the whole model's own relative error against float64 (the larger of two samples of its rounding)."""
    sharded, whole, reference = models
    for model in models:
        model.train()
    other_order = gradients_in_another_order(case, whole, batch)
    mine = my_rows(case)
    shares = ([rows(case, rank) for rank in range(case["world_size"])] if case["layout"]["splits_batch"]
              else [slice(None)])

    def whole_loss(model):
        logits = model_logits(case, model, batch)
        return sum(next_token_loss(logits[share], batch[share]) for share in shares) / len(shares)

    with StayFloat64():
        reference_loss = whole_loss(reference)
    losses = (next_token_loss(model_logits(case, sharded, batch[mine]), batch[mine]), whole_loss(whole),
              reference_loss)
    for loss in losses:
        loss.backward()
    errors, bounds = {}, {}
    named = zip(sharded.named_parameters(), whole.named_parameters(), reference.named_parameters(), strict=True)
    for (name, param), (_, theirs), (_, truth) in named:
        grad = None if param.grad is None else sharded_part(case, name, param.grad)
        expected = None if truth.grad is None else whole_part(case, name, truth.grad)
        samples = (theirs.grad, other_order[name])
        whole_error = largest(relative_error(None if sample is None else whole_part(case, name, sample), expected)
                              for sample in samples)
        errors[name], bounds[name] = relative_error(grad, expected), bound(case, whole_error)
    problem = over_bounds("gradients", errors, bounds)
    if problem is not None:
        raise AssertionError(problem)
    name = worst(errors, bounds)
    say(f"rank {dist.get_rank()}: gradients: worst {name} {errors[name]:.3g} (bound {bounds[name]:.3g})")


def gradients_in_another_order(case: dict, model, batch: torch.Tensor) -> dict:
    """The whole model's gradients of the same loss with the sequences reversed and every leaf output moved by up to
    an ulp (a second sample of its rounding); its gradients are cleared again."""
    reversed_batch = batch.flip(0)
    with perturbed_rounding(model, case["bounds"]["rounding_seed"]):
        next_token_loss(model_logits(case, model, reversed_batch), reversed_batch).backward()
    gradients = {name: None if param.grad is None else param.grad.detach().clone()
                 for name, param in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return gradients


# ---------------------------------------------------------------- training


class Run:
    """One model's training loop: AdamW, a warm-up schedule, clipping; what it measured at its latest step."""

    def __init__(self, case: dict, model, reference: bool = False, other_order: bool = False):
        training = case["training"]
        model.train()
        kernel = {"foreach": False} if reference else training["adamw_kernel"]
        self.model, self.other_order, self.clip = model, other_order, training["clip"]
        self.optimizer = torch.optim.AdamW(model.parameters(), **training["adamw"], **kernel)
        warmup = training["warmup_steps"]
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: min(1.0, (step + 1) / warmup))
        self.loss = self.grad_norm = math.nan
        self.grads: dict = {}
        self.params: dict = {}


def micro_batches(case: dict, step: int, other_order: bool) -> list:
    """The suite's batch rolled by a different amount per micro-batch and step (each token keeps its experts)."""
    count = case["training"]["micro_batches"]
    batch = make_batch(case)
    batches = [batch.roll(shifts=count * (step - 1) + index + 1, dims=1) for index in range(count)]
    return [each.flip(0) for each in reversed(batches)] if other_order else batches


def clip_gradients(run: Run, max_norm: float) -> torch.Tensor:
    """The global gradient norm, clipped: torch's clip_grad_norm_, or per device mesh where a layout puts parameters
    on several (one norm per mesh, combined), as transformers' Trainer does."""
    if run.clip == "torch":
        return torch.nn.utils.clip_grad_norm_(run.model.parameters(), max_norm)
    from torch.nn.utils import clip_grads_with_norm_, get_total_norm

    by_mesh: dict = {}
    for param in run.model.parameters():
        if param.grad is not None:
            by_mesh.setdefault(param.grad.device_mesh if isinstance(param.grad, DTensor) else None, []).append(param)
    norms = [full(get_total_norm([param.grad for param in params])) for params in by_mesh.values()]
    total = torch.linalg.vector_norm(torch.stack(norms))
    for params in by_mesh.values():
        clip_grads_with_norm_(params, max_norm, total)
    return total


def train_step(case: dict, run: Run, step: int, loss_of) -> None:
    """Accumulate over the micro-batches, clip, step the optimizer and the schedule."""
    count, total = case["training"]["micro_batches"], 0.0
    for batch in micro_batches(case, step, run.other_order):
        seed = case["bounds"]["rounding_seed"]
        with perturbed_rounding(run.model, seed) if run.other_order else contextlib.nullcontext():
            loss, global_loss = loss_of(run.model, batch)
        (loss / count).backward()
        total += global_loss / count
    run.grads = {name: None if param.grad is None else param.grad.detach().clone()
                 for name, param in run.model.named_parameters()}
    norm = clip_gradients(run, case["training"]["max_grad_norm"])
    run.loss, run.grad_norm = total, float(full(norm).item())
    run.optimizer.step()
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    run.params = {name: param.detach().clone() for name, param in run.model.named_parameters()}


def train_and_compare(case: dict, models: tuple, second_whole, device: torch.device) -> None:
    """The same N-step loop on the sharded model, the whole model (twice: as it is, and summed in another order) and
    the float64 truth; after every step the replicated parameters, the loss, the accumulated gradients, the global
    gradient norm and the updated parameters compared."""
    sharded_model, whole_model, reference_model = models
    sharded, whole = Run(case, sharded_model), Run(case, whole_model)
    other, reference = Run(case, second_whole, other_order=True), Run(case, reference_model, reference=True)
    world_size, rank = case["world_size"], dist.get_rank()
    shares = [rows(case, each) for each in range(world_size)]
    mine = my_rows(case)

    def whole_loss(model, batch):
        batch = batch.to(device)
        logits = model_logits(case, model, batch)
        loss = sum(next_token_loss(logits[share], batch[share]) for share in shares) / len(shares)
        return loss, float(loss)

    def sharded_loss(model, batch):
        batch = batch.to(device)
        loss = next_token_loss(model_logits(case, model, batch[mine]), batch[mine])
        if not case["layout"]["splits_batch"]:
            return loss, loss.item()
        total = loss.detach().clone()
        dist.all_reduce(total)
        return loss, total.item() / world_size

    for step in range(1, case["training"]["steps"] + 1):
        stage(f"training step {step}")
        train_step(case, sharded, step, sharded_loss)
        for run in (whole, other):
            train_step(case, run, step, whole_loss)
        with StayFloat64():
            train_step(case, reference, step, whole_loss)
        if rank == 0:
            say(f"step {step}: loss {sharded.loss:.9g} sharded, {whole.loss:.9g} whole, {reference.loss:.9g} float64")
        compare_step(case, step, sharded, (whole, other), reference)


def compare_step(case: dict, step: int, sharded: Run, samples: tuple, reference: Run) -> None:
    check_replicated(case, step, sharded.model)
    check_scalar(case, step, "loss", sharded.loss, [run.loss for run in samples], reference.loss)
    problem = tensors_problem(case, step, "gradients", sharded.grads, [run.grads for run in samples], reference.grads)
    if problem is not None:
        raise AssertionError(f"step {step}: {problem} (accumulated over {case['training']['micro_batches']} "
                             f"micro-batches)")
    check_scalar(case, step, "gradient norm", sharded.grad_norm, [run.grad_norm for run in samples],
                 reference.grad_norm)
    problem = tensors_problem(case, step, "updated parameters", sharded.params, [run.params for run in samples],
                              reference.params)
    if problem is not None:
        raise AssertionError(f"step {step}: {problem}")


def check_scalar(case: dict, step: int, name: str, mine: float, samples: list, truth: float) -> None:
    limit = bound(case, largest(abs(sample - truth) for sample in samples), abs(truth), step)
    if not abs(mine - truth) <= limit:
        raise AssertionError(f"step {step}: {name} {mine:.9g} differs from the float64 run's {truth:.9g} by "
                             f"{abs(mine - truth):.3g}, over its bound {limit:.3g} (the whole model's run: "
                             f"{samples[0]:.9g})")


def tensors_problem(case: dict, step: int, subject: str, mine: dict, samples: list, truth: dict) -> str | None:
    errors, bounds = {}, {}
    for name, tensor in mine.items():
        expected = None if truth[name] is None else whole_part(case, name, truth[name])
        part = None if tensor is None else sharded_part(case, name, tensor)
        whole_error = largest(relative_error(None if sample[name] is None else whole_part(case, name, sample[name]),
                                             expected) for sample in samples)
        errors[name], bounds[name] = relative_error(part, expected), bound(case, whole_error, step=step)
    return over_bounds(subject, errors, bounds)


def check_replicated(case: dict, step: int, model) -> None:
    """Every parameter the layout replicates bit-identical on every rank (each rank's bytes gathered)."""
    names, values = [], []
    for name, param in model.named_parameters():
        sharded = isinstance(param, DTensor) and any(isinstance(each, Shard) for each in param.placements)
        if not (sharded or is_expert_stack(case, name)):
            names.append(name)
            values.append(local(param).detach().contiguous())
    if not names:
        return
    mine = torch.cat([value.reshape(-1).view(torch.uint8) for value in values])
    copies = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(copies, mine)
    start = 0
    for name, value in zip(names, values, strict=True):
        end = start + value.numel() * value.element_size()
        for other, other_bytes in enumerate(copies[1:], start=1):
            if not torch.equal(other_bytes[start:end], copies[0][start:end]):
                difference = largest_difference(other_bytes[start:end].view(value.dtype),
                                                copies[0][start:end].view(value.dtype))
                raise AssertionError(f"step {step}: parameter {name} differs across ranks (rank {other} vs rank 0: "
                                     f"{difference:.3g})")
        start = end


if __name__ == "__main__":
    sys.exit(main())
