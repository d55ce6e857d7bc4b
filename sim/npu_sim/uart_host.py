"""The host side of the board bridge (``docs/bridge.md``, ``npu_spec.bridge``).

* Framing: :func:`encode_write`, :func:`encode_read`, :func:`decode_words`, and the conversion
  of byte images to the bridge's 32-bit words (:func:`words_of`, :func:`bytes_of`).
* :class:`BridgeModel`: what the bridge does with a byte stream, in plain Python (the
  reference the gateware is compared with, and a stand-in for a board in host tests).
* :class:`BridgeClient`: a host talking to a board through a serial port (pyserial), with
  timeouts and clear errors (:class:`BridgeError`).
* The bit-level line model for simulation: :func:`line_bits` and the async testbench helpers
  :func:`uart_send` and :func:`uart_receive`, which drive and sample a UART pin of a design
  at any (also fractional, i.e. mistuned) number of clock cycles per bit.
"""

import time

from npu_spec.bridge import (
    BRIDGE,
    BRIDGE_REGS_BASE,
    DEFAULT_BAUD,
    DEFAULT_TIMEOUT_BITS,
    MAX_WORDS,
    NPU_REGS_BASE,
    Command,
    Region,
    frame_region,
    is_fixed,
    is_read,
    regions,
)

__all__ = ["BridgeClient", "BridgeError", "BridgeModel", "bytes_of", "decode_words",
           "encode_frame", "encode_read", "encode_write", "line_bits", "uart_receive",
           "uart_send", "words_of"]


# --- Framing -------------------------------------------------------------------------------

def _check_address(address):
    if not isinstance(address, int) or not 0 <= address < 1 << 32:
        raise ValueError(f"word address must be a 32-bit unsigned integer, not {address!r}")


def encode_frame(command, address, length, words=()):
    """The bytes of one frame: command, length, big-endian word address, big-endian words."""
    command = Command(command)
    _check_address(address)
    if not isinstance(length, int) or not 0 <= length <= MAX_WORDS:
        raise ValueError(f"a frame has 0 to {MAX_WORDS} words, not {length!r}")
    words = list(words)
    if is_read(command) and words:
        raise ValueError("a read frame carries no data words")
    if not is_read(command) and len(words) != length:
        raise ValueError(f"a write frame of length {length} needs {length} words, "
                         f"not {len(words)}")
    out = bytearray([command, length]) + address.to_bytes(4, "big")
    for w in words:
        if not isinstance(w, int) or not 0 <= w < 1 << 32:
            raise ValueError(f"data words are 32-bit unsigned integers, not {w!r}")
        out += w.to_bytes(4, "big")
    return bytes(out)


def encode_write(address, words, *, fixed=False):
    """One write frame of up to 255 words at word ``address``."""
    words = list(words)
    return encode_frame(Command.WRITE_FIXED if fixed else Command.WRITE, address, len(words),
                        words)


def encode_read(address, count, *, fixed=False):
    """One read frame of ``count`` words at word ``address``."""
    return encode_frame(Command.READ_FIXED if fixed else Command.READ, address, count)


def decode_words(data):
    """The 32-bit words of a read's answer (big-endian on the wire)."""
    if len(data) % 4:
        raise ValueError(f"an answer is a whole number of 4-byte words, not {len(data)} bytes")
    return [int.from_bytes(data[k:k + 4], "big") for k in range(0, len(data), 4)]


def words_of(image):
    """The 32-bit words of a memory image: byte ``4 k + j`` is byte ``j`` (little-endian) of
    word ``k``; a partial last word is padded with zeros."""
    image = bytes(image)
    if len(image) % 4:
        image += bytes(4 - len(image) % 4)
    return [int.from_bytes(image[k:k + 4], "little") for k in range(0, len(image), 4)]


def bytes_of(words):
    """The memory bytes of 32-bit words (the inverse of :func:`words_of`)."""
    return b"".join(int(w).to_bytes(4, "little") for w in words)


# --- The reference model -------------------------------------------------------------------

