"""Positional kernels of paper 1 (Zhang et al., ACL 2023, Sections 3.2–3.3): PosNet-Embed and PosNet-Attn.

Weight concatenation (Eq. 10–11) keeps word order by concatenating the weighted values a_ij v_j in sequence
order and projecting the L·d vector back with Φ ∈ R^{Ld×d}. Splitting Φ into L blocks φ_j ∈ R^{d×d} gives the
cheap equivalent form o_i = Σ_j a_ij (v_j φ_j) = a_i (V ⊗ Φ) (Eq. 14–17): every position j owns a
"positional kernel" φ_j that multiplies the vector at that position.

* `"posnet_embed"` (Eq. 24) applies kernels to the scaled token embeddings through a low-rank bottleneck,
  PosNet(X; Φ) = Dropout(σ((X W1) ⊗ Φ) W2) + X, with W1 ∈ R^{d×d_p}, W2 ∈ R^{d_p×d}, Φ ∈ R^{L_max×d_p×d_p}.
  By default one module serves both stacks, as in the reference code.
* `"posnet_attn"` (Eq. 20/23) transforms the values of every self-attention layer,
  Attn(Q, K, V) = softmax(QKᵀ/√d_k) (Dropout(σ(V ⊗ Φ)) + V), with one kernel φ_j ∈ R^{d_k×d_k} per key
  position and layer (optionally per head). The transform runs in `transform_values`, before caching, so a
  decoding step costs one d_k×d_k product per head.

Deviations from the reference code (github vesterchang/interpret_positional_encoding) and why:

* The decoder always gets its kernels. The released recipe passed `--no-token-positional-embeddings`, which
  also dropped the decoder's PosNet, leaving the decoder without any position information.
* Kernels are indexed by the position counted from the start of each sequence (the model's position_ids).
  The reference left-padded sources and indexed by column, so a token's kernel depended on the batch padding.
* The reference applies PosNet to the embeddings *after* the embedding dropout; here `embed` runs before the
  stack's dropout (the model's one place for it), so the dropout acts on PosNet's output instead.
* The kernel tables hold `posnet_embed_max_positions` / `posnet_attn_max_positions` positions (default
  `max_position_embeddings`; the reference hard-codes 512, paper 1 Table 1's counts imply 200 and 252, see
  docs/posnet.md), and a longer input raises a ValueError.
"""

import math

import torch
from torch import nn
from torch.autograd.function import once_differentiable
from transformers import initialization as init
from transformers.activations import ACT2FN

from .base import (
    DECODER,
    ENCODER,
    PAPER_1,
    Hyperparameter,
    PositionContext,
    PositionEncoding,
    PositionPanel,
    apply_dropout,
    check_max_positions,
    cosine_similarity_matrix,
)


def position_kernel_product(
    inputs: torch.Tensor, kernels: torch.Tensor, positions: torch.Tensor, span=None
) -> torch.Tensor:
    """x_t φ_{p_t} for every token t (Eq. 16): inputs (B, L, G, d), kernels (L_max, K, d, d), positions (B|1, L),
    `span` their (smallest, largest) value when the caller knows it (see `first_of_consecutive`).

    K is 1 (one kernel for all G groups, e.g. heads) or G (a kernel per group). The product runs as one batched
    matmul over positions with the batch folded into the rows, so the kernels are read once per position and
    not once per token; it computes in the inputs' dtype. Rows whose positions differ from the batch's shared
    ones (padding, which gets clamped positions) are recomputed token by token, which keeps every token exact.
    """
    batch, length, groups, dim = inputs.shape
    shared_positions = positions.amax(0)  # (L,): the positions of the longest rows
    rows = inputs.permute(1, 2, 0, 3).reshape(length, kernels.shape[1], -1, dim)  # (L, K, G·B/K, d)
    first = first_of_consecutive(shared_positions, span)
    if first is None:
        output = torch.matmul(rows, kernels[shared_positions].to(inputs.dtype))
    else:
        output = KernelRangeProduct.apply(rows, kernels, first)  # (L, K, G·B/K, d)
    output = output.reshape(length, groups, batch, dim).permute(2, 0, 1, 3)  # (B, L, G, d)
    if positions.shape[0] > 1:
        differs = positions != shared_positions  # (B, L)
        if differs.any():
            row, column = differs.nonzero(as_tuple=True)
            tokens = inputs[row, column].reshape(row.shape[0], kernels.shape[1], -1, dim)  # (N, K, G/K, d)
            fixed = torch.matmul(tokens, kernels[positions[row, column]].to(inputs.dtype))  # (N, K, G/K, d)
            output = output.index_put((row, column), fixed.reshape(-1, groups, dim).to(output.dtype))
    return output


