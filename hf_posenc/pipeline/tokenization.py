"""Joint source+target BPE trained with `tokenizers`, wrapped as a `PreTrainedTokenizerFast`.

Special tokens follow Marian: `<pad>` (0) doubles as the decoder start token, `</s>` (1) ends every
sequence, `<unk>` (2). The tokenizer saves beside the model and reloads exactly with `AutoTokenizer`.
"""

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

PAD, EOS, UNK = "<pad>", "</s>", "<unk>"
SPECIAL_TOKENS = [PAD, EOS, UNK]  # ids 0, 1, 2


def train_joint_bpe(
    texts: Iterable[str], vocab_size: int = 8000, min_frequency: int = 2
) -> PreTrainedTokenizerFast:
    """Learn one BPE vocabulary over source and target text (shared embeddings need a shared vocabulary)."""
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
