"""Length control at decode time, tied to each example's source: three `LogitsProcessor`s and a loop guard.

Models trained on short examples stop at a length learned in training when the input is longer (Varis & Bojar,
EMNLP 2021, "Sequence Length is a Domain"); `generate` knows only absolute lengths. The options below scale with
the source, per example of the batch, and are read from the generation config by the model's `generate`
(`LengthControlGenerationMixin.generate`, below), so a saved `generation_config.json` turns them on:

* `min_length_ratio` r: no `</s>` before the hypothesis holds ⌈r·|x|⌉ tokens, `</s>` included, where |x| counts
  the example's non-pad source tokens, its `</s>` included (fairseq2's `min_gen_len = a·|x| + b` with b = 0;
  eole's `ratio` stops the beam there, this only forbids stopping earlier). `measure_min_length_ratio` measures r
  from the training pairs.
* `word_reward` ρ: ρ added to the log-probability of every token that is not `</s>`: the word reward of He et al.
  (2016, "Improved neural machine translation with SMT features") and Murray & Chiang (WMT 2018, "Correcting
  length bias in neural machine translation"), Marian's `--word-penalty` with the opposite sign. Beam search adds
  processed log-probabilities into a hypothesis's score and divides the sum by its length at the end, so a
  hypothesis of n tokens (W of them not `</s>`) scores (Σ_t log p(y_t | y_<t, x) + ρ·W) / n^α with α the
  `length_penalty`: the reward sits inside the normalised sum, as Marian's word penalty does. Greedy decoding picks
  argmax_v (log p(v) + ρ·[v ≠ </s>]) at each step (the processor sees logits there; log-softmax shifts a row by a
  constant, so the argmax is the same).
* `match_source_sentence_count`: no `</s>` before the hypothesis holds as many sentence ends as its source. A
  sentence ends at a token of the generation config's `sentence_end_token_ids` (else the model config's field of
  that name, which also turns on sentence-aware positions, sentence_positions.py) unless the next token is one of
  its `continuation_token_ids`, the tokens that carry on the word before them: the `.` of `18.4` or of the first
  `U.S.` ends nothing (`sentence_end_positions`). Without continuation ids every sentence-end token ends a
  sentence. `sentence_boundary_settings(tokenizer)` below derives both, the one place that does.
* `window_sentences` N: the source is cut after its sentence ends (as above) into windows of N
  consecutive sentences, each window is translated as an input of its own (all windows of the batch in one
  `generate` call, with the other settings), and each example's window translations are joined in order: sliding-
  window decoding that never gives the model an input longer than N sentences (Zhang, Gu, Zhang & Feng, EMNLP
  Findings 2023, "Addressing the length bias challenge in document-level NMT"; non-overlapping windows here).
  N = 1 is sentence-by-sentence decoding. A token after the last sentence end forms a last sentence. The
  windows' tokens are joined as generated: with a tokenizer that marks word starts (SentencePiece, the Metaspace
  BPE of the pipeline), a trained model starts each translation with a word start, so the text has a space
  between windows. Only the
  sequences are returned (`return_dict_in_generate`, several returned sequences and `inputs_embeds` are refused).
* The loop guard is transformers' own `no_repeat_ngram_size` (`NoRepeatNGramLogitsProcessor`): when any option
  above is on and the generation config leaves `no_repeat_ngram_size` unset (None), `generate` sets it to
  `LOOP_GUARD_NGRAM_SIZE`; 0 turns the guard off explicitly.

A row whose only allowed token is `</s>` (the budget's last step under `forced_eos_token_id`) keeps it: the two
`</s>` bans never leave a row without a token. The processors read only the ids of the hypothesis and the
per-example source figures, which `repeat_interleave` spreads over beams or returned sequences, so they hold
no state to reorder and give the same result with and without the cache.
"""

import math
from dataclasses import dataclass

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from .base import is_number
from .fast_decoding import FAST_DECODING, SHARED_CROSS_ATTENTION, fast_generate, resolved_settings
from .model_checks import check_generation_settings

