"""The program file: what every backend (golden model, RTL simulation, board runtime) loads.

A program is one zip archive (``docs/program.md``) with two members:

``program.json``
    The format version (:data:`FORMAT_VERSION`), the configuration the program was built for
    (every :class:`~npu_spec.config.NPUConfig` field), the base-address table (``base`` and
    ``limit`` in 32-bit words), the task queues (index, priority, network ID, base-table index,
    head and tail word addresses, number of tasks) and the named tensors (name, role, byte
    address in system memory, format, shape, strides in bytes).
``memory.bin``
    The initial system-memory image from byte 0 (descriptors, kernels, inputs, constants);
    bytes beyond its end are zero.

:func:`save` and :func:`load` write and read the file, :func:`check_config` compares the
configuration a program was built for with a build's. Every problem with a file is a
:class:`ProgramError`; a configuration that differs is its subclass
:class:`ConfigMismatchError` (the ``npu`` command exits with status 2 on either).

This module is plain Python (no numpy): a program's tensors are read and written as arrays by
the golden model (:mod:`npu_model.system`) and the compiler.
"""

import io
import json
import zipfile
from dataclasses import dataclass, field, fields

from .config import NPUConfig
from .taskman import BASE_TABLE_SIZE, MAX_QUEUES, PRIORITY_WIDTH, lean_error

__all__ = [
    "FORMAT_VERSION",
    "MEMORY_MEMBER",
    "PROGRAM_MEMBER",
    "ROLES",
    "TENSOR_FORMATS",
    "BaseEntry",
    "ConfigMismatchError",
    "Program",
    "ProgramError",
    "QueueSetup",
    "Tensor",
    "check_config",
    "config_differences",
    "dense_strides",
    "load",
    "save",
]

#: Version of the file format; a file of another version is refused.
FORMAT_VERSION = 1
#: Names of the archive members.
PROGRAM_MEMBER = "program.json"
MEMORY_MEMBER = "memory.bin"
#: Roles of a named tensor: read by the program, written by it, read-only parameters, or
#: working memory (neither read before written nor a result).
ROLES = ("input", "output", "constant", "scratch")
#: Element formats of a tensor in system memory and the bytes an element takes.
TENSOR_FORMATS = {"int8": 1, "fp16": 2}
#: Configuration fields that do not describe the hardware (ignored by :func:`check_config`).
_LABELS = ("name", "target")
#: Configuration fields that choose how the same contract is built (the blocks or the micro
#: build, ``NPUConfig.npu_impl``): a program runs on either, so :func:`check_config` ignores
#: them too.
_BUILD_ONLY = ("npu_impl",)


class ProgramError(ValueError):
    """A program file that cannot be read, or whose content is inconsistent."""


class ConfigMismatchError(ProgramError):
    """The program was built for another configuration; ``differences`` lists
    ``(field, program's value, build's value)``."""

    def __init__(self, differences):
        self.differences = tuple(differences)
        text = "; ".join(f"{name}: program {a!r}, build {b!r}"
                         for name, a, b in self.differences)
        super().__init__(f"the program was built for another configuration ({text})")


def _int(what, value, lo=0, hi=None):
    if not isinstance(value, int) or isinstance(value, bool):
        raise ProgramError(f"{what} must be an integer, not {value!r}")
    if value < lo or (hi is not None and value > hi):
        raise ProgramError(f"{what} must be in [{lo}, {hi if hi is not None else '...'}], "
                           f"not {value!r}")
    return value


@dataclass(frozen=True)
class BaseEntry:
    """An entry of the task manager's base-address table: a network's memory window
    ``[base, base + limit)``, in 32-bit words."""
    base: int
    limit: int

    def __post_init__(self):
        _int("BaseEntry.base", self.base, 0, 0xFFFF_FFFF)
        _int("BaseEntry.limit", self.limit, 0, 0xFFFF_FFFF)


@dataclass(frozen=True)
class QueueSetup:
    """How the host sets up one task queue before it pushes the tasks.

    ``head`` is the word address of the first descriptor, ``tail`` one past the last (0: no
    tail check), ``tasks`` the number of descriptors pushed (``Qi_PUSH``).
    """
    index: int
    priority: int = 0
    network: int = 0
    base_index: int = 0
    head: int = 0
    tail: int = 0
    tasks: int = 0

    def __post_init__(self):
        _int("QueueSetup.index", self.index, 0, MAX_QUEUES - 1)
        _int("QueueSetup.priority", self.priority, 0, (1 << PRIORITY_WIDTH) - 1)
        _int("QueueSetup.network", self.network, 0, 255)
        _int("QueueSetup.base_index", self.base_index, 0, BASE_TABLE_SIZE - 1)
        _int("QueueSetup.head", self.head, 0, 0xFFFF_FFFF)
        _int("QueueSetup.tail", self.tail, 0, 0xFFFF_FFFF)
        _int("QueueSetup.tasks", self.tasks, 0, 0xFFFF)


