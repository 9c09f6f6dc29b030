"""The Trainer (pipeline/training/trainer.py): the logged loss is the token-level loss under accumulation, the
token-budget loader on a CPU pins nothing, length buckets change the batches' shapes and not their examples or
losses, the optimizer is torch's fused AdamW, label smoothing by torch's cross_entropy is transformers' label
smoother, and throughput is reported in target tokens."""

import os
import signal
import time
import warnings
from types import SimpleNamespace

import pytest
import torch
from transformers import TrainerControl
from transformers.trainer_pt_utils import LabelSmoother

from hf_posenc.pipeline.training import arguments
from hf_posenc.pipeline.training.trainer import CrossEntropyLabelSmoother, StopOnInterrupt, TranslationTrainer
from tests.pipeline.training.trainer_probe import build_trainer


@pytest.mark.usefixtures("multi30k_dir")  # reads the shipped data
def test_logged_loss_is_the_true_token_level_loss_with_accumulation_and_no_smoothing(tmp_path):
    """Marian's mean loss gets multiplied by the accumulation steps under the v5 Trainer; ours must not."""
    trainer = build_trainer(tmp_path, max_steps=1, update_freq=3, learning_rate=0.0)
    model = trainer.model
    loader = iter(trainer.get_train_dataloader())
    batches = [next(loader) for _ in range(3)]
    total, tokens = 0.0, 0
    model.eval()
    with torch.no_grad():
        for batch in batches:
            logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
            total += torch.nn.functional.cross_entropy(
                logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100, reduction="sum"
            ).item()
            tokens += int((batch["labels"] != -100).sum())
    trainer.train()
    logged = trainer.state.log_history[0]["loss"]
    assert logged == pytest.approx(total / tokens, rel=1e-4)


@pytest.mark.usefixtures("multi30k_dir")  # reads the shipped data
def test_token_budget_loader_on_a_cpu_pins_nothing_and_warns_nothing(tmp_path):
    trainer = build_trainer(tmp_path, max_steps=1)
    trainer.args.dataloader_pin_memory = True  # the Trainer's default unless use_cpu, as in train.py
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        batch = next(iter(trainer.get_train_dataloader()))
    assert batch["input_ids"].numel() <= 600


@pytest.mark.usefixtures("multi30k_dir")  # reads the shipped data
def test_length_buckets_pad_the_same_batches_to_bucket_shapes_and_train_the_same_losses(tmp_path):
    buckets = [8, 16, 24, 32, 48, 64, 96, 128]
    plain = build_trainer(tmp_path / "plain", max_steps=4, label_smoothing=0.1)
    bucketed = build_trainer(tmp_path / "bucketed", max_steps=4, label_smoothing=0.1, length_buckets=buckets)
    plain_batches = list(plain.get_train_dataloader())
    bucketed_batches = list(bucketed.get_train_dataloader())
    assert len(plain_batches) == len(bucketed_batches)
    for before, after in zip(plain_batches, bucketed_batches, strict=True):
        for name in ("input_ids", "labels"):
            length = before[name].shape[1]
            assert after[name].shape[1] == min(b for b in buckets if b >= length)  # all below 128
            assert torch.equal(after[name][:, :length], before[name])  # the same examples, padded further
    for trainer in (plain, bucketed):
        trainer.train()
    losses = [[log["loss"] for log in t.state.log_history if "loss" in log] for t in (plain, bucketed)]
    assert len(losses[0]) == 4 and losses[1] == pytest.approx(losses[0], rel=1e-4)
    assert bucketed.target_tokens == plain.target_tokens  # padding is not counted as trained-on tokens


