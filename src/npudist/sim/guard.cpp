// The simulated NPU's device guard: torch asks it which npu device is current and how many there are.
//
// torch's guard for a PrivateUse1 backend written in Python (torch/csrc/acc/Module.cpp, PythonDeviceGuard)
// reports one device and ignores setDevice, so a tensor on npu:1 could not exist (autograd's engine keeps one
// ready queue per device it is told of). This guard keeps a current device per thread, as a chip runtime does
// (aclrtSetDevice), and reports the simulated host's chips. Streams and events are the host's: work is done
// when it is issued, so every query answers "done". It is registered before torch's Python guard, which then
// stands aside (registerPythonPrivateUse1DeviceGuard registers only where no guard exists). Built by guard.py.

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <atomic>

namespace {

std::atomic<c10::DeviceIndex> device_count{8};
thread_local c10::DeviceIndex current_device = 0;

struct SimGuard final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return c10::DeviceType::PrivateUse1; }

  c10::Device exchangeDevice(c10::Device device) const override {
    c10::Device old = getDevice();
    setDevice(device);
    return old;
  }

  c10::Device getDevice() const override { return c10::Device(type(), current_device); }

  void setDevice(c10::Device device) const override {
    if (device.index() >= 0) {
      current_device = device.index();
    }
  }

  void uncheckedSetDevice(c10::Device device) const noexcept override {
    if (device.index() >= 0) {
      current_device = device.index();
    }
  }

  c10::Stream getStream(c10::Device device) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, device);
  }

  c10::Stream getNewStream(c10::Device device, int priority = 0) const override {
    (void)priority;
    return c10::Stream(c10::Stream::DEFAULT, device);
  }

  c10::Stream exchangeStream(c10::Stream stream) const noexcept override {
    return c10::Stream(c10::Stream::DEFAULT, stream.device());
  }

  c10::DeviceIndex deviceCount() const noexcept override { return device_count.load(); }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag flag) const override {}
  void block(void* event, const c10::Stream& stream) const override {}
  bool queryEvent(void* event) const override { return true; }
  void destroyEvent(void* event, const c10::DeviceIndex device_index) const noexcept override {}
  bool queryStream(const c10::Stream& stream) const override { return true; }
  void synchronizeStream(const c10::Stream& stream) const override {}
};

SimGuard guard;

}  // namespace

extern "C" {

// Registers the guard for PrivateUse1; 0 if one was already registered (then nothing changes).
int npudist_sim_guard_register(int count) {
  if (c10::impl::hasDeviceGuardImpl(c10::DeviceType::PrivateUse1)) {
    return 0;
  }
  device_count.store(static_cast<c10::DeviceIndex>(count));
  c10::impl::registerDeviceGuard(c10::DeviceType::PrivateUse1, &guard);
  return 1;
}

int npudist_sim_guard_current(void) { return current_device; }

void npudist_sim_guard_set(int index) { current_device = static_cast<c10::DeviceIndex>(index); }
}
