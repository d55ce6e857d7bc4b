# amaranth: UnusedElaboratable=no
"""Register-map declarations, encoder/decoder and generated docs (pure Python)."""

import enum
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from npu_spec.config import PRESETS, NPUConfig
from npu_spec.registers import (
    MAGIC,
    NPU_INFO,
    VERSION_MAJOR,
    VERSION_MINOR,
    npu_info_values,
    register_maps,
    registers_markdown,
    write_docs,
)
from npu_spec.regmap import Field, Register, RegisterMap, WriteBlock, document

ROOT = Path(__file__).resolve().parents[2]


class Mode(enum.IntEnum):
    IDLE = 0
    CONV = 1
    POOL = 3


class Other(enum.IntEnum):
    A = 1


def example_map(base=0x40):
    return RegisterMap("EXAMPLE", base=base, doc="An example map.", registers=[
        Register("CTRL", doc="Control.", fields=[
            Field("mode", 2, enum=Mode, reset=Mode.CONV, doc="Operating mode."),
            Field("length", 10, reset=100, doc="Length."),
            Field("start", 1, offset=16, access="wo", doc="Start pulse."),
            Field("kind", 3, offset=20, enum={"A": 0, "B": 5}, doc="A dict enum."),
        ]),
        Register("STATUS", fields=[
            Field("busy", access="ro"),
            Field("count", 8, access="ro", reset=7),
            Field("done", 1, access="w1c"),
            Field("errors", 4, access="w1c"),
        ]),
        Register("DATA", offset=0x4, fields=[Field("value", 32)]),
        Register("NEXT", fields=[Field("value", 16, reset=0xBEEF)]),
    ])


# Declaration checks ---------------------------------------------------------------------------

class TestFieldValidation:
    @pytest.mark.parametrize("name", ["Mode", "1x", "", "with space", "class", "_x", 3])
    def test_bad_name(self, name):
        with pytest.raises(ValueError, match=re.escape(repr(name))):
            Field(name, 1)

    @pytest.mark.parametrize("width", [0, 33, -1])
    def test_bad_width(self, width):
        with pytest.raises(ValueError, match=rf"not {width}$"):
            Field("x", width)

    def test_width_type(self):
        with pytest.raises(TypeError, match=r"not 1\.5"):
            Field("x", 1.5)
        with pytest.raises(TypeError, match=r"not True"):
            Field("x", True)

    def test_bad_access(self):
        with pytest.raises(ValueError, match=r"not 'rc'"):
            Field("x", 1, access="rc")

    @pytest.mark.parametrize("offset", [-1, 32])
    def test_bad_offset(self, offset):
        with pytest.raises(ValueError, match=rf"not {offset}$"):
            Field("x", 1, offset=offset)

    def test_offset_plus_width(self):
        with pytest.raises(ValueError, match=r"\[35:28\]"):
            Field("x", 8, offset=28)

    @pytest.mark.parametrize("reset", [256, -1])
    def test_reset_does_not_fit(self, reset):
        with pytest.raises(ValueError, match=rf"not {reset}$"):
            Field("x", 8, reset=reset)

    def test_wo_reset_must_be_zero(self):
        with pytest.raises(ValueError, match=r"must be 0 .* not 1$"):
            Field("go", 1, access="wo", reset=1)

    def test_default_reset(self):
        assert Field("x", 4).reset == 0
        assert Field("x", 4, access="w1c").reset == 0
        assert Field("x", 4, access="wo").reset == 0
        assert Field("x", 4, access="ro").reset is None
        assert Field("x", 4, access="ro", reset=3).reset == 3

    def test_enum_member_too_wide(self):
        with pytest.raises(ValueError, match=r"POOL=3 .* 1 bit"):
            Field("mode", 1, enum=Mode)
        with pytest.raises(ValueError, match=r"BIG=9 .* 3 bit"):
            Field("kind", 3, enum={"SMALL": 0, "BIG": 9})

    def test_enum_bad_type(self):
        with pytest.raises(TypeError, match=r"not \[1, 2\]"):
            Field("mode", 2, enum=[1, 2])
        with pytest.raises(ValueError, match=r"not '1x'"):
            Field("mode", 2, enum={"1x": 1})

    def test_enum_on_w1c(self):
        with pytest.raises(ValueError, match=r"w1c"):
            Field("flags", 2, access="w1c", enum=Mode)

    def test_enum_reset(self):
        assert Field("mode", 2, enum=Mode, reset="POOL").reset == 3
        assert Field("mode", 2, enum=Mode, reset=Mode.CONV).reset == 1
        assert Field("mode", 2, enum=Mode, reset=1).reset == 1
        with pytest.raises(ValueError, match=r"'WRONG' is not a member of Mode"):
            Field("mode", 2, enum=Mode, reset="WRONG")
        with pytest.raises(ValueError, match=r"2 is not a value of Mode"):
            Field("mode", 2, enum=Mode, reset=2)
        with pytest.raises(TypeError, match=r"Other.A"):
            Field("mode", 2, enum=Mode, reset=Other.A)

    def test_dict_enum_becomes_intenum(self):
        f = Field("kind", 3, enum={"A": 0, "B": 5})
        assert issubclass(f.enum, enum.IntEnum)
        assert f.enum.B == 5 and f.enum.__name__ == "kind"