def dense_strides(shape, fmt):
    """Byte strides of a dense (C order) tensor of ``shape`` in format ``fmt``."""
    size = TENSOR_FORMATS[fmt]
    strides = []
    for n in reversed(shape):
        strides.append(size)
        size *= n
    return tuple(reversed(strides))


@dataclass(frozen=True)
class Tensor:
    """A named tensor in system memory: element ``index`` is at byte
    ``addr + sum(index[k] * strides[k])``, stored as :data:`TENSOR_FORMATS` says (int8 one
    byte, fp16 two bytes little-endian). ``strides`` default to a dense tensor."""
    name: str
    role: str
    addr: int
    format: str
    shape: tuple
    strides: tuple = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ProgramError(f"Tensor name must be a non-empty string, not {self.name!r}")
        if self.role not in ROLES:
            raise ProgramError(f"Tensor {self.name!r}: role must be one of "
                               f"{', '.join(ROLES)}, not {self.role!r}")
        if self.format not in TENSOR_FORMATS:
            raise ProgramError(f"Tensor {self.name!r}: format must be one of "
                               f"{', '.join(TENSOR_FORMATS)}, not {self.format!r}")
        _int(f"Tensor {self.name!r}: addr", self.addr)
        shape = tuple(self.shape)
        for n in shape:
            _int(f"Tensor {self.name!r}: a dimension", n, 1)
        object.__setattr__(self, "shape", shape)
        strides = dense_strides(shape, self.format) if self.strides is None else \
            tuple(self.strides)
        if len(strides) != len(shape):
            raise ProgramError(f"Tensor {self.name!r}: {len(strides)} strides for "
                               f"{len(shape)} dimensions")
        for s in strides:
            _int(f"Tensor {self.name!r}: a stride", s, -(1 << 31), (1 << 31) - 1)
        object.__setattr__(self, "strides", strides)

    @property
    def element_bytes(self):
        return TENSOR_FORMATS[self.format]

    @property
    def extent(self):
        """``(lowest, highest + 1)``: the byte range the tensor's elements occupy."""
        lo = hi = self.addr
        for n, s in zip(self.shape, self.strides):
            if s < 0:
                lo += (n - 1) * s
            else:
                hi += (n - 1) * s
        return lo, hi + self.element_bytes


