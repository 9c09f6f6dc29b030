"""transformers' own common model tests (`ModelTesterMixin`, and `GenerationTesterMixin` where it is available)
run against `MarianPosEncModel` and `MarianPosEncForConditionalGeneration`.

The tests come from the source distribution of the installed transformers version, which `make test` (and
`make test-all`) fetches from PyPI into .transformers-src/ (the wheel does not ship them); without it this file
is skipped. They run as transformers runs them for `MarianModel`/`MarianMTModel` (its
tests/models/marian/test_modeling_marian.py): Marian's test sizes and inputs, only the classes and the config
arguments changed, once per module configuration in `CONFIGS` (sinusoidal, RoPE, RPEHead, Shaw, T5 bias,
rPosNet: one test class each).

The sdist ships only the top-level files of transformers' tests/ folder: tests/test_modeling_common.py and its
siblings, not the sub-folders they import from (generation/test_utils.py with `GenerationTesterMixin`,
exporters/test_export.py, models/marian/). `import_upstream_tests` stands empty mixins in for those two
modules, so `GenerationTesterMixin`'s tests and the export tests do not run from the sdist; Marian's own
tester is rebuilt here (`MarianPosEncModelTester`). Where a full checkout of the same tag's tests/ is unpacked
into .transformers-src/tests, the real mixins are imported and run, with greedy generation defaults set by the
tester (`setUp`; the saved defaults are paper 1's beam 4). Generation is tested by tests/model/test_conformance.py
and tests/model/test_generation.py either way (cached and uncached greedy and beam search agree, per-step scores;
assisted decoding).

Deliberate differences from stock Marian are named skips with their reasons: those of every configuration in
`DOCUMENTED_DIFFERENCES`, those of one configuration in its `CONFIGS` entry. Every difference that remains,
skipped here or not, is in the one table of docs/architecture.md, "Differences from stock Marian".
"""

import importlib
import sys
import types
import unittest
import unittest.mock
import warnings

import pytest

from hf_posenc import (
    MarianPosEncConfig,
    MarianPosEncForConditionalGeneration,
    MarianPosEncModel,
    modeling_marian_posenc,
)
from tests.helpers import REPO

UPSTREAM_TESTS = REPO / ".transformers-src" / "tests"
UPSTREAM_PACKAGE = "transformers_upstream_tests"

if not (UPSTREAM_TESTS / "test_modeling_common.py").is_file():
    pytest.skip(
        f"{UPSTREAM_TESTS} is absent: `make install` fetches transformers' source distribution there",
        allow_module_level=True,
    )


def import_upstream_tests():
    """Import the sdist's tests/ as a package. The sdist ships only the top-level test files: the modules they
    import from sub-folders it does not ship (generation/test_utils.py, exporters/test_export.py) become empty
    mixins, unless a full checkout of the same tag was unpacked there."""
    package = types.ModuleType(UPSTREAM_PACKAGE)
    package.__path__ = [str(UPSTREAM_TESTS)]
    sys.modules.setdefault(UPSTREAM_PACKAGE, package)
    for folder, module, mixin in [
        ("exporters", "test_export", "ExportTesterMixin"),
        ("generation", "test_utils", "GenerationTesterMixin"),
    ]:
        if (UPSTREAM_TESTS / folder / f"{module}.py").is_file():
            continue
        subpackage = types.ModuleType(f"{UPSTREAM_PACKAGE}.{folder}")
        subpackage.__path__ = []
        stub = types.ModuleType(f"{UPSTREAM_PACKAGE}.{folder}.{module}")
        setattr(stub, mixin, type(mixin, (), {}))
        sys.modules.setdefault(subpackage.__name__, subpackage)
        sys.modules.setdefault(stub.__name__, stub)
    with warnings.catch_warnings():  # marks of transformers' own pytest configuration (flash_attn_test, ...)
        warnings.simplefilter("ignore", pytest.PytestUnknownMarkWarning)
        return importlib.import_module(f"{UPSTREAM_PACKAGE}.test_modeling_common")


common = import_upstream_tests()
GENERATION_MIXIN_SHIPPED = (UPSTREAM_TESTS / "generation" / "test_utils.py").is_file()

# Upstream tests no configuration passes on purpose: test name -> why.
DOCUMENTED_DIFFERENCES = {}
if not GENERATION_MIXIN_SHIPPED:
    DOCUMENTED_DIFFERENCES["test_generation_tester_mixin_inheritance"] = (
        "asks a model that can generate for GenerationTesterMixin's tests, which transformers' sdist does not "
        "ship (tests/generation/ is not in it); generation is tested in tests/model/test_conformance.py"
    )


