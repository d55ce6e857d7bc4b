# amaranth: UnusedElaboratable=no
"""Secure mode (seed 004): a secure request drains the NPU, switches mode, and only secure
queues run until they drain and the mode switches back."""

from tests.support.taskman import chain, inputs_for, make_bench, serial_values, values

FIG15 = [{}, {"tse": True, "dpc": True, "tsr": True}, {"spc": True, "spl": True}, {}]


def test_secure_request_drains_and_switches():
    A = chain(1, FIG15)                 # normal, priority 3
    S = chain(2, [{}, {}])              # secure, priority 0 (lowest)
    N = chain(3, [{}])                  # normal, priority 7 (highest), arrives in secure mode
    bench, placed = make_bench({0: A, 1: S, 2: N})
    bench.setup_queue(0, priority=3, network=1, base_index=0, head=placed[0].head, push=4)
    bench.setup_queue(1, priority=0, network=2, base_index=1, head=placed[1].head,
                      secure=True)
    bench.setup_queue(2, priority=7, network=3, base_index=2, head=placed[2].head)
    bench.read("STATUS", "before")
    bench.wait_start(0, 1)
    bench.write("Q1_PUSH", count=2)         # the secure request, during T1 (TSE)
    bench.wait_start(1, 0)
    bench.read("STATUS", "during")
    bench.write("Q2_PUSH", count=1)         # a normal queue of the highest priority
    bench.wait_end(1, 1)
    bench.wait_cycles(30)
    bench.read("STATUS", "after")
    bench.run()
    order = bench.order()
    # The secure request switches A at its switch point; N waits although it outranks S.
    assert order == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (0, 2), (0, 3)]
    # Drained: nothing of A was in flight while S ran, and S finished before N started.
    ends = {(e.queue, e.task_id): e.time for e in bench.events("end")}
    starts = {(e.queue, e.task_id): e.time for e in bench.events("start")}
    assert ends[(0, 1)] < starts[(1, 0)] and ends[(1, 1)] < starts[(2, 0)]
    assert bench.reads["before"]["secure"] == 0
    assert bench.reads["during"]["secure"] == 1
    assert bench.reads["after"]["secure"] == 0 and bench.reads["after"]["secure_request"] == 0
    # A's results equal a run without the interruption.
    assert values(bench, 0) == serial_values(A, 0, inputs_for({}))
