"""torch.compile in training (pipeline/training/compilation.py): the compile clock times torch's compilations and
only while entered, and bucketed batches marked for reuse compile one graph per length, whatever their number of
sentences."""

import torch

from hf_posenc.pipeline.training.compilation import (
    TORCH_RECOMPILE_LIMIT,
    CompileClock,
    mark_batch_shapes,
    recompile_limit,
)


class Ticks:
    """A clock that advances one second at every reading."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


class GraphCounter:
    """A torch.compile backend that counts the graphs it is given and runs them as traced."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, graph, example_inputs):
        self.graphs += 1
        return graph.forward


def test_the_compile_clock_times_torchs_compilations_while_it_is_entered():
    clock = CompileClock(Ticks())
    compiled = torch.compile(lambda x: (x * 2).sum(), backend=GraphCounter())
    with clock:
        compiled(torch.ones(3))
        compiled(torch.ones(3))  # no new compilation
    assert clock.compilations == 1 and clock.seconds == 1.0 and clock() == 1.0
    torch.compile(lambda x: x + 1, backend=GraphCounter())(torch.ones(2))  # after exit: not counted
    assert clock.compilations == 1


def test_a_compilation_under_way_is_counted_when_read():
    clock = CompileClock(Ticks())
    clock.start(None)  # at 1
    assert clock() == 1.0  # read at 2
    clock.end(None)  # at 3
    assert clock.seconds == 2.0 and clock.compilations == 1


def test_marked_batches_compile_one_graph_per_length_whatever_their_sentences():
    """Token-budget batches hold as many sentences as fit their length: marked, batches of one bucket share a
    graph; unmarked, torch makes every dimension that changes dynamic, the lengths too."""
    shapes = [(40, 16), (39, 16), (52, 12), (48, 12), (41, 16), (26, 24), (31, 20)]
    marked, unmarked = GraphCounter(), GraphCounter()
    for backend, mark in ((marked, True), (unmarked, False)):
        torch._dynamo.reset()
        step = torch.compile(lambda ids, mask: (ids * mask).sum(1), backend=backend)
        for rows, length in shapes:
            batch = {"ids": torch.ones(rows, length), "mask": torch.ones(rows, length)}
            if mark:
                mark_batch_shapes(batch)
            step(**batch)
    assert marked.graphs == 4  # the lengths 16, 12, 24 and 20
    assert unmarked.graphs < 4  # a graph dynamic in the lengths too, which buckets are there to avoid


def test_the_recompile_limit_leaves_room_for_every_pair_of_buckets():
    assert recompile_limit([]) == TORCH_RECOMPILE_LIMIT
    assert recompile_limit([8, 16, 32, 64]) == 25
    assert TORCH_RECOMPILE_LIMIT == torch._dynamo.config.recompile_limit  # torch's own default, unchanged
