"""Stand-ins for ``pynvml``, for the meters that take one (the bench's energy, the sweep's device busy share)."""


class FakeNvml:
    """Two GPUs, each 40 % busy, whose energy counters advance 1500 and 500 mJ per reading."""

    class Rates:
        gpu = 40

    def __init__(self):
        self.readings = [0, 0]

    def nvmlInit(self):
        pass

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetName(self, handle):
        return b"Fake GPU"

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        self.readings[handle] += (1500, 500)[handle]
        return self.readings[handle]

    def nvmlDeviceGetUtilizationRates(self, handle):
        return self.Rates()


class NoNvml:
    """A host without NVML: its library is not there."""

    def nvmlInit(self):
        raise OSError("NVML Shared Library Not Found")