class BridgeModel:
    """The bridge's frame handling in plain Python: feed it bytes, it answers bytes.

    It holds ``mem_bytes`` of system memory and a dictionary of host registers (``regs``,
    word address to value; reads of a missing register give 0). The idle timeout is modelled
    by :meth:`idle` (the line was idle for the timeout). Framing errors are not modelled.
    """

    def __init__(self, mem_bytes, *, memory=None, regs=None):
        regions(mem_bytes)                  # checks the size
        self.mem_bytes = mem_bytes
        self.memory = bytearray(memory if memory is not None else bytes(mem_bytes))
        if len(self.memory) != mem_bytes:
            raise ValueError(f"memory must have {mem_bytes} bytes, not {len(self.memory)}")
        self.regs = dict(regs or {})
        self.status = {f.name: 0 for f in BRIDGE["STATUS"].fields}
        self.frames = 0
        self._pending = bytearray()
        self._dropping = False

    def idle(self):
        """The line was idle for the timeout: a partial frame is dropped."""
        if self._pending:
            self.status["timeout"] = 1
        self._pending.clear()
        self._dropping = False

    def feed(self, data):
        """Bytes from the host; returns the bytes the bridge answers."""
        out = bytearray()
        for b in bytes(data):
            if self._dropping:
                continue
            self._pending.append(b)
            out += self._step()
        return bytes(out)

    def _step(self):
        p = self._pending
        if p[0] not in {int(c) for c in Command}:
            self.status["command"] = 1
            self._dropping = True
            p.clear()
            return b""
        if len(p) < 6:
            return b""
        command, length = Command(p[0]), p[1]
        address = int.from_bytes(p[2:6], "big")
        if not is_read(command) and len(p) < 6 + 4 * length:
            return b""
        words = decode_words(bytes(p[6:]))
        p.clear()
        answer = self._frame(command, address, length, words)
        # A frame is counted once it is done (a read of FRAMES does not count itself).
        self.frames = (self.frames + 1) & 0xFFFF
        return answer

    def _frame(self, command, address, length, words):
        if length == 0:
            return b""
        region = frame_region(self.mem_bytes, command, address, length)
        if region is None:
            self.status["range"] = 1
            return bytes(4 * length) if is_read(command) else b""
        step = 0 if is_fixed(command) else 1
        answer = []
        for k in range(length):
            a = address + k * step
            if is_read(command):
                answer.append(self._read(region, a))
            else:
                self._write(region, a, words[k])
        return b"".join(w.to_bytes(4, "big") for w in answer)

    def _read(self, region, a):
        if region == Region.MEMORY:
            return int.from_bytes(self.memory[4 * a:4 * a + 4], "little")
        if region == Region.NPU:
            return self.regs.get(a - NPU_REGS_BASE, 0)
        reg = a - BRIDGE_REGS_BASE
        if reg == BRIDGE["STATUS"].offset:
            return BRIDGE["STATUS"].pack(**self.status)
        if reg == BRIDGE["FRAMES"].offset:
            return self.frames
        return 0

    def _write(self, region, a, value):
        if region == Region.MEMORY:
            self.memory[4 * a:4 * a + 4] = value.to_bytes(4, "little")
        elif region == Region.NPU:
            self.regs[a - NPU_REGS_BASE] = value
        elif a - BRIDGE_REGS_BASE == BRIDGE["STATUS"].offset:
            clear = BRIDGE["STATUS"].unpack(value, strict=False)
            for name, bit in clear.items():
                if bit:
                    self.status[name] = 0


# --- The host client -----------------------------------------------------------------------

class BridgeError(RuntimeError):
    """The board did not answer as the bridge should (timeout, short answer, bad identity,
    an error flag of the bridge)."""


