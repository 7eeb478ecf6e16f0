// The process-group watch: every collective issued on any process group of this process, counted per group.
//
// torch's collectives all pass through the dispatcher as c10d ops (torch/csrc/distributed/c10d/Ops.cpp:
// ProcessGroup::allreduce and its siblings call c10d::allreduce_ and the like, whoever calls them: the
// Python API, DDP's C++ reducer, FSDP2) or as functional collectives (_c10d_functional::*, DTensor and
// torch.compile). Those ops have kernels for the device keys only, so a kernel on the Autograd keys runs
// first on every call; it counts the call, redispatches below autograd (what the default autograd
// fallback does for these ops) and counts the completion from the call's Work future. The caller pays a few
// atomic increments; the watchdog thread reads the counters once a period (snapshot()).
//
// Per group: calls entered and completed (point-to-point apart, since only two ranks of a group take part
// in one), the last op, its payload bytes and when it started. A functional collective is counted as the
// c10d call it makes, once; calls made inside a tensor subclass's __torch_dispatch__ (DTensor's own
// redistributions, an AsyncCollectiveTensor's wait) run with every key above the backend's excluded and are
// not seen here.

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/library.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

constexpr int64_t kSlots = 64;  // groups counted apart; later groups share the last slot
constexpr int64_t kFields = 8;

struct Slot {
  std::atomic<int64_t> entered{0}, done{0}, p2p_entered{0}, p2p_done{0}, op{-1}, bytes{0}, since_ns{0};
};

Slot g_slots[kSlots];
std::string g_names[kSlots];
std::atomic<int64_t> g_used{0}, g_latest{-1}, g_total{0}, g_waits{0};
std::mutex g_mu;
// Time during which at least one collective (or a functional collective's wait) was in flight on this rank:
// the fast ranks of a synchronous job spend the straggler's extra time there, the straggler does not.
std::mutex g_busy_mu;
int64_t g_inflight = 0, g_busy_since_ns = 0, g_busy_total_ns = 0;
std::unordered_map<const void*, int64_t> g_by_pg;
std::unordered_map<std::string, int64_t> g_by_name;
std::unordered_map<const void*, int64_t> g_op_index;
std::vector<std::string> g_op_names;

enum Kind : int { kCollective = 0, kP2P = 1, kFunctional = 2, kWait = 3 };

struct OpInfo {
  int64_t index;
  Kind kind;
};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch()).count();
}

int64_t slot_for_name_locked(const std::string& name) {
  auto it = g_by_name.find(name);
  if (it != g_by_name.end()) return it->second;
  int64_t slot = g_used.load();
  if (slot >= kSlots) return kSlots - 1;
  g_names[slot] = slot == kSlots - 1 ? std::string("(more groups)") : name;
  g_by_name.emplace(name, slot);
  g_used.store(slot + 1);
  return slot;
}

std::string group_name(const c10::intrusive_ptr<c10d::ProcessGroup>& pg) {
  // torch names every group it makes (the name functional collectives resolve); a group made in Python
  // without a backend has none, and its description ("default_pg" for the default group) stands in.
  try {
    const std::string& name = pg->getGroupName();
    if (!name.empty()) return name;
  } catch (...) {
  }
  try {
    const std::string& desc = pg->getGroupDesc();
    if (!desc.empty() && desc != "undefined") return "desc:" + desc;
  } catch (...) {
  }
  return "unnamed";
}

// Keyed by the ProcessGroup itself: the IValue around it is a new object at every boxed call, so its
// address is reused by other groups' calls. A group destroyed mid-job may hand its address to a new one;
// reset() (the Runtime's close) forgets them all.
int64_t slot_for_pg(const c10::IValue& iv) {
  auto pg = iv.toCustomClass<c10d::ProcessGroup>();
  const void* key = pg.get();
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_by_pg.find(key);
  if (it != g_by_pg.end()) return it->second;
  int64_t slot = slot_for_name_locked(group_name(pg));
  g_by_pg.emplace(key, slot);
  return slot;
}

int64_t slot_for_name(const std::string& name) {
  std::lock_guard<std::mutex> lock(g_mu);
  return slot_for_name_locked(name);
}

