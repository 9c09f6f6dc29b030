"""A learning-rate schedule planned for a wall-clock budget (budgeted training: Li, Yumer & Ramanan 2020,
"Budgeted Training: Rethinking Deep Neural Network Training Under Resource Constraints", ICLR: a schedule
that decays to near zero when the budget ends beats a fixed one at every budget).

A time budget allows as many updates as the machine's speed gives, and a fixed schedule (the recipe's
inverse square root after 150 warm-up updates) ends wherever the clock stops it: on a slow or busy machine
that is its unstable high-rate phase, and the averaged checkpoints all come from there. So, once the speed
is measured (`measure_updates` updates or `measure_seconds` seconds into the run), `BudgetSchedule` projects
the number of updates the budget allows and plans:

- warm-up: linear from 0 to the peak learning rate over `warmup_share` of the projected updates, at most the
  recipe's `warmup_steps` (the warm-up runs at the recipe's length until the speed is known);
- decay: linear from the peak to `floor` x peak at the projected last update;
- checkpoints: every `average_share / checkpoints` of the projected updates, so that the averaged last
  checkpoints span the last `average_share` of the plan, where the rate is low;
- re-planning: every `check_every` updates the speed of all updates since the plan was made projects the end
  anew (a long window: a checkpoint save or a moment of load does not move it, a machine that stays busier
  or freer does); when the updates left move by more than `replan_factor` and by at least `check_every`
  updates, the decay is re-planned from where it stands, continuously, to the new end.

Under `torch.compile` the seconds spent compiling (`compilation.CompileClock`, given as `compile_seconds`) are
spent from the budget like any other, and left out of the measured speed: a graph is compiled once per batch
shape, and the updates after it do not pay for it again. So the plan projects the updates that the budget left
after compilation allows at the compiled speed; a later compilation (a batch shape seen for the first time) shortens
what is left, and the next check re-plans if that moves the end.

The plan (`SchedulePlan`, a callable the `LambdaLR` scheduler holds) is kept with every checkpoint, logged,
and written to scores.json and the model card.
"""

import logging
from collections.abc import Callable

from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

logger = logging.getLogger(__name__)


class SchedulePlan:
    """The learning-rate factor of each update: linear warm-up to 1 at `warmup_steps`, then linear from
    `decay_factor` at `decay_start` to `floor` at `end`, and `floor` after it. Its attributes are its state
    (saved with the scheduler and the checkpoint)."""

    def __init__(self, warmup_steps: int, floor: float = 0.01):
        self.warmup_steps = warmup_steps
        self.floor = floor
        self.decay_start = warmup_steps
        self.decay_factor = 1.0
        self.end = None  # unknown until the speed is measured: the warm-up goes on, then the peak holds
        self.save_steps = None
        self.replans = 0

    def __call__(self, step: int) -> float:
        if step < self.decay_start:
            return min(1.0, (step + 1) / self.warmup_steps)
        if self.end is None:
            return self.decay_factor
        if step >= self.end:
            return self.floor
        progress = (step - self.decay_start) / (self.end - self.decay_start)
        return self.decay_factor + (self.floor - self.decay_factor) * progress

    def as_dict(self) -> dict:
        return dict(vars(self))


class BudgetSchedule(TrainerCallback, ExportableState):
    """Plans `plan` for `minutes` of training once the speed is known, and re-plans when it changes.
    `spent_seconds()` is the training time spent so far, earlier attempts of a resumed run included;
    `compile_seconds()` the part of it spent compiling in this attempt (None: no compilation)."""

    def __init__(
        self,
        plan: SchedulePlan,
        minutes: float,
        spent_seconds: Callable[[], float],
        warmup_share: float = 0.25,
        average_share: float = 0.2,
        checkpoints: int = 5,
        measure_updates: int = 20,
        measure_seconds: float = 60.0,
        check_every: int = 20,
        replan_factor: float = 1.25,
        compile_seconds: Callable[[], float] | None = None,
    ):
        self.plan = plan
        self.budget_seconds = minutes * 60
        self.spent_seconds = spent_seconds
        self.warmup_share = warmup_share
        self.average_share = average_share
        self.checkpoints = checkpoints
        self.measure_updates = measure_updates
        self.measure_seconds = measure_seconds
        self.check_every = check_every
        self.replan_factor = replan_factor
        self.compile_seconds = compile_seconds or (lambda: 0.0)
        self.max_warmup = plan.warmup_steps
        self.mark = (
            None  # (update, seconds spent, of them compiling) where the current speed measurement started
        )

    def state(self) -> dict:
        return {"args": {}, "attributes": {}, "plan": self.plan.as_dict()}

    def on_train_begin(self, args, state, control, **kwargs):
        saved = state.stateful_callbacks.get(type(self).__name__)
        if saved:  # a resumed run goes on with the plan it had
            vars(self.plan).update(saved["plan"])
        if self.plan.save_steps:
            state.save_steps = self.plan.save_steps
        self.mark = (state.global_step, self.spent_seconds(), self.compile_seconds())

    def on_step_end(self, args, state, control, **kwargs):
        step, spent = state.global_step, self.spent_seconds()
        # the seconds of the updates since the mark, less those spent compiling
        updates, seconds = step - self.mark[0], spent - self.mark[1] - (self.compile_seconds() - self.mark[2])
        if self.plan.end is None:
            if updates >= self.measure_updates or (seconds >= self.measure_seconds and updates > 0):
                self.replan(state, step, spent, seconds / updates)
        elif updates % self.check_every == 0:  # the speed since the plan was made, every check_every updates
            end = self.projected_end(step, spent, seconds / updates)
            left, planned_left = end - step, max(1, self.plan.end - step)
            moved = not 1 / self.replan_factor <= left / planned_left <= self.replan_factor
            # near the end a few updates are no change
            if moved and abs(end - self.plan.end) >= self.check_every:
                self.replan(state, step, spent, seconds / updates)

    def projected_end(self, step: int, spent: float, seconds_per_update: float) -> int:
        return step + max(1, int((self.budget_seconds - spent) / seconds_per_update))

    def replan(self, state, step: int, spent: float, seconds_per_update: float) -> None:
        plan = self.plan
        end = self.projected_end(step, spent, seconds_per_update)
        first = plan.end is None
        if step < plan.decay_start:  # still warming up: the warm-up follows the projection
            plan.warmup_steps = max(step + 1, min(self.max_warmup, round(self.warmup_share * end)))
            plan.decay_start, plan.decay_factor = plan.warmup_steps, 1.0
        else:  # decay on from where the rate stands now, to the new end
            plan.decay_factor, plan.decay_start = plan(step), step
        plan.end = max(end, plan.decay_start + 1)
        plan.save_steps = max(1, round(self.average_share * plan.end / self.checkpoints))
        plan.replans += 0 if first else 1
        state.save_steps = plan.save_steps
        self.mark = (step, spent, self.compile_seconds())
        logger.info(
            "%s: %.2f s per update -> about %d updates in the budget; warm-up %d, linear decay from update %d to %g "
            "x peak at %d, a checkpoint every %d updates",
            "learning-rate plan" if first else "learning-rate plan changed (the speed changed)",
            seconds_per_update,
            plan.end,
            plan.warmup_steps,
            plan.decay_start,
            plan.floor,
            plan.end,
            plan.save_steps,
        )
