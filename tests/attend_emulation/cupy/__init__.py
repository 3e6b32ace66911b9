"""numpy standing in for cupy (CPU harness for the attend wrappers only)."""
import numpy as _np
from numpy import *  # noqa
ndarray = _np.ndarray
def asnumpy(x): return _np.asarray(x)
def from_dlpack(x): return _np.from_dlpack(x)
class _S:
    ptr = 0
    def __enter__(self): return self
    def __exit__(self, *a): return False
    def synchronize(self): pass
class cuda:
    @staticmethod
    def get_current_stream(): return _S()
    ExternalStream = lambda ptr: _S()
    class runtime:
        @staticmethod
        def getDeviceCount(): return 1
    class Device:
        compute_capability = "90"
        attributes = {"MaxSharedMemoryPerBlockOptin": 232448}
        mem_info = (64 << 30, 141 << 30)
    class Event: pass
bool_ = _np.bool_
