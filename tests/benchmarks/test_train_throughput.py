"""Smoke test of the interleaved training A/B (benchmarks/train_throughput.py) on a seconds-long run: no timing is
asserted, only that every arm trains the asked updates in turns, with its own Trainer, label smoother and dropout."""

from transformers.trainer_pt_utils import LabelSmoother

from benchmarks.train_throughput import ArmClock, Turns, main
from hf_posenc import base
from hf_posenc.pipeline.training.trainer import CrossEntropyLabelSmoother


def test_the_arms_take_turns_and_each_trains_its_updates(tmp_path, tiny_run_flags, capsys):
    flags = [*tiny_run_flags(), "--max_steps", "6", "--logging_steps", "2"]
    arms = main(
        ["--arms", "before", "default", "buckets", "--turn", "2", "--threads", "1"]
        + ["--output_root", str(tmp_path), "--", *flags]
    )
    assert [arm.name for arm in arms] == ["before", "default", "buckets"]
    for arm in arms:
        assert arm.trainer.state.global_step == 6 and len(arm.clock.seconds) == 3  # 3 turns of 2 updates
    assert type(arms[0].trainer.label_smoother) is LabelSmoother
    assert type(arms[1].trainer.label_smoother) is CrossEntropyLabelSmoother
    # the step before trains with torch's dropout during its turns; the switch is left as the arms found it
    assert [arm.clock.packed_dropout for arm in arms] == [False, True, True] and base.PACKED_CPU_DROPOUT
    assert arms[2].trainer.length_buckets and arms[1].trainer.length_buckets is None
    assert arms[0].trainer.target_tokens == arms[1].trainer.target_tokens == arms[2].trainer.target_tokens
    printed = capsys.readouterr().out
    assert (
        "median turn ratio" in printed
        and "| before | 6 |" in printed
        and "| buckets | 6 |" in printed
        and "CPU capability" in printed
    )


def test_turns_go_round_and_a_finished_arm_leaves_the_round():
    turns = Turns(["a", "b", "c"])
    turns.hand_on("a")
    assert turns.order[turns.current] == "b"
    turns.hand_on("b", leave=True)
    assert turns.order == ["a", "c"] and turns.order[turns.current] == "c"
    turns.hand_on("c")
    assert turns.order[turns.current] == "a"


def test_an_arm_s_turn_sets_its_dropout(monkeypatch):
    monkeypatch.setattr(base, "PACKED_CPU_DROPOUT", True)
    clock = ArmClock("before", Turns(["before"]), every=1, packed_dropout=False)
    clock.take()
    assert base.PACKED_CPU_DROPOUT is False
