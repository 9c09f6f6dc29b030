"""Constants and plain functions the tests share, for what a fixture cannot give: values read when a test
module is imported (parametrize tables, paths of module-level settings) and pure functions of their arguments.
Imported as `tests.helpers` (pytest's `pythonpath` puts the repository root on the path); everything a test
uses as an object (models, configs, batches, tokenizers, folders, flags) is a fixture in a conftest.py."""

import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

REPO = Path(__file__).resolve().parents[1]

# The tiny model's special tokens and vocabulary size (`TINY_FIELDS`, used by the `tiny_config` fixture).
PAD, EOS, VOCAB = 0, 1, 60

# The tiny Marian dimensions every test model shares (stock MarianConfig accepts them too).
TINY_FIELDS = dict(
    vocab_size=VOCAB,
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=64,
    dropout=0.1,
    pad_token_id=PAD,
    decoder_start_token_id=PAD,
    eos_token_id=EOS,
    forced_eos_token_id=EOS,
)

# A few sentence pairs the command-line tools are run on (the `bpe_tokenizer`, `model_dir` and `texts` fixtures).
SOURCES = ["a dog runs", "a man sits", "two dogs run on the grass", "a woman reads", "children play"]
REFERENCES = ["ein hund läuft", "ein mann sitzt", "zwei hunde laufen", "eine frau liest", "kinder spielen"]


def decode_with_cache(model, encoder_outputs, mask, target, prefill: int = 1) -> torch.Tensor:
    """Logits of `target` (B, T) fed with the generation cache: the first `prefill` tokens in one call, then one
    token per call; (B, T, V), to compare with the full forward."""
    steps, cache = [], None
    for start, end in [(0, prefill), *((p, p + 1) for p in range(prefill, target.shape[1]))]:
        out = model(
            encoder_outputs=encoder_outputs,
            attention_mask=mask,
            decoder_input_ids=target[:, start:end],
            past_key_values=cache,
            use_cache=True,
        )
        cache = out.past_key_values
        steps.append(out.logits)
    return torch.cat(steps, dim=1)


def assert_refused(code, message, words):
    """Exit code 2 and one line, as argparse ends on a bad flag, holding every word."""
    assert code == 2 and message.startswith("tool.py: error: "), message
    for word in words:
        assert word in message, message


def command_line(flags: str, paths: dict, model, *fixed) -> list:
    """The model folder, `fixed`, then `flags` with their {name} paths filled in; `--model X` among the flags
    names another model folder."""
    words = flags.format(**paths).split()
    if "--model" in words:
        at = words.index("--model")
        model = words[at + 1]
        del words[at : at + 2]
    return [model, *fixed, *words]


def snapshot(folder) -> dict:
    """Every file under `folder` with its bytes: a refused run must leave them all as they were."""
    return {str(path.relative_to(folder)): path.read_bytes() for path in folder.rglob("*") if path.is_file()}


def record_host_reads_from(package_dir: Path, monkeypatch) -> list[str]:
    """Every read of a tensor's values into Python (int(), bool(), .item(), .tolist(), torch.equal) made by
    code under `package_dir`: on a GPU each one waits for the device (a sync)."""
    reads = []

    def recorded(name, original):
        def read(*args, **kwargs):
            caller = sys._getframe(1).f_code
            if Path(caller.co_filename).is_relative_to(package_dir):
                reads.append(f"{name} in {caller.co_name}")
            return original(*args, **kwargs)

        return read

    for name in ("__int__", "__bool__", "__index__", "item", "tolist"):
        monkeypatch.setattr(torch.Tensor, name, recorded(name, getattr(torch.Tensor, name)))
    monkeypatch.setattr(torch, "equal", recorded("equal", torch.equal))
    return reads


def record_positions(model, monkeypatch) -> dict[str, list]:
    """The position contexts each stack's position encoding receives in `embed`, per stack."""
    seen = {"encoder": [], "decoder": []}
    for stack in seen:
        encoding = getattr(model.model, stack).position_encoding
        monkeypatch.setattr(
            encoding,
            "embed",
            lambda inputs, context, *args, f=encoding.embed, stack=stack: (
                seen[stack].append(context) or f(inputs, context, *args)
            ),
        )
    return seen


class RecordedOps(TorchDispatchMode):
    """The aten operators run under it, in `ops` (a set)."""

    def __init__(self):
        super().__init__()
        self.ops = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func)
        return func(*args, **(kwargs or {}))
