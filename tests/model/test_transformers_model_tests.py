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
exporters/test_export.py, models/marian/). Marian's own tester is rebuilt here (`MarianPosEncModelTester`); the
export tests do not run (`ExportTesterMixin`, `ExportGenerateTesterMixin` are empty stand-ins).
`GenerationTesterMixin`'s tests run where `HF_POSENC_TRANSFORMERS_GENERATION_TESTS` names the tests/ folder of a
transformers source checkout (its generation/test_utils.py, of a commit close to the installed version); without
it the mixin is an empty stand-in and `test_generation_tester_mixin_inheritance` is skipped with a reason that
names the variable. The tester sets greedy generation defaults on the models it builds (`setUp`):
transformers' generation tests take a model's defaults to be those of a generation config built from its model
config, as `MarianMTModel`'s are, and ours are paper 1's beam 4, length penalty 0.6 and source length + 50 new
tokens. The generation tests our models skip and stock Marian runs are in the table named below. Generation is
also tested by tests/model/test_conformance.py and tests/model/test_modeling_marian_posenc_generation.py, which
need no checkout (cached and uncached greedy and beam search agree, per-step scores; assisted decoding).

Deliberate differences from stock Marian are named skips with their reasons: those of every configuration in
`DOCUMENTED_DIFFERENCES`, those of one configuration in its `CONFIGS` entry. Every difference that remains,
skipped here or not, is in the one table of docs/architecture.md, "Differences from stock Marian".
"""

import functools
import importlib
import os
import sys
import types
import unittest
import unittest.mock
import warnings
from pathlib import Path

import pytest
from transformers import GenerationConfig
from transformers.generation.configuration_utils import GenerationMode

from hf_posenc import (
    MarianPosEncConfig,
    MarianPosEncForConditionalGeneration,
    MarianPosEncModel,
)
from tests.helpers import REPO

UPSTREAM_TESTS = REPO / ".transformers-src" / "tests"
UPSTREAM_PACKAGE = "transformers_upstream_tests"

if not (UPSTREAM_TESTS / "test_modeling_common.py").is_file():
    pytest.skip(
        f"{UPSTREAM_TESTS} is absent: `make install` fetches transformers' source distribution there",
        allow_module_level=True,
    )


GENERATION_TESTS_VARIABLE = "HF_POSENC_TRANSFORMERS_GENERATION_TESTS"


def generation_tests_folder() -> Path | None:
    """The transformers checkout's tests/ folder that `HF_POSENC_TRANSFORMERS_GENERATION_TESTS` names, or None
    where it is unset; a folder without generation/test_utils.py is an error that names the variable."""
    folder = os.environ.get(GENERATION_TESTS_VARIABLE)
    if not folder:
        return None
    if not (Path(folder) / "generation" / "test_utils.py").is_file():
        raise FileNotFoundError(
            f"{GENERATION_TESTS_VARIABLE}={folder} has no generation/test_utils.py: name the tests/ folder of a "
            "transformers source checkout, or unset the variable to skip GenerationTesterMixin's tests"
        )
    return Path(folder)


def stand_in(name: str, *mixins: str) -> types.ModuleType:
    """An importable module `name` holding empty mixin classes, registered in `sys.modules`."""
    module = types.ModuleType(name)
    for mixin in mixins:
        setattr(module, mixin, type(mixin, (), {}))
    module.__path__ = []
    return sys.modules.setdefault(name, module)


def import_upstream_tests(generation_tests: Path | None):
    """Import the sdist's tests/ as a package. The modules its files import from sub-folders the sdist does not
    ship become empty mixins: exporters/test_export.py always, generation/test_utils.py unless `generation_tests`
    names a checkout's tests/ folder, whose generation/ is then imported in the package (its test_utils.py
    imports the export mixins as `tests.exporters.test_export`, the checkout's own package name, which points
    at the stand-in while it is imported)."""
    package = types.ModuleType(UPSTREAM_PACKAGE)
    package.__path__ = [str(UPSTREAM_TESTS)]
    sys.modules.setdefault(UPSTREAM_PACKAGE, package)
    exporters = stand_in(f"{UPSTREAM_PACKAGE}.exporters")
    export = stand_in(
        f"{UPSTREAM_PACKAGE}.exporters.test_export", "ExportTesterMixin", "ExportGenerateTesterMixin"
    )
    if generation_tests is None:
        stand_in(f"{UPSTREAM_PACKAGE}.generation")
        stand_in(f"{UPSTREAM_PACKAGE}.generation.test_utils", "GenerationTesterMixin")
    else:
        generation = types.ModuleType(f"{UPSTREAM_PACKAGE}.generation")
        generation.__path__ = [str(generation_tests / "generation")]
        sys.modules.setdefault(generation.__name__, generation)
    checkout_names = {"tests.exporters": exporters, "tests.exporters.test_export": export}
    sys.modules.update(checkout_names)
    try:
        with warnings.catch_warnings():
            # marks of transformers' own pytest configuration (flash_attn_test, generate, ...)
            warnings.simplefilter("ignore", pytest.PytestUnknownMarkWarning)
            return importlib.import_module(f"{UPSTREAM_PACKAGE}.test_modeling_common")
    finally:
        for name in checkout_names:
            sys.modules.pop(name)


GENERATION_TESTS = generation_tests_folder()
common = import_upstream_tests(GENERATION_TESTS)

# Upstream tests no configuration passes on purpose: test name -> why.
DOCUMENTED_DIFFERENCES = {}
# Upstream tests that cannot run here: test name -> why.
NOT_RUNNABLE = {}
if GENERATION_TESTS is None:
    NOT_RUNNABLE["test_generation_tester_mixin_inheritance"] = (
        f"GenerationTesterMixin's tests run where {GENERATION_TESTS_VARIABLE} names the tests/ folder of a "
        "transformers source checkout (transformers' sdist does not ship tests/generation/); generation is "
        "tested in tests/model/test_conformance.py and tests/model/test_modeling_marian_posenc_generation.py"
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


def with_greedy_defaults(model_init):
    """A model class's `__init__` followed by the generation config transformers builds from the model config
    (greedy search, no length rule), which is what `MarianMTModel` gets."""

    @functools.wraps(model_init)
    def init(model, config, *args, **kwargs):
        model_init(model, config, *args, **kwargs)
        model.generation_config = GenerationConfig.from_model_config(config)

    return init


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
        model_class = MarianPosEncForConditionalGeneration
        patcher = unittest.mock.patch.object(
            model_class, "__init__", with_greedy_defaults(model_class.__init__)
        )
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
TEST_CLASSES = {}
for name, (overrides, differences) in CONFIGS.items():
    members = {"__test__": True, "overrides": overrides}
    members |= {test: skipped(reason) for test, reason in {**DOCUMENTED_DIFFERENCES, **differences}.items()}
    members |= {test: unittest.skip(reason)(lambda self: None) for test, reason in NOT_RUNNABLE.items()}
    TEST_CLASSES[name] = globals()[f"Test{name}"] = type(f"Test{name}", (MarianPosEncModelTest,), members)


def test_the_tester_builds_models_that_decode_greedily_without_a_length_rule():
    """The tester's models have the generation defaults of `MarianMTModel` (a generation config built from the
    model config), where our saved defaults are paper 1's beam 4; models built outside the tester keep those."""
    tester = MarianPosEncModelTest("setUp")
    tester.setUp()
    config = tester.model_tester.get_config()
    greedy = MarianPosEncForConditionalGeneration(config).generation_config
    tester.doCleanups()
    paper = MarianPosEncForConditionalGeneration(config).generation_config
    assert paper.get_generation_mode() == GenerationMode.BEAM_SEARCH
    assert (paper.num_beams, paper.length_penalty, paper.max_new_tokens_over_source) == (4, 0.6, 50)
    assert greedy.to_diff_dict() == GenerationConfig.from_model_config(config).to_diff_dict()
    assert greedy.get_generation_mode() == GenerationMode.GREEDY_SEARCH
    assert greedy.bad_words_ids is None and getattr(greedy, "max_new_tokens_over_source", None) is None


