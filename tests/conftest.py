"""Fixtures every test folder shares: the tiny model and its batches, the toy tokenizers, the shipped data, a
tiny training run's flags, the command-line tools' inputs and a recording Hub API. Constants and pure functions
that a fixture cannot give (values read at import time) are in tests/helpers.py."""

import os
import sys
from pathlib import Path

import pytest
import torch

from hf_posenc.pipeline.data.files import DATA_ROOT_VARIABLE, data_root
from tests.helpers import EOS, PAD, REFERENCES, REPO, SOURCES, TINY_FIELDS, VOCAB

# Torch threads per test process: $HF_POSENC_TEST_THREADS, else 2 shared among `make test`'s workers (pytest-xdist
# sets PYTEST_XDIST_WORKER_COUNT in each): the tiny models gain nothing from a second thread, the workers do.
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(int(os.environ.get("HF_POSENC_TEST_THREADS", max(1, 2 // WORKERS))))

# The test files that take longest (installs, trainings, the conformance suite), started first: `make test` hands
# each file to one worker in the order collected, so a long file collected last would run on alone.
LONG_FILES = (
    "packaging/test_wheel.py",
    "pipeline/evaluation/test_command.py",
    "pipeline/training/test_fine_tuning.py",
    "study/test_compare.py",
    "pipeline/training/test_multiprocess.py",
    "model/test_conformance.py",
    "pipeline/training/test_run.py",
)

# The shipped data: $HF_POSENC_DATA, else ../shared/data beside the checkout (set here for the tests' own
# subprocesses too, as the Makefile sets it for its commands).
os.environ.setdefault(DATA_ROOT_VARIABLE, str(REPO.parent / "shared" / "data"))

# The words of the toy tokenizer: those of the analysis tests' sentences (tests/analysis/).
TOY_WORDS = sorted(
    set(
        "a an and man woman two dog dogs cat run runs sits on the green red grass near old house while children "
        "play".split()
    )
)


@pytest.fixture(scope="session")
def multi30k_dir() -> Path:
    """The shipped Multi30k folder; a test that needs it is skipped on a machine without the shared data."""
    folder = data_root() / "multi30k"
    if not folder.is_dir():
        pytest.skip(f"shared data folder {folder} is absent on this machine")
    return folder


@pytest.fixture(scope="session")
def tiny_config():
    """`tiny_config(**overrides)`: a `MarianPosEncConfig` of the tiny dimensions (`TINY_FIELDS`)."""
    from hf_posenc import MarianPosEncConfig

    def build(**overrides):
        return MarianPosEncConfig(**{**TINY_FIELDS, **overrides})

    return build


@pytest.fixture(scope="session")
def tiny_model(tiny_config):
    """`tiny_model(seed=0, **overrides)`: a tiny model in eval mode, initialised from `seed`."""
    from hf_posenc import MarianPosEncForConditionalGeneration

    def build(seed=0, **overrides):
        torch.manual_seed(seed)
        return MarianPosEncForConditionalGeneration(tiny_config(**overrides)).eval()

    return build


@pytest.fixture(scope="session")
def source_batch():
    """`source_batch(seed=0, batch=3, length=11)`: right-padded sources of different lengths, with their mask."""

    def build(seed=0, batch=3, length=11):
        generator = torch.Generator().manual_seed(seed)
        ids = torch.randint(2, VOCAB, (batch, length), generator=generator)
        mask = torch.ones_like(ids)
        for row in range(1, batch):
            cut = length - 2 * row
            ids[row, cut:] = PAD
            mask[row, cut:] = 0
        ids[torch.arange(batch), mask.sum(1) - 1] = EOS
        return ids, mask

    return build


@pytest.fixture(scope="session")
def target_batch():
    """`target_batch(seed=1, batch=3, length=9)`: decoder inputs that start with the decoder start token."""

    def build(seed=1, batch=3, length=9):
        generator = torch.Generator().manual_seed(seed)
        ids = torch.randint(2, VOCAB, (batch, length), generator=generator)
        ids[:, 0] = PAD  # decoder start token
        return ids

    return build


@pytest.fixture(scope="session")
def toy_tokenizer():
    """A word-level tokenizer of the tiny vocabulary: `TOY_WORDS`, then fillers up to `VOCAB`, so that every id
    the tiny model can generate decodes to a word; `</s>` ends every input."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": PAD, "</s>": EOS, "<unk>": 2}
    for word in TOY_WORDS:
        vocab.setdefault(word, len(vocab))
    while len(vocab) < VOCAB:
        vocab[f"filler{len(vocab)}"] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", EOS)])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )


@pytest.fixture(scope="session")
def tiny_run_flags(multi30k_dir):
    """`tiny_run_flags(train_limit=300)`: train.py flags of a seconds-long run on the shipped Multi30k: the tiny
    recipe with a 1-layer d32 model, `train_limit` training pairs and 4 test sentences, fp32 and eager attention
    on one thread (no probes), the C library's memory release (the test process lives on;
    tests/pipeline/training/test_multiprocess.py runs the default), no printed examples, and a degenerate result
    written, not fatal (each test adds its budget and checks)."""

    def flags(train_limit: int = 300) -> list[str]:
        model = ["--d_model", "32", "--layers", "1", "--heads", "2", "--ffn_dim", "32", "--vocab_size", "400"]
        data = ["--data_dir", str(multi30k_dir), "--train_limit", str(train_limit), "--test_limit", "4"]
        machine = ["--precision", "fp32", "--attention_backend", "eager", "--threads", "1"]
        quiet = ["--examples", "0", "--fail_on_degenerate", "false"]
        return ["--recipe", "multi30k-en-de-tiny", *data, *model, *machine, "--cpu_memory", "release", *quiet]

    return flags


# The command-line tools' inputs: a BPE tokenizer learnt from `SOURCES` and `REFERENCES`, a saved tiny model with
# it, and a folder of text files.


@pytest.fixture(scope="session")
def bpe_tokenizer():
    from hf_posenc.pipeline.data.tokenization import train_joint_bpe

    return train_joint_bpe((SOURCES + REFERENCES) * 3, vocab_size=60)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory, tiny_model, bpe_tokenizer):
    folder = tmp_path_factory.mktemp("model")
    tiny_model(max_position_embeddings=256).save_pretrained(folder)
    bpe_tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def texts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("texts")
    for name, lines in {
        "test.en": SOURCES,
        "test.de": REFERENCES,
        "short.hyp": REFERENCES[:3],
        "blank.txt": ["", "   "],
        "one_word.txt": ["dogs", "children"],
    }.items():
        (folder / name).write_text("\n".join(lines) + "\n")
    return folder


@pytest.fixture
def run_tool(monkeypatch, capsys):
    """`run_tool(main, argv)`: the tool as its command line runs it (`run_cli`): the exit code and the last line
    it wrote to stderr."""
    from hf_posenc.pipeline.cli import run_cli

    def run(main, argv) -> tuple[int, str]:
        capsys.readouterr()  # what the test's setup printed
        monkeypatch.setattr(sys, "argv", ["tool.py", *map(str, argv)])
        with pytest.raises(SystemExit) as exit_info:
            run_cli(main)
        written = capsys.readouterr().err
        assert "Traceback" not in written, written
        return exit_info.value.code, written.strip().splitlines()[-1]

    return run


class RecordingHubApi:
    """Stands in for `huggingface_hub.HfApi` (no network here). Every call is bound against the real `HfApi`
    method's signature (a parameter the real API lacks fails the test) and recorded with its arguments;
    `visibility` holds the repositories that exist (repo id -> private)."""

    def __init__(self, real_api: type, token=None):
        self.real_api = real_api
        self.token = token
        self.calls: list[tuple] = []
        self.visibility: dict[str, bool] = {}

    def record(self, name, *args, **kwargs) -> dict:
        import inspect

        bound = inspect.signature(getattr(self.real_api, name)).bind(self, *args, **kwargs).arguments
        bound.pop("self")
        self.calls.append((name, bound))
        return bound

    def create_repo(self, *args, **kwargs):
        from types import SimpleNamespace

        call = self.record("create_repo", *args, **kwargs)
        if call["repo_id"] in self.visibility and not call.get("exist_ok"):
            raise RuntimeError(f"{call['repo_id']} exists")
        self.visibility.setdefault(call["repo_id"], bool(call.get("private")))
        return SimpleNamespace(repo_id=call["repo_id"])

    def repo_info(self, *args, **kwargs):
        from types import SimpleNamespace

        call = self.record("repo_info", *args, **kwargs)
        return SimpleNamespace(private=self.visibility[call["repo_id"]])

    def create_branch(self, *args, **kwargs):
        self.record("create_branch", *args, **kwargs)

    def upload_folder(self, *args, **kwargs):
        from types import SimpleNamespace

        call = self.record("upload_folder", *args, **kwargs)
        call["files"] = sorted(path.name for path in Path(call["folder_path"]).iterdir())
        return SimpleNamespace(commit_url=f"https://hub.invalid/{call['repo_id']}/commit/1")


@pytest.fixture
def hub(monkeypatch):
    """The Hub API every `HfApi(token=...)` of the code under test gets (one recorder per test)."""
    import huggingface_hub

    recorder = RecordingHubApi(huggingface_hub.HfApi)

    def api(token=None):
        recorder.token = token
        return recorder

    monkeypatch.setattr(huggingface_hub, "HfApi", api)
    return recorder


def pytest_collection_modifyitems(items):
    """`LONG_FILES` first, in their order; the rest as collected."""

    def rank(item) -> int:
        path = item.path.as_posix()
        return next((index for index, name in enumerate(LONG_FILES) if path.endswith(name)), len(LONG_FILES))

    items.sort(key=rank)  # stable: the order within a file stays
