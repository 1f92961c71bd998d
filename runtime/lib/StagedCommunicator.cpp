//===- StagedCommunicator.cpp - device collectives through host memory ----===//
//
// Several ranks sharing one GPU cannot use NCCL (it wants one device per
// rank: "Duplicate GPU detected"). The staged engine runs such a job's
// collectives and transfers over the host engine (MPI): each call copies
// its device buffer into host memory, runs the host call, and copies the
// result back. The copies go through the device's stream and wait for it,
// so they come after the compute that made the data and before the compute
// that reads it; every call completes on return except the posted receives
// and the non-blocking sends, which keep their host buffers until they are
// waited for. The sums are MPI's, so a staged job computes what the same
// job on CPU ranks computes from the same device results.
//
//===----------------------------------------------------------------------===//

#include "pcc/runtime/Communicator.h"

#include "pcc/runtime/Device.h"

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <memory>
#include <vector>

namespace pccrt {
namespace {

class StagedCommunicator final : public Communicator {
public:
  StagedCommunicator(Communicator &host, Device &device)
      : host(host), device(device) {
    setName(host.name());
  }
  int rank() const override { return host.rank(); }
  int size() const override { return host.size(); }
  const char *engine() const override { return "mpi, staged"; }

  Status allReduce(const void *send, void *recv, int64_t count, DType type,
                   ReduceOp op) override {
    size_t bytes = byteCount(count, type);
    std::vector<char> &buf = staging(0, bytes);
    if (Status st = toHost(buf.data(), send, bytes, "all_reduce", count, type);
        !st.ok())
      return st;
    if (Status st = host.allReduce(buf.data(), buf.data(), count, type, op);
        !st.ok())
      return st;
    return toDevice(recv, buf.data(), bytes, "all_reduce", count, type);
  }
  Status allGather(const void *send, void *recv, int64_t countPerRank,
                   DType type) override {
    size_t part = byteCount(countPerRank, type);
    std::vector<char> &in = staging(0, part);
    std::vector<char> &out = staging(1, part * size());
    if (Status st =
            toHost(in.data(), send, part, "all_gather", countPerRank, type);
        !st.ok())
      return st;
    if (Status st = host.allGather(in.data(), out.data(), countPerRank, type);
        !st.ok())
      return st;
    return toDevice(recv, out.data(), part * size(), "all_gather", countPerRank,
                    type);
  }
  Status reduceScatter(const void *send, void *recv, int64_t countPerRank,
                       DType type, ReduceOp op) override {
    size_t part = byteCount(countPerRank, type);
    std::vector<char> &in = staging(0, part * size());
    std::vector<char> &out = staging(1, part);
    if (Status st = toHost(in.data(), send, part * size(), "reduce_scatter",
                           countPerRank, type);
        !st.ok())
      return st;
    if (Status st =
            host.reduceScatter(in.data(), out.data(), countPerRank, type, op);
        !st.ok())
      return st;
    return toDevice(recv, out.data(), part, "reduce_scatter", countPerRank,
                    type);
  }
  /// In place as the device form allows (recv this rank's slice of send):
  /// the staging buffers are distinct in any case.
  Status reduceScatterStart(const void *send, void *recv, int64_t countPerRank,
                            DType type) override {
    return reduceScatter(send, recv, countPerRank, type, ReduceOp::Sum);
  }
  Status broadcast(void *buffer, int64_t count, DType type, int root) override {
    size_t bytes = byteCount(count, type);
    std::vector<char> &buf = staging(0, bytes);
    if (rank() == root)
      if (Status st =
              toHost(buf.data(), buffer, bytes, "broadcast", count, type);
          !st.ok())
        return st;
    if (Status st = host.broadcast(buf.data(), count, type, root); !st.ok())
      return st;
    if (rank() == root)
      return Status::success();
    return toDevice(buffer, buf.data(), bytes, "broadcast", count, type);
  }
  Status send(const void *buffer, int64_t count, DType type,
              int peer) override {
    size_t bytes = byteCount(count, type);
    std::vector<char> &buf = staging(0, bytes);
    if (Status st = toHost(buf.data(), buffer, bytes, "send", count, type);
        !st.ok())
      return st;
    return host.send(buf.data(), count, type, peer);
  }
  Status recv(void *buffer, int64_t count, DType type, int peer) override {
    size_t bytes = byteCount(count, type);
    std::vector<char> &buf = staging(0, bytes);
    if (Status st = host.recv(buf.data(), count, type, peer); !st.ok())
      return st;
    return toDevice(buffer, buf.data(), bytes, "recv", count, type);
  }
  /// The device data is copied out now; the host send keeps its copy until
  /// completeSends.
  Status sendAsync(const void *buffer, int64_t count, DType type,
                   int peer) override {
    size_t bytes = byteCount(count, type);
    auto copy = std::make_unique<std::vector<char>>(bytes);
    if (Status st = toHost(copy->data(), buffer, bytes, "send", count, type);
        !st.ok())
      return st;
    if (Status st = host.sendAsync(copy->data(), count, type, peer); !st.ok())
      return st;
    sending.push_back(std::move(copy));
    return Status::success();
  }
  Status completeSends() override {
    Status st = host.completeSends();
    sending.clear();
    return st;
  }
  /// The host receive lands in a buffer of its own; waitReceivesThrough
  /// copies it to the device once the host engine has it.
  Status postRecv(void *buffer, int64_t count, DType type, int peer) override {
    Posted p{buffer, count, type,
             std::make_unique<std::vector<char>>(byteCount(count, type))};
    if (Status st = host.postRecv(p.host->data(), count, type, peer); !st.ok())
      return st;
    posted.push_back(std::move(p));
    ++receiveTicket;
    return Status::success();
  }
  int64_t postedReceives() const override { return receiveTicket; }
  Status waitReceivesThrough(int64_t through) override {
    through = std::min(through, receiveTicket);
    if (through <= receivesDone)
      return Status::success();
    // The host engine numbers the same receives from its own count.
    int64_t hostTicket = host.postedReceives() - (receiveTicket - through);
    if (Status st = host.waitReceivesThrough(hostTicket); !st.ok())
      return st;
    for (; receivesDone < through; ++receivesDone) {
      Posted p = std::move(posted.front());
      posted.pop_front();
      if (Status st = toDevice(p.device, p.host->data(), p.host->size(),
                               "recv (posted)", p.count, p.type);
          !st.ok())
        return st;
    }
    return Status::success();
  }
  Status beginGroup() override { return host.beginGroup(); }
  Status endGroup() override { return host.endGroup(); }
  Status barrier() override { return host.barrier(); }
  [[noreturn]] void abortJob(int code) override {
    host.abortJob(code);
    std::_Exit(code); // not reached: the host engine's abort ends the job
  }
  Status wait(int64_t timeoutMs) override { return host.wait(timeoutMs); }
  Result<std::unique_ptr<Communicator>> split(int, int) override {
    return Error{"rank " + std::to_string(rank()) + " of " +
                 std::to_string(size()) + " in '" + name() +
                 "' (mpi, staged): split the host group and stage the new "
                 "one (Communicator::staged on the split MPI group)"};
  }

private:
  static size_t byteCount(int64_t count, DType type) {
    return static_cast<size_t>(count) * dtypeSize(type);
  }
  /// Staging buffer `which` (0 or 1) of at least `bytes`, kept for the
  /// next call.
  std::vector<char> &staging(int which, size_t bytes) {
    std::vector<char> &buf = buffers[which];
    if (buf.size() < bytes)
      buf.resize(bytes);
    return buf;
  }
  /// One copy between the device and a staging buffer, its failure named
  /// by the call it serves.
  Status copy(bool toDevice, void *dst, const void *src, size_t bytes,
              const char *what, int64_t count, DType type) {
    auto n = static_cast<int64_t>(bytes);
    Status st = toDevice ? device.copyToDevice(dst, src, n)
                         : device.copyToHost(dst, src, n);
    if (!st.ok())
      return failure(what, count, type,
                     std::string(toDevice
                                     ? "copying the result back to the device: "
                                     : "staging the device buffer in host "
                                       "memory: ") +
                         st.error());
    return st;
  }
  Status toHost(void *dst, const void *src, size_t bytes, const char *what,
                int64_t count, DType type) {
    return copy(false, dst, src, bytes, what, count, type);
  }
  Status toDevice(void *dst, const void *src, size_t bytes, const char *what,
                  int64_t count, DType type) {
    return copy(true, dst, src, bytes, what, count, type);
  }

  struct Posted {
    void *device;
    int64_t count;
    DType type;
    std::unique_ptr<std::vector<char>> host;
  };

  Communicator &host;
  Device &device;
  std::vector<char> buffers[2];
  std::vector<std::unique_ptr<std::vector<char>>> sending;
  std::deque<Posted> posted;
  int64_t receiveTicket = 0, receivesDone = 0;
};

} // namespace

std::unique_ptr<Communicator> Communicator::staged(Communicator &host,
                                                   Device &device) {
  return std::unique_ptr<Communicator>(new StagedCommunicator(host, device));
}

} // namespace pccrt
