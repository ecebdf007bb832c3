"""What a worker's devices are doing, sampled per call: NVML on GPUs, the process on CPUs.

    sampler = DeviceSampler(["gpu:0"])           # the worker's devices, as its spans name them
    sampler.sample()   # GPU: {"device/gpu_util/gpu:0": 87.0, "device/memory_gb/gpu:0": 31.2,
                       #       "device/memory_total_gb/gpu:0": 139.8}
                       # CPU: {"device/cpu_util/cpu:0": 97.5, "device/memory_gb/cpu:0": 1.4}

GPUs are read from NVML (nvidia-ml-py): utilization is the driver's percent of time a kernel
ran over its last sample period (1/6 s to 1 s, by GPU); memory is what the whole GPU holds,
every process on it included. The worker's i-th device is the i-th GPU it can see:
CUDA_VISIBLE_DEVICES (set by Ray to the GPUs of the actor's bundle) lists them by NVML index
or UUID; unset, all of them in NVML order.

Where NVML cannot start (no NVIDIA driver, no library) or the process sees no GPU, the
devices are sampled as the worker's process: its CPU time over wall time since the
previous call (100 = one core busy; threads can take it past 100), and its resident memory.
That is also what a "gpu:k" device is on a CPU box, where Ray's GPUs are only logical. A
process holding several logical devices is sampled once and its CPU time split evenly
among them; each reports the process's whole resident memory. The logical devices are
those of every sampler alive in the process: a rollout worker on a thread of its own beside
the learner (placement.overlap_threads) has a device of its own, and the two split it
evenly (what each thread used is not told apart: with overlap_share = "idle" the learner
takes most of it).

Pure: no Ray, no torch. ``nvml_error`` says why a sampler is on the CPU path.
"""

from __future__ import annotations

import os
import time
import weakref
from types import ModuleType

import psutil

from engine import metrics as M

GB = 1e9


_LIVE: weakref.WeakSet = weakref.WeakSet()   # every DeviceSampler of this process


def _load_nvml() -> tuple[ModuleType | None, str | None]:
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return None, f"NVML did not start: {exc}"
    return pynvml, None


def _visible_gpus(nvml: ModuleType) -> list:
    """NVML handles of the GPUs this process can see, in CUDA's order for it."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    handles = []
    for entry in (e.strip() for e in visible.split(",")):
        if not entry:
            continue
        if entry.isdigit():
            handles.append(nvml.nvmlDeviceGetHandleByIndex(int(entry)))
        else:                               # GPU-<uuid> / MIG-<uuid>
            handles.append(nvml.nvmlDeviceGetHandleByUUID(entry))
    return handles


class DeviceSampler:
    """The devices of one worker (module docstring)."""

    def __init__(self, devices: list[str], nvml: ModuleType | None = None):
        """``devices``: the worker's device names (its SpanRecorder's). ``nvml``: an
        initialized pynvml-like module; by default pynvml, started here. Only "gpu:k"
        devices are read from NVML; a "cpu:k" device is always the process, also on a GPU
        machine (a CPU learner or reward worker there must not report GPU 0 as its own)."""
        self.devices = list(devices)
        self.gpu_devices = [d for d in self.devices if d.startswith("gpu")]
        self.nvml_error: str | None = None
        if self.gpu_devices and nvml is None:
            nvml, self.nvml_error = _load_nvml()
        elif not self.gpu_devices:
            self.nvml_error = "no GPU among this worker's devices"
            nvml = None
        self._nvml, self._gpus = nvml, []
        if nvml is not None:
            self._gpus = _visible_gpus(nvml)
            if not self._gpus:
                self.nvml_error = "NVML started, but this process sees no GPU"
            elif len(self._gpus) < len(self.gpu_devices):
                self.nvml_error = (f"{len(self.gpu_devices)} GPU devices but "
                                   f"{len(self._gpus)} visible GPUs")
            if self.nvml_error:
                self._gpus = []
        self._process = psutil.Process()
        self._last = self._cpu_clock()
        _LIVE.add(self)

    @property
    def on_gpu(self) -> bool:
        return bool(self._gpus)

    def _cpu_clock(self) -> tuple[float, float]:
        t = self._process.cpu_times()
        return time.monotonic(), t.user + t.system

    def sample(self) -> dict[str, float]:
        if not self.on_gpu:
            return self._sample_process(self.devices)
        out = self._sample_gpus()
        cpus = [d for d in self.devices if d not in self.gpu_devices]
        return {**out, **self._sample_process(cpus)} if cpus else out

    def _sample_gpus(self) -> dict[str, float]:
        nvml, out = self._nvml, {}
        for device, handle in zip(self.gpu_devices, self._gpus, strict=False):
            util = nvml.nvmlDeviceGetUtilizationRates(handle)
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            out[M.DEVICE_GPU_UTIL.of(device=device)] = float(util.gpu)
            out[M.DEVICE_MEMORY_GB.of(device=device)] = mem.used / GB
            out[M.DEVICE_MEMORY_TOTAL_GB.of(device=device)] = mem.total / GB
        return out

    def _sample_process(self, devices: list[str]) -> dict[str, float]:
        wall0, cpu0 = self._last
        self._last = wall1, cpu1 = self._cpu_clock()
        here = {d for sampler in list(_LIVE) for d in sampler.devices
                if not sampler.on_gpu or d not in sampler.gpu_devices}
        share = 100.0 * (cpu1 - cpu0) / max(wall1 - wall0, 1e-9) / max(len(here | set(devices)), 1)
        rss = self._process.memory_info().rss / GB
        out = {}
        for device in devices:
            out[M.DEVICE_CPU_UTIL.of(device=device)] = share
            out[M.DEVICE_MEMORY_GB.of(device=device)] = rss
        return out
