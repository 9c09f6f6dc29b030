"""The fast decoding loop: greedy and beam search over the model's own forward, token-identical to `generate`.

Switched on by the generation config's `fast_decoding` (False by default) or `generate(..., fast_decoding=True)`;
`generate` (generation_length.py) then runs `fast_generate` instead of transformers' loop. The loop computes what
transformers' greedy search (`_sample` without sampling) and beam search (`_beam_search`, transformers 5.x) compute,
step for step: the same forward call per step, the same float32 logits, log-softmax, logits processors (transformers'
own `NoRepeatNGramLogitsProcessor` and `ForcedEOSTokenLogitsProcessor`, the token bans of its `NoBadWords`, `MinLength`
and `MinNewTokensLength` processors as one in-place `BanTokens`, then the length control's), top-k selections,
length penalty, stopping rule (`early_stopping` False, True or "never") and output length. What it leaves out is
`generate`'s per-step machinery: input preparation and keyword updates, stopping criteria objects, the reordering
of the cross-attention cache, which beam search permutes within each example only, where every beam holds the same
encoder keys and values (`BeamCache`), the first step's copies for each beam (it runs once per example, `Decoder`),
and the rows that have finished (they leave the batch, `COMPACT_SHARE`).

Served: greedy and beam search (`num_beams` >= 1, `do_sample=False`), one returned sequence, the sequences only
(no `return_dict_in_generate`), the length penalty, `bad_words_ids`, `forced_eos_token_id`, `no_repeat_ngram_size`,
`min_length`, `min_new_tokens`, the budget (`max_new_tokens`, `max_length`) and the length control of
generation_length.py. Any other generation setting that differs from transformers' default is refused by name
(`fast_decoding_refusals`), never ignored. One setting gives up token identity for speed, off unless asked for
(int8 decoding asks for it): `shared_cross_attention`, where the beams of an example query one copy of its
cross-attention keys and values (`SHARED_CROSS_ATTENTION`).
"""

import torch
from transformers import DynamicCache, GenerationConfig, LogitsProcessorList
from transformers.cache_utils import DynamicLayer
from transformers.generation.logits_process import ForcedEOSTokenLogitsProcessor, NoRepeatNGramLogitsProcessor

from .base import PosEncCache

FAST_DECODING = "fast_decoding"
# The fast loop's one setting that is not token-identical to `generate` (off by default): the N beams of an example
# read one copy of its cross-attention keys and values, as N queries of one attention instead of N attentions of
# one query each. The same sums in another order: equal up to float rounding, so a token may differ where two
# candidates' scores are about as close as that. quantize_int8 (pipeline) turns it on for its models.
SHARED_CROSS_ATTENTION = "shared_cross_attention"
# Generation settings the loop serves (or that do not change what it computes); every other setting must keep
# transformers' default value.
SERVED = {
    "num_beams",
    "length_penalty",
    "early_stopping",
    "max_length",
    "max_new_tokens",
    "bad_words_ids",
    "forced_eos_token_id",
    "no_repeat_ngram_size",
    "min_length",
    "min_new_tokens",
    "pad_token_id",
    "eos_token_id",
    "bos_token_id",
    "decoder_start_token_id",
    "use_cache",
    "transformers_version",
    "_from_model_config",
    "max_new_tokens_over_source",
    FAST_DECODING,
    SHARED_CROSS_ATTENTION,
    # sampling settings: without sampling (`do_sample`, which must stay False) generate applies none of them
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "typical_p",
    "epsilon_cutoff",
    "eta_cutoff",
    "top_h",
}
NEG = -1.0e9  # transformers' score of a beam that must not be chosen
# Finished rows leave the batch once they are at least 1/COMPACT_SHARE of it: each selection copies every cache, and
# a few finished rows cost less to decode along (as `generate` does) than a copy at every step where one finishes.
COMPACT_SHARE = 16
# Keyword arguments of `generate` that the loop takes besides generation settings: the source and its mask.
INPUTS = {"attention_mask", "input_ids"}