MIN_LENGTH_RATIO = "min_length_ratio"
WORD_REWARD = "word_reward"
MATCH_SOURCE_SENTENCE_COUNT = "match_source_sentence_count"
SENTENCE_END_TOKEN_IDS = "sentence_end_token_ids"
CONTINUATION_TOKEN_IDS = "continuation_token_ids"
WINDOW_SENTENCES = "window_sentences"
# The keys that read the sentence-end ids: each needs them when it is on.
NEEDS_SENTENCE_ENDS = (MATCH_SOURCE_SENTENCE_COUNT, WINDOW_SENTENCES)
# The generation-config keys read here and their defaults: every option off.
LENGTH_CONTROL_DEFAULTS = {
    MIN_LENGTH_RATIO: None,
    WORD_REWARD: None,
    MATCH_SOURCE_SENTENCE_COUNT: False,
    SENTENCE_END_TOKEN_IDS: None,
    CONTINUATION_TOKEN_IDS: None,
    WINDOW_SENTENCES: None,
}
# n of the loop guard: long enough that captions may share phrases ("in front of a"), short enough to stop a
# repeated sentence (a Multi30k caption is 12-15 tokens); a choice, not measured.
LOOP_GUARD_NGRAM_SIZE = 8
# The quantile of target/source length ratios taken as r: the ratio of a long joined input varies less than that of
# one sentence, so a low quantile of single sentences is a floor that long inputs rarely need to go below.
DEFAULT_RATIO_QUANTILE = 0.05
# Sentence-final marks (as the length harness counts them) and what may close a sentence after them.
SENTENCE_END_MARKS = ".!?。！？"
CLOSING_MARKS = "\"'”’»)]"
WORD_BOUNDARY_MARKS = "▁Ġ"  # Metaspace (SentencePiece, our BPE) and byte-level word starts


def sentence_boundary_settings(tokenizer) -> dict[str, list[int]]:
    """The generation-config settings that find sentence ends in token ids, from `tokenizer`:
    `sentence_end_token_ids` and, where the vocabulary marks word starts, `continuation_token_ids`."""
    settings = {SENTENCE_END_TOKEN_IDS: sentence_end_token_ids(tokenizer)}
    if continuations := continuation_token_ids(tokenizer):
        settings[CONTINUATION_TOKEN_IDS] = continuations
    return settings


def continuation_token_ids(tokenizer) -> list[int]:
    """Ids of the vocabulary's tokens that carry on the word before them: no word-boundary mark first
    (`WORD_BOUNDARY_MARKS`), special tokens excluded; none where no token of the vocabulary starts with a mark (the
    vocabulary does not say where words start)."""
    special = set(getattr(tokenizer, "all_special_ids", ()))
    vocab = {token: token_id for token, token_id in tokenizer.get_vocab().items() if token_id not in special}
    if not any(token[:1] in WORD_BOUNDARY_MARKS for token in vocab):
        return []
    return sorted(token_id for token, token_id in vocab.items() if token[:1] not in WORD_BOUNDARY_MARKS)


def sentence_end_token_ids(tokenizer) -> list[int]:
    """Ids of the vocabulary's tokens that end a sentence: their text, word-boundary marks and closing quotes or
    brackets stripped, ends with `.`, `!`, `?` or a CJK full stop, question or exclamation mark; special tokens
    excluded. Works on any tokenizer with `get_vocab()` (and `all_special_ids`)."""
    special = set(getattr(tokenizer, "all_special_ids", ()))
    ends = []
    for token, token_id in tokenizer.get_vocab().items():
        text = token.strip(WORD_BOUNDARY_MARKS).rstrip(CLOSING_MARKS)
        if token_id not in special and text and text[-1] in SENTENCE_END_MARKS:
            ends.append(token_id)
    return sorted(ends)


