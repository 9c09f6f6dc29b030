"""int8 decoding in torch: `quantize_int8(model)` replaces every `nn.Linear` of a loaded model by an `Int8Linear`,
for inference on the CPU.

`Int8Linear` computes y = s_x s_w ⊙ (q_x q_wᵀ) + b: the weights quantized once per output channel (symmetric int8,
s_w = max_i |W_ji| / 127), the input quantized per row at every call (dynamic, s_x = max_i |x_i| / 127), the product
accumulated exactly in int32 by `torch._int_mm` and rescaled in float32. Only linear layers change, and every
module's forward runs as it is, so greedy search, beam search and the fast loop (fast_decoding.py) serve every
registered position encoding and token mixer, and the modules of a folder loaded with trust_remote_code=True.
What stays float32: the embeddings (also the shared table the output projection is tied to; the output projection
itself is quantized from it), layer norms, position tables, convolution kernels, the recurrent cells of rpe_head
and mpr_head (nn.RNN/GRU/LSTM and the SRU are not linear layers) and every attention product.

Code that reads a linear layer's weight instead of calling it (per-head blocks, a recurrence that stacks projection
matrices, a device lookup, a table kept while its weights stay the same tensors) reads `Int8Linear.weight`: the
dequantized weights q_w s_w in float32, so it computes with the same weights as the layer, without int8 speed.

Where torch has no fast int8 product for the CPU (AVX2 without VNNI: `torch._int_mm` measured 51-93x as long as a
float32 product there), int8 decoding would be several times slower than float32: `quantize_int8` measures one
decoder-step product both ways once per process (`int8_product_seconds`) and refuses int8 where it is not faster.

Not torch.ao.quantization.quantize_dynamic: torch 2.13 announces it deprecated ("will be removed in 2.10") and the
quantized tensors it builds on as to be removed, and its layers' `weight` is a method, which the modules above cannot
read. Measured speed and BLEU cost: docs/decoding.md, "int8 decoding in torch".
"""

import copy
import functools
import time

import torch
from torch import nn

INT8_MAX = 127  # symmetric quantization: -127..127, so that q and -q both exist
# The product `int8_product_seconds` times: rows x in @ in x out, the first feed-forward layer of the default model
# at one decoder step of 64 sentences x 4 beams.
PROBE_SHAPE = (256, 256, 1024)


def quantize_rows(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per row: q = round(x / s), s = max |x_row| / 127; (R, C) -> int8 (R, C), float32 (R, 1). A row
    of zeros gets the smallest normal scale and q = 0."""
    scale = matrix.abs().amax(dim=-1, keepdim=True).div_(INT8_MAX)  # (R, 1)
    scale.clamp_(min=torch.finfo(torch.float32).tiny)
    return (matrix / scale).round_().to(torch.int8), scale


class Int8Linear(nn.Module):
    """A `nn.Linear` for inference with int8 weights per output channel and inputs quantized per row at each call
    (the module docstring). `weight` (out, in) holds the dequantized weights for code that reads them; `bias`
    stays float32. It refuses training mode and inputs that need gradients: `torch._int_mm` has no gradient."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        quantized, scale = quantize_rows(linear.weight.detach().float())  # (out, in), (out, 1)
        self.register_buffer("weight_int8", quantized.t().contiguous())  # (in, out): torch._int_mm's layout
        self.register_buffer("weight_scale", scale.view(1, -1))  # (1, out)
        self.register_buffer("weight", quantized.float() * scale)  # (out, in)
        bias = None if linear.bias is None else linear.bias.detach().float().clone()
        self.register_buffer("bias", bias)  # (out,)
        self.training = False

    def train(self, mode: bool = True):
        if mode:
            raise ValueError(
                "train(True) on an int8 model: Int8Linear layers are for inference only (torch._int_mm has no "
                "gradient); train the float32 model, then quantize it"
            )
        return super().train(False)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out)
        if torch.is_grad_enabled() and inputs.requires_grad:
            raise ValueError(
                "an int8 model computes no gradient (torch._int_mm has none), but its input requires one: decode "
                "under torch.no_grad(), or train the float32 model"
            )
        rows = inputs.reshape(-1, self.in_features).float()  # (R, in)
        quantized, scale = quantize_rows(rows)  # (R, in), (R, 1)
        outputs = torch._int_mm(quantized, self.weight_int8).float()  # (R, out)
        outputs.mul_(scale).mul_(self.weight_scale)
        if self.bias is not None:
            outputs.add_(self.bias)
        return outputs.view(*inputs.shape[:-1], self.out_features).to(inputs.dtype)  # (..., out)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
        )


