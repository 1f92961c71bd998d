//===- Job.cpp - one rank of a pcc-run job --------------------------------===//
//
// Starting the ranks under mpirun, joining the job, the groups of the mesh
// axes, and the one way a rank fails: a message naming the rank and its
// mesh coordinates, then the whole job ends (the others would wait for
// this rank forever).
//
//===----------------------------------------------------------------------===//

#include "pcc/tooling/Job.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <unistd.h>

using namespace pccrt;
using namespace pccrun;

namespace {
/// "rank R of N: " once this process is one rank of several.
std::string rankPrefix;
/// The job's world once this process has joined it: a failing rank ends
/// the job through it, so the others do not wait for it forever.
Communicator *jobWorld = nullptr;
} // namespace

[[noreturn]] void pccrun::die(const std::string &message) {
  std::fprintf(stderr, "pcc-run: %serror: %s\n", rankPrefix.c_str(),
               message.c_str());
  std::fflush(stdout);
  std::fflush(stderr);
  if (jobWorld)
    jobWorld->abortJob(1);
  std::exit(1);
}

void pccrun::joinedJob(Communicator &world) {
  jobWorld = &world;
  if (world.size() > 1)
    rankPrefix = "rank " + std::to_string(world.rank()) + " of " +
                 std::to_string(world.size()) + ": ";
}

