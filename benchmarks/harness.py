"""Speed, memory and decoding cost of model variants, as ratios against a baseline measured in one process.

Absolute CPU times are noisy on shared machines, so every measurement runs the systems interleaved (one
repeat of system A, then of B, ..., then the next repeat), repeats, and keeps the median; `benchmarks/run.py`
reports everything relative to stock `transformers.MarianMTModel`. Memory on the CPU is measured
deterministically as the bytes autograd keeps for the backward pass (activations, deduplicated by storage)
plus parameters and gradients — the part of training memory that positional modules change; on CUDA the
allocator's peak is used instead.
"""

import copy
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import LogitsProcessor, LogitsProcessorList, MarianMTModel

from hf_posenc.configuration_marian_posenc import MarianPosEncConfig
from hf_posenc.generation_length import per_row
from hf_posenc.modeling_marian_posenc import MarianPosEncForConditionalGeneration
from hf_posenc.pipeline.training.hardware import autocast, synchronize, training_flops

# Model sizes shared by the benchmark scripts. "base" is paper 1's Transformer base (§5.1), "big" Transformer big;
# both are too slow for many variants on 2 CPU cores, "small" keeps the ratios meaningful there.
MODEL_SIZES = {
    "tiny": dict(
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        vocab_size=100,
    ),
    "small": dict(
        d_model=256,
        encoder_layers=3,
        decoder_layers=3,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=1024,
        decoder_ffn_dim=1024,
        vocab_size=8000,
    ),
    "base": dict(
        d_model=512,
        encoder_layers=6,
        decoder_layers=6,
        encoder_attention_heads=8,
        decoder_attention_heads=8,
        encoder_ffn_dim=2048,
        decoder_ffn_dim=2048,
        vocab_size=40000,
    ),
    # Transformer big (Vaswani et al. 2017 Table 3; the wmt14-*-big recipes): base's depth and vocabulary
    "big": dict(
        d_model=1024,
        encoder_layers=6,
        decoder_layers=6,
        encoder_attention_heads=16,
        decoder_attention_heads=16,
        encoder_ffn_dim=4096,
        decoder_ffn_dim=4096,
        vocab_size=40000,
    ),
}


def build_model(base_fields: dict, overrides: dict | None, device, seed: int = 0, precomputed: bool = False):
    """The model of a system in training mode: same fields and seed for every system."""
    torch.manual_seed(seed)
    if overrides is None:  # the stock baseline: MarianPosEncConfig's Marian fields (token ids, relu, scaling)
        model = MarianMTModel(MarianPosEncConfig(**base_fields).to_marian_config())
    else:
        model = MarianPosEncForConditionalGeneration(MarianPosEncConfig(**{**base_fields, **overrides}))
        if precomputed:
            model.precompute_position_attention()
    return model.to(device).train()


def build_system(system, base_fields: dict, device, seed: int = 0):
    """The model of a `benchmarks.systems.System` (overrides None: stock MarianMTModel)."""
    return build_model(base_fields, system.overrides, device, seed, system.precomputed)


def meta_model(base_fields: dict, overrides: dict | None = None, precomputed: bool = False):
    """A system's model on the meta device: nothing is allocated, so any size builds instantly."""
    with torch.device("meta"):
        return build_model(base_fields, overrides, "meta", precomputed=precomputed)


def count_parameters(base_fields: dict, overrides: dict | None = None, precomputed: bool = False) -> int:
    """Trainable parameters (stock Marian's sinusoid tables are frozen parameters, ours are buffers: neither
    counts)."""
    return meta_model(base_fields, overrides, precomputed).num_parameters(only_trainable=True)


def interleaved_median_seconds(work: dict[str, Callable[[], None]], repeats: int, device) -> dict[str, float]:
    """Median seconds of each callable: one warm-up each, then `repeats` rounds over all of them in turn, so
    machine noise hits every system alike."""
    for run in work.values():  # warm-up: allocator, kernels, optimizer state
        run()
    seconds = {name: [] for name in work}
    for _ in range(repeats):
        for name, run in work.items():
            synchronize(device)
            start = time.perf_counter()
            run()
            synchronize(device)
            seconds[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in seconds.items()}


def synthetic_batch(config, batch_size: int, length: int, device) -> dict:
    generator = torch.Generator().manual_seed(length)
    low = 2  # keep clear of pad (0) and eos (1)
    input_ids = torch.randint(low, config.vocab_size, (batch_size, length), generator=generator)
    labels = torch.randint(low, config.vocab_size, (batch_size, length), generator=generator)
    return {"input_ids": input_ids.to(device), "labels": labels.to(device)}