def first_of_consecutive(positions: torch.Tensor, span=None) -> int | None:
    """The first of positions (L,) when they are consecutive (first, first + 1, ...), as they are for unpadded
    and right-padded batches and for decoding steps; else None (the kernels are then gathered).

    With the positions' `span` (smallest, largest), as the model passes it, the test needs no read-back of the
    positions (a device sync per decoding step on a GPU): the model's positions start every row at the span's
    smallest value and rise by 0 or 1 per token (`positions_from_padding_mask`, the decoder's ranges), so L
    positions spanning L values are consecutive. Without a span the positions are compared with a range."""
    if span is not None:
        first, last = span
        return first if last - first + 1 == positions.shape[0] else None
    first = int(positions[0]) if positions.numel() else 0
    if torch.equal(positions, torch.arange(first, first + positions.shape[0], device=positions.device)):
        return first
    return None


class KernelRangeProduct(torch.autograd.Function):
    """rows (L, K, N, d) @ kernels[first : first + L] (L_max, K, d, d), with a lean backward for the kernels.

    Through autograd, the kernels' gradient would be made twice: the product's backward writes an L-row
    gradient, then the slice's backward zero-fills a whole-table one and copies it in. Here backward zero-fills
    the rows outside the range and writes the product's gradient straight into the table-sized tensor, one
    L_max × K × d × d allocation instead of two. (On the CPU each fresh allocation that size is paid in page
    faults: 14 ms per 32 MiB table, more than computing the gradient.) The product computes in the rows'
    dtype, as the plain matmul after the lookup did; the kernels' gradient is in the table's dtype.
    """

    @staticmethod
    def forward(ctx, rows, kernels, first: int):
        output = torch.matmul(rows, kernels[first : first + rows.shape[0]].to(rows.dtype))
        ctx.save_for_backward(rows, kernels)
        ctx.first, ctx.compute_dtype = first, output.dtype  # autocast may have lowered it
        return output

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output):
        rows, kernels = ctx.saved_tensors
        first, last, dtype = ctx.first, ctx.first + rows.shape[0], ctx.compute_dtype
        grad_output = grad_output.to(dtype)
        grad_rows = grad_kernels = None
        if ctx.needs_input_grad[0]:
            used_kernels = kernels[first:last].to(dtype)
            grad_rows = torch.matmul(grad_output, used_kernels.transpose(-1, -2)).to(rows.dtype)
        if ctx.needs_input_grad[1]:
            grad_kernels = torch.empty_like(kernels, memory_format=torch.contiguous_format)
            grad_kernels[:first].zero_()
            grad_kernels[last:].zero_()
            used_grad = grad_kernels[first:last]
            if dtype == kernels.dtype:
                torch.matmul(rows.transpose(-1, -2), grad_output, out=used_grad)
            else:
                used_grad.copy_(torch.matmul(rows.to(dtype).transpose(-1, -2), grad_output))
        return grad_rows, grad_kernels, None


def kernel_std(num_positions: int, dim: int) -> float:
    """Xavier-normal std of a kernel stack Φ ∈ R^{L×d×d} as torch computes it (fan_in d·d, fan_out L·d)."""
    return math.sqrt(2.0 / (dim * dim + num_positions * dim))


# Hyperparameters both PosNet encodings read.
POSNET_HYPERPARAMETERS = {
    "posnet_activation": Hyperparameter(
        str, "relu", "σ of Eq. 23/24, a name from transformers' ACT2FN", choices=tuple(sorted(ACT2FN))
    ),
    "posnet_dropout": Hyperparameter(
        float,
        0.0,
        "dropout on PosNet's output before the residual (reference default 0)",
        minimum=0.0,
        below=1.0,
    ),
    "posnet_shared": Hyperparameter(
        bool, True, "encoder and decoder share one PosNet module / kernel table (reference)"
    ),
}