def fast_decoding_refusals(settings: GenerationConfig, kwargs: dict) -> list[str]:
    """`key=value` of each generation setting of `settings` or `kwargs` (the call's) that the loop does not serve:
    a value other than transformers' default (and other than None or False, which turn a setting off) for a key
    outside `SERVED`, or a served key's unserved value; and each other keyword argument (`encoder_outputs`,
    `streamer`, ...) but the source and its mask."""
    defaults = GenerationConfig().to_dict()
    others = [
        f"{key}=..."
        for key, value in kwargs.items()
        if key not in defaults and key not in INPUTS and key != SHARED_CROSS_ATTENTION and value is not None
    ]
    values = {**settings.to_dict(), **{key: value for key, value in kwargs.items() if key in defaults}}
    refused = [
        f"{key}={value!r}"
        for key, value in values.items()
        if key in defaults and key not in SERVED and value != defaults[key] and value not in (None, False)
    ]
    if any(len(words) != 1 for words in values.get("bad_words_ids") or []):
        refused.append(f"bad_words_ids={values['bad_words_ids']!r} (only single tokens)")
    return refused + others


class BeamCache(PosEncCache):
    """`PosEncCache` whose beam reordering leaves the cross-attention cache as it is: beams are reordered within
    their example only, and every beam of an example holds the same encoder keys and values."""

    def reorder_cache(self, beam_idx: torch.LongTensor):
        self.self_attention_cache.reorder_cache(beam_idx)
        for name, state in self.extra_state.items():
            self.extra_state[name] = state.index_select(0, beam_idx.to(state.device))

    def batch_select_indices(self, indices: torch.LongTensor, examples: torch.LongTensor | None = None):
        """Keep rows `indices` of every cache (the cross-attention cache's rows `examples` where the beams share it;
        default `indices`), copied whole with `index_select`: transformers' `DynamicLayer` indexes
        (`keys[indices]`), 3.5x as long for (256, 4, 32, 64) keys (0.49 vs 0.14 ms, one thread, AMD EPYC)."""
        selections = ((self.self_attention_cache, indices), (self.cross_attention_cache, examples))
        for cache, rows in selections:
            rows = indices if rows is None else rows
            for layer in cache.layers:
                if type(layer) is not DynamicLayer:
                    layer.batch_select_indices(rows)
                elif layer.get_seq_length() > 0:
                    layer.keys, layer.values = (
                        layer.keys.index_select(0, rows),
                        layer.values.index_select(0, rows),
                    )
        for name, state in self.extra_state.items():
            self.extra_state[name] = state.index_select(0, indices)


class Decoder:
    """One decoding step of `model` for rows of `encoder_outputs`: the last token of each row in, its float32 logits
    out (as `generate` reads them), with the cache kept here. With `shared`, the N beams of an example read one
    copy of its cross-attention keys and values (`shared_cross_attention`), where every cross-attention mixer
    supports it."""

    def __init__(self, model, encoder_outputs, source_mask, num_beams: int = 1, shared: bool = False):
        self.model, self.encoder_outputs, self.source_mask = model, encoder_outputs, source_mask
        config = model.config
        self.cache = BeamCache(DynamicCache(config=config), DynamicCache(config=config))
        # rows per example until the first step, where every beam holds the start token
        self.repeats = num_beams
        mixers = [module for module in model.modules() if getattr(module, "is_cross_attention", False)]
        shared = shared and all(mixer.supports_shared_cross_attention for mixer in mixers)
        self.sharing = num_beams if shared else 1  # beams per row of the cross-attention cache

    def select(self, rows: torch.LongTensor) -> None:
        """Keep `rows` only, in their order (whole examples' beams together where they share the cross-attention
        cache): the cache, the encoder output and the source mask."""
        examples = rows[:: self.sharing] // self.sharing if self.sharing > 1 else None
        self.cache.batch_select_indices(rows, examples)
        for key, value in self.encoder_outputs.items():
            if isinstance(value, torch.Tensor):
                self.encoder_outputs[key] = value.index_select(0, rows)
        if self.source_mask is not None:
            self.source_mask = self.source_mask.index_select(0, rows)

    def __call__(self, tokens: torch.LongTensor) -> torch.Tensor:  # (rows,) -> (rows, V)
        repeats, self.repeats = self.repeats, 1
        output = self.model(
            encoder_outputs=self.encoder_outputs,
            attention_mask=self.source_mask,
            decoder_input_ids=tokens[::repeats, None],
            past_key_values=self.cache,
            use_cache=True,
            return_dict=True,
        )
        logits = output.logits[:, -1, :].float()  # a view of this step's logits, read once
        if repeats == 1:
            return logits
        # The first step ran once per example (its beams are all the start token, the cross-attention keys and
        # values computed once): its cache (but a shared cross-attention cache), encoder output and logits are
        # repeated for the beams, as `generate` expands them before decoding.
        if self.sharing > 1:
            self.cache.self_attention_cache.batch_repeat_interleave(repeats)
            self.cache.repeat_extra_state(repeats)
        else:
            self.cache.batch_repeat_interleave(repeats)
        self.encoder_outputs, self.source_mask = expanded(self.encoder_outputs, self.source_mask, repeats)
        return logits.repeat_interleave(repeats, dim=0)


