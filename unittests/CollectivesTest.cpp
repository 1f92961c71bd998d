//===- CollectivesTest.cpp - every collective on every rank ---------------===//
//
//   mpirun -n 4 pcc-collective-tests --engine=mpi
//   pcc-collective-tests --engine=self
//   pcc-collective-tests --engine=nccl        (one GPU: a world of one)
//   mpirun -n 2 pcc-collective-tests --engine=nccl   (one GPU per rank)
//
// Each rank fills its buffers from its rank number, so every expected value
// is known exactly (small integers in floating point). A failure names the
// rank; the process exits non-zero, and so does mpirun.
//
//===----------------------------------------------------------------------===//

#include "pcc/runtime/Communicator.h"
#include "pcc/runtime/Device.h"
#include "pcc/runtime/HalfFloat.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

using namespace pccrt;

namespace {

std::string engine = "mpi";
std::unique_ptr<Communicator> world;
std::unique_ptr<Device> device;

/// A float buffer in the engine's memory (device memory for NCCL).
class Buffer {
public:
  explicit Buffer(const std::vector<float> &values) : host(values) {
    if (!device->isHost()) {
      auto b = DeviceBuffer::allocate(*device, bytes());
      EXPECT_TRUE(b.ok()) << b.error();
      onDevice = b.take();
      EXPECT_TRUE(
          device->copyToDevice(onDevice.data(), host.data(), bytes()).ok());
    }
  }
  void *data() { return device->isHost() ? host.data() : onDevice.data(); }
  std::vector<float> read() {
    if (!device->isHost()) {
      Status w = world->wait(60000);
      EXPECT_TRUE(w.ok()) << w.error();
      EXPECT_TRUE(
          device->copyToHost(host.data(), onDevice.data(), bytes()).ok());
    }
    return host;
  }

private:
  int64_t bytes() const { return static_cast<int64_t>(host.size() * 4); }
  std::vector<float> host;
  DeviceBuffer onDevice;
};

std::vector<float> ramp(int64_t n, float base) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[i] = base + static_cast<float>(i);
  return v;
}

TEST(Collectives, AllReduceSumMaxMin) {
  int r = world->rank(), p = world->size();
  const int64_t n = 1000;
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min}) {
    Buffer in(ramp(n, float(r))), out(std::vector<float>(n, -1));
    ASSERT_TRUE(
        world->allReduce(in.data(), out.data(), n, DType::F32, op).ok());
    std::vector<float> got = out.read();
    for (int64_t i = 0; i < n; ++i) {
      // sum over ranks of (rank + i), max rank p-1, min rank 0.
      float want = op == ReduceOp::Sum   ? float(p * (p - 1) / 2 + p * i)
                   : op == ReduceOp::Max ? float(p - 1 + i)
                                         : float(i);
      ASSERT_EQ(got[i], want) << "rank " << r << " element " << i;
    }
  }
  // In place.
  Buffer buf(ramp(n, 1.0f));
  ASSERT_TRUE(
      world->allReduce(buf.data(), buf.data(), n, DType::F32, ReduceOp::Sum)
          .ok());
  EXPECT_EQ(buf.read()[7], float(p * 8));
}

// Gradient buckets: sums started while the backward pass goes on (MPI:
// MPI_Iallreduce; NCCL: a stream of their own), completed by one wait.
TEST(Collectives, StartedAllReduces) {
  int r = world->rank(), p = world->size();
  const int64_t n = 1 << 16;
  Buffer a(ramp(n, float(r))), b(ramp(n, float(2 * r)));
  ASSERT_TRUE(world->allReduceStart(a.data(), n, DType::F32).ok());
  world->progressCollectives();
  ASSERT_TRUE(world->allReduceStart(b.data(), n, DType::F32).ok());
  ASSERT_TRUE(world->waitCollectives().ok());
  std::vector<float> gotA = a.read(), gotB = b.read();
  for (int64_t i = 0; i < n; i += 997) {
    ASSERT_EQ(gotA[i], float(p * (p - 1) / 2 + p * i)) << "element " << i;
    ASSERT_EQ(gotB[i], float(p * (p - 1) + p * i)) << "element " << i;
  }
  // Nothing started: the wait returns at once.
  EXPECT_TRUE(world->waitCollectives().ok());
}