class PositionalKernelNetwork(nn.Module):
    """The embedding-level PosNet of Eq. 24: X -> Dropout(σ((X W1) ⊗ Φ) W2) + X.

    W1 (d×d_p) and W2 (d_p×d) have no bias, as in the reference; Φ is (L_max, 1, d_p, d_p) so that it feeds
    `position_kernel_product` directly.
    """

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.max_positions = config.posnet_embed_max_positions or config.max_position_embeddings
        self.activation = ACT2FN[config.posnet_activation]
        self.dropout = config.posnet_dropout
        self.down = nn.Parameter(torch.empty(config.d_model, config.posnet_dim))  # W1
        self.up = nn.Parameter(torch.empty(config.posnet_dim, config.d_model))  # W2
        self.kernels = nn.Parameter(torch.empty(self.max_positions, 1, config.posnet_dim, config.posnet_dim))
        self.reset_parameters()

    def reset_parameters(self):
        init.xavier_normal_(self.down)
        init.xavier_normal_(self.up)
        init.normal_(self.kernels, std=kernel_std(self.max_positions, self.config.posnet_dim))

    def forward(self, inputs: torch.Tensor, context: PositionContext) -> torch.Tensor:
        check_max_positions(context, self.max_positions, "posnet_embed", "posnet_embed_max_positions")
        projected = (inputs @ self.down).unsqueeze(2)  # (B, L, 1, d_p)
        kernelled = position_kernel_product(
            projected, self.kernels, context.query_positions, context.query_span
        ).squeeze(2)
        update = self.activation(kernelled) @ self.up  # (B, L, D)
        return inputs + apply_dropout(update, p=self.dropout, training=self.training)


class PosNetEmbedding(PositionEncoding):
    """PosNet-Embed (paper 1 Eq. 24) on the scaled token embeddings; replaces the sinusoid table.

    With `posnet_shared` (the default, as in the reference) and PosNet-Embed in both stacks, the decoder uses
    the encoder's network: the model calls `tie_to_encoder`, and the decoder keeps a plain reference to it,
    so the parameters exist once in the state dict and load, save and remote-code load need no tying step.
    """

    title = "PosNet-Embed"
    reference = "paper 1 Eq. 22/24 (positional kernels Eq. 14-17)"
    citations = (PAPER_1,)
    hyperparameters = {
        **POSNET_HYPERPARAMETERS,
        "posnet_dim": Hyperparameter(int, 128, "d_p of Eq. 24 (paper 1 §5: 128 base, 256 big)", minimum=1),
        "posnet_embed_max_positions": Hyperparameter(
            int | None, None, "L of the kernel table Φ; None: max_position_embeddings", minimum=1
        ),
    }
    position_table_fields = ("posnet_embed_max_positions", "max_position_embeddings")
    # The kernel product takes positions that rise by 0 or 1 per token (`first_of_consecutive`), which positions
    # restarting at each sentence do not.
    supports_sentence_positions = False
    variants = {
        "separate-stacks": {"posnet_shared": False},
        "decoder-only": {"encoder_position_encoding": "sinusoidal"},
    }

    def __init__(self, config, stack):
        super().__init__(config, stack)
        self.max_positions = config.posnet_embed_max_positions or config.max_position_embeddings
        self.uses_encoder_network = (
            stack == DECODER and config.posnet_shared and config.encoder_position_encoding == "posnet_embed"
        )
        self.network = None if self.uses_encoder_network else PositionalKernelNetwork(config)

    def reset_parameters(self):
        if not self.uses_encoder_network:  # the encoder initialises a shared network
            self.network.reset_parameters()

    def tie_to_encoder(self, encoder_encoding: PositionEncoding) -> None:
        if self.uses_encoder_network:
            # A plain attribute, not a submodule: the encoder owns (saves, loads, initialises) the network.
            self.__dict__["network"] = encoder_encoding.network

    def embed(self, inputs_embeds, context, padding_mask, cache):
        if self.network is None:
            raise RuntimeError(
                "This decoder shares the encoder's PosNet (posnet_shared=True) but was built without an "
                "encoder; build the whole model, or set posnet_shared=False."
            )
        return self.network(inputs_embeds, context)  # (B, L, D)

    def position_panels(self, positions):
        """Cosine similarity of the kernels φ_j of every pair of positions (once for a shared network)."""
        if self.uses_encoder_network:
            return []
        kernels = cosine_similarity_matrix(self.network.kernels[:positions])
        return [PositionPanel(f"{self.stack}: PosNet-Embed kernel similarity", "map", kernels)]