def expanded(encoder_outputs, source_mask, num_beams: int):
    """The encoder output's tensors and the source mask repeated for each beam, as `generate` expands them."""
    if num_beams == 1:
        return encoder_outputs, source_mask
    for key, value in encoder_outputs.items():
        if isinstance(value, torch.Tensor):
            encoder_outputs[key] = value.repeat_interleave(num_beams, dim=0)
    return encoder_outputs, None if source_mask is None else source_mask.repeat_interleave(num_beams, dim=0)


class BanTokens:
    """Scores of `tokens` set to -inf while the rows hold fewer than `until` tokens (None: always), in place. This is
    what transformers' `NoBadWordsLogitsProcessor` computes for single-token bad words (the scores plus a bias of
    -inf at the banned tokens and 0 elsewhere), and `MinLengthLogitsProcessor` and
    `MinNewTokensLengthLogitsProcessor` for the end token (the scores with the end token's replaced by -inf while
    the hypothesis is short), without their copy of the scores and their full-vocabulary bias or mask."""

    def __init__(self, tokens: list[int], until: int | None, device):
        self.tokens, self.until = torch.tensor(tokens, dtype=torch.long, device=device), until

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:  # (R, t), (R, V)
        if self.until is None or input_ids.shape[-1] < self.until:
            scores.index_fill_(-1, self.tokens, float("-inf"))
        return scores


def processors(settings: dict, eos: int, extra: LogitsProcessorList, device) -> LogitsProcessorList:
    """transformers' processors for the served settings in `generate`'s order (the token bans as `BanTokens`),
    then `extra` (length control)."""
    chain = LogitsProcessorList()
    if settings["no_repeat_ngram_size"]:
        chain.append(NoRepeatNGramLogitsProcessor(settings["no_repeat_ngram_size"]))
    banned = [
        words[0] for words in settings["bad_words_ids"] or [] if words[0] != eos
    ]  # as transformers drops eos
    if banned:
        chain.append(BanTokens(banned, None, device))
    if settings["min_length"]:
        chain.append(BanTokens([eos], settings["min_length"], device))
    if settings["min_new_tokens"]:  # the decoder input holds the start token when generation starts
        chain.append(BanTokens([eos], 1 + settings["min_new_tokens"], device))
    if settings["forced_eos_token_id"] is not None:
        chain.append(
            ForcedEOSTokenLogitsProcessor(settings["max_length"], settings["forced_eos_token_id"], device)
        )
    return LogitsProcessorList([*chain, *extra])


@torch.no_grad()
def fast_generate(model, source, source_mask, settings: dict, extra: LogitsProcessorList) -> torch.LongTensor:
    """The sequences `generate` returns for `source` (B, S) with `source_mask` (B, S; None: no mask, as `generate`
    reads a source given without one) under `settings` (the served keys, resolved: `max_length` counts the
    decoder start token) and the processors `extra`; (B, T)."""
    encoder_outputs = model.get_encoder()(input_ids=source, attention_mask=source_mask, return_dict=True)
    step = Decoder(
        model, encoder_outputs, source_mask, settings["num_beams"], settings[SHARED_CROSS_ATTENTION]
    )
    chain = processors(settings, settings["eos_token_id"], extra, source.device)
    rows = source.shape[0] * settings["num_beams"]
    start = torch.full((rows, 1), settings["decoder_start_token_id"], device=source.device)
    if settings["num_beams"] == 1:
        return greedy(step, start, chain, settings)
    return beam_search(step, start, chain, settings, source.shape[0])