// ZeRO's gradient buckets: reduce-scatters started while the backward pass
// goes on, out of place (ZeRO 2/3) and in place (ZeRO 1: the piece stays at
// the rank's place in the buffer), completed by the same one wait.
TEST(Collectives, StartedReduceScatters) {
  int r = world->rank(), p = world->size();
  const int64_t n = 1 << 12;
  Buffer in(ramp(n * p, float(r))), out(std::vector<float>(n, -1));
  Buffer inPlace(ramp(n * p, float(2 * r)));
  ASSERT_TRUE(
      world->reduceScatterStart(in.data(), out.data(), n, DType::F32).ok());
  world->progressCollectives();
  float *mine = static_cast<float *>(inPlace.data()) + r * n;
  ASSERT_TRUE(
      world->reduceScatterStart(inPlace.data(), mine, n, DType::F32).ok());
  ASSERT_TRUE(world->waitCollectives().ok());
  std::vector<float> got = out.read(), gotInPlace = inPlace.read();
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(got[i], float(p * (p - 1) / 2 + p * (r * n + i)))
        << "rank " << r << " element " << i;
    ASSERT_EQ(gotInPlace[r * n + i], float(p * (p - 1) + p * (r * n + i)))
        << "in place: rank " << r << " element " << i;
  }
}

// ZeRO 3's prefetch: gathers started beside reduce-scatters complete in
// the order they started; waiting through one leaves the later ones to a
// later wait (whose results are then right too).
TEST(Collectives, StartedGathersCompleteInOrder) {
  int r = world->rank(), p = world->size();
  const int64_t n = 1 << 12;
  Buffer piece(ramp(n, float(100 * r))), whole(std::vector<float>(n * p, -1));
  Buffer grads(ramp(n * p, float(r))), mine(std::vector<float>(n, -1));
  // In place: this rank's piece already at its place in the result.
  std::vector<float> stacked(n * p, -1);
  for (int64_t i = 0; i < n; ++i)
    stacked[r * n + i] = float(7 * r + i);
  Buffer inPlace(stacked);
  int64_t before = world->startedCollectives();
  ASSERT_TRUE(
      world->allGatherStart(piece.data(), whole.data(), n, DType::F32).ok());
  int64_t first = world->startedCollectives();
  ASSERT_TRUE(
      world->reduceScatterStart(grads.data(), mine.data(), n, DType::F32).ok());
  int64_t second = world->startedCollectives();
  float *own = static_cast<float *>(inPlace.data()) + r * n;
  ASSERT_TRUE(
      world->allGatherStart(own, inPlace.data(), n, DType::F32).ok());
  if (std::string(world->engine()) != "self") {
    EXPECT_EQ(first, before + 1);
    EXPECT_EQ(second, before + 2);
    EXPECT_EQ(world->startedCollectives(), before + 3);
  }
  world->progressCollectives();
  ASSERT_TRUE(world->waitCollectivesThrough(first).ok());
  std::vector<float> got = whole.read();
  for (int q = 0; q < p; ++q)
    for (int64_t i = 0; i < n; i += 101)
      ASSERT_EQ(got[q * n + i], float(100 * q + i)) << "piece " << q;
  ASSERT_TRUE(world->waitCollectivesThrough(second).ok());
  // Waiting again through a completed one does nothing.
  ASSERT_TRUE(world->waitCollectivesThrough(first).ok());
  std::vector<float> sum = mine.read();
  for (int64_t i = 0; i < n; i += 101)
    ASSERT_EQ(sum[i], float(p * (p - 1) / 2 + p * (r * n + i)));
  ASSERT_TRUE(world->waitCollectives().ok());
  std::vector<float> gathered = inPlace.read();
  for (int q = 0; q < p; ++q)
    for (int64_t i = 0; i < n; i += 101)
      ASSERT_EQ(gathered[q * n + i], float(7 * q + i)) << "in place " << q;
}

TEST(Collectives, AllGather) {
  int r = world->rank(), p = world->size();
  const int64_t n = 33;
  Buffer in(ramp(n, float(100 * r))), out(std::vector<float>(n * p, -1));
  ASSERT_TRUE(world->allGather(in.data(), out.data(), n, DType::F32).ok());
  std::vector<float> got = out.read();
  for (int q = 0; q < p; ++q)
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(got[q * n + i], float(100 * q + i)) << "rank " << r;
}

TEST(Collectives, ReduceScatter) {
  int r = world->rank(), p = world->size();
  const int64_t n = 17;
  Buffer in(ramp(n * p, float(r))), out(std::vector<float>(n, -1));
  ASSERT_TRUE(
      world->reduceScatter(in.data(), out.data(), n, DType::F32, ReduceOp::Sum)
          .ok());
  std::vector<float> got = out.read();
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(got[i], float(p * (p - 1) / 2 + p * (r * n + i))) << "rank " << r;
}