def measure_min_length_ratio(
    source_lengths, target_lengths, quantile: float = DEFAULT_RATIO_QUANTILE
) -> float:
    """r for `min_length_ratio`: the `quantile` of target/source token-length ratios over training pairs (lengths
    with `</s>`, as tokenized for training), rounded down to 3 decimals."""
    sources = torch.as_tensor(list(source_lengths), dtype=torch.float64)
    targets = torch.as_tensor(list(target_lengths), dtype=torch.float64)
    if sources.numel() == 0 or sources.shape != targets.shape:
        raise ValueError(
            f"need as many target lengths as source lengths, at least one: got {sources.numel()} source and "
            f"{targets.numel()} target lengths"
        )
    if not 0 <= quantile <= 1:
        raise ValueError(f"quantile={quantile!r} must lie in [0, 1]")
    if (sources <= 0).any() or (targets <= 0).any():
        raise ValueError("token lengths must be positive: every tokenized example holds at least its </s>")
    ratio = torch.quantile(targets / sources, quantile).item()
    return math.floor(ratio * 1000) / 1000


def key_error(key: str, value, allowed: str) -> ValueError:
    return ValueError(f"generation config {key}={value!r} is not allowed: {allowed}")


def checked_token_ids(key: str, ids, model_config) -> tuple[int, ...] | None:
    """The token ids of setting `key` as a tuple, refused unless every id is a token of the vocabulary other than
    the end-of-sequence and padding tokens (which every source holds or may hold)."""
    if ids is None:
        return None
    vocab_size = model_config.vocab_size
    special = {getattr(model_config, name, None) for name in ("eos_token_id", "pad_token_id")} - {None}
    allowed = f"a list of token ids in 0..{vocab_size - 1}, without </s> and <pad> ({sorted(special)})"
    if not isinstance(ids, (list, tuple)) or not all(
        isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab_size and i not in special
        for i in ids
    ):
        raise key_error(key, ids, allowed)
    return tuple(ids)


def sentence_end_positions(
    ids: torch.LongTensor, sentence_end_token_ids, continuation_token_ids=None
) -> torch.Tensor:
    """Where a sentence ends in `ids` (..., n), as bools (..., n): a sentence-end token whose next token is not a
    continuation token (the last token has none after it)."""
    ends = torch.isin(ids, torch.as_tensor(sentence_end_token_ids, device=ids.device))  # (..., n)
    if continuation_token_ids is not None and len(continuation_token_ids):
        carried = torch.isin(ids[..., 1:], torch.as_tensor(continuation_token_ids, device=ids.device))
        ends[..., :-1] &= ~carried
    return ends


@dataclass(frozen=True)
class LengthControl:
    """The length-control settings of one `generate` call, checked (`from_settings`)."""

    min_length_ratio: float | None = None
    word_reward: float | None = None
    match_source_sentence_count: bool = False
    sentence_end_token_ids: tuple[int, ...] | None = None
    continuation_token_ids: tuple[int, ...] | None = None
    window_sentences: int | None = None

    @property
    def active(self) -> bool:
        return (
            self.min_length_ratio is not None
            or self.word_reward is not None
            or self.match_source_sentence_count
        )

    @classmethod
    def from_settings(cls, generation_config, overrides: dict, model_config) -> "LengthControl":
        """The settings of `generation_config` (a missing key takes `LENGTH_CONTROL_DEFAULTS`), each replaced by
        the same key of `overrides` (`generate`'s keyword arguments), which are removed from `overrides`. Without
        sentence-end ids there, those of the model's config (sentence-aware positions) are taken."""
        values = {
            key: overrides.pop(key) if key in overrides else getattr(generation_config, key, default)
            for key, default in LENGTH_CONTROL_DEFAULTS.items()
        }
        if values[SENTENCE_END_TOKEN_IDS] is None:
            values[SENTENCE_END_TOKEN_IDS] = (
                list(getattr(model_config, SENTENCE_END_TOKEN_IDS, None) or []) or None
            )
        ratio, reward = values[MIN_LENGTH_RATIO], values[WORD_REWARD]
        if ratio is not None and not (is_number(ratio) and math.isfinite(ratio) and ratio >= 0):
            raise key_error(
                MIN_LENGTH_RATIO, ratio, "a finite number >= 0 (a multiple of the source length), or None"
            )
        if reward is not None and not (is_number(reward) and math.isfinite(reward)):
            raise key_error(
                WORD_REWARD, reward, "a finite number (added to each non-</s> log-probability), or None"
            )
        match = values[MATCH_SOURCE_SENTENCE_COUNT]
        if not isinstance(match, bool):
            raise key_error(MATCH_SOURCE_SENTENCE_COUNT, match, "True or False")
        window = values[WINDOW_SENTENCES]
        if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
            raise key_error(WINDOW_SENTENCES, window, "a whole number >= 1 (sentences per window), or None")
        ids = checked_token_ids(SENTENCE_END_TOKEN_IDS, values[SENTENCE_END_TOKEN_IDS], model_config)
        continuations = checked_token_ids(
            CONTINUATION_TOKEN_IDS, values[CONTINUATION_TOKEN_IDS], model_config
        )
        needs = [f"{key}={values[key]!r}" for key in NEEDS_SENTENCE_ENDS if values[key]]
        if needs and not ids:
            raise key_error(
                SENTENCE_END_TOKEN_IDS,
                values[SENTENCE_END_TOKEN_IDS],
                f"{' and '.join(needs)} needs a non-empty list of sentence-end token ids "
                "(sentence_end_token_ids(tokenizer))",
            )
        return cls(
            None if ratio is None else float(ratio),
            None if reward is None else float(reward),
            match,
            ids,
            continuations,
            window,
        )

    def settings(self, **changes) -> dict:
        """These settings as `generate`'s keyword arguments, with `changes`."""
        return {key: getattr(self, key) for key in LENGTH_CONTROL_DEFAULTS} | changes