class ReluKernelResidual(torch.autograd.Function):
    """v + Dropout(ReLU(v ⊗ Φ)) (paper 1 Eq. 23 with σ = ReLU) that keeps only v and a 1-byte mask for backward.

    Plain autograd would save the position-major copy of v (for the kernels' gradient) and ReLU's output (for
    ReLU's gradient): two float tensors of the values' size per layer. Here the forward saves the values v
    (the value projection's output), the kernel table (a parameter, no extra memory) and one bool mask that
    folds ReLU's derivative and the dropout mask together; backward recomputes v ⊗ Φ, a d_k×d_k product per
    token, to get the gradients of v and Φ.
    """

    @staticmethod
    def forward(ctx, value, kernels, positions, dropout: float, training: bool, span=None):
        # value (B, H, k, d_k), kernels (L_max, K, d_k, d_k), positions (B|1, k), span as in `first_of_consecutive`
        with torch.autocast(value.device.type, enabled=False):
            pre_activation = kernel_product_of_values(value, kernels, positions, span)  # (B, H, k, d_k)
        mask = pre_activation > 0
        scale = 1.0
        if training and dropout > 0:
            mask &= torch.rand_like(pre_activation) >= dropout
            scale = 1.0 / (1.0 - dropout)
        ctx.save_for_backward(value, kernels, positions, mask)
        ctx.scale, ctx.span = scale, span
        update = pre_activation.mul_(mask)
        if scale != 1.0:
            update.mul_(scale)
        return update.add_(value)  # (B, H, k, d_k)

    @staticmethod
    def backward(ctx, grad_output):
        value, kernels, positions, mask = ctx.saved_tensors
        grad_pre_activation = grad_output * mask
        if ctx.scale != 1.0:
            grad_pre_activation.mul_(ctx.scale)
        with torch.enable_grad(), torch.autocast(value.device.type, enabled=False):
            value_leaf = value.detach().requires_grad_(ctx.needs_input_grad[0])
            kernels_leaf = kernels.detach().requires_grad_(ctx.needs_input_grad[1])
            pre_activation = kernel_product_of_values(value_leaf, kernels_leaf, positions, ctx.span)
            leaves = [leaf for leaf in (value_leaf, kernels_leaf) if leaf.requires_grad]
            grads = iter(torch.autograd.grad(pre_activation, leaves, grad_pre_activation))
        grad_value = grad_output + next(grads) if ctx.needs_input_grad[0] else None
        grad_kernels = next(grads) if ctx.needs_input_grad[1] else None
        return grad_value, grad_kernels, None, None, None, None


def kernel_product_of_values(
    value: torch.Tensor, kernels: torch.Tensor, positions: torch.Tensor, span=None
) -> torch.Tensor:
    """v_j φ_j for attention values (B, H, k, d_k) with kernels (L_max, K, d_k, d_k)."""
    per_position = value.transpose(1, 2)  # (B, k, H, d_k)
    return position_kernel_product(per_position, kernels, positions, span).transpose(1, 2)