TEST(Collectives, Broadcast) {
  int r = world->rank(), p = world->size();
  int root = p - 1;
  Buffer buf(ramp(64, r == root ? 5.0f : -9.0f));
  ASSERT_TRUE(world->broadcast(buf.data(), 64, DType::F32, root).ok());
  std::vector<float> got = buf.read();
  EXPECT_EQ(got[0], 5.0f);
  EXPECT_EQ(got[63], 68.0f);
}

TEST(Collectives, SendRecvRing) {
  int r = world->rank(), p = world->size();
  if (p == 1)
    GTEST_SKIP() << "point-to-point needs two ranks";
  if (engine == "nccl")
    GTEST_SKIP() << "this ring uses host buffers (MPI); NCCL send/recv "
                    "needs device buffers on two GPUs";
  std::vector<float> mine = ramp(10, float(r)), theirs(10, -1);
  int next = (r + 1) % p, prev = (r + p - 1) % p;
  // Even ranks send first, odd ranks receive first: no deadlock for any p.
  if (r % 2 == 0) {
    ASSERT_TRUE(world->send(mine.data(), 10, DType::F32, next).ok());
    ASSERT_TRUE(world->recv(theirs.data(), 10, DType::F32, prev).ok());
  } else {
    ASSERT_TRUE(world->recv(theirs.data(), 10, DType::F32, prev).ok());
    ASSERT_TRUE(world->send(mine.data(), 10, DType::F32, next).ok());
  }
  EXPECT_EQ(theirs[0], float(prev));
}

// Tests receives posted before their sends, as a pipeline posts them a
// compute early: numbered in order, each wait completes the ones before
// it, and later ones stay pending.
TEST(Collectives, PostedReceivesCompleteInOrder) {
  int r = world->rank(), p = world->size();
  if (p == 1)
    GTEST_SKIP() << "point-to-point needs two ranks";
  const int64_t n = 1 << 10;
  int next = (r + 1) % p, prev = (r + p - 1) % p;
  Buffer first(std::vector<float>(n, -1)), second(std::vector<float>(n, -1));
  Buffer a(ramp(n, float(10 * r))), b(ramp(n, float(10 * r + 5)));
  int64_t before = world->postedReceives();
  ASSERT_TRUE(world->beginGroup().ok());
  Status st = world->postRecv(first.data(), n, DType::F32, prev);
  int64_t one = world->postedReceives();
  if (st.ok())
    st = world->postRecv(second.data(), n, DType::F32, prev);
  if (st.ok())
    st = world->sendAsync(a.data(), n, DType::F32, next);
  if (st.ok())
    st = world->sendAsync(b.data(), n, DType::F32, next);
  Status ended = world->endGroup();
  ASSERT_TRUE(st.ok()) << st.error();
  ASSERT_TRUE(ended.ok()) << ended.error();
  EXPECT_EQ(one, before + 1);
  EXPECT_EQ(world->postedReceives(), before + 2);
  ASSERT_TRUE(world->waitReceivesThrough(one).ok());
  std::vector<float> got = first.read();
  for (int64_t i = 0; i < n; i += 37)
    ASSERT_EQ(got[i], float(10 * prev + i));
  ASSERT_TRUE(world->waitReceivesThrough(world->postedReceives()).ok());
  // Waiting again through a completed one does nothing.
  ASSERT_TRUE(world->waitReceivesThrough(one).ok());
  got = second.read();
  for (int64_t i = 0; i < n; i += 37)
    ASSERT_EQ(got[i], float(10 * prev + 5 + i));
  ASSERT_TRUE(world->completeSends().ok());
}

TEST(Collectives, SplitByParity) {
  if (engine == "nccl")
    GTEST_SKIP() << "NCCL groups are made from split MPI groups";
  int r = world->rank(), p = world->size();
  auto sub = world->split(r % 2, r);
  ASSERT_TRUE(sub.ok()) << sub.error();
  (*sub)->setName(r % 2 ? "odd" : "even");
  int expected = (p + (r % 2 ? 0 : 1)) / 2;
  EXPECT_EQ((*sub)->size(), expected);
  EXPECT_EQ((*sub)->rank(), r / 2);
  float v = float(r), sum = -1;
  ASSERT_TRUE((*sub)->allReduce(&v, &sum, 1, DType::F32, ReduceOp::Sum).ok());
  float want = 0;
  for (int q = r % 2; q < p; q += 2)
    want += float(q);
  EXPECT_EQ(sum, want);
}

