"""DeviceSampler: a worker's devices as metrics, from NVML on GPUs and the process on CPU."""

import time
from types import SimpleNamespace

from engine.telemetry.devices import DeviceSampler


def busy(seconds: float) -> int:
    end, n = time.process_time() + seconds, 0
    while time.process_time() < end:
        n += 1
    return n


def test_a_cpu_worker_reports_its_process_cpu_share_after_busy_work():
    sampler = DeviceSampler(["cpu:0"])
    busy(0.3)
    m = sampler.sample()
    assert m["device/cpu_util/cpu:0"] > 10.0              # a busy core, shared with others
    assert 0.01 < m["device/memory_gb/cpu:0"] < 64


def test_each_sample_covers_the_time_since_the_previous_one():
    sampler = DeviceSampler(["cpu:0"])
    busy(0.2)
    sampler.sample()
    time.sleep(0.3)
    assert sampler.sample()["device/cpu_util/cpu:0"] < 20.0   # asleep since the last call


def test_one_process_holding_two_devices_splits_its_cpu_time_between_them():
    sampler = DeviceSampler(["cpu:0", "cpu:1"])
    busy(0.2)
    m = sampler.sample()
    assert m["device/cpu_util/cpu:0"] == m["device/cpu_util/cpu:1"] > 0


def test_without_an_nvidia_driver_a_gpu_named_device_falls_back_to_the_process(monkeypatch):
    import pynvml

    def no_driver():                      # what nvmlInit raises where no driver is loaded
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_driver)
    sampler = DeviceSampler(["gpu:0"])                 # Ray's logical GPU on a CPU box
    assert not sampler.on_gpu and "NVML did not start" in sampler.nvml_error
    busy(0.1)
    assert set(sampler.sample()) == {"device/cpu_util/gpu:0", "device/memory_gb/gpu:0"}


class FakeNvml:
    """The three pynvml calls the sampler makes, over two GPUs (a unit test's seam)."""

    def __init__(self):
        self.gpus = {0: ("GPU-aaa", 35, 10e9), 1: ("GPU-bbb", 90, 70e9)}

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetHandleByUUID(self, uuid):
        return next(i for i, g in self.gpus.items() if g[0] == uuid)

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=self.gpus[h][1], memory=0)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=self.gpus[h][2], total=141e9, free=141e9 - self.gpus[h][2])


def test_gpus_are_the_ones_cuda_visible_devices_names_in_its_order(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")            # Ray gave this actor GPU 1
    m = DeviceSampler(["gpu:3"], nvml=FakeNvml()).sample()
    assert m == {"device/gpu_util/gpu:3": 90.0, "device/memory_gb/gpu:3": 70.0,
                 "device/memory_total_gb/gpu:3": 141.0}
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-bbb,GPU-aaa")
    m = DeviceSampler(["gpu:0", "gpu:1"], nvml=FakeNvml()).sample()
    assert m["device/gpu_util/gpu:0"] == 90.0 and m["device/gpu_util/gpu:1"] == 35.0


def test_a_process_that_sees_no_gpu_is_sampled_as_a_process(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    sampler = DeviceSampler(["gpu:0"], nvml=FakeNvml())
    assert not sampler.on_gpu and "sees no GPU" in sampler.nvml_error
    assert "device/cpu_util/gpu:0" in sampler.sample()


def test_a_cpu_device_on_a_gpu_machine_is_its_process_not_gpu_0(monkeypatch):
    """gpu-check on an H200 found a CPU worker reporting GPU 0's NVML numbers as its own."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    m = DeviceSampler(["cpu:0"], nvml=FakeNvml()).sample()
    assert set(m) == {"device/cpu_util/cpu:0", "device/memory_gb/cpu:0"}
    mixed = DeviceSampler(["gpu:0", "cpu:0"], nvml=FakeNvml()).sample()
    assert mixed["device/gpu_util/gpu:0"] == 35.0 and "device/cpu_util/cpu:0" in mixed
    assert "device/gpu_util/cpu:0" not in mixed