def training_optimizer(model) -> torch.optim.AdamW:
    """The optimizer `train_scripts/train.py` trains with: the Trainer's default with torch >= 2.8,
    "adamw_torch_fused" (one fused kernel over all parameters; PyTorch's non-fused default on the CPU loops
    over the tensors and took 52 vs 6 ms per step on a 512 x 128 x 128 table, one thread)."""
    return torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)


def training_step(model, optimizer, batch, device, autocast_dtype):
    """One fwd + bwd + optimizer step."""
    with autocast(device, autocast_dtype):
        loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def training_run(model, optimizer, batch, steps: int, device, autocast_dtype) -> Callable[[], None]:
    def run():
        for _ in range(steps):
            training_step(model, optimizer, batch, device, autocast_dtype)

    return run


def saved_activation_bytes(model, batch, exclude_parameters: bool = False) -> int:
    """Bytes of the tensors autograd saves during one forward (each storage counted once); with
    `exclude_parameters`, only those whose storage is not a parameter's (the activations proper)."""
    skipped = {p.untyped_storage().data_ptr() for p in model.parameters()} if exclude_parameters else set()
    storages = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in skipped:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = model(**batch).loss
    loss.backward()
    model.zero_grad(set_to_none=True)
    return sum(storages.values())


def training_memory_bytes(model, optimizer, batch, device, autocast_dtype) -> int:
    """CUDA: the model's parameters and optimizer state + what the allocator's peak over one training step adds
    to what was allocated before it (the other systems' models stay resident on the device and are not
    counted); CPU: saved activations + parameters + gradients."""
    if torch.device(device).type == "cuda":
        resident = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        training_step(model, optimizer, batch, device, autocast_dtype)
        return torch.cuda.max_memory_allocated(device) - resident + model_state_bytes(model, optimizer)
    parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    gradient_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    with autocast(device, autocast_dtype):
        return saved_activation_bytes(model, batch) + parameter_bytes + gradient_bytes


def model_state_bytes(model, optimizer) -> int:
    """Bytes of the model's parameters and of its optimizer's state tensors."""
    tensors = [*model.parameters()]
    tensors += [
        value for state in optimizer.state.values() for value in state.values() if torch.is_tensor(value)
    ]
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors)


STOCK_MARIAN = "marian"  # the baseline system: transformers.MarianMTModel, built from the same config
COMPILED = "+compile"  # the name suffix of a variant trained under torch.compile
FAST = "+fast"  # the name suffix of a system decoded through the fast decoding loop (fast_decoding.py)
INT8 = "+int8"  # the name suffix of a system decoded through the fast loop with int8 linear layers


@dataclass
class StepResult:
    variant: str
    length: int
    tokens_per_second: float
    memory_bytes: int | None  # None: not measured (a compiled variant on the CPU)
    parameters: int
    flops_per_token: float | None = None  # model FLOPs of forward + backward per target token, if counted
    first_step_seconds: float | None = None  # compiled variants: the first step, compilation included