class MarianPosEncModelTester:
    """transformers' `MarianModelTester` sizes and inputs, building our config."""

    def __init__(self, parent, overrides, batch_size=13, seq_length=7):
        self.parent = parent
        self.overrides = overrides
        self.batch_size = batch_size
        self.seq_length = seq_length
        self.is_training = True
        self.vocab_size = 99
        self.hidden_size = 16
        self.num_hidden_layers = 2
        self.num_attention_heads = 4
        self.eos_token_id = 2
        self.pad_token_id = 1
        self.decoder_start_token_id = 3

    def get_config(self):
        return MarianPosEncConfig(
            vocab_size=self.vocab_size,
            d_model=self.hidden_size,
            encoder_layers=self.num_hidden_layers,
            decoder_layers=self.num_hidden_layers,
            encoder_attention_heads=self.num_attention_heads,
            decoder_attention_heads=self.num_attention_heads,
            encoder_ffn_dim=4,
            decoder_ffn_dim=4,
            activation_function="gelu",
            dropout=0.1,
            attention_dropout=0.1,
            max_position_embeddings=100,
            eos_token_id=self.eos_token_id,
            forced_eos_token_id=self.eos_token_id,
            bos_token_id=0,
            pad_token_id=self.pad_token_id,
            decoder_start_token_id=self.decoder_start_token_id,
            **self.overrides,
        )

    def prepare_config_and_inputs(self):
        input_ids = common.ids_tensor([self.batch_size, self.seq_length], self.vocab_size).clamp(3)
        input_ids[:, -1] = self.eos_token_id
        decoder_input_ids = common.ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
        attention_mask = input_ids.ne(self.pad_token_id)
        inputs = {
            "input_ids": input_ids,
            "decoder_input_ids": decoder_input_ids,
            "attention_mask": attention_mask,
            "decoder_attention_mask": attention_mask,
        }
        return self.get_config(), inputs

    def prepare_config_and_inputs_for_common(self):
        return self.prepare_config_and_inputs()


class MarianPosEncModelTest(common.ModelTesterMixin, common.GenerationTesterMixin, unittest.TestCase):
    __test__ = False
    overrides: dict = {}
    all_model_classes = (MarianPosEncModel, MarianPosEncForConditionalGeneration)
    is_encoder_decoder = True
    test_missing_keys = False

    def setUp(self):
        self.model_tester = MarianPosEncModelTester(self, self.overrides)
        # transformers' generation tests take greedy decoding without a length rule as the model's default (what
        # `MarianMTModel` has); ours is paper 1's beam 4, length penalty 0.6 and source length + 50 new tokens.
        for name, greedy in [("PAPER_1_DECODING", {}), ("MAX_NEW_TOKENS_OVER_SOURCE", None)]:
            patcher = unittest.mock.patch.object(modeling_marian_posenc, name, greedy)
            patcher.start()
            self.addCleanup(patcher.stop)
        # The mixin looks model classes up by name in transformers' own auto-class tables (a base model has no
        # loss; a seq2seq LM gets labels); `AutoModel.register` does not write those tables, so our names are
        # added here, where transformers' own source lists Marian's.
        for table, name in [
            (common.MODEL_MAPPING_NAMES, MarianPosEncModel.__name__),
            (
                common.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
                MarianPosEncForConditionalGeneration.__name__,
            ),
        ]:
            patcher = unittest.mock.patch.dict(table, {MarianPosEncConfig.model_type: name})
            patcher.start()
            self.addCleanup(patcher.stop)


# Per configuration: its config arguments, and the upstream tests it does not pass on purpose (name -> why).
CONFIGS = {
    "Sinusoidal": ({"position_encoding": "sinusoidal"}, {}),
    "Rope": ({"position_encoding": "rope"}, {}),
    "RPEHead": ({"position_encoding": "rpe_head"}, {}),
    "Shaw": ({"position_encoding": "shaw"}, {}),
    "T5Bias": ({"position_encoding": "t5_bias"}, {}),
    "RPosNet": ({"encoder_self_attention": "rposnet", "decoder_self_attention": "rposnet"}, {}),
}


def skipped(reason: str):
    return unittest.skip(f"documented difference: {reason}")(lambda self: None)


# The input embedding families (fixed, rotary, recurrent), a custom attention (Shaw's value term), a bias shared
# by the layers (T5), and a position-based mixer (rPosNet, with learned embeddings), one test class each.
for name, (overrides, differences) in CONFIGS.items():
    members = {"__test__": True, "overrides": overrides}
    members |= {test: skipped(reason) for test, reason in {**DOCUMENTED_DIFFERENCES, **differences}.items()}
    globals()[f"Test{name}"] = type(f"Test{name}", (MarianPosEncModelTest,), members)