def loop_guard_ngram_size(control: LengthControl, no_repeat_ngram_size: int | None) -> int | None:
    """The `no_repeat_ngram_size` to decode with: `LOOP_GUARD_NGRAM_SIZE` when length control is on and the setting
    is unset (None); the setting otherwise (0 keeps the guard off)."""
    if control.active and no_repeat_ngram_size is None:
        return LOOP_GUARD_NGRAM_SIZE
    return no_repeat_ngram_size


def per_row(values: torch.Tensor, rows: int) -> torch.Tensor:
    """Per-example values (B,) spread over the rows of a step, (B·n,), as generate expands inputs for beams and
    returned sequences (`repeat_interleave`)."""
    if rows % values.shape[0]:
        raise ValueError(f"{rows} decoding rows are not a whole multiple of the {values.shape[0]} examples")
    return values.repeat_interleave(rows // values.shape[0])


class SourceTiedEosBlock(LogitsProcessor):
    """Bans `</s>` in the rows where `blocked(hypotheses)` holds, unless `</s>` is the row's only allowed token (every
    other score -inf). Its id tensors are made on `device`, the decoding device, once (none is copied at a step).
    It leaves `scores` as it is (greedy search keeps that tensor as the raw logits): one copy, whose `</s>` columns
    it writes, and one reading of the other scores (each row's largest)."""

    def __init__(self, eos_token_ids: list[int], prompt_length: int, device=None):
        self.eos_token_ids = torch.tensor(eos_token_ids, dtype=torch.long, device=device)
        self.prompt_length = prompt_length

    per_example = "min_lengths"  # the attribute holding one value per example, (B,)

    def blocked(self, hypotheses: torch.LongTensor) -> torch.Tensor:  # (rows,) bool
        raise NotImplementedError

    def keep_examples(self, examples: torch.LongTensor) -> None:
        """Keep the values of `examples` only, in their order (the fast loop drops finished examples)."""
        values = getattr(self, self.per_example)
        setattr(self, self.per_example, values[examples.to(values.device)])

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        blocked = self.blocked(input_ids[:, self.prompt_length :])  # (rows,)
        processed = scores.clone()  # (rows, V)
        processed[:, self.eos_token_ids] = -math.inf
        has_other = processed.amax(-1) > -math.inf  # (rows,): a token besides </s> is allowed
        ban = (blocked & has_other)[:, None]  # (rows, 1)
        processed[:, self.eos_token_ids] = scores[:, self.eos_token_ids].masked_fill(ban, -math.inf)
        return processed


class MinLengthRatioLogitsProcessor(SourceTiedEosBlock):
    """No `</s>` before a hypothesis holds `min_lengths` tokens (`</s>` included), per example:
    ⌈r·|x|⌉ from `min_length_ratio`. transformers' `MinNewTokensLengthLogitsProcessor` takes one number for the
    batch; this takes one per example."""

    def __init__(
        self, min_lengths: torch.LongTensor, eos_token_ids: list[int], prompt_length: int, device=None
    ):
        super().__init__(eos_token_ids, prompt_length, device)
        self.min_lengths = min_lengths  # (B,), on `device`

    def blocked(self, hypotheses):
        minimum = per_row(self.min_lengths, hypotheses.shape[0])  # (rows,)
        return hypotheses.shape[-1] + 1 < minimum  # the hypothesis with </s> would be too short


class SentenceCountLogitsProcessor(SourceTiedEosBlock):
    """No `</s>` before a hypothesis holds `source_counts` sentence ends (`sentence_end_positions`), per example;
    a hypothesis's last token counts if it is a sentence-end token, as `</s>` after it would leave it last."""

    per_example = "source_counts"

    def __init__(
        self,
        source_counts,
        sentence_end_token_ids,
        eos_token_ids,
        prompt_length: int,
        continuation_token_ids=None,
        device=None,
    ):
        super().__init__(eos_token_ids, prompt_length, device)
        self.source_counts = source_counts  # (B,), on `device`
        self.sentence_end_token_ids = torch.tensor(sentence_end_token_ids, dtype=torch.long, device=device)
        self.continuation_token_ids = torch.tensor(
            continuation_token_ids or [], dtype=torch.long, device=device
        )

    def blocked(self, hypotheses):
        ends = sentence_end_positions(
            hypotheses, self.sentence_end_token_ids, self.continuation_token_ids
        ).sum(-1)  # (rows,)
        return ends < per_row(self.source_counts, hypotheses.shape[0])


class WordRewardLogitsProcessor(LogitsProcessor):
    """Adds `reward` to the score of every token but `</s>` (He et al. 2016; Murray & Chiang 2018)."""

    def __init__(self, reward: float, eos_token_ids: list[int], device=None):
        self.reward = reward
        self.eos_token_ids = torch.tensor(eos_token_ids, dtype=torch.long, device=device)

    def keep_examples(self, examples: torch.LongTensor) -> None:
        """Nothing per example (the fast loop's compaction)."""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        bonus = torch.full(scores.shape[-1:], self.reward, dtype=scores.dtype, device=scores.device)  # (V,)
        bonus[self.eos_token_ids] = 0
        return scores + bonus


def length_control_processors(
    control: LengthControl,
    source_ids: torch.LongTensor,
    source_mask: torch.Tensor,
    eos_token_ids: list[int],
    prompt_length: int,
) -> LogitsProcessorList:
    """The processors of `control` for a batch of sources (B, S) with their mask (B, S) (1: a token, 0: padding);
    `prompt_length` decoder tokens precede each hypothesis (the start token). The processors hold their values on
    the sources' device."""
    processors = LogitsProcessorList()
    device = source_ids.device
    mask = source_mask.bool()
    if control.min_length_ratio is not None and eos_token_ids:
        lengths = mask.sum(-1)  # (B,)
        minimum = torch.ceil(lengths.double() * control.min_length_ratio).long()  # (B,)
        processors.append(MinLengthRatioLogitsProcessor(minimum, eos_token_ids, prompt_length, device))
    if control.match_source_sentence_count and eos_token_ids:
        ends = sentence_end_positions(
            source_ids, control.sentence_end_token_ids, control.continuation_token_ids
        )
        counts = (ends & mask).sum(-1)  # (B,)
        processors.append(
            SentenceCountLogitsProcessor(
                counts,
                control.sentence_end_token_ids,
                eos_token_ids,
                prompt_length,
                control.continuation_token_ids,
                device,
            )
        )
    if control.word_reward is not None:
        processors.append(WordRewardLogitsProcessor(control.word_reward, eos_token_ids, device))
    return processors


def sentence_windows(
    source: torch.LongTensor, mask: torch.Tensor, control: LengthControl, eos_token_id: int
) -> tuple[list[torch.LongTensor], list[int]]:
    """The windows of `control.window_sentences` consecutive sentences of each source (B, S) with its mask (B, S),
    each ending in `eos_token_id` as a source does, and the example each window belongs to. A sentence ends where
    `sentence_end_positions` says; `</s>` and padding are not part of any sentence."""
    eos = source.new_tensor([eos_token_id])
    size = control.window_sentences
    batch_ends = sentence_end_positions(  # (B, S): padding and </s> never continue a word
        source, control.sentence_end_token_ids, control.continuation_token_ids
    )
    windows, owners = [], []
    for row, (ids, keep, ends) in enumerate(zip(source, mask.bool(), batch_ends, strict=True)):
        real = keep & (ids != eos_token_id)
        tokens = ids[real]  # (n,)
        cuts = (ends[real].nonzero().flatten() + 1).tolist()  # after each sentence end
        bounds = [0, *(cut for cut in cuts if cut < len(tokens)), len(tokens)]
        for index, start in enumerate(bounds[:-1:size]):
            stop = bounds[min(index * size + size, len(bounds) - 1)]
            windows.append(torch.cat([tokens[start:stop], eos]))
            owners.append(row)
    return windows, owners


def join_windows(
    outputs: torch.LongTensor, owners: list[int], rows: int, eos_token_id: int, pad_token_id: int
) -> torch.LongTensor:
    """Each example's window translations (W, T), in order, as one sequence: the decoder's start token, every
    window's tokens without start, `</s>` and padding, and `</s>` where the example's last window ended with it;
    (rows, T') padded with `pad_token_id`."""
    pieces: list[list[torch.LongTensor]] = [[outputs[owners.index(row), :1]] for row in range(rows)]
    ended = [False] * rows
    for output, row in zip(outputs, owners, strict=True):
        body = output[1:]
        pieces[row].append(body[(body != eos_token_id) & (body != pad_token_id)])
        ended[row] = bool((body == eos_token_id).any())
    eos = outputs.new_tensor([eos_token_id])
    joined = [torch.cat([*parts, eos] if done else parts) for parts, done in zip(pieces, ended, strict=True)]
    return torch.nn.utils.rnn.pad_sequence(joined, batch_first=True, padding_value=pad_token_id)  # (rows, T')


class LengthControlGenerationMixin:
    """The translation model's `generate` (mixed into `MarianPosEncForConditionalGeneration` ahead of
    `GenerationMixin`, whose `generate` it wraps): the source-tied budget and the length control above, read from
    the generation config or the call's keyword arguments."""

    def generate(self, inputs=None, generation_config=None, logits_processor=None, **kwargs):
        """`GenerationMixin.generate`; unless a length is given, allows source length + N new tokens, with N
        from the call's or the generation config's `max_new_tokens_over_source` (50, paper 1); adds the
        source-tied length control of the generation config or of the keyword arguments (`min_length_ratio`,
        `word_reward`, `match_source_sentence_count` with `sentence_end_token_ids`, and the loop guard; module
        docstring). Refuses a non-finite float setting and a count below 1 (`check_generation_settings`), which
        transformers decodes into NaN scores or fails on deep inside."""
        settings = generation_config or self.generation_config
        control = LengthControl.from_settings(settings, kwargs, self.config)  # first: its keys' own rules
        check_generation_settings(  # before the budget: it checks max_new_tokens_over_source too
            settings.to_dict(),
            kwargs,
            "in the generation_config given to generate"
            if generation_config is not None
            else "in the model's generation config (generation_config.json of a saved model)",
        )
        if control.window_sentences is not None:
            return self.generate_in_windows(control, inputs, generation_config, logits_processor, kwargs)
        over_source = kwargs.pop(
            "max_new_tokens_over_source", getattr(settings, "max_new_tokens_over_source", None)
        )
        source = inputs if inputs is not None else kwargs.get("input_ids")
        if (
            over_source is not None
            and source is not None
            and not {"max_new_tokens", "max_length"} & kwargs.keys()
        ):
            kwargs["max_new_tokens"] = source.shape[-1] + over_source
        if control.active:
            logits_processor = self.length_control(control, settings, source, logits_processor, kwargs)
        if kwargs.pop(FAST_DECODING, getattr(settings, FAST_DECODING, False)):
            return self.generate_fast(source, settings, logits_processor, kwargs)
        if kwargs.pop(SHARED_CROSS_ATTENTION, False):
            raise ValueError(
                f"{SHARED_CROSS_ATTENTION}=True is a setting of the fast loop, which is off for this call: pass "
                "fast_decoding=True with it (transformers' loop keeps a copy of the keys for each beam)"
            )
        return super().generate(
            inputs, generation_config=generation_config, logits_processor=logits_processor, **kwargs
        )

    def generate_fast(self, source, settings, logits_processor, kwargs) -> torch.LongTensor:
        """`generate` through the fast decoding loop (fast_decoding.py), for the settings it serves."""
        if source is None or source.dtype.is_floating_point:
            raise ValueError("fast_decoding needs the source token ids: pass input_ids, not inputs_embeds")
        kwargs.pop("input_ids", None)
        # None where the call gives none: transformers 5's generate infers no mask for an encoder-decoder model
        mask = kwargs.get("attention_mask")  # (B, S) or None
        resolved = resolved_settings(settings, kwargs, self.config)
        return fast_generate(self, source, mask, resolved, LogitsProcessorList(logits_processor or []))

    def length_control(self, control, settings, source, logits_processor, kwargs) -> LogitsProcessorList:
        """`logits_processor` with the processors of `control` for the batch `source` appended; sets the loop
        guard's `no_repeat_ngram_size` in `kwargs` where neither `kwargs` nor `settings` set it."""
        if source is None or source.dtype.is_floating_point:
            raise ValueError(
                "length control (min_length_ratio, word_reward, match_source_sentence_count) needs the source "
                "token ids: pass input_ids, not inputs_embeds"
            )
        ngram = kwargs.get("no_repeat_ngram_size", settings.no_repeat_ngram_size)
        kwargs["no_repeat_ngram_size"] = loop_guard_ngram_size(control, ngram)
        mask = kwargs.get("attention_mask")
        mask = mask if mask is not None else source != self.config.pad_token_id  # (B, S)
        eos = kwargs.get("eos_token_id", settings.eos_token_id)
        eos = [i for i in (eos if isinstance(eos, (list, tuple)) else [eos]) if i is not None and i >= 0]
        prompt = kwargs.get("decoder_input_ids")
        processors = length_control_processors(
            control, source, mask, eos, prompt_length=1 if prompt is None else prompt.shape[-1]
        )
        return LogitsProcessorList([*(logits_processor or []), *processors])

    def generate_in_windows(self, control, inputs, generation_config, logits_processor, kwargs):
        """`generate` under `window_sentences` (module docstring): the windows of every example in one call with
        the other settings, joined per example."""
        settings = generation_config or self.generation_config
        source = inputs if inputs is not None else kwargs.pop("input_ids", None)
        unsupported = {
            "inputs_embeds": kwargs.get("inputs_embeds") is not None,
            "decoder_input_ids": kwargs.get("decoder_input_ids") is not None,
            "return_dict_in_generate": kwargs.get(
                "return_dict_in_generate", settings.return_dict_in_generate
            ),
            "num_return_sequences > 1": (
                kwargs.get("num_return_sequences", settings.num_return_sequences) or 1
            )
            > 1,
        }
        refused = [name for name, given in unsupported.items() if given]
        if source is None or source.dtype.is_floating_point or refused:
            raise ValueError(
                f"window_sentences={control.window_sentences} cuts the source token ids into windows and returns "
                f"the joined sequences: pass input_ids, without {', '.join(refused or ['inputs_embeds'])}"
            )
        mask = kwargs.pop("attention_mask", None)
        pad, eos = self.config.pad_token_id, self.config.eos_token_id
        mask = mask if mask is not None else source != pad  # (B, S)
        windows, owners = sentence_windows(source, mask, control, eos)
        batch = torch.nn.utils.rnn.pad_sequence(windows, batch_first=True, padding_value=pad)  # (W, S')
        outputs = self.generate(
            batch,
            generation_config=generation_config,
            logits_processor=logits_processor,
            attention_mask=(batch != pad).long(),
            **control.settings(window_sentences=None),
            **kwargs,
        )  # (W, T)
        return join_windows(outputs, owners, source.shape[0], eos, pad)