def greedy(step, sequences, chain, settings) -> torch.LongTensor:
    """transformers' greedy search: argmax of the processed logits, until every row has its end token or the
    budget is spent; a finished row's later tokens are padding. Finished rows leave the batch where the processors
    allow it (`compactable`), else they go on decoding as in `generate`."""
    pad, eos, max_length = settings["pad_token_id"], settings["eos_token_id"], settings["max_length"]
    output = torch.full((sequences.shape[0], max_length), pad, dtype=torch.long, device=sequences.device)
    output[:, :1] = sequences
    alive = torch.arange(sequences.shape[0], device=sequences.device)  # (A,) rows of `output` still decoding
    going = torch.ones_like(alive, dtype=torch.bool)  # (A,)
    compact = compactable(chain)
    while sequences.shape[1] < max_length:
        tokens = chain(sequences, step(sequences[:, -1])).argmax(-1).masked_fill(~going, pad)  # (A,)
        output[alive, sequences.shape[1]] = tokens
        sequences = torch.cat([sequences, tokens[:, None]], dim=-1)
        going &= tokens != eos
        if not going.any():
            break
        if compact and int((~going).sum()) * COMPACT_SHARE >= len(going):
            kept = going.nonzero()[:, 0]
            step.select(kept)
            keep_examples(chain, kept)
            alive, sequences, going = alive[kept], sequences[kept], going[kept]
    return output[:, : sequences.shape[1]]


def keep_examples(chain: LogitsProcessorList, examples: torch.LongTensor) -> None:
    """The processors' per-example values for `examples` only (`compactable` says which processors have any)."""
    for processor in chain:
        if hasattr(processor, "keep_examples"):
            processor.keep_examples(examples)


# Processors that hold nothing per example (they read only the rows given to them).
ROW_PROCESSORS = (NoRepeatNGramLogitsProcessor, BanTokens, ForcedEOSTokenLogitsProcessor)


def compactable(chain: LogitsProcessorList) -> bool:
    """Whether finished examples may leave the batch: every processor reads only its rows, or can drop examples
    (`keep_examples`); a processor given by the caller might keep state per row, so its batch stays whole."""
    return all(
        isinstance(processor, ROW_PROCESSORS) or hasattr(processor, "keep_examples") for processor in chain
    )


class Beams:
    """transformers' beam-search state of B examples × N beams: the running hypotheses (B, N, T) and their summed
    log-probabilities (B, N), the finished ones (B, N, T) with their length-penalised scores (B, N), generated
    lengths (B, N) and flags (B, N), and whether each example may still improve (B, 1)."""

    def __init__(self, start: torch.LongTensor, batch: int, num_beams: int, max_length: int, fill: int):
        device = start.device
        self.running = torch.full((batch, num_beams, max_length), fill, dtype=torch.long, device=device)
        self.running[:, :, :1] = start.view(batch, num_beams, 1)
        self.finished = self.running.clone()
        self.running_scores = torch.zeros(batch, num_beams, device=device)
        self.running_scores[:, 1:] = -1e9
        self.scores = torch.full((batch, num_beams), -1e9, device=device)
        self.lengths = torch.zeros(batch, num_beams, dtype=torch.long, device=device)
        self.done = torch.zeros(batch, num_beams, dtype=torch.bool, device=device)
        self.improvable = torch.ones(batch, 1, dtype=torch.bool, device=device)

    def keep(self, examples: torch.LongTensor) -> None:
        """Keep the state of `examples` only, in their order."""
        for name, value in vars(self).items():
            setattr(self, name, value[examples])