class TestRegisterValidation:
    def test_auto_offsets(self):
        reg = Register("R", [Field("a", 3), Field("b", 5), Field("c", 4, offset=16),
                             Field("d", 2)])
        assert [(f.name, f.offset) for f in reg] == [("a", 0), ("b", 3), ("c", 16), ("d", 20)]
        assert reg["c"].bits == "[19:16]" and reg["a"].mask == 0b111

    def test_overlap(self):
        with pytest.raises(ValueError, match=r"'b' \[11:4\] .* overlaps field 'a' \[7:0\]"):
            Register("R", [Field("a", 8), Field("b", 8, offset=4)])

    def test_too_wide_in_total(self):
        with pytest.raises(ValueError, match=r"'c' of register 'R' .* \[39:24\]"):
            Register("R", [Field("a", 16), Field("b", 8), Field("c", 16)])

    def test_duplicate_field(self):
        with pytest.raises(ValueError, match=r"two fields named 'a'"):
            Register("R", [Field("a", 1), Field("a", 1)])

    def test_bad_register_name(self):
        with pytest.raises(ValueError, match=r"not 'ctrl'"):
            Register("ctrl", [Field("a")])

    def test_no_fields(self):
        with pytest.raises(ValueError, match=r"'R' must have at least one field"):
            Register("R", [])

    def test_not_a_field(self):
        with pytest.raises(TypeError, match=r"not 'a'"):
            Register("R", ["a"])

    def test_unknown_field_lookup(self):
        reg = Register("R", [Field("a")])
        with pytest.raises(ValueError, match=r"no field 'b'"):
            reg["b"]

    def test_masks_and_reset(self):
        reg = example_map()["STATUS"]
        assert reg.write_mask == 0x3E00 and reg.read_mask == 0x3FFF
        assert reg.reset == 7 << 1
        assert reg.access == "ro/w1c"


class TestMapValidation:
    def test_auto_register_offsets(self):
        regmap = example_map()
        assert [(r.name, r.offset) for r in regmap] == [
            ("CTRL", 0), ("STATUS", 1), ("DATA", 4), ("NEXT", 5)]
        assert regmap.size == 6 and len(regmap) == 4
        assert regmap.address("DATA") == 0x44

    def test_duplicate_name(self):
        with pytest.raises(ValueError, match=r"two registers named 'A'"):
            RegisterMap("M", [Register("A", [Field("x")]), Register("A", [Field("x")])])

    def test_duplicate_offset(self):
        with pytest.raises(ValueError, match=r"'B' .* offset 0x1, already used by register 'C'"):
            RegisterMap("M", [Register("A", [Field("x")]), Register("C", [Field("x")]),
                              Register("B", [Field("x")], offset=1)])

    def test_bad_base(self):
        with pytest.raises(ValueError, match=r"not -4"):
            RegisterMap("M", [Register("A", [Field("x")])], base=-4)

    def test_unknown_register(self):
        with pytest.raises(ValueError, match=r"no register 'NOPE'"):
            example_map()["NOPE"]

    def test_declaration_does_not_mutate_inputs(self):
        field = Field("x", 4)
        reg = Register("A", [field])
        RegisterMap("M", [reg], base=0)
        assert field.offset is None and reg.offset is None