def check_quantizable(model) -> list[tuple[str, nn.Linear]]:
    """The (name, layer) of every `nn.Linear` of `model`, a layer shared by several modules under each of its names;
    an error naming the bad value for a model in training mode, with no linear layer left (quantized already), or
    with a linear layer off the CPU or not in float32."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"quantize_int8 takes a torch model (nn.Module), got a {type(model).__name__}")
    if model.training:
        raise ValueError(
            "model.training=True: int8 layers are for inference only; call model.eval() first (and train the "
            "float32 model)"
        )
    linears = [
        (name, m) for name, m in model.named_modules(remove_duplicate=False) if isinstance(m, nn.Linear)
    ]
    if not linears:
        already = any(isinstance(module, Int8Linear) for module in model.modules())
        raise ValueError(
            f"{type(model).__name__} has no nn.Linear layer to quantize"
            + (": its linear layers are int8 already (quantize_int8 was applied)" if already else "")
        )
    for name, linear in linears:
        if linear.weight.device.type != "cpu":
            raise ValueError(
                f"{name}.weight is on {linear.weight.device}: int8 decoding runs on the CPU; allowed device: cpu "
                "(load the model on the CPU)"
            )
        if linear.weight.dtype != torch.float32:
            raise ValueError(
                f"{name}.weight is {linear.weight.dtype}: int8 layers are quantized from float32 weights; allowed "
                "dtype: torch.float32 (model.float())"
            )
    return linears


@functools.cache
def int8_product_seconds() -> tuple[float, float]:
    """(float32, int8) seconds of one `PROBE_SHAPE` product on this CPU at the current thread count: a float32
    matmul and `torch._int_mm` of int8 matrices, the best of 3 after a first call; measured once per process."""
    rows, inner, out = PROBE_SHAPE
    generator = torch.Generator().manual_seed(0)
    left, right = torch.randn(rows, inner, generator=generator), torch.randn(inner, out, generator=generator)
    products = {
        "float32": lambda: left @ right,
        "int8": functools.partial(
            torch._int_mm, quantize_rows(left)[0], quantize_rows(right.t())[0].t().contiguous()
        ),
    }
    best = {}
    for name, product in products.items():
        times = []
        for _ in range(4):
            started = time.perf_counter()
            product()
            times.append(time.perf_counter() - started)
        best[name] = min(times[1:])
    return best["float32"], best["int8"]


def check_int8_speed() -> None:
    """Refuses int8 decoding where torch's int8 product is not faster than float32's on this CPU, naming both
    times (`int8_product_seconds`)."""
    float32, int8 = int8_product_seconds()
    if int8 >= float32:
        rows, inner, out = PROBE_SHAPE
        raise ValueError(
            f"int8 decoding is slower than float32 on this CPU (capability "
            f"{torch.backends.cpu.get_cpu_capability()}): one decoder-step product ({rows}x{inner} @ {inner}x{out}) "
            f"takes {int8 * 1e3:.1f} ms in int8 (torch._int_mm) against {float32 * 1e3:.2f} ms in float32, "
            f"{int8 / float32:.1f}x as long; torch has no fast int8 product for this CPU. Decode in float32 "
            "(without --int8 / int8=True)"
        )


def quantize_int8(model: nn.Module, *, inplace: bool = False) -> nn.Module:
    """`model` with every `nn.Linear` replaced by an `Int8Linear` and every parameter frozen (requires_grad=False),
    for inference on the CPU (module docstring). An hf_posenc model's fast loop then lets the beams of an example
    share its cross-attention keys (generation config `shared_cross_attention`: int8 decoding is not
    token-identical to float32 `generate` in any case; fast_decoding.py). Returns a copy and leaves `model` as it
    was, unless `inplace`, which changes `model` itself (and saves the copy's memory). The model must be in eval
    mode, on the CPU, with float32 linear layers (`check_quantizable`), and int8 products faster than float32 ones
    on this CPU (`check_int8_speed`); an int8 model refuses train(True) and inputs that need gradients."""
    if not isinstance(inplace, bool):
        raise TypeError(f"inplace={inplace!r} must be True or False")
    check_quantizable(model)
    check_int8_speed()
    if not inplace:
        model = copy.deepcopy(model)
    replacements: dict[int, Int8Linear] = {}
    for name, linear in check_quantizable(model):
        if id(linear) not in replacements:
            replacements[id(linear)] = Int8Linear(linear)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, replacements[id(linear)])
    if hasattr(model, "generate_fast"):
        model.generation_config.shared_cross_attention = True
    return model.requires_grad_(False)


def is_int8(model: nn.Module) -> bool:
    """Whether `quantize_int8` replaced `model`'s linear layers."""
    return any(isinstance(module, Int8Linear) for module in model.modules())