/// Starts `ranks` copies of this program under mpirun; does not return.
[[noreturn]] void pccrun::launch(int ranks, const std::string &hostfile,
                                 const std::vector<std::string> &rankArgs) {
  std::vector<std::string> args{"mpirun", "-n", std::to_string(ranks)};
  if (geteuid() == 0)
    args.push_back("--allow-run-as-root");
  // Ranks may outnumber cores on one host; do not pin them to cores.
  for (const char *a : {"--oversubscribe", "--bind-to", "none"})
    args.push_back(a);
  // Several ranks per host each spawning a thread per core oversubscribe
  // the cores; one thread per rank unless the user says otherwise.
  for (const char *var : {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"}) {
    if (!std::getenv(var))
      setenv(var, "1", 0);
    args.push_back("-x");
    args.push_back(var);
  }
  if (!hostfile.empty()) {
    args.push_back("--hostfile");
    args.push_back(hostfile);
  }
  char self[4096];
  ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (len <= 0)
    die("cannot find this program's path to start the ranks");
  self[len] = '\0';
  args.push_back(self);
  for (const std::string &a : rankArgs)
    args.push_back(a);
  std::vector<char *> cargs;
  for (std::string &a : args)
    cargs.push_back(a.data());
  cargs.push_back(nullptr);
  std::fflush(stdout);
  execvp("mpirun", cargs.data());
  die("cannot start " + std::to_string(ranks) +
      " ranks: mpirun: " + std::strerror(errno) +
      " (install openmpi-bin, or start pcc-run under your own mpirun/srun)");
}

/// Opens `name`; a rank of a job asking for "cuda" gets one of its host's
/// GPUs, round-robin by its local rank.
std::unique_ptr<Device> pccrun::openRankDevice(const std::string &name,
                                               bool rank) {
  std::string deviceName = name;
  if (rank && deviceName == "cuda")
    if (const char *local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK")) {
      auto count = Device::cudaDeviceCount();
      if (count.ok() && *count > 0)
        deviceName = "cuda:" + std::to_string(std::atoi(local) % *count);
    }
  auto device = Device::open(deviceName);
  if (!device.ok())
    die(device.error());
  return device.take();
}

/// The world rank at mesh coordinates `coords` (the last axis fastest).
int pccrun::worldRankAt(const pcc_model_info &info,
                        const std::vector<int64_t> &coords) {
  int64_t rank = 0;
  for (int a = 0; a < info.num_mesh_axes; ++a)
    rank = rank * info.mesh_sizes[a] + coords[a];
  return static_cast<int>(rank);
}

/// The mesh coordinates of world rank `rank` (the last axis fastest).
std::vector<int64_t> pccrun::meshCoordinates(const pcc_model_info &info,
                                             int64_t rank) {
  std::vector<int64_t> coords(info.num_mesh_axes);
  for (int a = info.num_mesh_axes - 1; a >= 0; --a) {
    coords[a] = rank % info.mesh_sizes[a];
    rank /= info.mesh_sizes[a];
  }
  return coords;
}

namespace {
/// Whether any two ranks of the job use the same GPU (same host, same
/// ordinal): NCCL refuses such groups. Every rank gathers the same table,
/// so every rank gives the same answer.
bool ranksShareGpu(Communicator &world, Device &device) {
  if (device.isHost())
    return false;
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  // The host's name hashed (FNV-1a) with the ordinal, gathered from every
  // rank.
  uint64_t key = 1469598103934665603ull;
  for (const char *c = host; *c; ++c)
    key = (key ^ static_cast<unsigned char>(*c)) * 1099511628211ull;
  int64_t mine[2] = {static_cast<int64_t>(key), device.runContext().device};
  std::vector<int64_t> all(2 * static_cast<size_t>(world.size()));
  Status gathered = world.allGather(mine, all.data(), 2, pccrt::DType::I64);
  if (!gathered.ok())
    die("finding which GPU each rank uses: " + gathered.error());
  for (int a = 0; a < world.size(); ++a)
    for (int b = a + 1; b < world.size(); ++b)
      if (all[2 * a] == all[2 * b] && all[2 * a + 1] == all[2 * b + 1])
        return true;
  return false;
}
} // namespace

/// Joins the MPI job and builds one group per mesh axis: the ranks that
/// differ only in their coordinate on that axis (the last axis varies
/// fastest).
Ranks pccrun::joinRanks(const pcc_model_info &info, int64_t meshRanks,
                        Device &device, const std::string &mesh,
                        double collectiveTimeout,
                        GpuCollectives gpuCollectives) {
  Ranks r;
  Communicator::setCollectiveTimeout(collectiveTimeout);
  auto world = Communicator::mpiWorld();
  if (!world.ok())
    die(world.error());
  r.world = world.take();
  jobWorld = r.world.get();
  int rank = r.world->rank(), size = r.world->size();
  rankPrefix =
      "rank " + std::to_string(rank) + " of " + std::to_string(size) + ": ";
  if (size != meshRanks)
    die("the library was partitioned for " + mesh + " (" +
        std::to_string(meshRanks) + " ranks) but this run has " +
        std::to_string(size) + "; run it with -n " + std::to_string(meshRanks));
  r.coords = meshCoordinates(info, rank);
  // NCCL wants a GPU per rank; ranks sharing one stage through host memory.
  bool staged = gpuCollectives == GpuCollectives::Staged;
  if (gpuCollectives == GpuCollectives::Auto) {
    staged = ranksShareGpu(*r.world, device);
    if (staged && rank == 0)
      std::fprintf(stderr,
                   "pcc-run: ranks share a GPU (%s): collectives and "
                   "transfers staged through host memory over MPI (NCCL "
                   "needs a GPU per rank; --gpu-collectives=nccl refuses)\n",
                   device.describe().c_str());
  }
  if (gpuCollectives == GpuCollectives::Nccl && device.isHost())
    die("--gpu-collectives=nccl needs a CUDA device (--device cuda)");
  for (int a = 0; a < info.num_mesh_axes; ++a) {
    // The group of axis a: the ranks that differ from this one only there,
    // named by the one of them at coordinate 0.
    std::vector<int64_t> first = r.coords;
    first[a] = 0;
    auto group =
        r.world->split(worldRankAt(info, first), static_cast<int>(r.coords[a]));
    if (!group.ok())
      die(group.error());
    std::unique_ptr<Communicator> g = group.take();
    g->setName(info.mesh_axes[a]);
    if (staged && info.mesh_sizes[a] > 1) {
      std::unique_ptr<Communicator> s = Communicator::staged(*g, device);
      r.hostGroups.push_back(std::move(g));
      g = std::move(s);
    } else if (!device.isHost() && info.mesh_sizes[a] > 1) {
      auto nccl = Communicator::nccl(*g, device);
      if (!nccl.ok())
        die(nccl.error());
      r.hostGroups.push_back(std::move(g));
      g = nccl.take();
      g->setName(info.mesh_axes[a]);
    } else {
      r.hostGroups.push_back(nullptr);
    }
    r.groups.push_back(std::move(g));
  }
  // Messages from here on say where the rank sits in the mesh.
  std::string coords;
  for (int a = 0; a < info.num_mesh_axes; ++a)
    coords += (a ? ", " : "") + std::string(info.mesh_axes[a]) + "=" +
              std::to_string(r.coords[a]);
  rankPrefix = "rank " + std::to_string(rank) + " of " + std::to_string(size) +
               " [" + coords + "]: ";
  r.world->setMeshCoordinates(coords);
  for (auto &g : r.groups) {
    g->setMeshCoordinates(coords);
    r.bindings.push_back(std::make_unique<CommBinding>(*g));
  }
  for (auto &b : r.bindings)
    r.tables.push_back(b->table());
  return r;
}