# Encoder and decoder --------------------------------------------------------------------------

class TestEncode:
    def test_defaults(self):
        regmap = example_map()
        # rw fields keep their reset value, wo fields write 0.
        assert regmap.encode("CTRL") == (0x40, 1 | 100 << 2)
        assert regmap.encode("NEXT") == (0x45, 0xBEEF)
        # w1c fields not given write 0: nothing is cleared.
        assert regmap.encode("STATUS") == (0x41, 0)

    def test_fields(self):
        regmap = example_map()
        addr, word = regmap.encode("CTRL", mode=Mode.POOL, length=5, start=1, kind="B")
        assert addr == 0x40
        assert word == 3 | 5 << 2 | 1 << 16 | 5 << 20
        assert regmap.encode("STATUS", done=True, errors=0b1010) == (0x41, 1 << 9 | 0b1010 << 10)

    def test_enum_forms_agree(self):
        regmap = example_map()
        assert (regmap.encode("CTRL", mode=Mode.POOL) == regmap.encode("CTRL", mode="POOL")
                == regmap.encode("CTRL", mode=3))

    def test_read_only_rejected(self):
        with pytest.raises(ValueError, match=r"STATUS\.busy is read-only"):
            example_map().encode("STATUS", busy=1)

    def test_unknown_register_and_field(self):
        regmap = example_map()
        with pytest.raises(ValueError, match=r"'CTLR'"):
            regmap.encode("CTLR", mode=1)
        with pytest.raises(ValueError, match=r"no field 'lenght'"):
            regmap.encode("CTRL", lenght=1)

    @pytest.mark.parametrize("value", [1024, -1])
    def test_out_of_range(self, value):
        with pytest.raises(ValueError, match=rf"CTRL\.length.*\[0, 1023\].*not {value}$"):
            example_map().encode("CTRL", length=value)

    def test_enum_errors(self):
        regmap = example_map()
        with pytest.raises(ValueError, match=r"'RUN' is not a member of Mode"):
            regmap.encode("CTRL", mode="RUN")
        with pytest.raises(ValueError, match=r"2 is not a value of Mode"):
            regmap.encode("CTRL", mode=2)
        with pytest.raises(TypeError, match=r"Other.A"):
            regmap.encode("CTRL", mode=Other.A)
        with pytest.raises(TypeError, match=r"not 'x' \(the field has no enum\)"):
            regmap.encode("CTRL", length="x")
        with pytest.raises(TypeError, match=r"not 1\.0"):
            regmap.encode("CTRL", length=1.0)

    def test_wo_pulse_only_written_when_given(self):
        regmap = example_map()
        assert regmap.encode("CTRL")[1] & (1 << 16) == 0
        assert regmap.encode("CTRL", start=1)[1] & (1 << 16)


class TestDecode:
    def test_round_trip(self):
        regmap = example_map()
        addr, word = regmap.encode("CTRL", mode="POOL", length=77, start=1, kind="B")
        values = regmap.decode(addr, word)
        assert values == {"mode": Mode.POOL, "length": 77, "start": 1, "kind": 5}
        assert values["mode"] is Mode.POOL and values["kind"].name == "B"

    def test_random_round_trips(self):
        rng = random.Random(1234)
        regmap = example_map()
        for _ in range(500):
            reg = rng.choice(regmap.registers)
            values = {}
            for f in reg:
                if f.access == "ro":
                    continue
                values[f.name] = (rng.choice(list(f.enum)) if f.enum is not None
                                  else rng.randrange(f.max + 1))
            addr, word = regmap.encode(reg.name, **values)
            decoded = regmap.decode(addr, word)
            assert {k: decoded[k] for k in values} == values
            assert all(decoded[f.name] == 0 for f in reg if f.access == "ro")
            assert reg.pack(**decoded) == word

    def test_reserved_bits(self):
        regmap = example_map()
        with pytest.raises(ValueError, match=r"0x80000000 .* reserved bits 0x80000000"):
            regmap.decode(0x40, 0x8000_0000)
        assert regmap.decode(0x40, 0x8000_0000, strict=False)["mode"] == Mode.IDLE

    def test_invalid_enum_value(self):
        regmap = example_map()
        with pytest.raises(ValueError, match=r"'mode' holds 2, not a value of Mode"):
            regmap.decode(0x40, 2)
        values = regmap.decode(0x40, 2, strict=False)
        assert values["mode"] == 2 and type(values["mode"]) is int

    def test_unmapped_address(self):
        regmap = example_map()
        for address in (0x3F, 0x42, 0x43, 0x46):
            with pytest.raises(ValueError, match=rf"0x{address:X} is not a register"):
                regmap.decode(address, 0)

    def test_word_range(self):
        with pytest.raises(ValueError, match=r"not 4294967296"):
            example_map().decode(0x44, 1 << 32)


