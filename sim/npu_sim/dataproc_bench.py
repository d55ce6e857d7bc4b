"""The data processor as an engine's data side on the engine bench (simulation only).

:class:`BufferDataSide` puts the RTL data processor (:class:`npu.dataproc.DataProcessor`)
behind the bench's data-side interface, in place of the behavioural stand-ins
(:class:`~npu_sim.conv_harness.ConvDataSide`, :class:`~npu_sim.engine_bench.StreamDataSide`):
the engine's data ports go to the data processor, the bench's ``LOAD`` and ``DUMP`` go through
the DMA ports, and the register writes the engine takes are also given to the data processor,
so one program of ``WRITE`` commands sets up both (``npu_spec.dataproc.dataset_writes``).

====  ========  =============================================================================
sel   command   meaning
====  ========  =============================================================================
0     LOAD      buffer element ``addr`` gets ``data[0:16]`` (``dma_write``)
1     LOAD      word ``addr[0:16]`` of core ``addr[16:]``'s kernel memory gets ``data[0:32]``
0     DUMP      ``count`` buffer elements from ``addr`` (``dma_read``), one DATA beat each
====  ========  =============================================================================

``STALL`` holds back, with its probability in each cycle, the streams between the engine and
the data processor that may stall: the row requests and row writes of a core, the planar
engine's operand and result streams (the row answers are always taken).
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In

from npu.dataproc.dataproc import DataProcessor
from npu.neural.engine import NeuralEngine
from npu.planar.engine import PlanarEngine

from .engine_bench import DataSideSignature, EngineBench

__all__ = ["BufferDataSide", "LoadSel", "buffer_bench"]


class LoadSel:
    """The ``sel`` codes of ``LOAD`` and ``DUMP``."""
    BUFFER = 0
    KERNEL = 1


class BufferDataSide(wiring.Component):
    """The data processor behind the bench's data-side interface (module documentation).

    Parameters
    ----------
    dataproc : DataProcessor

    Members
    -------
    bench : In(DataSideSignature(data_width))
    """

    SEEDS = (0xACE1, 0x1D87, 0x5A3C, 0xE2B9, 0x7F31, 0x3C5A)

    def __init__(self, dataproc, *, data_width=32):
        if not isinstance(dataproc, DataProcessor):
            raise TypeError(f"dataproc must be a DataProcessor, not {dataproc!r}")
        self.dataproc = dataproc
        self._gates = []
        super().__init__({"bench": In(DataSideSignature(data_width))})

    def _gate(self, m, src, dst):
        """``src`` to ``dst`` (streams), held back at random; an offered beat stays offered."""
        k = len(self._gates)
        lfsr = Signal(16, init=self.SEEDS[k % len(self.SEEDS)] ^ (k << 8), name=f"lfsr{k}")
        offered = Signal(name=f"offered{k}")
        self._gates.append((lfsr, offered, src, dst))
        m.d.comb += [dst.payload.eq(src.payload), src.ready.eq(dst.ready & dst.valid)]
        return lfsr, offered

    def connect_engine(self, m, engine):
        dp = self.dataproc
        m.submodules.dataproc = dp
        if isinstance(engine, NeuralEngine):
            i = engine.core
            core = dp.ne[i]
            self._gate(m, engine.row_req, core.row_req)
            self._gate(m, engine.out, core.out)
            wiring.connect(m, core.row_data, engine.row_data)
            wiring.connect(m, engine.kmem, core.kmem)
        elif isinstance(engine, PlanarEngine):
            for name in ("a", "b", "c"):
                self._gate(m, getattr(dp, f"pe_{name}"), getattr(engine, name))
            self._gate(m, engine.out, dp.pe_out)
            start = engine.task.start
            m.d.comb += [dp.pe_start.eq(start.valid & start.ready),
                         dp.pe_done.eq(engine.task.done)]
        else:
            raise TypeError(f"engine must be a NeuralEngine or a PlanarEngine, not {engine!r}")
        # The register writes the engine takes also go to the data processor (always ready
        # without host accesses).
        writes = engine.writes
        m.d.comb += [dp.writes.valid.eq(writes.valid & writes.ready),
                     dp.writes.payload.eq(writes.payload)]

    def elaborate(self, platform):
        m = Module()
        dp = self.dataproc
        load, dump, out = self.bench.load, self.bench.dump, self.bench.out

        # Random stalls of the engine's streams.
        for lfsr, offered, src, dst in self._gates:
            m.d.sync += lfsr.eq(Mux(lfsr[0], (lfsr >> 1) ^ 0xB400, lfsr >> 1))
            m.d.sync += offered.eq(dst.valid & ~dst.ready)
            m.d.comb += dst.valid.eq(src.valid & (offered | (lfsr[:8] >= self.bench.stall)))

        # LOAD: buffer elements and kernel words.
        p = load.payload
        m.d.comb += [
            dp.dma_write.payload.addr.eq(p.addr), dp.dma_write.payload.data[0].eq(p.data[:16]),
            dp.dma_write.payload.mask.eq(1),
            dp.dma_write.valid.eq(load.valid & (p.sel == LoadSel.BUFFER)),
            dp.kmem_write.payload.core.eq(p.addr[16:]), dp.kmem_write.payload.addr.eq(p.addr),
            dp.kmem_write.payload.data.eq(p.data[:32]),
            dp.kmem_write.valid.eq(load.valid & (p.sel == LoadSel.KERNEL)),
            load.ready.eq(Mux(p.sel == LoadSel.BUFFER, dp.dma_write.ready,
                              Mux(p.sel == LoadSel.KERNEL, dp.kmem_write.ready, 1))),
        ]

        # DUMP: element reads, answered as DATA beats.
        addr = Signal.like(dump.payload.addr)
        left = Signal.like(dump.payload.count)
        req = dp.dma_read.req
        m.d.comb += [dump.ready.eq(left == 0), req.valid.eq(left != 0),
                     req.payload.addr.eq(addr)]
        with m.If(dump.valid & dump.ready):
            m.d.sync += [addr.eq(dump.payload.addr), left.eq(dump.payload.count)]
        with m.Elif(req.valid & req.ready):
            m.d.sync += [addr.eq(addr + 1), left.eq(left - 1)]
        resp = dp.dma_read.resp
        m.d.comb += [out.valid.eq(resp.valid), out.payload.data.eq(resp.payload.data[0]),
                     resp.ready.eq(out.ready)]
        return m


def buffer_bench(engine, config, **dataproc_args):
    """An :class:`EngineBench` of ``engine`` (a ``NeuralEngine`` or ``PlanarEngine`` of
    ``config``) on a :class:`BufferDataSide`."""
    return EngineBench(engine, BufferDataSide(DataProcessor(config, **dataproc_args)))
