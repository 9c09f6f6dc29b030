"""The learning-rate plan for a time budget (pipeline/training/schedule.py), driven by a fake clock: fast, slow and
changing speeds, continuity when re-planned, the checkpoint spacing that follows the plan, resume, and compile
time spent from the budget but left out of the speed."""

import json
from types import SimpleNamespace

import pytest
import torch

from hf_posenc.pipeline.training import arguments, run
from hf_posenc.pipeline.training.schedule import BudgetSchedule, SchedulePlan


class FakeRun:
    """Updates at a given speed against a fake clock; records the plan's factor at every update."""

    def __init__(self, minutes=16.0, warmup=150, **options):
        self.seconds = 0.0
        self.plan = SchedulePlan(warmup)
        self.callback = BudgetSchedule(self.plan, minutes, lambda: self.seconds, **options)
        self.state = SimpleNamespace(global_step=0, save_steps=50, stateful_callbacks={})
        self.callback.on_train_begin(None, self.state, None)
        self.factors = []

    def update(self, count: int, seconds_per_update: float) -> None:
        for _ in range(count):
            self.factors.append(self.plan(self.state.global_step))
            self.state.global_step += 1
            self.seconds += seconds_per_update
            self.callback.on_step_end(None, self.state, None)

    def until_budget(self, seconds_per_update: float) -> None:
        while self.seconds < self.callback.budget_seconds:
            self.update(1, seconds_per_update)


def test_a_fast_machine_keeps_the_recipe_warmup_and_decays_at_the_budget_end():
    run_ = FakeRun()
    run_.until_budget(1.0)  # 960 updates in 16 minutes
    assert run_.plan.end == 960 and run_.plan.warmup_steps == 150 and run_.plan.replans == 0
    assert max(run_.factors) == pytest.approx(1.0) and run_.factors.index(max(run_.factors)) == 149
    assert run_.factors[-1] == pytest.approx(0.01, abs=2e-3)  # the floor when the budget ends
    assert run_.state.save_steps == round(0.2 * 960 / 5)  # the last 5 checkpoints span the last 20%


def test_a_slow_machine_gets_a_short_warmup_and_still_ends_at_the_floor():
    """The failing case of the fixed schedule: 177 updates in the budget ended inside its 150-update warm-up."""
    run_ = FakeRun(minutes=4, warmup=150)
    run_.until_budget(240 / 177)
    assert run_.plan.end == 177 and run_.plan.warmup_steps == round(0.25 * 177)
    assert max(run_.factors) == pytest.approx(1.0)
    assert run_.factors[-1] < 0.02
    assert run_.state.save_steps == round(0.2 * 177 / 5)


def test_a_machine_that_gets_busy_is_replanned_without_a_jump():
    """Fast for 300 updates, then four times slower (another job took the cores): the end moves earlier and the
    decay continues from where the rate stood, reaching the floor when the budget ends."""
    run_ = FakeRun()
    run_.update(300, 1.0)
    assert run_.plan.end == 960
    run_.until_budget(4.0)
    assert run_.plan.replans >= 1
    assert run_.plan.end == pytest.approx(len(run_.factors), abs=run_.callback.check_every)
    steps = [b - a for a, b in zip(run_.factors, run_.factors[1:], strict=False)]
    assert max(abs(step) for step in steps[150:]) < 0.02  # no jump anywhere after the warm-up
    assert run_.factors[-1] < 0.05


def test_a_moment_of_load_or_a_checkpoint_save_keeps_the_plan():
    """Speed is measured over all updates since the plan: a few slow updates do not move it (a 20-update
    window re-planned an 8-minute run six times on checkpoint saves)."""
    run_ = FakeRun()
    run_.update(300, 1.0)
    run_.update(3, 15.0)
    run_.update(300, 1.0)
    assert run_.plan.replans == 0


def test_compile_time_shortens_the_budget_and_is_not_the_speed_of_an_update():
    """torch.compile: the first update compiles for 120 s, a new batch shape at update 400 for 60 s more. The plan
    projects the updates of the budget left after compiling at the compiled speed, and still ends at the floor."""
    compiled = {"seconds": 0.0}
    run_ = FakeRun(compile_seconds=lambda: compiled["seconds"])
    compiled["seconds"] = 120.0
    run_.update(1, 121.0)
    run_.update(19, 1.0)  # the speed is measured over these 20 updates: 1 s each, not (121 + 19) / 20
    assert run_.plan.end == 960 - 120 and run_.plan.warmup_steps == 150 and run_.plan.replans == 0
    run_.update(379, 1.0)
    compiled["seconds"] = 180.0
    run_.update(1, 61.0)
    run_.until_budget(1.0)
    assert len(run_.factors) == 960 - 180
    assert run_.plan.end == pytest.approx(len(run_.factors), abs=run_.callback.check_every)
    assert run_.factors[-1] < 0.05


def test_a_small_change_of_speed_keeps_the_plan():
    run_ = FakeRun()
    run_.update(200, 1.0)
    run_.update(200, 1.1)  # 10% slower: within the re-planning factor
    assert run_.plan.replans == 0


def test_the_plan_survives_resume_through_the_scheduler_state_and_the_checkpoint():
    run_ = FakeRun(minutes=4)
    run_.update(60, 1.5)
    saved_callback = json.loads(json.dumps(run_.callback.state()))
    model = torch.nn.Linear(2, 2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(torch.optim.SGD(model.parameters(), lr=1.0), run_.plan)
    saved_scheduler = scheduler.state_dict()

    resumed = SchedulePlan(150)
    callback = BudgetSchedule(resumed, 4, lambda: 90.0)
    state = SimpleNamespace(
        global_step=60, save_steps=50, stateful_callbacks={"BudgetSchedule": saved_callback}
    )
    callback.on_train_begin(None, state, None)
    assert resumed.as_dict() == run_.plan.as_dict() and state.save_steps == run_.plan.save_steps
    again = torch.optim.lr_scheduler.LambdaLR(torch.optim.SGD(model.parameters(), lr=1.0), SchedulePlan(150))
    again.load_state_dict(saved_scheduler)
    assert again.lr_lambdas[0].as_dict() == run_.plan.as_dict()


def test_explicit_schedule_flags_and_the_update_budgeted_recipe_keep_the_fixed_schedule():
    assert arguments.parse_args([]).planned_schedule
    for flags in (["--warmup_steps", "100"], ["--lr_scheduler_type", "linear"], ["--max_steps", "500"]):
        assert not arguments.parse_args(flags).planned_schedule, flags
    assert not arguments.parse_args(["--schedule", "fixed"]).planned_schedule
    assert not arguments.parse_args(["--recipe", "multi30k-en-de-compare"]).planned_schedule


def test_a_budgeted_run_records_its_plan_in_scores_and_card(tmp_path, tiny_run_flags):
    flags = [
        *tiny_run_flags(),
        "--minutes",
        "0.15",
        "--output_dir",
        str(tmp_path / "run"),
    ]
    scores = run.main(flags)
    plan = scores["schedule_plan"]
    assert plan is not None and plan["end"] and plan["warmup_steps"] <= 100
    assert "planned for the time budget (warm-up" in (tmp_path / "run" / "README.md").read_text()