def gather_beams(tensor: torch.Tensor, indices: torch.LongTensor) -> torch.Tensor:
    """`tensor` (B, K, ...) at beam `indices` (B, N) of each example: (B, N, ...)."""
    index = indices.view(*indices.shape, *([1] * (tensor.dim() - 2))).expand(
        *indices.shape, *tensor.shape[2:]
    )
    return tensor.gather(1, index)


def beam_search(step, start, chain, settings, batch: int) -> torch.LongTensor:
    """transformers' beam search (one end-of-sequence token, one returned sequence). An example that can no longer
    improve, or whose N finished beams are full under `early_stopping=True`, leaves the batch with its best
    finished hypothesis, where the processors allow it (`compactable`)."""
    num_beams, max_length, eos = settings["num_beams"], settings["max_length"], settings["eos_token_id"]
    pad = settings["pad_token_id"]
    beams = Beams(start, batch, num_beams, max_length, pad if pad else eos)
    final, final_lengths = beams.finished[:, 0].clone(), beams.lengths[:, 0].clone()  # (B, T), (B,)
    alive = torch.arange(batch, device=start.device)  # (A,) examples still searched
    compact, cur_len = compactable(chain), 1
    while True:
        parents, chosen, hits = beam_step(beams, step, chain, cur_len, settings)
        cur_len += 1
        beams.improvable &= may_improve(beams, cur_len, settings)
        full = beams.done.all(-1) & (settings["early_stopping"] is True)  # (A,)
        if not beams.improvable.any() or hits.all() or full.all():
            break
        offset = torch.arange(len(alive), device=start.device)[:, None] * num_beams  # (A, 1)
        rows = gather_beams(parents, chosen) + offset  # (A, N) each new beam's row
        ended = ~beams.improvable[:, 0] | full  # (A,) examples that ended now or before
        if compact and int(ended.sum()) * COMPACT_SHARE >= len(alive):
            final[alive[ended]], final_lengths[alive[ended]] = (
                beams.finished[ended, 0],
                beams.lengths[ended, 0],
            )
            kept = (~ended).nonzero()[:, 0]
            beams.keep(kept)
            keep_examples(chain, kept)
            step.select(rows[kept].view(-1))  # the reordering and the dropping in one selection
            alive = alive[kept]
        else:
            step.cache.reorder_cache(rows.view(-1))
    final[alive], final_lengths[alive] = beams.finished[:, 0], beams.lengths[:, 0]
    return final[:, : 1 + int(final_lengths.max())]


def beam_step(beams: Beams, step, chain, cur_len: int, settings) -> tuple:
    """One step of beam search: each example's 2N best continuations, the new running beams and the finished
    ones; (candidates' parent beams (A, 2N), chosen candidates (A, N), candidates that finished (A, 2N))."""
    batch, num_beams = beams.running.shape[:2]
    rows = beams.running[:, :, :cur_len].reshape(batch * num_beams, cur_len)  # (A·N, t)
    log_probs = chain(rows, torch.log_softmax(step(rows[:, -1]), dim=-1))  # (A·N, V)
    vocab = log_probs.shape[-1]
    totals = log_probs.view(batch, num_beams, vocab).add_(beams.running_scores[:, :, None]).view(batch, -1)
    scores, indices = totals.topk(2 * num_beams)  # (A, 2N)
    parents = indices // vocab
    candidates = gather_beams(beams.running, parents)  # (A, 2N, T)
    candidates[:, :, cur_len] = indices % vocab
    hits = (candidates[:, :, cur_len] == settings["eos_token_id"]) | (cur_len + 1 >= settings["max_length"])
    chosen = next_running(beams, scores, candidates, hits, num_beams)  # (A, N)
    top = torch.arange(2 * num_beams, device=hits.device) < num_beams  # (2N,) the top N of the candidates
    update_finished(beams, scores, candidates, hits & top, cur_len, settings)
    return parents, chosen, hits


def may_improve(beams: Beams, cur_len: int, settings) -> torch.Tensor:
    """transformers' early-stop heuristic: whether the best running beam, scored at the current generated length
    (at the budget's under `early_stopping="never"` with a positive length penalty), beats the worst finished one;
    (A, 1)."""
    penalty = settings["length_penalty"]
    never = settings["early_stopping"] == "never" and penalty > 0.0
    length = settings["max_length"] - 1 if never else cur_len - 1
    best = beams.running_scores[:, :1] / (length**penalty)  # (A, 1)
    worst = torch.where(beams.done, beams.scores.min(1, keepdim=True)[0], NEG)  # (A, N)
    return (best > worst).any(-1, keepdim=True)