class BridgeClient:
    """A host talking to a board's bridge over a serial port.

    Parameters
    ----------
    port : object
        A byte transport with pyserial's ``write(bytes)``, ``read(n)`` (returning fewer bytes
        when its own timeout passes) and, optionally, ``reset_input_buffer()``; normally a
        ``serial.Serial`` from :meth:`open`.
    timeout : float
        Seconds to wait for the whole answer of a read.
    name : str
        The device name, for messages.
    baud : int
        The baud rate, for messages and for the resynchronisation delay.
    idle_bits : int
        The bridge's idle timeout in bit times (:meth:`resync` waits a little longer).

    Every frame is written with one ``write`` call, so the bytes of a frame leave back to back
    (the bridge drops a frame that pauses for its idle timeout). A write is not answered; use
    ``verify=True`` (a read back) or :meth:`status` to confirm it.
    """

    def __init__(self, port, *, timeout=1.0, name="serial port", baud=DEFAULT_BAUD,
                 idle_bits=DEFAULT_TIMEOUT_BITS):
        self.port = port
        self.timeout = timeout
        self.name = name
        self.baud = baud
        self.idle_bits = idle_bits

    @classmethod
    def open(cls, device, baud=DEFAULT_BAUD, *, timeout=1.0, idle_bits=DEFAULT_TIMEOUT_BITS):
        """Open ``device`` with pyserial (8N1, no flow control)."""
        try:
            import serial
        except ImportError:
            raise BridgeError("pyserial is not installed (pip install pyserial==3.5)") from None
        try:
            port = serial.Serial(device, baud, timeout=min(timeout, 0.1))
        except (serial.SerialException, OSError, ValueError) as exc:
            raise BridgeError(f"cannot open {device} at {baud} baud: {exc}") from None
        return cls(port, timeout=timeout, name=device, baud=baud, idle_bits=idle_bits)

    def close(self):
        close = getattr(self.port, "close", None)
        if close:
            close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # Frames.
    def _send(self, frame):
        try:
            self.port.write(frame)
        except OSError as exc:
            raise BridgeError(f"writing to {self.name} failed: {exc}") from None

    def _receive(self, n, what):
        data = bytearray()
        deadline = time.monotonic() + self.timeout
        while len(data) < n:
            try:
                chunk = self.port.read(n - len(data))
            except OSError as exc:
                raise BridgeError(f"reading from {self.name} failed: {exc}") from None
            data += chunk
            if not chunk and time.monotonic() >= deadline:
                raise BridgeError(
                    f"timeout: {what} answered {len(data)} of {n} bytes in {self.timeout:g} s "
                    f"on {self.name}; is the board programmed with the bridge, at "
                    f"{self.baud} baud?")
        return bytes(data)

    def write_words(self, address, words, *, fixed=False):
        """Write 32-bit words from word ``address`` (frames of at most 255 words)."""
        words = list(words)
        for k in range(0, len(words), MAX_WORDS):
            chunk = words[k:k + MAX_WORDS]
            self._send(encode_write(address if fixed else address + k, chunk, fixed=fixed))

    def read_words(self, address, count, *, fixed=False):
        """Read ``count`` 32-bit words from word ``address``."""
        out = []
        for k in range(0, count, MAX_WORDS):
            n = min(MAX_WORDS, count - k)
            a = address if fixed else address + k
            self._send(encode_read(a, n, fixed=fixed))
            out += decode_words(self._receive(4 * n, f"the read of {n} words at word "
                                              f"{a:#010x}"))
        return out

    # System memory (byte addresses, multiples of 4).
    def write_mem(self, byte_address, data, *, verify=False):
        """Write ``data`` to system memory at ``byte_address`` (a multiple of 4; a partial last
        word is padded with zeros). ``verify`` reads it back and compares."""
        if byte_address % 4:
            raise ValueError(f"memory byte address must be a multiple of 4, not {byte_address}")
        words = words_of(data)
        self.write_words(byte_address // 4, words)
        if verify:
            back = self.read_words(byte_address // 4, len(words))
            if back != words:
                bad = next(k for k, (a, b) in enumerate(zip(words, back)) if a != b)
                raise BridgeError(f"memory check failed at byte {byte_address + 4 * bad:#x}: "
                                  f"wrote {words[bad]:#010x}, read {back[bad]:#010x}")

    def read_mem(self, byte_address, nbytes):
        """``nbytes`` of system memory from ``byte_address`` (a multiple of 4)."""
        if byte_address % 4:
            raise ValueError(f"memory byte address must be a multiple of 4, not {byte_address}")
        return bytes_of(self.read_words(byte_address // 4, -(-nbytes // 4)))[:nbytes]

    # NPU host registers (word addresses of docs/registers.md).
    def write_reg(self, reg, value):
        self.write_words(NPU_REGS_BASE + reg, [value & 0xFFFF_FFFF])

    def read_reg(self, reg):
        return self.read_words(NPU_REGS_BASE + reg, 1)[0]

    # The bridge's own registers.
    def status(self):
        """The bridge's flags and frame count: ``{flag: 0 or 1, ..., "frames": n}``."""
        st, frames = self.read_words(BRIDGE_REGS_BASE + BRIDGE["STATUS"].offset, 2)
        out = BRIDGE["STATUS"].unpack(st, strict=False)
        out["frames"] = BRIDGE["FRAMES"].unpack(frames, strict=False)["count"]
        return out

    def clear_status(self):
        self.write_words(BRIDGE_REGS_BASE + BRIDGE["STATUS"].offset,
                         [BRIDGE["STATUS"].write_mask])

    def check_status(self):
        """:class:`BridgeError` naming the flags if any is set (they are then cleared)."""
        st = self.status()
        flags = [name for name, v in st.items() if name != "frames" and v]
        if flags:
            self.clear_status()
            raise BridgeError(f"the bridge on {self.name} reports: {', '.join(flags)} "
                              f"(docs/bridge.md)")

    def identify(self):
        """Check the NPU answers (``NPU_INFO.ID``); returns ``(major, minor)`` of its register
        interface."""
        from npu_spec.registers import MAGIC, NPU_INFO
        magic = self.read_reg(NPU_INFO["ID"].offset)
        if magic != MAGIC:
            raise BridgeError(f"the device on {self.name} is not this NPU: ID reads "
                              f"{magic:#010x}, expected {MAGIC:#010x}")
        v = NPU_INFO["VERSION"].unpack(self.read_reg(NPU_INFO["VERSION"].offset))
        return v["major"], v["minor"]

    def resync(self):
        """Bring the bridge back to the start of a frame: stay quiet for longer than its idle
        timeout, then drop whatever the port received."""
        time.sleep(1.5 * self.idle_bits / self.baud + 0.01)
        reset = getattr(self.port, "reset_input_buffer", None)
        if reset:
            reset()


# --- The line, bit by bit (simulation) -----------------------------------------------------

async def _ticks(ctx, n):
    # Plain ticks (not ``repeat``), so a background testbench may be left waiting here.
    for _ in range(n):
        await ctx.tick()


def line_bits(byte, *, stop=1):
    """Levels of one byte on the line: start bit, 8 data bits (LSB first), stop bit."""
    return [0] + [(byte >> k) & 1 for k in range(8)] + [stop]


async def uart_send(ctx, pin, data, cycles_per_bit, *, gap_bits=0, bad_stop=()):
    """Drive ``pin`` with ``data`` at ``cycles_per_bit`` clock cycles per bit (a float gives a
    mistuned rate: bit edges fall at the nearest cycle). ``gap_bits`` of idle line follow each
    byte; the bytes whose indices are in ``bad_stop`` get a low stop bit."""
    t = 0.0
    now = 0
    for i, byte in enumerate(bytes(data)):
        levels = line_bits(byte, stop=0 if i in bad_stop else 1) + [1] * gap_bits
        for level in levels:
            ctx.set(pin, level)
            t += cycles_per_bit
            edge = round(t)
            await _ticks(ctx, edge - now)
            now = edge
    ctx.set(pin, 1)


async def uart_receive(ctx, pin, count, cycles_per_bit, *, timeout):
    """Sample ``count`` bytes from ``pin`` (idle high) in the middle of each bit, at
    ``cycles_per_bit`` (a float for a mistuned host); raises :class:`BridgeError` on a low stop
    bit or when no start bit comes for ``timeout`` cycles."""
    out = bytearray()
    for _ in range(count):
        waited = 0
        while ctx.get(pin):
            await ctx.tick()
            waited += 1
            if waited > timeout:
                raise BridgeError(f"no start bit for {timeout} cycles after {len(out)} bytes")
        # The start edge was at most a cycle ago: sample bit k at (k + 0.5) bit times from it.
        now = 0
        levels = []
        for k in range(10):
            at = max(now + 1, round((k + 0.5) * cycles_per_bit))
            await _ticks(ctx, at - now)
            now = at
            levels.append(ctx.get(pin))
        if levels[0]:
            raise BridgeError(f"a start bit shorter than half a bit in byte {len(out)}")
        if not levels[9]:
            raise BridgeError(f"low stop bit in byte {len(out)}")
        out.append(sum(bit << k for k, bit in enumerate(levels[1:9])))
    return bytes(out)