class TestBlocks:
    def test_merge_consecutive(self):
        regmap = example_map()
        blocks = regmap.encode_block({
            "DATA": {"value": 0x1234},
            "NEXT": {"value": 1},
            "CTRL": {"mode": "POOL"},
            "STATUS": {"done": 1},
        })
        assert blocks == [
            WriteBlock(0x44, 2, (0x1234, 1)),
            WriteBlock(0x40, 2, (regmap.encode("CTRL", mode="POOL")[1], 1 << 9)),
        ]
        assert all(block.count == len(block.words) for block in blocks)

    def test_order_preserved(self):
        regmap = example_map()
        # The command register is written last even though its address is lower.
        blocks = regmap.encode_block([("DATA", {"value": 1}), ("CTRL", {"start": 1}),
                                      ("DATA", {"value": 2})])
        assert [b.address for b in blocks] == [0x44, 0x40, 0x44]

    def test_round_trip(self):
        regmap = example_map()
        writes = [("CTRL", {"mode": Mode.IDLE, "length": 3, "start": 1, "kind": 0}),
                  ("STATUS", {"busy": 0, "count": 0, "done": 1, "errors": 15}),
                  ("DATA", {"value": 9}), ("NEXT", {"value": 8})]
        encodable = [(n, {k: v for k, v in vs.items() if not regmap[n][k].access == "ro"})
                     for n, vs in writes]
        blocks = regmap.encode_block(encodable)
        assert len(blocks) == 2
        assert regmap.decode_block(blocks) == writes

    def test_errors(self):
        regmap = example_map()
        with pytest.raises(ValueError, match=r"count 3 but 2 data words"):
            regmap.decode_block([(0x44, 3, (1, 2))])
        with pytest.raises(TypeError, match=r"not 'DATA'"):
            regmap.encode_block(["DATA"])
        with pytest.raises(TypeError, match=r"must be a dict, not 5"):
            regmap.encode_block([("DATA", 5)])
        with pytest.raises(ValueError, match=r"\[0, 65535\].*not 65536"):
            regmap.encode_block({"NEXT": {"value": 65536}})


# The NPU's own maps ---------------------------------------------------------------------------

