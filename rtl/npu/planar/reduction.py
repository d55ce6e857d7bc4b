"""The reduction over planes or the tensor: tree, retention registers, scale, post-processor.

Each beat leaving the lane pipeline (``pre(A)``; missing lanes hold the identity) goes
through a pairwise tree of binary32 add/max/min pipes (lane ``2i`` with lane ``2i + 1``,
level by level, one beat per cycle). Tree output ``k`` of a group is folded into retention
register ``k mod 3`` by one more pipe, so that the pipe's three-cycle latency never stalls it.
When the group's beats are in, the registers are combined as ``op(op(r0, r1), r2)``, the
result is multiplied by ``SCALE`` (:class:`FP32Mul`) and passed through the post-processor
(:class:`PostProcessor`); it leaves on ``result``.

When the lane pipeline's units are shared by ``share >= 4`` lanes (``planar_fp_share``),
beats enter the tree at least four cycles apart: the tree's last node and the retention pipe
are one pipe (a beat's last node op is three cycles before its retention op, so the two never
want the pipe in the same cycle), and the first level's nodes share pipes in pairs (node
``2k + 1`` one cycle after node ``2k``). Four lanes then need two add pipes instead of four.
The order of operations is the same.

In the integer build the tree and the retention registers are :data:`RED_WORD`-bit integer
pipes (the sums its rules allow fit) and there is no multiplier or post-processor (its tasks
have ``SCALE`` 1 and no post function): the combined value is the result, sign-extended.
"""

from amaranth.hdl import Array, Cat, Module, Mux, ResetInserter, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from npu_spec.planar import INT8_SUM_ELEMENTS, RETAIN

from ..lib.fp32 import FP32AddPipe
from ..lib.fp32mul import FP32Mul
from ..lib.pipe import delay
from .fold import reduction_fold
from .intpath import IntAddPipe, add_pipe
from .layouts import COUNT_BITS, Axis, Mode, config_layout, lane_output_layout, sizes_layout
from .postproc import PostProcessor

__all__ = ["RED_WORD", "Reduction"]

#: Width of the integer build's tree and retention registers: a sum of up to
#: ``INT8_SUM_ELEMENTS`` values of magnitude at most 128, signed.
RED_WORD = (INT8_SUM_ELEMENTS * 128).bit_length() + 1


