"""Attention windows: each self-attention query reads only the keys near its own position, and each cross-attention
query only the source positions near where its target progress points, so that a model given an input far longer
than its training inputs attends, at every token, over spans as long as those it was trained on. On when the
config sets `attention_window` (W) or `cross_attention_window` (C).

In the encoder, for tokens at positions i and j (counted from each source's first real token):

    allowed(i, j) = |i − j| ≤ W                                                        (1)

In the decoder, the start token at position 0:

    allowed(i, j) = j ≤ i and (i − j ≤ W or j = 0)                                    (2)

a window and the start token, which every query of training could read (the Λ-shaped mask of LM-Infinite, Han et
al., NAACL 2024, which keeps the first tokens beside a local window). In cross-attention, for target position i and
source position j of a source of n real tokens, with r = `cross_attention_window_ratio` target tokens per source
token:

    allowed(i, j) = |j − min(i / r, n − 1)| ≤ C                                        (3)

the window of Luong, Pham & Manning's local attention (EMNLP 2015) centred where a monotonic alignment at rate r
puts target token i, stopped at the source's last token so that a target longer than r·n still reads the end of
its source. Sliding windows in self-attention: Beltagy, Peters & Cohan 2020 (Longformer). Decoding a document so
that no window exceeds the training length: Zhang et al., EMNLP Findings 2023 (`window_sentences` does that by
cutting the input; these windows do it inside one pass).

The masks hold wherever the config sets them, in training too; windows wider than an input change nothing for it.
They are built from positions (the order of the tokens, not SHAPE's or randomized positions, nor the in-sentence
positions of `sentence_end_token_ids`), so a decoding step with the cache gets the mask of the whole forward.
"""

import math

import torch

from .base import CROSS_ATTENTION, DECODER_SELF_ATTENTION, ENCODER_SELF_ATTENTION, positions_from_padding_mask


def check_attention_windows(config, token_mixers: dict) -> None:
    """W and C positive integers or None, r a positive number used only with C, and at every site a window
    restricts a mixer that honours its mask (`supports_attention_windows`; the position-only mixers build their own
    weights and windows)."""
    for name in ("attention_window", "cross_attention_window"):
        value = getattr(config, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name}={value!r} must be an integer >= 1, or None (no window).")
    ratio = config.cross_attention_window_ratio
    if (
        isinstance(ratio, bool)
        or not isinstance(ratio, int | float)
        or not math.isfinite(ratio)
        or ratio <= 0
    ):
        raise ValueError(
            f"cross_attention_window_ratio={ratio!r} must be a positive number (target tokens per source token)."
        )
    if config.cross_attention_window is None and ratio != 1.0:
        raise ValueError(
            f"cross_attention_window_ratio={ratio!r} would do nothing: it places the cross-attention window, which "
            "cross_attention_window sets."
        )
    sites = [ENCODER_SELF_ATTENTION, DECODER_SELF_ATTENTION] if config.attention_window is not None else []
    sites += [CROSS_ATTENTION] if config.cross_attention_window is not None else []
    allowed = [name for name, cls in token_mixers.items() if cls.supports_attention_windows]
    for site in sites:
        if not token_mixers[getattr(config, site)].supports_attention_windows:
            field = "cross_attention_window" if site == CROSS_ATTENTION else "attention_window"
            raise ValueError(
                f"{field}={getattr(config, field)} restricts the attention at {site}, but {site}="
                f"{getattr(config, site)!r} builds its weights without that mask; allowed there: "
                f"{', '.join(allowed)}."
            )


def restricted(mask: torch.Tensor | None, allowed: torch.Tensor) -> torch.Tensor:
    """`mask` as transformers built it (SDPA's boolean, eager's additive float, or None) with every key outside
    `allowed` (B|1, 1, q, k) masked as well."""
    if mask is None:
        return allowed
    if mask.dtype == torch.bool:
        return mask & allowed
    return mask.masked_fill(~allowed, torch.finfo(mask.dtype).min)


def encoder_window_mask(mask, positions: torch.Tensor, window: int | None):
    """Eq. 1 on the encoder's self-attention mask; `positions` (B|1, L)."""
    if window is None:
        return mask
    distance = positions[:, None, :, None] - positions[:, None, None, :]  # (B|1, 1, L, L)
    return restricted(mask, distance.abs() <= window)


def decoder_window_mask(mask, past_length: int, query_length: int, window: int | None, device):
    """Eq. 2 on the decoder's causal mask over the cached and new positions, (B|1, 1, q, past + q)."""
    if window is None:
        return mask
    queries = torch.arange(past_length, past_length + query_length, device=device)[:, None]  # (q, 1)
    keys = torch.arange(past_length + query_length, device=device)[None]  # (1, k)
    distance = queries - keys
    allowed = (distance >= 0) & ((distance <= window) | (keys == 0))  # (q, k)
    return restricted(mask, allowed[None, None])


def cross_window_mask(
    mask, past_length: int, query_length: int, source_mask, source_length: int, config, device
):
    """Eq. 3 on the cross-attention mask, (B|1, 1, q, S); `source_mask` (B, S) or None (every source whole)."""
    if config.cross_attention_window is None:
        return mask
    sources = positions_from_padding_mask(source_mask, source_length, device)  # (B|1, S)
    lengths = (
        source_mask.sum(-1, keepdim=True) if source_mask is not None else torch.tensor([[source_length]])
    )
    queries = torch.arange(past_length, past_length + query_length, device=device)  # (q,)
    centres = torch.minimum(
        queries[None] / config.cross_attention_window_ratio, (lengths.to(device) - 1).clamp(min=0)
    )  # (B|1, q)
    allowed = (
        sources[:, None, :] - centres[:, :, None]
    ).abs() <= config.cross_attention_window  # (B|1, q, S)
    return restricted(mask, allowed[:, None])


def measure_token_ratio(source_lengths, target_lengths) -> float:
    """r for `cross_attention_window_ratio`: target tokens per source token over training pairs (lengths with
    `</s>`, as tokenized for training), the total of one over the total of the other, rounded to 3 decimals."""
    sources, targets = sum(source_lengths), sum(target_lengths)
    if sources <= 0 or targets <= 0:
        raise ValueError(
            f"need token lengths with a positive total: got {sources} source and {targets} target tokens"
        )
    return round(targets / sources, 3)