def next_running(beams: Beams, scores, candidates, hits, num_beams: int) -> torch.LongTensor:
    """The best N candidates that did not finish become the running beams; returns their candidate indices."""
    open_scores = scores + hits.to(torch.float32) * NEG  # (B, 2N)
    chosen = open_scores.topk(num_beams)[1]  # (B, N)
    beams.running = gather_beams(candidates, chosen)
    beams.running_scores = gather_beams(open_scores, chosen)
    return chosen


def update_finished(beams: Beams, scores, candidates, finishing, cur_len: int, settings) -> None:
    """Candidates among the top N that finish enter the finished beams where they beat them (scores divided by the
    generated length to the power of the length penalty), unless the example can no longer improve or, under
    `early_stopping=True`, its finished beams are full."""
    penalised = scores / (
        cur_len ** settings["length_penalty"]
    )  # cur_len + 1 tokens, the start not generated
    full = beams.done.all(-1, keepdim=True) & (settings["early_stopping"] is True)  # (A, 1)
    penalised = penalised + full.to(torch.float32) * NEG + (~beams.improvable).to(torch.float32) * NEG
    penalised = penalised + (~finishing) * NEG
    merged = torch.cat((beams.scores, penalised), dim=1)  # (B, 3N)
    best = merged.topk(beams.scores.shape[1])[1]  # (B, N)
    lengths = torch.full_like(penalised, cur_len, dtype=torch.long)
    beams.finished = gather_beams(torch.cat((beams.finished, candidates), dim=1), best)
    beams.scores = gather_beams(merged, best)
    beams.lengths = gather_beams(torch.cat((beams.lengths, lengths), dim=1), best)
    beams.done = gather_beams(torch.cat((beams.done, finishing), dim=1), best)


def resolved_settings(settings: GenerationConfig, kwargs: dict, model_config) -> dict:
    """The served settings of one call, each from `kwargs` (the call's) else `settings`, with `max_length`
    counting the decoder start token (`max_new_tokens` first, as `generate` takes it); refuses what the loop does
    not serve, naming it (`fast_decoding_refusals`, several end tokens)."""
    refused = fast_decoding_refusals(settings, kwargs)

    def value(key):
        return kwargs[key] if key in kwargs else getattr(settings, key, None)

    eos = value("eos_token_id")
    eos = eos[0] if isinstance(eos, (list, tuple)) and len(eos) == 1 else eos
    if not isinstance(eos, int):
        refused.append(f"eos_token_id={eos!r} (one end token)")
    shared = value(SHARED_CROSS_ATTENTION)
    shared = False if shared is None else shared  # unset in configs saved before the setting existed
    if not isinstance(shared, bool):
        refused.append(f"{SHARED_CROSS_ATTENTION}={shared!r} (True or False)")
    if refused:
        raise ValueError(
            f"fast_decoding serves greedy and beam search with the length control; it cannot serve "
            f"{', '.join(refused)}: leave fast_decoding off for these settings"
        )
    new_tokens = value("max_new_tokens")
    start = value("decoder_start_token_id")
    served = ("num_beams", "length_penalty", "early_stopping", "bad_words_ids", "forced_eos_token_id")
    resolved = {key: value(key) for key in served}
    return resolved | {
        "no_repeat_ngram_size": value("no_repeat_ngram_size") or 0,
        "min_length": value("min_length") or 0,
        "min_new_tokens": value("min_new_tokens") or 0,
        "max_length": 1 + new_tokens if new_tokens is not None else value("max_length"),
        "eos_token_id": eos,
        SHARED_CROSS_ATTENTION: shared,
        "pad_token_id": value("pad_token_id") if value("pad_token_id") is not None else eos,
        "decoder_start_token_id": model_config.decoder_start_token_id if start is None else start,
    }
