"""Smoke test of the interleaved training A/B (benchmarks/train_throughput.py) on a seconds-long run: no timing is
asserted, only that every arm trains the asked updates in turns, in its own process, with its own Trainer, label
smoother and dropout."""

import multiprocessing

import pytest

from benchmarks.train_throughput import Turns, collect_summaries, main


def test_the_arms_take_turns_and_each_trains_its_updates(tmp_path, tiny_run_flags, capsys):
    flags = [*tiny_run_flags(), "--max_steps", "6", "--logging_steps", "2"]
    arms = main(
        ["--arms", "before", "default", "buckets", "--turn", "2", "--threads", "1"]
        + ["--output_root", str(tmp_path), "--", *flags]
    )
    assert [arm["name"] for arm in arms] == ["before", "default", "buckets"]
    for arm in arms:
        assert arm["updates"] == 6 and len(arm["seconds"]) == 3  # 3 turns of 2 updates
    assert [arm["label_smoother"] for arm in arms] == ["LabelSmoother", *["CrossEntropyLabelSmoother"] * 2]
    # the step before trains with torch's dropout, in its own process
    assert [arm["packed_dropout"] for arm in arms] == [False, True, True]
    assert arms[2]["length_buckets"] and arms[1]["length_buckets"] is None
    assert arms[0]["target_tokens"] == arms[1]["target_tokens"] == arms[2]["target_tokens"]
    printed = capsys.readouterr().out
    assert (
        "median turn ratio" in printed
        and "| before | 6 |" in printed
        and "| buckets | 6 |" in printed
        and "CPU capability" in printed
    )


def test_turns_go_round_and_a_finished_arm_leaves_the_round():
    turns = Turns(3, multiprocessing.get_context("spawn"))
    turns.hand_on(0)
    assert turns.current.value == 1
    turns.hand_on(1, leave=True)
    assert list(turns.active) == [1, 0, 1] and turns.current.value == 2
    turns.hand_on(2)
    assert turns.current.value == 0
    turns.hand_on(0, leave=True)
    assert turns.current.value == 2  # the last arm in the round keeps the turn
    turns.hand_on(2)
    assert turns.current.value == 2
    turns.hand_on(2, leave=True)
    assert turns.current.value == -1


def test_an_arm_named_twice_is_refused(capsys):
    with pytest.raises(SystemExit):
        main(["--arms", "default", "default"])
    assert "names an arm twice" in capsys.readouterr().err


def test_an_arm_that_dies_without_its_summary_stops_the_others():
    class Arm:
        def __init__(self, name, exitcode):
            self.name, self.exitcode, self.terminated = name, exitcode, False

        def terminate(self):
            self.terminated = True

    results = multiprocessing.get_context("spawn").Queue()
    results.put({"name": "default"})
    arms = [Arm("before", -9), Arm("default", None)]
    with pytest.raises(RuntimeError, match=r"arm before \(exit code -9\) ended without its summary"):
        collect_summaries(results, arms, poll_seconds=0.1)
    assert all(arm.terminated for arm in arms)
