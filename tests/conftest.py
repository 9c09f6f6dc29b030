"""Shared fixtures: tiny configs, deterministic batches, and the location of the shipped data."""

import os
from pathlib import Path

import pytest
import torch

from hf_posenc.pipeline.data.files import DATA_ROOT_VARIABLE, data_root

torch.set_num_threads(int(os.environ.get("HF_POSENC_TEST_THREADS", "2")))

REPO = Path(__file__).resolve().parents[1]
# The shipped data: $HF_POSENC_DATA, else ../shared/data beside the checkout (set here for the tests' own
# subprocesses too, as the Makefile sets it for its commands).
os.environ.setdefault(DATA_ROOT_VARIABLE, str(REPO.parent / "shared" / "data"))
DATA_DIR = data_root() / "multi30k"

PAD, EOS, VOCAB = 0, 1, 60


def tiny_run_flags(train_limit: int = 300) -> list[str]:
    """train.py flags of a seconds-long run on the shipped Multi30k: the tiny recipe with a 1-layer d32 model,
    `train_limit` training pairs and 4 test sentences, fp32 and eager attention on one thread (no probes), the C
    library's memory release (the test process lives on; tests/test_multiprocess.py runs the default), no
    printed examples, and a degenerate result written, not fatal (each test adds its budget and checks)."""
    model = ["--d_model", "32", "--layers", "1", "--heads", "2", "--ffn_dim", "32", "--vocab_size", "400"]
    data = ["--data_dir", str(DATA_DIR), "--train_limit", str(train_limit), "--test_limit", "4"]
    machine = [
        "--precision",
        "fp32",
        "--attention_backend",
        "eager",
        "--threads",
        "1",
        "--cpu_memory",
        "release",
    ]
    quiet = ["--examples", "0", "--fail_on_degenerate", "false"]
    return ["--recipe", "multi30k-en-de-tiny", *data, *model, *machine, *quiet]


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


def tiny_config(**overrides):
    from hf_posenc import MarianPosEncConfig

    return MarianPosEncConfig(**{**TINY_FIELDS, **overrides})


def tiny_model(seed=0, **overrides):
    from hf_posenc import MarianPosEncForConditionalGeneration

    torch.manual_seed(seed)
    return MarianPosEncForConditionalGeneration(tiny_config(**overrides)).eval()


def source_batch(seed=0, batch=3, length=11):
    """Right-padded sources of different lengths, with their mask."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, VOCAB, (batch, length), generator=generator)
    mask = torch.ones_like(ids)
    for row in range(1, batch):
        cut = length - 2 * row
        ids[row, cut:] = PAD
        mask[row, cut:] = 0
    ids[torch.arange(batch), mask.sum(1) - 1] = EOS
    return ids, mask


def target_batch(seed=1, batch=3, length=9):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, VOCAB, (batch, length), generator=generator)
    ids[:, 0] = PAD  # decoder start token
    return ids


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


@pytest.fixture(scope="session")
def multi30k_dir():
    if not DATA_DIR.is_dir():
        pytest.skip(f"shared data folder {DATA_DIR} is absent on this machine")
    return DATA_DIR


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