class PosNetAttention(PositionEncoding):
    """PosNet-Attn (paper 1 Eq. 20/23): self-attention values v_j -> Dropout(σ(v_j φ_j)) + v_j.

    Kernel tables `kernels[t]` ∈ R^{L_max × K × d_k × d_k} with K = 1 (shared by the heads, the paper's
    single-head notation) or K = heads (`posnet_attn_per_head`). By default (`posnet_attn_share_layers`,
    `posnet_shared`) one table serves every self-attention layer of both stacks: the model paper 1 Table 1
    counts (+1.03M over SAPE in the base model = 252 × 64²); the decoder takes the encoder's table.
    `posnet_attn_share_layers=False` gives each layer its own table. Cross-attention gets no kernels (the model passes it no
    position encoding). The check against L_max runs once per forward, in `embed`, which otherwise leaves the
    embeddings unchanged. With σ = ReLU the transform runs through `ReluKernelResidual` (memory-lean
    backward); other activations use plain autograd.
    """

    title = "PosNet-Attn"
    reference = "paper 1 Eq. 20/21/23 (positional kernels Eq. 14-17)"
    citations = (PAPER_1,)
    hyperparameters = {
        **POSNET_HYPERPARAMETERS,
        "posnet_attn_per_head": Hyperparameter(bool, False, "a kernel per head instead of one per layer"),
        "posnet_attn_share_layers": Hyperparameter(
            bool,
            True,
            "one kernel table for all layers of a stack (and, with posnet_shared, both stacks): the model "
            "paper 1 Table 1 counts; False: one table per layer",
        ),
        "posnet_attn_max_positions": Hyperparameter(
            int | None, None, "L of the kernel table; None: max_position_embeddings", minimum=1
        ),
    }
    position_table_fields = ("posnet_attn_max_positions", "max_position_embeddings")
    # The kernel product takes positions that rise by 0 or 1 per token (`first_of_consecutive`), which positions
    # restarting at each sentence do not.
    supports_sentence_positions = False
    variants = {
        "per-head-dropout": {"posnet_attn_per_head": True, "posnet_dropout": 0.1},
        "per-layer-dropout": {"posnet_attn_share_layers": False, "posnet_dropout": 0.1},
        "separate-stacks-gelu": {"posnet_shared": False, "posnet_activation": "gelu"},
    }

    def __init__(self, config, stack):
        super().__init__(config, stack)
        self.max_positions = config.posnet_attn_max_positions or config.max_position_embeddings
        self.activation = ACT2FN[config.posnet_activation]
        self.lean_relu = config.posnet_activation == "relu"
        self.dropout = config.posnet_dropout
        self.share_layers = config.posnet_attn_share_layers
        layers = config.encoder_layers if stack == ENCODER else config.decoder_layers
        heads = config.encoder_attention_heads if stack == ENCODER else config.decoder_attention_heads
        self.head_dim = config.d_model // heads
        kernel_groups = heads if config.posnet_attn_per_head else 1
        self.uses_encoder_kernels = stack == DECODER and uses_one_kernel_table_per_model(config)
        if self.uses_encoder_kernels:
            self.kernels = None  # set by `tie_to_encoder`
            return
        # One parameter per table, not one (layers, L_max, ...) tensor: indexing a layer out of a joint
        # parameter makes every layer's backward materialise a gradient of the whole stack.
        self.kernels = nn.ParameterList(
            nn.Parameter(torch.empty(self.max_positions, kernel_groups, self.head_dim, self.head_dim))
            for _ in range(1 if self.share_layers else layers)
        )
        self.reset_parameters()

    @classmethod
    def check_config(cls, config, stack):
        if uses_one_kernel_table_per_model(config) and (
            config.encoder_attention_heads != config.decoder_attention_heads
        ):
            raise ValueError(
                "posnet_attn_share_layers=True with posnet_shared=True shares one kernel table between the "
                f"stacks, which needs equal head counts (encoder_attention_heads={config.encoder_attention_heads}, "
                f"decoder_attention_heads={config.decoder_attention_heads}); set posnet_shared=False."
            )

    def reset_parameters(self):
        if self.uses_encoder_kernels:  # the encoder initialises the shared table
            return
        # Each (L_max, d_k, d_k) table is initialised like the reference's Xavier-normal kernels.
        for kernels in self.kernels:
            init.normal_(kernels, std=kernel_std(self.max_positions, self.head_dim))

    def tie_to_encoder(self, encoder_encoding: PositionEncoding) -> None:
        if self.uses_encoder_kernels:
            # A plain attribute, not a submodule: the encoder owns (saves, loads, initialises) the table.
            self.__dict__["kernels"] = encoder_encoding.kernels

    def layer_kernels(self, layer_idx: int) -> torch.Tensor:
        """The kernel table of self-attention layer `layer_idx`: (L_max, K, d_k, d_k)."""
        if self.kernels is None:
            raise RuntimeError(
                "This decoder shares the encoder's PosNet-Attn kernels (posnet_attn_share_layers=True, "
                "posnet_shared=True) but was built without an encoder; build the whole model, or set "
                "posnet_shared=False."
            )
        return self.kernels[0 if self.share_layers else layer_idx]

    def embed(self, inputs_embeds, context, padding_mask, cache):
        check_max_positions(context, self.max_positions, "posnet_attn", "posnet_attn_max_positions")
        return inputs_embeds

    def transform_values(self, layer_idx, value, value_positions, value_span=None):
        kernels = self.layer_kernels(layer_idx)
        if self.lean_relu:
            return ReluKernelResidual.apply(
                value, kernels, value_positions, self.dropout, self.training, value_span
            )
        kernelled = kernel_product_of_values(
            value, kernels, value_positions, value_span
        )  # (B, H, k_new, d_k)
        update = apply_dropout(self.activation(kernelled), p=self.dropout, training=self.training)
        return value + update  # (B, H, k_new, d_k)

    def position_panels(self, positions):
        """Cosine similarity of the kernels of every pair of positions, per table (none for the decoder when it
        reads the encoder's table)."""
        if self.uses_encoder_kernels:
            return []
        return [
            PositionPanel(
                f"{self.stack} table {i}: kernel similarity", "map", cosine_similarity_matrix(k[:positions])
            )
            for i, k in enumerate(self.kernels)
        ]


def uses_one_kernel_table_per_model(config) -> bool:
    """PosNet-Attn in both stacks with one table shared by all layers and by the two stacks."""
    return (
        config.posnet_attn_share_layers
        and config.posnet_shared
        and config.encoder_position_encoding == "posnet_attn"
        and config.decoder_position_encoding == "posnet_attn"
    )
