"""The joint BPE tokenizer (pipeline/data/tokenization.py) round-trips through AutoTokenizer."""

from transformers import AutoTokenizer

from hf_posenc.pipeline.data.files import read_split
from hf_posenc.pipeline.data.tokenization import train_joint_bpe


def test_tokenizer_round_trips_through_auto_tokenizer(multi30k_dir, tmp_path):
    text = read_split(multi30k_dir, "val", "en", "de")
    tokenizer = train_joint_bpe(text.source + text.target, vocab_size=600)
    assert [tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id] == [0, 1, 2]
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    sample = text.source[:20] + text.target[:20]
    assert reloaded(sample)["input_ids"] == tokenizer(sample)["input_ids"]
    ids = reloaded(sample)["input_ids"]
    assert all(row[-1] == 1 for row in ids)  # </s> closes every sequence
    assert reloaded.batch_decode(ids, skip_special_tokens=True) == sample