OpInfo op_info(const c10::OperatorHandle& op) {
  const void* key = &op.schema();
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_op_index.find(key);
  int64_t index;
  if (it == g_op_index.end()) {
    index = static_cast<int64_t>(g_op_names.size());
    g_op_names.push_back(op.operator_name().name);
    g_op_index.emplace(key, index);
  } else {
    index = it->second;
  }
  const std::string& name = g_op_names[index];
  Kind kind = kCollective;
  if (name == "c10d::send" || name == "c10d::recv_" || name == "c10d::recv_any_source_" ||
      name == "_c10d_functional::isend" || name == "_c10d_functional::irecv" ||
      name == "_c10d_functional::batch_p2p_ops") {
    kind = kP2P;
  } else if (name == "_c10d_functional::wait_tensor") {
    kind = kWait;
  } else if (name.rfind("_c10d_functional::", 0) == 0) {
    kind = kFunctional;
  }
  return {index, kind};
}

bool is_class(const c10::IValue& iv, const char* name) {
  return iv.isCustomClass() && iv.type()->str() == name;
}

int64_t tensor_bytes(const c10::IValue& iv) {
  if (iv.isTensor()) {
    const auto& t = iv.toTensor();
    return t.defined() ? static_cast<int64_t>(t.numel() * t.element_size()) : 0;
  }
  if (iv.isTensorList()) {
    int64_t n = 0;
    for (const at::Tensor& t : iv.toTensorVector()) n += t.defined() ? t.numel() * t.element_size() : 0;
    return n;
  }
  return 0;
}

void busy_begin() {
  std::lock_guard<std::mutex> lock(g_busy_mu);
  if (g_inflight++ == 0) g_busy_since_ns = now_ns();
}

void busy_end() {
  std::lock_guard<std::mutex> lock(g_busy_mu);
  if (g_inflight > 0 && --g_inflight == 0) g_busy_total_ns += now_ns() - g_busy_since_ns;
}

int64_t busy_ns() {
  std::lock_guard<std::mutex> lock(g_busy_mu);
  return g_busy_total_ns + (g_inflight > 0 ? now_ns() - g_busy_since_ns : 0);
}

void finish(int64_t slot, bool p2p) {
  auto& s = g_slots[slot];
  (p2p ? s.p2p_done : s.done).fetch_add(1, std::memory_order_relaxed);
  busy_end();
}

// Below autograd for the rest of the call, as torch's default autograd fallback runs these ops: a functional
// collective's own c10d call then skips this kernel instead of being counted a second time.
void below_autograd(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  c10::impl::ExcludeDispatchKeyGuard guard(c10::autograd_dispatch_keyset);
  op.redispatchBoxed(ks & c10::after_autograd_keyset, stack);
}

void watch_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const OpInfo info = op_info(op);
  if (info.kind == kFunctional) {
    // A functional collective issues its c10d op on the spot and keeps the Work for wait_tensor: that c10d
    // call, let through to this kernel (autograd keys not excluded), is counted with its group and its
    // completion, so the collective stays in flight until its Work is done, wherever it is waited for.
    op.redispatchBoxed(ks & c10::after_autograd_keyset, stack);
    return;
  }
  if (info.kind == kWait) {
    g_waits.fetch_add(1, std::memory_order_relaxed);
    busy_begin();
    try {
      below_autograd(op, ks, stack);
    } catch (...) {
      g_waits.fetch_sub(1, std::memory_order_relaxed);
      busy_end();
      throw;
    }
    g_waits.fetch_sub(1, std::memory_order_relaxed);
    busy_end();
    return;
  }
  int64_t slot = -1;
  int64_t bytes = 0;
  for (const c10::IValue& iv : *stack) {
    bytes += tensor_bytes(iv);
    if (slot < 0 && is_class(iv, "__torch__.torch.classes.c10d.ProcessGroup")) slot = slot_for_pg(iv);
  }
  if (slot < 0) slot = slot_for_name("unnamed");
  const bool p2p = info.kind == kP2P;
  Slot& s = g_slots[slot];
  if (p2p) {
    s.p2p_entered.fetch_add(1, std::memory_order_relaxed);
  } else {
    s.op.store(info.index, std::memory_order_relaxed);
    s.bytes.store(bytes, std::memory_order_relaxed);
    s.since_ns.store(now_ns(), std::memory_order_relaxed);
    s.entered.fetch_add(1, std::memory_order_release);
    g_latest.store(slot, std::memory_order_relaxed);
  }
  g_total.fetch_add(1, std::memory_order_relaxed);
  busy_begin();
  try {
    below_autograd(op, ks, stack);
  } catch (...) {
    finish(slot, p2p);
    throw;
  }
  for (const c10::IValue& iv : *stack) {
    if (is_class(iv, "__torch__.torch.classes.c10d.Work")) {
      try {
        auto work = iv.toCustomClass<c10d::Work>();
        // A call that failed (a timeout, a peer gone) did not complete: it stays in flight, so the record
        // still says the rank waits in it when the failure is diagnosed.
        work->getFuture()->addCallback([slot, p2p](c10::ivalue::Future& f) {
          if (f.hasError()) {
            busy_end();
          } else {
            finish(slot, p2p);
          }
        });
        return;
      } catch (...) {
        break;  // a backend without futures: counted as completed at once
      }
    }
  }
  finish(slot, p2p);
}

