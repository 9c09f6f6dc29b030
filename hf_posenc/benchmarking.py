"""Training-step benchmark of model variants, as ratios against a baseline measured in the same process.

Absolute CPU times are noisy on shared machines, so every variant is measured interleaved with the others,
repeated, and reported as median throughput relative to the baseline. Memory on the CPU is measured
deterministically as the bytes autograd keeps for the backward pass (activations, deduplicated by storage)
plus parameters and gradients — the part of training memory that positional modules change; on CUDA the
allocator's peak is used instead.
"""

import statistics
import time
from dataclasses import dataclass

import torch

from .configuration_marian_posenc import MarianPosEncConfig
from .modeling_marian_posenc import MarianPosEncForConditionalGeneration


@dataclass
class StepResult:
    variant: str
    length: int
    tokens_per_second: float
    memory_bytes: int
    parameters: int


def saved_activation_bytes(model, batch) -> int:
    """Bytes of the tensors autograd saves during one forward (each storage counted once)."""
    storages = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = model(**batch).loss
    loss.backward()
    model.zero_grad(set_to_none=True)
    return sum(storages.values())


def synthetic_batch(config, batch_size: int, length: int, device) -> dict:
    generator = torch.Generator().manual_seed(length)
    low = 2  # keep clear of pad (0) and eos (1)
    input_ids = torch.randint(low, config.vocab_size, (batch_size, length), generator=generator)
    labels = torch.randint(low, config.vocab_size, (batch_size, length), generator=generator)
    return {"input_ids": input_ids.to(device), "labels": labels.to(device)}


def build_model(base_fields: dict, overrides: dict, device, seed: int = 0):
    torch.manual_seed(seed)
    config = MarianPosEncConfig(**{**base_fields, **overrides})
    return MarianPosEncForConditionalGeneration(config).to(device).train()


def training_step(model, optimizer, batch, device, autocast_dtype):
    """One fwd + bwd + optimizer step."""
    with torch.autocast(
        device_type=torch.device(device).type, dtype=autocast_dtype, enabled=autocast_dtype is not None
    ):
        loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def benchmark_training_steps(
    variants: dict[str, dict],
    base_fields: dict,
    lengths=(32, 128, 512),
    tokens_per_batch: int = 4096,
    repeats: int = 5,
    steps_per_repeat: int = 3,
    device: str = "cpu",
    autocast_dtype: torch.dtype | None = None,
) -> list[StepResult]:
    """Median target tokens/s of fwd+bwd+AdamW step and training memory, per variant and length."""
    results = []
    for length in lengths:
        batch_size = max(1, tokens_per_batch // length)
        models = {name: build_model(base_fields, overrides, device) for name, overrides in variants.items()}
        optimizers = {name: torch.optim.AdamW(model.parameters(), lr=1e-4) for name, model in models.items()}
        batch = synthetic_batch(next(iter(models.values())).config, batch_size, length, device)
        timings = {name: [] for name in models}

        for name in models:  # warm-up: allocator, kernels, optimizer state
            training_step(models[name], optimizers[name], batch, device, autocast_dtype)
        for _ in range(repeats):
            for name in models:  # interleaved, so machine noise hits every variant alike
                if device == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(steps_per_repeat):
                    training_step(models[name], optimizers[name], batch, device, autocast_dtype)
                if device == "cuda":
                    torch.cuda.synchronize()
                timings[name].append((time.perf_counter() - start) / steps_per_repeat)

        for name, model in models.items():
            parameters = sum(p.numel() for p in model.parameters())
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
                training_step(models[name], optimizers[name], batch, device, autocast_dtype)
                memory = torch.cuda.max_memory_allocated()
            else:
                parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
                memory = saved_activation_bytes(model, batch) + 2 * parameter_bytes
            results.append(
                StepResult(
                    name, length, batch_size * length / statistics.median(timings[name]), memory, parameters
                )
            )
    return results


def ratio_table(results: list[StepResult], baseline: str) -> str:
    """Markdown table: throughput and memory of each variant relative to the baseline, per length."""
    by_key = {(r.variant, r.length): r for r in results}
    lengths = sorted({r.length for r in results})
    variants = list(dict.fromkeys(r.variant for r in results))
    header = "| variant | params | " + " | ".join(f"speed L={n} | memory L={n}" for n in lengths) + " |"
    rows = [header, "|" + " --- |" * (2 + 2 * len(lengths))]
    for variant in variants:
        cells = [variant, f"{by_key[(variant, lengths[0])].parameters / 1e6:.2f}M"]
        for length in lengths:
            result, base = by_key[(variant, length)], by_key[(baseline, length)]
            cells += [
                f"{result.tokens_per_second / base.tokens_per_second:.2f}×",
                f"{result.memory_bytes / base.memory_bytes:.2f}×",
            ]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)
