"""Estimate the longest register-to-register paths of a Yosys ECP5 netlist, before placement.

    python scripts/board_paths.py DIR/npu_board.json [--top npu_board] [--rows 20] [--per-block]
    python scripts/board_paths.py DIR/npu_board.json --fanout [--rows 20]

Reads the netlist ``npu build --keep-files`` (or ``npu synth --keep-files``) leaves in its build
directory and prints a Markdown table of the worst endpoints: the estimated arrival time, the
register where the path starts, the register (and pin) where it ends, and the blocks it crosses
(cell names carry the Amaranth hierarchy, ``system.npu.<block>...``). One row per register
(its bits taken together, the worst bit shown); with ``--per-block`` one row per block where
paths end, its worst endpoint. ``--fanout`` lists instead the nets that drive the most
flip-flops' reset (``LSR``) and enable (``CE``) pins, by block.

The delays are a fixed model, not nextpnr's: ``NET`` ns per routed net plus a little per
doubling of fan-out, ``LUT`` ns per ``LUT4``, the carry chain of ``CCU2C`` cells at its fast
internal delay, a block RAM read at its clock-to-output time without output register, an
unregistered ``MULT18X18D`` as a long combinational cell. It ranks paths by logic depth and
fan-out; nextpnr's placed estimate (``--no-route --report``) gives the real figure of the worst
one. ``docs/synthesis.md``, "The whole ULX3S board: where the critical paths are".
"""

import argparse
import json
import re
import sys
import threading

NET = 0.7           # one routed net, ns
FANOUT = 0.15       # per doubling of a net's fan-out
LUT = 0.25
CARRY_IN = 0.4      # CCU2C A/B/C/D to S or COUT
CARRY = 0.05        # CIN to COUT
CARRY_SUM = 0.25    # CIN to S
CLK_Q = 0.5
BRAM_CLK_Q = 4.3    # DP16KD without output register
MULT = 5.5          # MULT18X18D without registers, input to output
LUTRAM_READ = 0.6   # TRELLIS_DPR16X4 RAD to DO
SETUP = 0.1


class Netlist:
    def __init__(self, module):
        self.cells = module["cells"]
        self.names = {}
        for name, net in module["netnames"].items():
            if name.startswith("$"):
                continue
            for bit in net["bits"]:
                if isinstance(bit, int) and (bit not in self.names
                                             or len(name) < len(self.names[bit])):
                    self.names[bit] = name
        self.driver = {}
        self.fanout = {}
        for cell_name, cell in self.cells.items():
            for port, bits in cell["connections"].items():
                direction = cell.get("port_directions", {}).get(port)
                for bit in bits:
                    if not isinstance(bit, int):
                        continue
                    if direction == "output":
                        self.driver[bit] = (cell_name, port)
                    elif direction == "input":
                        self.fanout[bit] = self.fanout.get(bit, 0) + 1
        self.arrival = {}       # bit -> (ns, start register)
        self.previous = {}      # bit -> the input bit on its worst path

    def _registered(self, cell, param):
        return cell["parameters"].get(param, "NONE") not in ("NONE", "none")

    def endpoint(self, cell, port):
        """True if input ``port`` of ``cell`` is sampled by a clock (a path ends there)."""
        kind = cell["type"]
        if kind == "TRELLIS_FF":
            return port != "CLK"
        if kind == "DP16KD":
            return not port.startswith("CLK")
        if kind == "TRELLIS_DPR16X4":
            return port in ("WAD", "DI", "WRE")
        if kind == "MULT18X18D" and port[:1] in ("A", "B") and port[1:].isdigit():
            return self._registered(cell, f"REG_INPUT{port[0]}_CLK")
        return False

    def hop(self, bit):
        """Routing delay of net ``bit`` (none along a carry chain)."""
        if self.driver.get(bit, (None, None))[1] == "COUT":
            return 0.0
        return NET + FANOUT * max(0, self.fanout.get(bit, 1).bit_length() - 1)

    def _worst(self, cell, ports, extra):
        best = (0.0, "constant", None)
        for port in ports:
            for bit in cell["connections"].get(port, []):
                if isinstance(bit, int):
                    ns, start = self.at(bit)
                    best = max(best, (ns + self.hop(bit) + extra(port), start, bit))
        return best

    def at(self, bit):
        """(arrival in ns, start register) of net ``bit`` at its driver's output."""
        if bit in self.arrival:
            return self.arrival[bit] or (0.0, "loop")
        self.arrival[bit] = None
        if bit not in self.driver:
            result = (0.0, f"input {self.names.get(bit)}")
        else:
            cell_name, out = self.driver[bit]
            cell = self.cells[cell_name]
            kind = cell["type"]
            best = None
            if kind == "TRELLIS_FF":
                result = (CLK_Q, cell_name)
            elif kind == "DP16KD":
                result = (BRAM_CLK_Q, cell_name)
            elif kind == "MULT18X18D" and any(self._registered(cell, f"REG_{r}_CLK")
                                              for r in ("OUTPUT", "PIPELINE", "INPUTA")):
                result = (CLK_Q + MULT, cell_name)
            elif kind == "MULT18X18D":
                best = self._worst(cell, [p for p in cell["connections"]
                                          if p[:1] in "AB" and p[1:].isdigit()], lambda p: MULT)
            elif kind == "TRELLIS_DPR16X4":
                best = self._worst(cell, ["RAD"], lambda p: LUTRAM_READ)
            elif kind == "LUT4":
                best = self._worst(cell, "ABCD", lambda p: LUT)
            elif kind == "CCU2C":
                best = self._worst(cell, ["A0", "B0", "C0", "D0", "A1", "B1", "C1", "D1", "CIN"],
                                   lambda p: (CARRY if out == "COUT" else CARRY_SUM)
                                   if p == "CIN" else CARRY_IN)
            else:
                result = (0.0, cell_name)
            if best is not None:
                result = best[:2]
                self.previous[bit] = best[2]
        self.arrival[bit] = result
        return result

    def path(self, bit):
        """The cells of the worst path into ``bit``, from its start."""
        cells = []
        while bit is not None:
            cells.append(self.driver.get(bit, ("input", None))[0])
            bit = self.previous.get(bit)
        return cells[::-1]


