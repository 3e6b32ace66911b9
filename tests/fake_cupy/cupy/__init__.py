"""NumPy standing in for CuPy, enough of it for the pipeline's Python to run on the CPU with
dry launches (workbench.families.cupy._launch.record_launches(dry=True)): the launch sequence
and the host's Python cost of a call, no kernel run. Array values are meaningless there.

Only for subprocesses (tests/fake_cupy/run_pipeline.py): it must never reach the process of the
other tests."""
import contextlib as _cl
import time as _time

import numpy as _np
from numpy import *  # noqa: F401,F403

__version__ = "fake"
COUNTS = {}                 # array-op name -> calls (graph nodes CuPy would add: fills, copies, casts)
DATA_S = [0.0]              # seconds NumPy spent moving data in the stand-ins (not the host cost CuPy would have)


class _Ptr:
    __slots__ = ("ptr",)

    def __init__(self, ptr):
        self.ptr = ptr


class ndarray(_np.ndarray):
    """np.ndarray with CuPy's .data.ptr, .get() and .device."""

    @property
    def data(self):
        return _Ptr(self.__array_interface__["data"][0])

    def get(self, stream=None):
        return _np.asarray(self).copy()

    def astype(self, *a, **kw):
        _count("astype")
        t = _time.perf_counter()
        out = _wrap(_np.ndarray.astype(self, *a, **kw))
        DATA_S[0] += _time.perf_counter() - t
        return out

    def fill(self, v):
        _count("fill")
        t = _time.perf_counter()
        _np.ndarray.fill(self, v)
        DATA_S[0] += _time.perf_counter() - t

    def __setitem__(self, key, value):
        _count("setitem")
        t = _time.perf_counter()
        _np.ndarray.__setitem__(self, key, value)
        DATA_S[0] += _time.perf_counter() - t


def _count(name):
    COUNTS[name] = COUNTS.get(name, 0) + 1


def _wrap(a):
    return a.view(ndarray) if isinstance(a, _np.ndarray) and not isinstance(a, ndarray) else a


def _wrapped(fn, name=None):
    def f(*a, **kw):
        if name:
            _count(name)
        t = _time.perf_counter()
        out = _wrap(fn(*a, **kw))
        DATA_S[0] += _time.perf_counter() - t
        return out
    f.__name__ = fn.__name__
    return f


empty = _wrapped(_np.empty)
empty_like = _wrapped(_np.empty_like)
zeros = _wrapped(_np.zeros, "zeros")
zeros_like = _wrapped(_np.zeros_like, "zeros")
full = _wrapped(_np.full, "full")
ones = _wrapped(_np.ones, "full")
arange = _wrapped(_np.arange, "arange")
asarray = _wrapped(_np.asarray)
array = _wrapped(_np.array)
ascontiguousarray = _wrapped(_np.ascontiguousarray)
where = _wrapped(_np.where, "elementwise")
minimum = _wrapped(_np.minimum, "elementwise")
maximum = _wrapped(_np.maximum, "elementwise")
stack = _wrapped(_np.stack, "elementwise")
sort = _wrapped(_np.sort, "sort")
concatenate = _wrapped(_np.concatenate, "copy")


def asnumpy(x, stream=None):
    return _np.asarray(x)


def from_dlpack(x):
    return _wrap(_np.from_dlpack(x))


class _Stream:
    def __init__(self, ptr=0, non_blocking=False):
        self.ptr = ptr

    def __enter__(self):
        _STACK.append(self)
        return self

    def __exit__(self, *a):
        _STACK.pop()
        return False

    def synchronize(self):
        pass

    def wait_event(self, e):
        _count("wait_event")

    def record(self, event=None):
        return event


_NULL = _Stream(0)
_STACK = []
_NEXT = [0x1000]


class _Event:
    def __init__(self, *a, **kw):
        pass

    def record(self, stream=None):
        _count("event_record")

    def synchronize(self):
        pass


def _new_stream(non_blocking=False):
    _NEXT[0] += 16
    return _Stream(_NEXT[0], non_blocking)


class _Device:
    compute_capability = "90"
    attributes = {"MaxSharedMemoryPerBlockOptin": 232448}
    id = 0

    def __init__(self, *a):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


class _Runtime:
    @staticmethod
    def getDeviceCount():
        return 1


class _CompileException(Exception):
    pass


class cuda:  # noqa: N801
    Stream = staticmethod(_new_stream)
    ExternalStream = _Stream
    Event = _Event
    Device = _Device
    runtime = _Runtime
    compiler = type("compiler", (), {"CompileException": _CompileException})

    @staticmethod
    def get_current_stream():
        return _STACK[-1] if _STACK else _NULL

    @staticmethod
    @_cl.contextmanager
    def using_allocator(alloc=None):
        yield


class RawModule:
    def __init__(self, *a, **kw):
        raise RuntimeError("the fake cupy compiles nothing: record launches with dry=True")
