"""``npu disasm PROG``: a program file in readable form.

Prints the configuration the program was built for, the base-address table, the queues, the
named tensors, and every queue's descriptors: task ID, engine, flags, dependency distance and
each register write by map, register and field names, with the datasets the writes program
(``docs/program.md``). ``--json`` prints the same as one JSON object.
"""

import enum
import json

from npu_cli.util import CLIError

__all__ = ["add_commands", "disassemble", "register_names"]


def register_names(config):
    """``{word address: (map name, display name, Register)}`` of every register of a build
    with ``config``: each core's neural-engine registers and dataset blocks included."""
    from npu_spec import dataproc, neural
    from npu_spec.registers import register_maps
    from npu_spec.taskman import task_manager_map

    names = {}
    for regmap in register_maps():
        if regmap.name == "TASK_MANAGER":
            regmap = task_manager_map(config.task_queues)
        for reg in regmap.registers:
            names[regmap.base + reg.offset] = (regmap.name, reg.name, reg)
    for core in range(config.cores):
        for reg in neural.NEURAL_ENGINE.registers:
            names[neural.core_base(core) + reg.offset] = (
                "NEURAL_ENGINE", f"CORE{core}.{reg.name}", reg)
        for port in ("IN", "OUT"):
            base = dataproc.ne_port_base(core, port)
            for k, name in enumerate(dataproc.DATASET_REGISTERS):
                reg = dataproc.DATA_PROCESSOR[f"NE0_IN_{name}"]
                names[base + k] = ("DATA_PROCESSOR", f"NE{core}_{port}_{name}", reg)
    return names


def _dataset_blocks(config):
    """``{block word address: name}`` of every dataset block."""
    from npu_spec import dataproc
    blocks = {dataproc.pe_port_base(p): f"PE_{p}" for p in dataproc.PE_PORTS}
    for core in range(config.cores):
        for port in ("IN", "OUT"):
            blocks[dataproc.ne_port_base(core, port)] = f"NE{core}_{port}"
    return blocks


def _plain(value):
    """A field value for printing: an enum member's name, or the number."""
    return value.name if isinstance(value, enum.Enum) else int(value)


def _task(desc, address, names, blocks):
    from npu_spec.descriptors import FLAGS
    from npu_spec.engine import Engine

    writes = []
    values = {}
    for block in desc.blocks:
        for i, word in enumerate(block.words):
            addr = block.address + i
            values[addr] = word
            known = names.get(addr)
            if known is None:
                writes.append({"address": addr, "map": None, "register": None, "word": word,
                               "fields": {}})
                continue
            map_name, reg_name, reg = known
            fields = {k: _plain(v) for k, v in reg.unpack(word, strict=False).items()}
            writes.append({"address": addr, "map": map_name, "register": reg_name,
                           "word": word, "fields": fields})
    datasets = {}
    for base, name in blocks.items():
        if all(base + k in values for k in range(5)):
            f = [names[base + k][2].unpack(values[base + k], strict=False) for k in range(5)]
            datasets[name] = {"addr": f[0]["addr"], "channels": f[2]["channels"],
                              "height": f[1]["height"], "width": f[1]["width"],
                              "cstride": f[3]["stride"], "rstride": f[4]["stride"]}
    try:
        engine = Engine(desc.engine).name
    except ValueError:
        engine = int(desc.engine)
    return {"address": address, "task_id": desc.task_id, "engine": engine,
            "network": desc.network, "flags": [f for f in FLAGS if getattr(desc, f)],
            "dep": desc.dep, "length": desc.length, "writes": writes, "datasets": datasets}


def disassemble(program, slot_words=None):
    """The program as a JSON-ready dict (``tasks`` per queue; a descriptor that does not
    decode ends its queue's list with an ``error`` entry)."""
    from npu_spec.descriptors import MAX_LENGTH, DescriptorError, decode
    from npu_spec.program import Program

    if not isinstance(program, Program):
        raise TypeError(f"program must be a Program, not {program!r}")
    doc = program.to_json()
    names = register_names(program.config)
    blocks = _dataset_blocks(program.config)
    memory = program.memory
    queues = []
    for q in program.queues:
        entry = program.base_table[q.base_index]
        tasks = []
        address = q.head
        for _ in range(q.tasks):
            raw = memory[4 * address:4 * (address + MAX_LENGTH)]
            raw += bytes(-len(raw) % 4)
            words = [int.from_bytes(raw[i:i + 4], "little") for i in range(0, len(raw), 4)]
            try:
                desc = decode(words, network=q.network, window=(entry.base, entry.limit),
                              address=address, tail=q.tail,
                              max_length=slot_words or MAX_LENGTH)
            except DescriptorError as e:
                tasks.append({"address": address, "error": f"{type(e).__name__}: {e}"})
                break
            tasks.append(_task(desc, address, names, blocks))
            address += desc.length
        queues.append({"index": q.index, "tasks": tasks})
    doc["descriptors"] = queues
    return doc


def _print_text(doc):
    cfg = doc["config"]
    print(f"program: format version {doc['format_version']}, "
          f"{doc['memory_bytes']} bytes of memory image")
    print("config: " + ", ".join(f"{k}={','.join(v) if isinstance(v, list) else v}"
                                 for k, v in cfg.items()))
    for i, e in enumerate(doc["base_table"]):
        print(f"base[{i}]: base 0x{e['base']:X} limit 0x{e['limit']:X} (words)")
    for q in doc["queues"]:
        print(f"queue {q['index']}: priority {q['priority']} network {q['network']} "
              f"base_index {q['base_index']} head 0x{q['head']:X} tail 0x{q['tail']:X} "
              f"tasks {q['tasks']}")
    for t in doc["tensors"]:
        print(f"tensor {t['name']}: {t['role']} {t['format']} shape {tuple(t['shape'])} "
              f"strides {tuple(t['strides'])} at byte 0x{t['addr']:X}")
    for q in doc["descriptors"]:
        print(f"\nqueue {q['index']}:")
        for t in q["tasks"]:
            if "error" in t:
                print(f"  @0x{t['address']:X}: {t['error']}")
                continue
            flags = " ".join(t["flags"]) or "-"
            print(f"  task {t['task_id']} @0x{t['address']:X}: {t['engine']} flags {flags} "
                  f"dep {t['dep']} ({t['length']} words)")
            for w in t["writes"]:
                if w["register"] is None:
                    print(f"    0x{w['address']:04X} = 0x{w['word']:08X} (no register)")
                    continue
                fields = " ".join(f"{k}={v}" for k, v in w["fields"].items())
                print(f"    0x{w['address']:04X} {w['register']}: {fields}")
            for name, d in t["datasets"].items():
                print(f"    dataset {name}: {d['channels']}x{d['height']}x{d['width']} at "
                      f"{d['addr']} cstride {d['cstride']} rstride {d['rstride']}")


def cmd_disasm(args):
    from npu_spec.program import ProgramError, load

    try:
        program = load(args.program)
    except ProgramError as e:
        raise CLIError(str(e), status=2) from None
    doc = disassemble(program)
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        _print_text(doc)
    return 0


def add_commands(subparsers):
    d = subparsers.add_parser(
        "disasm", help="print a program file: configuration, queues, tensors, tasks",
        description="Print a program file (docs/program.md): the configuration it was built "
        "for, the base-address table, the queues, the tensors, and every task with its "
        "register writes by register and field name and the datasets they program.")
    d.add_argument("program", metavar="PROG", help="program file (.npu zip archive)")
    d.add_argument("--json", action="store_true", help="print one JSON object")
    d.set_defaults(func=cmd_disasm)