def block(cell_name):
    """The block owning a cell: ``npu.<block>``, a core's sub-unit, or ``board.<part>``."""
    parts = cell_name.split(".")
    if parts[0] != "system" or len(parts) < 3:
        return "board"
    if parts[1] != "npu":
        return f"board.{parts[1]}"
    name = re.sub(r"\$\d+$", "", parts[2])
    if name.startswith("core") and len(parts) > 4:
        return ".".join([name] + parts[3:5 if parts[3] == "datapath" else 4])
    return name


def register(cell_name):
    """A flip-flop's register: its cell name without the bit suffixes Yosys adds."""
    return re.sub(r"(_\d+)+$", "", re.sub(r"_TRELLIS_FF_Q(_\d+)?$", "", cell_name))


def worst_endpoints(netlist, rows, per_block=False):
    ends = []
    for cell_name, cell in netlist.cells.items():
        for port, bits in cell["connections"].items():
            if cell.get("port_directions", {}).get(port) != "input" or \
                    not netlist.endpoint(cell, port):
                continue
            for bit in bits:
                if isinstance(bit, int):
                    ns, start = netlist.at(bit)
                    ends.append((ns + netlist.hop(bit) + SETUP, cell_name, port, start, bit))
    ends.sort(key=lambda e: -e[0])
    table, seen = [], set()
    for ns, cell_name, port, start, bit in ends:
        key = block(cell_name) if per_block else register(cell_name)
        if key in seen:
            continue
        seen.add(key)
        chain = []
        for name in netlist.path(bit) + [cell_name]:
            if not chain or chain[-1] != block(name):
                chain.append(block(name))
        table.append((ns, register(start), key, port, chain))
        if len(table) == rows:
            break
    return table


def control_fanout(netlist, rows):
    """The nets driving the most flip-flops' ``LSR`` (set/reset) and ``CE`` (enable) pins:
    ``(pin, flip-flops, net name, driving cell, {block: flip-flops})``, largest first."""
    users = {}
    for cell_name, cell in netlist.cells.items():
        if cell["type"] != "TRELLIS_FF":
            continue
        for pin in ("LSR", "CE"):
            bit = cell["connections"].get(pin, [None])[0]
            if isinstance(bit, int):
                per_block = users.setdefault((pin, bit), {})
                per_block[block(cell_name)] = per_block.get(block(cell_name), 0) + 1
    nets = sorted(users.items(), key=lambda item: -sum(item[1].values()))[:rows]
    return [(pin, sum(blocks.values()), netlist.names.get(bit, "?"),
             netlist.driver.get(bit, ("input", None))[0], blocks)
            for (pin, bit), blocks in nets]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("netlist")
    parser.add_argument("--top", default="npu_board")
    parser.add_argument("--rows", type=int, default=20)
    parser.add_argument("--per-block", action="store_true",
                        help="one row per block where paths end (its worst endpoint)")
    parser.add_argument("--fanout", action="store_true",
                        help="the largest reset (LSR) and enable (CE) nets instead")
    args = parser.parse_args()
    with open(args.netlist) as f:
        netlist = Netlist(json.load(f)["modules"][args.top])
    if args.fanout:
        print("| pin | flip-flops | net | driven by | flip-flops by block |")
        print("|---|---|---|---|---|")
        for pin, count, net, cell, blocks in control_fanout(netlist, args.rows):
            spread = ", ".join(f"{b} {n:,}" for b, n in sorted(blocks.items(),
                                                              key=lambda item: -item[1])[:4])
            print(f"| {pin} | {count:,} | `{net.removeprefix('system.')}` | "
                  f"`{cell.removeprefix('system.')}` | {spread} |")
        return
    # Paths are hundreds of cells deep: the recursion needs a large stack.
    sys.setrecursionlimit(1_000_000)
    threading.stack_size(512 * 1024 * 1024)
    result = []
    worker = threading.Thread(target=lambda: result.append(worst_endpoints(netlist, args.rows,
                                                                             args.per_block)))
    worker.start()
    worker.join()
    print("| # | ns (estimate) | from | to (pin) | blocks on the path |")
    print("|---|---|---|---|---|")
    for i, (ns, start, end, port, chain) in enumerate(result[0], 1):
        start = start.removeprefix("system.")
        end = end.removeprefix("system.")
        print(f"| {i} | {ns:.1f} | `{start}` | `{end}` ({port}) | {' -> '.join(chain)} |")


if __name__ == "__main__":
    main()