def benchmark_training_steps(
    variants: dict[str, dict | None],
    base_fields: dict,
    lengths=(32, 128, 512),
    tokens_per_batch: int = 4096,
    repeats: int = 5,
    steps_per_repeat: int = 3,
    device: str = "cpu",
    autocast_dtype: torch.dtype | None = None,
    count_flops: bool = False,
    compile: bool = False,
) -> list[StepResult]:
    """Median target tokens/s of fwd+bwd+AdamW steps and training memory, per variant (config overrides;
    None = stock MarianMTModel) and length; with `count_flops`, also the FLOPs of forward + backward. With
    `compile`, every variant is also trained under `torch.compile` as `<name>+compile` (same weights at the
    start), whose first step, compilation included, is timed on its own before the interleaved repeats; its
    FLOPs are its eager twin's, its memory is measured on CUDA only (the CPU metric hooks autograd's saved
    tensors, which a compiled graph does not expose)."""
    results = []
    for length in lengths:
        batch_size = max(1, tokens_per_batch // length)
        models = training_models(variants, base_fields, device, compile)
        optimizers = {name: training_optimizer(model) for name, model in models.items()}
        batch = synthetic_batch(next(iter(models.values())).config, batch_size, length, device)
        first_step = first_compiled_steps(models, optimizers, batch, device, autocast_dtype)
        work = {
            name: training_run(
                models[name], optimizers[name], batch, steps_per_repeat, device, autocast_dtype
            )
            for name in models
        }
        seconds = interleaved_median_seconds(work, repeats, device)
        tokens = {name: batch_size * length * steps_per_repeat / seconds[name] for name in models}
        results += step_results(
            models, optimizers, batch, length, tokens, first_step, device, autocast_dtype, count_flops
        )
    return results


def training_models(variants: dict[str, dict | None], base_fields: dict, device, compile: bool) -> dict:
    """Every variant's model, then, with `compile`, every variant again under `torch.compile` (same seed, so
    same weights at the start)."""
    models = {name: build_model(base_fields, overrides, device) for name, overrides in variants.items()}
    if compile:
        for name, overrides in variants.items():
            models[name + COMPILED] = torch.compile(build_model(base_fields, overrides, device))
    return models


def first_compiled_steps(models: dict, optimizers: dict, batch, device, autocast_dtype) -> dict[str, float]:
    """Seconds of each compiled model's first training step, compilation included."""
    first_step = {}
    for name in (name for name in models if name.endswith(COMPILED)):
        synchronize(device)
        start = time.perf_counter()
        training_step(models[name], optimizers[name], batch, device, autocast_dtype)
        synchronize(device)
        first_step[name] = time.perf_counter() - start
    return first_step


def step_results(
    models: dict,
    optimizers: dict,
    batch,
    length: int,
    tokens_per_second: dict[str, float],
    first_step: dict[str, float],
    device,
    autocast_dtype,
    count_flops: bool,
) -> list[StepResult]:
    """One length's results: the measured speed with each model's memory, parameters and (eager) FLOPs per
    token; each model's optimizer state is freed once the model is measured."""
    batch_tokens = batch["labels"].numel()  # batch size × length
    results, flops = [], {}
    for name, model in models.items():
        compiled = name.endswith(COMPILED)
        memory = (
            None
            if compiled and torch.device(device).type != "cuda"
            else training_memory_bytes(model, optimizers[name], batch, device, autocast_dtype)
        )
        parameters = model.num_parameters(only_trainable=True)
        if count_flops and not compiled:  # eager variants come first: the compiled twin reuses them
            flops[name] = training_flops(model, batch, device, autocast_dtype) / batch_tokens
        results.append(
            StepResult(
                name,
                length,
                tokens_per_second[name],
                memory,
                parameters,
                flops.get(name.removesuffix(COMPILED)),
                first_step.get(name),
            )
        )
        del optimizers[name]  # free the optimizer state before the next length's models
    return results


def forward_repeated(model, batch: dict, times: int, device, autocast_dtype) -> Callable[[], None]:
    """Paper 1's Fig. 2 benchmark: the same batch forwarded `times` times (no gradients)."""

    def run():
        with torch.no_grad(), autocast(device, autocast_dtype):
            for _ in range(times):
                model(**batch)

    return run


def generation_kwargs(new_tokens: int, beams: int) -> dict:
    """Exactly `new_tokens` tokens per sequence (min = max), so every system generates the same lengths."""
    return dict(num_beams=beams, do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens)


def generation_run(
    model, source, new_tokens: int, beams: int, device, autocast_dtype, fast: bool = False, lengths=None
) -> Callable[[], None]:
    """One `generate` call; with `fast`, through hf_posenc's fast decoding loop (fast_decoding.py). `lengths`
    (B,): each example's output length instead of `new_tokens` for all (`ExampleLengths`), the source
    right-padded with the model's pad token."""
    kwargs = generation_kwargs(new_tokens, beams) | ({"fast_decoding": True} if fast else {})
    if lengths is not None:
        kwargs |= dict(max_new_tokens=int(lengths.max()), min_new_tokens=None)
        kwargs["attention_mask"] = (source != model.config.pad_token_id).long()

    def run():  # a new ExampleLengths per call: the fast loop's compaction drops its finished examples
        ends = ExampleLengths(lengths, model.config.eos_token_id) if lengths is not None else None
        extra = {"logits_processor": LogitsProcessorList([ends])} if ends else {}
        with torch.inference_mode(), autocast(device, autocast_dtype):
            return model.generate(source, **kwargs, **extra)

    return run


class ExampleLengths(LogitsProcessor):
    """Every output of example b ends at `lengths[b]` generated tokens, `</s>` included: `</s>` is banned before
    that length and forced at it, in each of the example's rows (beams). The fast loop's compaction drops
    finished examples' lengths through `keep_examples`."""

    def __init__(self, lengths: torch.LongTensor, eos: int):
        self.lengths, self.eos = lengths, eos  # (B,), the end token

    def keep_examples(self, examples: torch.LongTensor) -> None:
        self.lengths = self.lengths[examples.to(self.lengths.device)]

    def __call__(self, input_ids, scores):  # (rows, t) with the start token, (rows, V)
        """In place, writing the due rows and the `</s>` column only: the benchmark's stand-in for translations
        that end costs both decoding loops as little as it can."""
        lengths = per_row(self.lengths, len(input_ids)).to(scores.device)  # (rows,)
        due = input_ids.shape[-1] >= lengths  # (rows,) the next token is the last
        eos_scores = scores[:, self.eos].clone()  # (rows,)
        scores.index_fill_(0, due.nonzero().flatten(), float("-inf"))  # (a row mask would write every row)
        scores[:, self.eos] = eos_scores.masked_fill(~due, float("-inf"))
        return scores


def real_length_batch(pairs, batch_size: int, config, generator) -> tuple[torch.LongTensor, torch.LongTensor]:
    """Random token ids at the lengths of the first `batch_size` sentence pairs of `pairs` (words + `</s>`): the
    sources (B, S), right-padded with `config`'s pad token, and each example's output length (B,)."""
    if batch_size > len(pairs):
        raise ValueError(f"a generation batch of {batch_size}: the test set has {len(pairs)} pairs")
    pad, eos = config.pad_token_id, config.eos_token_id
    sources = [len(text.split()) + 1 for text in pairs.source[:batch_size]]
    lengths = torch.tensor([len(text.split()) + 1 for text in pairs.target[:batch_size]])
    ids = torch.full((batch_size, max(sources)), pad, dtype=torch.long)
    for row, length in enumerate(sources):
        ids[row, : length - 1] = torch.randint(
            max(pad, eos) + 1, config.vocab_size, (length - 1,), generator=generator
        )
        ids[row, length - 1] = eos
    return ids, lengths


def step_clock(device) -> Callable[[], float]:
    """The clock of one decoding step: on the CPU the process's CPU time (another job on the machine takes the
    cores in turns, which wall time would count; the process's own work it does not change), on a GPU the wall
    time, read after synchronizing."""
    return time.perf_counter if torch.device(device).type == "cuda" else time.process_time


def prefilled_decoder(model, source, prefix: int, device, autocast_dtype) -> tuple:
    """What greedy decoding holds when its cache reaches `prefix` decoder tokens: the encoder output of `source`
    (1, S) and the cache of the start token and `prefix` - 1 other tokens (fixed random ids), from the model's
    own forward with the cache on."""
    generator = torch.Generator().manual_seed(prefix)
    tokens = torch.randint(2, model.config.vocab_size, (1, prefix), generator=generator)  # (1, prefix)
    tokens[0, 0] = model.config.decoder_start_token_id
    with torch.inference_mode(), autocast(device, autocast_dtype):
        encoder_outputs = model.get_encoder()(input_ids=source)
        output = model(encoder_outputs=encoder_outputs, decoder_input_ids=tokens.to(device), use_cache=True)
    return encoder_outputs, output.past_key_values


def timed_decode_step(model, encoder_outputs, cache, device, autocast_dtype) -> float:
    """Seconds of one greedy decoding step on a copy of `cache` (the copy is not timed): one new token through
    the decoder with the cache, its logits."""
    token = torch.full((1, 1), 2, dtype=torch.long, device=device)
    clock = step_clock(device)
    with torch.inference_mode(), autocast(device, autocast_dtype):
        cache = copy.deepcopy(cache)
        synchronize(device)
        start = clock()
        model(encoder_outputs=encoder_outputs, decoder_input_ids=token, past_key_values=cache, use_cache=True)
        synchronize(device)
        return clock() - start


def decode_step_seconds(
    models: dict, source, prefixes: list[int], rounds: int, device, autocast_dtype, seed: int = 0
) -> dict[str, list[float]]:
    """`<system>@<prefix>` -> the seconds of one greedy step (batch 1) whose cache holds `prefix` tokens, once per
    round. Every system's cache is filled once per prefix; each round times every (system, prefix) step once, in
    an order shuffled anew, so that what the machine does meanwhile falls on every system and prefix alike."""
    states = {
        (name, prefix): prefilled_decoder(model, source, prefix, device, autocast_dtype)
        for name, model in models.items()
        for prefix in prefixes
    }
    order, shuffle = list(states), random.Random(seed)
    for name, prefix in order:  # warm-up
        timed_decode_step(models[name], *states[name, prefix], device, autocast_dtype)
    seconds = {f"{name}@{prefix}": [] for name, prefix in order}
    for _ in range(rounds):
        shuffle.shuffle(order)
        for name, prefix in order:
            step = timed_decode_step(models[name], *states[name, prefix], device, autocast_dtype)
            seconds[f"{name}@{prefix}"].append(step)
    return seconds


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