TEST(Collectives, ErrorsNameTheRankAndCollective) {
  if (engine != "mpi")
    GTEST_SKIP() << "the MPI engine's argument checks";
  float v = 0;
  Status s = world->allReduce(&v, &v, -1, DType::F32, ReduceOp::Sum);
  ASSERT_FALSE(s.ok());
  std::string want = "rank " + std::to_string(world->rank()) + " of " +
                     std::to_string(world->size()) +
                     " in 'world' (mpi): all_reduce of -1 x F32: element "
                     "count -1 is outside what one MPI call moves";
  EXPECT_EQ(s.error().rfind(want, 0), 0u) << s.error();
  // With its place in the mesh set, the message says it too.
  world->setMeshCoordinates("tp=" + std::to_string(world->rank()));
  s = world->allGather(&v, &v, -1, DType::F32);
  world->setMeshCoordinates("");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().find(" in 'world' (mpi) at mesh [tp=" +
                           std::to_string(world->rank()) +
                           "]: all_gather of -1 x F32"),
            std::string::npos)
      << s.error();
}

// bf16 and fp16 (mixed precision's tensor-parallel sums): MPI has no such
// types, so the engine adds each pair in float and rounds (as NCCL does).
// Small integers are exact in both, so every sum and maximum is exact.
TEST(Collectives, SixteenBitFloats) {
  if (!device->isHost())
    GTEST_SKIP() << "host buffers (NCCL reduces bf16 and fp16 natively)";
  int r = world->rank(), p = world->size();
  const int64_t n = 64;
  for (DType type : {DType::BF16, DType::F16})
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
      auto encode = [&](float v) {
        return type == DType::BF16 ? floatToBf16(v) : floatToHalf(v);
      };
      auto decode = [&](uint16_t h) {
        return type == DType::BF16 ? bf16ToFloat(h) : halfToFloat(h);
      };
      std::vector<uint16_t> buf(n);
      for (int64_t i = 0; i < n; ++i)
        buf[i] = encode(float(r + i % 8));
      ASSERT_TRUE(world->allReduce(buf.data(), buf.data(), n, type, op).ok());
      for (int64_t i = 0; i < n; ++i) {
        float want = op == ReduceOp::Sum ? float(p * (p - 1) / 2 + p * (i % 8))
                                         : float(p - 1 + i % 8);
        ASSERT_EQ(decode(buf[i]), want) << "rank " << r << " element " << i;
      }
    }
}

} // namespace

int main(int argc, char **argv) {
  testing::InitGoogleTest(&argc, argv);
  std::string deviceName = "cpu";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--engine=", 0) == 0)
      engine = a.substr(9);
    else if (a.rfind("--device=", 0) == 0)
      deviceName = a.substr(9);
  }
  if (engine == "nccl" && deviceName == "cpu")
    deviceName = "cuda";
  auto dev = Device::open(deviceName);
  if (!dev.ok()) {
    std::fprintf(stderr, "pcc-collective-tests: %s\n", dev.error().c_str());
    return 1;
  }
  device = dev.take();
  if (engine == "self") {
    world = Communicator::self();
  } else {
    // NCCL bootstraps through MPI when launched by mpirun, else a world of
    // one hands the id to itself.
    std::unique_ptr<Communicator> bootstrap;
    if (engine == "mpi" || Communicator::launchedByMpi()) {
      auto mpi = Communicator::mpiWorld();
      if (!mpi.ok()) {
        std::fprintf(stderr, "pcc-collective-tests: %s\n", mpi.error().c_str());
        return 1;
      }
      bootstrap = mpi.take();
    } else {
      bootstrap = Communicator::self();
    }
    if (engine == "mpi") {
      world = std::move(bootstrap);
    } else if (engine == "nccl") {
      auto nccl = Communicator::nccl(*bootstrap, *device);
      if (!nccl.ok()) {
        std::fprintf(stderr, "pcc-collective-tests: %s\n",
                     nccl.error().c_str());
        return 1;
      }
      world = nccl.take();
      bootstrap.release(); // MPI must outlive NCCL's teardown; freed at exit
    } else {
      std::fprintf(stderr, "pcc-collective-tests: unknown engine '%s'\n",
                   engine.c_str());
      return 1;
    }
  }
  std::printf("pcc-collective-tests: rank %d of %d, engine %s, device %s\n",
              world->rank(), world->size(), world->engine(),
              device->describe().c_str());
  int rc = RUN_ALL_TESTS();
  world.reset();
  device.reset();
  return rc;
}