class TestNPUInfo:
    def test_layout(self):
        assert NPU_INFO.base == 0
        assert NPU_INFO.address("ID") == 0
        assert NPU_INFO["ID"].reset == MAGIC == 0x4E50_5530
        assert NPU_INFO["VERSION"].reset == VERSION_MAJOR << 16 | VERSION_MINOR
        assert NPU_INFO["SCRATCH"].write_mask == 0xFFFF_FFFF
        assert NPU_INFO["IRQ_STATUS"].accesses == {"w1c"}
        for name in ("ID", "VERSION", "CONFIG0", "CONFIG1", "CONFIG2"):
            assert NPU_INFO[name].accesses == {"ro"} and NPU_INFO[name].write_mask == 0

    @pytest.mark.parametrize("name", sorted(PRESETS))
    def test_values(self, name):
        config = PRESETS[name]
        values = npu_info_values(config)
        assert set(values) == {"ID", "VERSION", "CONFIG0", "CONFIG1", "CONFIG2", "CONFIG3",
                               "CONFIG4"}
        for reg_name, fields in values.items():
            word = NPU_INFO[reg_name].pack(**fields)
            assert NPU_INFO.decode(NPU_INFO.address(reg_name), word) == fields
            assert set(fields) == {f.name for f in NPU_INFO[reg_name]}
        assert values["CONFIG0"] == {"cores": config.cores, "macs": config.macs,
                                     "acc_slots": config.acc_slots}
        assert values["CONFIG1"]["fp16"] == int(config.has_fp16)
        assert values["CONFIG2"]["buffer_kib"] == config.buffer_kib
        assert values["CONFIG3"] == {"mem_width": config.mem_width,
                                     "kernel_kib": config.kernel_kib}
        assert values["CONFIG4"]["mem_kib"] == config.mem_kib

    def test_extreme_config_fits(self):
        config = NPUConfig(cores=64, macs=4096, acc_slots=64, planar_lanes=32,
                           buffer_kib=1 << 16, task_queues=32)
        assert npu_info_values(config)["CONFIG0"]["macs"] == 4096

    def test_values_type(self):
        with pytest.raises(TypeError, match=r"not 'small'"):
            npu_info_values("small")

    def test_read_only_config(self):
        with pytest.raises(ValueError, match=r"read-only"):
            NPU_INFO.encode("CONFIG0", cores=1)


# Documentation --------------------------------------------------------------------------------

class TestDocs:
    def test_docs_up_to_date(self):
        path = ROOT / "docs" / "registers.md"
        assert path.read_text(encoding="utf-8") == registers_markdown(), (
            "docs/registers.md is out of date: run python scripts/gen_docs.py")

    def test_write_docs(self, tmp_path):
        path = write_docs(tmp_path / "sub" / "registers.md")
        assert path.read_text(encoding="utf-8") == registers_markdown()

    def test_every_map_documented(self):
        text = registers_markdown()
        for regmap in register_maps():
            assert f"## {regmap.name}\n" in text
            for reg in regmap:
                assert f"### {regmap.name}.{reg.name} " in text
                for f in reg:
                    assert f"`{f.name}`" in text

    def test_example_in_docs_runs(self):
        text = registers_markdown()
        code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
        namespace = {}
        exec(code, namespace)
        example = namespace["EXAMPLE"]
        assert example.address("STATUS") == 0x101
        assert example["STATUS"]["done"].offset == 1
        assert example.encode("CTRL", mode="RUN", start=1) == (0x100, 1 | 1 << 8)

    def test_markdown_tables(self):
        text = example_map().to_markdown()
        assert "| `[1:0]` | `mode` | rw | `1` (CONV) | Operating mode. Values: `0` = `IDLE`, " \
               "`1` = `CONV`, `3` = `POOL`. |" in text
        assert "| `[15:12]` | - | - | `0` | Reserved: reads 0, writes ignored. |" in text
        assert "| `[22:20]` | `kind` | rw | `0` (A) | A dict enum. Values: `0` = `A`, " \
               "`5` = `B`. |" in text
        assert "| `[0]` | `busy` | ro | hw |" in text
        assert "| `0x05` | `0x0045` | `NEXT` | rw | `0x0000BEEF` |" in text
        assert "| `0x01` | `0x0041` | `STATUS` | ro/w1c | hw |" in text

    def test_document_checks_maps(self):
        with pytest.raises(TypeError, match=r"not 'NPU_INFO'"):
            document(["NPU_INFO"])

    def test_gen_docs_check(self):
        result = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_docs.py"),
                                 "--check"], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr


def test_no_amaranth_import():
    code = ("import sys, npu_spec.regmap, npu_spec.registers; "
            "assert 'amaranth' not in sys.modules, sorted(m for m in sys.modules "
            "if m.startswith('amaranth'))")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_pack_not_strict_takes_any_code_that_fits():
    reg = Register("R", fields=[Field("mode", 2, enum={"A": 0, "B": 1}), Field("n", 4)])
    with pytest.raises(ValueError, match="not a value of"):
        reg.pack(mode=3)
    assert reg.pack(strict=False, mode=3, n=5) == 3 | 5 << 2
    with pytest.raises(ValueError, match=r"must be in \[0, 3\]"):
        reg.pack(strict=False, mode=4)