def test_the_generation_tests_variable_names_a_checkouts_tests_folder(tmp_path, monkeypatch):
    monkeypatch.delenv(GENERATION_TESTS_VARIABLE, raising=False)
    assert generation_tests_folder() is None
    monkeypatch.setenv(GENERATION_TESTS_VARIABLE, str(tmp_path))
    with pytest.raises(FileNotFoundError, match=f"{GENERATION_TESTS_VARIABLE}={tmp_path} has no generation/"):
        generation_tests_folder()
    (tmp_path / "generation").mkdir()
    (tmp_path / "generation" / "test_utils.py").touch()
    assert generation_tests_folder() == tmp_path


def test_generation_tests_run_with_the_variable_and_are_skipped_naming_it_without():
    """With the variable set, the test classes carry transformers' `GenerationTesterMixin` tests; without it, the
    inheritance test (which would pass against the empty stand-in) is skipped with a reason that names it. The
    checkout's name for the export mixins is not left behind in `sys.modules`."""
    test_class = TEST_CLASSES["Sinusoidal"]
    inheritance = test_class.test_generation_tester_mixin_inheritance
    if GENERATION_TESTS is None:
        assert not hasattr(test_class, "test_greedy_generate")
        assert GENERATION_TESTS_VARIABLE in inheritance.__unittest_skip_why__
    else:
        assert callable(test_class.test_greedy_generate)
        assert not getattr(inheritance, "__unittest_skip__", False)
    assert not any(name.startswith("tests.exporters") for name in sys.modules)
