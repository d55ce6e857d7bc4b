"""The host side of the board bridge (``npu_sim.uart_host``): framing, the reference model,
and the client's errors and timeouts on a stand-in port and on a real pyserial port."""

import pytest

from npu_sim.uart_host import (
    BridgeClient,
    BridgeError,
    BridgeModel,
    bytes_of,
    decode_words,
    encode_frame,
    encode_read,
    encode_write,
    words_of,
)
from npu_spec.bridge import (
    BRIDGE_REGS_BASE,
    NPU_REGS_BASE,
    Command,
    Region,
    baud_divisor,
    frame_region,
)
from npu_spec.registers import MAGIC, NPU_INFO, VERSION_MAJOR, VERSION_MINOR


def test_frame_bytes():
    # LiteX's framing: command, length, big-endian word address, big-endian words.
    assert encode_write(0x0102_0304, [0xA0B0_C0D0]) == bytes.fromhex("01 01 01020304 A0B0C0D0")
    assert encode_read(0x10, 2) == bytes.fromhex("02 02 00000010")
    assert encode_read(0x10, 3, fixed=True) == bytes.fromhex("04 03 00000010")
    assert encode_write(7, [1, 2], fixed=True)[:2] == b"\x03\x02"
    assert decode_words(bytes.fromhex("00000001 FFFFFFFE")) == [1, 0xFFFF_FFFE]


@pytest.mark.parametrize("call,message", [
    (lambda: encode_read(0, 256), "0 to 255 words"),
    (lambda: encode_write(1 << 32, [0]), "32-bit"),
    (lambda: encode_write(0, [1 << 32]), "32-bit"),
    (lambda: encode_frame(Command.WRITE, 0, 2, [1]), "needs 2 words"),
    (lambda: encode_frame(Command.READ, 0, 1, [1]), "no data"),
    (lambda: decode_words(b"abc"), "4-byte"),
])
def test_framing_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_words_are_little_endian_memory():
    assert words_of(b"\x01\x02\x03\x04\x05") == [0x0403_0201, 0x05]
    assert bytes_of([0x0403_0201]) == b"\x01\x02\x03\x04"


def test_regions():
    assert frame_region(64, Command.WRITE, 0, 16) == Region.MEMORY
    assert frame_region(64, Command.WRITE, 1, 16) is None
    assert frame_region(64, Command.READ_FIXED, 15, 255) == Region.MEMORY
    assert frame_region(64, Command.READ, NPU_REGS_BASE + 0xFFFF, 1) == Region.NPU
    assert frame_region(64, Command.READ, NPU_REGS_BASE + 0xFFFF, 2) is None
    assert frame_region(64, Command.READ, BRIDGE_REGS_BASE, 2) == Region.BRIDGE
    assert frame_region(64, Command.READ, 0, 0) is None


def test_baud_divisor_message():
    with pytest.raises(ValueError, match="divisor 8 gives 3125000 baud, 4.2% off"):
        baud_divisor(25e6, 3e6)


class ModelPort:
    """A stand-in serial port: a :class:`BridgeModel` behind ``write``/``read``."""

    def __init__(self, model, *, mute=False):
        self.model = model
        self.mute = mute
        self.pending = bytearray()
        self.writes = []

    def write(self, data):
        self.writes.append(bytes(data))
        answer = self.model.feed(data)
        if not self.mute:
            self.pending += answer

    def read(self, n):
        out, self.pending = bytes(self.pending[:n]), self.pending[n:]
        return out


def client(mem=4096, **kwargs):
    regs = {NPU_INFO["ID"].offset: MAGIC,
            NPU_INFO["VERSION"].offset: VERSION_MAJOR << 16 | VERSION_MINOR}
    port = ModelPort(BridgeModel(mem, regs=regs), **kwargs)
    return BridgeClient(port, timeout=0.05, name="model"), port


def test_client_memory_registers_and_status():
    c, port = client()
    data = bytes(range(256)) * 5            # 1280 bytes: more than one frame of 255 words
    c.write_mem(64, data, verify=True)
    assert c.read_mem(64, len(data)) == data
    assert c.read_mem(66 - 2, 3) == data[:3]
    assert all(len(w) <= 6 + 4 * 255 for w in port.writes)
    assert c.identify() == (VERSION_MAJOR, VERSION_MINOR)
    c.write_reg(NPU_INFO["SCRATCH"].offset, 0x1234)
    assert c.read_reg(NPU_INFO["SCRATCH"].offset) == 0x1234
    st = c.status()
    assert not any(v for k, v in st.items() if k != "frames") and st["frames"] > 5
    c.check_status()


def test_client_reports_bridge_errors():
    c, _ = client(mem=64)
    c.write_words(15, [1, 2])               # runs past the end: the bridge drops it
    with pytest.raises(BridgeError, match="reports: range"):
        c.check_status()
    c.check_status()                        # cleared


def test_client_errors():
    c, _ = client(mute=True)
    with pytest.raises(BridgeError, match=r"timeout: the read of 2 words at word 0x00000000 "
                                          r"answered 0 of 8 bytes in 0.05 s on model"):
        c.read_words(0, 2)
    with pytest.raises(ValueError, match="multiple of 4"):
        c.read_mem(2, 4)

    c, port = client()
    port.model.regs[NPU_INFO["ID"].offset] = 0x1234
    with pytest.raises(BridgeError, match="is not this NPU: ID reads 0x00001234"):
        c.identify()


def test_verify_catches_a_corrupted_write():
    """The framing has no check of its own: a bit flipped on the line in a data byte goes
    unnoticed by the bridge; ``verify`` reads back and notices."""
    c, port = client()
    write = port.write

    def flip_first(data):
        port.write = write
        data = bytearray(data)
        data[-1] ^= 0x10
        write(bytes(data))

    port.write = flip_first
    with pytest.raises(BridgeError, match="memory check failed at byte 0x10: wrote "
                                          "0x04030201, read 0x04030211"):
        c.write_mem(16, b"\x01\x02\x03\x04", verify=True)


def test_pyserial_port_errors():
    serial = pytest.importorskip("serial")
    with pytest.raises(BridgeError, match="cannot open /nonexistent/ttyUSB9 at 1000000 baud"):
        BridgeClient.open("/nonexistent/ttyUSB9")
    # A loopback port answers a read frame with its own 6 bytes: short of 8, a timeout.
    port = serial.serial_for_url("loop://", timeout=0.01)
    c = BridgeClient(port, timeout=0.1, name="loop://")
    with pytest.raises(BridgeError, match="answered 6 of 8 bytes"):
        c.read_words(0, 2)
    c.close()
