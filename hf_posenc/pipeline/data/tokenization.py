"""Joint source+target BPE trained with `tokenizers`, wrapped as a `PreTrainedTokenizerFast`, or an existing
tokenizer reused.

Special tokens follow Marian: `<pad>` (0) doubles as the decoder start token, `</s>` (1) ends every
sequence, `<unk>` (2). The tokenizer saves beside the model and reloads exactly with `AutoTokenizer`.
A reused tokenizer (`load_tokenizer`: a previous run's, or a pretrained model's, loaded with `AutoTokenizer`)
needs a pad and an end token and must end every sequence with the end token; other ids than 0/1/2 are fine:
the model's config takes its pad, decoder start and end ids from the tokenizer. It may be a Python tokenizer
(a stock Marian model's `MarianTokenizer`: two SentencePiece models, the target side encoded with
`text_target`).
"""

import hashlib
import logging
import tempfile
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

logger = logging.getLogger(__name__)

PAD, EOS, UNK = "<pad>", "</s>", "<unk>"
SPECIAL_TOKENS = [PAD, EOS, UNK]  # ids 0, 1, 2
PROBE_TEXT = "a b"  # any text: what a reused tokenizer makes of it shows its special-token layout


def train_joint_bpe(
    texts: Iterable[str | list[str]], vocab_size: int = 8000, min_frequency: int = 2
) -> PreTrainedTokenizerFast:
    """Learn one BPE vocabulary over source and target text (shared embeddings need a shared vocabulary).
    `texts` may yield strings or lists of strings (batches)."""
    bpe = Tokenizer(models.BPE(unk_token=UNK))
    bpe.normalizer = normalizers.NFKC()
    bpe.pre_tokenizer = pre_tokenizers.Metaspace()
    bpe.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=SPECIAL_TOKENS, show_progress=False
    )
    bpe.train_from_iterator(texts, trainer=trainer)
    bpe.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS}", pair=f"$A {EOS} $B {EOS}", special_tokens=[(EOS, bpe.token_to_id(EOS))]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe, pad_token=PAD, eos_token=EOS, unk_token=UNK, model_max_length=1024
    )


def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    """A saved tokenizer (a folder, e.g. a previous run's or a pretrained model's, or a Hub id) as `AutoTokenizer`
    loads it, checked for what the pipeline relies on: a pad token (padding and Marian's decoder start), an end
    token, and every encoded sequence ending with that end token and holding no other special token (no BOS or
    CLS)."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError, ImportError) as error:
        raise ValueError(
            f"{name_or_path!r} holds no loadable fast tokenizer (tokenizer.json) nor a Python one that this "
            f"installation can load (Marian's source.spm and target.spm need the sentencepiece package): {error}"
        ) from None
    missing = [name for name in ("pad_token", "eos_token") if getattr(tokenizer, name) is None]
    if missing:
        raise ValueError(
            f"tokenizer {name_or_path} has no {' and no '.join(missing)}; the models need <pad> (padding and "
            "decoder start) and </s> (end of every sequence)"
        )
    if tokenizer.pad_token_id == tokenizer.eos_token_id:
        raise ValueError(
            f"tokenizer {name_or_path} uses id {tokenizer.pad_token_id} for both padding and </s>; they must differ"
        )
    ids = tokenizer(PROBE_TEXT)["input_ids"]
    specials = set(tokenizer.all_special_ids)
    if not ids or ids[-1] != tokenizer.eos_token_id or specials & set(ids[:-1]):
        raise ValueError(
            f"tokenizer {name_or_path} encodes {PROBE_TEXT!r} as {tokenizer.convert_ids_to_tokens(ids)}: every "
            f"sequence must end with {tokenizer.eos_token!r} and hold no other special token (a post-processor "
            "like TemplateProcessing(single='$A </s>'))"
        )
    layout = (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id)
    if layout != (0, 1, 2):
        logger.info(
            "tokenizer %s: pad=%s, eos=%s, unk=%s (not Marian's 0/1/2): the model config takes these ids",
            name_or_path,
            *layout,
        )
    return tokenizer


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """sha256 of the serialised tokenizer (a fast one's tokenizer.json: normaliser, vocabulary, merges,
    post-processor; a Python one's class and vocabulary files, e.g. Marian's SentencePiece models) and of the
    special tokens: two tokenizers with the same fingerprint give the same ids."""
    if isinstance(tokenizer, PreTrainedTokenizerFast):
        digest = hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode("utf-8"))
    else:
        digest = hashlib.sha256(type(tokenizer).__name__.encode("utf-8"))
        with tempfile.TemporaryDirectory() as folder:
            for path in sorted(tokenizer.save_vocabulary(folder)):
                digest.update(Path(path).read_bytes())
    digest.update(repr(sorted(tokenizer.special_tokens_map.items())).encode("utf-8"))
    return digest.hexdigest()