@dataclass(frozen=True)
class Program:
    """A program: the configuration it was built for, the task manager's setup and the
    initial system memory (``docs/program.md``)."""
    config: NPUConfig
    base_table: tuple = ()
    queues: tuple = ()
    tensors: tuple = ()
    memory: bytes = b""
    metadata: dict = field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.config, NPUConfig):
            raise ProgramError(f"Program.config must be an NPUConfig, not {self.config!r}")
        object.__setattr__(self, "base_table", tuple(self.base_table))
        object.__setattr__(self, "queues", tuple(self.queues))
        object.__setattr__(self, "tensors", tuple(self.tensors))
        object.__setattr__(self, "memory", bytes(self.memory))
        self.check()

    @property
    def memory_bytes(self):
        """Size of the system memory the configuration is built for."""
        return self.config.mem_kib * 1024

    def check(self):
        """:class:`ProgramError` unless the parts are consistent with each other and with the
        configuration."""
        if len(self.base_table) > BASE_TABLE_SIZE:
            raise ProgramError(f"the base-address table has {BASE_TABLE_SIZE} entries, "
                               f"not {len(self.base_table)}")
        for entry in self.base_table:
            if not isinstance(entry, BaseEntry):
                raise ProgramError(f"base-table entries must be BaseEntry, not {entry!r}")
        seen = set()
        for q in self.queues:
            if not isinstance(q, QueueSetup):
                raise ProgramError(f"queues must be QueueSetup, not {q!r}")
            if q.index in seen or q.index >= self.config.task_queues:
                raise ProgramError(f"queue index {q.index} is repeated or beyond the "
                                   f"{self.config.task_queues} queues of the configuration")
            if q.base_index >= len(self.base_table):
                raise ProgramError(f"queue {q.index} uses base-table entry {q.base_index}; "
                                   f"the table has {len(self.base_table)}")
            seen.add(q.index)
        problem = lean_error(self.config, self.base_table, self.queues)
        if problem is not None:
            raise ProgramError(problem)
        if len(self.memory) > self.memory_bytes:
            raise ProgramError(f"the memory image has {len(self.memory)} bytes, the "
                               f"configuration's memory {self.memory_bytes} (mem_kib "
                               f"{self.config.mem_kib})")
        names = set()
        for t in self.tensors:
            if not isinstance(t, Tensor):
                raise ProgramError(f"tensors must be Tensor, not {t!r}")
            if t.name in names:
                raise ProgramError(f"two tensors are named {t.name!r}")
            names.add(t.name)
            lo, hi = t.extent
            if lo < 0 or hi > self.memory_bytes:
                raise ProgramError(f"tensor {t.name!r} (bytes {lo}..{hi - 1}) lies outside "
                                   f"the {self.memory_bytes}-byte system memory")

    def tensor(self, name):
        """The tensor called ``name``; :class:`KeyError` naming the tensors otherwise."""
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(f"no tensor {name!r}; tensors: {', '.join(t.name for t in self.tensors)}")

    def queue(self, index):
        """The setup of queue ``index``."""
        for q in self.queues:
            if q.index == index:
                return q
        raise KeyError(f"no queue {index}")

    def to_json(self):
        """The content of ``program.json`` as a dict."""
        config = {f.name: getattr(self.config, f.name) for f in fields(NPUConfig)}
        config["formats"] = list(config["formats"])
        return {
            "format_version": FORMAT_VERSION,
            "config": config,
            "base_table": [{"base": e.base, "limit": e.limit} for e in self.base_table],
            "queues": [{f.name: getattr(q, f.name) for f in fields(QueueSetup)}
                       for q in self.queues],
            "tensors": [{"name": t.name, "role": t.role, "addr": t.addr, "format": t.format,
                         "shape": list(t.shape), "strides": list(t.strides)}
                        for t in self.tensors],
            "memory_bytes": len(self.memory),
            "metadata": self.metadata,
        }

    @classmethod
    def from_json(cls, doc, memory):
        """The program of a ``program.json`` dict and a memory image; :class:`ProgramError`
        for anything missing, unknown or inconsistent."""
        if not isinstance(doc, dict):
            raise ProgramError(f"{PROGRAM_MEMBER} must hold an object, not {type(doc).__name__}")
        version = doc.get("format_version")
        if version != FORMAT_VERSION:
            raise ProgramError(f"format version {version!r} is not supported (this reader "
                               f"reads version {FORMAT_VERSION})")
        try:
            config = dict(doc["config"])
            known = {f.name for f in fields(NPUConfig)}
            unknown = set(config) - known
            if unknown:
                raise ProgramError(f"unknown configuration fields: {', '.join(sorted(unknown))}")
            config["formats"] = tuple(config.get("formats", ()))
            config = NPUConfig(**config)
            table = [BaseEntry(int(e["base"]), int(e["limit"])) for e in doc["base_table"]]
            queues = [QueueSetup(**q) for q in doc["queues"]]
            tensors = [Tensor(t["name"], t["role"], t["addr"], t["format"], tuple(t["shape"]),
                              tuple(t["strides"])) for t in doc["tensors"]]
        except ProgramError:
            raise
        except (KeyError, TypeError, ValueError) as e:
            raise ProgramError(f"bad {PROGRAM_MEMBER}: {type(e).__name__}: {e}") from None
        if doc.get("memory_bytes", len(memory)) != len(memory):
            raise ProgramError(f"{MEMORY_MEMBER} has {len(memory)} bytes, {PROGRAM_MEMBER} "
                               f"says {doc['memory_bytes']}")
        return cls(config, table, queues, tensors, memory, dict(doc.get("metadata", {})))

    def save(self, path):
        """Write the program file ``path``."""
        save(self, path)


def save(program, path):
    """Write ``program`` to the zip archive ``path`` (``program.json`` and ``memory.bin``)."""
    if not isinstance(program, Program):
        raise TypeError(f"program must be a Program, not {program!r}")
    text = json.dumps(program.to_json(), indent=1)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr(PROGRAM_MEMBER, text)
        z.writestr(MEMORY_MEMBER, program.memory)
    return path


def load(path):
    """The :class:`Program` of the file ``path``; :class:`ProgramError` naming the problem for
    a file that is not a program."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ProgramError(f"cannot read {path}: {e.strerror}") from None
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            names = set(z.namelist())
            for member in (PROGRAM_MEMBER, MEMORY_MEMBER):
                if member not in names:
                    raise ProgramError(f"{path} has no {member}")
            doc = json.loads(z.read(PROGRAM_MEMBER).decode("utf-8"))
            memory = z.read(MEMORY_MEMBER)
    except zipfile.BadZipFile:
        raise ProgramError(f"{path} is not a program file (not a zip archive)") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ProgramError(f"{path}: {PROGRAM_MEMBER} is not valid JSON: {e}") from None
    return Program.from_json(doc, memory)


def config_differences(a, b):
    """``[(field, a's value, b's value)]`` for every hardware field (all but the labels
    ``name`` and ``target`` and the build choice ``npu_impl``) in which configurations ``a``
    and ``b`` differ."""
    return [(f.name, getattr(a, f.name), getattr(b, f.name)) for f in fields(NPUConfig)
            if f.name not in _LABELS + _BUILD_ONLY and getattr(a, f.name) != getattr(b, f.name)]


def check_config(program, config):
    """:class:`ConfigMismatchError` unless ``program`` was built for a configuration with the
    same hardware as ``config`` (the labels ``name`` and ``target`` may differ)."""
    if not isinstance(config, NPUConfig):
        raise TypeError(f"config must be an NPUConfig, not {config!r}")
    differences = config_differences(program.config, config)
    if differences:
        raise ConfigMismatchError(differences)
