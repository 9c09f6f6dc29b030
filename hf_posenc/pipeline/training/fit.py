"""What a run checks before its first update, after the data and the model are built: the data's longest pair
fits the model's position tables (`check_longest_pair`) and its largest batches fit the machine's memory
(`check_training_memory`). Each raises a ValueError that names the sizes and the setting to change."""

from typing import TYPE_CHECKING

import torch

from ...base import PositionLimitError
from ..data.corpus import list_lengths
from ..evaluation.decoding import check_decoding_memory
from .hardware import SCORE_BYTES, check_memory

if TYPE_CHECKING:
    from .arguments import Arguments
    from .run import PreparedData


def check_longest_pair(model, data: "PreparedData") -> None:
    """The longest source (training, validation or test) and target go through the model once, before any
    training: a bounded position table too short for them is an error now, not when their batch comes up."""
    longest_source, longest_target = data.data_report["longest_source"], data.data_report["longest_target"]
    if data.valid is not None:
        longest_source = max(longest_source, int(list_lengths(data.valid, "input_ids").max()))
        longest_target = max(longest_target, int(list_lengths(data.valid, "labels").max()))
    test_source = max(len(ids) for ids in data.tokenizer(data.test.source)["input_ids"])
    source = torch.full((1, max(longest_source, test_source)), data.tokenizer.eos_token_id)
    target = torch.full((1, longest_target), data.tokenizer.pad_token_id)
    model.eval()
    try:
        with torch.no_grad():
            model(input_ids=source, decoder_input_ids=target)
    except PositionLimitError as error:
        raise ValueError(
            f"the longest pair of the data ({source.shape[1]} source, {target.shape[1]} target tokens) does not fit "
            f"the model: {error}"
        ) from None
    finally:
        model.train()


def check_training_memory(args: "Arguments", model, data: "PreparedData", padding: dict | None) -> None:
    """Refuse, before the first update, batches whose vocabulary-sized tensors alone need more memory than the
    machine has available (`check_memory`): the largest training batch's target positions (the first epoch's
    token-budget batches, or sentence batches of the mean target length) x the vocabulary x `SCORE_BYTES`, for
    every process of a CPU run, and the validation's beams where it is translated (`check_decoding_memory`)."""
    training, vocabulary = args.training, model.get_output_embeddings().out_features
    if padding is not None:
        positions, fix = padding["target"]["largest_batch"], "lower --max_tokens"
    else:
        lengths = list_lengths(data.train, "labels")  # (N,)
        positions = round(min(training.per_device_train_batch_size, len(lengths)) * float(lengths.mean()))
        fix = "lower --per_device_train_batch_size"
    processes = training.world_size if training.device.type == "cpu" else 1  # one machine's memory
    check_memory(
        processes * positions * vocabulary * SCORE_BYTES,
        training.device,
        f"training on batches of {positions} target positions x {vocabulary} tokens"
        + f" in each of {processes} processes" * (processes > 1),
        fix,
    )
    if training.predict_with_generate or args.run.eval_bleu:  # the validation's translations, while training
        beams = model.generation_config.num_beams or 1
        check_decoding_memory(training.per_device_eval_batch_size, beams, vocabulary, training.device)