@pytest.mark.usefixtures("multi30k_dir")  # reads the shipped data
def test_the_trainer_steps_with_torchs_fused_adamw_which_updates_as_the_plain_one_does(tmp_path):
    """transformers' default `optim` (adamw_torch_fused from torch 2.8 on; train.py and the recipes leave it) is
    torch's fused AdamW, on the CPU too: 4.3x faster per step than the for-loop AdamW on the default recipe's
    7.6M parameters (docs/training.md). Its updates are the plain AdamW's (to float rounding)."""
    assert arguments.parse_args([]).training.optim == "adamw_torch_fused"
    trainer = build_trainer(tmp_path, max_steps=1, learning_rate=1e-3)
    optimizer = trainer.create_optimizer()
    assert type(optimizer) is torch.optim.AdamW and optimizer.defaults["fused"] is True
    parameters = [p for group in optimizer.param_groups for p in group["params"]]
    initial = [p.detach().clone() for p in parameters]
    copies = iter([p.clone().requires_grad_() for p in initial])
    plain_groups = [
        {
            "params": [next(copies) for _ in group["params"]],
            **{key: group[key] for key in ("lr", "betas", "eps", "weight_decay")},
        }
        for group in optimizer.param_groups
    ]
    plain = torch.optim.AdamW(plain_groups, foreach=False)
    copies = [p for group in plain_groups for p in group["params"]]
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):
        for parameter, copy in zip(parameters, copies, strict=True):
            parameter.grad = torch.randn(parameter.shape, generator=generator)
            copy.grad = parameter.grad.clone()
        optimizer.step()
        plain.step()
    for parameter, copy, start in zip(parameters, copies, initial, strict=True):  # the updates, ~1e-3 each
        torch.testing.assert_close(parameter.detach() - start, copy.detach() - start, rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize("count", [None, 40, "tensor"])
def test_cross_entropy_label_smoothing_is_transformers_label_smoother(count):
    """The same loss and gradients as `LabelSmoother`, with the Trainer's token count or without."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 50, generator=generator) * 3  # (B, T, V)
    labels = torch.randint(0, 50, (3, 7), generator=generator)
    labels[1, 4:] = labels[2, 6:] = -100
    items = torch.tensor(40) if count == "tensor" else count
    values, gradients = [], []
    for smoother in (LabelSmoother(epsilon=0.1), CrossEntropyLabelSmoother(epsilon=0.1)):
        leaf = logits.clone().requires_grad_()
        loss = smoother({"logits": leaf}, labels, num_items_in_batch=items)
        loss.backward()
        values.append(loss.item())
        gradients.append(leaf.grad)
    assert values[1] == pytest.approx(values[0], rel=1e-6)
    torch.testing.assert_close(gradients[1], gradients[0], rtol=1e-5, atol=1e-7)


@pytest.mark.usefixtures("multi30k_dir")  # reads the shipped data
def test_the_trainer_smooths_labels_with_cross_entropy(tmp_path):
    trainer = build_trainer(tmp_path, max_steps=1, label_smoothing=0.1)
    assert type(trainer.label_smoother) is CrossEntropyLabelSmoother and trainer.label_smoother.epsilon == 0.1


def test_under_token_batches_the_trainer_reports_target_tokens_not_samples_per_second(monkeypatch):
    logged = []
    monkeypatch.setattr(TranslationTrainer.__mro__[1], "log", lambda self, logs, *a, **k: logged.append(logs))
    trainer = object.__new__(TranslationTrainer)  # only what `log` reads
    trainer.max_tokens, trainer.target_tokens = 2500, 5000
    trainer.log({"train_runtime": 10.0, "train_samples_per_second": 12.8, "train_loss": 3.0})
    assert logged == [{"train_runtime": 10.0, "train_loss": 3.0, "train_target_tokens_per_second": 500.0}]


@pytest.mark.parametrize("strategy, saved", [("steps", True), ("no", False)])
def test_a_first_interrupt_stops_training_after_the_update_under_way_and_a_second_one_at_once(
    strategy, saved
):
    stop, control, args = StopOnInterrupt(), TrainerControl(), SimpleNamespace(save_strategy=strategy)
    previous = signal.getsignal(signal.SIGINT)
    stop.on_train_begin(args, None, control)
    stop.on_step_end(args, None, control)
    assert not control.should_training_stop and not stop.interrupted
    os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C: no KeyboardInterrupt here
    time.sleep(0.01)
    assert stop.interrupted and signal.getsignal(signal.SIGINT) is previous  # the next one: at once
    stop.on_step_end(args, None, control)
    assert control.should_training_stop and control.should_save is saved
    stop.on_train_end(args, None, control)
    assert signal.getsignal(signal.SIGINT) is previous
