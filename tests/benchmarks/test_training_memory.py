"""The CUDA memory figure of a training step counts the measured system only (allocator calls faked)."""

import torch

from benchmarks import harness


def test_cuda_training_memory_leaves_out_what_other_systems_hold(monkeypatch):
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()  # the optimizer's state now exists: exp_avg, exp_avg_sq, step
    allocated = {"now": 10**9, "peak": 0}  # another system's model resident on the device: 1 GB

    def step(*args):
        allocated["peak"] = allocated["now"] + 5_000  # the step adds 5,000 bytes at its peak

    monkeypatch.setattr(harness, "training_step", step)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: allocated["now"])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: allocated["peak"])
    state = 4 * (10 + 10 + 10) + 2 * 4  # parameters, exp_avg, exp_avg_sq (10 floats each), two step counters
    assert harness.training_memory_bytes(model, optimizer, None, "cuda", None) == 5_000 + state