class Reduction(wiring.Component):
    """Reduction tree, retention registers and their sequencer.

    Parameters
    ----------
    lanes : int
        ``L``, a power of two.
    shared : SharedModules or None
        Library of shared blocks (``npu.lib.shared``; Verilog output only): the tree's adders
        are instances of one converted ``FP32AddPipe``.
    word : int or None
        None: binary32; else the lanes' integer width (the integer build).
    share : int
        Lanes served by one lane's units (``planar_fp_share``): beats arrive at least
        ``share`` cycles apart; with 4 or more the last tree node is the retention pipe.

    Members
    -------
    flush : In(1)
        Synchronous clear of every register here and in the tree (the engine's flush; it
        reaches the adders also when they are instances of a shared module).
    task, sizes : In(config_layout()), In(sizes_layout())
        The running task (a reduction over planes or the tensor) and its sizes.
    busy : In(1)
        A task is running.
    clear : In(1)
        Set up for a new task.
    lane : In(lane_output_layout(L))
        The lane pipeline's output.
    en : In(1)
        The lane pipeline advances (its output beat is taken).
    result : Out(stream.Signature(32))
        A group's result (binary32).
    done : Out(1)
        Combinational: ``result`` is taken in this cycle.
    """

    def __init__(self, lanes, *, shared=None, word=None, share=1):
        if lanes < 1 or lanes & (lanes - 1):
            raise ValueError(f"lanes must be a power of two, not {lanes!r}")
        if share < 1 or lanes % share:
            raise ValueError(f"share must divide lanes ({lanes}), not {share!r}")
        self._lanes = lanes
        self._share = share
        self._shared = shared
        self._word = word
        super().__init__({
            "flush":  In(1),
            "task":   In(config_layout()),
            "sizes":  In(sizes_layout()),
            "busy":   In(1),
            "clear":  In(1),
            "lane":   In(lane_output_layout(lanes, word or 32)),
            "en":     In(1),
            "result": Out(stream.Signature(32)),
            "done":   Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        task = self.task
        active = (task.mode == Mode.REDUCE) & (task.axis != Axis.CHANNEL)
        integer = self._word is not None
        tree_word = RED_WORD if integer else None
        red_op, identity = reduction_fold(m, task.op, word=tree_word)

        # The tree (integer lanes sign-extended to its width).
        lane = self.lane
        values = [lane.value[i].as_signed() if integer else lane.value[i]
                  for i in range(self._lanes)]
        level = [Mux(lane.mask[i], values[i], identity) for i in range(self._lanes)]
        tree_in = lane.valid & active & self.en
        # When beats come at least 4 cycles apart, the last node is the retention pipe and
        # the first level's nodes share pipes in pairs.
        merged = self._share >= 4 and self._lanes > 1
        depth = 0
        stagger = 0
        if self._share >= 4 and self._lanes >= 4:
            level = self._paired_level(m, level, tree_in, red_op, tree_word)
            depth, stagger = 1, 1
        while len(level) > (2 if merged else 1):
            nodes = []
            for k in range(len(level) // 2):
                node = add_pipe(m, f"tree{depth}_{k}", self._shared, tree_word,
                                reset=self.flush)
                m.d.comb += [node.en.eq(1), node.a.eq(level[2 * k]),
                             node.b.eq(level[2 * k + 1]), node.op.eq(red_op)]
                nodes.append(node.result)
            level = nodes
            depth += 1
        latency = FP32AddPipe.LATENCY * depth + stagger
        at_level = delay(m, tree_in, latency, name="tree")[-1] if latency else tree_in

        # Retention registers: tree output k into register k mod RETAIN (`index`); a result
        # that reaches the register it was read from is forwarded.
        m.submodules.retention = retention = IntAddPipe(RED_WORD) if integer else FP32AddPipe()
        if merged:
            # The last node's op goes through the retention pipe, ahead of the FSM's ops.
            tree_out = retention.result
            tree_valid = delay(m, at_level, FP32AddPipe.LATENCY, name="last_node")[-1]
        else:
            tree_out, tree_valid = level[0], at_level
        registers = Array(Signal(tree_word or 32, name=f"retained{j}") for j in range(RETAIN))
        index = Signal(range(RETAIN))
        count = Signal(COUNT_BITS)
        issue = Signal()
        fold_layout = data.StructLayout({"valid": 1, "index": range(RETAIN)})
        folding = Signal(fold_layout)
        m.d.comb += [folding.valid.eq(issue & tree_valid), folding.index.eq(index)]
        folds = delay(m, folding, FP32AddPipe.LATENCY, name="fold")
        folded = folds[-1]
        forward = folded.valid & (folded.index == index)
        m.d.comb += [retention.en.eq(1), retention.op.eq(red_op)]
        node_a = Signal.like(retention.a)
        node_b = Signal.like(retention.b)
        with m.If(folded.valid):
            m.d.sync += registers[folded.index].eq(retention.result)

        m.d.comb += self.done.eq(self.result.valid & self.result.ready)
        combined = Signal(signed(32))   # the integer build's result
        if integer:
            m.d.comb += self.result.payload.eq(combined)
        else:
            m.submodules.scale_mul = scale_mul = FP32Mul()
            m.submodules.post_processor = post = PostProcessor()
            m.d.comb += [scale_mul.en.eq(1), scale_mul.b.eq(task.scale),
                         post.fn.eq(task.post), post.x.eq(scale_mul.result),
                         self.result.payload.eq(post.result)]
        wait = Signal(3)
        with m.FSM(name="reduce"):
            with m.State("COLLECT"):
                m.d.comb += [issue.eq(active),
                             node_a.eq(Mux(forward, retention.result, registers[index])),
                             node_b.eq(tree_out)]
                with m.If(tree_valid & active):
                    m.d.sync += [index.eq(Mux(index == RETAIN - 1, 0, index + 1)),
                                 count.eq(count + 1)]
                in_flight = Cat(*(f.valid for f in folds)).any()
                beats = self.sizes.beats_group
                with m.If(active & self.busy & (count == beats) & (beats != 0) & ~in_flight
                          & ~tree_valid):
                    m.d.sync += wait.eq(0)
                    m.next = "COMBINE1"
            with m.State("COMBINE1"):
                m.d.comb += [node_a.eq(registers[0]), node_b.eq(registers[1])]
                m.next = "WAIT1"
            with m.State("WAIT1"):
                m.d.sync += wait.eq(wait + 1)
                with m.If(wait == FP32AddPipe.LATENCY - 2):
                    m.d.sync += wait.eq(0)
                    m.next = "COMBINE2"
            with m.State("COMBINE2"):
                m.d.comb += [node_a.eq(retention.result), node_b.eq(registers[2])]
                m.next = "WAIT2"
            with m.State("WAIT2"):
                m.d.sync += wait.eq(wait + 1)
                with m.If(wait == FP32AddPipe.LATENCY - 2):
                    m.d.sync += wait.eq(0)
                    m.next = "RESULT" if integer else "SCALE"
            if integer:
                with m.State("RESULT"):
                    m.d.sync += combined.eq(retention.result)
                    m.next = "OUTPUT"
            if not integer:
                with m.State("SCALE"):
                    m.d.comb += scale_mul.a.eq(retention.result)
                    m.d.sync += wait.eq(wait + 1)
                    with m.If(wait == FP32Mul.LATENCY):
                        m.d.comb += post.start.eq(1)
                        m.next = "POST"
                with m.State("POST"), m.If(post.done):
                    m.next = "OUTPUT"
            with m.State("OUTPUT"):
                m.d.comb += self.result.valid.eq(1)
                with m.If(self.result.ready):
                    m.d.sync += [index.eq(0), count.eq(0)]
                    m.d.sync += [registers[j].eq(identity) for j in range(RETAIN)]
                    m.next = "COLLECT"
        if merged:
            m.d.comb += [retention.a.eq(Mux(at_level, level[0], node_a)),
                         retention.b.eq(Mux(at_level, level[1], node_b))]
        else:
            m.d.comb += [retention.a.eq(node_a), retention.b.eq(node_b)]
        with m.If(self.clear):
            m.d.sync += [index.eq(0), count.eq(0)]
            m.d.sync += [registers[j].eq(identity) for j in range(RETAIN)]
        return ResetInserter(self.flush)(m)

    def _paired_level(self, m, level, tree_in, red_op, tree_word):
        """The tree's first level on one pipe per two nodes: node ``2k`` in the beat's cycle,
        node ``2k + 1`` one cycle later from registered operands; both results together four
        cycles after the beat (the first one held a cycle)."""
        nodes = []
        for k in range(len(level) // 4):
            late = [Signal.like(level[4 * k + j], name=f"tree0_late{k}_{j}") for j in (2, 3)]
            m.d.sync += [late[0].eq(level[4 * k + 2]), late[1].eq(level[4 * k + 3])]
            node = add_pipe(m, f"tree0_{k}", self._shared, tree_word, reset=self.flush)
            m.d.comb += [node.en.eq(1), node.op.eq(red_op),
                         node.a.eq(Mux(tree_in, level[4 * k], late[0])),
                         node.b.eq(Mux(tree_in, level[4 * k + 1], late[1]))]
            early = Signal.like(node.result, name=f"tree0_early{k}")
            m.d.sync += early.eq(node.result)
            nodes += [early, node.result]
        return nodes