at::Tensor snapshot() {
  const int64_t used = g_used.load();
  at::Tensor out = at::zeros({used + 1, kFields}, at::kLong);
  auto a = out.accessor<int64_t, 2>();
  a[0][0] = g_total.load();
  a[0][1] = g_latest.load();
  a[0][2] = g_waits.load();
  a[0][3] = used;
  a[0][4] = busy_ns();
  for (int64_t i = 0; i < used; ++i) {
    const Slot& s = g_slots[i];
    a[i + 1][0] = s.entered.load();
    a[i + 1][1] = s.done.load();
    a[i + 1][2] = s.p2p_entered.load();
    a[i + 1][3] = s.p2p_done.load();
    a[i + 1][4] = s.op.load();
    a[i + 1][5] = s.bytes.load();
    a[i + 1][6] = s.since_ns.load();
  }
  return out;
}

std::vector<std::string> names() {
  std::lock_guard<std::mutex> lock(g_mu);
  return std::vector<std::string>(g_names, g_names + g_used.load());
}

std::vector<std::string> op_names() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_op_names;
}

// Forget the groups (their pointers may be reused by the next process group of this process); the counts of
// calls still in flight land in slots that no longer mean anything, which a new group's first call resets.
void reset() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_by_pg.clear();
  g_by_name.clear();
  for (int64_t i = 0; i < kSlots; ++i) {
    Slot& s = g_slots[i];
    s.entered = 0;
    s.done = 0;
    s.p2p_entered = 0;
    s.p2p_done = 0;
    s.op = -1;
    s.bytes = 0;
    s.since_ns = 0;
    g_names[i].clear();
  }
  g_used = 0;
  g_latest = -1;
  g_total = 0;
  std::lock_guard<std::mutex> busy(g_busy_mu);
  g_inflight = 0;
  g_busy_total_ns = 0;
}

}  // namespace

double busy_seconds() { return static_cast<double>(busy_ns()) / 1e9; }

TORCH_LIBRARY(npudist_watch, m) {
  m.def("snapshot() -> Tensor", &snapshot);
  m.def("busy_seconds() -> float", &busy_seconds);
  m.def("names() -> str[]", &names);
  m.def("op_names() -> str[]", &op_names);
  m.def("reset() -> ()", &reset);
}

#define NPUDIST_WATCH(ns, key)                                                           \
  TORCH_LIBRARY_IMPL(ns, key, m) {                                                       \
    for (const char* name : ns##_ops) {                                                  \
      m.impl(name, torch::CppFunction::makeFromBoxedFunction<&watch_kernel>());          \
    }                                                                                    \
  }

static const char* c10d_ops[] = {
    "allreduce_", "allreduce_coalesced_", "allgather_", "_allgather_base_", "allgather_coalesced_",
    "allgather_into_tensor_coalesced_", "reduce_scatter_", "_reduce_scatter_base_",
    "reduce_scatter_tensor_coalesced_", "reduce_", "gather_", "scatter_", "alltoall_", "alltoall_base_",
    "broadcast_", "barrier", "monitored_barrier_", "send", "recv_", "recv_any_source_"};
static const char* _c10d_functional_ops[] = {
    "all_reduce", "all_reduce_", "all_reduce_coalesced", "all_reduce_coalesced_", "all_gather_into_tensor",
    "all_gather_into_tensor_out", "all_gather_into_tensor_coalesced", "reduce_scatter_tensor",
    "reduce_scatter_tensor_out", "reduce_scatter_tensor_coalesced", "all_to_all_single", "broadcast",
    "broadcast_", "wait_tensor"};

NPUDIST_WATCH(c10d, AutogradCPU)
NPUDIST_WATCH(c10d, AutogradCUDA)
NPUDIST_WATCH(c10d, AutogradPrivateUse1)
NPUDIST_WATCH(c10d, AutogradXPU)
NPUDIST_WATCH(_c10d_functional, AutogradCPU)
NPUDIST_WATCH(_c10d_functional, AutogradCUDA)
NPUDIST_WATCH(_c10d_functional, AutogradPrivateUse1)
NPUDIST_WATCH(_c10d_functional, AutogradXPU)
